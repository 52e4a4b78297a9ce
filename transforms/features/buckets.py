"""Cost buckets, bucket weights and fitting an epoch's pool to whole steps. Pure numpy, no Beam.

Flow for one epoch (the planner in ``lidarshard.transforms.plan`` takes over afterwards)::

    edges   = quantile_edges(costs, default_num_buckets(len(costs)))   # (K-1,) cost units
    ids     = assign_buckets(costs, edges)                             # (N,) 0 = cheapest
    pool    = weighted_pool(ids, resolve_weights(w, K), rng)           # (M,) sample indices
    pool, dropped, padded = fit_pool(pool, W * B, policy, rng)         # M' % (W*B) == 0

Bucket ``k`` holds the costs in ``[edges[k-1], edges[k])`` (``-inf``/``+inf`` at the ends), so
an edge value itself belongs to the bucket above it (``np.searchsorted(side='right')``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "POLICIES",
    "quantile_edges",
    "streamed_quantile_edges",
    "sorted_values",
    "default_num_buckets",
    "assign_buckets",
    "bucket_counts",
    "resolve_weights",
    "weighted_pool",
    "fit_pool",
]

#: How ``fit_pool`` makes a pool a whole number of steps.
POLICIES = ("drop_last", "pad")


def _check_costs(costs: NDArray[np.float64]) -> NDArray[np.float64]:
    costs = np.asarray(costs, dtype=np.float64)
    if costs.ndim != 1:
        raise ValueError(f"costs must be 1-D, got shape {costs.shape}")
    if not np.isfinite(costs).all():
        raise ValueError("costs must be finite")
    return costs


def quantile_edges(costs: NDArray[np.float64], k: int) -> NDArray[np.float64]:
    """Exact quantile edges that cut ``costs`` into at most ``k`` equal-count buckets.

    Edge ``i`` is the cost at sorted position ``(i * N) // k`` (an actual data value, no
    interpolation), for ``i = 1 .. k-1``. Duplicates (ties) and edges equal to the minimum are
    removed, so fewer than ``k - 1`` edges may come back, but every bucket is non-empty.

    Args:
        costs: (N,) finite costs, any order.
        k: requested number of buckets, >= 1.

    Returns:
        (<= k-1,) float64, strictly increasing, every value > ``costs.min()``.
    """
    costs = _check_costs(costs)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n = costs.size
    if n == 0 or k == 1:
        return np.empty(0, dtype=np.float64)
    s = np.sort(costs)
    return _distinct_edges(s[_quantile_positions(n, k)], s[0])


def streamed_quantile_edges(
    chunks: Callable[[], Iterable[NDArray[np.float64]]], n: int, k: int
) -> NDArray[np.float64]:
    """``quantile_edges`` of the ``n`` costs that each call of ``chunks()`` yields in pieces (the same
    pieces each time), found without holding them: ``sorted_values`` reads them 8 times.

    An edge equal to 0 can only come with negative costs; it is written 0.0 (a sort may give -0.0).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n == 0 or k == 1:
        return np.empty(0, dtype=np.float64)
    values = sorted_values(chunks, np.concatenate([[0], _quantile_positions(n, k)]))
    return _distinct_edges(values[1:], values[0])


def _quantile_positions(n: int, k: int) -> NDArray[np.int64]:
    """(k-1,) the sorted positions ``(i * n) // k`` of the edges, ``i = 1 .. k-1``."""
    return (np.arange(1, k, dtype=np.int64) * n) // k


def _distinct_edges(edges: NDArray[np.float64], minimum: float) -> NDArray[np.float64]:
    """``edges`` (sorted) less repeats and those at ``minimum`` (they would leave a bucket empty)."""
    keep = np.ones(edges.size, dtype=bool)
    keep[1:] = np.diff(edges) > 0  # edges are sorted: drop repeats
    keep &= edges > minimum  # an edge at the minimum would leave bucket 0 empty
    return edges[keep]


_SIGN = np.uint64(1 << 63)
_BYTE = np.uint64(255)
_LOW = np.uint64(0xFFFF)


def _order_keys(costs: NDArray[np.float64]) -> NDArray[np.uint64]:
    """(n,) keys whose unsigned order is the order of ``costs`` (finite; -0.0 counted as 0.0)."""
    bits = (costs + 0.0).view(np.uint64)
    return np.where(bits & _SIGN, ~bits, bits | _SIGN)


def sorted_values(
    chunks: Callable[[], Iterable[NDArray[np.float64]]], positions: NDArray[np.int64]
) -> NDArray[np.float64]:
    """(P,) the values at sorted ``positions`` (each in [0, n)) of the costs ``chunks()`` yields, as
    ``np.sort`` of them all would hold them: a radix selection over their ``_order_keys``, one byte
    a pass from the highest (8 passes; per pass (P, 256) counts and one piece at a time).

    Raises:
        ValueError: a cost that is not finite.
    """
    prefix = np.zeros(len(positions), np.uint64)  # the key bytes found so far, per position
    rank = np.asarray(positions, np.int64).copy()  # the position among the keys of that prefix
    for shift in range(56, -8, -8):
        groups, slot = np.unique(prefix, return_inverse=True)
        counts = np.zeros(groups.size * 256, np.int64)
        known = 56 - shift  # the bits of a prefix
        table = np.full(1 << min(known, 16), -1, np.int64)  # group of a prefix (<= 16 bits) or of its low 16
        table[groups & _LOW] = np.arange(groups.size) if known <= 16 else 0
        for chunk in chunks():
            keys = _order_keys(_check_costs(chunk))
            if known <= 16:  # a table lookup
                at = table[keys >> np.uint64(shift + 8)] if known else np.zeros(keys.size, np.int64)
            else:  # keys whose prefix's low 16 bits no group has are out first, the few left searched
                keys = keys[table[(keys >> np.uint64(shift + 8)) & _LOW] >= 0]
                high = keys >> np.uint64(shift + 8)
                at = np.minimum(np.searchsorted(groups, high), groups.size - 1)
                at[groups[at] != high] = -1
            hit = at >= 0
            byte = ((keys[hit] >> np.uint64(shift)) & _BYTE).astype(np.int64)
            counts += np.bincount(at[hit] * 256 + byte, minlength=counts.size)
        below = np.cumsum(counts.reshape(groups.size, 256)[slot], axis=1)  # (P, 256)
        byte = (below <= rank[:, None]).sum(axis=1)
        rank -= np.where(byte > 0, below[np.arange(len(rank)), np.maximum(byte - 1, 0)], 0)
        prefix = (prefix << np.uint64(8)) | byte.astype(np.uint64)
    bits = np.where(prefix & _SIGN, prefix & ~_SIGN, ~prefix)
    return bits.view(np.float64)


def default_num_buckets(n: int) -> int:
    """Default bucket count for ``n`` samples: ``clamp(round(sqrt(n) / 4), 4, 64)``, at most ``n``.

    Why: a bucket should hold enough samples that its quantile and its weight are stable
    (``n / k = 4 * sqrt(n)`` samples each, e.g. 400 of 10k, 4096 of 1M before the cap), while
    at least 4 buckets still separate cheap/typical/heavy/tail. Beyond 64 buckets the planner
    gains nothing: ``balanced`` works on exact costs, and weights are set per coarse size class.
    """
    if n <= 0:
        return 1
    return int(min(n, max(4, min(64, round(np.sqrt(n) / 4)))))


def assign_buckets(costs: NDArray[np.float64], edges: NDArray[np.float64]) -> NDArray[np.int32]:
    """Bucket id of each cost: the number of edges <= cost (0 = cheapest).

    Args:
        costs: (N,) finite costs.
        edges: (K-1,) strictly increasing edges from ``quantile_edges``.

    Returns:
        (N,) int32 in ``[0, K-1]``.
    """
    costs = _check_costs(costs)
    edges = np.asarray(edges, dtype=np.float64)
    if edges.size > 1 and not (np.diff(edges) > 0).all():
        raise ValueError("edges must be strictly increasing")
    return np.searchsorted(edges, costs, side="right").astype(np.int32)


def bucket_counts(bucket_ids: NDArray[np.int32], k: int) -> NDArray[np.int64]:
    """(k,) int64 number of samples per bucket (the manifest's ``buckets.counts``)."""
    return np.bincount(np.asarray(bucket_ids, dtype=np.int64), minlength=k).astype(np.int64)


def resolve_weights(weights: Sequence[float] | None, k: int) -> NDArray[np.float64]:
    """Per-bucket sampling weights: ``None`` -> all 1, one value -> broadcast, else exactly ``k``.

    Returns:
        (k,) float64, finite and >= 0. A weight of 2.5 samples a bucket's members 2.5 times
        per epoch on average; 0.5 keeps each with probability 0.5.
    """
    if weights is None:
        return np.ones(k, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.size == 1:
        w = np.full(k, w[0])
    if w.size != k:
        raise ValueError(f"expected 1 or {k} bucket weights, got {w.size}")
    if not (np.isfinite(w).all() and (w >= 0).all()):
        raise ValueError("bucket weights must be finite and >= 0")
    return w


def weighted_pool(
    bucket_ids: NDArray[np.int32],
    weights: NDArray[np.float64],
    rng: np.random.Generator,
    sample_weights: NDArray[np.float64] | None = None,
) -> NDArray[np.int64]:
    """Sample one epoch's pool: sample ``i`` appears ``floor(w) + Bernoulli(frac(w))`` times.

    ``w = weights[bucket_ids[i]] * sample_weights[i]``: w > 1 repeats, w < 1 thins, w == 1 keeps
    every sample once. The expected number of copies is exactly ``w`` (deterministic stochastic
    rounding: one draw per sample from the epoch's seeded ``rng``).

    Args:
        bucket_ids: (N,) bucket of each sample, in ``[0, K)``.
        weights: (K,) finite weights >= 0.
        rng: the epoch's generator (one uniform draw per sample).
        sample_weights: optional (N,) finite per-sample weights >= 0 (repeat factors).

    Returns:
        (M,) int64 sample indices into ``bucket_ids``, sorted ascending (repeats adjacent).
    """
    ids = np.asarray(bucket_ids)
    if not np.issubdtype(ids.dtype, np.integer):
        ids = ids.astype(np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    if ids.size and (ids.min() < 0 or ids.max() >= weights.size):
        raise ValueError(f"bucket ids must lie in [0, {weights.size})")
    if not (np.isfinite(weights).all() and (weights >= 0).all()):
        raise ValueError("bucket weights must be finite and >= 0")
    w = weights[ids]
    if sample_weights is not None:
        sample_weights = np.asarray(sample_weights, dtype=np.float64)
        if (
            sample_weights.shape != ids.shape
            or not (np.isfinite(sample_weights) & (sample_weights >= 0)).all()
        ):
            raise ValueError("sample weights must be (N,), finite and >= 0")
        w *= sample_weights
    # in place, at most three (N,) temporaries at once: whole copies, then one draw against the fraction
    whole = np.floor(w)
    w -= whole
    up = rng.random(ids.size) < w
    del w
    copies = whole.astype(np.int64)
    del whole
    copies += up
    return np.repeat(np.arange(ids.size, dtype=np.int64), copies)


def fit_pool(
    pool: NDArray[np.int64], step_size: int, policy: str, rng: np.random.Generator
) -> tuple[NDArray[np.int64], int, int]:
    """Make the pool a whole number of steps of ``step_size = W * B`` samples.

    ``drop_last`` removes ``len % step_size`` entries chosen uniformly at random (all of them
    when the pool is shorter than one step); ``pad`` appends ``step_size - len % step_size``
    randomly chosen entries (distinct where the pool is large enough). An empty pool stays empty.

    Args:
        pool: (M,) int64 sample indices (e.g. from ``weighted_pool``).
        step_size: samples per step, ``world_size * batch_size`` >= 1.
        policy: one of ``POLICIES``.
        rng: the epoch's generator.

    Returns:
        ``(fitted, dropped, padded)``: fitted (M',) int64 sorted ascending with
        ``M' % step_size == 0`` and ``M' = M - dropped + padded``.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if step_size < 1:
        raise ValueError(f"step_size must be >= 1, got {step_size}")
    pool = np.asarray(pool, dtype=np.int64)
    n = pool.size
    rem = n % step_size
    if rem == 0:
        return np.sort(pool), 0, 0
    if policy == "drop_last":
        keep = np.ones(n, dtype=bool)
        keep[rng.choice(n, size=rem, replace=False)] = False
        return np.sort(pool[keep]), rem, 0
    pad = step_size - rem
    extra = pool[rng.choice(n, size=pad, replace=pad > n)]
    return np.sort(np.concatenate([pool, extra])), 0, pad

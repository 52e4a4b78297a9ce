"""Evaluation sharding: every validation sample exactly once over all ranks, cost balanced.

``DistributedSampler`` pads a validation set by repeating samples (which biases metrics) and deals
round-robin, so one rank can get the large scenes. Here the shards partition the dataset, per-rank
counts differ by at most one, and samples go largest-cost first to the least-loaded rank with room
(LPT with a cardinality cap); no RNG, ties broken by index. A rank may hold no sample, so an
evaluation loop must run no collective per batch (it would wait forever): gather the results once
after the loop on every rank (docs/GUIDE.md shows the loop). Needs ``pip install "lidarshard[torch]"``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from lidarshard.loaders.reader import PathLike, check_int, needs_torch, read_samples
from lidarshard.transforms.plan.lpt import CountRoom, lpt_heap

try:
    from torch.utils.data import Sampler
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise needs_torch(__name__) from e

from lidarshard.loaders.sampler import rank_world

__all__ = ["EvalSampler", "eval_costs", "eval_shards"]


def eval_shards(costs: Sequence[float] | NDArray[np.float64], world_size: int) -> list[NDArray[np.int64]]:
    """Partition ``range(len(costs))`` into ``world_size`` shards of balanced total cost.

    Args:
        costs: (N,) predicted cost per sample, finite and >= 0 (cost-model units).
        world_size: W >= 1 shards.

    Returns:
        W ascending (n_r,) index arrays: disjoint, covering 0..N-1, ``n_r`` in {N // W, N // W + 1}
        (the first ``N % W`` ranks by load order get the extra one). Samples are placed in descending
        cost order on the least-loaded rank with room, so max load - min load <= max cost in practice.
    """
    w = check_int("world_size", world_size, 1)
    c = np.asarray(costs, dtype=np.float64)
    if c.ndim != 1 or not np.isfinite(c).all() or (c < 0).any():
        raise ValueError("costs must be a 1-d array of finite values >= 0")
    base, extra = divmod(c.size, w)
    order = np.lexsort((np.arange(c.size), -c))  # descending cost, ties by index
    to = lpt_heap(np.zeros(w), np.zeros(w), order, c[order], CountRoom(w, base, extra))
    assert to is not None  # the counts hold all N
    return [np.sort(order[to == r]) for r in range(w)]


def eval_costs(
    out_dir: PathLike,
    size: int | None = None,
    index_of: Mapping[str, int] | Callable[[str], int] | None = None,
) -> NDArray[np.float64]:
    """(size,) predicted cost per dataset index, from a manifest's samples.

    Args:
        out_dir: committed manifest of the validation set.
        size: dataset length; default the manifest's sample count (dataset in the samples' order).
        index_of: sample_id -> dataset index (mapping or callable); default the samples' row order.

    Raises:
        ValueError: a dataset index has no cost (its sample is not in the manifest), or a sample maps
            outside ``0..size-1``.
    """
    table = read_samples(out_dir, ["sample_id", "cost"])
    ids, cost = table["sample_id"].to_pylist(), table["cost"].to_numpy()
    n = len(ids) if size is None else check_int("size", size, 0)
    if index_of is None:
        idx = np.arange(len(ids))
    else:
        get = index_of.get if isinstance(index_of, Mapping) else index_of
        idx = np.array([-1 if (j := get(s)) is None else int(j) for s in ids], dtype=np.int64)
        keep = idx >= 0
        idx, cost = idx[keep], cost[keep]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"a manifest sample maps to dataset index {int(idx.max())}, outside 0..{n - 1}")
    out = np.full(n, np.nan)
    out[idx] = cost
    missing = np.flatnonzero(np.isnan(out))
    if missing.size:
        raise ValueError(
            f"{missing.size} of {n} dataset items have no cost in {out_dir} (first index {int(missing[0])}): "
            "build the manifest on this validation set, or pass the right index_of / id_key"
        )
    return out


class EvalSampler(Sampler[int]):
    """This rank's shard of an evaluation set (``DataLoader(sampler=...)``), ascending indices.

    Args:
        costs: (N,) predicted cost per dataset index (see :func:`eval_costs`).
        rank: default ``torch.distributed.get_rank()``.
        world_size: default ``torch.distributed.get_world_size()``.

    ``len(sampler)`` is this rank's count (N // W or N // W + 1: 0 on some ranks when W > N, which
    warns once, naming what the evaluation loop must do); ``set_epoch`` is accepted and changes
    nothing (evaluation order is fixed).
    """

    def __init__(
        self,
        costs: Sequence[float] | NDArray[np.float64],
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        self.rank, self.world_size = rank_world(rank, world_size)
        self.shards = eval_shards(costs, self.world_size)
        self.indices = self.shards[self.rank]
        if not self.indices.size:
            warnings.warn(
                f"EvalSampler: rank {self.rank} of {self.world_size} gets no samples ({sum(map(len, self.shards))} "
                "for all ranks): run no collective per batch in the evaluation loop, gather the results "
                "once after it on every rank (see lidarshard.loaders.evaluation)",
                stacklevel=2,
            )

    @classmethod
    def from_manifest(
        cls,
        out_dir: PathLike,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        size: int | None = None,
        index_of: Mapping[str, int] | Callable[[str], int] | None = None,
    ) -> EvalSampler:
        """Shards weighted by the manifest's predicted costs (:func:`eval_costs` arguments)."""
        return cls(eval_costs(out_dir, size, index_of), rank, world_size)

    def set_epoch(self, epoch: int) -> None:
        check_int("epoch", epoch, 0)

    def __len__(self) -> int:
        return int(self.indices.size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices.tolist())

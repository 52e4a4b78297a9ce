"""One epoch's pool and its plan in one process (the whole epoch at G = 1, or one step group). Pure.

``epoch_pool`` realizes the pool (bucket weight x sample weight per sample, seeded stochastic rounding,
fitted to whole steps for the equal-count strategies) and refuses one too large for this machine;
``plan_pool`` plans it with the strategy (caps, rank speeds, ``--heaviest-first``) from the columns
``plan_columns`` names; ``to_samples`` maps the plan's pool indices to sample rows. ``planner.plan_samples`` and ``groups.plan_group`` plan with them.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.plan_writer import NUMERIC_INPUT
from lidarshard.transforms.features import buckets
from lidarshard.transforms.plan import ANY_POOL, order, plan_epoch, seeds
from lidarshard.transforms.plan.caps import PoolLimits
from lidarshard.transforms.plan.speeds import normalized

__all__ = [
    "PLAN_ENTRY_BYTES", "COST_FEATURES", "plan_columns", "plan_input", "memory_bytes", "epoch_pool", "plan_pool",
    "to_samples",
]  # fmt: skip


#: Memory one plan entry (a sample's place in one epoch) takes while its epoch is planned, written and
#: re-planned by the publish's validation, in bytes: the strategies alone measured 75-155 (2M entries),
#: the plan rows and their table add more. ``check_plan_size`` refuses a plan that cannot fit with it.
PLAN_ENTRY_BYTES = 256

#: The size features a cost model reads (``sample_costs``): what ``as_planned`` needs of an earlier epoch.
COST_FEATURES = ("num_in_range", "num_points", "occupied_voxels")


def plan_columns(cfg: PlanConfig, epoch: int | None = None) -> list[str]:
    """The scored columns epoch ``epoch``'s plan is decided from (any epoch's when None): ``NUMERIC_INPUT``
    (``plan_pool``: costs, buckets, the points the caps and ``--heaviest-first points`` read, weights), and
    ``COST_FEATURES`` where a cost model is applied again (an epoch planned before a re-plan, ``as_planned``)
    or the memory model reads them (``--max-step-memory``). The one list the build, the grouped build, each
    step group's table and the elastic re-plan read (a table may lack the optional ``num_points``, ``weight``)."""
    earlier = cfg.planned_with(epoch) is not None if epoch is not None else bool(cfg.earlier)
    return plan_input(earlier or cfg.caps.memory is not None)


def plan_input(features: bool) -> list[str]:
    """``NUMERIC_INPUT``, with the ``COST_FEATURES`` it lacks when ``features`` (``plan_columns``' rule; the
    elastic re-plan, which takes the costs from the plan rows, asks for them where a memory model reads them)."""
    return [*NUMERIC_INPUT, *(c for c in COST_FEATURES if features and c not in NUMERIC_INPUT)]


def to_samples(plan: NDArray[np.int64], pool: NDArray[np.int64]) -> NDArray[np.int64]:
    """(S, W, M) pool indices -> sample indices (``-1`` stays), one plan-sized array."""
    out = pool[plan]  # -1 reads the last entry; reset below
    out[plan < 0] = -1
    return out


def plan_pool(
    scored: pa.Table, epoch: int, cfg: PlanConfig
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64], int, int]:
    """(plan (S, W, M) in pool space, pool (P,) sample indices, pool costs (P,), dropped, padded)."""
    costs = scored.column("cost").to_numpy()
    ids = scored.column("bucket_id").to_numpy()
    sample_weights = scored.column("weight").to_numpy() if "weight" in scored.column_names else None
    pool, dropped, padded = epoch_pool(ids, sample_weights, epoch, cfg)[:3]
    del sample_weights
    w, b = cfg.world_size, cfg.batch_size
    if pool.size == 0 or pool.size < w:
        raise ValueError(
            f"epoch {epoch}: {len(costs)} samples do not fill one step of W*B = "
            f"{w * b}; use --pad or a smaller --world-size/--batch-size"
        )
    points = None
    if cfg.caps.active or cfg.heaviest_first == "points":
        points = scored.column("num_points").to_numpy()[pool] if "num_points" in scored.column_names else None
    memory = None  # (P,) bytes each entry adds to its rank-step's predicted peak
    if cfg.caps.memory is not None:
        memory = cfg.caps.memory.model.sample_bytes(scored)[pool]
    limits = PoolLimits(cfg.caps, points, memory) if cfg.caps.active else None
    pooled = costs[pool]
    speeds = None if cfg.rank_speed is None else normalized(cfg.rank_speed)
    plan = plan_epoch(
        cfg.strategy,
        pooled,
        w,
        b,
        seed=cfg.seed,
        epoch=epoch,
        bucket_ids=ids[pool],
        limits=limits,
        speeds=speeds,
    )
    if cfg.heaviest_first == "points":
        if points is None:
            raise ValueError("--heaviest-first points needs the samples' num_points")
        plan = order.heaviest_first(plan, points)
    elif cfg.heaviest_first == "cost":
        plan = order.heaviest_first(plan, pooled)
    elif cfg.heaviest_first == "memory":
        if memory is None:
            raise ValueError("--heaviest-first memory needs a memory model: give --max-step-memory")
        plan = order.heaviest_first(plan, memory)
    return plan, pool, pooled, dropped, padded


def memory_bytes() -> int | None:
    """This machine's physical memory, or its cgroup's limit when lower (bytes; None when unknown)."""
    found = []
    try:
        found.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        pass
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            found.append(int(text))
    return min((n for n in found if n > 0), default=None)


def epoch_pool(
    ids: NDArray[np.int32], sample_weights: NDArray[np.float64] | None, epoch: int, cfg: PlanConfig
) -> tuple[NDArray[np.int64], int, int, np.random.Generator]:
    """The pool epoch ``epoch`` plans: bucket weight x sample weight per sample, realized by seeded
    stochastic rounding (``buckets.weighted_pool``), then fitted to whole steps for equal-count
    strategies (``cfg.policy``).

    Args:
        ids: (N,) bucket ids; sample_weights: (N,) per-sample weights, or None (all 1).

    Returns:
        (pool (M,) sorted sample indices, dropped, padded, the epoch's generator after its draws).
    """
    weights = buckets.resolve_weights(cfg.weights, int(ids.max()) + 1 if len(ids) else 1)
    per_sample = weights[ids] if sample_weights is None else weights[ids] * sample_weights
    expected = float(per_sample.sum()) if len(ids) else 0.0
    del per_sample
    if expected > cfg.max_plan_factor * len(ids):
        raise ValueError(
            f"the bucket and sample weights would plan ~{expected:.6g} entries from {len(ids)} samples per "
            f"epoch, more than --max-plan-factor {cfg.max_plan_factor:g} x the input; lower the weights or raise it"
        )
    memory = memory_bytes()
    if memory is not None and expected * PLAN_ENTRY_BYTES > memory:
        raise ValueError(
            f"epoch {epoch} would plan ~{expected:.3g} entries from {len(ids):,} samples, ~"
            f"{expected * PLAN_ENTRY_BYTES / 2**30:.3g} GiB at ~{PLAN_ENTRY_BYTES} bytes an entry, more than this "
            f"machine's {memory / 2**30:.3g} GiB: lower --bucket-weights/--sample-weights"
        )
    rng = seeds.rng(cfg.seed, epoch, "pool")
    pool = buckets.weighted_pool(ids, weights, rng, sample_weights)
    dropped = padded = 0
    if cfg.strategy not in ANY_POOL:
        pool, dropped, padded = buckets.fit_pool(pool, cfg.world_size * cfg.batch_size, cfg.policy, rng)
    return pool, dropped, padded, rng

"""Epoch planners: which pool entries each rank trains on at each step.

A plan for one epoch is an int64 array of shape ``(S, W, M)`` (steps x ranks x slots) whose
entries index the epoch's pool; every pool entry appears exactly once. Equal-count strategies
return ``M = B`` with every slot used and need ``P % (W*B) == 0``; variable-count strategies
(``VARIABLE_COUNT``: ``budget``, ``rebalance``, ``auto``) mark empty slots ``-1``, every rank-step holding at least
one entry; ``ANY_POOL`` ones (``budget``) take any ``P >= W``. Each strategy is one module exporting
``plan(costs, world_size, batch_size, rng, bucket_ids, limits)``; ``STRATEGIES`` maps names to
those functions and ``plan_epoch`` validates inputs, seeds the generator, dispatches and checks
the caps (``lidarshard.transforms.plan.caps``). A strategy seeded as another (``SEEDED_AS``: ``rebalance``
splits ``random``'s steps) gets that strategy's generator. Balance metrics live in
``lidarshard.transforms.plan.metrics``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.transforms.plan import auto, balanced, budget, megabatch, mixed, rebalance, seeds, stratified
from lidarshard.transforms.plan import random as random_
from lidarshard.transforms.plan.caps import PoolLimits, check_caps
from lidarshard.transforms.plan.speeds import fastest_heaviest

__all__ = [
    "PlanFn",
    "STRATEGIES",
    "VARIABLE_COUNT",
    "ANY_POOL",
    "SEEDED_AS",
    "SPEED_AWARE",
    "DEFAULT_STRATEGY",
    "STRATEGY_HELP",
    "plan_epoch",
]

#: ``plan(costs (P,), world_size, batch_size, rng, bucket_ids (P,) | None, limits | None)
#: -> (S, W, M) int64``.
PlanFn = Callable[
    [NDArray[np.float64], int, int, np.random.Generator, NDArray[np.int32] | None, PoolLimits | None],
    NDArray[np.int64],
]

STRATEGIES: dict[str, PlanFn] = {
    "random": random_.plan,
    "stratified": stratified.plan,
    "balanced": balanced.plan,
    "megabatch": megabatch.plan,
    "budget": budget.plan,
    "mixed": mixed.plan,
    "rebalance": rebalance.plan,
    "auto": auto.plan,
}

#: Strategies whose rank-steps hold a variable number of samples (``-1`` pads the plan): the contract's list.
VARIABLE_COUNT = schemas.VARIABLE_COUNT

#: Variable-count strategies that plan a pool of any size ``P >= W`` (nothing dropped or padded to whole
#: steps); the others, ``rebalance`` included, plan a pool of whole steps of ``W*B``.
ANY_POOL = frozenset({"budget"})

#: Strategies seeded as another: ``rebalance`` gets ``random``'s generator (it splits ``random``'s steps).
SEEDED_AS: dict[str, str] = {"rebalance": "random"}

#: Strategies that plan for per-rank speeds themselves: ``fn(costs, W, B, rng, bucket_ids, limits, speeds)``
#: with (W,) speeds of mean 1, each rank's load at a step ~ its speed; the others are reordered per step.
SPEED_AWARE: dict[str, Callable[..., NDArray[np.int64]]] = {
    "budget": budget.plan,
    "rebalance": rebalance.plan,
}

DEFAULT_STRATEGY = "mixed"


def _summary(fn: PlanFn) -> str:
    """The first line of a strategy module's docstring, without its leading name."""
    line = (sys.modules[fn.__module__].__doc__ or "").strip().splitlines()[0]
    line = line.split(":", 1)[1].strip() if line.startswith("``") and ":" in line else line
    return line.replace("``", "")


#: One line per registered strategy, for ``--strategy`` help: ``name: summary``.
STRATEGY_HELP = "\n".join(f"{name}: {_summary(fn)}" for name, fn in STRATEGIES.items())


def plan_epoch(
    strategy: str,
    costs: NDArray[np.float64],
    world_size: int,
    batch_size: int,
    *,
    seed: int,
    epoch: int,
    bucket_ids: NDArray[np.int32] | None = None,
    limits: PoolLimits | None = None,
    speeds: NDArray[np.float64] | None = None,
) -> NDArray[np.int64]:
    """Plan one epoch with a registered strategy, then check the caps.

    Args:
        strategy: a key of ``STRATEGIES``.
        costs: (P,) finite costs >= 0 of the pool; ``P % (world_size * batch_size) == 0``, or
            ``P >= world_size`` for ``ANY_POOL`` ones.
        world_size: W >= 1 ranks.
        batch_size: B >= 1 samples per rank per step.
        seed: run seed >= 0; with ``epoch`` and the strategy (``SEEDED_AS`` the one it is seeded as) it
            seeds ``seeds.rng(seed, epoch, strategy)``.
        epoch: epoch index >= 0.
        bucket_ids: optional (P,) bucket ids >= 0 (used by ``stratified``).
        limits: optional caps with the pool's points; honoured by ``budget``, checked for all.
        speeds: optional (W,) relative rank speeds (``--rank-speed``): a ``SPEED_AWARE`` strategy plans
            for them; the others' steps hand the heaviest batch to the fastest rank
            (``speeds.fastest_heaviest``).

    Returns:
        (S, W, M) int64: equal-count strategies (P // (W*B), W, B), a permutation of ``arange(P)``;
        variable-count ones hold every pool entry once plus ``-1`` pads. The same arguments always
        give the same array.

    Raises:
        ValueError: bad arguments, or a rank-step over a cap (naming epoch, step, rank, value).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {sorted(STRATEGIES)}")
    if world_size < 1 or batch_size < 1:
        raise ValueError(f"world_size and batch_size must be >= 1, got {world_size}, {batch_size}")
    costs = np.ascontiguousarray(costs, dtype=np.float64)
    if costs.ndim != 1 or not np.isfinite(costs).all() or (costs < 0).any():
        raise ValueError("costs must be a 1-D array of finite values >= 0")
    step = world_size * batch_size
    variable, any_pool = strategy in VARIABLE_COUNT, strategy in ANY_POOL
    if costs.size % step and not any_pool:
        raise ValueError(f"pool size {costs.size} is not a multiple of W*B = {step}; use fit_pool")
    if any_pool and 0 < costs.size < world_size:
        raise ValueError(f"pool size {costs.size} is smaller than world_size {world_size}")
    if bucket_ids is not None:
        bucket_ids = np.asarray(bucket_ids)
        if bucket_ids.shape != costs.shape or (bucket_ids.size and bucket_ids.min() < 0):
            raise ValueError("bucket_ids must be (P,) ints >= 0")
    shape = (costs.size // step, world_size, batch_size)
    if costs.size == 0:
        return np.empty(shape, dtype=np.int64)
    rng = seeds.rng(seed, epoch, SEEDED_AS.get(strategy, strategy))
    if speeds is not None:
        speeds = np.asarray(speeds, dtype=np.float64)
        if speeds.shape != (world_size,) or not (np.isfinite(speeds) & (speeds > 0)).all():
            raise ValueError(f"speeds must be {world_size} finite values > 0")
    if speeds is not None and strategy in SPEED_AWARE:
        out = SPEED_AWARE[strategy](costs, world_size, batch_size, rng, bucket_ids, limits, speeds)
    else:
        out = STRATEGIES[strategy](costs, world_size, batch_size, rng, bucket_ids, limits)
        if speeds is not None:
            out = fastest_heaviest(out, costs, speeds)
    wrong = out.shape[1] != world_size or (out[..., 0] < 0).any() or (not any_pool and len(out) > shape[0])
    if wrong if variable else out.shape != shape:
        raise AssertionError(f"strategy {strategy!r} returned a plan of shape {out.shape}, expected {shape}")
    check_caps(out, limits, costs, epoch)
    return out

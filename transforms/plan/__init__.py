"""Epoch planners: which pool entries each rank trains on at each step.

A plan for one epoch is an int64 array of shape ``(S, W, B)`` (steps x ranks x slots) whose
entries index the epoch's fitted pool; every pool entry appears exactly once. Each strategy is
one module exporting ``plan(costs, world_size, batch_size, rng, bucket_ids)``; ``STRATEGIES``
maps names to those functions and ``plan_epoch`` validates inputs, seeds the generator and
dispatches. Balance metrics live in ``lidarshard.transforms.plan.metrics``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan import balanced, megabatch, stratified
from lidarshard.transforms.plan import random as random_

__all__ = ["PlanFn", "STRATEGIES", "DEFAULT_STRATEGY", "plan_epoch", "strategy_salt"]

#: ``plan(costs (P,), world_size, batch_size, rng, bucket_ids (P,) | None) -> (S, W, B) int64``.
PlanFn = Callable[
    [NDArray[np.float64], int, int, np.random.Generator, NDArray[np.int32] | None], NDArray[np.int64]
]

STRATEGIES: dict[str, PlanFn] = {
    "random": random_.plan,
    "stratified": stratified.plan,
    "balanced": balanced.plan,
    "megabatch": megabatch.plan,
}

DEFAULT_STRATEGY = "balanced"


def strategy_salt(strategy: str) -> int:
    """Stable per-strategy integer mixed into the seed (CRC-32 of the name, not ``hash()``)."""
    return zlib.crc32(strategy.encode("utf-8"))


def plan_epoch(
    strategy: str,
    costs: NDArray[np.float64],
    world_size: int,
    batch_size: int,
    *,
    seed: int,
    epoch: int,
    bucket_ids: NDArray[np.int32] | None = None,
) -> NDArray[np.int64]:
    """Plan one epoch with a registered strategy.

    Args:
        strategy: a key of ``STRATEGIES``.
        costs: (P,) finite costs >= 0 of the fitted pool, ``P % (world_size * batch_size) == 0``.
        world_size: W >= 1 ranks.
        batch_size: B >= 1 samples per rank per step.
        seed: run seed >= 0; with ``epoch`` and the strategy it seeds
            ``np.random.default_rng([seed, epoch, strategy_salt(strategy)])``.
        epoch: epoch index >= 0.
        bucket_ids: optional (P,) bucket ids >= 0 (used by ``stratified``).

    Returns:
        (P // (W*B), W, B) int64, a permutation of ``arange(P)``; the same arguments always give
        the same array.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {sorted(STRATEGIES)}")
    if world_size < 1 or batch_size < 1:
        raise ValueError(f"world_size and batch_size must be >= 1, got {world_size}, {batch_size}")
    costs = np.ascontiguousarray(costs, dtype=np.float64)
    if costs.ndim != 1 or not np.isfinite(costs).all() or (costs < 0).any():
        raise ValueError("costs must be a 1-D array of finite values >= 0")
    step = world_size * batch_size
    if costs.size % step:
        raise ValueError(f"pool size {costs.size} is not a multiple of W*B = {step}; use fit_pool")
    if bucket_ids is not None:
        bucket_ids = np.asarray(bucket_ids)
        if bucket_ids.shape != costs.shape or (bucket_ids.size and bucket_ids.min() < 0):
            raise ValueError("bucket_ids must be (P,) ints >= 0")
    shape = (costs.size // step, world_size, batch_size)
    if costs.size == 0:
        return np.empty(shape, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch, strategy_salt(strategy)])
    out = STRATEGIES[strategy](costs, world_size, batch_size, rng, bucket_ids)
    if out.shape != shape:
        raise AssertionError(f"strategy {strategy!r} returned shape {out.shape}, expected {shape}")
    return out

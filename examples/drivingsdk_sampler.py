"""The nearest peer's sampler, written from its documented algorithm: DrivingSDK-style sorted buckets.

Ascend's DrivingSDK (mx_driving ``CapacityBucketingDynamicDataset`` + ``ReplicasDistributedSampler``)
balances data-parallel ranks by size: sort the samples by voxel count, cut the sorted list into
buckets of W consecutive samples (one per rank), shuffle the bucket order and each bucket's members,
and give member i of every bucket to rank i. Buckets are cut once and never change, so the same
samples meet at a step every epoch.

What this implementation chose where the documentation is silent:
- size = the manifest's ``occupied_voxels`` (``num_points`` when the manifest has no voxel counts);
  ties keep the samples' index order (a stable sort).
- P % W samples that fill no bucket are left out, chosen once from the seed (fixed, like the buckets).
- batch size B: rank i's batch at step s is member i of the buckets s*B .. s*B+B-1 of the epoch's
  bucket order; the K % B buckets left at the end of an epoch's order are not trained that epoch.
- the epoch's bucket order and member order come from ``np.random.default_rng((seed, epoch))``.

    sampler = BucketBatchSampler(sizes, rank, world_size, batch_size, seed)   # a batch_sampler
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    sampler.set_epoch(epoch)
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

__all__ = ["BucketBatchSampler", "buckets", "epoch_plan"]


def buckets(sizes: NDArray[np.int64], world_size: int, seed: int) -> NDArray[np.int64]:
    """(K, W) sample indices: sorted by size, W consecutive samples a bucket, K = P // W.

    The P % W samples left over (chosen once from ``seed``) are in no bucket.
    """
    sizes = np.asarray(sizes)
    if world_size < 1 or sizes.size < world_size:
        raise ValueError(f"{sizes.size} samples cannot fill one bucket of {world_size} ranks")
    order = np.argsort(sizes, kind="stable")
    left = np.random.default_rng((seed, 0)).choice(order.size, order.size % world_size, replace=False)
    return np.delete(order, left).reshape(-1, world_size)


def epoch_plan(fixed: NDArray[np.int64], batch_size: int, seed: int, epoch: int) -> NDArray[np.int64]:
    """(S, W, B) sample indices of one epoch: bucket order and members shuffled, S = K // B."""
    rng = np.random.default_rng((seed, epoch + 1))
    shuffled = rng.permuted(fixed[rng.permutation(len(fixed))], axis=1)  # (K, W)
    steps = len(fixed) // batch_size
    return shuffled[: steps * batch_size].reshape(steps, batch_size, -1).transpose(0, 2, 1)


class BucketBatchSampler:
    """Rank ``rank``'s batches of the DrivingSDK-style plan (a ``DataLoader`` batch_sampler)."""

    def __init__(
        self, sizes: NDArray[np.int64], rank: int, world_size: int, batch_size: int, seed: int = 0
    ) -> None:
        if not 0 <= rank < world_size or batch_size < 1:
            raise ValueError(f"rank {rank} of {world_size}, batch size {batch_size}: not a plan")
        self.rank, self.batch_size, self.seed, self.epoch = rank, batch_size, seed, 0
        self.fixed = buckets(sizes, world_size, seed)

    def set_epoch(self, epoch: int) -> None:
        """Like ``DistributedSampler.set_epoch``: the next iteration draws epoch ``epoch``'s order."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.fixed) // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        plan = epoch_plan(self.fixed, self.batch_size, self.seed, self.epoch)
        for step in plan:
            yield step[self.rank].tolist()

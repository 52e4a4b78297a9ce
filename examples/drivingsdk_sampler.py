"""The nearest peer as shipped: DrivingSDK's load balancing (mx_driving), re-implemented from its code.

Ascend's DrivingSDK balances data-parallel ranks by size with three pieces of ``mx_driving``, read at
github.com/Ascend/DrivingSDK (``mx_driving/dataset/utils/dynamic_sampler.py``, ``dynamic_dataset.py``,
``dynamic_transform.py``, ``mx_driving/dataset/point_dataset.py``). What they do, and what this module
re-implements (our own code, the same behaviour):

1. **The size key** (``get_voxel_number_from_mean_vfe``, run once when the info files are generated): the
   keyframe plus its sweeps (OpenPCDet's info files pad a scene start's sweep list with copies of the
   keyframe or of the last sweep, which add no voxel), sweep points within 1 m of the sensor in x and y
   dropped, voxelized at [0.075, 0.075, 0.2] m in the range x, y in [-54, 54) m, z in [-5, 3) m with at
   most 120,000 voxels: the key is the number of occupied voxels, capped at 120,000 (``voxel_key``).
2. **The buckets** (``PointCloudDynamicDataset.sorting`` + ``CapacityBucketingDynamicDataset.bucketing``):
   the samples sorted by that key, largest first (Python's stable sort: ties keep the info files' order),
   cut into consecutive buckets of ``bucket_capacity`` samples (8 = the world size in its CenterPoint
   example); when N % capacity != 0 the last bucket (the smallest samples) is shorter (``buckets``).
3. **The sampler** (``ReplicasDistributedSampler``, shuffle on): every epoch, a generator seeded with the
   epoch alone (no run seed) shuffles the bucket order and each bucket's members; member i of every bucket
   goes to replica list i; the W replica lists are shuffled and concatenated; the list is padded with its
   own head to ``ceil(N / W) * W`` entries and rank r takes the r-th contiguous block of ``ceil(N / W)``
   (``rank_indices``). The DataLoader cuts each rank's block into batches of B (the last one short).

When N % W == 0 every replica list holds one member of every bucket and rank r's k-th sample is a member of
the epoch's k-th bucket: each step holds whole buckets of sorted neighbours. When N % W != 0 the short
bucket makes some replica lists one longer than the others, the contiguous blocks no longer start where the
lists do, and the ranks drift apart by up to W - 1 positions: a step then mixes buckets of random sizes
(nuScenes' 28,130 training samples on 8 ranks: N % 8 = 2). The shuffles are ``numpy.random.default_rng``'s
(mx_driving's are ``torch.randperm`` with ``torch.Generator().manual_seed(epoch)``): the same structure,
other permutations.

    sizes = [voxel_key(points_of(i), is_sweep_of(i)) for i in range(n)]
    sampler = BucketBatchSampler(sizes, rank, world_size, batch_size)   # a DataLoader batch_sampler
    sampler.set_epoch(epoch)
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "VOXEL_SIZE",
    "POINT_RANGE",
    "MAX_VOXELS",
    "voxel_key",
    "buckets",
    "rank_indices",
    "epoch_plan",
    "BucketBatchSampler",
]

#: mx_driving's fixed voxel size (m), range (x0, y0, z0, x1, y1, z1; m) and voxel cap of the size key.
VOXEL_SIZE = (0.075, 0.075, 0.2)
POINT_RANGE = (-54.0, -54.0, -5.0, 54.0, 54.0, 3.0)
MAX_VOXELS = 120_000


def voxel_key(points: NDArray[np.floating], sweep: NDArray[np.bool_] | None = None) -> int:
    """mx_driving's size key of one sample: occupied voxels at ``VOXEL_SIZE`` in ``POINT_RANGE``, at most
    ``MAX_VOXELS``.

    Args:
        points: (N, C >= 3) x, y, z (m) of the keyframe and its sweeps, in the keyframe's frame.
        sweep: (N,) True for sweep points (those within 1 m of the sensor in x and y are dropped), or None.
    """
    xyz = np.asarray(points, dtype=np.float64)[:, :3]
    if sweep is not None:
        near = (np.abs(xyz[:, 0]) < 1.0) & (np.abs(xyz[:, 1]) < 1.0)
        xyz = xyz[~(np.asarray(sweep, dtype=bool) & near)]
    low, high, size = np.asarray(POINT_RANGE[:3]), np.asarray(POINT_RANGE[3:]), np.asarray(VOXEL_SIZE)
    grid = np.round((high - low) / size).astype(np.int64)  # 1440 x 1440 x 40
    cell = np.floor((xyz - low) / size).astype(np.int64)
    inside = ((cell >= 0) & (cell < grid)).all(axis=1)
    cell = cell[inside]
    flat = (cell[:, 0] * grid[1] + cell[:, 1]) * grid[2] + cell[:, 2]
    return int(min(np.unique(flat).size, MAX_VOXELS))


def buckets(keys: NDArray[np.integer], capacity: int) -> list[NDArray[np.int64]]:
    """The fixed buckets: sample indices sorted by key, largest first (ties in index order), cut into
    consecutive runs of ``capacity`` (the last one shorter when ``len(keys) % capacity``)."""
    if capacity < 1:
        raise ValueError(f"bucket capacity must be >= 1, got {capacity}")
    order = np.argsort(-np.asarray(keys, dtype=np.float64), kind="stable").astype(np.int64)
    return [order[i : i + capacity] for i in range(0, order.size, capacity)]


def rank_indices(fixed: list[NDArray[np.int64]], world_size: int, epoch: int) -> NDArray[np.int64]:
    """(W, ceil(N / W)) each rank's samples of epoch ``epoch`` in order (``ReplicasDistributedSampler``)."""
    n = sum(b.size for b in fixed)
    if world_size < 1 or n < 1:
        raise ValueError(f"{n} samples cannot be sampled on {world_size} ranks")
    rng = np.random.default_rng(epoch)  # the epoch alone seeds the shuffles, as in mx_driving
    lists: list[list[int]] = [[] for _ in range(world_size)]
    for b in rng.permutation(len(fixed)):
        for i, member in enumerate(fixed[b][rng.permutation(fixed[b].size)].tolist()):
            lists[i].append(member)
    flat = np.asarray([m for r in rng.permutation(world_size) for m in lists[r]], dtype=np.int64)
    per_rank = -(-n // world_size)
    flat = np.resize(flat, per_rank * world_size)  # padded with its own head
    return flat.reshape(world_size, per_rank)


def epoch_plan(
    fixed: list[NDArray[np.int64]], world_size: int, batch_size: int, epoch: int
) -> NDArray[np.int64]:
    """(S, W, B) sample indices of one epoch, ``-1`` in the short last batch: each rank's block of
    ``rank_indices`` cut into batches of B (``S = ceil(ceil(N / W) / B)``)."""
    per = rank_indices(fixed, world_size, epoch)
    steps = -(-per.shape[1] // batch_size)
    out = np.full((world_size, steps * batch_size), -1, dtype=np.int64)
    out[:, : per.shape[1]] = per
    return out.reshape(world_size, steps, batch_size).transpose(1, 0, 2).copy()


class BucketBatchSampler:
    """Rank ``rank``'s batches of the shipped DrivingSDK plan (a ``DataLoader`` batch_sampler); buckets of
    ``world_size`` samples, as its CenterPoint example sets ``bucket_capacity`` to the NPU count."""

    def __init__(self, keys: NDArray[np.integer], rank: int, world_size: int, batch_size: int) -> None:
        if not 0 <= rank < world_size or batch_size < 1:
            raise ValueError(f"rank {rank} of {world_size}, batch size {batch_size}: not a plan")
        self.rank, self.world_size, self.batch_size, self.epoch = rank, world_size, batch_size, 0
        self.fixed = buckets(keys, world_size)

    def set_epoch(self, epoch: int) -> None:
        """Like ``DistributedSampler.set_epoch``: the next iteration draws epoch ``epoch``'s order."""
        self.epoch = epoch

    def __len__(self) -> int:
        per_rank = -(-sum(b.size for b in self.fixed) // self.world_size)
        return -(-per_rank // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        for step in epoch_plan(self.fixed, self.world_size, self.batch_size, self.epoch):
            yield [int(i) for i in step[self.rank] if i >= 0]

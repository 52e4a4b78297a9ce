"""examples/drivingsdk_sampler.py: DrivingSDK's load balancing as mx_driving ships it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def _sampler() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "drivingsdk_sampler", REPO / "examples/drivingsdk_sampler.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_key_counts_its_voxels_in_its_range_with_its_cap() -> None:
    m = _sampler()
    pts = np.array([[0.01, 0.01, 0.0], [0.02, 0.02, 0.1], [0.1, 0.0, 0.0], [60.0, 0.0, 0.0], [0.0, 0.0, 3.5]])
    assert m.voxel_key(pts) == 2  # two share a 0.075 x 0.075 x 0.2 voxel; x 60 m and z 3.5 m are outside
    assert (
        m.voxel_key(pts, np.array([True, False, False, False, False])) == 2
    )  # a sweep point within 1 m goes
    assert m.voxel_key(pts, np.array([False, False, True, False, False])) == 1
    grid = np.stack(np.meshgrid(np.arange(400), np.arange(400), [0.0], indexing="ij"), -1).reshape(-1, 3)
    assert m.voxel_key(grid * [0.1, 0.1, 1.0] - [20.0, 20.0, 0.0]) == m.MAX_VOXELS  # 160,000 voxels, capped


def test_buckets_are_sorted_largest_first_and_the_last_is_short() -> None:
    m = _sampler()
    keys = np.array([5, 9, 9, 1, 7, 3, 8, 2, 6, 4])
    fixed = m.buckets(keys, 4)
    assert [b.tolist() for b in fixed] == [[1, 2, 6, 4], [8, 0, 9, 5], [7, 3]]  # ties in index order


def test_a_multiple_of_w_keeps_whole_buckets_in_every_step() -> None:
    m = _sampler()
    keys = np.random.default_rng(3).integers(100, 10_000, 32)
    fixed = m.buckets(keys, 4)
    for batch in (1, 2):
        plan = m.epoch_plan(fixed, 4, batch, epoch=1)
        assert plan.shape == (8 // batch, 4, batch) and sorted(plan.ravel().tolist()) == list(range(32))
        members = {frozenset(b.tolist()) for b in fixed}
        for step in plan:
            for k in range(batch):  # the k-th sample of every rank's batch: one bucket
                assert frozenset(step[:, k].tolist()) in members
    assert not np.array_equal(m.epoch_plan(fixed, 4, 1, 0), m.epoch_plan(fixed, 4, 1, 1))


def test_a_remainder_pads_with_the_head_and_shifts_the_ranks_apart() -> None:
    """N % W != 0: one bucket is short, the replica lists differ in length, each rank's contiguous block
    starts off its list: steps mix buckets, and the head of the list is trained twice."""
    m = _sampler()
    keys = np.arange(34)[::-1]  # already sorted: bucket k holds keys 4k .. 4k+3 (a 2-sample last bucket)
    fixed = m.buckets(keys, 4)
    per = m.rank_indices(fixed, 4, epoch=0)
    assert per.shape == (4, 9) and np.bincount(per.ravel()).max() == 2 and len(np.unique(per)) == 34
    plan = m.epoch_plan(fixed, 4, 1, epoch=0)
    spread = [len({i // 4 for i in step[:, 0].tolist()}) for step in plan]
    assert max(spread) > 1  # some step holds samples of different buckets


def test_the_batch_sampler_replays_its_rank() -> None:
    m = _sampler()
    keys = np.random.default_rng(1).integers(1, 100, 23)
    ranks = [m.BucketBatchSampler(keys, r, 4, 2) for r in range(4)]
    for s in ranks:
        s.set_epoch(2)
    got = [list(s) for s in ranks]
    plan = m.epoch_plan(ranks[0].fixed, 4, 2, 2)
    assert len(ranks[0]) == plan.shape[0] == 3
    assert got[1] == [[int(i) for i in step[1] if i >= 0] for step in plan]
    with pytest.raises(ValueError, match="rank 4 of 4"):
        m.BucketBatchSampler(keys, 4, 4, 1)

"""examples/drivingsdk_sampler.py: the DrivingSDK-style sorted buckets, as its docstring states them."""

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


SIZES = np.random.default_rng(3).integers(100, 10_000, 23)  # 23 % 4 = 3 samples fill no bucket


def test_buckets_are_consecutive_in_size_order_and_fixed() -> None:
    m = _sampler()
    fixed = m.buckets(SIZES, 4, seed=7)
    assert fixed.shape == (5, 4) and len(np.unique(fixed)) == 20
    order = np.argsort(SIZES, kind="stable")
    kept = order[np.isin(order, fixed)]
    np.testing.assert_array_equal(fixed.ravel(), kept)  # W consecutive of the sorted kept samples
    np.testing.assert_array_equal(m.buckets(SIZES, 4, seed=7), fixed)  # the seed fixes them
    with pytest.raises(ValueError, match="cannot fill one bucket"):
        m.buckets(SIZES[:3], 4, seed=0)


@pytest.mark.parametrize("batch", [1, 2])
def test_member_i_of_each_bucket_goes_to_rank_i_in_a_new_order_each_epoch(batch: int) -> None:
    m = _sampler()
    world = 4
    samplers = [m.BucketBatchSampler(SIZES, r, world, batch, seed=7) for r in range(world)]
    fixed = {frozenset(b.tolist()) for b in samplers[0].fixed}
    epochs = []
    for epoch in (0, 1):
        for s in samplers:
            s.set_epoch(epoch)
        steps = list(zip(*(list(s) for s in samplers), strict=True))  # (S, W) batches
        assert len(steps) == len(samplers[0]) == 5 // batch
        for step in steps:
            assert all(len(b) == batch for b in step)
            for k in range(batch):  # the k-th sample of every rank's batch: one fixed bucket
                assert frozenset(b[k] for b in step) in fixed
        epochs.append(steps)
    assert epochs[0] != epochs[1]  # bucket order and members reshuffled
    assert m.epoch_plan(samplers[0].fixed, batch, 7, 1).tolist() == [list(map(list, s)) for s in epochs[1]]


def test_a_bad_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 2 of 2"):
        _sampler().BucketBatchSampler(SIZES, 2, 2, 1)

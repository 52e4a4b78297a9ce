"""lidarshard.loaders.elastic: switching world size mid-epoch skips and repeats nothing, and stays balanced."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lidarshard.loaders import ManifestReader, load_manifest, read_samples
from lidarshard.loaders.elastic import (
    ElasticBatchSampler,
    ElasticPlan,
    load_epoch_plan,
    merge_ranks,
    replan_remaining,
)
from lidarshard.pipelines import build as build_cli
from lidarshard.transforms.plan import plan_epoch
from lidarshard.transforms.plan.metrics import linearity
from tests.helpers import BEAM_TEST_FLAGS, make_bins
from tests.manifest_fixture import make_fixture

W, B = 8, 2  # the manifest's plan; 197 clouds -> 12 steps of 16 per epoch, 5 dropped


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("elastic")
    inp = make_bins(tmp / "in", n=197, seed=3)
    flags = ["--world-size", str(W), "--batch-size", str(B), "--epochs", "2", "--cost-model", "points"]
    assert (
        build_cli.run([str(inp), str(tmp / "out"), *flags, "--max-reject-fraction", "0.1", *BEAM_TEST_FLAGS])
        == 0
    )
    return tmp / "out"


def _accounted(p: ElasticPlan) -> Counter:
    """consumed + remaining + dropped - padded, as a multiset of samples.parquet rows."""
    total = Counter(p.consumed.tolist()) + Counter(p.rows.ravel().tolist()) + Counter(p.dropped.tolist())
    total.subtract(Counter(p.padded.tolist()))
    return +total


def _linearity(rows: np.ndarray, costs: np.ndarray) -> float:
    return linearity(rows, costs) if rows.size else 1.0


def test_import_pulls_neither_beam_nor_torch() -> None:
    code = "import sys, lidarshard.loaders.elastic; assert not {'apache_beam', 'torch'} & set(sys.modules)"
    subprocess.run(
        [sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], check=True, timeout=60
    )


def test_load_epoch_plan_is_the_manifest(built: Path) -> None:
    p = load_epoch_plan(built, 1)
    ids = read_samples(built, ["sample_id"])["sample_id"].to_pylist()
    assert (p.steps, p.world_size, p.batch_size, p.history) == (12, W, B, ())
    for r in range(W):
        planned = [s for b in ManifestReader(built, r, W, 1) for s in b.sample_ids]
        assert [ids[i] for i in p.rows[:, r].ravel()] == planned
    stats = load_manifest(built)["balance"][1]
    assert p.balance()["linearity"] == pytest.approx(stats["linearity"], abs=1e-6)


@pytest.mark.parametrize(
    ("consumed", "world", "batch", "how"),
    [
        (5, 4, None, "merge"),  # 16 -> 8 style halving: batch 2B, global batch kept
        (5, 4, B, "merge"),  # halving with the per-rank batch kept: twice the steps
        (3, 1, None, "merge"),
        (5, 3, 2, "replan"),  # 7 steps x 16 = 112 entries over 3x2: 4 dropped (drop_last)
        (4, 16, 1, "replan"),  # growing
        (5, 6, None, "replan"),  # global batch 16 does not split over 6: error
        (0, 5, 3, "replan"),  # the whole epoch on another size
        (12, 3, 2, "replan"),  # epoch finished: nothing left
        (6, W, B, "keep"),  # restarted on the same size
    ],
)
def test_switch_skips_and_repeats_nothing_and_stays_balanced(
    built: Path, consumed: int, world: int, batch: int | None, how: str
) -> None:
    base = load_epoch_plan(built, 0)
    if batch is None and (W * B) % world:
        with pytest.raises(ValueError, match="pass batch_size"):
            base.switch(consumed, world, batch)
        return
    p = replan_remaining(built, 0, consumed, world, batch)
    b = batch or W * B // world
    assert (p.world_size, p.batch_size, p.history) == (world, b, ((consumed, world, b),))
    assert _accounted(p) == Counter(base.rows.ravel().tolist())
    assert p.consumed.tolist() == base.rows[:consumed].ravel().tolist()
    assert p.padded.size == 0 and p.dropped.size == (base.rows[consumed:].size % (world * b))
    rest = _linearity(base.rows[consumed:], base.costs)
    got = p.balance()
    if how in ("merge", "keep"):
        # never below the original over the same steps (each merged rank sums balanced ranks)
        assert p.dropped.size == 0 and got["linearity"] >= rest - 1e-12
    elif p.steps:
        assert got["linearity"] >= got["bound"] - 0.01
    assert (
        replan_remaining(built, 0, consumed, world, batch).rows.tolist() == p.rows.tolist()
    )  # deterministic


def test_pad_policy_repeats_and_records(built: Path) -> None:
    base = replace(load_epoch_plan(built, 0), policy="pad")
    p = base.switch(5, 3, 2)  # 112 entries -> 114
    assert (p.padded.size, p.dropped.size, p.rows.size) == (2, 0, 114)
    assert _accounted(p) == Counter(base.rows.ravel().tolist())


def test_chained_switches(built: Path) -> None:
    base = load_epoch_plan(built, 0)
    p = base.switch(3, 4).switch(2, 2).switch(1, 3, 5)  # 8 -> 4 -> 2 ranks (merges) -> 3 ranks (re-plan)
    assert p.history == ((3, 4, 4), (2, 2, 8), (1, 3, 5))
    assert _accounted(p) == Counter(base.rows.ravel().tolist())
    assert p.consumed.size == 3 * 16 + 2 * 16 + 1 * 16
    assert p.balance()["linearity"] >= p.balance()["bound"] - 0.01


def test_merge_ranks_layout() -> None:
    rows = np.arange(2 * 4 * 3).reshape(2, 4, 3)
    merged = merge_ranks(rows, 2)
    assert merged.shape == (2, 2, 6) and merged[1, 1].tolist() == rows[1, 2:].ravel().tolist()
    stepped = merge_ranks(rows, 2, keep_batch_size=True)
    assert stepped.shape == (4, 2, 3) and stepped[3, 1].tolist() == rows[1, 3].tolist()
    with pytest.raises(ValueError, match="does not divide"):
        merge_ranks(rows, 3)


def _run(samplers: list[ElasticBatchSampler], steps: int | None = None) -> list[list[list[int]]]:
    """Each rank's batches, in lockstep, for ``steps`` steps (all when None)."""
    its = [iter(s) for s in samplers]
    out: list[list[list[int]]] = [[] for _ in samplers]
    for _ in range(steps if steps is not None else len(samplers[0])):
        for r, it in enumerate(its):
            out[r].append(next(it))
    return out


def test_sampler_restart_on_half_the_ranks_mid_epoch(built: Path) -> None:
    ids = read_samples(built, ["sample_id"])["sample_id"].to_pylist()
    old = [ElasticBatchSampler(built, r, W) for r in range(W)]
    for s in old:
        s.set_epoch(1)
    before = _run(old, 5)
    state = old[0].state_dict()  # what the checkpoint stores; the step is the same on every rank
    assert state == {"epoch": 1, "step": 5, "world_size": W, "batch_size": B, "history": []}
    new = [ElasticBatchSampler(built, r, W // 2) for r in range(W // 2)]
    for s in new:
        s.load_state_dict(state)
        s.set_epoch(1)  # the usual loop calls it again: the position is kept
    after = _run(new)
    assert len(new[0]) == 7 and {len(b) for rank in after for b in rank} == {2 * B}
    seen = Counter(i for rank in before + after for batch in rank for i in batch)
    planned = Counter(
        ids.index(s) for r in range(W) for b in ManifestReader(built, r, W, 1) for s in b.sample_ids
    )
    assert seen == planned  # nothing skipped, nothing repeated
    # a second restart (4 -> 3 ranks, re-plan) chains on the saved history
    state2 = new[0].state_dict()
    assert state2["history"] == [[5, 4, 4]] and state2["step"] == 7
    third = ElasticBatchSampler(built, 0, 3, batch_size=5)
    third.load_state_dict(state2)
    assert third.history == [(5, 4, 4), (7, 3, 5)] and len(third) == 0
    # the next epoch is planned whole on the new size (a merge of the manifest's epoch)
    nxt = [ElasticBatchSampler(built, r, W // 2) for r in range(W // 2)]
    for s in nxt:
        s.set_epoch(0)
    got = Counter(i for rank in _run(nxt) for b in rank for i in b)
    assert got == Counter(load_epoch_plan(built, 0).rows.ravel().tolist())


def test_sampler_on_the_manifest_size_replays_it_with_index_of(built: Path) -> None:
    ids = read_samples(built, ["sample_id"])["sample_id"].to_pylist()
    reverse = {s: len(ids) - 1 - i for i, s in enumerate(ids)}
    s = ElasticBatchSampler(built, 3, W, index_of=reverse)
    expect = [[reverse[x] for x in b.sample_ids] for b in ManifestReader(built, 3, W, 0)]
    assert list(s) == expect
    with pytest.raises(KeyError, match="not in index_of"):
        list(ElasticBatchSampler(built, 0, W, index_of={}))
    with pytest.raises(ValueError, match="pass batch_size"):
        ElasticBatchSampler(built, 0, 6)
    s.set_epoch(2)
    with pytest.raises(ValueError, match="not planned"):
        len(s)


def _plan(costs: np.ndarray, w: int, b: int, strategy: str = "balanced") -> ElasticPlan:
    empty = np.empty(0, np.int64)
    rows = plan_epoch(strategy, costs, w, b, seed=0, epoch=0)
    return ElasticPlan(
        rows, costs, empty, empty, empty, epoch=0, seed=0, strategy=strategy, policy="drop_last"
    )


@settings(max_examples=40, deadline=None)
@given(
    steps=st.integers(1, 12),
    w=st.integers(1, 6),
    b=st.integers(1, 4),
    new_w=st.integers(1, 9),
    new_b=st.integers(1, 5),
    frac=st.floats(0, 1),
    strategy=st.sampled_from(["balanced", "mixed", "stratified", "random", "megabatch"]),
    seed=st.integers(0, 2**16),
)
def test_switch_invariants(
    steps: int, w: int, b: int, new_w: int, new_b: int, frac: float, strategy: str, seed: int
) -> None:
    costs = np.exp(np.random.default_rng(seed).normal(8, 0.7, steps * w * b))
    base = _plan(costs, w, b, strategy)
    consumed = int(frac * steps)
    p = base.switch(consumed, new_w, new_b)
    assert p.rows.shape[1:] == (new_w, new_b) and p.rows.dtype == np.int64
    assert _accounted(p) == Counter(base.rows.ravel().tolist())
    assert p.dropped.size < new_w * new_b


def test_sampler_under_a_prefetching_plan_loader_resumes_on_half_the_ranks(built: Path) -> None:
    """A crash while 2 workers hold prefetched batches: the checkpoint counts trained batches, so the
    restart on W/2 ranks trains exactly the rest of the epoch."""
    torch = pytest.importorskip("torch")
    from lidarshard.loaders.torch import PlanLoader

    n = len(read_samples(built, ["sample_id"]))
    items = list(range(n))
    trained, states = Counter(), []
    for r in range(W):
        sampler = ElasticBatchSampler(built, r, W)
        sampler.set_epoch(1)
        loader = PlanLoader(items, sampler, num_workers=2, prefetch_factor=4, collate_fn=list)
        for step, batch in enumerate(loader):
            if step == 5:
                break  # the crash: batch 5 was received but not trained
            trained.update(batch)
            states.append(sampler.state_dict())
        del loader
    assert {s["step"] for s in states[4::5]} == {5}  # not the 5 + prefetched batches the workers held
    new = [ElasticBatchSampler(built, r, W // 2) for r in range(W // 2)]
    for s in new:
        s.load_state_dict(states[-1])
        s.set_epoch(1)
        assert len(s) == 7
        trained.update(i for b in PlanLoader(items, s, num_workers=2, collate_fn=list) for i in b)
    assert trained == Counter(load_epoch_plan(built, 1).rows.ravel().tolist())
    sampler = ElasticBatchSampler(built, 0, W)
    it = iter(torch.utils.data.DataLoader(items, batch_sampler=sampler, num_workers=2))
    next(it)
    with pytest.raises(RuntimeError, match="prefetches batches ahead of training.*PlanLoader"):
        sampler.state_dict()
    del it


def test_budget_manifest_is_replanned_with_budget_on_any_new_size(tmp_path: Path) -> None:
    sizes = [int(v) for v in np.random.default_rng(2).lognormal(5.0, 1.0, 60).astype(int) + 5]
    out = make_fixture(tmp_path, sizes, world_size=4, batch_size=2, epochs=1, budget=True)
    full = load_epoch_plan(out, 0)
    assert full.batch_size == 2 and (full.rows[..., 0] >= 0).all()
    for new_w, new_b in [(2, None), (3, 1), (4, 2)]:
        nxt = full.switch(2, new_w, new_b)
        left = nxt.rows[nxt.rows >= 0]
        assert nxt.world_size == new_w and (nxt.rows[..., 0] >= 0).all()  # no empty rank-step
        assert nxt.dropped.size == nxt.padded.size == 0
        np.testing.assert_array_equal(np.sort(np.concatenate([nxt.consumed, left])), np.arange(len(sizes)))
        assert nxt.balance()["linearity"] >= nxt.balance()["bound"] - 0.01
    again = full.switch(2, 3, 1)
    np.testing.assert_array_equal(again.rows, full.switch(2, 3, 1).rows)  # a pure function of the history
    sampler = ElasticBatchSampler(out, 1, 3, batch_size=1)
    assert all(len(b) >= 1 for b in sampler) and len(list(sampler)) == len(sampler)

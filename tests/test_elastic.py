"""lidarshard.loaders.elastic: a restart on any world size trains every planned entry of the epoch exactly as
often as planned (or refuses in one line), stays balanced, and never loads a state of another plan."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lidarshard import schemas
from lidarshard.loaders import ManifestReader, load_manifest, read_samples
from lidarshard.loaders.elastic import (
    ElasticBatchSampler,
    ElasticPlan,
    load_epoch_plan,
    merge_ranks,
    replan_remaining,
)
from lidarshard.loaders.reshard import check_exact, replan_pool
from lidarshard.transforms.plan import plan_epoch
from lidarshard.transforms.plan.metrics import linearity
from tests.elastic_fixture import plan_manifest
from tests.helpers import slow_after

REPO = Path(__file__).resolve().parents[1]
W, B = 8, 2  # the manifest's plan; 197 samples -> 12 steps of 16 per epoch, 5 dropped
STRATEGIES = ["mixed", "balanced", "stratified", "random", "megabatch", "budget"]


def _costs(n: int, seed: int = 3) -> np.ndarray:
    return np.exp(np.random.default_rng(seed).normal(7.0, 0.6, n)).round(3)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return plan_manifest(
        tmp_path_factory.mktemp("elastic") / "out", _costs(197), world_size=W, batch_size=B, epochs=2
    )


def _multiset(p: ElasticPlan) -> Counter:
    """consumed + remaining, as a multiset of samples rows."""
    return Counter(p.consumed.tolist()) + Counter(p.rows[p.rows >= 0].tolist())


def _planned(p: ElasticPlan) -> Counter:
    return Counter(p.rows[p.rows >= 0].tolist())


def test_import_pulls_neither_beam_nor_torch() -> None:
    code = "import sys, lidarshard.loaders.elastic; assert not {'apache_beam', 'torch'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_load_epoch_plan_is_the_manifest(built: Path) -> None:
    p = load_epoch_plan(built, 1)
    ids = read_samples(built, ["sample_id"])["sample_id"].to_pylist()
    assert (p.steps, p.world_size, p.batch_size, p.history) == (12, W, B, ())
    for r in range(W):
        planned = [s for b in ManifestReader(built, r, W, 1) for s in b.sample_ids]
        assert [ids[i] for i in p.rows[:, r].ravel()] == planned
    assert p.balance()["linearity"] == pytest.approx(load_manifest(built).balance[1].linearity, abs=1e-6)


@pytest.mark.parametrize(
    ("consumed", "world", "batch", "how", "steps"),
    [
        (5, 4, None, "merge", 7),  # 16 -> 8 style halving: batch 2B, global batch kept
        (5, 4, B, "merge", 14),  # halving with the per-rank batch kept: twice the steps
        (3, 1, None, "merge", 9),
        (5, 3, 2, "replan", 19),  # 112 entries over 3x2: 18 full steps + one of 4 (1, 1, 2)
        (5, 5, 3, "replan", 8),  # 112 = 7 x 15 + 7: a last step of 7 over 5 ranks
        (5, 5, 11, "replan", 2),  # 112 = 2 x 55 + 2 (< 5 ranks): folded into the last step
        (4, 16, 1, "replan", 8),  # growing
        (0, 5, 3, "replan", 13),  # the whole epoch on another size: 192 = 12 x 15 + 12
        (12, 3, 2, "replan", 0),  # epoch finished: nothing left
        (6, W, B, "keep", 6),  # restarted on the same size
    ],
)
def test_switch_trains_every_entry_once_more_and_stays_balanced(
    built: Path, consumed: int, world: int, batch: int | None, how: str, steps: int
) -> None:
    base = load_epoch_plan(built, 0)
    p = replan_remaining(built, 0, consumed, world, batch)
    b = batch or W * B // world
    assert (p.steps, p.world_size, p.batch_size, p.history) == (steps, world, b, ((consumed, world, b),))
    assert _multiset(p) == _planned(base)  # nothing dropped, nothing repeated
    assert p.consumed.tolist() == base.rows[:consumed].ravel().tolist()
    check_exact(base.rows, p.consumed, p.rows, base.costs.size, 0)  # every rank-step holds >= 1
    counts = p.counts()
    assert (counts[:-1] == world * b).all() and np.allclose(p.loss_scales(), world / np.maximum(counts, 1))
    rest = linearity(base.rows[consumed:], base.costs) if consumed < 12 else 1.0
    got = p.balance()
    if how in ("merge", "keep"):  # never below the original over the same steps
        assert got["linearity"] >= rest - 1e-12
    elif p.steps > 2:
        assert got["linearity"] >= got["greedy_reference"] - 0.02
    assert (
        replan_remaining(built, 0, consumed, world, batch).rows.tolist() == p.rows.tolist()
    )  # deterministic


def test_fewer_entries_left_than_ranks_is_one_line(built: Path) -> None:
    base = load_epoch_plan(built, 0)
    with pytest.raises(
        ValueError, match=r"16 planned entries are left in the epoch, fewer than world_size 17"
    ) as e:
        base.switch(11, 17, 1)
    assert "\n" not in str(e.value)
    six = base.switch(5, 6)  # 16 over 6 ranks: the default batch is ceil(16 / 6) = 3 (was refused)
    assert six.rows.shape[1] == 6 and _multiset(six) == _multiset(base)


def test_chained_switches(built: Path) -> None:
    base = load_epoch_plan(built, 0)
    p = base.switch(3, 4).switch(2, 2).switch(1, 3, 5)  # 8 -> 4 -> 2 ranks (merges) -> 3 ranks (re-plan)
    assert p.history == ((3, 4, 4), (2, 2, 8), (1, 3, 5))
    assert _multiset(p) == _planned(base)
    assert p.consumed.size == 3 * 16 + 2 * 16 + 1 * 16
    q = p.switch(2, 2, 4).switch(1, 7, 1)  # a merge-incompatible size after uneven steps, then growing
    assert _multiset(q) == _planned(base)


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
    old = [ElasticBatchSampler(built, r, W) for r in range(W)]
    for s in old:
        s.set_epoch(1)
    before = _run(old, 5)
    state = old[0].state_dict()  # what the checkpoint stores; the step is the same on every rank
    fingerprint = load_manifest(built).plan_fingerprint(1)
    assert state == {
        "epoch": 1,
        "step": 5,
        "world_size": W,
        "batch_size": B,
        "history": [],
        "seed": 0,
        "strategy": "mixed",
        "plan_fingerprint": fingerprint,
    }
    new = [ElasticBatchSampler(built, r, W // 2) for r in range(W // 2)]
    for s in new:
        s.load_state_dict(state)
        s.set_epoch(1)  # the usual loop calls it again: the position is kept
    after = _run(new)
    assert len(new[0]) == 7 and {len(b) for rank in after for b in rank} == {2 * B}
    seen = Counter(i for rank in before + after for batch in rank for i in batch)
    assert seen == _planned(load_epoch_plan(built, 1))  # nothing skipped, nothing repeated
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
    assert got == _planned(load_epoch_plan(built, 0))


def test_sampler_on_the_manifest_size_replays_it_with_index_of(built: Path) -> None:
    ids = read_samples(built, ["sample_id"])["sample_id"].to_pylist()
    reverse = {s: len(ids) - 1 - i for i, s in enumerate(ids)}
    s = ElasticBatchSampler(built, 3, W, index_of=reverse)
    expect = [[reverse[x] for x in b.sample_ids] for b in ManifestReader(built, 3, W, 0)]
    assert list(s) == expect
    with pytest.raises(KeyError, match="not in index_of"):
        list(ElasticBatchSampler(built, 0, W, index_of={}))
    assert ElasticBatchSampler(built, 0, 6).batch_size == 3  # ceil(W*B / 6): the documented default
    s.set_epoch(2)
    with pytest.raises(ValueError, match="not planned"):
        len(s)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.integers(1, 12),
    w=st.integers(1, 6),
    b=st.integers(1, 4),
    new_w=st.integers(1, 9),
    new_b=st.integers(1, 5),
    frac=st.floats(0, 1),
    strategy=st.sampled_from(STRATEGIES),
    seed=st.integers(0, 2**16),
)
def test_switch_invariants(
    steps: int, w: int, b: int, new_w: int, new_b: int, frac: float, strategy: str, seed: int
) -> None:
    costs = np.exp(np.random.default_rng(seed).normal(8, 0.7, steps * w * b))
    base = ElasticPlan.of(
        plan_epoch(strategy, costs, w, b, seed=0, epoch=0), costs, strategy=strategy, batch=b
    )
    consumed = int(frac * base.steps)
    left = int((base.rows[consumed:] >= 0).sum())
    merge = w % new_w == 0 and new_b in (b, w // new_w * b) and strategy != "budget"
    if 0 < left < new_w and not merge:
        with pytest.raises(ValueError, match="fewer than world_size"):
            base.switch(consumed, new_w, new_b)
        return
    p = base.switch(consumed, new_w, new_b)
    assert p.rows.shape[1] == new_w and p.rows.dtype == np.int64
    assert _multiset(p) == _planned(base)
    check_exact(base.rows, p.consumed, p.rows, costs.size, 0)


def test_replan_pool_spreads_or_folds_the_leftover() -> None:
    costs = np.arange(1.0, 21.0)
    spread = replan_pool(np.arange(20), costs, "balanced", 3, 2, seed=1, epoch=0)  # 3 x 6 + 2 -> fold
    assert spread.shape[0] == 3 and sorted(spread[spread >= 0].tolist()) == list(range(20))
    extra = replan_pool(np.arange(20), costs, "balanced", 4, 3, seed=1, epoch=0)  # 1 x 12 + 8 -> a step
    counts = (extra >= 0).sum(axis=2)
    assert counts.tolist()[0] == [3, 3, 3, 3] and sorted(counts[1].tolist()) == [2, 2, 2, 2]
    assert sorted(extra[1][extra[1] >= 0].tolist()) == list(range(8))  # the lightest entries are left over
    repeats = np.array([0, 0, 1, 2, 2, 2, 3])  # a weighted pool's multiset stays a multiset
    got = replan_pool(repeats, costs, "random", 2, 3, seed=0, epoch=0)
    assert Counter(got[got >= 0].tolist()) == Counter(repeats.tolist())


# ------------------------------------------------------------------------------------ crash and resume


def _trained(
    out: Path,
    kind: str,
    world: int,
    batch: int | None,
    k: int | None,
    workers: int,
    state: dict | None = None,
) -> tuple[Counter, dict, dict[int, int]]:
    """Train on ``world`` ranks (resuming ``state`` when given), checkpointing after every trained batch,
    until the crash after ``k`` trained batches (None: the epoch's end) on every rank.

    Returns:
        (entries trained, rank 0's last checkpoint, {step: samples of all ranks}).
    """
    import torch.utils.data as tud

    from lidarshard.loaders.torch import BalancedBatchSampler, PlanBatchSampler, PlanLoader, PlanSampler

    items = list(range(len(read_samples(out, ["sample_id"]))))
    trained: Counter = Counter()
    per_step: Counter = Counter()
    saved: dict = {}
    for r in range(world):
        if kind == "elastic":
            sampler = ElasticBatchSampler(out, r, world, batch_size=batch)
        elif kind == "balanced":
            sampler = BalancedBatchSampler(out, r, world)
        else:  # the per-sample sampler of the mmengine / Pointcept adapters, in a plain DataLoader
            sampler = PlanSampler(out, r, world)
        if state is not None:
            sampler.load_state_dict(state)
        ckpt = sampler.state_dict()
        if kind == "plan_sampler":
            loader = tud.DataLoader(items, batch_sampler=PlanBatchSampler(sampler), collate_fn=list)
        else:
            loader = PlanLoader(items, sampler, num_workers=workers, collate_fn=list)
        for n, got in enumerate(loader):
            if n == k:
                break  # the crash: this batch was received, not trained
            trained.update(got)
            per_step[ckpt["step"]] += len(got)
            ckpt = sampler.state_dict()  # the checkpoint after each trained batch
        del loader
        saved = saved or ckpt
        if kind == "elastic":  # W' / N_step: the summed loss of every step gives the global-batch mean
            for step, total in per_step.items():
                assert sampler.loss_scale(step) == pytest.approx(world / total) or r < world - 1
    return trained, saved, dict(per_step)


@pytest.fixture(scope="module")
def manifests(tmp_path_factory) -> dict:
    """(strategy, W, B, weighted) -> a 1-epoch manifest of 48 samples, written once per module."""
    root = tmp_path_factory.mktemp("property")
    cache: dict = {}

    def get(strategy: str, w: int, b: int, weighted: bool) -> Path:
        key = (strategy, w, b, weighted)
        if key not in cache:
            name = f"{strategy}-{w}-{b}-{int(weighted)}"
            weights = (1.0, 2.0) if weighted else None
            cache[key] = plan_manifest(
                root / name,
                _costs(48, w * 10 + b),
                world_size=w,
                batch_size=b,
                strategy=strategy,
                weights=weights,
            )
        return cache[key]

    return {"get": get}


#: A restart: (fraction of the remaining steps trained before the next crash, W', B' or None: W*B / W').
_HOP = st.tuples(st.floats(0, 1), st.integers(1, 9), st.sampled_from([None, 1, 2, 3]))


@pytest.mark.slow  # 30 crash-and-resume runs, some through DataLoader worker processes
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    strategy=st.sampled_from(STRATEGIES),
    w=st.sampled_from([1, 2, 3, 4, 8]),
    b=st.integers(1, 3),
    weighted=st.booleans(),
    kind=st.sampled_from(["balanced", "elastic", "plan_sampler"]),
    workers=st.sampled_from([0, 2]),
    k_frac=st.floats(0, 1),
    hops=st.lists(_HOP, min_size=1, max_size=2),
)
def test_crash_on_w_resume_on_w2_trains_every_planned_entry_exactly(
    manifests: dict,
    strategy: str,
    w: int,
    b: int,
    weighted: bool,
    kind: str,
    workers: int,
    k_frac: float,
    hops: list[tuple[float, int, int | None]],
) -> None:
    """Crash after k trained batches on W ranks, resume on W' ranks from rank 0's checkpoint (and crash and
    resume again on W''): every entry of the epoch is trained exactly as often as the manifest plans it, or
    the restart refuses in one line. ``kind`` is the sampler that wrote the first checkpoint."""
    pytest.importorskip("torch")
    out = manifests["get"](strategy, w, b, weighted)
    k = int(k_frac * load_manifest(out).steps(0))
    trained, state, _ = _trained(out, kind, w, None, k, workers)
    assert state["step"] == k and (state["world_size"], state["batch_size"]) == (w, b)
    for i, (frac, new_w, new_b) in enumerate(hops):
        now = ElasticBatchSampler(out, 0, state["world_size"], batch_size=state["batch_size"])
        now.load_state_dict(state)  # the plan the crashed job ran, at its position
        pw, pb = now.world_size, now.batch_size
        new_b = new_b or (pw * pb // new_w if (pw * pb) % new_w == 0 else max(1, pw * pb // new_w))
        left = int((now.plan().rows[state["step"] :] >= 0).sum())
        merge = pw % new_w == 0 and new_b in (pb, pw // new_w * pb) and strategy != "budget"
        if 0 < left < new_w and not merge and (new_w, new_b) != (pw, pb):
            with pytest.raises(ValueError, match=r"fewer than world_size") as e:
                _trained(out, "elastic", new_w, new_b, None, workers, state)
            assert "\n" not in str(e.value)
            return
        last = i == len(hops) - 1
        crash = None if last else int(frac * (now.plan().steps - state["step"]))
        more, state, counts = _trained(out, "elastic", new_w, new_b, crash, workers, state)
        trained += more
        assert (state["world_size"], state["batch_size"]) == (new_w, new_b)
        assert all(c >= new_w for c in counts.values())  # no rank ever waits with an empty batch
        if (new_w, new_b) != (pw, pb):
            assert state["history"][-1][1:] == [new_w, new_b]
    assert trained == _planned(load_epoch_plan(out, 0))


@pytest.mark.parametrize(
    ("w", "b", "k", "new_w", "new_b"),
    slow_after(
        3,
        [
            (4, 2, 3, 2, None),
            (4, 2, 3, 3, 2),
            (4, 2, 3, 3, 3),
            (8, 2, 2, 3, 5),
            (8, 2, 2, 3, 2),
            (4, 2, 3, 8, 1),
        ],
    ),
)
def test_the_issue_cases_see_80_of_80(
    tmp_path: Path, w: int, b: int, k: int, new_w: int, new_b: int | None
) -> None:
    """80 samples planned W x B; BalancedBatchSampler checkpoints at step k as the README loop does, the job
    restarts on W' ranks with ElasticBatchSampler (was: 52 of 80 seen on 4 -> 2, 78 of 80 on 4 -> 3)."""
    pytest.importorskip("torch")
    out = plan_manifest(tmp_path / "out", _costs(80), world_size=w, batch_size=b)
    before, state, _ = _trained(out, "balanced", w, None, k, 2)
    after, end, _ = _trained(out, "elastic", new_w, new_b, None, 2, state)
    assert sum((before + after).values()) == 80 and set(before + after) == set(range(80))
    assert max((before + after).values()) == 1
    assert end["batch_size"] == (new_b or w * b // new_w) and end["history"] == [
        [k, new_w, end["batch_size"]]
    ]


def test_the_issue_case_on_a_real_build(tmp_path: Path) -> None:
    """``lidarshard build`` of 80 clouds for 4 x 2; BalancedBatchSampler's checkpoint after 3 steps; restart
    on 2 ranks (a merge) and on 3 ranks of 2 (a re-plan): 80 of 80 seen, each once."""
    pytest.importorskip("torch")
    from tests.helpers import build_bins_manifest

    out = build_bins_manifest(tmp_path, 80, 4, 2, epochs=1)
    assert load_manifest(out).steps(0) == 10
    before, state, _ = _trained(out, "balanced", 4, None, 3, 2)
    for new_w, new_b in [(2, None), (3, 2), (3, 3)]:
        after, end, _ = _trained(out, "elastic", new_w, new_b, None, 2, state)
        assert before + after == Counter(range(80)), (new_w, new_b)
        assert (end["world_size"], end["batch_size"]) == (new_w, new_b or 4)


def test_budget_manifest_is_replanned_with_budget_on_any_new_size(tmp_path: Path) -> None:
    out = plan_manifest(tmp_path / "out", _costs(60, 2), world_size=4, batch_size=2, strategy="budget")
    full = load_epoch_plan(out, 0)
    assert full.batch_size == 2 and (full.rows[..., 0] >= 0).all()
    for new_w, new_b in [(2, None), (3, 1), (4, 2), (7, 3)]:
        nxt = full.switch(2, new_w, new_b)
        assert nxt.world_size == new_w and (nxt.rows[..., 0] >= 0).all()  # no empty rank-step
        assert _multiset(nxt) == _planned(full)
        assert nxt.balance()["linearity"] >= nxt.balance()["greedy_reference"] - 0.01
    np.testing.assert_array_equal(full.switch(2, 3, 1).rows, full.switch(2, 3, 1).rows)  # pure function
    sampler = ElasticBatchSampler(out, 1, 3, batch_size=1)
    assert all(len(b) >= 1 for b in sampler) and len(list(sampler)) == len(sampler)


def test_pad_and_weighted_plans_keep_their_repeats(tmp_path: Path) -> None:
    """A ``pad`` epoch and a weighted epoch plan some samples twice: a restart trains them twice too."""
    for name, kw in (("pad", {"policy": "pad"}), ("weighted", {"weights": (1.0, 2.0)})):
        out = plan_manifest(tmp_path / name, _costs(45), world_size=4, batch_size=2, **kw)
        base = load_epoch_plan(out, 0)
        assert max(_planned(base).values()) == 2
        for new_w, new_b in [(3, 2), (2, None), (5, 3)]:
            assert _multiset(base.switch(1, new_w, new_b)) == _planned(base)


def test_replans_keep_the_manifests_caps_or_refuse(tmp_path: Path) -> None:
    from lidarshard.transforms.plan.caps import Caps

    out = plan_manifest(
        tmp_path / "b", _costs(50), world_size=4, batch_size=2, strategy="budget", caps=Caps(max_samples=3)
    )
    base = load_epoch_plan(out, 0)
    for new_w, new_b in [(3, 2), (2, 3), (6, 1)]:
        p = base.switch(2, new_w, new_b)
        assert _multiset(p) == _planned(base) and (p.rows >= 0).sum(axis=2).max() <= 3
    fixed = plan_manifest(tmp_path / "f", _costs(48), world_size=4, batch_size=2, caps=Caps(max_samples=2))
    base = load_epoch_plan(fixed, 0)  # 48 = 6 x 8; 5 steps left = 40 entries = 3 x 12 + 4 on 6 x 2: folded
    with pytest.raises(ValueError, match=r"cannot re-plan the rest of epoch 0 on 6 x 2 .*max-samples") as e:
        base.switch(1, 6, 2)
    assert "\n" not in str(e.value)
    assert _multiset(base.switch(1, 3, 2)) == _planned(base)  # 40 = 6 x 6 + 4: a last step of 2, 1, 1


# ------------------------------------------------------------------------------- states tied to plans


def test_a_state_of_another_plan_is_refused_naming_both(tmp_path: Path) -> None:
    torch_loaders = pytest.importorskip("lidarshard.loaders.torch")
    costs = _costs(40)
    seed0 = plan_manifest(tmp_path / "s0", costs, world_size=2, batch_size=2)
    seed9 = plan_manifest(tmp_path / "s9", costs, world_size=2, batch_size=2, seed=9)
    other_w = plan_manifest(tmp_path / "w4", costs, world_size=4, batch_size=1)
    sampler = torch_loaders.BalancedBatchSampler(seed0, 0, 2)
    list(islice(iter(sampler), 3))
    state = sampler.state_dict()
    fp0, fp9 = load_manifest(seed0).plan_fingerprint(0), load_manifest(seed9).plan_fingerprint(0)
    both = rf"saved on plan {fp0} \(seed 0, .*\) but .* epoch 0 is plan {fp9} \(seed 9"
    for target in (
        torch_loaders.BalancedBatchSampler(seed9, 0, 2),
        torch_loaders.PlanSampler(seed9, 0, 2),
        ElasticBatchSampler(seed9, 0, 2),
        ElasticBatchSampler(seed9, 0, 1),
    ):
        with pytest.raises(ValueError, match=both) as e:
            target.load_state_dict(state)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="another plan"):  # a plan rebuilt for another world size
        ElasticBatchSampler(other_w, 0, 2).load_state_dict(state)
    # the same plan at another world size: only the elastic sampler switches there
    elastic = ElasticBatchSampler(seed0, 0, 1)
    elastic.load_state_dict(state)
    with pytest.raises(
        ValueError, match=r"saved at world_size 1, batch_size 4 .*resume with .*ElasticBatchSampler"
    ):
        torch_loaders.BalancedBatchSampler(seed0, 0, 2).load_state_dict(elastic.state_dict())
    # a state of an older lidarshard ({"epoch", "step"}) was saved on the manifest's W, B: taken as is
    old = ElasticBatchSampler(seed0, 0, 1)
    old.load_state_dict({"epoch": 0, "step": 3})
    assert old.history == [(3, 1, 4)] and old.state_dict()["plan_fingerprint"] == fp0
    torch_loaders.BalancedBatchSampler(seed0, 0, 2).load_state_dict({"epoch": 0, "step": 3})


def test_a_plan_that_is_not_the_manifests_epoch_is_refused(tmp_path: Path) -> None:
    """The samplers check the epoch they are about to train against the manifest's counts."""
    import json

    torch_loaders = pytest.importorskip("lidarshard.loaders.torch")
    out = plan_manifest(tmp_path / "out", _costs(40), world_size=2, batch_size=2)
    meta = json.loads((out / "_manifest.json").read_text())
    meta["counts"]["planned"] = [meta["counts"]["planned"][0] - 4]  # four entries "lost" since the build
    (out / "_manifest.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"epoch 0: 40 plan rows, but the manifest records 36 planned"):
        list(ElasticBatchSampler(out, 0, 1))
    with pytest.raises(
        ValueError, match=r"holds 40 entries over 10 steps but the manifest records 36.*wrong epoch"
    ):
        list(torch_loaders.BalancedBatchSampler(out, 0, 2))
    plan_part = out / schemas.plan_file(0, 1)
    plan_part.write_bytes(plan_part.read_bytes()[:-1] + b"\0")  # a plan file edited after the build
    with pytest.raises(ValueError, match=r"rank-1/part-00000.parquet: .*sha256 differs"):
        load_epoch_plan(out, 0)
    with pytest.raises(ValueError, match="not the epoch's plan"):
        check_exact(np.arange(6).reshape(1, 2, 3), np.array([0, 1]), np.array([[[2], [3]]]), 6, 0)


def test_sampler_under_a_prefetching_plan_loader_resumes_on_half_the_ranks(built: Path) -> None:
    """A crash while 2 workers hold prefetched batches: the checkpoint counts trained batches, so the
    restart on W/2 ranks trains exactly the rest of the epoch."""
    torch = pytest.importorskip("torch")
    from lidarshard.loaders.torch import PlanLoader

    items = list(range(len(read_samples(built, ["sample_id"]))))
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
    assert trained == _planned(load_epoch_plan(built, 1))
    sampler = ElasticBatchSampler(built, 0, W)
    it = iter(torch.utils.data.DataLoader(items, batch_sampler=sampler, num_workers=2))
    next(it)
    with pytest.raises(RuntimeError, match="prefetches batches ahead of training.*PlanLoader"):
        sampler.state_dict()
    del it


# -------------------------------------------------------------------------------------------- the docs


def _python_blocks(doc: str, section: str) -> list[str]:
    text = (REPO / "docs" / doc).read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, flags=re.S)


def test_the_elastic_doc_block_runs_and_trains_the_rest_of_the_epoch(tmp_path: Path) -> None:
    """docs/FRAMEWORKS.md "Elastic world size": its loop, restarted on half the ranks of a checkpoint."""
    pytest.importorskip("torch")
    from lidarshard.loaders.torch import BalancedBatchSampler
    from tests.manifest_fixture import make_fixture

    out = make_fixture(tmp_path, [40 + 7 * i for i in range(16)], world_size=2, batch_size=2, epochs=1)
    first = BalancedBatchSampler(out, 0, 2)
    list(islice(iter(first), 2))
    (block,) = _python_blocks("FRAMEWORKS.md", "Elastic world size")
    env = {"out_dir": out, "rank": 0, "world_size": 1, "ckpt": {"sampler": first.state_dict()}, "epochs": 1}
    exec(compile(block, "docs/FRAMEWORKS.md", "exec"), env)  # noqa: S102 - the doc's own code
    assert env["sampler"].state_dict()["history"] == [[2, 1, 4]] and env["sampler"].state_dict()["step"] == 2


def test_a_world_size_that_does_not_divide_the_global_batch_runs_as_documented(built: Path) -> None:
    """W*B = 16 over 3 ranks: the default batch is ceil(16 / 3) = 6, the docs' rule, and the epoch is
    trained exactly as planned; a BalancedBatchSampler-style reader names the elastic sampler."""
    three = [ElasticBatchSampler(built, r, 3) for r in range(3)]
    assert {s.batch_size for s in three} == {6}
    for s in three:
        s.set_epoch(1)
    seen = Counter(i for rank in _run(three) for batch in rank for i in batch)
    assert seen == _planned(load_epoch_plan(built, 1))
    with pytest.raises(ValueError) as err:
        ManifestReader(built, 0, 3, 1)
    assert "lidarshard.ElasticBatchSampler(out_dir, rank, 3)" in str(err.value) and "\n" not in str(err.value)

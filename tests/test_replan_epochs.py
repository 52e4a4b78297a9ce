"""``build --replan-from E``: re-plan the remaining epochs with a new cost model, keep the trained ones byte for
byte, and move a running sampler to the new manifest at epoch E (issue 27 item 3)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import lidarshard
from lidarshard.loaders.elastic import ElasticBatchSampler
from lidarshard.loaders.reader import load_manifest
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.schemas.manifest import Manifest
from lidarshard.tools.validate import validate
from lidarshard.transforms.value_checks import UsageError
from tests.helpers import BEAM_TEST_FLAGS, make_bins

torch = pytest.importorskip("torch")
from lidarshard.loaders.torch import BalancedBatchSampler, PlanLoader  # noqa: E402

W, B, EPOCHS = 2, 2, 3
NEW_MODEL = "linear:0,0,1,2"  # voxels squared: a plan unlike the voxel one
PLAN = {
    "world_size": W,
    "batch_size": B,
    "epochs": EPOCHS,
    "strategy": "balanced",
    "max_reject_fraction": 0.1,
}


def _build(out: Path, **flags) -> dict:
    return lidarshard.build(None, str(out), pipeline_args=BEAM_TEST_FLAGS, **(PLAN | flags))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """PREV (voxel costs), NEW = PREV re-planned from epoch 1 on points, NEWER = NEW re-planned from 2 on
    linear costs, and FRESH = the samples planned on points from epoch 0."""
    root = tmp_path_factory.mktemp("replan")
    data = make_bins(root / "in", n=40)
    prev = root / "prev"
    lidarshard.build(str(data), str(prev), pipeline_args=BEAM_TEST_FLAGS, **PLAN)
    samples = str(prev / "samples")
    _build(root / "new", from_samples=samples, replan_from=1, cost_model=NEW_MODEL)
    _build(
        root / "newer", from_samples=str(root / "new" / "samples"), replan_from=2, cost_model="linear:1,0.5,2"
    )
    _build(root / "fresh", from_samples=samples, cost_model=NEW_MODEL)
    return {name: root / name for name in ("prev", "new", "newer", "fresh")}


def _epoch_bytes(out: Path, epoch: int) -> list[bytes]:
    return [p.read_bytes() for p in sorted((out / "plan" / f"epoch-{epoch}").rglob("*.parquet"))]


def test_the_epochs_before_e_are_kept_byte_for_byte_and_the_rest_replanned(runs) -> None:
    prev, new, newer, fresh = (runs[k] for k in ("prev", "new", "newer", "fresh"))
    assert _epoch_bytes(new, 0) == _epoch_bytes(prev, 0)
    for e in (1, 2):  # planned on the new model, exactly as a plan made on it from the start
        assert _epoch_bytes(new, e) == _epoch_bytes(fresh, e) != _epoch_bytes(prev, e)
    assert _epoch_bytes(newer, 0) == _epoch_bytes(prev, 0)
    assert _epoch_bytes(newer, 1) == _epoch_bytes(new, 1)
    assert _epoch_bytes(newer, 2) != _epoch_bytes(new, 2)
    m, mp = load_manifest(new), load_manifest(prev)
    assert [h.until_epoch for h in m.cost_history] == [1]
    assert m.cost_history[0].cost_model == mp.cost_model
    assert m.cost_history[0].bucket_edges == mp.buckets.edges
    assert m.balance[0] == mp.balance[0] and m.cost_model.q == 2.0
    history = load_manifest(newer).cost_history
    assert [(h.until_epoch, h.cost_model.name) for h in history] == [(1, "voxels"), (2, "linear")]
    for out in (new, newer):
        assert validate(str(out))[0] == [], out
    assert not mp.cost_history and "cost_history" not in json.loads((prev / "_manifest.json").read_text())


def test_validate_rechecks_the_kept_epochs_with_the_model_that_planned_them(runs, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(runs["new"], bad)
    raw = json.loads((bad / "_manifest.json").read_text())
    raw["cost_history"][0]["cost_model"] = {"name": "linear", "c0": 0.0, "a": 1.0, "b": 3.0}
    (bad / "_manifest.json").write_text(json.dumps(raw))
    problems = " ".join(validate(str(bad))[0])
    assert "epoch 0" in problems and "differs from the samples" in problems
    raw["cost_history"][0]["until_epoch"] = 7
    with pytest.raises(ValueError, match="cost_history must be"):
        Manifest.from_json(raw)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"replan_from": 1}, "add --from-samples PREV/samples"),
        ({"replan_from": 4, "epochs": 5}, "E must be at most 3"),
        ({"replan_from": 3}, "below --epochs"),
        ({"replan_from": 1, "seed": 5}, "--seed gives seed 5 where it planned 0"),
        (
            {"replan_from": 1, "strategy": "mixed"},
            "--strategy gives strategy mixed where it planned balanced",
        ),
    ],
)
def test_a_replan_that_cannot_continue_is_one_line_before_beam(runs, tmp_path, flags, message) -> None:
    source = {} if flags == {"replan_from": 1} else {"from_samples": str(runs["prev"] / "samples")}
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        lidarshard.build(
            None if source else str(runs["prev"]), str(tmp_path / "out"), pipeline_args=BEAM_TEST_FLAGS,
            **(PLAN | source | {"cost_model": "points"} | flags),
        )  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_the_cli_says_it_in_one_line(runs, tmp_path, capsys) -> None:
    argv = [
        "build",
        str(tmp_path / "o"),
        "--from-samples",
        str(runs["fresh"] / "samples"),
        "--world-size",
        "2",
    ]
    argv += ["--batch-size", "2", "--epochs", "3", "--replan-from", "1", "--strategy", "random"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--strategy gives strategy random where it planned balanced" in err


def _batches(sampler, epoch: int) -> list[list[int]]:
    sampler.set_epoch(epoch)
    return [list(b) for b in sampler]


def test_a_running_sampler_moves_to_the_replan_at_its_epoch_and_resumes_across_it(runs) -> None:
    prev, new = str(runs["prev"]), str(runs["new"])
    for rank in range(W):
        on_prev = BalancedBatchSampler(prev, rank, W)
        on_new = BalancedBatchSampler(new, rank, W)
        first = _batches(on_prev, 0)
        assert on_prev.switch_plan(new) == 1  # after epoch 0, before epoch 1
        assert _batches(on_prev, 1) == _batches(on_new, 1) != _batches(BalancedBatchSampler(prev, rank, W), 1)
        assert first == _batches(on_new, 0)
        # a checkpoint taken on PREV in epoch 0 resumes on NEW: the same plan, the same batches
        saved = BalancedBatchSampler(prev, rank, W)
        it = iter(saved)
        next(it)
        state = saved.state_dict()
        resumed = BalancedBatchSampler(new, rank, W)
        resumed.load_state_dict(state)
        assert [list(b) for b in resumed] == first[1:]
        # epoch 1 begun on PREV: too late to switch
        late = BalancedBatchSampler(prev, rank, W)
        late.set_epoch(1)
        next(iter(late))
        with pytest.raises(ValueError, match="re-plans from epoch 1, but this sampler is already at epoch 1"):
            late.switch_plan(new)
        # a state saved on NEW's epoch 1 is not PREV's plan
        on_new.set_epoch(1)
        with pytest.raises(ValueError, match="belongs to another plan"):
            BalancedBatchSampler(prev, rank, W).load_state_dict(on_new.state_dict())


def test_a_plan_that_does_not_continue_is_refused(runs) -> None:
    sampler = BalancedBatchSampler(str(runs["prev"]), 0, W)
    with pytest.raises(ValueError, match="is not a re-plan"):
        sampler.switch_plan(str(runs["fresh"]))
    on_fresh = BalancedBatchSampler(str(runs["fresh"]), 0, W)
    with pytest.raises(ValueError, match="its epoch 0 is another plan"):
        on_fresh.switch_plan(str(runs["new"]))


def test_plan_loader_and_elastic_switch_too(runs) -> None:
    prev, new = str(runs["prev"]), str(runs["new"])
    data = list(range(load_manifest(prev).counts.accepted))
    loader = PlanLoader(data, BalancedBatchSampler(prev, 0, W), collate_fn=lambda b: b)
    assert [len(b) for b in loader] and loader.switch_plan(new) == 1
    loader.batch_sampler.set_epoch(1)
    assert [list(b) for b in loader] == _batches(BalancedBatchSampler(new, 0, W), 1)
    # elastic on 3 ranks re-plans the remaining entries with the costs that planned the epoch: the same
    # from PREV or from NEW for epoch 0
    for rank in range(3):
        a, b = (
            ElasticBatchSampler(prev, rank, 3, batch_size=1),
            ElasticBatchSampler(new, rank, 3, batch_size=1),
        )
        assert _batches(a, 0) == _batches(b, 0)
        assert a.switch_plan(new) == 1
        assert _batches(a, 1) == _batches(b, 1)
    costs = ElasticBatchSampler(new, 0, 3, batch_size=1).plan().costs
    prev_costs = ElasticBatchSampler(prev, 0, 3, batch_size=1).plan().costs
    np.testing.assert_array_equal(costs, prev_costs)  # epoch 0: the voxel costs that planned it


def test_lidarshard_replan_takes_the_previous_flags(runs, tmp_path: Path, monkeypatch) -> None:
    """``lidarshard.replan`` constructs the re-plan's settings from OUT's manifest, read once: the build
    it runs never reads that manifest again."""
    from lidarshard.pipelines import preflight as replan_settings

    def read_again(path: str) -> None:
        raise AssertionError(f"the re-plan read {path}'s manifest a second time")

    monkeypatch.setattr(replan_settings, "load_manifest", read_again)
    out = tmp_path / "again"
    lidarshard.replan(str(runs["prev"]), str(out), 1, NEW_MODEL, pipeline_args=BEAM_TEST_FLAGS)
    for e in range(EPOCHS):
        assert _epoch_bytes(out, e) == _epoch_bytes(runs["new"], e)
    with pytest.raises(UsageError, match="replan: .* is not a committed lidarshard manifest"):
        lidarshard.replan(str(tmp_path), str(tmp_path / "x"), 1, NEW_MODEL)

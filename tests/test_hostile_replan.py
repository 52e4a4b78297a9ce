"""Issue 36's hostile re-plans: a NEW handed to ``switch_plan`` that does not continue OUT, generated here.

Each case (one test id per sampler kind: ``PAIRS`` counts them) must be refused in one line, and the sampler
that refused keeps replaying its plan: its next epochs' batches are those of a sampler that never tried.
Then ``lidarshard.replan`` given a from_epoch out of range or not an int, and switching after epoch E began.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import lidarshard
from lidarshard.loaders.elastic import ElasticBatchSampler
from tests.helpers import BEAM_TEST_FLAGS

pytestmark = pytest.mark.hostile("replan")

torch = pytest.importorskip("torch")
from lidarshard.loaders.torch import BalancedBatchSampler, PlanLoader  # noqa: E402

W, B, EPOCHS = 2, 2, 3
MODEL = "linear:0,0,1,2"


def _rows(n: int = 32) -> list[dict]:
    return [
        {
            "sample_id": f"{i:04d}",
            "path": f"/data/{i:04d}.bin",
            "num_points": 100 + (i * 37) % 50,
            "occupied_voxels": 10 + (i * 11) % 17,
        }
        for i in range(n)
    ]


def _write(out: Path, **flags) -> Path:
    plan = {"epochs": EPOCHS, "cost_model": "voxels", "strategy": "balanced"} | flags
    lidarshard.write_manifest(_rows(), str(out), plan.pop("world_size", W), B, **plan)
    return out


def _edit(src: Path, dst: Path, change: Callable[[dict], None]) -> Path:
    shutil.copytree(src, dst)
    m = json.loads((dst / "_manifest.json").read_text())
    change(m)
    (dst / "_manifest.json").write_text(json.dumps(m))
    return dst


#: The plan setting each ``other_<name>`` NEW differs in from OUT.
OTHERS = {"seed": {"seed": 7}, "world": {"world_size": 1}, "strategy": {"strategy": "random"}}


class _Runs(dict):
    """The cases' directories; an ``other_<name>`` NEW (a write and a Beam re-plan) is made when a test
    first asks for it, so the fast lane, which runs one of them, makes one."""

    def __init__(self, root: Path, found: dict[str, Path]) -> None:
        super().__init__(found)
        self.root = root

    def __missing__(self, case: str) -> Path:
        name = case.removeprefix("other_")
        if case == name or name not in OTHERS:
            raise KeyError(case)
        other = _write(self.root / name, **OTHERS[name])  # re-planned: what differs is the setting alone
        new = self.root / f"{name}_new"
        lidarshard.replan(str(other), str(new), 1, MODEL, pipeline_args=BEAM_TEST_FLAGS)
        self[case] = new
        return new


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """OUT, its re-plan NEW (from epoch 1), and NEWs that do not continue OUT."""
    root = tmp_path_factory.mktemp("hostile_replan")
    out = _write(root / "out")
    new = root / "new"
    lidarshard.replan(str(out), str(new), 1, MODEL, pipeline_args=BEAM_TEST_FLAGS)
    found = _Runs(
        root, {"out": out, "new": new, "fresh": _write(root / "fresh", cost_model=MODEL), "self": out}
    )

    def history(m: dict) -> None:
        m["cost_history"][0]["cost_model"]["b"] = 3.0

    def until(m: dict) -> None:
        m["cost_history"][0]["until_epoch"] = 2

    found["tampered_history"] = _edit(new, root / "tampered", history)
    found["moved_until"] = _edit(new, root / "until", until)
    # a re-plan from 1 of a manifest whose epoch 0 another cost model planned: same samples, seed, W, B
    lidarshard.replan(
        str(found["fresh"]), str(root / "fresh_new"), 1, "voxels", pipeline_args=BEAM_TEST_FLAGS
    )
    found["epoch_before_changed"] = root / "fresh_new"
    changed = shutil.copytree(new, root / "changed")  # NEW's epoch-0 files swapped behind its manifest
    first = sorted((changed / "plan" / "epoch-0").rglob("*.parquet"))
    second = sorted((changed / "plan" / "epoch-1").rglob("*.parquet"))
    for a, b in zip(first, second, strict=True):
        a.write_bytes(b.read_bytes())
    found["files_swapped"] = changed
    return found


SAMPLERS: dict[str, Callable[[str, int], Any]] = {
    "balanced": lambda out, rank: BalancedBatchSampler(out, rank, W),
    "elastic": lambda out, rank: ElasticBatchSampler(out, rank, 3, batch_size=1),
    "plan_loader": lambda out, rank: PlanLoader(
        list(range(32)), BalancedBatchSampler(out, rank, W), collate_fn=lambda batch: batch
    ),
}
#: NEW directories that do not continue the manifest a sampler replays, each refused before epoch 1:
#: case -> (the manifest the sampler replays, what the one line names).
CASES = {
    "other_seed": ("out", "seed 7 != 0"),
    "other_world": ("out", "world_size 1 != 2"),
    "other_strategy": ("out", "strategy random != balanced"),
    "fresh": ("out", "is not a re-plan"),
    "self": ("out", "is not a re-plan"),
    "new": ("new", "already replays"),  # a re-plan switched to itself
    "tampered_history": ("out", "its cost_history does not record the cost models"),
    "moved_until": ("out", "its epoch 1 is another plan"),
    "epoch_before_changed": ("out", "its epoch 0 is another plan"),
    "files_swapped": ("out", "not a readable plan file"),
}
#: ``ElasticBatchSampler`` reads no plan file (it re-plans from the samples and the checked cost_history):
#: NEW's plan files swapped behind its manifest change nothing it serves.
#: The fast lane runs one ``other_*`` case (its re-plans take a Beam run each); the slow lane the others.
PAIRS = [
    (c, k) if c not in ("other_world", "other_strategy") else pytest.param(c, k, marks=pytest.mark.slow)
    for c in CASES
    for k in SAMPLERS
    if (c, k) != ("files_swapped", "elastic")
]


def _sampler(sampler: Any) -> Any:
    return getattr(sampler, "batch_sampler", sampler)  # a PlanLoader's


def _batches(sampler: Any, epoch: int) -> list[list[int]]:
    _sampler(sampler).set_epoch(epoch)
    return [list(b) for b in sampler]


def _refused(sampler: Any, new: Path) -> str:
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        sampler.switch_plan(str(new))
    text = str(e.value)
    assert "\n" not in text and text, text
    return text


@pytest.mark.parametrize(("case", "kind"), PAIRS)
def test_a_new_that_does_not_continue_is_refused_and_the_sampler_keeps_its_plan(runs, case, kind) -> None:
    on, says = CASES[case]
    make = SAMPLERS[kind]
    sampler, untouched = make(str(runs[on]), 0), make(str(runs[on]), 0)
    assert _batches(sampler, 0) == _batches(untouched, 0)
    assert says in _refused(sampler, runs[case])
    assert _sampler(sampler).out_dir == str(runs[on])
    for epoch in (1, 2):
        assert _batches(sampler, epoch) == _batches(untouched, epoch)


@pytest.mark.parametrize("kind", ["balanced", "elastic"])
def test_switching_after_epoch_e_began_is_refused_and_the_epoch_goes_on(runs, kind) -> None:
    out = str(runs["out"])
    sampler, untouched = SAMPLERS[kind](out, 0), SAMPLERS[kind](out, 0)
    sampler.set_epoch(1)
    it = iter(sampler)
    first = next(it)
    assert "already at epoch 1" in _refused(sampler, runs["new"])
    untouched.set_epoch(1)
    assert [list(first), *[list(b) for b in it]] == [list(b) for b in untouched]


@pytest.mark.parametrize("from_epoch", [None, 0, -1, 3, 99, 1.0, True, "1"])
def test_replan_from_epoch_out_of_range_or_not_an_int_is_one_line(runs, tmp_path: Path, from_epoch) -> None:
    from lidarshard.transforms.value_checks import UsageError

    with pytest.raises(UsageError) as e:
        lidarshard.replan(str(runs["out"]), str(tmp_path / "x"), from_epoch, MODEL)
    assert "\n" not in str(e.value) and not (tmp_path / "x").exists()


def test_the_real_replan_still_switches(runs) -> None:
    """The control: the NEW every case above spoils is taken, at epoch 1."""
    for kind, make in SAMPLERS.items():
        sampler = make(str(runs["out"]), 0)
        _batches(sampler, 0)
        assert sampler.switch_plan(str(runs["new"])) == 1, kind
        assert _batches(sampler, 1) == _batches(make(str(runs["new"]), 0), 1)

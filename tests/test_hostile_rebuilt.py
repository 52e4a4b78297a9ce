"""Issue 50 item 1: readers and samplers held across a rebuild of their OUT.

A sampler reads ``_manifest.json`` when it is made and an epoch's plan files when the epoch starts; a rebuild
that publishes another plan into the same OUT in between (another seed, another world size, batch size,
strategy or samples, fewer epochs, OUT removed or half published) must not be trained: every reader of the
plan files (``loaders.held.same_plan``) refuses it in one line naming OUT and the fix, before a batch of it is
handed out. A rebuild that leaves the files a read relies on as they were (the same options again, or more
epochs appended) is no change: training goes on with the plan opened. One test id per (reader, rebuild).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from lidarshard.loaders.elastic import ElasticBatchSampler
from lidarshard.loaders.epoch_plan import read_epoch_plan
from lidarshard.loaders.reader import ManifestReader, load_manifest, read_samples
from lidarshard.schemas import SUCCESS_FILE
from tests.elastic_fixture import plan_manifest

pytestmark = pytest.mark.hostile("publishing")

COSTS = np.random.default_rng(0).uniform(1.0, 10.0, 40)
REBUILT = "rebuilt after this reader opened it|no longer the manifest this reader opened"
PLAN = {"world_size": 2, "batch_size": 2, "epochs": 2, "seed": 0, "strategy": "mixed"}


def _publish(out: Path, costs=COSTS, **changes) -> None:
    """A rebuild of ``out`` with ``changes``, published as the build does: the new tree replaces the old whole."""
    staged = plan_manifest(out.parent / "staged", costs, **(PLAN | changes))
    shutil.rmtree(out)
    os.rename(staged, out)


def _unpublished(out: Path) -> None:  # an object-store publish under way: no _SUCCESS yet
    (out / SUCCESS_FILE).unlink()


#: rebuild -> what it does to OUT; each publishes a plan whose epoch 1 is not the one opened
REBUILDS: dict[str, Callable[[Path], None]] = {
    "another seed": lambda out: _publish(out, seed=7),
    "world size 2 -> 4": lambda out: _publish(out, world_size=4),
    "world size 2 -> 1": lambda out: _publish(out, world_size=1),
    "batch size 2 -> 1": lambda out: _publish(out, batch_size=1),
    "another strategy": lambda out: _publish(out, strategy="random"),
    "other samples": lambda out: _publish(out, costs=COSTS[::-1] + 0.5),
    "one epoch left": lambda out: _publish(out, epochs=1),
    "OUT removed": shutil.rmtree,
    "publish under way": _unpublished,
}


class Held:
    """A reader of each kind, made on the original OUT and used for its epoch 0 before the rebuild."""

    def __init__(self, kind: str, out: Path) -> None:
        self.kind, self.out = kind, out
        self.manifest = load_manifest(out)
        self.sampler = None
        if kind.startswith("elastic"):
            self.sampler = ElasticBatchSampler(out, 0, 3 if kind == "elastic on 3 ranks" else 2)
        elif kind == "balanced":
            from lidarshard.loaders.torch import BalancedBatchSampler

            self.sampler = BalancedBatchSampler(out, 0, 2)
        elif kind == "plan sampler":
            from lidarshard.loaders.torch import PlanSampler

            self.sampler = PlanSampler(out, 0, 2)
        self.epoch0 = self.read(0)

    def read(self, epoch: int) -> list:
        """What the reader serves of ``epoch`` (batches, plan rows or samples)."""
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
            return [b if isinstance(b, int) else list(b) for b in self.sampler]
        if self.kind == "epoch plan":
            ids = read_samples(self.out, ["sample_id"], manifest=self.manifest)["sample_id"]
            return read_epoch_plan(str(self.out), self.manifest, epoch, ids).plan.tolist()
        if self.kind == "rank reader, unverified":
            return [
                b.sample_ids
                for b in ManifestReader(self.out, 0, 2, epoch, manifest=self.manifest, verify=False)
            ]
        assert self.kind == "samples"
        return read_samples(self.out, manifest=self.manifest).to_pylist()


KINDS = [
    "elastic",
    "elastic on 3 ranks",
    "balanced",
    "plan sampler",
    "epoch plan",
    "rank reader, unverified",
    "samples",
]
#: the samples are the same whatever the plan: only these rebuilds change what a samples read relies on
SAMPLES_CHANGE = {"other samples", "OUT removed", "publish under way"}
#: a publish under way has not replaced the files yet: a reader that checks every byte it reads against the
#: manifest it opened (the plan readers by default, the samples read whole) gets exactly the plan opened
SERVED_AS_OPENED = {("publish under way", kind) for kind in ("balanced", "plan sampler", "samples")}


@pytest.mark.parametrize("rebuild", sorted(REBUILDS))
@pytest.mark.parametrize("kind", KINDS)
def test_a_rebuild_under_a_held_reader_is_refused_in_one_line(
    tmp_path: Path, kind: str, rebuild: str
) -> None:
    out = plan_manifest(tmp_path / "out", COSTS, **PLAN)
    held = Held(kind, out)
    fresh = Held(kind, plan_manifest(tmp_path / "copy", COSTS, **PLAN)).read(1)  # epoch 1 as opened
    REBUILDS[rebuild](out)
    if (kind == "samples" and rebuild not in SAMPLES_CHANGE) or (rebuild, kind) in SERVED_AS_OPENED:
        assert held.read(1) == fresh  # every byte it reads is as opened: nothing changed for this read
        return
    with pytest.raises(ValueError, match=REBUILT) as info:  # loaders.held.RebuiltError
        held.read(1)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{out}: ")
    assert "restart training on the new manifest" in message


@pytest.mark.parametrize("kind", KINDS)
def test_the_same_build_again_is_no_change(tmp_path: Path, kind: str) -> None:
    out = plan_manifest(tmp_path / "out", COSTS, **PLAN)
    held = Held(kind, out)
    want = Held(kind, plan_manifest(tmp_path / "copy", COSTS, **PLAN)).read(1)
    _publish(out)  # the same options: the same bytes
    assert held.read(1) == want
    assert held.read(0) == held.epoch0


@pytest.mark.parametrize("kind", ["elastic", "balanced", "epoch plan"])
def test_epochs_appended_keep_the_epochs_opened(tmp_path: Path, kind: str) -> None:
    out = plan_manifest(tmp_path / "out", COSTS, **PLAN)
    held = Held(kind, out)
    want = Held(kind, plan_manifest(tmp_path / "copy", COSTS, **PLAN)).read(1)
    _publish(out, epochs=3)  # epochs 0 and 1 planned as before, one more after them
    assert held.read(1) == want


def test_a_reader_made_before_the_rebuild_serves_the_plan_it_read(tmp_path: Path) -> None:
    out = plan_manifest(tmp_path / "out", COSTS, **PLAN)
    reader = ManifestReader(out, 1, 2, 1)
    before = [b.sample_ids for b in reader]
    _publish(out, seed=7)
    assert [b.sample_ids for b in reader] == before  # read whole when made: nothing read again


def test_elastic_mid_epoch_keeps_its_epoch_and_stops_at_the_next(tmp_path: Path) -> None:
    """The issue's case: W 2 -> 4 published while epoch 0 is being trained on 2 ranks."""
    out = plan_manifest(tmp_path / "out", COSTS, **PLAN)
    samplers = [ElasticBatchSampler(out, r, 2) for r in range(2)]
    running = [iter(s) for s in samplers]
    first = [next(it) for it in running]
    _publish(out, world_size=4)
    rest = [list(it) for it in running]  # epoch 0 was read whole before the rebuild: all of it trains
    trained = sorted(i for r in range(2) for b in [first[r], *rest[r]] for i in b)
    copy = plan_manifest(tmp_path / "copy", COSTS, **PLAN)
    assert trained == sorted(i for r in range(2) for b in ElasticBatchSampler(copy, r, 2) for i in b)
    for s in samplers:
        s.set_epoch(1)
        with pytest.raises(ValueError, match=f"{REBUILT}.*world_size 4, batch_size 2"):
            list(s)

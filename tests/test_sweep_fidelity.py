"""Sweep fidelity under hostile tables and manifests (issue 50, items 4 and 6, and variants of our own).

Two rules decide every nuScenes prev chain (``transforms/layouts/nuscenes_tasks.py``):

- **scene**: sweeps stay in the keyframe's scene (``sample_data.sample_token -> sample.scene_token``). A
  ``prev`` naming a record of another scene is where the keyframe's scene starts: the chain ends there,
  whatever that record holds, and never re-enters; the sample is served with the sweeps before the cut
  (the build summary counts the samples with fewer sweeps than asked).
- **broken chain**: a ``prev`` that cannot be followed as the schema defines it (no such record, a
  duplicated token, another channel, an unknown sample or scene, a record not strictly earlier than the
  one before it, which every loop has, a file named twice in one sample) rejects the sample,
  ``bad_table``, naming the chain.

The loader refuses sweep time lags it would serve that are no finite number of seconds >= 0.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.transforms.layouts.nuscenes_tasks import load_tasks
from tests.test_nuscenes import VERSION, Dataset, by_id, load, read_local

hostile = pytest.mark.hostile("sweep fidelity")


def _names(task) -> list[str]:
    """The sweep file names of a task, newest first (``<log>__LIDAR_TOP__<timestamp>.pcd.bin``)."""
    return [Path(s.path).name for s in task.sweeps]


def _files(ds: Dataset, *tokens: str) -> list[str]:
    return [Path(ds.sd(t)["filename"]).name for t in tokens]


# ------------------------------------------------------------------------------------ the scene rule


@hostile
def test_a_chain_into_the_scene_before_is_cut_at_the_scene_start(tmp_path: Path) -> None:
    """Issue 50 item 4: scene B's first keyframe names scene A's last keyframe as its prev (7.7 s before)."""
    ds = Dataset()
    ds.sd("kB0")["prev"] = "kA2"
    tasks, rejects = load(ds, tmp_path, sweeps=5)
    assert rejects == [] and len(tasks) == 5
    got = by_id(tasks)
    assert got["sampB0"].sweeps == ()  # as if prev were "": the first keyframe of its scene
    assert _names(got["sampB1"]) == _files(ds, "sB1", "kB0")
    assert max(s.time_lag_s for t in tasks for s in t.sweeps) < 0.35  # a scene's own frames, never 7.7 s


@hostile
def test_a_chain_into_a_later_scene_is_cut_before_its_time_is_read(tmp_path: Path) -> None:
    """The other scene's record is later (not earlier): the scene rule decides before the time rule."""
    ds = Dataset()
    ds.sd("kA0")["prev"] = "sB1"
    tasks, rejects = load(ds, tmp_path, sweeps=5)
    assert rejects == [] and by_id(tasks)["sampA0"].sweeps == ()


@hostile
def test_a_chain_that_leaves_and_re_enters_the_scene_ends_where_it_leaves(tmp_path: Path) -> None:
    ds = Dataset()
    ds.sd("sA3")["prev"] = "kB0"  # kA2 -> sA4 -> sA3 -> kB0 (scene B) -> sA2 (scene A again) -> ...
    ds.sd("kB0")["prev"] = "sA2"
    tasks, rejects = load(ds, tmp_path, sweeps=6)
    got = by_id(tasks)
    assert rejects == [] and _names(got["sampA2"]) == _files(ds, "sA4", "sA3")
    assert got["sampB0"].sweeps == () and _names(got["sampB1"]) == _files(ds, "sB1", "kB0")


@hostile
def test_the_keyframes_sample_is_looked_up_only_when_a_sweep_is_followed(tmp_path: Path) -> None:
    ds = Dataset()
    ds.sd("kA0")["sample_token"] = "lost"  # kA0 has no prev: its scene is never needed
    ds.sd("kA1")["sample_token"] = "lost too"
    tasks, rejects = load(ds, tmp_path, sweeps=2)
    assert "lost" in by_id(tasks) and "lost too" not in by_id(tasks)
    assert [(r[1], "unknown sample token 'lost too'" in r[2]) for r in rejects] == [("bad_table", True)]


@hostile
@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda ds: ds.sd("sA2").update(sample_token="ghost"), "unknown sample token 'ghost'"),
        (lambda ds: ds.t["sample"][1].pop("scene_token"), "sample sampA1 has no scene_token"),
        (lambda ds: ds.t["sample"][1].update(scene_token=""), "sample sampA1 has no scene_token"),
        (lambda ds: ds.t["sample"][1].update(scene_token=7), "sample sampA1 has no scene_token"),
        (
            lambda ds: ds.t["sample"].append(dict(ds.t["sample"][1])),
            "sample token sampA1 appears more than once",
        ),
    ],
    ids=["sweep-of-unknown-sample", "no-scene", "empty-scene", "scene-not-a-string", "sample-twice"],
)
def test_a_scene_that_cannot_be_told_rejects_the_sample(tmp_path: Path, edit, needle: str) -> None:
    ds = Dataset()
    edit(ds)
    tasks, rejects = load(ds, tmp_path, sweeps=2)
    assert rejects and {r[1] for r in rejects} == {"bad_table"}
    assert all(needle in r[2] for r in rejects), rejects
    assert "sampA1" not in by_id(tasks) and {"sampA0", "sampB0", "sampB1"} <= set(by_id(tasks))


@hostile
def test_sweeps_without_sample_json_are_one_line_and_none_need_no_scene(tmp_path: Path) -> None:
    ds = Dataset()
    del ds.t["sample"]
    root = str(ds.write(tmp_path))
    with pytest.raises(ValueError, match=r"sample\.json not found: sweeps stay in their keyframe's scene"):
        load_tasks(root, VERSION, 1, read_local)
    tasks, rejects = load_tasks(root, VERSION, 0, read_local)
    assert rejects == [] and len(tasks) == 5


# ------------------------------------------------------------------------------- the broken-chain rule


@hostile
@pytest.mark.parametrize(
    ("token", "change", "needle"),
    [
        ("sA1", {"prev": "sA2"}, "not earlier"),  # a two-record loop: sA2 -> sA1 -> sA2
        ("sA1", {"prev": "sA1"}, "not earlier"),  # a record that is its own prev
        ("sA1", {"prev": "kA2"}, "not earlier"),  # a loop through a later keyframe of the scene
        ("sA2", {"prev": "gone"}, "not a known sample_data token"),
        ("sA2", {"prev": "radarA1"}, "not a LIDAR_TOP record"),
        ("sA2", {"prev": "camA0"}, "not a LIDAR_TOP record"),
        ("sA1", {"timestamp": 1_100_001}, "not earlier"),  # after the record it precedes
        ("sA1", {"timestamp": 1_100_000}, "not earlier"),  # at the same time as it
    ],
    ids=["loop", "self-loop", "loop-via-keyframe", "missing-prev", "radar", "camera", "backwards", "equal"],
)
def test_a_chain_that_cannot_be_followed_rejects_its_sample(
    tmp_path: Path, token: str, change: dict, needle: str
) -> None:
    ds = Dataset()
    ds.sd(token).update(change)
    tasks, rejects = load(ds, tmp_path, sweeps=5)
    assert rejects and {r[1] for r in rejects} == {"bad_table"}
    assert all(needle in r[2] and "sweep chain of k" in r[2] for r in rejects), rejects
    assert len(tasks) + len(rejects) == 5 and {"sampA0", "sampB0", "sampB1"} <= set(by_id(tasks))


@hostile
@pytest.mark.parametrize(
    ("token", "same_as"),
    [("sA1", "sA2"), ("sA2", "kA1")],
    ids=["two-sweeps-one-file", "sweep-is-the-keyframe"],
)
def test_a_file_named_twice_in_one_sample_rejects_it(tmp_path: Path, token: str, same_as: str) -> None:
    ds = Dataset()
    ds.sd(token)["filename"] = ds.sd(same_as)["filename"]
    tasks, rejects = load(ds, tmp_path, sweeps=2)
    assert [r[1] for r in rejects] == ["bad_table"] and "again" in rejects[0][2]
    assert rejects[0][0].endswith(ds.sd("kA1")["filename"]) and "sampA1" not in by_id(tasks)


@hostile
def test_a_sweep_listed_twice_in_the_table_rejects_the_samples_reaching_it(tmp_path: Path) -> None:
    ds = Dataset()
    ds.t["sample_data"].append(dict(ds.sd("sA4"), timestamp=1_175_000))
    tasks, rejects = load(ds, tmp_path, sweeps=2)
    assert [r[1] for r in rejects] == ["bad_table"] and "sA4" in rejects[0][2] and "twice" in rejects[0][2]
    assert "sampA2" not in by_id(tasks) and len(tasks) == 4


# ------------------------------------------------------------------- end to end: the dataroot


def _synth_crossing(tmp: Path) -> Path:
    """A synthetic dataroot of 3 scenes whose 2nd scene's first frame names the 1st scene's last frame as
    its prev (the next scene of a log, an hour later in the issue)."""
    from lidarshard.pipelines.cli import main

    root = tmp / "root"
    assert main(["synth", str(root), "--scenes", "3", "--keyframes-per-scene", "3", "--seed", "2"]) == 0
    table = root / "v1.0-synth" / "sample_data.json"
    rows = json.loads(table.read_text())
    scene_of = {
        s["token"]: s["scene_token"] for s in json.loads((root / "v1.0-synth" / "sample.json").read_text())
    }
    firsts = [r for r in rows if r["prev"] == ""]
    by_scene = {scene_of[r["sample_token"]]: r for r in firsts}
    a, b = sorted(by_scene.values(), key=lambda r: r["timestamp"])[:2]
    last = a
    nxt = {r["token"]: r for r in rows}
    while last["next"]:
        last = nxt[last["next"]]
    b["prev"], last["next"] = last["token"], b["token"]
    table.write_text(json.dumps(rows))
    return root


@hostile
def test_a_build_serves_no_sweep_of_another_scene_and_counts_the_short_chains(tmp_path: Path) -> None:
    from lidarshard.pipelines.cli import main
    from tests.helpers import BEAM_TEST_FLAGS

    root, out = _synth_crossing(tmp_path), tmp_path / "out"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["build", str(root), str(out), "--nuscenes-version", "v1.0-synth", "--sweeps", "9",
                     "--world-size", "1", "--batch-size", "1", *BEAM_TEST_FLAGS]) == 0  # fmt: skip
    samples = pq.read_table(out / schemas.SAMPLES_DIR, columns=["num_sweeps", "sweep_time_lags"]).to_pylist()
    lags = [lag for s in samples for lag in s["sweep_time_lags"]]
    assert len(samples) == 9 and 0 < max(lags) < 0.5 and all(math.isfinite(v) and v > 0 for v in lags)
    first = [s for s in samples if s["num_sweeps"] == 0]
    assert len(first) == 3  # one a scene: the crossing scene's first keyframe too
    (line,) = [x for x in buf.getvalue().splitlines() if x.startswith("INPUT ")]
    assert line.endswith(": 9 samples accepted, 3 with fewer sweeps: their scene starts sooner"), line


# ----------------------------------------------------------------------------- the loader's time lags


def _lag_manifest(tmp_path: Path, lags: list) -> Path:
    from tests.manifest_fixture import write_clouds, write_manifest

    cols = write_clouds(tmp_path / "data", [40, 30], sweeps=2, sweep_size=9, seed=1)
    cols["sweep_time_lags"] = [[0.05, 0.1], lags]
    return write_manifest(tmp_path / "out", cols, world_size=1, batch_size=1, epochs=1)


@hostile
@pytest.mark.parametrize(
    "lags",
    [[0.05, float("nan")], [-0.05, 0.1], [0.05, float("inf")], [0.05, -float("inf")], [None, 0.1]],
    ids=["nan", "negative", "inf", "minus-inf", "null"],
)
def test_the_loader_refuses_lags_that_are_no_seconds_before_the_keyframe(tmp_path: Path, lags: list) -> None:
    pytest.importorskip("torch")
    from lidarshard.loaders import read_samples
    from lidarshard.loaders.points import load_points
    from lidarshard.loaders.torch import PointCloudDataset

    out = _lag_manifest(tmp_path, lags)
    ids = PointCloudDataset(out).sample_ids  # no lag served: nothing to refuse
    with pytest.raises(ValueError, match=rf"time_lag=True: sample '{ids[1]}' records a sweep time lag of "):
        PointCloudDataset(out, time_lag=True)
    assert PointCloudDataset(out, time_lag=True, sweeps=False)[1]["points"].shape[1] == 6  # keyframe: lag 0
    row = read_samples(out).to_pylist()[1]
    with pytest.raises(ValueError, match=r"time lag .* of sweep \d is no finite number of seconds >= 0"):
        load_points(row["path"], None, row["sweep_paths"], row["sweep_transforms"], time_lags=lags)


def test_a_zero_lag_is_served() -> None:
    from lidarshard.loaders.points import bad_time_lag

    assert bad_time_lag([0.0, 0.05]) is None and bad_time_lag(np.array([0.1, -0.0])) is None
    assert bad_time_lag([0.1, -1e-9]) == 1 and bad_time_lag([]) is None


def test_the_summary_names_where_each_layouts_chains_start() -> None:
    from lidarshard.pipelines.understood import input_lines

    meta = {
        "sweeps": {"nusc": 9, "logs": 2, "files": 0},
        "datasets": [
            {"name": "nusc", "root": "/n", "layout": "nuscenes"},
            {"name": "logs", "root": "/a", "layout": "av2"},
            {"name": "files", "root": "/f", "layout": "files"},
        ],
    }
    lines = input_lines(meta, {"nusc": 40, "logs": 7, "files": 3}, {"nusc": 4, "logs": 1, "files": 0})
    assert lines[0].endswith(": 40 samples accepted, 4 with fewer sweeps: their scene starts sooner")
    assert lines[1].endswith(": 7 samples accepted, 1 with fewer sweeps: their log starts sooner")
    assert lines[2].endswith(": 3 samples accepted")

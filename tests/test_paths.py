"""lidarshard.transforms.io.paths and ``build --relative-to``: a dataset that moves. Build on a synth nuScenes
dataroot, move the dataroot, train from the new place; path_map for a manifest of full paths."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lidarshard import schemas
from lidarshard.loaders import ManifestReader, read_samples
from lidarshard.pipelines import build as build_cli
from lidarshard.tools.validate import validate
from lidarshard.transforms.io.paths import (
    PATH_COLUMNS,
    PathResolver,
    absolute,
    bad_path,
    path_problem,
    relative_to,
    resolved,
)
from lidarshard.transforms.io.storage import join
from tests.helpers import BEAM_TEST_FLAGS

PLAN = ["--nuscenes-version", "v1.0-synth", "--sweeps", "1", "--world-size", "2", "--batch-size", "2"]


def test_relative_to_and_back_keeps_nulls_lists_and_slices() -> None:
    t = pa.table(
        {
            "path": ["/d/a.bin", "/d/s/b.bin", "/d/c.bin"],
            "sweep_paths": pa.array([["/d/x", "/d/y"], None, []], pa.list_(pa.string())),
            "label_path": pa.array([None, "/d/l", None], pa.string()),
        }
    ).slice(1)
    rel = relative_to(t, "/d/")
    assert rel.to_pylist() == [
        {"path": "s/b.bin", "sweep_paths": None, "label_path": "l"},
        {"path": "c.bin", "sweep_paths": [], "label_path": None},
    ]
    assert absolute(rel, "/d").to_pylist() == t.to_pylist()
    assert absolute(rel, "gs://b/e")["path"].to_pylist() == ["gs://b/e/s/b.bin", "gs://b/e/c.bin"]
    assert relative_to(t, None) is t and absolute(t, None) is t
    with pytest.raises(ValueError, match=r"/d/s/b.bin is not inside --relative-to /d/c"):
        relative_to(t, "/d/c")  # a component boundary, not a string prefix: /d/c.bin is not in /d/c


def _path_problem_one_by_one(table: pa.Table, root: str | None) -> str | None:
    """``path_problem``'s rules string by string in Python: the reference its byte search must agree with."""
    for name in PATH_COLUMNS:
        if name not in table.column_names:
            continue
        cells = table.column(name).to_pylist()
        values = [v for c in cells for v in (c if isinstance(c, list) else [c]) if v is not None]
        odd = [v for v in values if v == "" or "\0" in v]
        if odd:
            return f"{name} {bad_path(odd[0])}"
        full = [v.startswith("/") or "://" in v for v in values]
        bad = [
            v
            for v, f in zip(values, full, strict=True)
            if re.search(r"(^|/)\.\.(/|$)", v) or (f if root is not None else not f)
        ]
        if bad:
            want = f"relative to path_root {root} and inside it" if root else "a full path (no path_root)"
            return f"{name} {bad[0]!r} is not {want}"
    return None


_PATHS = st.lists(st.one_of(st.none(), st.text("ab/.:\0", max_size=5).map(lambda v: v.lstrip("\0") or v)))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    paths=_PATHS,
    sweeps=st.lists(st.one_of(st.none(), _PATHS)),
    root=st.sampled_from([None, "/r"]),
    cut=st.integers(0, 3),
    prefix=st.sampled_from(["", "/d/", "x/"]),
)
@example(paths=[None, "..", "a."], sweeps=[None, None, [".a"]], root="/r", cut=0, prefix="")  # first byte
def test_path_problem_agrees_with_judging_each_string(
    paths: list, sweeps: list, root: str | None, cut: int, prefix: str
) -> None:
    """Across chunks, slices, nulls and list cells (a fault may straddle two strings' bytes)."""
    n = min(len(paths), len(sweeps))
    paths = [None if p is None else prefix + p for p in paths[:n]]
    t = pa.table(
        {"path": pa.array(paths, pa.string()), "sweep_paths": pa.array(sweeps[:n], pa.list_(pa.string()))}
    )
    t = pa.concat_tables([t.slice(0, cut), t.slice(cut)]).slice(min(1, n))
    assert path_problem(t, root) == _path_problem_one_by_one(t, root)


def test_path_resolver_joins_roots_and_maps_prefixes() -> None:
    assert PathResolver("/old")("a/b.bin") == "/old/a/b.bin"
    assert PathResolver("/old", root="s3://bkt/data/")("a/b.bin") == "s3://bkt/data/a/b.bin"
    moved = PathResolver(None, path_map={"/data": "/mnt/x", "/data/nu": "/fast/nu"})
    assert moved("/data/nu/a.bin") == "/fast/nu/a.bin"  # the longest prefix wins
    assert moved("/data/other/a.bin") == "/mnt/x/other/a.bin"
    assert moved("/database/a.bin") == "/database/a.bin"  # whole components only
    assert PathResolver("/old", path_map={"/old": "/new"})("a.bin") == "/new/a.bin"
    with pytest.raises(ValueError, match="stored relative but the manifest records no path_root: pass root="):
        PathResolver(None)("a.bin")


def test_one_join_for_the_resolver_the_column_join_and_resolved() -> None:
    for root in ("/d", "/d/", "gs://bkt/data", "gs://bkt/data/"):
        stored = ["a/b.bin", None, "/full/c.bin"]
        want = [join(root, "a/b.bin"), None, "/full/c.bin"]
        assert (
            resolved(stored, root) == want == [None if p is None else PathResolver(root)(p) for p in stored]
        )
        table = pa.table({"label_path": pa.array(stored, pa.string())})
        assert absolute(table, root).column("label_path").to_pylist() == want
    assert resolved(["a.bin", None], None) == ["a.bin", None]


@pytest.fixture(scope="module")
def dataroot(tmp_path_factory) -> Path:
    synth = pytest.importorskip("lidarshard.pipelines.synth")
    root = tmp_path_factory.mktemp("synth") / "nuscenes"
    argv = [str(root), "--scenes", "1", "--keyframes-per-scene", "4", "--sweeps-per-keyframe", "1"]
    assert synth.run([*argv, *BEAM_TEST_FLAGS]) in (0, None)
    return root


def _points(out: Path, **where) -> list[np.ndarray]:
    torch = pytest.importorskip("torch")
    from lidarshard.loaders.torch import BalancedBatchSampler, PlanLoader, PointCloudDataset, collate

    dataset = PointCloudDataset(out, **where)
    loader = PlanLoader(dataset, BalancedBatchSampler(out, 0, 2), collate_fn=collate, num_workers=1)
    batches = [b["points"] for b in loader]
    assert batches and all(isinstance(p, torch.Tensor) and p.shape[0] > 0 for p in batches)
    return [p.numpy() for p in batches]


def test_build_move_the_dataroot_and_train_from_the_new_place(dataroot: Path, tmp_path: Path) -> None:
    here = tmp_path / "here"
    shutil.copytree(dataroot, here)
    out = tmp_path / "out"
    assert build_cli.run([str(here), str(out), *PLAN, *BEAM_TEST_FLAGS]) == 0
    m = json.loads((out / schemas.MANIFEST_FILE).read_text())
    assert m["path_root"] == str(here)
    samples = read_samples(out)
    assert all(p.startswith("samples/LIDAR_TOP/") for p in samples["path"].to_pylist())
    sweeps = [p for s in samples["sweep_paths"].to_pylist() for p in s]
    assert sweeps and all(p.startswith("sweeps/LIDAR_TOP/") for p in sweeps)
    assert validate(str(out)) == ([], validate(str(out))[1])
    before = _points(out)

    there = tmp_path / "elsewhere" / "nuscenes"
    there.parent.mkdir()
    here.rename(there)
    with pytest.raises(FileNotFoundError, match=str(here)):
        _points(out)  # the recorded root is gone: the error names where it looked
    after = _points(out, root=str(there))
    assert len(after) == len(before) and all(np.array_equal(a, b) for a, b in zip(after, before, strict=True))
    batch = next(iter(ManifestReader(out, 1, 2, 0, root=str(there))))
    assert all(Path(p).is_file() and p.startswith(str(there)) for p in batch.paths)


def test_full_paths_move_with_path_map(dataroot: Path, tmp_path: Path) -> None:
    here = tmp_path / "a" / "nuscenes"
    shutil.copytree(dataroot, here)
    out = tmp_path / "out"
    assert build_cli.run([str(here), str(out), *PLAN, "--relative-to", "none", *BEAM_TEST_FLAGS]) == 0
    assert json.loads((out / schemas.MANIFEST_FILE).read_text())["path_root"] is None
    assert read_samples(out)["path"][0].as_py().startswith(str(here))
    assert validate(str(out))[0] == []
    before = _points(out)
    there = tmp_path / "b"
    (tmp_path / "a").rename(there)
    assert all(
        np.array_equal(a, b)
        for a, b in zip(_points(out, path_map={str(tmp_path / "a"): str(there)}), before, strict=True)
    )


def test_from_samples_re_roots_and_a_root_outside_the_inputs_fails(dataroot: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert build_cli.run([str(dataroot), str(out), *PLAN, *BEAM_TEST_FLAGS]) == 0
    again = tmp_path / "again"
    flags = [str(again), "--from-samples", str(out / schemas.SAMPLES_DIR), *PLAN[4:]]
    assert build_cli.run([*flags, "--relative-to", str(dataroot.parent), *BEAM_TEST_FLAGS]) == 0
    m = json.loads((again / schemas.MANIFEST_FILE).read_text())
    assert m["path_root"] == str(dataroot.parent)
    assert read_samples(again)["path"][0].as_py().startswith("nuscenes/samples/")
    assert validate(str(again))[0] == []
    with pytest.raises(Exception, match=r"is not inside --relative-to .*/samples/LIDAR_TOP"):
        build_cli.run(
            [
                str(dataroot),
                str(tmp_path / "bad"),
                *PLAN,
                "--relative-to",
                str(dataroot / "samples" / "LIDAR_TOP"),
                *BEAM_TEST_FLAGS,
            ]
        )

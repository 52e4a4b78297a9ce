"""``lidarshard scan``: features through the Beam pipeline, every reject reason, the accounting check."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from lidarshard.pipelines import scan as scan_cli
from lidarshard.transforms.beam import scan_transform as scan_beam
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.features.sample import ScanConfig, featurize, file_task
from lidarshard.transforms.layouts.task import ScanTask, SweepRef
from tests.helpers import BEAM_TEST_FLAGS, mem_io

IDENTITY = tuple(float(v) for v in np.eye(4).ravel())


def _write_bad_corpus(root: Path) -> dict[str, str]:
    """Files that must each be rejected, keyed by path relative to ``root`` -> expected reason."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    rng.normal(size=(100, 4)).astype(np.float32).tofile(root / "good.bin")
    expected = {}

    def put(name: str, data: bytes, reason: str) -> None:
        (root / name).write_bytes(data)
        expected[name] = reason

    put("empty.bin", b"", "empty")
    put("notes.pcd", b"hello, I am a text file\n", "bad_header")
    put("cut.bin", np.zeros(10, np.float32).tobytes()[:-3], "truncated")
    put("nan.bin", np.full((8, 4), np.nan, np.float32).tobytes(), "non_finite")
    put(
        "huge.pcd",
        b"VERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\nWIDTH 1000000000000\n"
        b"HEIGHT 1\nPOINTS 1000000000000\nDATA binary\n" + b"\0" * 24,
        "too_large",
    )
    put("readme.txt", b"not a cloud", "unsupported_format")
    put("far.bin", np.array([[1e30, 0, 0, 0]], np.float32).tobytes(), "absurd_coordinates")
    (root / "dir.bin").mkdir()
    (root / "dir.bin" / "inner.txt").write_bytes(b"x")
    expected["dir.bin/inner.txt"] = "unsupported_format"
    return expected


def _scan(tmp_path: Path, inp: str, *flags: str) -> tuple[dict, list[dict], list[dict]]:
    out = tmp_path / "out"
    assert scan_cli.run([inp, str(out), "--max-reject-fraction", "1", *flags, *BEAM_TEST_FLAGS]) == 0
    names = {p.name for p in out.iterdir()}  # the shard files under _work/ are gone
    assert names == {"_SUCCESS", "_scan.json", "samples", "rejects.parquet"}
    meta = json.loads((out / "_scan.json").read_text())
    return (
        meta,
        pq.read_table(out / "samples").to_pylist(),
        pq.read_table(out / "rejects.parquet").to_pylist(),
    )


def test_every_bad_input_gets_its_reason_and_the_run_goes_on(tmp_path: Path) -> None:
    expected = _write_bad_corpus(tmp_path / "in")
    meta, samples, rejects = _scan(tmp_path, str(tmp_path / "in"))
    assert [s["sample_id"] for s in samples] == ["good.bin"]
    got = {os.path.relpath(r["path"], tmp_path / "in"): r["reason"] for r in rejects}
    assert got == expected
    assert all(r["detail"] for r in rejects)
    c = meta["counts"]
    assert (c["scanned"], c["accepted"], c["rejected"]) == (len(expected) + 1, 1, len(expected))


def test_real_nuscenes_keyframe_features(tmp_path: Path, realdata: Path) -> None:
    # samples/ of a nuScenes dataroot, read as loose files: say so (alone it names the dataroot to pass)
    samples_dir = str(realdata / "nuscenes" / "samples")
    meta, samples, rejects = _scan(tmp_path, samples_dir, "--voxel-size", "0.2", "--dataset", "files")
    assert rejects == [] and meta["counts"]["accepted"] == 2
    full = next(s for s in samples if s["num_points"] == 34688)
    assert (
        full["format"] == "nuscenes_bin" and full["occupied_voxels"] == 12641 and full["file_bytes"] == 693760
    )
    assert (round(full["x_min"], 2), round(full["x_max"], 2)) == (-58.00, 96.85)
    assert full["sample_id"] == "LIDAR_TOP/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin"


def test_glob_input_and_point_dims(tmp_path: Path, realdata: Path) -> None:
    meta, samples, _ = _scan(
        tmp_path,
        str(realdata / "waymo" / "kitti_format" / "training" / "velodyne" / "*.bin"),
        "--point-dims",
        "6",
    )
    assert [(s["sample_id"], s["num_points"]) for s in samples] == [
        ("0000000.bin", 800),
        ("1000000.bin", 800),
    ]


def test_stat_features_read_no_contents(tmp_path: Path, realdata: Path) -> None:
    _, samples, _ = _scan(tmp_path, str(realdata / "kitti" / "training"), "--features", "stat")
    assert {s["num_points"] for s in samples} == {800, 17238}
    assert all(s["occupied_voxels"] is None for s in samples)


def test_featurize_aggregates_sweeps_and_checks_labels() -> None:
    key = np.zeros((50, 5), np.float32)
    key[:, 0] = np.arange(50)
    sweep = key.copy()
    files = {"k.pcd.bin": key.tobytes(), "s.pcd.bin": sweep.tobytes(), "l.bin": bytes(50)}
    task = ScanTask("tok", "k.pcd.bin", (SweepRef("s.pcd.bin", IDENTITY, 0.05),), "l.bin")
    row = featurize(task, *mem_io(files), ScanConfig())
    assert row["num_points"] == 50 + 49  # the sweep loses its one point inside the |x|<1, |y|<1 box
    assert row["has_labels"] and row["num_sweeps"] == 1 and row["file_bytes"] == 2000
    files["l.bin"] = bytes(49)
    with pytest.raises(RejectError, match="label_mismatch"):
        featurize(task, *mem_io(files), ScanConfig())
    del files["s.pcd.bin"]
    with pytest.raises(RejectError, match="missing_sweep"):
        featurize(task, *mem_io(files | {"l.bin": bytes(50)}), ScanConfig())


@pytest.mark.parametrize(("rule", "points"), [("sweeps", 50 + 49), ("devkit", 49 + 49), ("none", 50 + 50)])
def test_featurize_counts_points_under_the_close_point_rule(rule: str, points: int) -> None:
    key = np.zeros((50, 5), np.float32)
    key[:, 0] = np.arange(50)  # one point (x = 0) inside the |x|<1, |y|<1 box of each cloud
    files = {"k.pcd.bin": key.tobytes(), "s.pcd.bin": key.tobytes()}
    task = ScanTask("tok", "k.pcd.bin", (SweepRef("s.pcd.bin", IDENTITY, 0.05),), None)
    assert featurize(task, *mem_io(files), ScanConfig(close_points=rule))["num_points"] == points
    alone = featurize(ScanTask("tok", "k.pcd.bin", (), None), *mem_io(files), ScanConfig(close_points=rule))
    assert alone["num_points"] == (49 if rule == "devkit" else 50)  # "devkit" filters a lone keyframe too
    with pytest.raises(ValueError, match="close_points must be one of sweeps, devkit, none, got 'all'"):
        ScanConfig(close_points="all")


def test_too_large_files_are_never_read() -> None:
    def read(_: str, limit: int | None = None) -> bytes:
        raise AssertionError("read a file that should have been refused by its size")

    with pytest.raises(RejectError, match="too_large"):
        featurize(file_task("a", "a.bin"), read, lambda _: 10**12, ScanConfig())


def test_accounting_check_fails_the_run_when_the_runner_loses_elements(tmp_path: Path, monkeypatch) -> None:
    _write_bad_corpus(tmp_path / "in")
    real = scan_beam._Featurize.process

    def lossy(self, task):
        if task.path.endswith("good.bin"):
            return iter(())  # a runner that silently loses one element
        return real(self, task)

    monkeypatch.setattr(scan_beam._Featurize, "process", lossy)
    with pytest.raises(Exception, match="accounting check failed"):
        scan_cli.run(
            [str(tmp_path / "in"), str(tmp_path / "out"), "--max-reject-fraction", "1", *BEAM_TEST_FLAGS]
        )
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if ".staging-" in p.name]


def test_too_many_rejects_fail_the_run_with_a_summary(tmp_path: Path) -> None:
    _write_bad_corpus(tmp_path / "in")
    with pytest.raises(Exception, match=r"8 of 9 inputs rejected .*absurd_coordinates: 1"):
        scan_cli.run([str(tmp_path / "in"), str(tmp_path / "out"), *BEAM_TEST_FLAGS])
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if ".staging-" in p.name]


def test_relative_input_gives_absolute_paths(tmp_path: Path, monkeypatch) -> None:
    _write_bad_corpus(tmp_path / "in")
    monkeypatch.chdir(tmp_path)
    _, samples, rejects = _scan(tmp_path, "in")
    assert samples[0]["sample_id"] == "good.bin"
    assert all(os.path.isabs(r["path"]) for r in samples + rejects)


def test_concat_rows_is_independent_of_how_rows_are_split(monkeypatch) -> None:
    """Any split of the rows over accumulators, any merge order: the same sorted table."""
    monkeypatch.setattr(scan_beam, "ROWS_PER_CHUNK", 3)
    schema = scan_cli.schemas.reject_schema()
    rows = [{"path": f"p{i:02d}", "reason": "r", "detail": str(i)} for i in range(11)]
    fn = scan_beam.ConcatRows(schema, ("path",))

    def acc_of(part):
        acc = fn.create_accumulator()
        for row in part:
            acc = fn.add_input(acc, row)
        return acc

    whole = fn.extract_output(acc_of(rows))
    assert whole.column("path").to_pylist() == [r["path"] for r in rows]
    parts = [rows[7:], rows[:2], rows[2:7]]
    merged = fn.merge_accumulators([acc_of(p) for p in parts])
    assert fn.extract_output(merged).equals(whole)
    assert fn.extract_output(fn.create_accumulator()).num_rows == 0


def test_empty_input_directory_scans_to_empty_tables(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    scan_cli.run([str(tmp_path / "in"), str(tmp_path / "out"), *BEAM_TEST_FLAGS])
    assert pq.read_table(tmp_path / "out" / "samples").num_rows == 0
    assert pq.read_table(tmp_path / "out" / "rejects.parquet").num_rows == 0
    assert json.loads((tmp_path / "out" / "_scan.json").read_text())["counts"]["scanned"] == 0

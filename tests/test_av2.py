"""Argoverse 2: the Feather sweep reader (``formats.feather``) and the sensor-log layout (``layouts.av2``)."""

from __future__ import annotations

import io as _io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pytest

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.formats.feather import count_rows, read_av2_feather
from lidarshard.transforms.formats.readers import (
    FORMATS,
    count_points_from_size,
    detect_format,
    read_points,
    record_floats,
)
from lidarshard.transforms.layouts import STORAGE_IO, av2
from lidarshard.transforms.layouts.task import LayoutOptions

IO = STORAGE_IO
LOG_ID = "7fab2350-7eaf-3b7e-a39d-6937a4c1bede"
SWEEPS = {"315966265259836000": 99_229, "315966265360032000": 99_466}  # PROVENANCE.md


@pytest.fixture(scope="module")
def av2_root(realdata: Path) -> Path:
    root = realdata / "av2" / "sensor"
    if not root.is_dir():
        pytest.skip(f"AV2 real data not found at {root}")
    return root


def _sweep_table(n: int = 50, seed: int = 0, drop: str | None = None) -> pa.Table:
    rng = np.random.default_rng(seed)
    cols = {
        "x": pa.array(rng.normal(0, 30, n).astype(np.float16)),
        "y": pa.array(rng.normal(0, 30, n).astype(np.float16)),
        "z": pa.array(rng.normal(0, 2, n).astype(np.float16)),
        "intensity": pa.array(rng.integers(0, 256, n).astype(np.uint8)),
        "laser_number": pa.array(rng.integers(0, 64, n).astype(np.uint8)),
        "offset_ns": pa.array(rng.integers(0, 100_000_000, n).astype(np.int32)),
    }
    return pa.table({k: v for k, v in cols.items() if k != drop})


def _feather_bytes(table: pa.Table, **kw) -> bytes:
    buf = _io.BytesIO()
    feather.write_feather(table, buf, compression="lz4", **kw)
    return buf.getvalue()


def _reason(fn, *args) -> str:
    with pytest.raises(RejectError) as err:
        fn(*args)
    return err.value.reason


def _quat_matrix(qw: float, qx: float, qy: float, qz: float) -> np.ndarray:
    """Independent (w, x, y, z) quaternion -> rotation, plain numpy (Hamilton convention)."""
    q = np.array([qw, qx, qy, qz]) / np.linalg.norm([qw, qx, qy, qz])
    w, x, y, z = q
    return np.array(
        [
            [w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z],
        ]
    )


def _city_from_ego(table: pa.Table, t: int) -> np.ndarray:
    rows = [r for r in table.to_pylist() if r["timestamp_ns"] == t]
    assert len(rows) == 1
    r = rows[0]
    out = np.eye(4)
    out[:3, :3] = _quat_matrix(r["qw"], r["qx"], r["qy"], r["qz"])
    out[:3, 3] = [r["tx_m"], r["ty_m"], r["tz_m"]]
    return out


# ------------------------------------------------------------------------------------ real files


def test_real_sweeps_exact_counts_and_values(av2_root: Path):
    lidar = av2_root / "val" / LOG_ID / "sensors" / "lidar"
    for stamp, n in SWEEPS.items():
        path = str(lidar / f"{stamp}.feather")
        data = Path(path).read_bytes()
        assert detect_format(path) == "av2_feather"
        points = read_points(data, detect_format(path))
        assert points.shape == (n, 4) and points.dtype == np.float32 and points.flags.c_contiguous
        assert count_rows(data) == n
        plain = feather.read_table(path)
        assert plain.schema.field("x").type == pa.float16()
        for j, name in enumerate(("x", "y", "z", "intensity")):
            np.testing.assert_array_equal(points[:, j], np.asarray(plain[name], np.float32))
        assert np.isfinite(points).all() and 0 < np.abs(points[:, :3]).max() < 400


def test_real_log_tasks_from_each_root(av2_root: Path):
    log = av2_root / "val" / LOG_ID
    expect = {
        str(av2_root): [f"val/{LOG_ID}/{t}" for t in SWEEPS],
        str(av2_root / "val"): [f"{LOG_ID}/{t}" for t in SWEEPS],
        str(log): [f"{LOG_ID}/{t}" for t in SWEEPS],
        str(log) + "/": [f"{LOG_ID}/{t}" for t in SWEEPS],
    }
    for root, ids in expect.items():
        assert av2.describe(root, IO) == "Argoverse 2 sensor logs (1 log, 2 sweeps)"
        found = av2.load_tasks(root, LayoutOptions(), IO)
        assert [t.sample_id for t in found.tasks] == ids and found.rejects == []
        assert [t.path for t in found.tasks] == [f"{log}/sensors/lidar/{t}.feather" for t in SWEEPS]
        assert all(t.sweeps == () and t.label_path is None and t.frame is None for t in found.tasks)
    assert av2.describe(str(av2_root.parent.parent), IO) is None  # realdata/: AV2 three levels too deep
    with pytest.raises(ValueError, match="no Argoverse 2 sweeps"):
        av2.load_tasks(str(av2_root.parent.parent / "kitti"), LayoutOptions(), IO)


def test_real_sweep_transform_matches_pose_table(av2_root: Path):
    log = av2_root / "val" / LOG_ID
    found = av2.load_tasks(str(log), LayoutOptions(sweeps=1), IO)
    first, second = found.tasks
    assert found.rejects == [] and first.sweeps == ()
    (ref,) = second.sweeps
    assert ref.path == first.path
    t0, t1 = (int(t) for t in SWEEPS)
    assert ref.time_lag_s == pytest.approx((t1 - t0) / 1e9)
    poses = feather.read_table(log / av2.POSE_TABLE)
    expected = np.linalg.inv(_city_from_ego(poses, t1)) @ _city_from_ego(poses, t0)
    got = np.array(ref.sensor_to_ref).reshape(4, 4)
    np.testing.assert_allclose(got, expected, atol=1e-9)
    assert 0.01 < np.linalg.norm(got[:3, 3]) < 5.0  # the car creeps ~0.07 m in 0.1 s: not the identity


# ------------------------------------------------------------------------------------ the reader


def test_formats_registry():
    assert "av2_feather" in FORMATS
    assert detect_format("s3://b/log/sensors/lidar/1.FEATHER") == "av2_feather"
    assert record_floats("av2_feather") is None  # self-describing, like npy/pcd/ply
    with pytest.raises(ValueError):
        count_points_from_size(1000, "av2_feather")


def test_reader_widens_and_handles_chunks_and_nulls():
    table = _sweep_table(300)
    data = _feather_bytes(table, chunksize=64)  # five record batches
    points = read_av2_feather(data, 1000)
    assert points.shape == (300, 4) and count_rows(data) == 300
    np.testing.assert_array_equal(points[:, 0], table["x"].to_numpy().astype(np.float32))
    np.testing.assert_array_equal(points[:, 3], table["intensity"].to_numpy().astype(np.float32))
    with_null = table.set_column(2, "z", pa.array([None] + table["z"].to_pylist()[1:], pa.float16()))
    points = read_av2_feather(_feather_bytes(with_null), 1000)
    assert np.isnan(points[0, 2]) and np.isfinite(points[1:, 2]).all()
    as_float32 = table.set_column(0, "x", table["x"].cast(pa.float32()))
    np.testing.assert_array_equal(
        read_av2_feather(_feather_bytes(as_float32), 1000), read_av2_feather(data, 1000)
    )


def test_reader_rejects_hostile_inputs():
    data = _feather_bytes(_sweep_table(200))
    for cut in (7, 100, len(data) // 2, len(data) - 1, len(data) - 7):
        assert _reason(read_points, data[:cut], "av2_feather") in ("truncated", "bad_header")
    assert _reason(read_av2_feather, data[:-20] + data[-6:], 1000) in ("truncated", "bad_header")
    assert _reason(read_av2_feather, _feather_bytes(_sweep_table(drop="z")), 1000) == "bad_header"
    assert _reason(read_av2_feather, _feather_bytes(_sweep_table(drop="intensity")), 1000) == "bad_header"
    text_z = _sweep_table().set_column(2, "z", pa.array(["a"] * 50))
    assert _reason(read_av2_feather, _feather_bytes(text_z), 1000) == "bad_header"
    twice = _sweep_table().append_column("x", pa.array(np.zeros(50, np.float16)))
    assert _reason(read_av2_feather, _feather_bytes(twice), 1000) == "bad_header"
    assert _reason(read_av2_feather, _feather_bytes(_sweep_table(0)), 1000) == "empty"
    assert _reason(read_av2_feather, b"", 1000) == "empty"
    assert _reason(read_av2_feather, data, 199) == "too_large"
    assert _reason(read_av2_feather, b"FEA1" + bytes(100), 1000) == "unsupported_format"
    assert _reason(read_av2_feather, np.zeros((4, 4), np.float32).tobytes(), 1000) == "unsupported_format"


def test_reader_never_leaks_arrow_errors():
    data = _feather_bytes(_sweep_table(120), chunksize=50)
    rng = np.random.default_rng(7)
    reasons = set()
    for _ in range(400):
        bad = bytearray(data)
        for pos in rng.integers(0, len(bad), size=int(rng.integers(1, 4))):
            bad[pos] = int(rng.integers(0, 256))
        try:
            points = read_points(bytes(bad), "av2_feather")
            assert points.ndim == 2 and points.shape[1] == 4
        except RejectError as err:
            reasons.add(err.reason)
    assert reasons and reasons <= {"bad_header", "truncated", "too_large", "unsupported_format", "empty"}


# ------------------------------------------------------------------------------------ the layout


def _pose_table(stamps: list[int], skip: int | None = None) -> pa.Table:
    """City poses: the car drives +x at 10 m/s and yaws 0.1 rad/s (plus an unnormalized scale)."""
    rows = [t for t in stamps if t != skip]
    secs = np.array([(t - stamps[0]) / 1e9 for t in rows])
    half = 0.05 * secs
    return pa.table(
        {
            "timestamp_ns": pa.array(rows, pa.int64()),
            "qw": 2 * np.cos(half),
            "qx": np.zeros(len(rows)),
            "qy": np.zeros(len(rows)),
            "qz": 2 * np.sin(half),
            "tx_m": 1000 + 10 * secs,
            "ty_m": np.full(len(rows), -50.0),
            "tz_m": np.full(len(rows), 3.0),
        }
    )


def _make_log(root: Path, stamps: list[int], poses: pa.Table | None, extra: tuple[str, ...] = ()) -> Path:
    lidar = root / "sensors" / "lidar"
    lidar.mkdir(parents=True)
    for i, t in enumerate(stamps):
        (lidar / f"{t}.feather").write_bytes(_feather_bytes(_sweep_table(20, seed=i)))
    for name in extra:
        (lidar / name).write_bytes(b"x")
    if poses is not None:
        feather.write_feather(poses, str(root / av2.POSE_TABLE), compression="lz4")
    return root


STAMPS = [1_000_000_000 + 100_000_000 * i for i in range(4)]


def test_synthetic_sweep_chain(tmp_path: Path):
    poses = _pose_table(STAMPS)
    _make_log(tmp_path / "train" / "logA", STAMPS, poses)
    found = av2.load_tasks(str(tmp_path), LayoutOptions(sweeps=2), IO)
    assert found.rejects == []
    assert [t.sample_id for t in found.tasks] == [f"train/logA/{t}" for t in STAMPS]
    assert [len(t.sweeps) for t in found.tasks] == [0, 1, 2, 2]
    last = found.tasks[-1]
    assert [s.path for s in last.sweeps] == [found.tasks[2].path, found.tasks[1].path]  # newest first
    assert [s.time_lag_s for s in last.sweeps] == pytest.approx([0.1, 0.2])
    for s, t in zip(last.sweeps, STAMPS[2:0:-1], strict=True):
        expected = np.linalg.inv(_city_from_ego(poses, STAMPS[3])) @ _city_from_ego(poses, t)
        np.testing.assert_allclose(np.array(s.sensor_to_ref).reshape(4, 4), expected, atol=1e-9)
    # a point 1 m ahead of the car 0.2 s earlier is 2 m behind and slightly to the side of it now
    moved = np.array(last.sweeps[1].sensor_to_ref).reshape(4, 4) @ [1.0, 0, 0, 1]
    assert moved[0] == pytest.approx(1 - 2.0, abs=0.05) and abs(moved[1]) < 0.1
    assert av2.describe(str(tmp_path), IO) == "Argoverse 2 sensor logs (1 log, 4 sweeps)"


def test_synthetic_rejects(tmp_path: Path):
    _make_log(
        tmp_path / "logA", STAMPS, _pose_table(STAMPS, skip=STAMPS[1]), extra=("notes.txt", "12ab.feather")
    )
    _make_log(tmp_path / "logB", STAMPS[:2], None)
    plain = av2.load_tasks(str(tmp_path), LayoutOptions(), IO)
    assert len(plain.tasks) == 6  # no poses needed without sweeps
    unsupported = [(Path(p).name, r) for p, r, _ in plain.rejects]
    assert unsupported == [("12ab.feather", "unsupported_format"), ("notes.txt", "unsupported_format")]
    found = av2.load_tasks(str(tmp_path), LayoutOptions(sweeps=1), IO)
    assert [t.sample_id for t in found.tasks] == [f"logA/{STAMPS[0]}", f"logA/{STAMPS[3]}"]
    bad = {Path(p).parent.parent.parent.name + "/" + Path(p).name: (r, d) for p, r, d in found.rejects}
    assert len(found.tasks) + len(found.rejects) == 8  # every file accounted for
    for t in STAMPS[1:3]:  # its own pose is missing / its previous sweep's pose is missing
        reason, detail = bad[f"logA/{t}.feather"]
        assert reason == "bad_table" and str(STAMPS[1]) in detail
    for t in STAMPS[:2]:
        reason, detail = bad[f"logB/{t}.feather"]
        assert reason == "bad_table" and av2.POSE_TABLE in detail and "missing" in detail


def test_malformed_pose_tables(tmp_path: Path):
    good = _pose_table(STAMPS[:2])
    cases = {
        "no_qz": good.drop_columns(["qz"]),
        "text_stamps": good.set_column(0, "timestamp_ns", pa.array([str(t) for t in STAMPS[:2]])),
        "zero_quat": good.set_column(1, "qw", pa.array([0.0, 0.0])).set_column(4, "qz", pa.array([0.0, 0.0])),
        "nan": good.set_column(5, "tx_m", pa.array([np.nan, 1.0])),
        "duplicate": pa.concat_tables([good, good]),
    }
    for name, table in cases.items():
        _make_log(tmp_path / name, STAMPS[:2], table)
    (tmp_path / "garbage" / "sensors" / "lidar").mkdir(parents=True)
    (tmp_path / "garbage" / "sensors" / "lidar" / f"{STAMPS[0]}.feather").write_bytes(
        _feather_bytes(_sweep_table())
    )
    (tmp_path / "garbage" / av2.POSE_TABLE).write_bytes(b"ARROW1\x00\x00 not really")
    found = av2.load_tasks(str(tmp_path), LayoutOptions(sweeps=1), IO)
    assert found.tasks == []
    assert {r for _, r, _ in found.rejects} == {"bad_table"} and len(found.rejects) == 11
    details = {Path(p).parent.parent.parent.name: d for p, _, d in found.rejects}
    assert "'qz'" in details["no_qz"] and "timestamp_ns" in details["text_stamps"]
    assert "zero norm" in details["zero_quat"] and "more than one pose" in details["duplicate"]
    assert "Arrow IPC" in details["garbage"]

"""Issue #25 items 5 and 6, generated: hostile nuScenes tables, poses, quaternions and sweeps.

Every case ends in a reject with its reason or a one-line error, without a RuntimeWarning, and the good
keyframes beside the bad one are still scanned. Families: overlong strings in a row (rejected by length,
never copied), the memory a 100 MB filename costs, table files over the size limit, poses far away,
quaternions of any scale, sweep points that would overflow float32, sweeps whose columns differ from their
keyframe's, and one scan through the CLI holding all of them.
"""

from __future__ import annotations

import io
import json
import math
import tracemalloc
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lidarshard import schemas
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.tools.validate import validate
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.features.sample import ScanConfig, featurize
from lidarshard.transforms.io import storage
from lidarshard.transforms.layouts import nuscenes_tasks as tables
from lidarshard.transforms.layouts.geometry import MAX_TRANSLATION_M, quaternion_matrix
from lidarshard.transforms.layouts.multisweep import aggregate
from lidarshard.transforms.layouts.nuscenes_tasks import MAX_FIELD_CHARS, load_tasks
from tests.helpers import BEAM_TEST_FLAGS, IDENTITY_Q, one_scene_samples, yaw_q

pytestmark = pytest.mark.hostile("tables")

VERSION = "v1.0-hostile"
GOOD = ("good0", "good1", "good2")
TABLES = ("sample_data", "calibrated_sensor", "sensor", "ego_pose", "lidarseg")
HALF_TURN_X = [1.0, 1.0, 0.0, 0.0]  # unnormalized: 90 degrees about x


@pytest.fixture(autouse=True)
def _warnings_are_errors() -> Iterator[None]:
    """A RuntimeWarning (overflow in a cast or a matmul) is how issue #25 saw points vanish: none may leak."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        yield


def _cloud(n: int, cols: int = 5, seed: int = 0) -> np.ndarray:
    """(n, cols) float32 points 2..40 m from the sensor, so ``remove_close`` keeps them all."""
    rng = np.random.default_rng(seed)
    r, a = rng.uniform(2, 40, n), rng.uniform(-np.pi, np.pi, n)
    pts = np.zeros((n, cols), np.float32)
    pts[:, 0], pts[:, 1], pts[:, 2] = r * np.cos(a), r * np.sin(a), rng.uniform(-2, 3, n)
    return pts


def _encode(points: np.ndarray, ext: str) -> bytes:
    if ext == "npy":
        buf = io.BytesIO()
        np.save(buf, points)
        return buf.getvalue()
    if ext == "pcd":
        cols = points.shape[1]
        fields = ["x", "y", "z", "intensity", "ring", "extra"][:cols]
        head = (
            f"VERSION 0.7\nFIELDS {' '.join(fields)}\nSIZE {' '.join(['4'] * cols)}\nTYPE {' '.join(['F'] * cols)}\n"
            f"COUNT {' '.join(['1'] * cols)}\nWIDTH {len(points)}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\n"
            f"POINTS {len(points)}\nDATA binary\n"
        )
        return head.encode() + points.astype("<f4").tobytes()
    return points.astype("<f4").tobytes()  # pcd.bin: float32 x 5


class Root:
    """A nuScenes-style dataroot: keyframes, each with one sweep 50 ms before it; ``add`` returns the rows so a
    test can spoil one. The three ``GOOD`` keyframes are always there and must always be scanned."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.t: dict[str, list] = {
            "sensor": [{"token": "lidar", "channel": "LIDAR_TOP", "modality": "lidar"}],
            "calibrated_sensor": [
                {
                    "token": "cs",
                    "sensor_token": "lidar",
                    "translation": [0.9, 0.0, 1.8],
                    "rotation": IDENTITY_Q,
                }
            ],
            "ego_pose": [],
            "sample_data": [],
            "lidarseg": [],
        }
        self.files: dict[str, bytes] = {}
        self.clock = 1_000_000
        for token in GOOD:
            self.add(token)

    def _row(self, token: str, folder: str, ext: str, points: np.ndarray, key: bool, prev: str) -> dict:
        self.clock += 50_000
        pose = {"token": f"ep_{token}", "timestamp": self.clock, "translation": [10.0, 2.0, 0.0]}
        self.t["ego_pose"].append(pose | {"rotation": yaw_q(0.1)})
        name = f"{folder}/LIDAR_TOP/{token}.{ext}"
        self.files[name] = _encode(points, ext)
        row = {
            "token": token, "sample_token": f"s_{token}", "ego_pose_token": f"ep_{token}",
            "calibrated_sensor_token": "cs", "filename": name, "timestamp": self.clock,
            "is_key_frame": key, "prev": prev, "next": "",
        }  # fmt: skip
        self.t["sample_data"].append(row)
        return row

    def add(
        self, token: str, *, ext: str = "pcd.bin", key_cols: int = 5, sweep_cols: int = 5
    ) -> tuple[dict, dict]:
        """(keyframe row, sweep row) of a new keyframe ``token`` (sample ``s_<token>``) and its sweep."""
        sweep = self._row(f"{token}_sweep", "sweeps", ext, _cloud(40, sweep_cols, 1), False, "")
        key = self._row(token, "samples", ext, _cloud(60, key_cols, 2), True, sweep["token"])
        return key, sweep

    def pose(self, row: dict) -> dict:
        return next(p for p in self.t["ego_pose"] if p["token"] == row["ego_pose_token"])

    def write(self) -> str:
        (self.path / VERSION).mkdir(parents=True, exist_ok=True)
        for name, rows in (self.t | {"sample": one_scene_samples(self.t["sample_data"])}).items():
            (self.path / VERSION / f"{name}.json").write_text(json.dumps(rows))
        for name, data in self.files.items():
            (self.path / name).parent.mkdir(parents=True, exist_ok=True)
            (self.path / name).write_bytes(data)
        return str(self.path)

    def scan(self, sweeps: int = 1) -> tuple[dict[str, dict], list[tuple[str, str, str]]]:
        """What the scan's DoFn computes, in process: ({sample_id: feature row}, rejects)."""
        tasks, rejects = load_tasks(self.write(), VERSION, sweeps, storage.read_bytes)
        rows = {}
        for task in tasks:
            try:
                rows[task.sample_id] = featurize(task, storage.read_bytes, storage.size, ScanConfig())
            except RejectError as err:
                rejects.append((task.path, err.reason, err.detail))
        return rows, rejects


def _only_bad(root: Root, sweeps: int = 1) -> tuple[str, str, str]:
    """Scans ``root``: the good keyframes are all accepted and exactly one sample is rejected (returned)."""
    rows, rejects = root.scan(sweeps)
    assert {f"s_{t}" for t in GOOD} <= set(rows), rejects
    assert len(rejects) == 1, rejects
    return rejects[0]


# ------------------------------------------------------------------- item 5: strings a row may hold

STRING_FIELDS = ("token", "sample_token", "ego_pose_token", "calibrated_sensor_token", "prev", "filename")
LONG = (MAX_FIELD_CHARS + 1, 1 << 20)


@pytest.mark.parametrize("size", LONG)
@pytest.mark.parametrize("which", ["keyframe", "sweep"])
@pytest.mark.parametrize("field", STRING_FIELDS)
def test_an_overlong_string_rejects_its_sample_by_length(
    tmp_path: Path, field: str, which: str, size: int
) -> None:
    root = Root(tmp_path)
    key, sweep = root.add("bad")
    (key if which == "keyframe" else sweep)[field] = "x" * size
    path, reason, detail = _only_bad(root)
    assert reason == "bad_table"
    assert (
        len(path) < 300 and len(detail) < 300 and "x" * 100 not in path + detail
    )  # the length, not the text
    if (which, field) == ("sweep", "token"):
        assert "is not a known sample_data token" in detail  # the keyframe's prev names no row
    elif (which, field) == ("keyframe", "calibrated_sensor_token"):
        assert detail == "sample_data bad: unknown sensor channel"  # no sensor has that token
    else:
        assert str(size) in detail and str(MAX_FIELD_CHARS) in detail


@pytest.mark.parametrize("size", LONG)
def test_an_overlong_lidarseg_filename_rejects_its_sample(tmp_path: Path, size: int) -> None:
    root = Root(tmp_path)
    key, _ = root.add("bad")
    root.t["lidarseg"].append({"token": "ls", "sample_data_token": key["token"], "filename": "l" * size})
    path, reason, detail = _only_bad(root)
    assert (reason, path) == ("bad_table", f"{tmp_path}/{key['filename']}")
    assert str(size) in detail and len(detail) < 300


def test_long_strings_where_nothing_reads_them_are_harmless(tmp_path: Path) -> None:
    root = Root(tmp_path)
    key, _ = root.add("fine")
    root.pose(key)["note"] = "n" * (1 << 20)  # an extra field no one reads
    root.t["sensor"].append({"token": "t" * (1 << 20), "channel": "CAM_FRONT"})  # another sensor
    key["sample_token"] = "s" * MAX_FIELD_CHARS  # at the limit: still a usable id
    rows, rejects = root.scan()
    assert rejects == [] and set(rows) == {*(f"s_{t}" for t in GOOD), "s" * MAX_FIELD_CHARS}


@pytest.mark.parametrize("field", ["filename", "sample_token"])
def test_a_100_mb_string_costs_its_parse_and_nothing_more(tmp_path: Path, field: str) -> None:
    """Issue #25: a 100 MB filename cost ~45x its size (4.49 GB) and the scan died under a 6 GB cap."""
    root = Root(tmp_path)
    key, _ = root.add("huge")
    key[field] = "h" * (100 << 20)
    dataroot = root.write()
    table = (tmp_path / VERSION / "sample_data.json").stat().st_size
    tracemalloc.start()
    try:
        tasks, rejects = load_tasks(dataroot, VERSION, 1, storage.read_bytes)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * table, f"peak {peak / 2**20:.0f} MiB for a {table / 2**20:.0f} MiB table"
    assert [t.sample_id for t in tasks] == [f"s_{t}" for t in GOOD]
    assert [(r[1], len(r[0]) < 300, len(r[2]) < 300) for r in rejects] == [("bad_table", True, True)]


# ------------------------------------------------------------------------- item 5: table file sizes


@pytest.mark.parametrize("table", TABLES)
def test_a_table_over_the_limit_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str
) -> None:
    """An 8 GiB sparse table was read whole (bare MemoryError); the limit is patched down to 1 MiB here so
    the test reads at most that: the refusal must come from the size, not from memory running out."""
    root = Root(tmp_path)
    dataroot = root.write()
    big = tmp_path / VERSION / f"{table}.json"
    with open(big, "r+b") as f:
        f.truncate(8 << 30)  # sparse: no disk used
    monkeypatch.setattr(tables, "MAX_TABLE_BYTES", 1 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as info:
            load_tasks(dataroot, VERSION, 1, storage.read_bytes)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(info.value) == (
        f"nuScenes table {big} is larger than 1048576 bytes, the limit for a table (MAX_TABLE_BYTES)"
    )
    assert peak < 3 << 20


def test_the_table_limit_is_documented_and_named_in_gib(tmp_path: Path) -> None:
    assert tables.MAX_TABLE_BYTES == 4 << 30 and "MAX_TABLE_BYTES" in (tables.__doc__ or "")

    def oversize(path: str, limit: int | None) -> bytes:
        raise storage.FileTooLargeError(path, 8 << 30, limit or 0)

    with pytest.raises(ValueError, match=r"sample_data\.json is larger than 4 GiB, the limit for a table"):
        load_tasks(str(tmp_path), VERSION, 0, oversize)


def test_a_reader_that_ignores_the_limit_is_still_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataroot = Root(tmp_path).write()
    monkeypatch.setattr(tables, "MAX_TABLE_BYTES", 64)
    with pytest.raises(ValueError, match="sample_data.json is larger than 64 bytes"):
        load_tasks(dataroot, VERSION, 0, lambda path, limit: Path(path).read_bytes())


def test_a_table_too_big_to_parse_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataroot = Root(tmp_path).write()

    def no_memory(raw: bytes, what: str) -> object:
        raise MemoryError

    monkeypatch.setattr(tables, "loads", no_memory)
    with pytest.raises(
        ValueError, match=r"sample_data\.json \(\d+ bytes\) does not fit in memory once parsed"
    ):
        load_tasks(dataroot, VERSION, 0, storage.read_bytes)


# ------------------------------------------------------------------------------- item 6: far poses

FAR = [1e6, -1e6, 5e8, 2e9, 1e12, -1e15, 1e300, -1e300, 1.7e308]


def _expected(offset: float) -> str:
    return "absurd_coordinates" if abs(offset) <= MAX_TRANSLATION_M else "bad_table"


@pytest.mark.parametrize("axis", [0, 2])
@pytest.mark.parametrize("value", FAR)
@pytest.mark.parametrize("record", ["sweep ego_pose", "keyframe ego_pose", "sweep calibrated_sensor"])
def test_a_far_pose_is_rejected_never_dropped(tmp_path: Path, record: str, value: float, axis: int) -> None:
    """Issue #25: a sweep ego_pose of 1e300 turned the sweep to inf, dropped without a word (and a leaked
    RuntimeWarning), while 1e6 m was correctly ``absurd_coordinates``."""
    root = Root(tmp_path)
    key, sweep = root.add("far")
    if record == "sweep calibrated_sensor":
        cs = dict(root.t["calibrated_sensor"][0], token="cs_far")
        root.t["calibrated_sensor"].append(cs)
        sweep["calibrated_sensor_token"] = "cs_far"
        target = cs
    else:
        target = root.pose(sweep if record.startswith("sweep") else key)
    target["translation"] = [value if i == axis else t for i, t in enumerate(target["translation"])]
    path, reason, detail = _only_bad(root)
    assert (path, reason) == (f"{tmp_path}/{key['filename']}", _expected(value))
    assert ("translation" in detail) == (reason == "bad_table")


@pytest.mark.parametrize("value", [5e8, -MAX_TRANSLATION_M])
def test_far_but_equal_poses_cancel(tmp_path: Path, value: float) -> None:
    """No false alarm: keyframe and sweep both far from the map origin is a car that barely moved."""
    root = Root(tmp_path)
    key, sweep = root.add("far_pair")
    for row in (key, sweep):
        root.pose(row)["translation"] = [value, value, 0.0]
        root.pose(row)["rotation"] = IDENTITY_Q
    rows, rejects = root.scan()
    assert rejects == [] and rows["s_far_pair"]["num_points"] == 100


# ----------------------------------------------------------------------- item 6: quaternion scales

UNIT_QS = [HALF_TURN_X, yaw_q(0.5), [0.3, -0.5, 0.7, 0.1]]
SCALES_OK = [1e-8, 1.0, 1e10, 1e200, 1e308]
SCALES_ZERO = [1e-300, 1e-12, 0.0]


@pytest.mark.parametrize("scale", SCALES_OK)
@pytest.mark.parametrize("q", UNIT_QS)
def test_a_quaternion_of_any_finite_scale_is_its_rotation(q: list[float], scale: float) -> None:
    """Issue #25: ``[1e200, 1e200, 0, 0]`` became the identity (the squared norm overflowed to inf)."""
    scaled = [v * scale for v in q]
    np.testing.assert_allclose(quaternion_matrix(scaled), quaternion_matrix(q), atol=1e-12)
    assert not np.allclose(quaternion_matrix(q), np.eye(3))


@pytest.mark.parametrize("scale", SCALES_ZERO)
@pytest.mark.parametrize("q", UNIT_QS)
def test_a_vanishing_quaternion_is_refused(q: list[float], scale: float) -> None:
    with pytest.raises(RejectError, match="bad_table.*near. zero norm"):
        quaternion_matrix([v * scale for v in q])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1, 1), min_size=4, max_size=4).filter(lambda q: math.hypot(*q) > 0.1),
    st.integers(-8, 307),
)
def test_quaternion_scale_never_matters(q: list[float], exponent: int) -> None:
    scaled = [v * 10.0**exponent for v in q]
    np.testing.assert_allclose(quaternion_matrix(scaled), quaternion_matrix(q), atol=1e-12)


def test_a_huge_quaternion_in_the_tables_turns_the_sweep(tmp_path: Path) -> None:
    root = Root(tmp_path)
    key, sweep = root.add("turned")
    root.pose(sweep)["rotation"] = [1e200, 1e200, 0.0, 0.0]
    tasks, rejects = load_tasks(root.write(), VERSION, 1, storage.read_bytes)
    root.pose(sweep)["rotation"] = HALF_TURN_X
    same, _ = load_tasks(root.write(), VERSION, 1, storage.read_bytes)
    turned = next(t for t in tasks if t.sample_id == "s_turned").sweeps[0].sensor_to_ref
    assert (
        rejects == [] and turned == next(t for t in same if t.sample_id == "s_turned").sweeps[0].sensor_to_ref
    )


# --------------------------------------------------------------- item 6: sweeps leaving float32 range


def _tf(rotation: list[float] | None = None, t: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> np.ndarray:
    tf = np.eye(4)
    if rotation is not None:
        tf[:3, :3] = quaternion_matrix(rotation)
    tf[:3, 3] = t
    return tf


OVERFLOWS: dict[str, tuple[np.ndarray, np.ndarray]] = {
    "point near float32 max, turned 45 deg": (np.full((3, 5), 3e38, np.float32), _tf(yaw_q(math.pi / 4))),
    "translation 1e300": (_cloud(5), _tf(t=(1e300, 0.0, 0.0))),
    "translation 1e39": (_cloud(5), _tf(t=(0.0, 0.0, -1e39))),
    "transform holds inf": (_cloud(5), _tf(t=(math.inf, 0.0, 0.0))),
    "transform holds nan": (_cloud(5), _tf(t=(0.0, math.nan, 0.0))),
}


@pytest.mark.parametrize("case", OVERFLOWS)
def test_a_sweep_point_leaving_float32_is_absurd_not_inf(case: str) -> None:
    sweep, tf = OVERFLOWS[case]
    with pytest.raises(RejectError, match="absurd_coordinates: .* points of sweep 0 land beyond float32"):
        aggregate(_cloud(8), [sweep], [tf])


def test_non_finite_points_in_a_sweep_still_pass_through() -> None:
    sweep = _cloud(4)
    sweep[1, 0] = np.nan
    sweep[2, 2] = np.inf
    out = aggregate(_cloud(8), [sweep], [_tf(yaw_q(0.3), (1.0, 2.0, 0.0))])
    assert out.shape == (12, 5) and int(np.isfinite(out[:, :3]).all(axis=1).sum()) == 10


# ---------------------------------------------------------------------- item 6: sweep column counts

COLUMNS = [("npy", 5, 4), ("npy", 5, 6), ("npy", 4, 3), ("pcd", 4, 3), ("pcd", 4, 5), ("pcd", 3, 6)]


@pytest.mark.parametrize(("ext", "key_cols", "sweep_cols"), COLUMNS)
def test_a_sweep_with_other_columns_has_its_own_reason(
    tmp_path: Path, ext: str, key_cols: int, sweep_cols: int
) -> None:
    """Issue #25: fewer columns in a sweep than in its keyframe was filed as ``reader_error``."""
    root = Root(tmp_path)
    key, _ = root.add("mixed", ext=ext, key_cols=key_cols, sweep_cols=sweep_cols)
    path, reason, detail = _only_bad(root)
    assert (path, reason) == (f"{tmp_path}/{key['filename']}", "sweep_columns")
    assert detail == f"sweep 0 has {sweep_cols} columns per point, its keyframe {key_cols}"
    assert "sweep_columns" in schemas.REJECT_REASONS


@pytest.mark.parametrize("ext", ["npy", "pcd"])
def test_equal_columns_in_self_describing_formats_aggregate(tmp_path: Path, ext: str) -> None:
    root = Root(tmp_path)
    root.add("same", ext=ext, key_cols=4, sweep_cols=4)
    rows, rejects = root.scan()
    assert rejects == [] and rows["s_same"]["num_points"] == 100


# -------------------------------------------------------------------------- all of it, through the CLI


def test_one_scan_holding_every_family(tmp_path: Path) -> None:
    """Beam, rejects.parquet and validate: each hostile keyframe gets its reason, the good ones are scanned."""
    root = Root(tmp_path / "root")
    want: dict[str, str] = {}
    key, _ = root.add("long_name")
    key["filename"] = "f" * (1 << 20)
    want[f"{root.path}/{VERSION}/sample_data.json#long_name"] = "bad_table"
    key, sweep = root.add("far_sweep")
    root.pose(sweep)["translation"] = [1e300, 0.0, 0.0]
    want[f"{root.path}/{key['filename']}"] = "bad_table"
    key, sweep = root.add("far_but_finite")
    root.pose(sweep)["translation"] = [1e6, 0.0, 0.0]
    want[f"{root.path}/{key['filename']}"] = "absurd_coordinates"
    key, _ = root.add("mixed", ext="npy", key_cols=5, sweep_cols=4)
    want[f"{root.path}/{key['filename']}"] = "sweep_columns"
    key, sweep = root.add("turned")
    root.pose(sweep)["rotation"] = [1e200, 1e200, 0.0, 0.0]
    out = tmp_path / "out"
    flags = ["--nuscenes-version", VERSION, "--sweeps", "1", "--max-reject-fraction", "1", *BEAM_TEST_FLAGS]
    assert cli_main(["scan", root.write(), str(out), *flags]) == 0
    assert validate(str(out))[0] == []
    samples = {r["sample_id"] for r in pq.read_table(out / schemas.SAMPLES_DIR).to_pylist()}
    rejects = pq.read_table(out / schemas.REJECTS_FILE).to_pylist()
    assert samples == {*(f"s_{t}" for t in GOOD), "s_turned"}
    assert {r["path"]: r["reason"] for r in rejects} == want
    assert all(len(r["path"]) + len(r["detail"]) < 600 for r in rejects)

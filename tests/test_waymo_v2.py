"""Waymo Open v2 layout: range image -> points, one frame's row groups, sweeps, hostile files."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.io import storage
from lidarshard.transforms.layouts import STORAGE_IO, waymo_v2
from lidarshard.transforms.layouts.task import LayoutOptions
from lidarshard.transforms.layouts.waymo_range import (
    CAL_EXTRINSIC,
    CAL_INC_MAX,
    CAL_INC_MIN,
    CAL_INC_VALUES,
    KEY_FRAME,
    KEY_LASER,
    KEY_SEGMENT,
    RETURNS,
)

IO = STORAGE_IO
SEGMENT = "10023947602400723454_1120_000_1140_000"  # the real vehicle_pose file's segment
POSE_FILE = Path("waymo_v2") / "vehicle_pose" / f"{SEGMENT}.parquet"

# The declared schemas of SCHEMA.txt (waymo-open-dataset v2 Component.schema()).
LIDAR_SCHEMA = pa.schema(
    [
        (KEY_SEGMENT, pa.string()),
        (KEY_FRAME, pa.int64()),
        (KEY_LASER, pa.int8()),
        (RETURNS[0][0], pa.list_(pa.float32())),
        (RETURNS[0][1], pa.list_(pa.int32(), 3)),
        (RETURNS[1][0], pa.list_(pa.float32())),
        (RETURNS[1][1], pa.list_(pa.int32(), 3)),
    ]
)
CALIBRATION_SCHEMA = pa.schema(
    [
        (KEY_SEGMENT, pa.string()),
        (KEY_LASER, pa.int8()),
        (CAL_EXTRINSIC, pa.list_(pa.float64(), 16)),
        (CAL_INC_MIN, pa.float64()),
        (CAL_INC_MAX, pa.float64()),
        (CAL_INC_VALUES, pa.list_(pa.float64())),
    ]
)
POSE_SCHEMA = pa.schema(
    [
        (KEY_SEGMENT, pa.string()),
        (KEY_FRAME, pa.int64()),
        (waymo_v2.POSE_TRANSFORM, pa.list_(pa.float64(), 16)),
    ]
)


def extrinsic(yaw: float, pitch: float = 0.0, t: tuple[float, float, float] = (1.0, -0.5, 2.0)) -> np.ndarray:
    """Sensor -> vehicle: rotation Rz(yaw) @ Ry(pitch), translation t."""
    cz, sz, cy, sy = math.cos(yaw), math.sin(yaw), math.cos(pitch), math.sin(pitch)
    rz = np.array([[cz, -sz, 0], [sz, cz, 0], [0, 0, 1]])
    ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    e = np.eye(4)
    e[:3, :3], e[:3, 3] = rz @ ry, t
    return e


# Two lasers: 1 with explicit inclinations (ascending, bottom beam first), 2 with min/max only.
LASERS = {
    1: (extrinsic(0.3, 0.02), (4, 10), [-0.30, -0.12, 0.0, 0.05]),
    2: (extrinsic(-2.0, 0.0, (-1.0, 0.4, 1.0)), (3, 7), None),
}
INC_RANGE = (-0.5, 0.2)


def range_image(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    img = np.zeros((h, w, 4), dtype=np.float32)
    img[..., 0] = rng.uniform(1.0, 60.0, (h, w)) * (rng.random((h, w)) > 0.3)  # ~30% invalid (range 0)
    img[..., 1] = rng.uniform(0.0, 1.0, (h, w))
    img[..., 2] = rng.uniform(0.0, 0.2, (h, w))
    img[..., 3] = -1.0
    return img


def write_segment(
    root: Path, frames: list[int], seed: int = 0, calibration: bool = True, widen: int = 1
) -> dict:
    """A synthetic segment following SCHEMA.txt: one row group per frame, lasers written 2 then 1,
    range images ``widen`` times wider than ``LASERS`` says. Returns {(frame, laser): [return1, return2]}."""
    rng = np.random.default_rng(seed)
    rows, images = [], {}
    for ts in frames:
        for laser in (2, 1):
            _, (h, w), _ = LASERS[laser]
            imgs = [range_image(rng, h, w * widen) for _ in RETURNS]
            images[ts, laser] = imgs
            row = {KEY_SEGMENT: SEGMENT, KEY_FRAME: ts, KEY_LASER: laser}
            for (values, shape), img in zip(RETURNS, imgs, strict=True):
                row[values], row[shape] = img.reshape(-1).tolist(), list(img.shape)
            rows.append(row)
    (root / "lidar").mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=LIDAR_SCHEMA)
    pq.write_table(table, root / "lidar" / f"{SEGMENT}.parquet", row_group_size=len(LASERS))
    if calibration:
        cal = [
            {
                KEY_SEGMENT: SEGMENT,
                KEY_LASER: laser,
                CAL_EXTRINSIC: e.reshape(-1).tolist(),
                CAL_INC_MIN: INC_RANGE[0] if values is None else values[0],
                CAL_INC_MAX: INC_RANGE[1] if values is None else values[-1],
                CAL_INC_VALUES: values,
            }
            for laser, (e, _, values) in LASERS.items()
        ]
        (root / "lidar_calibration").mkdir(exist_ok=True)
        pq.write_table(
            pa.Table.from_pylist(cal, schema=CALIBRATION_SCHEMA),
            root / "lidar_calibration" / f"{SEGMENT}.parquet",
        )
    return images


def inclinations(laser: int) -> np.ndarray:
    _, (h, _), values = LASERS[laser]
    if values is None:
        lo, hi = INC_RANGE
        values = [lo + (i + 0.5) / h * (hi - lo) for i in range(h)]
    return np.asarray(values[::-1])  # top beam first


def closed_form(img: np.ndarray, e: np.ndarray, inc: np.ndarray) -> np.ndarray:
    """Pixel-by-pixel reference (plain Python loops over the PROVENANCE formula)."""
    h, w, _ = img.shape
    out = []
    for i in range(h):
        for j in range(w):
            r = float(img[i, j, 0])
            if r > 0:
                az = ((w - j - 0.5) / w * 2 - 1) * math.pi - math.atan2(e[1, 0], e[0, 0])
                p = [
                    r * math.cos(az) * math.cos(inc[i]),
                    r * math.sin(az) * math.cos(inc[i]),
                    r * math.sin(inc[i]),
                ]
                out.append([*(e[:3, :3] @ p + e[:3, 3]), img[i, j, 1], img[i, j, 2]])
    return np.asarray(out, dtype=np.float64).reshape(-1, 5)


# ---- range image -> points


def test_sphere_points_lie_at_their_range_from_the_sensor() -> None:
    h, w, r = 6, 32, 17.5
    img = np.zeros((h, w, 4), dtype=np.float32)
    img[..., 0] = r
    img[2, 5, 0] = 0.0  # invalid pixels are dropped
    img[4, 9, 0] = -1.0
    e = extrinsic(0.7, 0.1, (1.5, -0.3, 2.2))
    inc = np.linspace(0.3, -0.4, h)
    pts = waymo_v2.range_image_points(img, e, inc)
    assert pts.shape == (h * w - 2, 5) and pts.dtype == np.float32
    sensor = (pts[:, :3].astype(np.float64) - e[:3, 3]) @ e[:3, :3]  # inverse of the rigid extrinsic
    np.testing.assert_allclose(np.linalg.norm(sensor, axis=1), r, atol=1e-4)
    # every row keeps its inclination in the sensor frame
    rows = np.repeat(np.arange(h), w)
    rows = np.delete(rows, [2 * w + 5, 4 * w + 9])
    np.testing.assert_allclose(np.arcsin(sensor[:, 2] / r), inc[rows], atol=1e-5)


def test_centre_column_points_along_vehicle_forward_at_the_row_inclination() -> None:
    h, w = 5, 101  # odd width: column 50 is the exact centre
    img = np.zeros((h, w, 4), dtype=np.float32)
    img[:, w // 2, 0] = 10.0
    t = (1.0, 2.0, 3.0)
    e = extrinsic(1.1, 0.0, t)  # a yawed sensor: the azimuth correction undoes its yaw
    inc = np.linspace(0.2, -0.2, h)
    pts = waymo_v2.range_image_points(img, e, inc).astype(np.float64)
    expected = np.stack([10 * np.cos(inc), np.zeros(h), 10 * np.sin(inc)], axis=1) + t
    np.testing.assert_allclose(pts[:, :3], expected, atol=1e-4)


def test_points_match_closed_form_pixel_by_pixel() -> None:
    img = range_image(np.random.default_rng(3), 4, 9)
    e, inc = extrinsic(-0.4, 0.05), np.array([0.1, 0.0, -0.1, -0.25])
    pts = waymo_v2.range_image_points(img, e, inc)
    want = closed_form(img, e, inc)
    assert pts.shape == want.shape == (int((img[..., 0] > 0).sum()), 5)
    np.testing.assert_allclose(pts, want, atol=1e-4)


def test_beam_inclinations_values_reversed_else_uniform() -> None:
    row = {CAL_INC_VALUES: [-0.3, -0.1, 0.2], CAL_INC_MIN: -0.3, CAL_INC_MAX: 0.2}
    np.testing.assert_array_equal(waymo_v2.beam_inclinations(row, 3), [0.2, -0.1, -0.3])
    uniform = waymo_v2.beam_inclinations({CAL_INC_VALUES: None, CAL_INC_MIN: -0.4, CAL_INC_MAX: 0.4}, 4)
    np.testing.assert_allclose(uniform, [0.3, 0.1, -0.1, -0.3])
    with pytest.raises(RejectError) as err:
        waymo_v2.beam_inclinations(row, 4)
    assert err.value.reason == "bad_table"
    with pytest.raises(RejectError):
        waymo_v2.beam_inclinations({CAL_INC_VALUES: None, CAL_INC_MIN: None, CAL_INC_MAX: 0.1}, 4)


# ---- the real vehicle_pose component


def test_real_vehicle_pose_reads_with_the_declared_schema(realdata: Path) -> None:
    path = realdata / POSE_FILE
    schema = pq.read_schema(path)
    assert schema.names == POSE_SCHEMA.names
    for got, declared in zip(schema, POSE_SCHEMA, strict=True):
        if got.name == waymo_v2.POSE_TRANSFORM:  # SCHEMA.txt's note: stored as float, declared double
            assert pa.types.is_fixed_size_list(got.type) and got.type.list_size == 16
            assert pa.types.is_floating(got.type.value_type)
        else:
            assert got.type == declared.type
    poses = waymo_v2.read_poses(str(path), IO)
    assert len(poses) == 199 and all(m is not None for m in poses.values())
    for m in poses.values():
        assert m is not None and m.shape == (4, 4)
        np.testing.assert_allclose(m[:3, :3] @ m[:3, :3].T, np.eye(3), atol=1e-5)
        np.testing.assert_array_equal(m[3], [0, 0, 0, 1])


# ---- a synthetic segment: tasks, frames, row groups


def real_frames(realdata: Path, n: int) -> list[int]:
    return pq.read_table(realdata / POSE_FILE, columns=[KEY_FRAME]).column(0).to_pylist()[:n]


def test_describe_and_tasks(tmp_path: Path) -> None:
    frames = [1000, 1100, 1200]
    write_segment(tmp_path, frames)
    assert waymo_v2.describe(str(tmp_path), IO) == "Waymo Open v2 components (1 segment)"
    assert waymo_v2.describe(str(tmp_path / "lidar"), IO) is None
    found = waymo_v2.load_tasks(str(tmp_path), LayoutOptions(), IO)
    assert found.rejects == []
    lidar = str(tmp_path / "lidar" / f"{SEGMENT}.parquet")
    assert [t.sample_id for t in found.tasks] == [f"{SEGMENT}/{ts}" for ts in frames]
    assert all(t.path == lidar and t.sweeps == () and t.label_path is None for t in found.tasks)
    assert [t.frame for t in found.tasks] == frames
    assert waymo_v2.calibration_path(lidar) == str(tmp_path / "lidar_calibration" / f"{SEGMENT}.parquet")


def test_read_frame_exact_points_in_laser_then_return_order(tmp_path: Path) -> None:
    frames = [1000, 1100, 1200]
    images = write_segment(tmp_path, frames)
    lidar = str(tmp_path / "lidar" / f"{SEGMENT}.parquet")
    for ts in frames:
        pts = waymo_v2.read_frame(storage.open_read, lidar, ts, 10_000)
        parts = [
            closed_form(img, LASERS[laser][0], inclinations(laser))
            for laser in sorted(LASERS)
            for img in images[ts, laser]
        ]
        want = np.concatenate(parts)
        valid = sum(int((img[..., 0] > 0).sum()) for laser in LASERS for img in images[ts, laser])
        assert pts.shape == (valid, 5) and pts.dtype == np.float32
        np.testing.assert_allclose(pts, want, atol=1e-4)


class _Recorder:
    """A stream that records the byte ranges read from it."""

    def __init__(self, f, reads: list[tuple[int, int]]) -> None:
        self._f, self._reads, self.closed = f, reads, False

    def read(self, n: int = -1) -> bytes:
        start = self._f.tell()
        data = self._f.read(n)
        self._reads.append((start, start + len(data)))
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def test_read_frame_reads_only_that_frames_row_group(tmp_path: Path) -> None:
    frames = [1000, 1100, 1200]
    write_segment(tmp_path, frames, widen=300)  # row groups of ~0.5 MB: more than pyarrow's footer read
    lidar = str(tmp_path / "lidar" / f"{SEGMENT}.parquet")
    size = (tmp_path / "lidar" / f"{SEGMENT}.parquet").stat().st_size
    meta = pq.ParquetFile(lidar).metadata
    assert meta.num_row_groups == 3 and meta.row_group(0).total_byte_size > 1 << 17

    def chunk_range(g: int, c: int) -> tuple[int, int]:
        col = meta.row_group(g).column(c)
        start = col.dictionary_page_offset or col.data_page_offset
        return start, start + col.total_compressed_size

    reads: dict[str, list[tuple[int, int]]] = {}

    def open_read(path: str):
        return _Recorder(storage.open_read(path), reads.setdefault(path, []))

    def touched(spans: list[tuple[int, int]]) -> set[tuple[int, int]]:
        return {
            (g, c)
            for g in range(3)
            for c in range(meta.num_columns)
            for a, b in spans
            if a < chunk_range(g, c)[1] and b > chunk_range(g, c)[0]
        }

    pts = waymo_v2.read_frame(open_read, lidar, 1100, 1_000_000)
    assert len(pts) > 0
    footer_start = size - 8 - meta.serialized_size
    # pyarrow reads the file's tail (up to 64 KiB at once) for the footer; every other read is data
    footer = [(a, b) for a, b in reads[lidar] if b == size or a >= footer_start]
    assert footer and all(b - a <= 1 << 16 for a, b in footer)
    data = touched([r for r in reads[lidar] if r not in footer])
    names = [meta.schema.column(c).path for c in range(meta.num_columns)]
    assert {g for g, _ in data} == {1}  # the row group of frame 1100 only
    assert {names[c] for _, c in data} == {
        KEY_FRAME,
        KEY_LASER,
        *(f"{col}.list.element" for pair in RETURNS for col in pair),
    }  # every column but the segment name
    assert 0 not in {g for g, _ in touched(reads[lidar])}  # row group 0 never read at all
    assert set(reads) == {lidar, waymo_v2.calibration_path(lidar)}


def test_sweeps_move_previous_frames_through_the_vehicle_poses(tmp_path: Path, realdata: Path) -> None:
    frames = real_frames(realdata, 4)
    write_segment(tmp_path, frames)
    (tmp_path / "vehicle_pose").mkdir()
    shutil.copyfile(realdata / POSE_FILE, tmp_path / "vehicle_pose" / f"{SEGMENT}.parquet")  # tmp only
    table = pq.read_table(realdata / POSE_FILE)
    world = {
        ts: np.asarray(m, dtype=np.float64).reshape(4, 4)
        for ts, m in zip(table.column(KEY_FRAME).to_pylist(), table.column(2).to_pylist(), strict=True)
    }
    found = waymo_v2.load_tasks(str(tmp_path), LayoutOptions(sweeps=2), IO)
    assert found.rejects == [] and len(found.tasks) == 4
    assert [len(t.sweeps) for t in found.tasks] == [0, 1, 2, 2]
    for i, task in enumerate(found.tasks):
        want_frames = frames[max(0, i - 2) : i][::-1]
        assert [s.frame for s in task.sweeps] == want_frames
        for s, ts in zip(task.sweeps, want_frames, strict=True):
            want = np.linalg.inv(world[frames[i]]) @ world[ts]
            np.testing.assert_allclose(np.reshape(s.sensor_to_ref, (4, 4)), want, atol=1e-6)
            assert s.path == task.path and s.time_lag_s == pytest.approx((frames[i] - ts) / 1e6)
            assert 0.09 < s.time_lag_s < 0.21


# ---- hostile input


def test_frame_without_pose_rejects_the_samples_that_need_it(tmp_path: Path, realdata: Path) -> None:
    frames = [*real_frames(realdata, 2), 9_999_999_999_999_999]  # the last frame has no pose
    write_segment(tmp_path, frames)
    (tmp_path / "vehicle_pose").mkdir()
    shutil.copyfile(realdata / POSE_FILE, tmp_path / "vehicle_pose" / f"{SEGMENT}.parquet")
    found = waymo_v2.load_tasks(str(tmp_path), LayoutOptions(sweeps=1), IO)
    assert [t.frame for t in found.tasks] == frames[:2]
    lidar = str(tmp_path / "lidar" / f"{SEGMENT}.parquet")
    assert [(p, reason) for p, reason, _ in found.rejects] == [(f"{lidar}#{frames[2]}", "bad_table")]
    # without the pose file: the first frame (no sweeps) stays, the others are missing_file
    (tmp_path / "vehicle_pose" / f"{SEGMENT}.parquet").unlink()
    found = waymo_v2.load_tasks(str(tmp_path), LayoutOptions(sweeps=1), IO)
    assert [t.frame for t in found.tasks] == frames[:1]
    assert {reason for _, reason, _ in found.rejects} == {"missing_file"} and len(found.rejects) == 2


def test_segment_without_calibration_and_stray_files_are_rejects(tmp_path: Path) -> None:
    write_segment(tmp_path, [1000, 1100], calibration=False)
    (tmp_path / "lidar_calibration").mkdir()
    (tmp_path / "lidar_calibration" / "notes.txt").write_text("x")
    (tmp_path / "lidar" / "nested").mkdir()
    (tmp_path / "lidar" / "nested" / "other.parquet").write_bytes(b"x")
    found = waymo_v2.load_tasks(str(tmp_path), LayoutOptions(), IO)
    assert found.tasks == []
    reasons = sorted((Path(p.split("#")[0]).name, reason) for p, reason, _ in found.rejects)
    assert reasons == sorted(
        [
            ("notes.txt", "unsupported_format"),
            ("other.parquet", "unsupported_format"),
            (f"{SEGMENT}.parquet", "missing_file"),
            (f"{SEGMENT}.parquet", "missing_file"),
        ]
    )
    lidar = str(tmp_path / "lidar" / f"{SEGMENT}.parquet")
    with pytest.raises(RejectError) as err:
        waymo_v2.read_frame(storage.open_read, lidar, 1000, 10_000)
    assert err.value.reason == "missing_file"


def test_not_a_waymo_root_is_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no lidar/\\*.parquet"):
        waymo_v2.load_tasks(str(tmp_path), LayoutOptions(), IO)


def rewrite(root: Path, change) -> str:
    """Rewrite the segment's lidar file with ``change(row)`` applied to each row (schema kept)."""
    path = root / "lidar" / f"{SEGMENT}.parquet"
    rows = pq.read_table(path).to_pylist()
    for row in rows:
        change(row)
    pq.write_table(pa.Table.from_pylist(rows, schema=LIDAR_SCHEMA), path, row_group_size=len(LASERS))
    return str(path)


@pytest.mark.parametrize(
    "change",
    [
        lambda row: row.update({RETURNS[0][1]: [row[RETURNS[0][1]][0] + 1, *row[RETURNS[0][1]][1:]]}),
        lambda row: row.update({RETURNS[1][0]: row[RETURNS[1][0]][:-4]}),
        lambda row: row.update({RETURNS[0][1]: [1, len(row[RETURNS[0][0]]) // 2, 2]}),
        lambda row: row.update({RETURNS[0][1]: [-1, -1, 4]}),
    ],
    ids=["taller-than-values", "values-short", "two-channels", "negative"],
)
def test_shape_lying_about_values_is_bad_header(tmp_path: Path, change) -> None:
    write_segment(tmp_path, [1000])
    lidar = rewrite(tmp_path, change)
    with pytest.raises(RejectError) as err:
        waymo_v2.read_frame(storage.open_read, lidar, 1000, 10_000)
    assert err.value.reason == "bad_header"


def test_huge_claimed_shape_is_too_large_before_reading_values(tmp_path: Path) -> None:
    write_segment(tmp_path, [1000])
    lidar = rewrite(tmp_path, lambda row: row.update({RETURNS[0][1]: [100_000, 100_000, 4]}))
    with pytest.raises(RejectError) as err:
        waymo_v2.read_frame(storage.open_read, lidar, 1000, 10_000)
    assert err.value.reason == "too_large"


def test_frame_absent_too_many_points_not_parquet(tmp_path: Path) -> None:
    images = write_segment(tmp_path, [1000, 1200])
    lidar = str(tmp_path / "lidar" / f"{SEGMENT}.parquet")
    for frame in (1100, 999, 5000):  # between row groups, before and after every one
        with pytest.raises(RejectError) as err:
            waymo_v2.read_frame(storage.open_read, lidar, frame, 10_000)
        assert err.value.reason == "missing_file"
    valid = sum(int((img[..., 0] > 0).sum()) for laser in LASERS for img in images[1000, laser])
    assert len(waymo_v2.read_frame(storage.open_read, lidar, 1000, valid)) == valid
    with pytest.raises(RejectError) as err:
        waymo_v2.read_frame(storage.open_read, lidar, 1000, valid - 1)
    assert err.value.reason == "too_large"
    (tmp_path / "lidar" / f"{SEGMENT}.parquet").write_bytes(b"PAR1 not really parquet PAR1")
    with pytest.raises(RejectError) as err:
        waymo_v2.read_frame(storage.open_read, lidar, 1000, 10_000)
    assert err.value.reason == "bad_header"
    found = waymo_v2.load_tasks(str(tmp_path), LayoutOptions(), IO)
    assert found.tasks == [] and [(p, r) for p, r, _ in found.rejects] == [(lidar, "bad_header")]


def test_laser_without_calibration_is_bad_table(tmp_path: Path) -> None:
    write_segment(tmp_path, [1000])
    lidar = rewrite(tmp_path, lambda row: row.update({KEY_LASER: 5 if row[KEY_LASER] == 2 else 1}))
    with pytest.raises(RejectError) as err:
        waymo_v2.read_frame(storage.open_read, lidar, 1000, 10_000)
    assert err.value.reason == "bad_table"


def test_damaged_files_never_escape_as_other_errors(tmp_path: Path) -> None:
    write_segment(tmp_path, [1000, 1100])
    path = tmp_path / "lidar" / f"{SEGMENT}.parquet"
    good = path.read_bytes()
    rng = np.random.default_rng(7)
    damaged = [good[:cut] for cut in (0, 4, len(good) // 2, len(good) - 9, len(good) - 1)]
    for _ in range(30):
        data = bytearray(good)
        for pos in rng.integers(0, len(good), 4):
            data[pos] ^= 0xFF
        damaged.append(bytes(data))
    for data in damaged:
        path.write_bytes(data)
        try:
            pts = waymo_v2.read_frame(storage.open_read, str(path), 1000, 10_000)
        except RejectError as err:
            assert err.reason in {"bad_header", "unreadable", "missing_file", "bad_table", "too_large"}
        else:
            assert pts.ndim == 2 and pts.shape[1] == 5 and pts.dtype == np.float32
        found = waymo_v2.load_tasks(str(tmp_path), LayoutOptions(), IO)
        assert len(found.tasks) + len(found.rejects) >= 1


def test_mistyped_columns_are_bad_header(tmp_path: Path) -> None:
    write_segment(tmp_path, [1000])
    path = tmp_path / "lidar" / f"{SEGMENT}.parquet"
    table = pq.read_table(path)
    i = table.schema.get_field_index(RETURNS[0][0])
    table = table.set_column(i, RETURNS[0][0], pa.array(["x"] * table.num_rows))
    pq.write_table(table, path)
    with pytest.raises(RejectError, match="mistyped") as err:
        waymo_v2.read_frame(storage.open_read, str(path), 1000, 10_000)
    assert err.value.reason == "bad_header"

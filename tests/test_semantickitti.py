"""layouts.semantickitti: the real scans (three ROOT forms) and hand-built sequences with poses."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.formats import readers
from lidarshard.transforms.formats.labels import (
    SEMANTICKITTI_LEARNING_MAP,
    label_format,
    parse_learning_map,
    read_labels,
)
from lidarshard.transforms.layouts import STORAGE_IO, semantickitti
from lidarshard.transforms.layouts.task import LayoutOptions

IO = STORAGE_IO
FULL_POINTS = 123_389
#: Semantic ids of the full real scan and the same through its learning_map (see tests/test_labels.py).
FULL_SEMANTIC = [0, 1, 10, 11, 30, 40, 44, 48, 50, 51, 52, 70, 71, 72, 80, 81, 99, 252, 254]
FULL_CLASSES = [0, 1, 2, 6, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19]
#: A KITTI-like velodyne -> camera 0 transform (axes swapped, small offsets): rigid, not identity.
TR = np.array(
    [[0.0, -1.0, 0.0, -0.012], [0.0, 0.0, -1.0, -0.054], [1.0, 0.0, 0.0, -0.29], [0.0, 0.0, 0.0, 1.0]]
)


@pytest.fixture(scope="module")
def full(semantickitti_full: Path) -> Path:
    return semantickitti_full


@pytest.mark.parametrize("sub", ["", "sequences", "sequences/00", "sequences/00/"])
def test_real_full_three_roots(full: Path, sub: str) -> None:
    root = f"{full}/{sub}" if sub else str(full)
    assert semantickitti.describe(root, IO) == "SemanticKITTI sequences (1 sequence, 1 scan, 1 labelled)"
    found = semantickitti.load_tasks(root, LayoutOptions(), IO)
    assert found.rejects == []
    assert [t.sample_id for t in found.tasks] == ["00/000000"]
    task = found.tasks[0]
    seq = f"{full}/sequences/00"
    assert (task.path, task.label_path, task.sweeps) == (
        f"{seq}/velodyne/000000.bin",
        f"{seq}/labels/000000.label",
        (),
    )
    assert found.label_map == parse_learning_map((full / "semantic-kitti.yaml").read_bytes())
    points = readers.read_points(IO.read_bytes(task.path, None), readers.detect_format(task.path))
    assert points.shape == (FULL_POINTS, 4)
    label_bytes = IO.read_bytes(task.label_path, None)
    assert len(read_labels(label_bytes, label_format(task.label_path), FULL_POINTS)) == FULL_POINTS
    raw = read_labels(label_bytes, "semantickitti", len(points))
    assert np.unique(raw).tolist() == FULL_SEMANTIC
    classes = read_labels(label_bytes, label_format(task.label_path), len(points), found.label_map)
    assert np.unique(classes).tolist() == FULL_CLASSES


def test_real_small_scan(realdata: Path) -> None:
    root = realdata / "semantickitti"
    if not root.is_dir():
        pytest.skip("no small SemanticKITTI scan")
    assert semantickitti.describe(str(root), IO) == "SemanticKITTI sequences (1 sequence, 1 scan, 1 labelled)"
    found = semantickitti.load_tasks(str(root), LayoutOptions(), IO)
    # no semantic-kitti.yaml beside it (as in the real downloads): the standard learning_map, never raw ids
    assert found.label_map == SEMANTICKITTI_LEARNING_MAP
    (task,) = found.tasks
    points = readers.read_points(IO.read_bytes(task.path, None), "kitti_bin")
    data = IO.read_bytes(task.label_path, None)
    raw = read_labels(data, "semantickitti", len(points))
    labels = read_labels(data, "semantickitti", len(points), found.label_map)
    assert len(points) == len(labels) == 50
    assert np.unique(raw).tolist() == [0, 50, 52, 70, 71, 80]
    assert np.unique(labels).tolist() == [0, 13, 15, 16, 18]  # unlabeled, building, vegetation, trunk, pole


def test_standard_map_is_semantic_kitti_apis(semantickitti_full: Path) -> None:
    """The bundled map equals the learning_map of semantic-kitti-api's ``semantic-kitti.yaml``, and every
    real label maps as ``learning_map[raw & 0xFFFF]`` (instance bits dropped)."""
    config = parse_learning_map((semantickitti_full / "semantic-kitti.yaml").read_bytes())
    assert config == SEMANTICKITTI_LEARNING_MAP
    data = (semantickitti_full / "sequences/00/labels/000000.label").read_bytes()
    raw = np.frombuffer(data, "<u4")
    want = np.array([config[int(v)] for v in raw & 0xFFFF], np.uint8)
    np.testing.assert_array_equal(read_labels(data, "semantickitti", len(raw), config), want)


def test_labelled_scans_without_a_config_get_the_standard_map(
    semantickitti_full: Path, tmp_path: Path
) -> None:
    """A download as shipped (sequences/ with labels, no yaml): the standard map, before the scan too."""
    (tmp_path / "sequences").symlink_to(semantickitti_full / "sequences")
    assert semantickitti.find_label_map(str(tmp_path), IO) == SEMANTICKITTI_LEARNING_MAP
    assert (
        semantickitti.load_tasks(str(tmp_path), LayoutOptions(), IO).label_map == SEMANTICKITTI_LEARNING_MAP
    )


def test_not_semantickitti(realdata: Path, tmp_path: Path) -> None:
    """A KITTI object folder (training/velodyne) is not a sequence: detection says None."""
    for sub in ("kitti", "kitti/training", "waymo/kitti_format/training", "nuscenes"):
        if (realdata / sub).is_dir():
            assert semantickitti.describe(str(realdata / sub), IO) is None, sub
    assert semantickitti.describe(str(tmp_path), IO) is None
    with pytest.raises(ValueError, match="holds no SemanticKITTI scans"):
        semantickitti.load_tasks(str(tmp_path), LayoutOptions(), IO)


# --- hand-built sequences ---------------------------------------------------------------------------


def _pose(yaw: float, t: tuple[float, float, float]) -> np.ndarray:
    """Camera-0 pose: a rotation about the camera's y axis (down), then a translation."""
    c, s = math.cos(yaw), math.sin(yaw)
    out = np.eye(4)
    out[:3, :3] = [[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]]
    out[:3, 3] = t
    return out


POSES = [_pose(0.05 * i, (0.3 * i, 0.01 * i, 1.2 * i)) for i in range(5)]


def _row(m: np.ndarray) -> str:
    return " ".join(f"{v:.12e}" for v in m[:3].ravel())


def _sequence(
    root: Path,
    seq: str = "00",
    scans: int = 5,
    *,
    poses: bool = True,
    calib: bool = True,
    times: list[float] | None = None,
    labels: tuple[int, ...] = (),
) -> Path:
    """``root/sequences/<seq>``: ``scans`` scans of 3 points, poses.txt, calib.txt (with P0 like KITTI)."""
    folder = root / "sequences" / seq
    (folder / "velodyne").mkdir(parents=True)
    for i in range(scans):
        pts = np.arange(12, dtype=np.float32).reshape(3, 4) + i
        (folder / "velodyne" / f"{i:06d}.bin").write_bytes(pts.tobytes())
    if labels:
        (folder / "labels").mkdir()
        for i in labels:
            (folder / "labels" / f"{i:06d}.label").write_bytes(np.array([10, 40, 0], "<u4").tobytes())
    if poses:
        (folder / "poses.txt").write_text("\n".join(_row(p) for p in POSES[:scans]) + "\n")
    if calib:
        p0 = "P0: 7.18856e+02 0 6.071928e+02 0 0 7.18856e+02 1.852157e+02 0 0 0 1 0"
        (folder / "calib.txt").write_text(f"{p0}\nTr: {_row(TR)}\n")
    if times is not None:
        (folder / "times.txt").write_text("".join(f"{t:e}\n" for t in times))
    return folder


def test_sweep_chain_and_transform(tmp_path: Path) -> None:
    _sequence(tmp_path, labels=(0, 3))
    found = semantickitti.load_tasks(str(tmp_path), LayoutOptions(sweeps=2), IO)
    assert found.rejects == [] and found.label_map == SEMANTICKITTI_LEARNING_MAP
    by_id = {t.sample_id: t for t in found.tasks}
    assert list(by_id) == [f"00/{i:06d}" for i in range(5)]
    velodyne = f"{tmp_path}/sequences/00/velodyne"
    assert by_id["00/000000"].sweeps == ()
    assert [s.path for s in by_id["00/000001"].sweeps] == [f"{velodyne}/000000.bin"]
    task = by_id["00/000003"]
    assert [s.path for s in task.sweeps] == [f"{velodyne}/000002.bin", f"{velodyne}/000001.bin"]
    assert [s.time_lag_s for s in task.sweeps] == pytest.approx([0.1, 0.2])
    assert task.label_path == f"{tmp_path}/sequences/00/labels/000003.label"
    assert by_id["00/000002"].label_path is None
    # Independent check through points: world points seen from each scan's velodyne (world <- velo = P @ Tr).
    world = np.array([[5.0, -2.0, 30.0, 1.0], [-7.0, 1.5, 12.0, 1.0], [0.5, 0.2, -3.0, 1.0]]).T
    in_ref = np.linalg.inv(POSES[3] @ TR) @ world
    for ref, j in zip(task.sweeps, (2, 1), strict=True):
        moved = np.array(ref.sensor_to_ref).reshape(4, 4)
        np.testing.assert_allclose(moved, np.linalg.inv(POSES[3] @ TR) @ POSES[j] @ TR, atol=1e-9)
        np.testing.assert_allclose(moved @ (np.linalg.inv(POSES[j] @ TR) @ world), in_ref, atol=1e-6)


def test_times_txt_gives_lags(tmp_path: Path) -> None:
    _sequence(tmp_path, times=[0.0, 0.1037, 0.2073, 0.3110, 0.4147])
    found = semantickitti.load_tasks(str(tmp_path / "sequences"), LayoutOptions(sweeps=3), IO)
    task = {t.sample_id: t for t in found.tasks}["00/000004"]
    assert [s.time_lag_s for s in task.sweeps] == pytest.approx([0.1037, 0.2074, 0.3110])


def test_missing_poses_rejects_the_sequence(tmp_path: Path) -> None:
    _sequence(tmp_path, "00", 3, poses=False)
    _sequence(tmp_path, "01", 2)
    found = semantickitti.load_tasks(str(tmp_path), LayoutOptions(sweeps=1), IO)
    assert [t.sample_id for t in found.tasks] == ["01/000000", "01/000001"]
    assert len(found.rejects) == 3
    for path, reason, detail in found.rejects:
        assert path.startswith(f"{tmp_path}/sequences/00/velodyne/") and reason == "bad_table"
        assert "missing poses.txt" in detail and "sequences/00" in detail
    # Without sweeps, poses are never needed.
    plain = semantickitti.load_tasks(str(tmp_path), LayoutOptions(), IO)
    assert len(plain.tasks) == 5 and plain.rejects == []


def test_missing_calib_rejects_the_sequence(tmp_path: Path) -> None:
    _sequence(tmp_path, "00", 2, calib=False)
    found = semantickitti.load_tasks(str(tmp_path / "sequences" / "00"), LayoutOptions(sweeps=1), IO)
    assert found.tasks == []
    assert {(r[1], "missing calib.txt" in r[2]) for r in found.rejects} == {("bad_table", True)}


def test_calib_without_tr(tmp_path: Path) -> None:
    folder = _sequence(tmp_path, "00", 2)
    (folder / "calib.txt").write_text("P0: 1 0 0 0 0 1 0 0 0 0 1 0\n")
    found = semantickitti.load_tasks(str(tmp_path), LayoutOptions(sweeps=1), IO)
    assert found.tasks == [] and all("no 'Tr:' line" in r[2] for r in found.rejects)


def test_malformed_pose_rejects_the_samples_needing_it(tmp_path: Path) -> None:
    folder = _sequence(tmp_path)
    rows = (folder / "poses.txt").read_text().splitlines()
    rows[2] = "1 0 0 oops"
    (folder / "poses.txt").write_text("\n".join(rows) + "\n")
    found = semantickitti.load_tasks(str(tmp_path), LayoutOptions(sweeps=2), IO)
    assert [t.sample_id for t in found.tasks] == ["00/000000", "00/000001"]
    assert [(Path(p).name, r) for p, r, _ in found.rejects] == [
        ("000002.bin", "bad_table"),
        ("000003.bin", "bad_table"),
        ("000004.bin", "bad_table"),
    ]
    assert all("poses.txt row 2" in d for _, _, d in found.rejects)


def test_not_rigid_pose_and_short_poses(tmp_path: Path) -> None:
    folder = _sequence(tmp_path, scans=3)
    rows = (folder / "poses.txt").read_text().splitlines()
    (folder / "poses.txt").write_text("\n".join([rows[0], "2 0 0 0 0 1 0 0 0 0 1 0"]) + "\n")
    found = semantickitti.load_tasks(str(tmp_path), LayoutOptions(sweeps=1), IO)
    details = {Path(p).name: d for p, _, d in found.rejects}
    assert [t.sample_id for t in found.tasks] == ["00/000000"]
    assert "not a rigid transform" in details["000001.bin"]
    assert "has 2 rows; scan 2 needs row 2" in details["000002.bin"]


def test_files_that_are_not_scans(tmp_path: Path) -> None:
    folder = _sequence(tmp_path, scans=3)
    (folder / "velodyne" / "notes.txt").write_text("x")
    (folder / "velodyne" / "000009.BIN").write_bytes(b"")
    (folder / "velodyne" / "sub").mkdir()
    (folder / "velodyne" / "sub" / "000007.bin").write_bytes(b"")
    (folder / "velodyne" / "0001.bin").write_bytes(b"")  # scan 1 again
    found = semantickitti.load_tasks(str(tmp_path), LayoutOptions(), IO)
    assert [t.sample_id for t in found.tasks] == ["00/000000", "00/000001", "00/000002"]
    rejects = {p.split("/velodyne/")[1]: (r, d) for p, r, d in found.rejects}
    assert rejects["notes.txt"][0] == rejects["000009.BIN"][0] == rejects["sub/000007.bin"][0]
    assert (
        rejects["notes.txt"][0] == "unsupported_format" and "sub/000007.bin" in rejects["sub/000007.bin"][1]
    )
    assert rejects["0001.bin"][0] == "duplicate_id"
    on_disk = sorted(p for p in (folder / "velodyne").rglob("*") if p.is_file())
    assert len(found.tasks) + len(found.rejects) == len(on_disk)  # every file accounted for


def test_gap_in_scans_is_missing_sweep(tmp_path: Path) -> None:
    folder = _sequence(tmp_path)
    (folder / "velodyne" / "000002.bin").unlink()
    found = semantickitti.load_tasks(str(tmp_path), LayoutOptions(sweeps=2), IO)
    assert [t.sample_id for t in found.tasks] == ["00/000000", "00/000001"]
    assert [(Path(p).name, r) for p, r, _ in found.rejects] == [
        ("000003.bin", "missing_sweep"),
        ("000004.bin", "missing_sweep"),
    ]


def test_label_map_from_yaml_and_label_mismatch(tmp_path: Path) -> None:
    folder = _sequence(tmp_path, scans=2, labels=(0, 1))
    (tmp_path / "semantic-kitti.yaml").write_text("learning_map:\n  0: 0\n  10: 1\n")  # no 40
    (folder / "labels" / "000001.label").write_bytes(np.array([10, 0], "<u4").tobytes())  # 2 for 3 points
    found = semantickitti.load_tasks(str(folder), LayoutOptions(), IO)  # from sequences/00: up two folders
    assert found.label_map == {0: 0, 10: 1}
    scan0, scan1 = found.tasks
    n = len(readers.read_points(IO.read_bytes(scan0.path, None), "kitti_bin"))
    with pytest.raises(RejectError) as err:
        read_labels(IO.read_bytes(scan0.label_path, None), "semantickitti", n, found.label_map)
    assert err.value.reason == "label_mismatch" and "id 40" in err.value.detail
    with pytest.raises(RejectError) as err:
        read_labels(IO.read_bytes(scan1.label_path, None), "semantickitti", n, found.label_map)
    assert (
        err.value.reason == "label_mismatch"
        and "2 uint32 labels" in err.value.detail
        and "3 points" in err.value.detail
    )


def test_broken_label_config_is_fatal(tmp_path: Path) -> None:
    _sequence(tmp_path, scans=1)
    (tmp_path / "semantic-kitti.yaml").write_text("learning_map:\n  0: 300\n")
    with pytest.raises(ValueError) as err:
        semantickitti.load_tasks(str(tmp_path), LayoutOptions(), IO)
    assert "semantic-kitti.yaml" in str(err.value) and "\n" not in str(err.value)


def test_several_sequences_sorted_and_described(tmp_path: Path) -> None:
    _sequence(tmp_path, "01", 2, labels=(1,))
    _sequence(tmp_path, "00", 1)
    assert (
        semantickitti.describe(str(tmp_path), IO)
        == "SemanticKITTI sequences (2 sequences, 3 scans, 1 labelled)"
    )
    found = semantickitti.load_tasks(str(tmp_path) + "/", LayoutOptions(), IO)
    assert [t.sample_id for t in found.tasks] == ["00/000000", "01/000000", "01/000001"]
    assert [t.label_path is not None for t in found.tasks] == [False, False, True]


def test_bad_sweeps_option(tmp_path: Path) -> None:
    _sequence(tmp_path, scans=1)
    with pytest.raises(ValueError, match="sweeps"):
        semantickitti.load_tasks(str(tmp_path), LayoutOptions(sweeps=-1), IO)


def test_unlabelled_kitti_records_no_label_map(tmp_path: Path) -> None:
    """KITTI odometry scans without labels/: no map is recorded (there is nothing to map)."""
    _sequence(tmp_path)
    assert semantickitti.find_label_map(str(tmp_path), IO) is None
    assert semantickitti.load_tasks(str(tmp_path), LayoutOptions(), IO).label_map is None

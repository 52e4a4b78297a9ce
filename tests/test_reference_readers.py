"""Readers against the code people read these files with, on the real files of ../shared/realdata
(docs/READERS.md lists every format and layout, its reference and the test that holds it).

- headerless ``.bin`` records: ``np.fromfile(path, np.float32).reshape(-1, dims)``, the whole of
  mmdet3d's ``LoadPointsFromFile``, semantic-kitti-api's ``LaserScan.open_scan`` and the devkit's
  ``LidarPointCloud.from_file`` (which keeps 4 of the 5 columns): no library to install does more.
- ``.npy``: ``np.load`` of real scans written in every dtype, order and header version the reader takes.
- ``.ply``: plyfile, on the real (mesh) PLY and on a real scan written by plyfile as ascii and big-endian.

Files written here go to tmp_path; realdata is only read.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from lidarshard.transforms.formats.readers import FORMATS, read_points
from lidarshard.transforms.layouts import LAYOUT_NAMES
from tests.helpers import REPO
from tests.test_readers import REAL_FILES

READERS_DOC = REPO / "docs" / "READERS.md"
BINS = [(rel, dims) for rel, dims, _, _ in REAL_FILES if rel.endswith(".bin")]
#: Real scans of 4, 5 and 6 float32 columns that the .npy and .ply cases write out again.
SCANS = [
    ("kitti/training/velodyne_reduced/000008.bin", 4),
    ("nuscenes/samples/LIDAR_TOP/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin", 5),
    ("sunrgbd/points/000017.bin", 6),
]


def _format(rel: str, dims: int | None) -> str:
    return "nuscenes_bin" if rel.endswith(".pcd.bin") else "kitti_bin" if dims is None else "bin"


def _scan(realdata: Path, rel: str, dims: int) -> np.ndarray:
    return np.fromfile(realdata / rel, np.float32).reshape(-1, dims)


@pytest.mark.parametrize(("rel", "dims"), BINS, ids=[rel for rel, _ in BINS])
def test_fixed_record_files_are_np_fromfile(realdata: Path, rel: str, dims: int | None) -> None:
    fmt = _format(rel, dims)
    want = {"nuscenes_bin": 5, "kitti_bin": 4}.get(fmt, dims)
    reference = np.fromfile(realdata / rel, np.float32).reshape(-1, want)
    ours = read_points((realdata / rel).read_bytes(), fmt, point_dims=dims)
    assert ours.shape == reference.shape and ours.tobytes() == reference.tobytes()


@pytest.mark.parametrize(
    ("dtype", "fortran", "version"),
    [("<f4", False, (1, 0)), ("<f4", True, (1, 0)), (">f4", False, (2, 0)), ("<f8", False, (3, 0)),
     ("<f2", False, (1, 0)), ("<i4", True, (2, 0)), ("<u2", False, (1, 0))],
)  # fmt: skip
def test_npy_is_np_load(realdata: Path, tmp_path: Path, dtype: str, fortran: bool, version: tuple) -> None:
    for rel, dims in SCANS:
        scan = _scan(realdata, rel, dims)
        arr = np.abs(scan) if dtype[1] == "u" else scan
        arr = np.asfortranarray(arr.astype(dtype)) if fortran else np.ascontiguousarray(arr.astype(dtype))
        path = tmp_path / f"{Path(rel).stem}.npy"
        with open(path, "wb") as f:
            np.lib.format.write_array(f, arr, version=version)
        reference = np.load(path, allow_pickle=False)
        assert reference.flags.f_contiguous == fortran and reference.dtype == np.dtype(dtype)
        ours = read_points(path.read_bytes(), "npy")
        assert ours.tobytes() == np.ascontiguousarray(reference, np.float32).tobytes()


def test_the_real_ply_is_plyfiles(realdata: Path) -> None:
    plyfile = pytest.importorskip("plyfile")
    path = realdata / "ply" / "pcl" / "cube.ply"
    vertex = plyfile.PlyData.read(str(path))["vertex"]
    names = [p.name for p in vertex.properties]
    assert names == ["x", "y", "z"] and vertex.count == 24
    reference = np.stack([np.asarray(vertex[n], np.float32) for n in names], axis=1)
    assert read_points(path.read_bytes(), "ply").tobytes() == reference.tobytes()


@pytest.mark.parametrize("encoding", ["ascii", "binary_big_endian", "binary_little_endian"])
def test_real_scans_written_by_plyfile_read_as_plyfile_reads_them(
    realdata: Path, tmp_path: Path, encoding: str
) -> None:
    """Every property, every vertex (and a face list after the vertices, which a scan exported from a
    mesh tool carries)."""
    plyfile = pytest.importorskip("plyfile")
    for rel, dims in SCANS:
        scan = _scan(realdata, rel, dims)
        names = ["x", "y", "z", "intensity", "ring", "extra"][:dims]
        vertex = np.empty(len(scan), [(n, "f4") for n in names])
        for i, n in enumerate(names):
            vertex[n] = scan[:, i]
        faces = np.array([([0, 1, 2],), ([2, 3, 4],)], [("vertex_indices", "i4", (3,))])
        data = plyfile.PlyData(
            [plyfile.PlyElement.describe(vertex, "vertex"), plyfile.PlyElement.describe(faces, "face")],
            text=encoding == "ascii",
            byte_order={"ascii": "=", "binary_big_endian": ">", "binary_little_endian": "<"}[encoding],
        )
        path = tmp_path / f"{Path(rel).stem}.ply"
        data.write(str(path))
        read = plyfile.PlyData.read(str(path))["vertex"]
        reference = np.stack([np.asarray(read[n], np.float32) for n in names], axis=1)
        np.testing.assert_array_equal(reference, scan)  # plyfile's round trip is exact: the oracle holds
        assert read_points(path.read_bytes(), "ply").tobytes() == reference.tobytes()


# ---------------------------------------------------------------------- layouts through the loader


def test_semantickitti_through_the_loader_is_semantic_kitti_apis(realdata: Path, tmp_path: Path) -> None:
    """The real labelled scan built and served: points as ``LaserScan.open_scan`` reads them, labels as
    ``SemLaserScan.open_label`` + its remap (``yaml.safe_load`` of the config, a lookup table over
    ``label & 0xFFFF``)."""
    pytest.importorskip("torch")
    yaml = pytest.importorskip("yaml")
    import lidarshard
    from lidarshard.loaders.torch import PointCloudDataset

    root = realdata / "semantickitti_full"
    out = tmp_path / "out"
    lidarshard.build(str(root), str(out), world_size=1, batch_size=1, runner="FnApiRunner")
    item = PointCloudDataset(out, labels=True)[0]
    seq = root / "sequences" / "00"
    scan = np.fromfile(seq / "velodyne" / "000000.bin", dtype=np.float32).reshape((-1, 4))
    learning_map = yaml.safe_load((root / "semantic-kitti.yaml").read_text())["learning_map"]
    lut = np.zeros(max(learning_map) + 100, dtype=np.int32)
    lut[list(learning_map.keys())] = list(learning_map.values())
    raw = np.fromfile(seq / "labels" / "000000.label", dtype=np.int32) & 0xFFFF
    labels = lut[raw]
    assert len(scan) == len(labels) == 123_389 and (len(np.unique(raw)), len(np.unique(labels))) == (19, 14)
    assert item["points"].numpy().tobytes() == scan.tobytes()
    np.testing.assert_array_equal(item["labels"].numpy(), labels)


def test_av2_through_the_loader_is_the_feather_table(realdata: Path, tmp_path: Path) -> None:
    """av2-api's ``read_lidar_sweep`` reads a sweep's feather table (pandas over pyarrow) and takes x, y, z
    (float16) and intensity: each real sweep built and served (no sweeps) is those columns as float32."""
    pytest.importorskip("torch")
    import pyarrow.feather as feather

    import lidarshard
    from lidarshard.loaders.torch import PointCloudDataset

    root = realdata / "av2" / "sensor"
    out = tmp_path / "out"
    lidarshard.build(str(root), str(out), world_size=1, batch_size=1, runner="FnApiRunner")
    dataset = PointCloudDataset(out)
    lidar = sorted((root / "val").glob("*/sensors/lidar/*.feather"))
    assert len(dataset) == len(lidar) == 2
    for i, path in enumerate(lidar):
        table = feather.read_table(path)
        reference = np.stack([np.asarray(table[c], np.float32) for c in ("x", "y", "z", "intensity")], axis=1)
        assert dataset[i]["points"].numpy().tobytes() == reference.tobytes()


# ------------------------------------------------------------------------------- the table of readers


def _table() -> dict[str, list[str]]:
    """{first-column name: the row's cells} of the table in docs/READERS.md (names in backquotes)."""
    rows = {}
    for line in READERS_DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 4:
            for name in re.findall(r"`([^`]+)`", cells[0]):
                rows[name] = cells
    return rows


def test_every_format_and_layout_has_a_row_in_docs_readers() -> None:
    rows = _table()
    missing = [name for name in (*FORMATS, *LAYOUT_NAMES) if name not in rows]
    assert not missing, f"docs/READERS.md has no row for {missing}"


def test_every_test_the_table_names_exists() -> None:
    """A row's tests are ``tests/test_X.py::test_name`` (or ``tests/test_X.py``): each file and function
    exists, so the table never points at a test that was renamed or removed."""
    named = 0
    for name, cells in _table().items():
        for file, func in re.findall(r"(tests/test_\w+\.py)(?:::(test_\w+))?", " ".join(cells)):
            source = (REPO / file).read_text()
            assert not func or re.search(rf"^def {func}\(", source, re.M), f"{name}: {file}::{func} is gone"
            named += 1
        assert re.search(r"tests/test_\w+\.py", " ".join(cells)), f"row {name} names no test"
    assert named >= len(FORMATS) + len(LAYOUT_NAMES)

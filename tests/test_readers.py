"""lidarshard.transforms.formats.readers: detection, headerless bins, npy, ply, and every real file's count and extent."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

from lidarshard.schemas import REJECT_REASONS
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.formats.readers import (
    FORMATS,
    count_points_from_size,
    detect_format,
    read_points,
    record_floats,
)

# file under realdata/, point_dims (None = the format's default), N, (x, y, z) min..max (PROVENANCE.md)
REAL_FILES = [
    ("kitti/kitti_gt_database/0_Pedestrian_0.bin", None, 377, [(-0.24, 0.21), (-0.53, 0.60), (0.00, 1.83)]),
    ("kitti/misc/a.bin", None, 50, [(40.80, 53.61), (0.11, 7.02), (1.59, 2.02)]),
    ("kitti/training/velodyne/000000.bin", None, 800, [(11.57, 72.00), (-16.13, 13.96), (0.56, 2.64)]),
    ("kitti/training/velodyne_reduced/000000.bin", None, 800,
     [(11.57, 72.00), (-16.13, 13.96), (0.56, 2.64)]),
    ("kitti/training/velodyne_reduced/000008.bin", None, 17238,
     [(2.89, 76.83), (-26.42, 10.28), (-3.61, 2.87)]),
    ("lyft/lidar/host-a017_lidar1_1236118886501000046.bin", 5, 5,
     [(50.64, 52.07), (4.18, 6.51), (6.23, 6.43)]),
    ("lyft/lidar/host-a017_lidar1_1236118886701083686.bin", 5, 5,
     [(42.11, 54.76), (4.11, 7.37), (5.06, 6.61)]),
    ("lyft/lidar/host-a017_lidar1_1236118886901125926.bin", 5, 5,
     [(44.64, 49.62), (6.02, 6.48), (5.72, 6.37)]),
    ("nuscenes/samples/LIDAR_TOP/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin", None,
     34688, [(-58.00, 96.85), (-96.29, 98.59), (-3.42, 19.03)]),
    ("nuscenes/samples/LIDAR_TOP/n015-2018-08-02-17-16-37+0800__LIDAR_TOP__1533201470948018.pcd.bin", None,
     100, [(-22.04, -0.00), (-0.38, 0.04), (-1.96, 2.84)]),
    ("nuscenes/sweeps/LIDAR_TOP/n008-2018-09-18-12-07-26-0400__LIDAR_TOP__1537287083900561.pcd.bin", None,
     400, [(-22.09, -0.00), (-0.38, 1.21), (-2.06, 4.13)]),
    ("nuscenes/sweeps/LIDAR_TOP/n015-2018-08-02-17-16-37+0800__LIDAR_TOP__1533201470898274.pcd.bin", None,
     100, [(-22.04, -0.00), (-0.38, 0.04), (-1.96, 2.84)]),
    ("nuscenes_lidarseg_pr2859/samples/LIDAR_TOP/n015-2018-08-02-17-16-37+0800__LIDAR_TOP__1533201470948018"
     ".pcd.bin", None, 40, [(-29.89, 25.90), (-55.80, 15.11), (-2.45, 8.90)]),
    ("s3dis/points/Area_1_office_2.bin", 6, 100, [(0.04, 5.82), (0.01, 2.97), (0.05, 3.32)]),
    ("scannet/points/scene0000_00.bin", 6, 100, [(-3.50, 3.37), (-3.57, 3.46), (-0.04, 2.90)]),
    ("scannet_demo/points/scene0000_00.bin", 6, 40684, [(-0.01, 8.41), (-0.00, 8.73), (-0.00, 3.02)]),
    ("semantickitti/sequences/00/velodyne/000000.bin", None, 50,
     [(-52.89, 72.68), (-23.06, 31.58), (0.33, 2.08)]),
    ("sunrgbd/points/000001.bin", 6, 100, [(-0.98, -0.93), (1.28, 1.36), (0.02, 0.28)]),
    ("sunrgbd/points/000017.bin", 6, 50000, [(-2.18, 4.39), (1.15, 8.21), (-1.45, 1.66)]),
    ("waymo/kitti_format/training/velodyne/0000000.bin", 6, 800,
     [(-58.21, 7.73), (-0.07, 17.66), (2.41, 4.36)]),
    ("waymo/kitti_format/training/velodyne/1000000.bin", 6, 800,
     [(-45.78, 72.48), (2.11, 74.21), (2.66, 5.23)]),
    ("waymo/kitti_format/waymo_gt_database/0_Car_0.bin", 5, 303,
     [(-3.18, 1.94), (-1.55, 1.47), (0.06, 1.21)]),
    ("pcd/pcl/lamppost.pcd", None, 1771, [(-11.17, -9.77), (-0.38, 0.59), (-5.45, 0.47)]),
    ("pcd/pcl/car6.pcd", None, 10031, [(-40.17, -33.95), (-68.56, -61.88), (-6.99, -5.43)]),
    ("pcd/mmdet3d_pr2611/8_0001.pcd", None, 116465, [(-49.71, 49.65), (-49.35, 49.72), (-4.93, 2.05)]),
    ("ply/pcl/cube.ply", None, 24, [(-1.0, 1.0), (-1.0, 1.0), (-1.0, 1.0)]),
]  # fmt: skip


def _reject(data: bytes, fmt: str, **kw) -> RejectError:
    with pytest.raises(RejectError) as e:
        read_points(data, fmt, **kw)
    assert e.value.reason in REJECT_REASONS and e.value.reason != "reader_error"
    return e.value


# ------------------------------------------------------------------------------------------ real files


@pytest.mark.parametrize(
    "rel,dims,n,extent", REAL_FILES, ids=[r[0].rsplit("/", 1)[-1][-40:] for r in REAL_FILES]
)
def test_real_file_count_and_extent(realdata, rel, dims, n, extent):
    data = (realdata / rel).read_bytes()
    fmt = detect_format(rel)
    pts = read_points(data, fmt, point_dims=dims)
    assert pts.dtype == np.float32 and pts.flags.c_contiguous and pts.flags.writeable
    assert pts.shape[0] == n and pts.shape[1] >= 3
    if record_floats(fmt, dims) is not None:
        assert pts.shape[1] == record_floats(fmt, dims)
        assert count_points_from_size(len(data), fmt, dims) == n
    for axis, (lo, hi) in enumerate(extent):
        assert round(float(pts[:, axis].min()), 2) == pytest.approx(lo, abs=1e-9)
        assert round(float(pts[:, axis].max()), 2) == pytest.approx(hi, abs=1e-9)


def test_real_nuscenes_keeps_intensity_and_ring(realdata):
    rel = "nuscenes/samples/LIDAR_TOP/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin"
    pts = read_points((realdata / rel).read_bytes(), "nuscenes_bin")
    assert pts.shape == (34688, 5)
    assert set(np.unique(pts[:, 4])) == set(range(32))
    assert pts[:, 3].min() >= 0 and pts[:, 3].max() <= 255


def test_real_binary_mesh_ply_reads_vertices_only(realdata):
    pts = read_points((realdata / "ply/pcl/cube.ply").read_bytes(), "ply")
    assert pts.shape == (24, 3) and set(np.unique(np.abs(pts))) == {1.0}


# ------------------------------------------------------------------------------- detection and sizes


@pytest.mark.parametrize(
    "path,fmt",
    [
        ("a/n015__LIDAR_TOP__1.pcd.bin", "nuscenes_bin"),
        ("gs://b/X.PCD.BIN", "nuscenes_bin"),
        ("velodyne/000000.bin", "kitti_bin"),
        ("S.Bin", "kitti_bin"),
        ("pts.npy", "npy"),
        ("c.PCD", "pcd"),
        ("m.Ply", "ply"),
    ],
)
def test_detect_format(path, fmt):
    assert detect_format(path) == fmt and fmt in FORMATS


@pytest.mark.parametrize("path", ["a.las", "a.pcd.gz", "readme", "a.bin.tmp", "npy", ""])
def test_detect_format_rejects_other_extensions(path):
    with pytest.raises(RejectError) as e:
        detect_format(path)
    assert e.value.reason == "unsupported_format"


def test_record_floats():
    assert [record_floats(f) for f in ("nuscenes_bin", "kitti_bin", "npy", "pcd", "ply")] == [
        5,
        4,
        None,
        None,
        None,
    ]
    assert record_floats("kitti_bin", 6) == record_floats("nuscenes_bin", 6) == record_floats("bin", 6) == 6
    assert record_floats("pcd", 6) is None
    with pytest.raises(ValueError, match="needs point_dims"):
        record_floats("bin")
    with pytest.raises(ValueError, match="unknown format"):
        record_floats("las")


def test_count_points_from_size():
    assert count_points_from_size(693760, "nuscenes_bin") == 34688
    assert count_points_from_size(19200, "kitti_bin", 6) == 800
    assert count_points_from_size(24, "bin", 3) == 2
    for num_bytes, reason in ((0, "empty"), (21, "truncated"), (30, "truncated")):
        with pytest.raises(RejectError) as e:
            count_points_from_size(num_bytes, "nuscenes_bin")
        assert e.value.reason == reason
    with pytest.raises(RejectError, match="bad_header"):
        count_points_from_size(16, "bin", 2)
    for fmt in ("npy", "pcd", "ply", "las"):
        with pytest.raises(ValueError):
            count_points_from_size(100, fmt)


# ---------------------------------------------------------------------------------------- bin formats


def test_bin_round_trip_is_a_copy():
    pts = np.arange(60, dtype=np.float32).reshape(12, 5)
    data = bytearray(pts.tobytes())
    got = read_points(bytes(data), "nuscenes_bin")
    np.testing.assert_array_equal(got, pts)
    np.testing.assert_array_equal(read_points(bytes(data), "kitti_bin", point_dims=3), pts.reshape(20, 3))
    np.testing.assert_array_equal(read_points(bytes(data), "bin", point_dims=10), pts.reshape(6, 10))
    got[0, 0] = 99  # writeable, independent of the input buffer
    assert data[:4] == b"\0\0\0\0"


@pytest.mark.parametrize(
    "data,fmt,kw,reason",
    [
        (b"", "kitti_bin", {}, "empty"),
        (b"\0" * 17, "kitti_bin", {}, "truncated"),
        (b"\0" * 16, "nuscenes_bin", {}, "truncated"),
        (b"\0" * 16, "bin", {}, "bad_header"),
        (b"\0" * 16, "bin", {"point_dims": 2}, "bad_header"),
        (b"\0" * 16, "kitti_bin", {"point_dims": 0}, "bad_header"),
        (b"\0" * 32, "kitti_bin", {"max_points": 1}, "too_large"),
        (b"\0" * 32, "las", {}, "unsupported_format"),
    ],
)
def test_bin_rejects(data, fmt, kw, reason):
    assert _reject(data, fmt, **kw).reason == reason


# ------------------------------------------------------------------------------------------------ npy


def _npy(arr: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr, allow_pickle=False)
    else:
        np.lib.format.write_array(buf, arr, version=version, allow_pickle=False)
    return buf.getvalue()


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(12, dtype=np.float32).reshape(4, 3),
        np.linspace(-5, 5, 35).reshape(7, 5),  # float64
        np.asfortranarray(np.arange(20, dtype=np.float64).reshape(5, 4)),
        np.arange(18, dtype=">f4").reshape(6, 3),  # big-endian
        np.arange(18, dtype=np.int16).reshape(6, 3),
        np.arange(18, dtype=np.uint8).reshape(6, 3),
        np.arange(9, dtype=np.float16).reshape(3, 3),
    ],
    ids=["f4", "f8", "fortran", "be_f4", "i2", "u1", "f2"],
)
def test_npy_round_trip(arr):
    got = read_points(_npy(arr), "npy")
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, arr.astype(np.float32))


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_header_versions(version):
    arr = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(read_points(_npy(arr, version), "npy"), arr)


def test_npy_object_array_is_never_unpickled(monkeypatch):
    buf = io.BytesIO()
    np.save(buf, np.array([[1, 2, 3]], dtype=object), allow_pickle=True)
    import pickle

    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("unpickled"))
    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("unpickled"))
    assert _reject(buf.getvalue(), "npy").reason == "bad_header"


def _raw_npy(header: str, body: bytes = b"") -> bytes:
    h = header.encode("latin1")
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + body


def _hdr(shape: str = "(1, 3)", descr: str = "'<f4'", fortran: str = "False", body: bytes = b"") -> bytes:
    return _raw_npy(f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}", body)


@pytest.mark.parametrize(
    "data,reason,detail",
    [
        (b"", "empty", "no bytes"),
        (b"PK\x03\x04 zip archive", "bad_header", "magic"),
        (b"\x93NUMPY\x09\x00\x10\x00", "bad_header", "version 9"),
        (b"\x93NUMPY\x01\x00\xff\xff{", "bad_header", "header length"),
        (_hdr("(4,)"), "bad_header", "2-D"),
        (_hdr("(4, 2)"), "bad_header", "3 columns"),
        (_hdr("(2, 3, 1)"), "bad_header", "2-D"),
        (_hdr("(-2, 3)"), "bad_header", "2-D"),
        (_hdr("(True, 3)"), "bad_header", "2-D"),
        (_hdr("(0, 3)"), "empty", "0 points"),
        (_hdr("(10**12, 3)"), "bad_header", "literal"),
        (_hdr("(1000000000000, 3)"), "too_large", ""),
        (_hdr("(1000, 3)", body=b"\0" * 11999),
         "truncated", "11999 data bytes"),
        (_hdr("(1, 3)", descr="'|O'"), "bad_header", "numeric"),
        (_hdr("(1, 3)", descr="'<c8'"), "bad_header", "numeric"),
        (_hdr("(1, 3)", descr="'<U4'"), "bad_header", "numeric"),
        (_hdr("(1, 3)", descr="[('x', '<f4')]"), "bad_header", "plain"),
        (_hdr("(1, 3)", descr="'nonsense'"), "bad_header", "dtype"),
        (_hdr("(1, 3)", fortran="0"), "bad_header", "True or False"),
        (_raw_npy("{'descr': '<f4', 'shape': (1, 3), }"), "bad_header", "dict with"),
        (_raw_npy("__import__('os').system('true')"), "bad_header", "literal"),
        (_raw_npy("[" * 5000), "bad_header", "literal"),
    ],
)  # fmt: skip
def test_npy_rejects(data, reason, detail):
    err = _reject(data, "npy")
    assert err.reason == reason and detail in err.detail, err


# ------------------------------------------------------------------------------------------------ ply


def _ply(
    fmt: str, n: int = 5, before: str = "", after: bool = True, extra_list: bool = False
) -> tuple[bytes, np.ndarray]:
    """A PLY with vertices (x, y, z float, intensity uchar, t double) and optionally faces after."""
    rng = np.random.default_rng(1)
    bo = {"binary_little_endian": "<", "binary_big_endian": ">"}.get(fmt, "<")
    vert = np.empty(
        n, dtype=[("x", bo + "f4"), ("intensity", "u1"), ("y", bo + "f4"), ("z", bo + "f4"), ("t", bo + "f8")]
    )
    for k in ("x", "y", "z", "t"):
        vert[k] = rng.normal(size=n)
    vert["intensity"] = rng.integers(0, 256, n)
    want = np.stack([vert[k].astype(np.float32) for k in ("x", "y", "z", "intensity", "t")], axis=1)
    head = f"ply\nformat {fmt} 1.0\ncomment made by a test\n" + before
    head += f"element vertex {n}\nproperty float x\nproperty uchar intensity\nproperty float y\n"
    head += "property float z\nproperty double t\n"
    if extra_list:
        head += "property list uchar int idx\n"
    if after:
        head += "element face 1\nproperty list uchar int vertex_indices\n"
    head += "end_header\n"
    if fmt == "ascii":
        lines = [" ".join(f"{v!r}" if isinstance(v, float) else str(v) for v in row.tolist()) for row in vert]
        if extra_list:
            lines = [ln + " 2 7 8" for ln in lines]
        body = "\n".join(lines) + "\n" + ("3 0 1 2\n" if after else "")
        return head.encode() + body.encode(), want
    if extra_list:
        raise ValueError("binary list vertices are built by plyfile in the tests")
    face = np.array([3], "u1").tobytes() + np.array([0, 1, 2], bo + "i4").tobytes()
    return head.encode() + vert.tobytes() + (face if after else b""), want


@pytest.mark.parametrize("fmt", ["ascii", "binary_little_endian", "binary_big_endian"])
def test_ply_round_trip(fmt):
    data, want = _ply(fmt)
    got = read_points(data, "ply")
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt", ["ascii", "binary_little_endian"])
def test_ply_scalar_element_before_vertex(fmt):
    if fmt == "ascii":
        data, want = _ply(fmt, before="element camera 2\nproperty float fx\nproperty int w\n")
        data = data.replace(b"end_header\n", b"end_header\n1.5 3\n2.5 4\n")
    else:
        data, want = _ply(fmt, before="element camera 2\nproperty float fx\nproperty int w\n")
        data = data.replace(b"end_header\n", b"end_header\n" + b"\x01" * 16)
    np.testing.assert_array_equal(read_points(data, "ply"), want)


def test_ply_list_before_vertex_uses_plyfile():
    plyfile = pytest.importorskip("plyfile")
    verts = np.array([(1, 2, 3, 9), (4, 5, 6, 8)], dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), ("s", "u2")])
    faces = np.empty(1, dtype=[("vertex_indices", "O")])
    faces["vertex_indices"][0] = np.array([0, 1, 0], "i4")
    for text in (True, False):
        buf = io.BytesIO()
        els = [plyfile.PlyElement.describe(faces, "face"), plyfile.PlyElement.describe(verts, "vertex")]
        plyfile.PlyData(els, text=text).write(buf)
        np.testing.assert_array_equal(read_points(buf.getvalue(), "ply"), [[1, 2, 3, 9], [4, 5, 6, 8]])


def test_ply_list_in_vertex_uses_plyfile():
    pytest.importorskip("plyfile")
    data, want = _ply("ascii", extra_list=True)
    np.testing.assert_array_equal(read_points(data, "ply"), want)


def test_ply_without_plyfile_is_unsupported(monkeypatch):
    monkeypatch.setitem(sys.modules, "plyfile", None)
    data, _ = _ply("ascii", extra_list=True)
    err = _reject(data, "ply")
    assert err.reason == "unsupported_format" and "lidarshard[ply]" in err.detail


@pytest.mark.parametrize(
    "edit,reason,detail",
    [
        (lambda d: b"", "empty", "no bytes"),
        (lambda d: d[3:], "bad_header", "magic"),
        (lambda d: d.replace(b"end_header", b"end_headr"), "bad_header", "end_header"),
        (
            lambda d: d.replace(b"binary_little_endian", b"binary_middle_endian"),
            "bad_header",
            "bad header line",
        ),
        (lambda d: d.replace(b"format binary_little_endian 1.0\n", b""), "bad_header", "format line"),
        (lambda d: d.replace(b"property float y", b"property float w"), "bad_header", "'y'"),
        (lambda d: d.replace(b"property float y", b"property float128 y"), "bad_header", "bad header line"),
        (lambda d: d.replace(b"element vertex 5", b"element vertex -5"), "bad_header", "bad header line"),
        (lambda d: d.replace(b"element vertex 5", b"element vertex 0"), "empty", "0 vertices"),
        (lambda d: d.replace(b"element vertex 5", b"element vertex 1000000000000"), "too_large", ""),
        (lambda d: d.replace(b"element vertex 5", b"element vertex 50"), "truncated", "body bytes"),
        (lambda d: d.replace(b"element face 1", b"element face 100000000"), "truncated", "body bytes"),
        (lambda d: d.replace(b"element vertex", b"element vertx"), "bad_header", "'vertex' element"),
        (lambda d: d[:-40], "truncated", "body bytes"),
        (lambda d: d.replace(b"comment made", "comment mädé".encode()), "bad_header", "non-ASCII"),
    ],
)
def test_ply_rejects(edit, reason, detail):
    data, _ = _ply("binary_little_endian")
    err = _reject(edit(data), "ply")
    assert err.reason == reason and detail in err.detail, err


def test_ply_ascii_rejects():
    data, _ = _ply("ascii", after=False)
    assert _reject(data[:-30], "ply").reason == "truncated"
    bad = data.split(b"end_header\n")[0] + b"end_header\n" + b"1 2 abc 4 5\n" * 5
    assert "not a number" in _reject(bad, "ply").detail


# ------------------------------------------------------------------------------------- safety nets


@pytest.mark.parametrize("exc,reason", [(IndexError("bug"), "reader_error"), (MemoryError(), "too_large")])
def test_unexpected_errors_become_rejects(monkeypatch, exc, reason):
    import lidarshard.transforms.formats.readers as readers

    def boom(data, max_points):
        raise exc

    monkeypatch.setattr(readers, "_read_npy", boom)
    with pytest.raises(RejectError) as e:
        read_points(b"x", "npy")
    assert e.value.reason == reason


def test_open3d_backend_import_error_names_the_extra(monkeypatch):
    from lidarshard.transforms.formats.open3d_backend import read_points_open3d

    monkeypatch.setitem(sys.modules, "open3d", None)
    with pytest.raises(ImportError, match=r"lidarshard\[open3d\]"):
        read_points_open3d(b"", "pcd")

"""lidarshard.transforms.formats.pcd: real PCL files, generated round trips in every DATA mode, and hostile headers."""

from __future__ import annotations

import io

import lzf
import numpy as np
import pytest

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.formats.pcd import MAX_HEADER_BYTES, parse_header, read_pcd

# file under realdata/pcd, N, finite N, columns, (x, y, z) min..max to 2 decimals (PROVENANCE.md)
REAL_PCD = [
    ("mmdet3d_pr2611/8_0001.pcd", 116465, 116465, ["x", "y", "z", "r", "g", "b"],
     [(-49.71, 49.65), (-49.35, 49.72), (-4.93, 2.05)]),
    ("pcl/bunny.pcd", 397, 397, ["x", "y", "z"], [(-0.09, 0.06), (0.04, 0.18), (-0.06, 0.06)]),
    ("pcl/car6.pcd", 10031, 10031, ["x", "y", "z"], [(-40.17, -33.95), (-68.56, -61.88), (-6.99, -5.43)]),
    ("pcl/colored_cloud.pcd", 1000, 1000,
     ["x", "y", "z", "r", "g", "b", "normal_x", "normal_y", "normal_z", "curvature"],
     [(-0.89, 0.49), (-0.65, -0.38), (0.88, 1.53)]),
    ("pcl/cturtle.pcd", 167198, 167198, ["x", "y", "z", "intensity"],
     [(-1.42, 1.42), (-1.05, 1.06), (1.40, 2.00)]),
    ("pcl/lamppost.pcd", 1771, 1771, ["x", "y", "z"], [(-11.17, -9.77), (-0.38, 0.59), (-5.45, 0.47)]),
    ("pcl/milk.pcd", 13704, 13704, ["x", "y", "z"], [(-0.14, 0.01), (-0.26, -0.01), (0.71, 0.89)]),
    ("pcl/office1_keypoints.pcd", 1318, 1318, ["x", "y", "z", "intensity"],
     [(-10.99, 10.13), (-8.77, 5.91), (-1.36, 2.18)]),
    ("pcl/table_scene_mug_stereo_textured.pcd", 307200, 209280, ["x", "y", "z", "r", "g", "b", "a"],
     [(-0.46, 0.72), (-0.51, 0.18), (0.69, 2.59)]),
]  # fmt: skip


def make_pcd(cols: dict[str, np.ndarray], mode: str, *, width: int | None = None, height: int = 1) -> bytes:
    """A PCD file from ``{name: (N,) or (N, COUNT) array}``; dtype gives SIZE/TYPE."""
    arrs = {k: (v if v.ndim == 2 else v[:, None]) for k, v in cols.items()}
    n = len(next(iter(arrs.values())))
    size = " ".join(str(a.dtype.itemsize) for a in arrs.values())
    typ = " ".join(a.dtype.kind.upper() for a in arrs.values())
    head = (
        f"# .PCD v0.7 - Point Cloud Data file format\nVERSION 0.7\nFIELDS {' '.join(arrs)}\nSIZE {size}\n"
        f"TYPE {typ}\nCOUNT {' '.join(str(a.shape[1]) for a in arrs.values())}\n"
        f"WIDTH {width or n}\nHEIGHT {height}\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\nDATA {mode}\n"
    ).encode()
    if mode == "ascii":
        table = np.hstack([a.astype(np.float64) for a in arrs.values()])
        fmt = [("%d" if a.dtype.kind in "iu" else "%.9g") for a in arrs.values() for _ in range(a.shape[1])]
        buf = io.StringIO()
        np.savetxt(buf, table, fmt=fmt)  # integers as written by PCL: every digit
        return head + buf.getvalue().encode()
    if mode == "binary":
        struct = np.dtype(
            [(f"f{i}", a.dtype.newbyteorder("<"), (a.shape[1],)) for i, a in enumerate(arrs.values())]
        )
        rec = np.empty(n, dtype=struct)
        for i, a in enumerate(arrs.values()):
            rec[f"f{i}"] = a
        return head + rec.tobytes()
    soa = b"".join(
        np.ascontiguousarray(a.T).astype(a.dtype.newbyteorder("<")).tobytes() for a in arrs.values()
    )
    comp = lzf.compress(soa, 2 * len(soa) + 64) if soa else b""  # PCL allows expansion too
    return head + np.array([len(comp), len(soa)], "<u4").tobytes() + comp


def _cloud(n: int = 257, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "intensity": rng.integers(0, 256, n).astype(np.uint8),
        "x": rng.normal(0, 30, n).astype(np.float32),
        "normal": rng.normal(size=(n, 3)).astype(np.float32),
        "y": rng.normal(0, 30, n).astype(np.float32),
        "z": rng.normal(0, 2, n).astype(np.float64),
        "ring": rng.integers(0, 32, n).astype(np.uint16),
        "t": rng.integers(-(2**40), 2**40, n).astype(np.int64),
    }


def _reason(data: bytes, **kw) -> RejectError:
    with pytest.raises(RejectError) as e:
        read_pcd(data, **kw)
    return e.value


# ------------------------------------------------------------------------------------------ real files


@pytest.mark.parametrize("rel,n,finite,columns,extent", REAL_PCD, ids=[r[0] for r in REAL_PCD])
def test_real_pcd_counts_and_extents(realdata, rel, n, finite, columns, extent):
    data = (realdata / "pcd" / rel).read_bytes()
    pts = read_pcd(data)
    assert parse_header(data).columns == columns
    assert pts.shape == (n, len(columns)) and pts.dtype == np.float32 and pts.flags.c_contiguous
    ok = np.isfinite(pts[:, :3]).all(axis=1)
    assert ok.sum() == finite
    for axis, (lo, hi) in enumerate(extent):
        assert round(float(pts[ok, axis].min()), 2) == pytest.approx(lo, abs=1e-9)
        assert round(float(pts[ok, axis].max()), 2) == pytest.approx(hi, abs=1e-9)


def test_real_organized_cloud_keeps_nan_rows(realdata):
    data = (realdata / "pcd/pcl/table_scene_mug_stereo_textured.pcd").read_bytes()
    h = parse_header(data)
    assert (h.width, h.height, h.points, h.data) == (640, 480, 307200, "binary_compressed")
    assert np.isnan(read_pcd(data)[:, :3]).any(axis=1).sum() == 97920


def test_real_v05_header_without_viewpoint(realdata):
    h = parse_header((realdata / "pcd/pcl/bunny.pcd").read_bytes())
    assert (h.points, h.data, h.fields) == (397, "ascii", ("x", "y", "z"))


@pytest.mark.parametrize("rel", [r[0] for r in REAL_PCD if r[0] != "pcl/bunny.pcd"])  # pypcd4 reads v0.7 only
def test_real_pcd_matches_pypcd4(realdata, rel):
    """Every field of every real PCD pypcd4 reads, every point, exactly: scalar fields as its values (cast to
    float32, NaN where it has NaN), a packed rgb/rgba as its ``decode_rgb`` channels (alpha: bits 24-31)."""
    pypcd4 = pytest.importorskip("pypcd4")
    path = realdata / "pcd" / rel
    with open(path, "rb") as f:
        ref = pypcd4.PointCloud.from_fileobj(f)
    ours, columns = read_pcd(path.read_bytes()), parse_header(path.read_bytes()).columns
    expected = []
    for field in ref.fields:
        values = ref.pc_data[field]
        if field in ("rgb", "rgba"):
            expected.append(pypcd4.PointCloud.decode_rgb(values).astype(np.float32))
            if field == "rgba":
                expected.append(((values.view(np.uint32) >> 24) & 255).astype(np.float32)[:, None])
        else:
            expected.append(values.astype(np.float32)[:, None])
    assert ours.shape == (ref.points, len(columns))
    np.testing.assert_array_equal(ours, np.hstack(expected))


# ------------------------------------------------------------------------------------- generated files


@pytest.mark.parametrize("mode", ["ascii", "binary", "binary_compressed"])
def test_round_trip_every_mode(mode):
    cols = _cloud()
    data = make_pcd(cols, mode)
    assert parse_header(data).columns == ["x", "y", "z", "intensity", "ring", "t"]
    got = read_pcd(data)
    want = np.stack([cols[k].astype(np.float32) for k in ("x", "y", "z", "intensity", "ring", "t")], axis=1)
    if mode == "ascii":  # %.9g text is exact for float32 but not for the float64 z
        np.testing.assert_allclose(got, want, rtol=2.5e-7)
    else:
        np.testing.assert_array_equal(got, want)


_COLOUR_TYPES = [np.uint32, np.int32, np.float32]  # TYPE U, I, F of a SIZE 4 packed colour


@pytest.mark.parametrize("mode", ["ascii", "binary", "binary_compressed"])
@pytest.mark.parametrize("field", ["rgb", "rgba"])
@pytest.mark.parametrize("kind", _COLOUR_TYPES, ids=["U", "I", "F"])
def test_packed_colour_unpacked_by_its_bits(mode, field, kind):
    """Every 0xAARRGGBB pattern that a float32 can carry bit for bit (no NaN payloads): the channels are
    the packed value's bytes, whatever TYPE the file gives the field, in every DATA mode."""
    rng = np.random.default_rng(7)
    channels = rng.integers(0, 256, (300, 4), dtype=np.uint32)
    channels[:4] = [[255, 255, 255, 0], [0, 0, 0, 255], [1, 2, 3, 4], [255, 0, 128, 127]]  # edges
    packed = (channels[:, 3] << 24) | (channels[:, 0] << 16) | (channels[:, 1] << 8) | channels[:, 2]
    if kind is np.float32:  # PCL's float rgb: finite floats only (%.9g text round-trips them exactly)
        packed &= 0x7F7FFFFF
        channels = np.stack([(packed >> s) & 0xFF for s in (16, 8, 0, 24)], axis=1)
    xyz = rng.normal(size=(300, 3)).astype(np.float32)
    cols = {"x": xyz[:, 0], "y": xyz[:, 1], "z": xyz[:, 2], field: packed.view(kind)}
    got = read_pcd(make_pcd(cols, mode))
    n = 3 if field == "rgb" else 4
    assert parse_header(make_pcd(cols, mode)).columns == ["x", "y", "z", *"rgba"[:n]]
    np.testing.assert_array_equal(got[:, 3:], channels[:, :n].astype(np.float32))


def test_ascii_colour_that_is_not_an_integer_is_refused():
    one = np.zeros(1, np.float32)
    good = make_pcd({"x": one, "y": one, "z": one, "rgb": np.array([7], np.uint32)}, "ascii")
    assert read_pcd(good)[0, 3:].tolist() == [0, 0, 7]
    for bad in (b"1.5", b"-1", b"4294967296", b"nan"):
        with pytest.raises(RejectError, match="colour value") as e:
            read_pcd(good[: good.rindex(b" ") + 1] + bad + b"\n")
        assert e.value.reason == "bad_header"


@pytest.mark.parametrize("mode", ["ascii", "binary", "binary_compressed"])
def test_organized_all_nan_cloud_reads(mode):
    nan = np.full(12, np.nan, np.float32)
    got = read_pcd(make_pcd({"x": nan, "y": nan, "z": nan}, mode, width=4, height=3))
    assert got.shape == (12, 3) and np.isnan(got).all()


def test_minimal_old_header_defaults():
    data = b"FIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nWIDTH 2\nDATA ascii\n1 2 3\n4 5 nan\n"
    h = parse_header(data)
    assert (h.counts, h.height, h.points) == ((1, 1, 1), 1, 2)
    np.testing.assert_array_equal(read_pcd(data), [[1, 2, 3], [4, 5, np.nan]])


def test_crlf_comments_lowercase_and_padding_fields():
    body = np.array([(1.0, 2.0, 3.0, 7.0)], dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("_", "<f4")])
    head = (
        "# comment\r\n\r\nversion 0.7\r\nFIELDS x y z _\r\nSIZE 4 4 4 4\r\nTYPE f f f F\r\n"
        "COUNT 1 1 1 1\r\nWIDTH 1\r\nHEIGHT 1\r\nPOINTS 1\r\nDATA BINARY\r\n"
    )
    got = read_pcd(head.encode() + body.tobytes())
    np.testing.assert_array_equal(got, [[1, 2, 3]])


def test_binary_ignores_trailing_bytes():
    data = make_pcd(
        {"x": np.ones(3, np.float32), "y": np.ones(3, np.float32), "z": np.ones(3, np.float32)}, "binary"
    )
    assert read_pcd(data + b"\x00" * 5).shape == (3, 3)


# ----------------------------------------------------------------------------------- hostile headers

_XYZ = {"x": np.arange(4, dtype=np.float32), "y": np.ones(4, np.float32), "z": np.zeros(4, np.float32)}
_GOOD = make_pcd(_XYZ, "binary")


def _edit(line: str, new: str | None, data: bytes = _GOOD) -> bytes:
    """Replace the header line starting with ``line`` by ``new`` (None deletes it)."""
    end = data.index(b"\n", data.index(b"\nDATA ") + 1) + 1
    lines = [new if ln.startswith(line) else ln for ln in data[:end].decode().splitlines()]
    return "".join(ln + "\n" for ln in lines if ln is not None).encode() + data[end:]


@pytest.mark.parametrize(
    "line,new,reason,detail",
    [
        ("POINTS", "POINTS -4", "bad_header", "not an integer"),
        ("POINTS", "POINTS 4.0", "bad_header", "not an integer"),
        ("POINTS", "POINTS 1e3", "bad_header", "not an integer"),
        ("POINTS", "POINTS 99999999999999999999999", "bad_header", "not an integer"),
        ("POINTS", "POINTS 5", "bad_header", "WIDTH 4 x HEIGHT 1 != POINTS 5"),
        ("POINTS", "POINTS", "bad_header", "POINTS must hold one integer"),
        ("WIDTH", "WIDTH -1", "bad_header", "WIDTH value"),
        ("HEIGHT", "HEIGHT x", "bad_header", "HEIGHT value"),
        ("SIZE", "SIZE 4 4", "bad_header", "lengths differ"),
        ("SIZE", "SIZE 4 4 -4", "bad_header", "SIZE value"),
        ("SIZE", "SIZE 4 4 3", "bad_header", "unsupported TYPE 'F' with SIZE 3"),
        ("TYPE", "TYPE F F Q", "bad_header", "unsupported TYPE 'Q'"),
        ("TYPE", "TYPE F F", "bad_header", "lengths differ"),
        ("COUNT", "COUNT 1 1 1 1", "bad_header", "lengths differ"),
        ("COUNT", "COUNT 1 1 0", "bad_header", "COUNT 0"),
        ("COUNT", "COUNT 1 1 3", "bad_header", "exactly one field 'z' with COUNT 1"),
        ("FIELDS", "FIELDS x y w", "bad_header", "exactly one field 'z'"),
        ("FIELDS", "FIELDS", "bad_header", "missing or empty FIELDS"),
        ("FIELDS", None, "bad_header", "missing or empty FIELDS"),
        ("VIEWPOINT", "VIEWPOINT 0 0", "bad_header", "VIEWPOINT"),
        ("VERSION", "COLOR 0.7", "bad_header", "unknown header line"),
        ("VERSION", "FIELDS x y z", "bad_header", "duplicate FIELDS"),
        ("DATA", "DATA", "bad_header", "DATA must be one of"),
        ("DATA", "DATA binary_lz4", "bad_header", "DATA must be one of"),
    ],
)
def test_bad_header_lines(line, new, reason, detail):
    err = _reason(_edit(line, new))
    assert err.reason == reason and detail in err.detail, err


@pytest.mark.timeout(5)
def test_trillion_points_rejected_at_once():
    data = _edit("POINTS", "POINTS 1000000000000", _edit("WIDTH", "WIDTH 1000000000000"))
    assert _reason(data).reason == "too_large"  # no allocation: the timeout(5) above guards it
    assert _reason(data, max_points=10**13).reason == "truncated"
    comp = make_pcd(_XYZ, "binary_compressed")
    big = _edit("POINTS", "POINTS 1000000000000", _edit("WIDTH", "WIDTH 1000000000000", comp))
    assert _reason(big, max_points=10**13).reason == "bad_header"  # uncompressed size != claim


def test_empty_text_and_non_ascii_inputs():
    assert _reason(b"").reason == "empty"
    assert _reason(b"hello world\nthis is text\n").reason == "bad_header"
    assert "non-ASCII" in _reason("FIELDS x y zé\n".encode()).detail
    assert _reason(_edit("POINTS", "POINTS 0", _edit("WIDTH", "WIDTH 0"))).reason == "empty"
    assert "has no DATA line" in _reason(b"FIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nWIDTH 1\n").detail
    assert "no DATA line within" in _reason(b"# " + b"a" * MAX_HEADER_BYTES + b"\nDATA ascii\n").detail


@pytest.mark.parametrize("cut", [1, 4, 47])
def test_truncated_binary(cut):
    err = _reason(_GOOD[:-cut])
    assert err.reason == "truncated" and "body bytes" in err.detail


_COMP = make_pcd(_XYZ, "binary_compressed")
_COMP_HEAD = _COMP[: _COMP.index(b"DATA binary_compressed\n") + 23]


def _compressed(comp_size: int, raw_size: int, block: bytes) -> bytes:
    return _COMP_HEAD + np.array([comp_size, raw_size], "<u4").tobytes() + block


@pytest.mark.parametrize(
    "comp_size,raw_size,block,reason,detail",
    [
        (None, 47, None, "bad_header", "uncompressed size 47 != POINTS 4"),
        (None, 2**32 - 1, None, "bad_header", "uncompressed size"),
        (2**32 - 1, None, None, "truncated", "compressed size"),
        (0, None, None, "bad_header", "impossible for a 0-byte LZF block"),
        (9, None, b"garbage!!", "bad_header", "corrupt LZF"),
        (40, None, b"\xff" * 40, "bad_header", "decompresses to more than the claimed 48"),
        (None, None, lzf.compress(b"\0" * 40), "truncated", "LZF block holds 40 bytes"),
    ],
)
def test_bad_compressed_sizes(comp_size, raw_size, block, reason, detail):
    block = _COMP[len(_COMP_HEAD) + 8 :] if block is None else block
    comp_size = len(block) if comp_size is None else comp_size
    err = _reason(_compressed(comp_size, 48 if raw_size is None else raw_size, block))
    assert err.reason == reason and detail in err.detail, err


def test_compressed_prefix_missing():
    assert "size prefix" in _reason(_COMP_HEAD + b"\x01\x02").detail


def test_lzf_ratio_bound_is_safe():
    """The best LZF can do (a long zero run) stays inside the bound the reader enforces."""
    raw = b"\0" * 1_000_000
    assert len(raw) <= 89 * len(lzf.compress(raw))


def test_huge_record_rejected():
    data = _edit("FIELDS", "FIELDS x y z d", _edit("SIZE", "SIZE 4 4 4 4", _edit("TYPE", "TYPE F F F F")))
    err = _reason(_edit("COUNT", "COUNT 1 1 1 100000", data))
    assert err.reason == "bad_header" and "point record of 400012 bytes exceeds" in err.detail


@pytest.mark.parametrize(
    "body,reason,detail",
    [
        (b"0 1 2\n3 4 5\n6 7 8\n9 10", "truncated", "cannot hold"),
        (b"0 1 2\n3 4 5\n6 7 8\n9 10              \n", "truncated", "values <"),
        (b"0 1 2\n3 4 5\n6 7 8\n9 10 11\n12\n", "bad_header", "more than POINTS"),
        (b"0 1 2\n3 4 5\n6 7 8\n9 10 abc\n", "bad_header", "not a number"),
        (b"0 1 2\n3 4 5\n6 7 8\n9 10 " + b"1" * 100 + b"\n", "bad_header", "longer than"),
    ],
)
def test_bad_ascii_bodies(body, reason, detail):
    head = make_pcd(_XYZ, "ascii").partition(b"DATA ascii\n")[0] + b"DATA ascii\n"
    err = _reason(head + body)
    assert err.reason == reason and detail in err.detail, err


def test_ascii_tolerates_trailing_whitespace_and_nan_tokens():
    head = make_pcd(_XYZ, "ascii").partition(b"DATA ascii\n")[0] + b"DATA ascii\n"
    got = read_pcd(head + b"0 1 2\n3 4 5\n6 7 NaN\n9 10 nan\n\n  \n")
    assert got.shape == (4, 3) and np.isnan(got[2:, 2]).all()

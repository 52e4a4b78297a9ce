"""Property tests: whatever bytes come in, ``read_points`` returns a sane array or raises RejectError.

Inputs are generated here (random bytes, mutated PCD/NPY/PLY headers, hostile size claims); nothing
binary is committed. Bounded: 200 examples per target, derandomized so runs are reproducible.
"""

from __future__ import annotations

import io

import lzf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lidarshard.schemas import REJECT_REASONS
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.formats.readers import FORMATS, read_points
from tests.test_pcd import make_pcd

FUZZ = settings(
    max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
MAX_POINTS = 100_000
#: Tokens that stress the header parsers' number handling.
NASTY = ["-1", "0", "1", "3", "4.5", "1e3", "nan", "x", "", "4294967296", "1000000000000", "9" * 25,
         "F", "U", "I", "8", "binary", "ascii", "binary_compressed", "\xff", "_"]  # fmt: skip


def check(data: bytes, fmt: str, **kw) -> np.ndarray | None:
    """Assert the reader's contract; returns the points or None when rejected."""
    try:
        pts = read_points(data, fmt, max_points=MAX_POINTS, **kw)
    except RejectError as e:
        assert e.reason in REJECT_REASONS and e.reason != "reader_error", e
        return None
    assert isinstance(pts, np.ndarray) and pts.ndim == 2 and pts.dtype == np.float32
    assert pts.shape[0] >= 1 and pts.shape[1] >= 3 and pts.flags.c_contiguous
    return pts


def _small_pcd(mode: str, n: int = 6) -> bytes:
    rng = np.random.default_rng(n)
    cols = {
        "x": rng.normal(size=n).astype(np.float32),
        "y": rng.normal(size=n).astype(np.float32),
        "z": rng.normal(size=n).astype(np.float32),
        "intensity": rng.integers(0, 255, n).astype(np.uint8),
        "normal": rng.normal(size=(n, 2)).astype(np.float64),
    }
    return make_pcd(cols, mode)


BASES = {mode: _small_pcd(mode) for mode in ("ascii", "binary", "binary_compressed")}


def _mutate_header(data: bytes, draw) -> bytes:
    """One random edit of a PCD/PLY header line, token, length or bit."""
    end = data.find(b"\nDATA ")
    end = data.find(b"\n", end + 1) + 1 if end >= 0 else data.find(b"end_header\n") + 11
    head, body = data[:end].decode("latin1").splitlines(), data[end:]
    if not head:
        return data + draw(st.binary(min_size=1, max_size=64))
    op = draw(st.sampled_from(["token", "drop", "dup", "swap", "cut", "flip", "append"]))
    i = draw(st.integers(0, len(head) - 1))
    if op == "token":
        toks = head[i].split() or [""]
        j = draw(st.integers(0, len(toks) - 1))
        toks[j] = draw(st.sampled_from(NASTY) | st.text(max_size=6))
        head[i] = " ".join(toks)
    elif op == "drop":
        del head[i]
    elif op == "dup":
        head.insert(i, head[i])
    elif op == "swap":
        k = draw(st.integers(0, len(head) - 1))
        head[i], head[k] = head[k], head[i]
    out = "".join(ln + "\n" for ln in head).encode("utf8", "surrogatepass") + body
    if op == "cut":
        out = out[: draw(st.integers(0, len(out)))]
    elif op == "flip":
        pos = draw(st.integers(0, len(out) - 1))
        out = out[:pos] + bytes([out[pos] ^ (1 << draw(st.integers(0, 7)))]) + out[pos + 1 :]
    elif op == "append":
        out += draw(st.binary(max_size=64))
    return out


# ------------------------------------------------------------------------------------------ targets


@FUZZ
@given(data=st.binary(max_size=2048), fmt=st.sampled_from(FORMATS), dims=st.none() | st.integers(-2, 9))
def test_random_bytes(data, fmt, dims):
    check(data, fmt, point_dims=dims)


@FUZZ
@given(mode=st.sampled_from(sorted(BASES)), data=st.data())
def test_mutated_generated_pcd(mode, data):
    mutated = BASES[mode]
    for _ in range(data.draw(st.integers(1, 3))):
        mutated = _mutate_header(mutated, data.draw)
    check(mutated, "pcd")


@FUZZ
@given(comp=st.integers(0, 2**32 - 1), raw=st.integers(0, 2**32 - 1), cut=st.integers(0, 200))
def test_forged_compressed_sizes(comp, raw, cut):
    good = BASES["binary_compressed"]
    at = good.index(b"binary_compressed\n") + 18
    forged = good[:at] + np.array([comp, raw], "<u4").tobytes() + good[at + 8 :]
    check(forged[: len(forged) - cut], "pcd")


@FUZZ
@given(data=st.data())
def test_mutated_real_pcd(realdata, data):
    files = ["pcl/bunny.pcd", "pcl/office1_keypoints.pcd", "pcl/milk.pcd", "pcl/colored_cloud.pcd"]
    raw = (realdata / "pcd" / data.draw(st.sampled_from(files))).read_bytes()
    check(_mutate_header(raw, data.draw), "pcd")


_DESCR = ["'<f4'", "'>f8'", "'<i2'", "'|u1'", "'|O'", "'<c8'", "'<U3'", "'|V12'", "'f4,f4'", "[('x', '<f4')]",
          "'(3,)f4'", "'(100000000000,)f4'", "'<M8[s]'", "'|b1'", "'<f2'", "3", "None"]  # fmt: skip


@FUZZ
@given(
    descr=st.sampled_from(_DESCR),
    shape=st.lists(st.integers(-3, 10**13) | st.sampled_from([0, 1, 3, 4]), max_size=3),
    fortran=st.sampled_from(["True", "False", "0", "'yes'"]),
    body=st.binary(max_size=512),
    version=st.sampled_from([1, 2, 3]),
)
def test_random_npy_headers(descr, shape, fortran, body, version):
    h = f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {tuple(shape)!r}, }}"
    size = len(h).to_bytes(2 if version == 1 else 4, "little")
    check(b"\x93NUMPY" + bytes([version, 0]) + size + h.encode() + body, "npy")


@FUZZ
@given(arr=st.integers(1, 8).flatmap(lambda n: st.lists(st.floats(width=32), min_size=3 * n, max_size=3 * n)))
def test_valid_npy_round_trips(arr):
    a = np.array(arr, np.float32).reshape(-1, 3)
    buf = io.BytesIO()
    np.save(buf, a)
    np.testing.assert_array_equal(check(buf.getvalue(), "npy"), a)


_PLY_TYPES = ["float", "double", "uchar", "int", "short", "float128", "list uchar int", "list int float"]


@FUZZ
@given(
    fmt=st.sampled_from(["ascii", "binary_little_endian", "binary_big_endian", "binary_middle_endian"]),
    elements=st.lists(
        st.tuples(
            st.sampled_from(["vertex", "face", "camera"]),
            st.integers(-1, 10**13) | st.integers(0, 8),
            st.lists(st.tuples(st.sampled_from(_PLY_TYPES), st.sampled_from(["x", "y", "z", "i", "x"])),
                     max_size=5),
        ),
        max_size=3,
    ),
    body=st.binary(max_size=512) | st.text("0123456789.- \nnan", max_size=200).map(str.encode),
)  # fmt: skip
def test_random_ply_headers(fmt, elements, body):
    head = f"ply\nformat {fmt} 1.0\n"
    for name, count, props in elements:
        head += f"element {name} {count}\n" + "".join(f"property {t} {p}\n" for t, p in props)
    check(head.encode() + b"end_header\n" + body, "ply")


@FUZZ
@given(data=st.data())
def test_mutated_ply(data):
    n = data.draw(st.integers(1, 5))
    fmt = data.draw(st.sampled_from(["ascii", "binary_little_endian"]))
    head = (
        f"ply\nformat {fmt} 1.0\nelement vertex {n}\nproperty float x\nproperty float y\nproperty float z\n"
    )
    head += "element face 1\nproperty list uchar int vertex_indices\nend_header\n"
    pts = np.arange(3 * n, dtype=np.float32).reshape(n, 3)
    body = (
        ("".join(f"{a} {b} {c}\n" for a, b, c in pts) + "3 0 0 0\n").encode()
        if fmt == "ascii"
        else (pts.tobytes() + b"\x03" + np.zeros(3, "<i4").tobytes())
    )
    check(_mutate_header(head.encode() + body, data.draw), "ply")


# ------------------------------------------------------------------------------ adversarial corpus

_XYZ = {k: np.zeros(4, np.float32) for k in "xyz"}


def _sub(data: bytes, old: bytes, new: bytes) -> bytes:
    assert old in data
    return data.replace(old, new, 1)


def _pickled_npy() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.array([[1, 2, 3]], dtype=object), allow_pickle=True)
    return buf.getvalue()


_BIN = make_pcd(_XYZ, "binary")
_ZLIB = make_pcd(_XYZ, "binary_compressed")
_AT = _ZLIB.index(b"binary_compressed\n") + 18
CORPUS = {
    "empty file": (b"", "pcd", "empty"),
    "text file": (b"Lorem ipsum dolor sit amet\n" * 20, "pcd", "bad_header"),
    "negative POINTS": (_sub(_BIN, b"POINTS 4", b"POINTS -4"), "pcd", "bad_header"),
    "huge SIZE": (_sub(_BIN, b"SIZE 4 4 4", b"SIZE 4 4 99999999999"), "pcd", "bad_header"),
    "FIELDS/SIZE mismatch": (_sub(_BIN, b"SIZE 4 4 4", b"SIZE 4 4"), "pcd", "bad_header"),
    "COUNT mismatch": (_sub(_BIN, b"COUNT 1 1 1", b"COUNT 1 1 1 1"), "pcd", "bad_header"),
    "10**12 POINTS": (
        _sub(_sub(_BIN, b"POINTS 4", b"POINTS 1000000000000"), b"WIDTH 4", b"WIDTH 1000000000000"),
        "pcd", "too_large",
    ),
    "compressed size past EOF": (
        _ZLIB[:_AT] + np.array([10**9, 48], "<u4").tobytes() + _ZLIB[_AT + 8 :], "pcd", "truncated"
    ),
    "uncompressed size lies": (
        _ZLIB[:_AT] + np.array([10, 2**32 - 1], "<u4").tobytes() + _ZLIB[_AT + 8 :], "pcd", "bad_header"
    ),
    "LZF bomb ratio": (
        _sub(_sub(_ZLIB[:_AT], b"POINTS 4", b"POINTS 1000000"), b"WIDTH 4", b"WIDTH 1000000")
        + np.array([8, 12_000_000], "<u4").tobytes() + (lzf.compress(b"\0" * 100) or b"")[:8],
        "pcd", "bad_header",
    ),
    "truncated records": (_BIN[:-5], "pcd", "truncated"),
    "truncated bin": (b"\0" * 33, "kitti_bin", "truncated"),
    "npy pickle": (_pickled_npy(), "npy", "bad_header"),
    "ply 10**12 vertices": (b"ply\nformat ascii 1.0\nelement vertex 1000000000000\nproperty float x\n"
                            b"property float y\nproperty float z\nend_header\n1 2 3\n", "ply", "too_large"),
}  # fmt: skip


@pytest.mark.timeout(10)
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_adversarial_corpus(name):
    data, fmt, reason = CORPUS[name]
    with pytest.raises(RejectError) as e:
        read_points(data, fmt, max_points=10**13 if name == "LZF bomb ratio" else 50_000_000)
    assert e.value.reason == reason, e.value


@pytest.mark.parametrize("mode", sorted(BASES))
def test_all_nan_cloud_reads(mode):
    nan = {k: np.full(5, np.nan, np.float32) for k in "xyz"}
    pts = check(make_pcd(nan, mode), "pcd")
    assert pts is not None and pts.shape == (5, 3) and np.isnan(pts).all()

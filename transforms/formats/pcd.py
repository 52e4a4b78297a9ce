"""A safe numpy parser for PCL's PCD format (ascii, binary, binary_compressed).

Every size claimed by the header is checked against the bytes actually present *before* anything is
allocated, so a hostile header (``POINTS 1000000000000``, a forged LZF size) is rejected at once with a
``RejectError`` instead of exhausting memory. pypcd4 is not used as the reader because it refuses
PCL's own ``VERSION .5`` files (e.g. PCL's ``bunny.pcd``).

Packed colour: PCL stores a point's colour as one 4-byte field ``rgb`` or ``rgba`` holding 0xAARRGGBB, typed
``U`` (``pcl::PointXYZRGBA``), ``I`` or ``F`` (the same four bytes read as a float: ``pcl::PointXYZRGB``'s
classic layout). ``read_pcd`` unpacks it by its bits, as PCL and open3d do, into channel columns ``r``, ``g``,
``b`` (and ``a`` for ``rgba``), each 0..255; casting the packed value to float32 would keep 24 of its 32 bits.

Format (PCL ``io/src/pcd_io.cpp``): an ASCII header of ``KEY value...`` lines, ``#`` comments, ending
with ``DATA ascii|binary|binary_compressed``; then one point per line (ascii), packed little-endian
records (binary, array of structs), or ``uint32 compressed_size, uint32 uncompressed_size`` and an LZF
block that decompresses to a structure of arrays (binary_compressed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.formats.ascii_values import read_columns

__all__ = ["COLOUR_FIELDS", "MAX_HEADER_BYTES", "VALUES_PER_POINT", "PcdHeader", "parse_header", "read_pcd"]

#: The header (everything up to and including the DATA line) must fit in this many bytes.
MAX_HEADER_BYTES = 64 * 1024
#: Values (points x fields x COUNT) a file may hold per point of ``max_points``: a wide record (COUNT 97)
#: counts against the limit too.
VALUES_PER_POINT = 16
#: Upper bound on one point record; real PCL records (even 352-float SHOT descriptors) are far smaller.
_MAX_RECORD_BYTES = 64 * 1024
#: LZF emits at most 264 output bytes per 3 input bytes (a long back-reference) and starts with a
#: literal, so a block never decompresses to more than 88x its size; 89x is a safe upper bound.
_LZF_MAX_RATIO = 89
_INT_RE = re.compile(r"\+?[0-9]{1,18}")
_DTYPES = {
    ("F", 4): "<f4", ("F", 8): "<f8",
    ("I", 1): "<i1", ("I", 2): "<i2", ("I", 4): "<i4", ("I", 8): "<i8",
    ("U", 1): "<u1", ("U", 2): "<u2", ("U", 4): "<u4", ("U", 8): "<u8",
}  # fmt: skip
#: Packed colour fields (one 4-byte 0xAARRGGBB value, COUNT 1) and the channel columns each becomes.
COLOUR_FIELDS: dict[str, tuple[str, ...]] = {"rgb": ("r", "g", "b"), "rgba": ("r", "g", "b", "a")}
_SHIFTS = {"r": 16, "g": 8, "b": 0, "a": 24}  # bit offset of each channel in the packed value
_KEYS = ("VERSION", "FIELDS", "SIZE", "TYPE", "COUNT", "WIDTH", "HEIGHT", "VIEWPOINT", "POINTS", "DATA")
_DATA_MODES = ("ascii", "binary", "binary_compressed")


@dataclass(frozen=True)
class PcdHeader:
    """A validated PCD header.

    Attributes:
        fields: field names in file order (``_`` marks padding).
        dtypes: little-endian numpy dtype string of each field's scalar.
        counts: scalars per field (``COUNT``).
        width, height: cloud organization; ``height > 1`` means organized (may hold NaN points).
        points: number of points N (``width * height``).
        data: ``"ascii"``, ``"binary"`` or ``"binary_compressed"``.
        data_offset: byte offset of the body (just after the DATA line).
    """

    fields: tuple[str, ...]
    dtypes: tuple[str, ...]
    counts: tuple[int, ...]
    width: int
    height: int
    points: int
    data: str
    data_offset: int

    @property
    def record_bytes(self) -> int:
        """Bytes of one point: sum of SIZE * COUNT."""
        return sum(np.dtype(d).itemsize * c for d, c in zip(self.dtypes, self.counts, strict=True))

    @property
    def sources(self) -> list[str]:
        """The fields ``read_pcd`` reads: x, y, z, then the other COUNT-1 fields in file order."""
        extra = [
            f
            for f, c in zip(self.fields, self.counts, strict=True)
            if c == 1 and f not in ("x", "y", "z", "_")
        ]
        return ["x", "y", "z", *extra]

    def dtype_of(self, field: str) -> str:
        """The numpy dtype string of ``field``'s scalar."""
        return self.dtypes[self.fields.index(field)]

    def is_colour(self, field: str) -> bool:
        """Whether ``field`` is a packed colour (``COLOUR_FIELDS``, COUNT 1, SIZE 4)."""
        return field in COLOUR_FIELDS and np.dtype(self.dtype_of(field)).itemsize == 4

    @property
    def columns(self) -> list[str]:
        """Names of ``read_pcd``'s output columns: ``sources``, each packed colour field replaced by its
        channels (``rgb`` -> r, g, b; ``rgba`` -> r, g, b, a)."""
        return [c for f in self.sources for c in (COLOUR_FIELDS[f] if self.is_colour(f) else (f,))]


def _bad(detail: str) -> RejectError:
    return RejectError("bad_header", f"PCD: {detail}")


def _int(key: str, token: str) -> int:
    if not _INT_RE.fullmatch(token):
        raise _bad(f"{key} value {token[:40]!r} is not an integer in 0..10**18")
    return int(token)


def _header_lines(data: bytes) -> tuple[list[tuple[str, list[str]]], int]:
    """Split the header into (KEY, values) up to and including DATA; returns them and the body offset."""
    lines: list[tuple[str, list[str]]] = []
    pos = 0
    while True:
        end = data.find(b"\n", pos, MAX_HEADER_BYTES + 1)
        if end < 0:
            if len(data) > MAX_HEADER_BYTES:
                raise _bad(f"no DATA line within the first {MAX_HEADER_BYTES} bytes")
            end = len(data)  # the DATA line may be the last line, without a newline
        raw = data[pos:end]
        pos = end + 1
        try:
            text = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            raise _bad(f"non-ASCII byte in header line {len(lines) + 1}") from None
        if text and not text.startswith("#"):
            key, *values = text.split()
            key = key.upper()
            if key not in _KEYS:
                raise _bad(f"unknown header line {text[:60]!r}")
            if any(k == key for k, _ in lines):
                raise _bad(f"duplicate {key} line")
            lines.append((key, values))
            if key == "DATA":
                return lines, min(pos, len(data))
        if pos >= len(data):
            raise _bad("header has no DATA line")


def parse_header(data: bytes) -> PcdHeader:
    """Parse and validate a PCD header without touching the body.

    Raises:
        RejectError: ``bad_header`` with a precise detail for any malformed or inconsistent header.
    """
    lines, offset = _header_lines(data)
    h = dict(lines)
    for key in ("FIELDS", "SIZE", "TYPE"):
        if not h.get(key):
            raise _bad(f"missing or empty {key} line")
    fields = h["FIELDS"]
    n_f = len(fields)
    counts = [_int("COUNT", t) for t in h["COUNT"]] if "COUNT" in h else [1] * n_f
    sizes = [_int("SIZE", t) for t in h["SIZE"]]
    types = [t.upper() for t in h["TYPE"]]
    if not len(sizes) == len(types) == len(counts) == n_f:
        raise _bad(f"FIELDS/SIZE/TYPE/COUNT lengths differ: {n_f}/{len(sizes)}/{len(types)}/{len(counts)}")
    dtypes = []
    for name, t, s, c in zip(fields, types, sizes, counts, strict=True):
        if (t, s) not in _DTYPES:
            raise _bad(f"field {name!r} has unsupported TYPE {t[:8]!r} with SIZE {s}")
        if c < 1:
            raise _bad(f"field {name!r} has COUNT {c} (must be >= 1)")
        dtypes.append(_DTYPES[(t, s)])
    for axis in ("x", "y", "z"):
        found = [c for f, c in zip(fields, counts, strict=True) if f == axis]
        if len(found) != 1 or found[0] != 1:
            raise _bad(f"need exactly one field {axis!r} with COUNT 1, FIELDS is {' '.join(fields)[:80]!r}")
    named = [f for f in fields if f != "_"]
    if len(set(named)) != len(named):
        raise _bad("duplicate field names")
    record = sum(s * c for s, c in zip(sizes, counts, strict=True))
    if record > _MAX_RECORD_BYTES:
        raise _bad(f"point record of {record} bytes exceeds {_MAX_RECORD_BYTES}")
    width, height, points = _shape(h)
    mode = h["DATA"][0].lower() if len(h["DATA"]) == 1 else ""
    if mode not in _DATA_MODES:
        raise _bad(f"DATA must be one of {', '.join(_DATA_MODES)}, got {' '.join(h['DATA'])[:40]!r}")
    if "VIEWPOINT" in h:
        vp = h["VIEWPOINT"]
        if len(vp) != 7 or not all(re.fullmatch(r"[-+0-9.eE]{1,40}", v) for v in vp):
            raise _bad("VIEWPOINT must hold 7 numbers")
    return PcdHeader(tuple(fields), tuple(dtypes), tuple(counts), width, height, points, mode, offset)


def _shape(h: dict[str, list[str]]) -> tuple[int, int, int]:
    """WIDTH, HEIGHT, POINTS; POINTS defaults to WIDTH * HEIGHT (old files), HEIGHT to 1."""
    for key in ("WIDTH", "HEIGHT", "POINTS"):
        if key in h and len(h[key]) != 1:
            raise _bad(f"{key} must hold one integer")
    if "WIDTH" not in h and "POINTS" not in h:
        raise _bad("neither WIDTH nor POINTS given")
    points = _int("POINTS", h["POINTS"][0]) if "POINTS" in h else None
    height = _int("HEIGHT", h["HEIGHT"][0]) if "HEIGHT" in h else 1
    width = _int("WIDTH", h["WIDTH"][0]) if "WIDTH" in h else points
    assert width is not None
    if points is None:
        points = width * height
    elif width * height != points:
        raise _bad(f"WIDTH {width} x HEIGHT {height} != POINTS {points}")
    return width, height, points


def read_pcd(data: bytes, *, max_points: int = 50_000_000) -> NDArray[np.float32]:
    """Read a PCD file's points.

    Args:
        data: the whole file.
        max_points: reject files claiming more points than this.

    Returns:
        ``(N, C)`` float32, C-contiguous; columns are ``PcdHeader.columns`` (x, y, z, then the other
        COUNT-1 fields cast to float32, e.g. intensity; a packed ``rgb``/``rgba`` field as its channels
        r, g, b (, a), 0..255). Organized clouds keep their NaN points, so N is always WIDTH * HEIGHT.

    Raises:
        RejectError: ``empty``, ``truncated``, ``bad_header`` or ``too_large``.
    """
    if not data:
        raise RejectError("empty", "PCD: file holds no bytes")
    h = parse_header(data)
    if h.points == 0:
        raise RejectError("empty", "PCD: header claims 0 points")
    if h.points > max_points:
        raise RejectError("too_large", f"PCD: header claims {h.points} points > max_points {max_points}")
    values = h.points * sum(h.counts)
    if values > VALUES_PER_POINT * max_points:
        raise RejectError(
            "too_large",
            f"PCD: POINTS {h.points} x {sum(h.counts)} values (COUNT) > {VALUES_PER_POINT} x max_points {max_points}",
        )
    body = memoryview(data)[h.data_offset :]
    if h.data == "ascii":
        cols = _ascii(h, body)
    elif h.data == "binary":
        cols = _binary(h, body)
    else:
        cols = _compressed(h, body)
    out = np.empty((h.points, len(cols)), dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # beyond float32 range -> +-inf, by design
        for i, col in enumerate(cols):
            out[:, i] = col
    return out


def _pick(h: PcdHeader, get: dict[str, NDArray]) -> list[NDArray]:
    """The output columns from each source field's values (``get``: field -> (N,) values)."""
    out: list[NDArray] = []
    for name in h.sources:
        if not h.is_colour(name):
            out.append(get[name])
            continue
        bits = _colour_bits(get[name], h.dtype_of(name))
        out += [(bits >> np.uint32(_SHIFTS[c])) & np.uint32(0xFF) for c in COLOUR_FIELDS[name]]
    return out


def _colour_bits(values: NDArray, dtype: str) -> NDArray[np.uint32]:
    """(N,) packed 0xAARRGGBB values of a colour field: its 4 bytes as read (binary), or its ASCII
    numbers (float64) converted as PCL's writer printed them (``F``: a float32's bits; ``U``/``I``: an
    integer, two's complement for ``I``).

    Raises:
        RejectError: ``bad_header`` for an ASCII ``U``/``I`` colour that is not an integer of 32 bits.
    """
    if values.dtype != np.float64:  # binary: reinterpret the 4 bytes
        return np.ascontiguousarray(values).view(np.uint32)
    if dtype == "<f4":
        with np.errstate(over="ignore", invalid="ignore"):
            return values.astype(np.float32).view(np.uint32)
    lo = -(1 << 31) if dtype == "<i4" else 0
    ok = np.isfinite(values) & (values == np.floor(values)) & (values >= lo) & (values < lo + (1 << 32))
    if not ok.all():
        bad = values[~ok][0]
        raise _bad(f"colour value {bad!r} is not a {dtype[1:]} integer")
    return (values.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32)


def _binary(h: PcdHeader, body: memoryview) -> list[NDArray]:
    need = h.points * h.record_bytes
    if len(body) < need:
        raise RejectError(
            "truncated", f"PCD binary: {len(body)} body bytes < POINTS {h.points} x {h.record_bytes} B"
        )
    offsets = np.cumsum([0] + [np.dtype(d).itemsize * c for d, c in zip(h.dtypes, h.counts, strict=True)])
    struct = np.dtype(
        {
            "names": [f"f{i}" for i in range(len(h.fields))],
            "formats": [d if c == 1 else (d, (c,)) for d, c in zip(h.dtypes, h.counts, strict=True)],
            "offsets": [int(o) for o in offsets[:-1]],
            "itemsize": h.record_bytes,
        }
    )
    arr = np.frombuffer(body, dtype=struct, count=h.points)
    return _pick(h, {name: arr[f"f{i}"] for i, name in enumerate(h.fields)})


def _compressed(h: PcdHeader, body: memoryview) -> list[NDArray]:
    import lzf  # python-neo-lzf, installed with pypcd4

    if len(body) < 8:
        raise RejectError(
            "truncated", f"PCD binary_compressed: {len(body)} body bytes, need an 8-byte size prefix"
        )
    comp, raw = (int(v) for v in np.frombuffer(body, dtype="<u4", count=2))
    need = h.points * h.record_bytes
    if raw != need:
        raise _bad(f"uncompressed size {raw} != POINTS {h.points} x {h.record_bytes} B = {need}")
    if comp > len(body) - 8:
        raise RejectError(
            "truncated", f"PCD binary_compressed: compressed size {comp} > {len(body) - 8} bytes left"
        )
    if raw > _LZF_MAX_RATIO * comp:
        raise _bad(f"uncompressed size {raw} is impossible for a {comp}-byte LZF block")
    try:
        dec = lzf.decompress(bytes(body[8 : 8 + comp]), raw)
    except ValueError:
        raise _bad("corrupt LZF block") from None
    if dec is None:
        raise _bad(f"LZF block decompresses to more than the claimed {raw} bytes")
    if len(dec) != raw:
        raise RejectError(
            "truncated", f"PCD binary_compressed: LZF block holds {len(dec)} bytes, header claims {raw}"
        )
    get: dict[str, NDArray] = {}
    off = 0
    for name, d, c in zip(h.fields, h.dtypes, h.counts, strict=True):
        get[name] = np.frombuffer(dec, dtype=d, count=h.points * c, offset=off).reshape(h.points, c)[:, 0]
        off += h.points * c * np.dtype(d).itemsize
    return _pick(h, get)


def _ascii(h: PcdHeader, body: memoryview) -> list[NDArray]:
    per_point = sum(h.counts)
    need = h.points * per_point
    # every value takes at least one character plus a separator: refuse before allocating
    if 2 * need - 1 > len(body):
        raise RejectError("truncated", f"PCD ascii: {len(body)} body bytes cannot hold {need} values")
    starts = dict(zip(h.fields, np.cumsum([0, *h.counts])[:-1].tolist(), strict=True))
    wanted = [starts[f] for f in h.sources]
    # float64 keeps a packed colour's 32 bits; plain fields are rounded to float32 by read_pcd anyway
    exact = np.float64 if any(h.is_colour(f) for f in h.sources) else np.float32
    out, more = read_columns(body, h.points, per_point, wanted, what="PCD ascii", dtype=exact)
    if more:
        raise _bad(f"ascii body holds more than POINTS {h.points} x {per_point} values")
    return _pick(h, dict(zip(h.sources, out.T, strict=True)))

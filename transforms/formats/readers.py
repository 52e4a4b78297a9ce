"""Point-cloud format readers: detection by extension and one ``read_points`` entry point.

Pure numpy (no Beam). Every reader takes the file's bytes and returns an ``(N, C)`` float32 array
whose first three columns are x, y, z. Bad input raises ``RejectError`` with a reason from
``lidarshard.schemas.REJECT_REASONS``; no size claimed by a header is trusted before it is checked against the
bytes present, so a hostile header cannot make a reader allocate more than a small multiple of the file.

Formats:
    ``nuscenes_bin`` headerless float32 x5 (x, y, z, intensity, ring), ``*.pcd.bin``.
    ``kitti_bin``    headerless float32 x4 (x, y, z, reflectance), other ``*.bin``.
    ``bin``          headerless float32 x ``point_dims`` (never detected; chosen explicitly).
    ``npy``          NumPy ``.npy`` holding a 2-D ``(N, >=3)`` numeric array (never unpickled).
    ``pcd``          PCL PCD, see ``lidarshard.transforms.formats.pcd``.
    ``ply``          PLY ascii / binary_little_endian / binary_big_endian, ``vertex`` element.
    ``av2_feather``  Argoverse 2 lidar sweep, ``*.feather`` (Arrow IPC, float16 x, y, z + uint8 intensity),
                     see ``lidarshard.transforms.formats.feather``; not fixed-record (no size-only count).
"""

from __future__ import annotations

import ast
import io
import re
import warnings

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.formats.ascii_values import read_columns
from lidarshard.transforms.formats.feather import read_av2_feather
from lidarshard.transforms.formats.pcd import VALUES_PER_POINT, read_pcd

__all__ = ["FORMATS", "detect_format", "record_floats", "read_points", "count_points_from_size"]

FORMATS: tuple[str, ...] = ("nuscenes_bin", "kitti_bin", "bin", "npy", "pcd", "ply", "av2_feather")
_FIXED = {"nuscenes_bin": 5, "kitti_bin": 4, "bin": None}
_MAX_HEADER = 64 * 1024
_PLY_TYPES = {
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1", "short": "i2", "int16": "i2",
    "ushort": "u2", "uint16": "u2", "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
    "float": "f4", "float32": "f4", "double": "f8", "float64": "f8",
}  # fmt: skip
_END_HEADER = re.compile(rb"\nend_header[ \t]*\r?\n")
_PLY_FORMATS = {"ascii": "", "binary_little_endian": "<", "binary_big_endian": ">"}


def detect_format(path: str) -> str:
    """Reader name for ``path`` from its extension (case-insensitive).

    Raises:
        RejectError: ``unsupported_format`` for any other extension.
    """
    name = path.lower()
    for suffix, fmt in ((".pcd.bin", "nuscenes_bin"), (".bin", "kitti_bin"), (".npy", "npy"),
                        (".pcd", "pcd"), (".ply", "ply"), (".feather", "av2_feather")):  # fmt: skip
        if name.endswith(suffix):
            return fmt
    raise RejectError("unsupported_format", f"no reader for extension of {path.rsplit('/', 1)[-1][:100]!r}")


def record_floats(fmt: str, point_dims: int | None = None) -> int | None:
    """float32 values per point of a fixed-record format, or None for a self-describing one.

    ``point_dims`` overrides the default of ``nuscenes_bin`` (5) and ``kitti_bin`` (4) and is required
    for ``bin``; it is ignored for ``npy``, ``pcd``, ``ply`` and ``av2_feather``.

    Raises:
        ValueError: unknown ``fmt``, or ``bin`` without ``point_dims``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    if fmt not in _FIXED:
        return None
    dims = point_dims if point_dims is not None else _FIXED[fmt]
    if dims is None:
        raise ValueError("format 'bin' needs point_dims")
    return int(dims)


def _fixed_dims(fmt: str, point_dims: int | None) -> int:
    try:
        dims = record_floats(fmt, point_dims)
    except ValueError as e:
        raise RejectError("bad_header", str(e)) from None
    assert dims is not None
    if dims < 3:
        raise RejectError("bad_header", f"{fmt}: point_dims {dims} < 3 (need x, y, z)")
    return dims


def count_points_from_size(num_bytes: int, fmt: str, point_dims: int | None = None) -> int:
    """Points N of a fixed-record file from its size alone: ``num_bytes / (4 * dims)``.

    Raises:
        RejectError: ``empty`` (0 bytes), ``truncated`` (not whole records), ``bad_header`` (dims < 3).
        ValueError: ``fmt`` needs its header to know N (npy, pcd, ply, av2_feather) or is unknown.
    """
    if record_floats(fmt, point_dims) is None:
        raise ValueError(f"format {fmt!r} needs its header to count points")
    rec = 4 * _fixed_dims(fmt, point_dims)
    if num_bytes <= 0:
        raise RejectError("empty", "file holds no bytes")
    if num_bytes % rec:
        raise RejectError("truncated", f"{num_bytes} bytes is not a whole number of {rec}-byte records")
    return num_bytes // rec


def read_points(
    data: bytes,
    fmt: str,
    *,
    point_dims: int | None = None,
    max_points: int = 50_000_000,
    copy: bool = True,
) -> NDArray[np.float32]:
    """Decode one point-cloud file.

    Args:
        data: the whole file's bytes.
        fmt: one of ``FORMATS`` (see ``detect_format``).
        point_dims: float32 values per point for the headerless formats (see ``record_floats``).
        max_points: reject files holding or claiming more points than this.
        copy: True (default): always a new, writable array. False: a read-only view of ``data`` where
            the file's layout allows one (fixed-record formats; an ``npy`` of C-order little-endian
            float32), for a caller that only reads the points. ``av2_feather`` always decodes.

    Returns:
        ``(N, C)`` float32, C-contiguous, ``N >= 1``, ``C >= 3``; columns 0..2 are x, y, z (may be NaN),
        then the file's other scalar numeric fields in order (bin: all columns; pcd: COUNT-1 fields, a packed
        rgb/rgba as its channels r, g, b (, a) 0..255;
        ply: other scalar vertex properties; av2_feather: intensity only, ``C == 4``).

    Raises:
        RejectError: reason ``empty``, ``truncated``, ``bad_header``, ``unsupported_format`` or
            ``too_large``; ``reader_error`` only for a bug in a reader.
    """
    if fmt not in FORMATS:
        raise RejectError("unsupported_format", f"unknown format {fmt!r}")
    try:
        if fmt in _FIXED:
            return _read_bin(data, _fixed_dims(fmt, point_dims), max_points, copy)
        if fmt == "npy":  # a C-order float32 body comes back as a read-only view of ``data``
            points = _read_npy(data, max_points)
            return points.copy() if copy and not points.flags.owndata else points
        if fmt == "pcd":
            return read_pcd(data, max_points=max_points)
        if fmt == "av2_feather":
            return read_av2_feather(data, max_points)
        return _read_ply(data, max_points)
    except MemoryError:
        raise RejectError("too_large", f"{fmt}: out of memory decoding {len(data)} bytes") from None
    except (ValueError, TypeError, IndexError, KeyError, OverflowError) as e:
        raise RejectError("reader_error", f"{fmt}: {type(e).__name__}: {e}") from e


def _read_bin(data: bytes, dims: int, max_points: int, copy: bool = True) -> NDArray[np.float32]:
    n = count_points_from_size(len(data), "bin", dims)
    if n > max_points:
        raise RejectError("too_large", f"{n} points > max_points {max_points}")
    points = np.frombuffer(data, dtype="<f4").reshape(n, dims)
    if copy or points.dtype != np.float32:  # a big-endian machine converts
        return points.astype(np.float32, order="C")
    return points


def _finish(cols: list[NDArray], n: int) -> NDArray[np.float32]:
    out = np.empty((n, len(cols)), dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # beyond float32 range -> +-inf, by design
        for i, col in enumerate(cols):
            out[:, i] = col
    return out


# ---------------------------------------------------------------------------------------------- npy


def _read_npy(data: bytes, max_points: int) -> NDArray[np.float32]:
    if not data:
        raise RejectError("empty", "npy: file holds no bytes")
    if data[:6] != b"\x93NUMPY" or len(data) < 10:
        raise RejectError("bad_header", "npy: missing \\x93NUMPY magic")
    major = data[6]
    if major not in (1, 2, 3):
        raise RejectError("bad_header", f"npy: unsupported format version {major}.{data[7]}")
    start = 10 if major == 1 else 12
    hlen = int.from_bytes(data[8:start], "little")
    if hlen > _MAX_HEADER or start + hlen > len(data):
        raise RejectError("bad_header", f"npy: header length {hlen} exceeds the file or {_MAX_HEADER} bytes")
    try:
        meta = ast.literal_eval(data[start : start + hlen].decode("latin1" if major < 3 else "utf8"))
    except (ValueError, SyntaxError, TypeError, UnicodeDecodeError, RecursionError, MemoryError):
        raise RejectError("bad_header", "npy: header is not a Python literal") from None
    if not isinstance(meta, dict) or set(meta) != {"descr", "fortran_order", "shape"}:
        raise RejectError("bad_header", "npy: header must be a dict with descr, fortran_order, shape")
    descr, fortran, shape = meta["descr"], meta["fortran_order"], meta["shape"]
    if not isinstance(descr, str):
        raise RejectError("bad_header", "npy: descr must be a plain dtype string (no structured arrays)")
    if not isinstance(fortran, bool):
        raise RejectError("bad_header", "npy: fortran_order must be True or False")
    try:
        dtype = np.dtype(descr)
    except (TypeError, ValueError, SyntaxError):
        raise RejectError("bad_header", f"npy: unknown dtype {descr[:40]!r}") from None
    if dtype.kind not in "fiu" or dtype.itemsize > 16:
        raise RejectError("bad_header", f"npy: dtype {descr[:40]!r} is not a numeric int/float type")
    if not (isinstance(shape, tuple) and len(shape) == 2 and all(type(s) is int and s >= 0 for s in shape)):
        raise RejectError("bad_header", f"npy: shape {str(shape)[:60]} is not a 2-D (N, C) shape")
    n, c = shape
    if c < 3:
        raise RejectError("bad_header", f"npy: shape {shape} has fewer than 3 columns (x, y, z)")
    if n == 0:
        raise RejectError("empty", "npy: array holds 0 points")
    if n > max_points:
        raise RejectError("too_large", f"npy: {n} points > max_points {max_points}")
    body = len(data) - start - hlen
    if n * c * dtype.itemsize > body:
        raise RejectError("truncated", f"npy: {body} data bytes < shape {shape} x {dtype.itemsize} B")
    flat = np.frombuffer(data, dtype=dtype, count=n * c, offset=start + hlen)
    arr = flat.reshape((n, c), order="F" if fortran else "C")
    with np.errstate(over="ignore", invalid="ignore"):
        return np.ascontiguousarray(arr, dtype=np.float32)


# ---------------------------------------------------------------------------------------------- ply


def _ply_header(data: bytes) -> tuple[str, list[tuple[str, int, list[tuple[str, str | None, str]]]], int]:
    """(format, [(element, count, [(type, list count type or None, name)])], body offset)."""
    if not data.startswith(b"ply\n") and not data.startswith(b"ply\r\n"):
        raise RejectError("bad_header", "PLY: missing 'ply' magic line")
    m = _END_HEADER.search(data, 0, _MAX_HEADER)
    if m is None:
        raise RejectError("bad_header", f"PLY: no end_header line within {_MAX_HEADER} bytes")
    try:
        lines = data[: m.start()].decode("ascii").splitlines()[1:]
    except UnicodeDecodeError:
        raise RejectError("bad_header", "PLY: non-ASCII header") from None
    fmt = None
    elements: list[tuple[str, int, list[tuple[str, str | None, str]]]] = []
    for line in lines:
        tok = line.split()
        if not tok or tok[0] in ("comment", "obj_info"):
            continue
        if tok[0] == "format" and len(tok) == 3 and tok[1] in _PLY_FORMATS and fmt is None:
            fmt = tok[1]
        elif tok[0] == "element" and len(tok) == 3 and tok[2].isdigit() and len(tok[2]) <= 18:
            elements.append((tok[1], int(tok[2]), []))
        elif tok[0] == "property" and elements and len(tok) == 3 and tok[1] in _PLY_TYPES:
            elements[-1][2].append((_PLY_TYPES[tok[1]], None, tok[2]))
        elif (tok[0] == "property" and elements and len(tok) == 5 and tok[1] == "list"
              and tok[2] in _PLY_TYPES and tok[3] in _PLY_TYPES):  # fmt: skip
            elements[-1][2].append((_PLY_TYPES[tok[3]], _PLY_TYPES[tok[2]], tok[4]))
        else:
            raise RejectError("bad_header", f"PLY: bad header line {line[:60]!r}")
    if fmt is None:
        raise RejectError("bad_header", "PLY: missing or unknown format line")
    return fmt, elements, m.end()


def _read_ply(data: bytes, max_points: int) -> NDArray[np.float32]:
    if not data:
        raise RejectError("empty", "PLY: file holds no bytes")
    fmt, elements, offset = _ply_header(data)
    names = [e[0] for e in elements]
    if names.count("vertex") != 1:
        raise RejectError("bad_header", "PLY: need exactly one 'vertex' element")
    vi = names.index("vertex")
    n, vprops = elements[vi][1], elements[vi][2]
    scalar = [(t, name) for t, lt, name in vprops if lt is None]
    for axis in ("x", "y", "z"):
        if [name for _, name in scalar].count(axis) != 1:
            raise RejectError("bad_header", f"PLY: vertex needs exactly one scalar property {axis!r}")
    if n == 0:
        raise RejectError("empty", "PLY: 0 vertices")
    if n > max_points:
        raise RejectError("too_large", f"PLY: {n} vertices > max_points {max_points}")
    if n * len(vprops) > VALUES_PER_POINT * max_points:
        detail = (
            f"PLY: {n} vertices x {len(vprops)} properties > {VALUES_PER_POINT} x max_points {max_points}"
        )
        raise RejectError("too_large", detail)
    body = memoryview(data)[offset:]
    _check_room(fmt, elements, len(body))
    if any(lt is not None for e in elements[: vi + 1] for _, lt, _ in e[2]):
        return _ply_fallback(data, scalar)
    order = ["x", "y", "z"] + [name for _, name in scalar if name not in ("x", "y", "z")]
    if fmt == "ascii":
        skip = sum(cnt * len(props) for _, cnt, props in elements[:vi])
        index = {name: i for i, (_, _, name) in enumerate(vprops)}
        return read_columns(body, n, len(vprops), [index[k] for k in order], skip=skip, what="PLY ascii")[0]
    bo = _PLY_FORMATS[fmt]
    skip = sum(cnt * sum(np.dtype(t).itemsize for t, _, _ in props) for _, cnt, props in elements[:vi])
    struct = np.dtype([(f"p{i}", bo + t) for i, (t, _, _) in enumerate(vprops)])
    if skip + n * struct.itemsize > len(body):
        raise RejectError("truncated", f"PLY: {len(body)} body bytes < {n} vertices x {struct.itemsize} B")
    arr = np.frombuffer(body, dtype=struct, count=n, offset=skip)
    col = {name: arr[f"p{i}"] for i, (_, _, name) in enumerate(vprops)}
    return _finish([col[k] for k in order], n)


def _check_room(fmt: str, elements: list, body_bytes: int) -> None:
    """Refuse element counts the body cannot hold (each row needs >= its fixed bytes or tokens)."""
    need = 0
    for _, cnt, props in elements:
        if fmt == "ascii":
            row = 2 * len(props)
        else:
            row = sum(np.dtype(lt if lt is not None else t).itemsize for t, lt, _ in props)
        need += cnt * max(row, 1)
    if need > body_bytes + 1:
        raise RejectError("truncated", f"PLY: header needs >= {need} body bytes, file has {body_bytes}")


def _ply_fallback(data: bytes, scalar: list[tuple[str, str]]) -> NDArray[np.float32]:
    """Read layouts the fast path does not handle (a list property before/in 'vertex') via plyfile."""
    try:
        import plyfile
    except ImportError:
        raise RejectError(
            "unsupported_format",
            'PLY with list properties before the vertex data needs plyfile: pip install "lidarshard[ply]"',
        ) from None
    try:
        with warnings.catch_warnings():  # plyfile warns on empty list rows; errors still raise
            warnings.simplefilter("ignore", UserWarning)
            vert = plyfile.PlyData.read(io.BytesIO(data))["vertex"].data
    except (plyfile.PlyParseError, ValueError, TypeError, IndexError, KeyError, EOFError, OverflowError) as e:
        raise RejectError("bad_header", f"PLY (plyfile): {type(e).__name__}: {str(e)[:200]}") from None
    order = ["x", "y", "z"] + [name for _, name in scalar if name not in ("x", "y", "z")]
    return _finish([vert[k] for k in order], len(vert))

"""Argoverse 2 lidar sweeps: Arrow IPC files (Feather v2, LZ4) -> ``(N, 4)`` float32 points. Pure pyarrow/numpy.

An AV2 sweep (``sensors/lidar/<timestamp_ns>.feather``) holds one row per return: ``x, y, z`` (float16, m,
ego-vehicle frame, motion-compensated to the file name's timestamp), ``intensity`` (uint8), ``laser_number``
(uint8) and ``offset_ns`` (int32). ``read_av2_feather`` returns x, y, z, intensity widened exactly to float32.

Limits: the row count is summed from the file's own metadata (the footer's record-batch blocks and each
batch message's ``length``, flatbuffers read with bounds checks) and checked against ``max_points`` before any
buffer is decompressed or converted; only the four columns used are decompressed, and what pyarrow reads is
validated (``Table.validate(full=True)``). Arrow errors become ``RejectError``, never escape: an allocation
pyarrow cannot make (a compressed buffer's claimed size, which is not checked here) is ``too_large``; pages
are only touched by what really decompresses, so memory stays bounded by the file's compression ratio.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from numpy.typing import NDArray

from lidarshard.transforms.errors import RejectError

__all__ = ["AV2_COLUMNS", "read_av2_feather", "count_rows"]

#: The columns read, in output order (``laser_number`` and ``offset_ns`` are not decompressed).
AV2_COLUMNS: tuple[str, ...] = ("x", "y", "z", "intensity")
_MAGIC = b"ARROW1"
_RECORD_BATCH = 3  # flatbuffers ``MessageHeader`` union tag of a RecordBatch


class _Malformed(Exception):
    """A flatbuffer offset or length that points outside its buffer."""


def _unpack(fmt: str, buf: bytes | memoryview, pos: int) -> int:
    size = struct.calcsize(fmt)
    if pos < 0 or pos + size > len(buf):
        raise _Malformed(f"offset {pos} outside {len(buf)} bytes")
    return int(struct.unpack_from(fmt, buf, pos)[0])


def _field(buf: bytes | memoryview, table: int, index: int) -> int | None:
    """Absolute position of field ``index`` of the flatbuffer table at ``table``, None when absent."""
    vtable = table - _unpack("<i", buf, table)
    vsize = _unpack("<H", buf, vtable)
    if 4 + 2 * index + 2 > vsize:
        return None
    off = _unpack("<H", buf, vtable + 4 + 2 * index)
    return table + off if off else None


def _ref(buf: bytes | memoryview, pos: int) -> int:
    """Follow the uoffset stored at ``pos`` (a table or vector)."""
    return pos + _unpack("<I", buf, pos)


def _batch_rows(data: memoryview, offset: int, meta_len: int) -> int:
    """``RecordBatch.length`` of the message at ``offset`` (``meta_len``: its framed metadata bytes)."""
    if offset < 0 or meta_len < 8 or offset + meta_len > len(data):
        raise _Malformed(f"record batch block at {offset} (+{meta_len}) outside the file")
    start = 8 if _unpack("<i", data, offset) == -1 else 4  # continuation marker, then the length
    size = _unpack("<i", data, offset + start - 4)
    if size <= 0 or start + size > meta_len:
        raise _Malformed(f"message metadata of {size} bytes does not fit its {meta_len}-byte block")
    msg = data[offset + start : offset + start + size]
    root = _ref(msg, 0)
    tag, header = _field(msg, root, 1), _field(msg, root, 2)
    if tag is None or header is None or _unpack("<B", msg, tag) != _RECORD_BATCH:
        raise _Malformed("a record batch block does not hold a RecordBatch message")
    length = _field(msg, _ref(msg, header), 0)
    rows = 0 if length is None else _unpack("<q", msg, length)
    if rows < 0:
        raise _Malformed(f"record batch claims {rows} rows")
    return rows


def count_rows(data: bytes) -> int:
    """Rows of an Arrow IPC file from its metadata alone (no buffer decompressed).

    Raises:
        RejectError: ``empty`` (no bytes), ``unsupported_format`` (no ``ARROW1`` magic: not an IPC file,
            e.g. Feather v1), ``truncated`` (leading magic only), ``bad_header`` (a footer or message that
            does not parse).
    """
    if not data:
        raise RejectError("empty", "feather: file holds no bytes")
    if not data.startswith(_MAGIC):
        what = "Feather v1" if data.startswith(b"FEA1") else "no ARROW1 magic"
        raise RejectError("unsupported_format", f"feather: not an Arrow IPC (Feather v2) file ({what})")
    if len(data) < 18 or not data.endswith(_MAGIC):
        raise RejectError("truncated", f"feather: {len(data)} bytes end without the ARROW1 footer magic")
    view = memoryview(data)
    try:
        flen = _unpack("<i", view, len(data) - 10)
        if flen <= 0 or flen > len(data) - 18:
            raise _Malformed(f"footer length {flen} does not fit the file")
        footer = view[len(data) - 10 - flen : len(data) - 10]
        batches = _field(footer, _ref(footer, 0), 3)
        if batches is None:
            return 0
        vec = _ref(footer, batches)
        count = _unpack("<I", footer, vec)
        if vec + 4 + 24 * count > len(footer):
            raise _Malformed(f"footer lists {count} record batches it has no room for")
        total = 0
        for i in range(count):  # Block: int64 offset, int32 metaDataLength, 4 pad bytes, int64 bodyLength
            pos = vec + 4 + 24 * i
            total += _batch_rows(view, _unpack("<q", footer, pos), _unpack("<i", footer, pos + 8))
        return total
    except _Malformed as e:
        raise RejectError("bad_header", f"feather: {e}") from None


def _columns(schema: pa.Schema) -> list[int]:
    """Indices of ``AV2_COLUMNS`` in ``schema``; each must appear once with an integer/float type."""
    out = []
    for name in AV2_COLUMNS:
        idx = schema.get_all_field_indices(name)
        if len(idx) != 1:
            what = "missing" if not idx else f"appears {len(idx)} times"
            raise RejectError("bad_header", f"feather: column {name!r} {what} ({len(schema)} columns)")
        kind = schema.field(idx[0]).type
        if not (pa.types.is_floating(kind) or pa.types.is_integer(kind)):
            raise RejectError("bad_header", f"feather: column {name!r} has non-numeric type {kind}")
        out.append(idx[0])
    return out


def _widen(chunk: pa.Array) -> NDArray:
    """A numeric chunk as numpy (nulls -> NaN); float16/uint8 widen to float32 exactly on assignment."""
    if chunk.null_count:
        values = np.asarray(chunk.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.float64)
        values[np.asarray(chunk.is_null().to_numpy(zero_copy_only=False), dtype=bool)] = np.nan
        return values
    return chunk.to_numpy(zero_copy_only=False)


def read_av2_feather(data: bytes, max_points: int) -> NDArray[np.float32]:
    """Decode one AV2 lidar sweep.

    Args:
        data: the whole ``.feather`` file's bytes.
        max_points: reject a file whose metadata claims more rows than this (checked before decompressing).

    Returns:
        ``(N, 4)`` float32, C-contiguous, ``N >= 1``: x, y, z (m, ego-vehicle frame; null -> NaN), intensity.

    Raises:
        RejectError: ``empty`` (no bytes or 0 rows), ``unsupported_format`` (not an Arrow IPC file),
            ``truncated``, ``bad_header`` (unparsable metadata, a missing/duplicated/non-numeric x, y, z or
            intensity column, buffers that fail validation), ``too_large`` (rows > ``max_points``).
    """
    rows = count_rows(data)
    try:
        reader = ipc.open_file(pa.BufferReader(data))
        cols = _columns(reader.schema)
        if rows == 0:
            raise RejectError("empty", "feather: table holds 0 rows")
        if rows > max_points:
            raise RejectError("too_large", f"feather: {rows} points > max_points {max_points}")
        opts = ipc.IpcReadOptions(included_fields=cols)
        table = ipc.open_file(pa.BufferReader(data), options=opts).read_all()
        table.validate(full=True)
    except MemoryError as e:  # pa.ArrowMemoryError too: a compressed buffer claiming an absurd size
        raise RejectError("too_large", f"feather: {type(e).__name__}: {str(e)[:200]}") from None
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:  # ArrowInvalid, IOError, a non-UTF-8 name
        raise RejectError("bad_header", f"feather: {type(e).__name__}: {str(e)[:200]}") from None
    if table.num_rows != rows:
        raise RejectError("bad_header", f"feather: {table.num_rows} rows read, metadata claims {rows}")
    out = np.empty((rows, len(AV2_COLUMNS)), dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # float64/int64 beyond float32 -> +-inf, by design
        for j, name in enumerate(AV2_COLUMNS):
            start = 0
            for chunk in table.column(name).chunks:
                out[start : start + len(chunk), j] = _widen(chunk)
                start += len(chunk)
    return out

"""Whitespace-separated numbers (ASCII PCD and PLY bodies) parsed in bounded memory. Pure numpy.

Splitting a body into Python tokens costs ~45 bytes per value (a 150 MB file with ``COUNT 97``
needed 3 GB); here the body is parsed in ``CHUNK_BYTES`` pieces by numpy's C parser and only the
wanted columns are kept, so memory is the output columns plus one chunk, whatever the file holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.errors import RejectError

__all__ = ["CHUNK_BYTES", "read_columns"]

#: Bytes parsed at a time.
CHUNK_BYTES = 1 << 20
#: Longest value accepted, in characters (a float needs ~25).
MAX_VALUE_CHARS = 64
_LONG = re.compile(rb"[^ \t\r\n\x0b\x0c]{%d}" % (MAX_VALUE_CHARS + 1))
_WS = (b" ", b"\n", b"\t", b"\r", b"\x0b", b"\x0c")


def _numbers(chunk: bytes, what: str) -> NDArray[np.float64]:
    if _LONG.search(chunk):
        raise RejectError("bad_header", f"{what}: a value is longer than {MAX_VALUE_CHARS} characters")
    try:
        vals = np.fromstring(chunk, dtype=np.float64, sep=" ")
    except ValueError:
        raise RejectError("bad_header", f"{what}: a value is not a number") from None
    if vals.size == 1 and not chunk.strip():  # numpy parses a blank string as [-1.0]
        return vals[:0]
    return vals


def _chunks(body: memoryview, what: str):
    """Pieces of ``body`` that end on whitespace (or at the end)."""
    start, n = 0, len(body)
    while start < n:
        chunk = bytes(body[start : min(start + CHUNK_BYTES, n)])
        if start + len(chunk) < n:
            cut = max(chunk.rfind(c) for c in _WS)
            if cut < 0:
                raise RejectError(
                    "bad_header", f"{what}: a value is longer than {MAX_VALUE_CHARS} characters"
                )
            chunk = chunk[: cut + 1]
        start += len(chunk)
        yield chunk


def read_columns(
    body: bytes | memoryview,
    rows: int,
    per_row: int,
    wanted: Sequence[int],
    *,
    skip: int = 0,
    what: str,
    dtype: type[np.floating] = np.float32,
) -> tuple[NDArray[np.floating], bool]:
    """Columns ``wanted`` of the ``rows`` x ``per_row`` numbers that follow ``skip`` leading numbers.

    Args:
        body: ASCII text of whitespace-separated numbers.
        rows, per_row: the table to read (row-major, as the file lists it).
        wanted: column indices in ``0..per_row-1`` to return.
        skip: numbers before the table (earlier PLY elements).
        what: names the format in reject details.
        dtype: of the result: float32 (values parsed as float64 then rounded, +-inf beyond its range) or
            float64 (as parsed: exact integers up to 2**53, e.g. a PCD's packed colour).

    Returns:
        (``(rows, len(wanted))`` values of ``dtype``; whether more numbers follow the table).

    Raises:
        RejectError: ``truncated`` (too few numbers), ``bad_header`` (a value that is not a number).
    """
    need = rows * per_row
    out = np.empty((rows, len(wanted)), dtype=dtype)
    g, more = -skip, False  # g: index, within the table, of the next number parsed
    for chunk in _chunks(memoryview(body), what):
        if g >= need:
            more = more or bool(chunk.strip())
            if more:
                break
            continue
        vals = _numbers(chunk, what)
        lo, hi = max(0, -g), max(0, min(vals.size, need - g))
        if hi > lo:
            g0 = g + lo
            for j, s in enumerate(wanted):
                first = (s - g0) % per_row
                part = vals[lo + first : hi : per_row]
                row0 = (g0 + first) // per_row
                with np.errstate(over="ignore", invalid="ignore"):
                    out[row0 : row0 + part.size, j] = part
        more = more or vals.size > hi
        g += vals.size
    if g < need:
        raise RejectError("truncated", f"{what}: {max(g, 0)} values < {rows} x {per_row}")
    return out, more

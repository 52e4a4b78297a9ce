"""A rank's plan file streamed from its pieces without holding its rows: a local spill by row group.

``plan_writer.rank_batches`` holds every piece of a rank at once (N / W plan rows with their path
strings, ~1 KB a row at 9 sweeps). Here the writer reads only the pieces' (step, slot) columns (8 B a
row) to decide each row's place in the file, then reads the pieces one at a time and appends each
row to a local Arrow IPC file of the output row group it lands in; each row group is then read back,
put in order and yielded::

    order, group = plan_writer.rank_order(keys, rows)     # (n,) int32 each: ~8 B a row kept
    for piece in pieces: spill piece's rows by ``group``    # one piece in memory
    for k in row groups: yield spilled rows of k, in ``order``  # one row group in memory

Memory: ~8 B a row of the rank plus one piece and one row group; disk: the rank's rows once (Arrow
IPC, uncompressed: ~1 KB a row at 9 sweeps) in a temporary directory, removed when the file is
written. At most ``OPEN_SPILLS`` row groups are spilled in one pass over the pieces. The batches are exactly
``rank_batches``'s (same rows, order and types: ``finish_rank`` stays the oracle).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.transforms.core import plan_writer
from lidarshard.transforms.io.arrow import ROW_GROUP_ROWS

__all__ = ["Read", "stream_rank", "OPEN_SPILLS"]

#: ``read(i, columns)``: piece ``i`` (of the rank's pieces, in a fixed order) as a table, only
#: ``columns`` when given (steps already the epoch's).
Read = Callable[[int, Sequence[str] | None], pa.Table]
#: Spill files one pass over the pieces keeps open; more row groups take more passes.
OPEN_SPILLS = 128
#: Uncompressed: a compressing writer's state grows the task by MiBs for each open row group's spill.
_IPC = pa.ipc.IpcWriteOptions(compression=None)


def stream_rank(
    read: Read, pieces: int, epoch: int, rank: int, spill: str | None = None, rows: int = ROW_GROUP_ROWS
) -> Iterator[pa.Table]:
    """Rank ``rank``'s plan file for ``epoch`` from its ``pieces`` pieces (``read``), ``rows`` rows at a
    time in (step, slot) order with the file's ``epoch`` and ``rank`` columns: ``rank_batches``'s
    batches. ``spill``: a local directory to spill under (a temporary directory of its own inside it;
    default the system's)."""
    keys = [read(i, ("step", "slot")) for i in range(pieces)]
    sizes = [k.num_rows for k in keys]
    order, group = plan_writer.rank_order(
        [(k.column("step").to_numpy(), k.column("slot").to_numpy()) for k in keys], rows
    )
    del keys
    total = sum(sizes)
    if not total:
        yield from plan_writer.rank_batches([], epoch, rank)
        return
    if spill is not None:
        os.makedirs(spill, exist_ok=True)
    offsets = np.r_[0, np.cumsum(sizes)]
    count = -(-total // rows)
    with tempfile.TemporaryDirectory(prefix=f"ranks-{epoch}-{rank}-", dir=spill) as tmp:
        for first in range(0, count, OPEN_SPILLS):
            ks = range(first, min(first + OPEN_SPILLS, count))
            paths = [os.path.join(tmp, f"{k:08d}.arrow") for k in ks]
            schema = _spill(read, offsets, group, first, paths)
            for k, path in zip(ks, paths, strict=True):
                yield _read_back(path, schema, order[k * rows : (k + 1) * rows], epoch, rank)


def _spill(read: Read, offsets: NDArray, group: NDArray[np.int32], first: int, paths: list[str]) -> pa.Schema:
    """Append every piece's rows of row groups ``first .. first + len(paths) - 1`` to their ``paths``
    (Arrow IPC streams), in piece order, reading only the pieces holding some; the pieces' schema."""
    writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
    schema = None
    try:
        for i in range(len(offsets) - 1):
            g = group[offsets[i] : offsets[i + 1]] - first
            keep = np.flatnonzero((g >= 0) & (g < len(paths)))
            if not keep.size:  # none of its rows in these row groups: not read
                continue
            by = keep[np.argsort(g[keep], kind="stable")]
            gs = g[by]
            cuts = np.flatnonzero(np.diff(gs)) + 1
            piece = read(i, None)
            schema = piece.schema
            taken = piece.take(pa.array(by))
            del piece
            for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(by)], strict=True):
                k = int(gs[a])
                if k not in writers:
                    writers[k] = pa.ipc.new_stream(paths[k], schema, options=_IPC)
                writers[k].write_table(taken.slice(int(a), int(b - a)))
    finally:
        for w in writers.values():
            w.close()
    assert schema is not None
    return schema


def _read_back(path: str, schema: pa.Schema, order: NDArray[np.int32], epoch: int, rank: int) -> pa.Table:
    """One output row group: the spilled rows at ``path`` (concatenated indices ``sort(order)``, in
    that order) put in file order ``order``, keyed."""
    if os.path.exists(path):
        with pa.ipc.open_stream(pa.memory_map(path)) as reader:
            table = reader.read_all()
        os.unlink(path)
    else:
        table = schema.empty_table()
    where = np.empty(order.size, np.int64)
    where[np.argsort(order, kind="stable")] = np.arange(order.size)
    return plan_writer.keyed(table.take(pa.array(where)), epoch, rank)

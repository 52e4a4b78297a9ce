"""An epoch's plan files written without any process holding the samples' strings. Pure.

Taking every planned row from the whole scored table in one process would hold ~1 GB of paths per
epoch at 1M samples with 9 sweeps. Here the plan is decided on the numeric columns only
(``NUMERIC_INPUT``, ~28 bytes a sample), and the rows travel in shards (row ranges) of the samples::

    part = assignment(plan_samples(numeric, epoch, cfg).plan)  # sample index -> (rank, step, slot), sorted
    for k, (start, stop) in enumerate(shard_bounds(n)):    # in parallel: one task per (epoch, shard)
        pieces = rank_pieces(read_rows(start, stop), start, slice_rows(part, start, stop))
    rank_batches(pieces_of_rank, epoch, rank)              # in parallel: one task per (epoch, rank)

``finish_rank`` (``rank_batches`` joined) gives exactly the table a one-process writer would (same rows, order and types;
``tests/plan_oracle.py`` keeps that writer as the tests' oracle).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.transforms.io.arrow import ROW_GROUP_ROWS

__all__ = [
    "plan_rows",
    "NUMERIC_INPUT",
    "COPIED",
    "ROWS_PER_SHARD",
    "shard_bounds",
    "assignment",
    "slice_rows",
    "rank_pieces",
    "rank_order",
    "rank_batches",
    "keyed",
    "finish_rank",
]

#: The scored columns every epoch's plan is decided from (``epochs.plan_columns`` adds the size features
#: where a plan needs them).
NUMERIC_INPUT = ["cost", "bucket_id", "num_points", "weight"]
#: The scored columns every plan row copies from its sample.
COPIED = ["sample_id", "path", "sweep_paths", "cost", "bucket_id"]
#: Samples one (epoch, shard) task holds (4 row groups of the samples, ``arrow.ROW_GROUP_ROWS``).
ROWS_PER_SHARD = 1 << 16

_FIXED = ("step", "slot", "rank_count", "global_count")
#: Copied columns an epoch's assignment may carry itself: the costs of an epoch planned before a re-plan.
_OWN = ("cost", "bucket_id")
#: The plan file's columns a piece holds: all but the (epoch, rank) key, which ``finish_rank`` adds.
_KEY = tuple(name for name, _, _ in schemas.PLAN_KEY_FIELDS)


def plan_rows(plan: NDArray[np.int64]) -> dict[str, NDArray]:
    """The plan's rows in rank-major, (step, slot) order: sample index and position columns.

    Args:
        plan: (S, W, M) int64, ``-1`` = empty slot (each rank-step's samples come first).

    Returns:
        ``{"row", "step", "rank", "slot", "rank_count", "global_count"}``, each (N,) for the
        N = ``(plan >= 0).sum()`` planned slots; ``rank_count`` is the samples of that rank at that
        step, ``global_count`` of all ranks at that step.
    """
    s, w, m = plan.shape
    valid = (plan >= 0).transpose(1, 0, 2)  # (W, S, M)
    counts = valid.sum(axis=-1)  # (W, S)
    shape = (w, s, m)
    step = np.broadcast_to(np.arange(s, dtype=np.int32)[None, :, None], shape)[valid]
    rank = np.broadcast_to(np.arange(w, dtype=np.int32)[:, None, None], shape)[valid]
    return {
        "row": plan.transpose(1, 0, 2)[valid],
        "step": step,
        "rank": rank,
        "slot": np.broadcast_to(np.arange(m, dtype=np.int32), shape)[valid],
        "rank_count": counts[rank, step].astype(np.int32),
        "global_count": counts.sum(axis=0)[step].astype(np.int32),
    }


def shard_bounds(n: int, rows: int = ROWS_PER_SHARD) -> list[tuple[int, int]]:
    """[start, stop) sample-index ranges of ``rows`` samples (the last one shorter) covering ``n``."""
    return [(a, min(a + rows, n)) for a in range(0, n, rows)]


def assignment(plan: NDArray[np.int64]) -> dict[str, NDArray]:
    """An epoch's plan (S, W, M) sample indices (``EpochPlan.plan``) as ``plan_rows`` arrays sorted by
    sample index ``row`` (ties: rank-major plan order), for the shard tasks."""
    rows = plan_rows(plan)
    order = np.argsort(rows["row"], kind="stable")
    return {k: rows.pop(k)[order] for k in list(rows)}  # each column freed once reordered


def slice_rows(part: dict[str, NDArray], start: int, stop: int) -> dict[str, NDArray]:
    """The entries of ``part`` (sorted by ``row``) whose sample index is in [start, stop)."""
    a, b = np.searchsorted(part["row"], [start, stop])
    return {k: v[a:b] for k, v in part.items()}


def rank_pieces(rows: pa.Table, start: int, part: dict[str, NDArray]) -> dict[int, pa.Table]:
    """Plan rows of one shard, per rank.

    Args:
        rows: the ``COPIED`` columns of samples [start, start + rows.num_rows).
        start: sample index of ``rows``' first row.
        part: ``slice_rows`` of the epoch's assignment for this shard; its ``cost`` and ``bucket_id``,
            when present, replace the samples' (an epoch planned with an earlier cost model).

    Returns:
        {rank: table of ``plan_schema()`` without ``epoch``, ``rank``, rows in this shard's order} for
        the ranks with entries.
    """
    by_rank = np.argsort(part["rank"], kind="stable")
    ranks = part["rank"][by_rank]
    taken = rows.select(COPIED).take(pa.array(part["row"][by_rank] - start))
    fixed = {name: pa.array(part[name][by_rank]) for name in (*_FIXED, *_OWN) if name in part}
    schema = _piece_schema()
    arrays = [fixed[f.name] if f.name in fixed else taken.column(f.name) for f in schema]
    table = pa.Table.from_arrays(arrays, schema=schema)
    cuts = np.flatnonzero(np.diff(ranks)) + 1
    starts, stops = np.r_[0, cuts], np.r_[cuts, len(ranks)]
    return {
        int(ranks[a]): table.slice(int(a), int(b - a)) for a, b in zip(starts, stops, strict=True) if b > a
    }


def _piece_schema() -> pa.Schema:
    plan = schemas.plan_schema()
    return pa.schema([f for f in plan if f.name not in _KEY], metadata=plan.metadata)


def rank_order(
    keys: list[tuple[NDArray[np.integer], NDArray[np.integer]]], rows: int = ROW_GROUP_ROWS
) -> tuple[NDArray[np.int32], NDArray[np.int32]]:
    """Where a rank's rows go in its file, from its pieces' ``(step, slot)`` columns (in piece order).

    Returns:
        ``order`` (n,): the rows' indices (into the pieces concatenated) in (step, slot) order, ties
        in piece order (``rank_batches``'s order); ``group`` (n,): each row's output row group of
        ``rows`` rows (``order[k * rows : (k + 1) * rows]`` is row group ``k``).
    """
    step = np.concatenate([np.asarray(s) for s, _ in keys]) if keys else np.empty(0, np.int32)
    slot = np.concatenate([np.asarray(s) for _, s in keys]) if keys else np.empty(0, np.int32)
    order = np.lexsort((slot, step)).astype(np.int32)  # stable, as Arrow's sort_indices
    del step, slot
    group = np.empty(order.size, np.int32)
    group[order] = np.arange(order.size, dtype=np.int32) // rows
    return order, group


def keyed(batch: pa.Table, epoch: int, rank: int) -> pa.Table:
    """Plan rows of a piece's schema as the rank file's: its ``epoch`` and ``rank`` columns first."""
    n = batch.num_rows
    batch = batch.add_column(0, "rank", pa.array(np.full(n, rank, np.int32))).add_column(
        0, "epoch", pa.array(np.full(n, epoch, np.int32))
    )
    return batch.cast(schemas.plan_schema())  # read-back pieces name list items "element"


def rank_batches(
    pieces: list[pa.Table], epoch: int, rank: int, rows: int = ROW_GROUP_ROWS
) -> Iterator[pa.Table]:
    """Rank ``rank``'s plan file for ``epoch`` from its pieces (any order), ``rows`` rows at a time in
    (step, slot) order, with the file's ``epoch`` and ``rank`` columns (one empty table when there are
    none). Memory: every piece at once (the build streams instead: ``rank_stream.stream_rank``)."""
    parts = [p for p in pieces if p.num_rows]
    table = pa.concat_tables(parts) if parts else _piece_schema().empty_table()  # chunks, no copy
    order = pc.sort_indices(table, sort_keys=[("step", "ascending"), ("slot", "ascending")])
    for a in range(0, max(table.num_rows, 1), rows):
        yield keyed(table.take(order.slice(a, rows)), epoch, rank)


def finish_rank(pieces: list[pa.Table], epoch: int, rank: int) -> pa.Table:
    """Rank ``rank``'s plan file table for ``epoch`` from its pieces (any order): sorted by (step, slot),
    with the file's ``epoch`` and ``rank`` columns (``rank_batches`` joined)."""
    return pa.concat_tables(list(rank_batches(pieces, epoch, rank))).combine_chunks()

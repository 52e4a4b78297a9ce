"""The streamed rank writer (``rank_stream.stream_rank``) gives ``finish_rank``'s files, one piece at a time."""

from __future__ import annotations

import io
import weakref
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lidarshard import schemas
from lidarshard.transforms.core import plan_writer, rank_stream
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.planner import plan_samples
from lidarshard.transforms.io.arrow import ParquetStream, parquet_bytes
from tests.helpers import scored_pool


def _pieces(n: int, seed: int, cfg: PlanConfig, shard: int) -> dict[int, list[pa.Table]]:
    """Each rank's pieces of epoch 0, read back from Parquet as the build reads them."""
    scored = scored_pool(n, seed)
    part = plan_writer.assignment(plan_samples(scored.select(plan_writer.NUMERIC_INPUT), 0, cfg).plan)
    pieces: dict[int, list[pa.Table]] = {}
    for start, stop in plan_writer.shard_bounds(n, shard):
        rows = scored.slice(start, stop - start)
        for rank, piece in plan_writer.rank_pieces(
            rows, start, plan_writer.slice_rows(part, start, stop)
        ).items():
            pieces.setdefault(rank, []).append(pq.read_table(pa.BufferReader(parquet_bytes(piece))))
    return pieces


def _reader(pieces: list[pa.Table], calls: list | None = None) -> rank_stream.Read:
    def read(i: int, columns) -> pa.Table:
        if calls is not None:
            calls.append((i, columns))
        return pieces[i].select(list(columns)) if columns is not None else pieces[i]

    return read


def _written(batches) -> bytes:
    sink = io.BytesIO()
    with ParquetStream(sink, schemas.plan_schema()) as out:
        for batch in batches:
            out.write(batch)
    return sink.getvalue()


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(20, 300),
    w=st.integers(1, 4),
    shard=st.integers(8, 120),
    rows=st.integers(1, 40),
    spills=st.integers(1, 4),
    reverse=st.booleans(),
    strategy=st.sampled_from(["random", "mixed", "budget"]),
)
def test_streamed_batches_are_the_joined_writers(n, w, shard, rows, spills, reverse, strategy) -> None:
    """Any piece order, row group size and number of passes: ``rank_batches``'s batches exactly, and the
    same file bytes as ``finish_rank``'s table."""
    cfg = PlanConfig(world_size=w, batch_size=2, strategy=strategy)
    pieces = _pieces(n, 0, cfg, shard)
    old = rank_stream.OPEN_SPILLS
    rank_stream.OPEN_SPILLS = spills
    try:
        for r in range(w):
            mine = pieces.get(r, [])[:: -1 if reverse else 1]
            got = list(rank_stream.stream_rank(_reader(mine), len(mine), 0, r, rows=rows))
            want = list(plan_writer.rank_batches(mine, 0, r, rows=rows))
            assert len(got) == len(want)
            for a, b in zip(got, want, strict=True):
                assert a.equals(b) and a.schema == b.schema
            assert _written(got) == parquet_bytes(plan_writer.finish_rank(mine, 0, r))
    finally:
        rank_stream.OPEN_SPILLS = old


def test_one_piece_at_a_time_and_the_spill_goes(tmp_path: Path, monkeypatch) -> None:
    """Only (step, slot) columns are read before the spill; then each piece is read whole at most once
    per pass, each gone before the next is read; the spill directory is left empty."""
    cfg = PlanConfig(world_size=2, batch_size=3, strategy="mixed")
    pieces = _pieces(400, 1, cfg, 23)[0]
    monkeypatch.setattr(rank_stream, "OPEN_SPILLS", 3)
    calls: list = []
    alive: list[weakref.ref] = []
    read = _reader(pieces, calls)

    def tracked(i: int, columns) -> pa.Table:
        assert sum(r() is not None for r in alive) == 0, "a whole piece is still held"
        table = read(i, columns)
        if columns is None:
            table = table.slice(0)  # a table of its own, dropped by the writer
            alive.append(weakref.ref(table))
        return table

    batches = list(rank_stream.stream_rank(tracked, len(pieces), 0, 0, str(tmp_path), rows=10))
    groups = -(-sum(p.num_rows for p in pieces) // 10)
    passes = -(-groups // 3)
    assert [c for c in calls if c[1] is not None] == [(i, ("step", "slot")) for i in range(len(pieces))]
    whole = [i for i, c in calls if c is None]
    assert set(whole) == set(range(len(pieces))) and passes > 1 and len(whole) <= len(pieces) * passes
    assert len(batches) == groups and list(tmp_path.iterdir()) == []
    assert _written(batches) == parquet_bytes(plan_writer.finish_rank(pieces, 0, 0))


def test_no_pieces_give_one_empty_table() -> None:
    (empty,) = rank_stream.stream_rank(_reader([]), 0, 3, 1)
    assert empty.num_rows == 0 and empty.schema == schemas.plan_schema()


def test_rank_order_ties_keep_piece_order() -> None:
    """(step, slot) order, ties in piece order (Arrow's stable sort), and each row's row group."""
    order, group = plan_writer.rank_order(
        [(np.array([1, 0]), np.array([0, 1])), (np.array([0, 1]), np.array([1, 0]))], rows=3
    )
    assert order.tolist() == [1, 2, 0, 3] and group.tolist() == [0, 0, 0, 1]
    assert order.dtype == np.int32 and group.dtype == np.int32


@pytest.mark.parametrize("rows", [1, 7])
def test_rank_order_is_arrow_sort_indices(rows) -> None:
    rng = np.random.default_rng(rows)
    keys = [
        (rng.integers(0, 5, 30, dtype=np.int32), rng.integers(0, 3, 30, dtype=np.int32)) for _ in range(3)
    ]
    table = pa.table(
        {"step": np.concatenate([s for s, _ in keys]), "slot": np.concatenate([s for _, s in keys])}
    )
    want = pa.compute.sort_indices(table, sort_keys=[("step", "ascending"), ("slot", "ascending")])
    order, group = plan_writer.rank_order(keys, rows)
    assert order.tolist() == want.to_pylist()
    assert (group[order] == np.arange(90) // rows).all()

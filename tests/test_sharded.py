"""The sharded plan writer (``transforms.plan.sharded``) gives exactly the one-process oracle's rank files."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lidarshard import schemas
from lidarshard.transforms.core import plan_writer as sharded
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.planner import plan_samples
from lidarshard.transforms.io.arrow import ParquetStream, parquet_bytes
from lidarshard.transforms.plan.caps import Caps
from tests.helpers import scored_pool
from tests.plan_oracle import plan_tables


def _pieces(scored: pa.Table, epoch: int, cfg: PlanConfig, rows: int) -> dict[int, list[pa.Table]]:
    part = sharded.assignment(plan_samples(scored.select(sharded.NUMERIC_INPUT), epoch, cfg).plan)
    pieces: dict[int, list[pa.Table]] = {}
    for start, stop in sharded.shard_bounds(scored.num_rows, rows):
        got = sharded.rank_pieces(
            scored.slice(start, stop - start), start, sharded.slice_rows(part, start, stop)
        )
        for rank, piece in got.items():
            pieces.setdefault(rank, []).append(piece)
    return pieces


def _sharded_tables(
    scored: pa.Table, epoch: int, cfg: PlanConfig, rows: int, reverse: bool
) -> list[pa.Table]:
    pieces = _pieces(scored, epoch, cfg, rows)
    return [
        sharded.finish_rank(pieces.get(r, [])[:: -1 if reverse else 1], epoch, r)
        for r in range(cfg.world_size)
    ]


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(20, 400),
    w=st.integers(1, 5),
    b=st.integers(1, 4),
    strategy=st.sampled_from(["random", "balanced", "mixed", "budget"]),
    policy=st.sampled_from(["drop_last", "pad"]),
    rows=st.integers(1, 200),
    reverse=st.booleans(),
    seed=st.integers(0, 3),
)
def test_pieces_make_the_same_rank_files(n, w, b, strategy, policy, rows, reverse, seed) -> None:
    scored = scored_pool(n, seed)
    cfg = PlanConfig(world_size=w, batch_size=b, strategy=strategy, policy=policy, weights=(1.0, 2.0, 0.5))
    try:
        want, _ = plan_tables(scored, 1, cfg)
    except ValueError as e:  # bucket weights below 1 can leave fewer than W*B samples: both paths refuse
        assert "do not fill one step" in str(e)
        with pytest.raises(ValueError, match="do not fill one step"):
            _sharded_tables(scored, 1, cfg, rows, reverse)
        return
    got = _sharded_tables(scored, 1, cfg, rows, reverse)
    for r in range(w):
        assert got[r].equals(want[r])
        assert parquet_bytes(got[r]) == parquet_bytes(want[r])


def test_pieces_round_trip_through_parquet_keep_the_schema() -> None:
    """Pieces are stored as Parquet; read back, list items are named 'element': the file is unchanged."""
    scored = scored_pool(300, 0)
    cfg = PlanConfig(world_size=3, batch_size=2, caps=Caps(max_points=5000), strategy="budget")
    want, _ = plan_tables(scored, 0, cfg)
    part = sharded.assignment(plan_samples(scored.select(sharded.NUMERIC_INPUT), 0, cfg).plan)
    pieces = sharded.rank_pieces(scored, 0, sharded.slice_rows(part, 0, 300))
    back = {r: pa.BufferReader(parquet_bytes(p)) for r, p in pieces.items()}
    import pyarrow.parquet as pq

    for r in range(3):
        table = sharded.finish_rank([pq.read_table(back[r])], 0, r)
        assert parquet_bytes(table) == parquet_bytes(want[r])


def test_rank_batches_stream_the_rank_file_a_row_group_at_a_time() -> None:
    """The rank writer's batches (any piece order, 16 rows each), streamed, are the one-process file."""
    scored = scored_pool(300, 1)
    cfg = PlanConfig(world_size=3, batch_size=2, strategy="mixed")
    want, _ = plan_tables(scored, 0, cfg)
    pieces = _pieces(scored, 0, cfg, 37)
    for r in range(3):
        batches = list(sharded.rank_batches(pieces[r][::-1], 0, r, rows=16))
        assert len(batches) > 1 and max(b.num_rows for b in batches) == 16
        sink = io.BytesIO()
        with ParquetStream(sink, schemas.plan_schema()) as out:
            for batch in batches:
                out.write(batch)
        assert sink.getvalue() == parquet_bytes(want[r])
    (empty,) = sharded.rank_batches([], 0, 0)
    assert empty.num_rows == 0 and empty.schema == schemas.plan_schema()


def test_slice_rows_and_bounds() -> None:
    assert sharded.shard_bounds(0) == []
    assert sharded.shard_bounds(5, 2) == [(0, 2), (2, 4), (4, 5)]
    part = {"row": np.array([0, 1, 1, 3, 4]), "rank": np.arange(5)}
    assert sharded.slice_rows(part, 1, 4)["rank"].tolist() == [1, 2, 3]
    three = scored_pool(3, 0).select(sharded.NUMERIC_INPUT).set_column(3, "weight", pa.array([1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="do not fill one step"):
        plan_samples(three, 0, PlanConfig(world_size=4, batch_size=1))

"""The in-memory plan writer, kept only as a test oracle: one process takes every planned row from the
whole scored table. The build writes plan files in shards (``transforms.plan.sharded``) and must give
exactly these tables."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from lidarshard import schemas
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.plan_writer import plan_rows
from lidarshard.transforms.core.planner import plan_samples


def plan_tables(scored: pa.Table, epoch: int, cfg: PlanConfig) -> tuple[list[pa.Table], dict]:
    """One epoch's plan as W tables (rank order) of ``plan_schema()``, sorted by (step, slot), and its stats."""
    planned = plan_samples(scored, epoch, cfg)
    rows = plan_rows(planned.plan)
    cols = scored.select(["sample_id", "path", "sweep_paths", "cost", "bucket_id"])
    taken = cols.take(pa.array(rows.pop("row"))).combine_chunks()
    fixed = {name: pa.array(values) for name, values in rows.items()}
    fixed["epoch"] = pa.array(np.full(len(rows["rank"]), epoch, np.int32))
    fixed["rank"] = pa.array(rows["rank"].astype(np.int32))
    arrays = [fixed[f.name] if f.name in fixed else taken.column(f.name) for f in schemas.plan_schema()]
    table = pa.Table.from_arrays(arrays, schema=schemas.plan_schema())
    w = planned.plan.shape[1]
    ends = np.cumsum(np.bincount(rows["rank"], minlength=w))
    starts = ends - np.bincount(rows["rank"], minlength=w)
    return [table.slice(int(a), int(e - a)) for a, e in zip(starts, ends, strict=True)], planned.stats

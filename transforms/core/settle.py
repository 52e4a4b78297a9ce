"""Settle a prepared source one samples part at a time, a row group at a time. Pure.

``score.settle_and_score``'s first pass: for each row group, its costs (the cost model's, or the
``cost`` column a user gave), its repeated sample ids and the samples over a cap become rejects; each
new samples part's ``keep`` mask and its kept rows' costs are parked in the build's scratch directory
(``previous.park_keep``, ``park_costs``) as the pass leaves it. What stays whole is the keep mask
(1 byte an input row) and the reject rows; the exact quantile edges read the parked costs back a
part at a time (``costs_by_part``, ``epochs.streamed_bucket_edges``), never all at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.transforms.core import previous
from lidarshard.transforms.features.accounting import duplicate_rejects
from lidarshard.transforms.features.cost import CostModel, sample_costs
from lidarshard.transforms.io.arrow import row_groups
from lidarshard.transforms.io.scratch import read_columns, scores_path, write_columns
from lidarshard.transforms.plan.caps import over_cap

__all__ = [
    "Settled",
    "StoredPaths",
    "settle_parts",
    "null_counts",
    "model_costs",
    "park_costs",
    "parked_costs",
    "costs_by_part",
]

#: The columns whose nulls (in any row) change how every row is costed (``cost.sample_costs``).
NULLABLE = ("num_in_range", "occupied_voxels")


class StoredPaths:
    """Columns of chosen rows of the source, for reject lines: paths stored the way new rejects are."""

    def __init__(self, file, roots: tuple[str | None, str | None], reroot: bool) -> None:
        self.file, self.roots, self.reroot = file, roots, reroot

    def paths(self, rows: NDArray[np.int64]) -> list[str]:
        found = previous.paths_at(self.file, rows)
        if not self.reroot:
            return found
        return previous.reroot(pa.table({"path": found}), self.roots).column("path").to_pylist()

    def ids(self, rows: NDArray[np.int64]) -> list[str]:
        return previous.paths_at(self.file, rows, "sample_id")


@dataclass(frozen=True)
class Settled:
    """What ``settle_parts`` settled: ``keep`` (N,) per input row; ``added`` the new reject rows (in
    input order, unsorted); ``tasks`` one parked ``PartTask`` per part with a kept row (its ``keep``
    and costs in scratch); ``kept`` each task's kept rows."""

    keep: NDArray[np.bool_]
    added: list[pa.Table]
    tasks: list[previous.PartTask]
    kept: list[int]


def settle_parts(
    file, paths: list[str], repeated: NDArray[np.bool_], costs_of, caps, stored: StoredPaths,
    extras: Sequence[str], part_rows: int, work: str, schema: pa.Schema,
) -> Settled:  # fmt: skip
    """Settle ``file`` (a ``ParquetParts`` of the files at ``paths``) part by part (``part_spans``).

    Args:
        repeated: (N,) rows that repeat an id (``previous.repeated_ids``); becomes ``keep`` in place.
        costs_of: ``costs_of(numeric row group, lacking) -> (n,) costs``; caps: ``PlanConfig.caps``.
        extras: the columns besides ``previous.NUMERIC`` that costs read; schema: the rejects'.
        work: the scratch directory the parts' arrays are parked under (``scratch.scores_path``).
    """
    lacking = null_counts(file)
    keep = np.logical_not(repeated, out=repeated)
    added: list[pa.Table] = []
    tasks: list[previous.PartTask] = []
    kept: list[int] = []
    groups = previous.numeric_groups(file, extras)
    for span in previous.part_spans(file, paths, part_rows):
        costs, row = [], span.rows[0]
        for _ in range(*span.groups):
            t = next(groups)
            n = t.num_rows
            cost = costs_of(t, lacking)
            added += _settle_group(t, cost, keep[row : row + n], row, caps, stored, lacking, schema)
            costs.append(cost[keep[row : row + n]])
            row += n
        mask = keep[span.rows[0] : span.rows[1]]
        count = int(mask.sum())
        if count:
            path = scores_path(work, len(tasks))
            previous.park_keep(path, mask)
            park_costs(path, np.concatenate(costs))
            none = np.empty(0)
            task = previous.PartTask(
                len(tasks), span.path, span.groups, mask, none, none.astype(np.int32), none, stored.roots
            )
            tasks.append(previous.parked(task))  # its arrays are in scratch
            kept.append(count)
    return Settled(keep, added, tasks, kept)


def null_counts(file) -> dict[str, int]:
    """{column of ``NULLABLE``: its nulls in every row of ``file``}, reading those columns only."""
    out = dict.fromkeys(NULLABLE, 0)
    for t in row_groups(file, list(NULLABLE)):
        for name in NULLABLE:
            out[name] += t.column(name).null_count
    return out


def _settle_group(
    numeric: pa.Table, cost: NDArray[np.float64], keep: NDArray[np.bool_], first: int, caps,
    stored: StoredPaths, lacking: Mapping[str, int], schema: pa.Schema,
) -> list[pa.Table]:  # fmt: skip
    """The reject rows of one row group (rows ``first`` on): its repeated ids (``keep`` False on entry)
    and its kept samples over a cap (set False in ``keep``)."""
    added = []
    repeated = np.flatnonzero(~keep)
    if repeated.size:
        rows = repeated + first
        added.append(pa.Table.from_pylist(duplicate_rejects(stored.paths(rows), stored.ids(rows)), schema))
    if caps.active:
        candidates = np.flatnonzero(keep)
        points = numeric.column("num_points").to_numpy(zero_copy_only=False)[candidates]
        memory = None if caps.memory is None else caps.memory.model.sample_bytes(numeric, lacking)[candidates]
        details = over_cap(cost[candidates], points, caps, memory)
        bad = candidates[[bool(d) for d in details]] if len(details) else candidates[:0]
        if bad.size:
            keep[bad] = False
            text = [d for d in details if d]
            over = {"path": stored.paths(bad + first), "reason": ["over_cap"] * bad.size, "detail": text}
            added.append(pa.Table.from_pydict(over, schema=schema))
    return added


def model_costs(model: CostModel, given: bool):
    """``costs_of`` for ``settle_parts``: the model's costs of a row group, or (``given``) its ``cost``
    column checked (finite, >= 0)."""

    def costs_of(numeric: pa.Table, lacking: Mapping[str, int]) -> NDArray[np.float64]:
        if not given:
            return sample_costs(numeric, model, lacking)
        col = numeric.column("cost")
        cost = col.to_numpy(zero_copy_only=False).astype(np.float64) if not col.null_count else None
        if cost is None or not (np.isfinite(cost).all() and (cost >= 0).all()):
            raise ValueError("cost must hold one finite value >= 0 per sample")
        return cost

    return costs_of


def park_costs(path: str, cost: NDArray[np.float64]) -> None:
    """Write a part's (kept,) costs to the scratch file ``path`` + ``.cost``."""
    write_columns(f"{path}.cost", {"cost": cost})


def parked_costs(path: str) -> NDArray[np.float64]:
    """The (kept,) costs ``park_costs`` wrote for ``path``."""
    return read_columns(f"{path}.cost")["cost"]


def costs_by_part(settled: Settled, work: str) -> Callable[[], Iterator[NDArray[np.float64]]]:
    """``chunks()`` for ``epochs.streamed_bucket_edges``: each part's parked (kept,) costs in turn."""
    return lambda: (parked_costs(scores_path(work, task.part)) for task in settled.tasks)

"""The rows ``lidarshard.write_manifest`` is given, checked before Beam starts, naming the first bad row.

The build core still refuses what it cannot plan (``transforms.core.score``), but from inside a Beam step,
after the run started and in its own words ("cost must hold one finite value >= 0 per sample"). Here each
input row is checked where it enters: the error names its index in the caller's table and its
``sample_id``, as one line.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.pipelines.flags import UsageError
from lidarshard.transforms.features.cost import CostModel, sample_costs

__all__ = ["COUNT_COLUMNS", "check_rows"]

#: Sample columns that count something (points, voxels, bytes, sweeps): never negative where given.
COUNT_COLUMNS = (
    "file_bytes",
    "num_points",
    "num_finite",
    "num_in_range",
    "occupied_voxels",
    "num_sweeps",
    "path_bytes",
)


def _row(table: pa.Table, i: int) -> str:
    """``row I (sample_id 'S')``: input row ``i`` as the caller knows it."""
    return f"row {i} (sample_id {table.column('sample_id')[i].as_py()!r})"


def _first(bad: NDArray[np.bool_]) -> int | None:
    hits = np.flatnonzero(bad)
    return int(hits[0]) if hits.size else None


def _nulls(col: pa.ChunkedArray) -> NDArray[np.bool_]:
    return col.is_null().to_numpy(zero_copy_only=False)


def _check_present(table: pa.Table) -> None:
    for name in ("sample_id", "path"):
        i = _first(_nulls(table.column(name)))
        if i is not None:
            where = f"row {i}" if name == "sample_id" else _row(table, i)
            raise UsageError(f"samples: {where} has no {name} (null)")


def _check_counts(table: pa.Table) -> None:
    for name in COUNT_COLUMNS:
        values = table.column(name).to_numpy(zero_copy_only=False)
        if values.dtype == object:  # nulls: not recorded, checked below where the cost model reads it
            values = np.array([-1 if v is None else v for v in values], np.int64)
            given = ~_nulls(table.column(name))
        else:
            given = np.ones(values.shape, bool)
        i = _first(given & (values < 0))
        if i is not None:
            raise UsageError(
                f"samples: {_row(table, i)} has {name} {int(values[i])}: a count, never negative"
            )


def _model_columns(table: pa.Table, model: CostModel) -> list[str]:
    """The size columns ``sample_costs`` reads for ``model`` (as it picks them)."""
    names = []
    if model.a:
        in_range = table.column("num_in_range").null_count == 0
        names.append("num_in_range" if in_range else "num_points")
    if model.b:
        names.append("occupied_voxels")
    return names


def check_rows(table: pa.Table, cost: pa.ChunkedArray | None, model: CostModel | None) -> None:
    """Every row of ``table`` (the samples schema, in the caller's order) can be planned.

    Args:
        table: (N rows) the caller's samples cast to ``schemas.sample_schema()``.
        cost: the given ``cost`` column (N,) when the costs come with the samples, else None.
        model: the cost model computing the costs from size columns when ``cost`` is None.

    Raises:
        UsageError: a row without ``sample_id`` or ``path``; a negative count; a missing,
            NaN, infinite or negative cost, or a size column the model needs missing -- naming the row.
    """
    _check_present(table)
    _check_counts(table)
    if cost is None:
        assert model is not None
        for name in _model_columns(table, model):
            i = _first(_nulls(table.column(name)))
            if i is not None:
                raise UsageError(
                    f"samples: the cost model {model.name!r} reads {name}, but {_row(table, i)} has none; "
                    "give that column or a cost column"
                )
        values = sample_costs(table, model)
        what = f"cost model {model.name!r} gives"
    else:
        i = _first(_nulls(cost))
        if i is not None:
            raise UsageError(f"samples: {_row(table, i)} has no cost (null); give every row a cost")
        values = cost.to_numpy()
        what = "cost"
    i = _first(~(np.isfinite(values) & (values >= 0)))
    if i is not None:
        raise UsageError(f"samples: {_row(table, i)}: {what} {values[i]}; costs are finite numbers >= 0")

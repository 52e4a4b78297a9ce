"""The samples ``lidarshard.write_manifest`` is given, cast to ``schemas.sample_schema()`` column by column (a count
given as booleans or text is refused, not converted) and checked row by row before Beam starts: an error names
the row's index in the caller's table and its ``sample_id``, in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.features import repeat
from lidarshard.transforms.features.cost import CostModel, sample_costs
from lidarshard.transforms.io.paths import PATH_COLUMNS, bad_path, path_problem
from lidarshard.transforms.value_checks import UsageError

__all__ = ["COUNT_COLUMNS", "as_table", "samples_table", "check_rows"]

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


def as_table(samples: Any) -> pa.Table:
    """A Table, a pandas DataFrame (index dropped), a list of dicts (a key a row lacks: null) or an Arrow stream
    (polars) as a pyarrow Table."""
    if isinstance(samples, pa.Table):
        return samples
    if isinstance(samples, list):
        bad = next((type(row).__name__ for row in samples if not isinstance(row, Mapping)), None)
        if bad is not None:
            raise UsageError(f"samples: a list of samples must hold dicts (one per sample), not {bad}")
        columns = {}
        for name in dict.fromkeys(k for row in samples for k in row):
            try:
                columns[name] = pa.array([row.get(name) for row in samples])
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise UsageError(f"samples: key {name!r} holds values of mixed types: {e}") from None
        return pa.table(columns)
    if type(samples).__module__.split(".")[0] == "pandas":
        return pa.Table.from_pandas(samples, preserve_index=False)
    if hasattr(samples, "__arrow_c_stream__"):
        return pa.table(samples)
    raise UsageError(
        f"samples must be a pyarrow Table, a pandas DataFrame or a list of dicts, not {type(samples).__name__}"
    )


def _cast(col: pa.ChunkedArray, name: str, want: pa.DataType) -> pa.ChunkedArray:
    """Column ``name`` as ``want``: no booleans or text read as numbers, no numbers as text (2 sorts after 12)."""
    kind = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
    target = want.value_type if pa.types.is_list(want) else want
    if pa.types.is_list(kind) and pa.types.is_list(want):
        kind = kind.value_type
    numeric = pa.types.is_integer(target) or pa.types.is_floating(target)
    if (numeric and (pa.types.is_boolean(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind))) or (
        pa.types.is_string(target) and (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind))
    ):  # fmt: skip
        if name == "sample_id":
            raise UsageError(
                f"samples: sample_id must be strings, not {kind} (ids are sorted as text: 2 would come after 12); "
                'convert them zero-padded, e.g. f"{i:08d}", or df["sample_id"].map("{:08d}".format) in pandas'
            )
        raise UsageError(f"samples: column {name} holds {kind} values, not {target}: give {name} as {target}")
    try:
        return col.cast(want)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise UsageError(f"samples: column {name} ({col.type}) is not {want}: {e}") from None


def samples_table(table: pa.Table, model: CostModel | None, plan: PlanConfig) -> pa.Table:
    """The caller's samples checked (``check_rows``) as the samples schema, plus ``cost`` when given (``model``
    None) and ``plan``'s ``--sample-weights`` column, sorted by (sample_id, path)."""
    if table.num_rows == 0:
        raise UsageError("samples: no rows: a manifest plans at least one sample")
    missing = [c for c in ("sample_id", "path") if c not in table.column_names]
    if missing:
        raise UsageError(f"samples: missing column(s) {', '.join(missing)}")
    n, want = table.num_rows, schemas.sample_schema()
    defaults = {
        "sweep_paths": pa.array([[]] * n, want.field("sweep_paths").type),
        "sweep_transforms": pa.array([[]] * n, want.field("sweep_transforms").type),
        "has_labels": pa.array(np.zeros(n, bool)),
    }
    cols = []
    for f in want:
        if f.name in table.column_names:
            cols.append(_cast(table.column(f.name), f.name, f.type))
        elif f.name == "num_sweeps":
            cols.append(pc.list_value_length(cols[want.get_field_index("sweep_paths")]).cast(f.type))
        else:
            cols.append(defaults.get(f.name, pa.nulls(n, f.type)))
    out = pa.Table.from_arrays(cols, schema=want)
    cost = _cast(table.column("cost"), "cost", pa.float64()) if model is None else None
    check_rows(out, cost, model)
    if cost is not None:
        out = out.append_column("cost", cost)
    weights = plan.repeat.column
    if weights is not None:
        try:
            w = repeat.check_weights(table, weights, plan.max_plan_factor)
        except ValueError as e:
            raise UsageError(f"sample_weights {e}") from None
        if weights in out.column_names:
            raise UsageError(f"sample_weights {weights}: a samples column, not a weight column")
        out = out.append_column(weights, pa.array(w, pa.float64()))
    if plan.repeat.threshold is not None and out.column("label_path").null_count == n:
        raise UsageError("repeat_factors: no sample has a label_path (lidarseg labels) to read")
    return out.sort_by([("sample_id", "ascending"), ("path", "ascending")])


def _row(table: pa.Table, i: int) -> str:  # input row i as the caller knows it
    return f"row {i} (sample_id {table.column('sample_id')[i].as_py()!r})"


def _first(bad: NDArray[np.bool_] | pa.ChunkedArray) -> int | None:
    hits = np.flatnonzero(bad if isinstance(bad, np.ndarray) else bad.to_numpy(zero_copy_only=False))
    return int(hits[0]) if hits.size else None


def _nulls(col: pa.ChunkedArray) -> NDArray[np.bool_]:
    return col.is_null().to_numpy(zero_copy_only=False)


def _check_values(table: pa.Table) -> None:
    """Ids and paths present and storable (full, no NUL byte), counts >= 0, one finite lag >= 0 per sweep."""
    for name in ("sample_id", "path"):
        i = _first(_nulls(table.column(name)))
        if i is not None:
            raise UsageError(
                f"samples: {f'row {i}' if name == 'sample_id' else _row(table, i)} has no {name} (null)"
            )
    for name in PATH_COLUMNS:  # what no path may be (paths.bad_path), named by its row
        col = table.column(name).combine_chunks()
        many = pa.types.is_list(col.type)
        flat = pc.list_flatten(col) if many else col
        i = _first(pc.fill_null(pc.or_(pc.equal(flat, ""), pc.match_substring(flat, "\0")), False))
        if i is not None:
            row = int(pc.list_parent_indices(col)[i].as_py()) if many else i
            raise UsageError(f"samples: {_row(table, row)}: {name} {bad_path(flat[i].as_py())}")
    problem = path_problem(table, None)  # write_manifest records no path_root: the paths are stored as given
    if problem:
        raise UsageError(f"samples: {problem}: pass full paths or URIs (e.g. os.path.abspath)")
    for name in COUNT_COLUMNS:
        col = table.column(name)
        i = _first(pc.fill_null(pc.less(col, 0), False))
        if i is not None:
            raise UsageError(
                f"samples: {_row(table, i)} has {name} {col[i].as_py()}: a count, never negative"
            )
    lags = table.column("sweep_time_lags").combine_chunks()
    flat = pc.list_flatten(lags).to_numpy(zero_copy_only=False)
    counts = pc.list_value_length(table.column("sweep_paths"))
    bad = np.array(pc.fill_null(pc.not_equal(pc.list_value_length(lags), counts), False), dtype=bool)
    bad[pc.list_parent_indices(lags).to_numpy()[~(np.isfinite(flat) & (flat >= 0))]] = True
    i = _first(bad)
    if i is not None:
        raise UsageError(
            f"samples: {_row(table, i)} has sweep_time_lags {lags[i].as_py()}: one finite number of seconds "
            "(>= 0) per sweep path"
        )


def check_rows(table: pa.Table, cost: pa.ChunkedArray | None, model: CostModel | None) -> None:
    """Every row of ``table`` (N rows, the samples schema, the caller's order) can be planned: its values, and a
    finite cost >= 0, given (``cost``, (N,)) or of the size columns ``model`` reads; else UsageError naming it."""
    _check_values(table)
    if cost is None:
        assert model is not None
        in_range = "num_in_range" if table.column("num_in_range").null_count == 0 else "num_points"
        for name in [in_range] * bool(model.a) + ["occupied_voxels"] * bool(model.b):  # as sample_costs picks
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

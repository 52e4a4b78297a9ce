"""The Python API of the pipeline side: ``lidarshard.build`` and ``lidarshard.write_manifest``.

Both take the command's flags as keyword arguments (``--bucket-weights`` -> ``bucket_weights``): the
fields of ``lidarshard.pipelines.options.BuildOptions``, checked as typed values by the validators the
command line uses (a bad value raises :class:`~lidarshard.pipelines.flags.UsageError`, a ``ValueError``,
with the same one line), and run the same build core and the same publish, returning the same summary::

    summary = lidarshard.build("data/", "out/", world_size=8, batch_size=2, epochs=3, runner="FnApiRunner")
    summary = lidarshard.write_manifest(infos_df, "out/", 8, 2, epochs=3)   # your own sample list, no scan

``write_manifest`` is for users who already have their samples (an mmdet3d/OpenPCDet infos file, a
dataframe): a pyarrow Table, pandas DataFrame or list of dicts with ``sample_id`` (strings), ``path``
(full paths) and either ``cost`` or the size columns the cost model needs (``num_points``/
``num_in_range``, ``occupied_voxels``). The table is written as one samples part and built like
``lidarshard build OUT --from-samples``, in this process (Beam's in-memory runner): the same samples
give the same plan files.

Needs Apache Beam (``pip install "lidarshard[pipeline]"``); ``import lidarshard`` names that extra when
``lidarshard.build`` or ``lidarshard.write_manifest`` is asked for without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lidarshard import schemas
from lidarshard.pipelines import build as build_cmd
from lidarshard.pipelines import launch
from lidarshard.pipelines.api_output import beam_output_held
from lidarshard.pipelines.checks import check_locations
from lidarshard.pipelines.flags import UsageError
from lidarshard.pipelines.options import BuildOptions, table_keys
from lidarshard.pipelines.preflight import build_settings, table_settings
from lidarshard.pipelines.preflight import cost_model as parse_cost_model
from lidarshard.pipelines.runners import check_workers_reach, run_paths
from lidarshard.pipelines.samples_input import check_rows
from lidarshard.pipelines.settings import check_plan_size
from lidarshard.schemas.manifest import Manifest
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.score import GIVEN, PREPARED, Source
from lidarshard.transforms.features import repeat
from lidarshard.transforms.features.cost import CostModel
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import parquet_bytes
from lidarshard.transforms.io.metadata import load_manifest
from lidarshard.transforms.io.paths import path_problem

__all__ = ["build", "replan", "write_manifest", "summary"]


def summary(out: str) -> dict:
    """The numbers of a written manifest: out, counts, steps_per_epoch, buckets, balance per epoch."""
    m = load_manifest(out)
    return {
        "out": out,
        "world_size": m.world_size,
        "batch_size": m.batch_size,
        "epochs": m.epochs,
        "strategy": m.strategy,
        "counts": m.counts.to_json(),
        "steps_per_epoch": list(m.steps_per_epoch),
        "buckets": m.buckets.to_json(),
        "balance": [b.to_json() for b in m.balance],
    }


def build(
    input: str | Sequence[str] | None,
    out: str,
    *,
    world_size: int,
    batch_size: int,
    runner: str | None = None,
    pipeline_args: Sequence[str] = (),
    **flags: Any,
) -> dict:
    """Run ``lidarshard build`` in this process; returns :func:`summary` of the published OUT.

    Args:
        input: INPUT (``[NAME=]PATH``: a directory, glob or dataset root; see docs/CLI.md's dataset
            layouts), or several of them for one plan; None with ``from_samples=...``.
        out: OUT, replaced atomically on success.
        world_size, batch_size: W ranks, B samples per rank per step.
        runner: Beam runner name (``FnApiRunner``, ``DataflowRunner``, ...); default as the CLI.
        pipeline_args: further Beam flags, e.g. ``["--direct_num_workers=2"]``.
        **flags: any other ``build`` flag in snake case (``epochs=3``, ``bucket_weights=(1, 2)``, ``pad=True``).

    Raises:
        UsageError: a bad flag, value or path (the CLI's exit 2), before Beam starts.
        Exception: the run failed (the CLI's exit 1); nothing was published.
    """
    inputs = [] if input is None else [input] if isinstance(input, str) else list(input)
    opts = BuildOptions.from_keywords({"world_size": world_size, "batch_size": batch_size} | flags)
    return _run(opts, [*inputs, out], runner, pipeline_args)


def _run(
    opts: BuildOptions,
    paths: list[str],
    runner: str | None,
    pipeline_args: Sequence[str],
    replan: tuple[PlanConfig, Manifest] | None = None,
) -> dict:
    """The checked build of ``opts`` (``replan``: see ``preflight.build_settings``) run and published."""
    beam_argv = [*([f"--runner={runner}"] if runner else []), *pipeline_args]
    dry_run = launch.dry_run_requested(beam_argv)
    settings = build_settings(opts, paths, dry_run, replan)
    check_workers_reach(beam_argv, run_paths(settings), opts.shared_filesystem)
    if not dry_run:  # a dry run works offline
        check_locations(beam_argv)
    with beam_output_held():
        built = build_cmd.launch_build(settings, beam_argv)
    if not built:
        return {"out": settings.output, "dry_run": True}
    return summary(settings.output)


def replan(
    out: str,
    new_out: str,
    from_epoch: int,
    cost_model: str,
    *,
    epochs: int | None = None,
    runner: str | None = None,
    pipeline_args: Sequence[str] = (),
) -> dict:
    """Re-plan manifest ``out`` from epoch ``from_epoch`` on with ``cost_model`` (``@fit.json`` from
    ``lidarshard calibrate``) into ``new_out``: ``build new_out --from-samples out/samples --replan-from E``
    with ``out``'s own plan settings, constructed from the manifest read here once
    (``replan.replan_options``). Epochs before E keep ``out``'s plan byte for byte; a running sampler
    moves to ``new_out`` with ``switch_plan(new_out)``. Returns :func:`summary`.

    Raises:
        UsageError: ``out`` is not a committed manifest, ``from_epoch`` is not an int (None is refused:
            a re-plan keeps the epochs before it; ``lidarshard.build`` plans every epoch anew) or is outside
            its epochs, a bad model.
    """
    from lidarshard.pipelines.replan import replan_options

    try:
        m = load_manifest(out)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(f"replan: {e}") from None
    if isinstance(from_epoch, bool) or not isinstance(from_epoch, (int, np.integer)):
        raise UsageError(
            f"replan: from_epoch must be the first epoch to re-plan, an int >= 1 (the epochs before "
            f"it keep {out}'s plan), not {from_epoch!r}; to plan every epoch anew use lidarshard.build"
        )
    samples = storage.join(out, schemas.SAMPLES_DIR)
    opts, cfg = replan_options(m, samples, from_epoch, cost_model, epochs)
    return _run(opts, [new_out], runner, pipeline_args, (cfg, m))


def write_manifest(
    samples: Any,
    out: str,
    world_size: int,
    batch_size: int,
    *,
    rejects: pa.Table | None = None,
    cost_model: str | None = None,
    **flags: Any,
) -> dict:
    """Plan and write a manifest from your own sample list (no scan), in this process; returns :func:`summary`.

    Args:
        samples: pyarrow Table, pandas DataFrame or list of dicts, one row per sample: ``sample_id``
            (strings; ids are sorted as text, so zero-pad numbers), ``path`` (full paths or URIs), and
            ``cost`` or the size columns of ``lidarshard.schemas.SAMPLE_FIELDS`` the cost model reads;
            other sample columns (``sweep_paths``, ...) are kept when present.
        out: OUT directory (local or any Beam filesystem), replaced atomically.
        world_size, batch_size: W ranks, B samples per rank per step.
        rejects: rows already rejected upstream (``lidarshard.schemas.reject_schema()``), kept in
            rejects.parquet and the counts.
        cost_model: as ``--cost-model``; None uses the ``cost`` column when there is one, else voxels.
        **flags: the flags of the plan and output groups in snake case (``epochs``, ``seed``, ``strategy``,
            ``buckets``, ``bucket_weights``, ``pad``, ``max_plan_factor``, ``max_reject_fraction``,
            ``part_rows``, caps); ``sample_weights="COLUMN"`` takes per-sample weights from that column
            of ``samples``, ``repeat_factors="lidarseg:t=T"`` reads each ``label_path`` (as given).

    Raises:
        UsageError: a bad flag, value or column, before anything is written.
        Exception: the build failed; nothing was published.
    """
    unknown = sorted(set(flags) - table_keys())
    if unknown:
        raise UsageError(f"write_manifest takes the plan flags only, not {', '.join(unknown)}")
    samples = _as_table(samples)
    given = cost_model is None and "cost" in samples.column_names
    size = {"world_size": world_size, "batch_size": batch_size, "cost_model": cost_model}
    args = BuildOptions.from_keywords(size | flags)
    model = GIVEN if given else parse_cost_model(args.cost_model)
    settings = table_settings(args, out, model)
    table = _samples_table(samples, args, None if given else model)
    check_plan_size(settings.cfg, table.num_rows, "the table")
    if given and pc.count_distinct(table.column("sample_id")).as_py() != table.num_rows:
        raise UsageError("samples: sample_id must be unique when a cost column is given")
    rejects = (
        schemas.reject_schema().empty_table() if rejects is None else rejects.cast(schemas.reject_schema())
    )

    def stage(staging: str) -> Source:
        path = storage.join(staging, schemas.WORK_DIR, PREPARED, schemas.part_name(0))
        storage.write_bytes(path, parquet_bytes(table))
        return Source((path,), rejects, ordered=True)

    with beam_output_held():
        build_cmd.launch_build(settings, [], stage, launch.LOCAL_RUNNER)
    return summary(settings.output)


def _as_table(samples: Any) -> pa.Table:
    """``write_manifest``'s samples as a pyarrow Table: a Table, a pandas DataFrame (its index
    dropped), a list of dicts (the union of their keys; a key a row lacks is null there), or any
    object with the Arrow stream interface (polars)."""
    if isinstance(samples, pa.Table):
        return samples
    if isinstance(samples, list):
        bad = next((type(row).__name__ for row in samples if not isinstance(row, Mapping)), None)
        if bad is not None:
            raise UsageError(f"samples: a list of samples must hold dicts (one per sample), not {bad}")
        names = list(dict.fromkeys(k for row in samples for k in row))
        columns = {}
        for name in names:
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


def _given_cost(table: pa.Table) -> pa.ChunkedArray:
    """The given ``cost`` column as float64 (N,)."""
    try:
        return table.column("cost").cast(pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise UsageError(f"samples: column cost ({table.column('cost').type}) is not a number: {e}") from None


def _check_ids(table: pa.Table) -> None:
    """The samples have ``sample_id`` and ``path``, and the ids are not numbers: ids are strings sorted as
    text, so integer ids (id 2 after id 12) are refused rather than converted."""
    missing = [c for c in ("sample_id", "path") if c not in table.column_names]
    if missing:
        raise UsageError(f"samples: missing column(s) {', '.join(missing)}")
    kind = table.schema.field("sample_id").type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        raise UsageError(
            f"samples: sample_id must be strings, not {kind} (ids are sorted as text: 2 would come after 12); "
            'convert them zero-padded, e.g. f"{i:08d}", or df["sample_id"].map("{:08d}".format) in pandas'
        )


def _samples_table(table: pa.Table, args: BuildOptions, model: CostModel | None) -> pa.Table:
    """The samples -> the samples schema (plus ``cost`` and the ``sample_weights`` column when given),
    sorted by (sample_id, path); each row checked first (``samples_input.check_rows``: ``model`` None
    when the costs are the given ``cost`` column)."""
    if table.num_rows == 0:
        raise UsageError("samples: no rows: a manifest plans at least one sample")
    _check_ids(table)
    n = table.num_rows
    want = schemas.sample_schema()
    defaults = {
        "sweep_paths": pa.array([[]] * n, want.field("sweep_paths").type),
        "sweep_transforms": pa.array([[]] * n, want.field("sweep_transforms").type),
        "has_labels": pa.array(np.zeros(n, bool)),
    }
    cols = []
    for f in want:
        if f.name in table.column_names:
            col = table.column(f.name)
            try:
                cols.append(col.cast(f.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise UsageError(f"samples: column {f.name} ({col.type}) is not {f.type}: {e}") from None
        elif f.name == "num_sweeps":
            cols.append(pc.list_value_length(cols[want.get_field_index("sweep_paths")]).cast(f.type))
        else:
            cols.append(defaults.get(f.name, pa.nulls(n, f.type)))
    out = pa.Table.from_arrays(cols, schema=want)
    cost = _given_cost(table) if model is None else None
    check_rows(out, cost, model)
    problem = path_problem(out, None)  # write_manifest records no path_root: the paths are stored as given
    if problem:
        raise UsageError(f"samples: {problem}: pass full paths or URIs (e.g. os.path.abspath)")
    if cost is not None:
        out = out.append_column("cost", cost)
    if args.sample_weights is not None:
        try:
            w = repeat.check_weights(table, args.sample_weights, args.max_plan_factor)
        except ValueError as e:
            raise UsageError(f"sample_weights {e}") from None
        if args.sample_weights in [*out.column_names, "cost"]:
            raise UsageError(f"sample_weights {args.sample_weights}: a samples column, not a weight column")
        out = out.append_column(args.sample_weights, pa.array(w, pa.float64()))
    if args.repeat_factors is not None and out.column("label_path").null_count == n:
        raise UsageError("repeat_factors: no sample has a label_path (lidarseg labels) to read")
    return out.sort_by([("sample_id", "ascending"), ("path", "ascending")])

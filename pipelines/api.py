"""The Python API of the pipeline side: ``lidarshard.build`` and ``lidarshard.write_manifest``.

Both take the command's flags as keyword arguments (``--bucket-weights`` -> ``bucket_weights``): the
options of ``lidarshard.pipelines.options.BuildOptions``, checked as typed values by the checks the command
line parses with (a bad value raises :class:`~lidarshard.transforms.declare.UsageError`, a ``ValueError``,
with the same one line; ``os.PathLike`` paths, numpy numbers and arrays are taken), and run the same build
core and the same publish, returning the same summary::

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

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lidarshard import schemas
from lidarshard.pipelines import build as build_cmd
from lidarshard.pipelines import launch
from lidarshard.pipelines.api_output import beam_output_held
from lidarshard.pipelines.checks import check_locations
from lidarshard.pipelines.options import TABLE_KEYS, BuildOptions
from lidarshard.pipelines.options import cost_model as parse_cost_model
from lidarshard.pipelines.preflight import build_settings, table_settings
from lidarshard.pipelines.replan import continued
from lidarshard.pipelines.runners import check_workers_reach, run_paths
from lidarshard.pipelines.samples_input import as_table, samples_table
from lidarshard.pipelines.settings import check_plan_size
from lidarshard.transforms.core.manifest_writer import Kept
from lidarshard.transforms.core.score import GIVEN, PREPARED, Source
from lidarshard.transforms.declare import from_keywords, keyword
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import parquet_bytes
from lidarshard.transforms.io.metadata import load_manifest
from lidarshard.transforms.value_checks import UsageError

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
    input: Any,
    out: Any,
    *,
    world_size: int,
    batch_size: int,
    runner: str | None = None,
    pipeline_args: Sequence[str] = (),
    **flags: Any,
) -> dict:
    """Run ``lidarshard build`` in this process; returns :func:`summary` of the published OUT.

    Args:
        input: INPUT (``[NAME=]PATH``, a str or ``os.PathLike``: a directory, glob or dataset root; see
            docs/CLI.md's dataset layouts), or a list of them for one plan; None with ``from_samples=...``.
        out: OUT, replaced atomically on success.
        world_size, batch_size: W ranks, B samples per rank per step.
        runner: Beam runner name (``FnApiRunner``, ``DataflowRunner``, ...); default as the CLI.
        pipeline_args: further Beam flags, e.g. ``["--direct_num_workers=2"]``.
        **flags: any other ``build`` flag in snake case (``epochs=3``, ``bucket_weights=(1, 2)``, ``pad=True``).

    Raises:
        UsageError: a bad flag, value or path (the CLI's exit 2), before Beam starts.
        Exception: the run failed (the CLI's exit 1); nothing was published.
    """
    given = {"input": input, "out": out, "world_size": world_size, "batch_size": batch_size}
    return _run(from_keywords(BuildOptions, given | flags), runner, pipeline_args)


def _beam_argv(runner: Any, pipeline_args: Any) -> list[str]:
    """``runner`` and ``pipeline_args`` as Beam's command line (a str and a list of str, checked)."""
    if runner is not None and not isinstance(runner, str):
        raise UsageError(f"runner {runner!r} is not a runner's name (a str such as 'FnApiRunner')")
    if isinstance(pipeline_args, str) or not all(isinstance(a, str) for a in pipeline_args or ()):
        raise UsageError(
            f"pipeline_args {pipeline_args!r}: give a list of Beam flags, e.g. ['--direct_num_workers=2']"
        )
    return [*([f"--runner={runner}"] if runner else []), *(pipeline_args or ())]


def _run(opts: BuildOptions, runner: Any, pipeline_args: Any, kept: Kept | None = None) -> dict:
    """The checked build of ``opts`` (``kept``: see ``preflight.build_settings``) run and published."""
    beam_argv = _beam_argv(runner, pipeline_args)
    dry_run = launch.dry_run_requested(beam_argv)
    settings = build_settings(opts, dry_run, kept)
    check_workers_reach(beam_argv, run_paths(settings), opts.shared_filesystem)
    if not dry_run:  # a dry run works offline
        check_locations(beam_argv)
    with beam_output_held():
        built = build_cmd.launch_build(settings, beam_argv)
    return summary(settings.output) if built else {"out": settings.output, "dry_run": True}


def replan(
    out: Any,
    new_out: Any,
    from_epoch: int,
    cost_model: Any,
    *,
    epochs: int | None = None,
    runner: str | None = None,
    pipeline_args: Sequence[str] = (),
) -> dict:
    """Re-plan manifest ``out`` from epoch ``from_epoch`` on with ``cost_model`` (``@fit.json`` from
    ``lidarshard calibrate``) into ``new_out``: ``build new_out --from-samples out/samples --replan-from E``
    with ``out``'s own plan settings, constructed from the manifest read here once (``replan.continued``).
    Epochs before E keep ``out``'s plan byte for byte; a running sampler moves to ``new_out`` with
    ``switch_plan(new_out)``. Returns :func:`summary`.

    Raises:
        UsageError: ``out`` is not a committed manifest, ``from_epoch`` is not an int (None is refused:
            a re-plan keeps the epochs before it; ``lidarshard.build`` plans every epoch anew) or is outside
            its epochs, no or a bad model.
    """
    out = keyword(BuildOptions, "from_samples", out)
    try:
        m = load_manifest(out)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(f"replan: {e}") from None
    if isinstance(from_epoch, (bool, np.bool_)) or not isinstance(from_epoch, (int, np.integer)):
        raise UsageError(
            f"replan: from_epoch must be the first epoch to re-plan, an int >= 1 (the epochs before "
            f"it keep {out}'s plan), not {from_epoch!r}; to plan every epoch anew use lidarshard.build"
        )
    if cost_model is None:
        raise UsageError(
            "replan: cost_model plans the epochs from from_epoch on: give one (points, voxels, linear:c0,a,b, "
            "or @fit.json as lidarshard calibrate writes it)"
        )
    samples = storage.join(out, schemas.SAMPLES_DIR)
    epochs = None if epochs is None else keyword(BuildOptions, "epochs", epochs)
    plan, kept = continued(samples, int(from_epoch), epochs, m=m)
    fraction = m.max_reject_fraction
    opts = BuildOptions(
        out=keyword(BuildOptions, "out", new_out),
        plan=plan,
        cost_model=keyword(BuildOptions, "cost_model", cost_model),
        from_samples=samples,
        replan_from=int(from_epoch),
        max_reject_fraction=fraction if isinstance(fraction, (int, float)) else None,
    )
    return _run(opts, runner, pipeline_args, kept)


def write_manifest(
    samples: Any,
    out: Any,
    world_size: int,
    batch_size: int,
    *,
    rejects: pa.Table | None = None,
    cost_model: Any = None,
    **flags: Any,
) -> dict:
    """Plan and write a manifest from your own sample list (no scan), in this process; returns :func:`summary`.

    Args:
        samples: pyarrow Table, pandas DataFrame or list of dicts, one row per sample: ``sample_id``
            (strings; ids are sorted as text, so zero-pad numbers), ``path`` (full paths or URIs), and
            ``cost`` or the size columns of ``lidarshard.schemas.SAMPLE_FIELDS`` the cost model reads;
            other sample columns (``sweep_paths``, ...) are kept when present.
        out: OUT directory (local or any Beam filesystem; a str or ``os.PathLike``), replaced atomically.
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
    unknown = sorted(set(flags) - TABLE_KEYS)
    if unknown:
        raise UsageError(f"write_manifest takes the plan flags only, not {', '.join(unknown)}")
    samples = as_table(samples)
    given = cost_model is None and "cost" in samples.column_names
    size = {"out": out, "world_size": world_size, "batch_size": batch_size}
    opts = from_keywords(BuildOptions, size | {"cost_model": cost_model} | flags)
    model = GIVEN if given else parse_cost_model(opts.cost_model)
    settings = table_settings(opts, model)
    table = samples_table(samples, None if given else model, opts.plan)
    check_plan_size(opts.plan, table.num_rows, "the table")
    if given and pc.count_distinct(table.column("sample_id")).as_py() != table.num_rows:
        raise UsageError("samples: sample_id must be unique when a cost column is given")
    rejected = _rejects(rejects)

    def stage(staging: str) -> Source:
        path = storage.join(staging, schemas.WORK_DIR, PREPARED, schemas.part_name(0))
        storage.write_bytes(path, parquet_bytes(table))
        return Source((path,), rejected, ordered=True)

    with beam_output_held():
        build_cmd.launch_build(settings, [], stage, launch.LOCAL_RUNNER)
    return summary(settings.output)


def _rejects(rejects: Any) -> pa.Table:
    """``write_manifest``'s ``rejects`` as the rejects schema (None: none)."""
    if rejects is None:
        return schemas.reject_schema().empty_table()
    try:
        return as_table(rejects).cast(schemas.reject_schema())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, KeyError) as e:
        raise UsageError(
            f"rejects: not the rejects schema (lidarshard.schemas.reject_schema()): {e}"
        ) from None

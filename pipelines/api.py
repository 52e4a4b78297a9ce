"""The Python API of the pipeline side: ``lidarshard.build`` and ``lidarshard.write_manifest``.

Both take the command's flags as keyword arguments (``--bucket-weights`` -> ``bucket_weights``),
check them with the same parser and checks as ``lidarshard build`` (a bad value raises
:class:`~lidarshard.pipelines.launch.UsageError`, a ``ValueError``, with the same one line), plan
and write with the same code, publish atomically the same way and return the same summary::

    summary = lidarshard.build("data/", "out/", world_size=8, batch_size=2, epochs=3, runner="FnApiRunner")
    summary = lidarshard.write_manifest(infos_df, "out/", 8, 2, epochs=3)   # no Beam pipeline, no scan

``write_manifest`` is for users who already have their samples (an mmdet3d/OpenPCDet infos file, a
dataframe): a table with ``sample_id``, ``path`` and either ``cost`` or the size columns the cost
model needs (``num_points``/``num_in_range``, ``occupied_voxels``). The same samples give the same
bytes as ``lidarshard build OUT --from-samples`` (only the provenance keys of ``_manifest.json`` differ).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lidarshard import schemas
from lidarshard.pipelines import _output, _score, launch, options
from lidarshard.pipelines import build as build_cmd
from lidarshard.transforms import storage
from lidarshard.transforms.features import repeat
from lidarshard.transforms.features.cost import CostModel
from lidarshard.transforms.parts import PART_ROWS, read_parts
from lidarshard.transforms.plan import manifest

__all__ = ["build", "write_manifest", "summary"]

#: The keyword arguments ``write_manifest`` takes besides its own (the plan flags).
_PLAN_KEYS = {"epochs", "seed", "strategy", "buckets", "bucket_weights", "max_plan_factor", "pad", "drop_last",
              "max_reject_fraction", "max_points_per_rank_step", "max_cost_per_rank_step",
              "max_samples_per_rank_step", "repeat_factors", "sample_weights"}  # fmt: skip
#: What ``write_manifest`` records instead of a scan's provenance.
_CREATED_BY = f"lidarshard {launch.VERSION} write_manifest"


def _argv(options_: dict[str, Any]) -> list[str]:
    """Keyword arguments -> flags: True -> ``--flag``; False/None -> left out; sequences -> ``a,b``."""
    argv = []
    for key, value in options_.items():
        name = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(name)
        elif isinstance(value, (list, tuple)):
            argv.append(f"{name}={','.join(str(v) for v in value)}")
        else:
            argv.append(f"{name}={value}")
    return argv


def _parse(
    paths: list[str], world_size: int, batch_size: int, options_: dict[str, Any]
) -> argparse.Namespace:
    parser = build_cmd.parser()
    parser.raise_errors = True
    size = {"world_size": world_size, "batch_size": batch_size}
    args, beam_argv = parser.parse([*paths, *_argv(size | options_)])
    if beam_argv:
        raise launch.UsageError(f"{beam_argv[0]} is a Beam option: pass it in pipeline_args")
    return args


def summary(out: str) -> dict:
    """The numbers of a written manifest: out, counts, steps_per_epoch, buckets, balance per epoch."""
    m = storage.read_json(storage.join(out, schemas.MANIFEST_FILE))
    keys = (
        "world_size",
        "batch_size",
        "epochs",
        "strategy",
        "counts",
        "steps_per_epoch",
        "buckets",
        "balance",
    )
    return {"out": out} | {k: m[k] for k in keys}


def build(
    input: str | None,
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
        input: INPUT (directory, glob, nuScenes dataroot); None with ``from_samples=...``.
        out: OUT, replaced atomically on success.
        world_size, batch_size: W ranks, B samples per rank per step.
        runner: Beam runner name (``FnApiRunner``, ``DataflowRunner``, ...); default as the CLI.
        pipeline_args: further Beam flags, e.g. ``["--direct_num_workers=2"]``.
        **flags: any other ``build`` flag in snake case (``epochs=3``, ``bucket_weights=(1, 2)``, ``pad=True``).

    Raises:
        UsageError: a bad flag, value or path (the CLI's exit 2), before Beam starts.
        Exception: the run failed (the CLI's exit 1); nothing was published.
    """
    args = _parse([out] if input is None else [input, out], world_size, batch_size, flags)
    cfg, model = build_cmd.prepare(args)
    beam_argv = [*([f"--runner={runner}"] if runner else []), *pipeline_args]
    if not build_cmd.launch_build(args, beam_argv, cfg, model):
        return {"out": args.output, "dry_run": True}
    return summary(args.output)


def _samples_table(samples: Any, args: argparse.Namespace) -> pa.Table:
    """A pyarrow Table or pandas DataFrame -> the samples schema (plus ``cost`` and the
    ``--sample-weights`` column as ``repeat.WEIGHT_COLUMN`` when given), sorted by sample_id."""
    table = samples if isinstance(samples, pa.Table) else pa.Table.from_pandas(samples, preserve_index=False)
    missing = [c for c in ("sample_id", "path") if c not in table.column_names]
    if missing:
        raise launch.UsageError(f"samples: missing column(s) {', '.join(missing)}")
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
                raise launch.UsageError(
                    f"samples: column {f.name} ({col.type}) is not {f.type}: {e}"
                ) from None
        elif f.name == "num_sweeps":
            cols.append(pc.list_value_length(cols[want.get_field_index("sweep_paths")]).cast(f.type))
        else:
            cols.append(defaults.get(f.name, pa.nulls(n, f.type)))
    out = pa.Table.from_arrays(cols, schema=want)
    if "cost" in table.column_names:
        out = out.append_column("cost", table.column("cost").cast(pa.float64()))
    if args.sample_weights is not None:
        try:
            w = repeat.check_weights(table, args.sample_weights, args.max_plan_factor)
        except ValueError as e:
            raise launch.UsageError(f"sample_weights {e}") from None
        out = out.append_column(repeat.WEIGHT_COLUMN, pa.array(w, pa.float64()))
    if args.repeat_factors is not None and out.column("label_path").null_count == n:
        raise launch.UsageError("repeat_factors: no sample has a label_path (lidarseg labels) to read")
    return out.sort_by("sample_id")


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
    """Plan and write a manifest in this process (no Beam pipeline, no scan); returns :func:`summary`.

    Args:
        samples: pyarrow Table or pandas DataFrame, one row per sample: ``sample_id``, ``path``, and
            ``cost`` or the size columns of ``lidarshard.schemas.SAMPLE_FIELDS`` the cost model reads;
            other sample columns (``sweep_paths``, ...) are kept when present.
        out: OUT directory (local or any Beam filesystem), replaced atomically.
        world_size, batch_size: W ranks, B samples per rank per step.
        rejects: rows already rejected upstream (``lidarshard.schemas.reject_schema()``), kept in
            rejects.parquet and the counts.
        cost_model: as ``--cost-model``; None uses the ``cost`` column when there is one, else voxels.
        **flags: the other plan flags in snake case (``epochs``, ``seed``, ``strategy``, ``buckets``,
            ``bucket_weights``, ``pad``, ``max_plan_factor``, ``max_reject_fraction``, caps);
            ``sample_weights="COLUMN"`` takes per-sample weights from that column of ``samples``,
            ``repeat_factors="lidarseg:t=T"`` reads each ``label_path`` (as given) for LVIS repeat factors.
    """
    unknown = sorted(set(flags) - _PLAN_KEYS)
    if unknown:
        raise launch.UsageError(f"write_manifest takes the plan flags only, not {', '.join(unknown)}")
    given = cost_model is None and "cost" in (
        samples.column_names if isinstance(samples, pa.Table) else list(samples.columns)
    )
    plan_flags = dict(flags) | ({"cost_model": cost_model or "voxels"} if not given else {})
    args = _parse([out], world_size, batch_size, plan_flags)
    table = _samples_table(samples, args)
    cfg = options.plan_config(args)
    model = CostModel("given") if given else options.cost_model(args.cost_model)
    out = storage.absolute(out)
    options.check_output(out, [])
    fraction = (
        options.DEFAULT_REJECT_FRACTION if args.max_reject_fraction is None else args.max_reject_fraction
    )
    costs = table.column("cost") if given else None
    keep = [
        *(f.name for f in schemas.sample_schema()),
        *([repeat.WEIGHT_COLUMN] if args.sample_weights else []),
    ]
    base = table.select(keep)
    rejects = (
        schemas.reject_schema().empty_table() if rejects is None else rejects.cast(schemas.reject_schema())
    )
    storage.delete([launch.rejects_path(out)]) if storage.exists(
        launch.rejects_path(out)
    ) else None  # a stale one from an earlier failed call would mislead
    if costs is not None and pc.count_distinct(base.column("sample_id")).as_py() != base.num_rows:
        raise launch.UsageError("samples: sample_id must be unique when a cost column is given")
    settled, rejects, counts = launch.settle_or_stop(
        base.num_rows + rejects.num_rows, base, rejects, fraction, launch.rejects_path(out),
        lambda s, r: _screen(s, r, model, cfg, costs),
    )  # fmt: skip
    if costs is not None:  # the over-cap rejects left: keep the costs of the rows kept
        keep = pc.is_in(table.column("sample_id"), settled.column("sample_id"))
        costs = table.column("cost").filter(keep)
    staging = _output.new_staging(out)
    try:
        write = _score.writer(staging)  # (its Beam counters are no-ops outside a pipeline)
        settled, weights = repeat.sample_weights(settled, cfg.repeat, storage.read_bytes)
        checked = manifest.score_samples(
            settled, rejects, counts, model, cfg, write, costs, weights, PART_ROWS
        )
        scored = read_parts(_score.written_parts(checked, staging), columns=manifest.PLAN_INPUT)
        files, stats = list(checked["files"]), []
        for epoch in range(cfg.epochs):
            epoch_files, epoch_stats = manifest.write_epoch(scored, epoch, cfg, write)
            files += epoch_files
            stats.append(epoch_stats)
        meta = {
            "schema_version": schemas.SCHEMA_VERSION,
            "created_by": _CREATED_BY,
            "input": None,
            "from_samples": None,
            "max_reject_fraction": fraction,
            "part_rows": PART_ROWS,
            "path_root": None,  # the paths are stored as the table gave them
        }
        storage.write_json(
            storage.join(staging, schemas.MANIFEST_FILE),
            manifest.manifest_json(meta, cfg, checked, files, stats),
        )
        storage.write_bytes(storage.join(staging, schemas.SUCCESS_FILE), b"")
    except BaseException:
        _output.discard(staging)
        raise
    _output.commit(staging, out)
    return summary(out)


def _screen(samples: pa.Table, rejects: pa.Table, model: CostModel, cfg, costs) -> tuple[pa.Table, pa.Table]:
    return manifest.reject_over_cap(samples, rejects, model, cfg, costs)

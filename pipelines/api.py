"""The Python API of the pipeline side: ``lidarshard.build``, ``lidarshard.replan``, ``lidarshard.write_manifest``.

They take the command's flags as keywords (``--bucket-weights`` -> ``bucket_weights``), checked as typed values
by the command line's checks (a bad one: UsageError, a ValueError, with the same one line), run the same build
core and publish, and return the same summary::

    summary = lidarshard.build("data/", "out/", world_size=8, batch_size=2, epochs=3, runner="FnApiRunner")
    summary = lidarshard.write_manifest(infos_df, "out/", 8, 2, epochs=3)   # your own sample list, no scan

A run changes nothing of its caller's output: Beam's records and whatever the run writes to fd 2 go to the
``lidarshard.beam`` logger at DEBUG; a failure raises its one line. Needs ``lidarshard[pipeline]``.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lidarshard import schemas
from lidarshard.pipelines import build as build_cmd
from lidarshard.pipelines import launch
from lidarshard.pipelines.checks import check_locations
from lidarshard.pipelines.cli import BeamRootRecords, one_line
from lidarshard.pipelines.options import TABLE_KEYS, BuildOptions
from lidarshard.pipelines.options import cost_model as parse_cost_model
from lidarshard.pipelines.preflight import build_settings, check_plan_size, continued, table_settings
from lidarshard.pipelines.runners import check_workers_reach, run_paths
from lidarshard.pipelines.samples_input import as_table, samples_table
from lidarshard.transforms.core.manifest_writer import Kept
from lidarshard.transforms.core.score import GIVEN, PREPARED, Source
from lidarshard.transforms.declare import from_keywords, keyword
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import parquet_bytes
from lidarshard.transforms.io.metadata import load_manifest
from lidarshard.transforms.value_checks import UsageError

__all__ = ["build", "replan", "write_manifest", "summary", "BEAM_LOGGER"]

#: Where an API run's Beam output goes, at DEBUG.
BEAM_LOGGER = "lidarshard.beam"
_BEAM_LOG = logging.getLogger(BEAM_LOGGER)


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
    """``lidarshard build INPUT OUT`` in this process; returns :func:`summary` of OUT.

    Args:
        input: INPUT (``[NAME=]PATH``, str or ``os.PathLike``) or a list of them; None with ``from_samples``.
        out: OUT, replaced atomically on success.
        world_size, batch_size: W ranks, B samples per rank per step.
        runner, pipeline_args: the Beam runner's name and further Beam flags (``["--direct_num_workers=2"]``).
        **flags: any other ``build`` flag in snake case (``epochs=3``, ``bucket_weights=(1, 2)``, ``pad=True``).

    Raises:
        UsageError: a bad flag, value or path (the CLI's exit 2), before Beam starts.
        Exception: the run failed (the CLI's exit 1); nothing was published.
    """
    given = {"input": input, "out": out, "world_size": world_size, "batch_size": batch_size}
    return _run(from_keywords(BuildOptions, given | flags), runner, pipeline_args)


def _beam_argv(runner: Any, pipeline_args: Any) -> list[str]:
    if runner is not None and not isinstance(runner, str):
        raise UsageError(f"runner {runner!r} is not a runner's name (a str such as 'FnApiRunner')")
    if isinstance(pipeline_args, str) or not all(isinstance(a, str) for a in pipeline_args or ()):
        raise UsageError(
            f"pipeline_args {pipeline_args!r}: give a list of Beam flags, e.g. ['--direct_num_workers=2']"
        )
    return [*([f"--runner={runner}"] if runner else []), *(pipeline_args or ())]


def _run(opts: BuildOptions, runner: Any, pipeline_args: Any, kept: Kept | None = None) -> dict:
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
    """``build new_out --from-samples out/samples --replan-from from_epoch --cost-model cost_model`` with
    ``out``'s plan settings, constructed from its manifest read once (``preflight.continued``); epochs before
    keep ``out``'s plan byte for byte (a sampler moves with ``switch_plan(new_out)``). Returns :func:`summary`."""
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
    """Plan and write a manifest of your own sample list (no scan: ``build OUT --from-samples``), in this
    process (Beam's in-memory runner); returns :func:`summary`.

    Args:
        samples: pyarrow Table, pandas DataFrame or list of dicts, one row per sample: ``sample_id`` (strings,
            sorted as text: zero-pad numbers), ``path`` (full paths or URIs), and ``cost`` or the size columns
            the cost model reads; other sample columns (``sweep_paths``, ...) are kept.
        out: OUT directory (str or ``os.PathLike``), replaced atomically.
        world_size, batch_size: W ranks, B samples per rank per step.
        rejects: rows rejected upstream (``lidarshard.schemas.reject_schema()``), kept in rejects.parquet.
        cost_model: as ``--cost-model``; None: the ``cost`` column when there is one, else voxels.
        **flags: the plan and output groups' flags in snake case (``TABLE_KEYS``); ``sample_weights="COLUMN"``
            reads a column of ``samples``, ``repeat_factors="lidarseg:t=T"`` each ``label_path``.

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
    if rejects is None:
        return schemas.reject_schema().empty_table()
    try:
        return as_table(rejects).cast(schemas.reject_schema())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, KeyError) as e:
        raise UsageError(
            f"rejects: not the rejects schema (lidarshard.schemas.reject_schema()): {e}"
        ) from None


class _HeldBeamRecords(logging.Handler):  # Beam's records of an API run, re-logged at DEBUG
    def emit(self, record: logging.LogRecord) -> None:
        _BEAM_LOG.debug("%s: %s", record.name, record.getMessage(), exc_info=record.exc_info)


@contextmanager
def beam_output_held() -> Iterator[None]:
    """Around one API run: Beam's records and fd 2 go to ``lidarshard.beam`` at DEBUG, nothing to the caller's
    stderr; a failure is raised as its one line (``cli.one_line``; its type, else RuntimeError)."""
    beam, root = logging.getLogger("apache_beam"), logging.getLogger()
    held, hidden, propagate = _HeldBeamRecords(), BeamRootRecords(logging.CRITICAL + 1), beam.propagate
    beam.addHandler(held)
    beam.propagate = False
    root.addFilter(hidden)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        except UsageError:
            raise
        except Exception as e:
            _BEAM_LOG.debug("the run failed", exc_info=e)
            raise _one_line_error(e) from None
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            root.removeFilter(hidden)
            beam.propagate = propagate
            beam.removeHandler(held)
            caught.seek(0)
            text = caught.read().decode("utf-8", "replace")
            if text:
                _BEAM_LOG.debug("stderr of the run:\n%s", text)


def _one_line_error(e: Exception) -> Exception:
    line = one_line(e)
    try:
        same = type(e)(line)
    except Exception:
        return RuntimeError(line)
    return same if str(same) == line else RuntimeError(line)  # BeamIOError appends its exceptions

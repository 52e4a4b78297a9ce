"""The one launcher of the Beam commands and the Python API: Beam options, staging, run, publish.

``launch(write, beam_argv, out)`` builds a pipeline whose steps write into a fresh staging directory
(``write(pipeline, staging)``), runs it on the chosen runner and hands the staging directory to the one
publish (``lidarshard.pipelines.publish.run_and_publish``: validate, then commit atomically).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from lidarshard import __version__
from lidarshard.pipelines import publish, understood
from lidarshard.pipelines.checks import check_locations
from lidarshard.pipelines.cli import running
from lidarshard.pipelines.preflight import rejects_path
from lidarshard.pipelines.runners import check_workers_reach, resolve_runner, run_paths
from lidarshard.transforms.declare import from_flags
from lidarshard.transforms.io import storage
from lidarshard.transforms.value_checks import UsageError

__all__ = [
    "VERSION",
    "DRY_RUN_NOTE",
    "LOCAL_RUNNER",
    "beam_options",
    "dry_run_requested",
    "launch",
    "run_command",
    "run_pipeline",
]

VERSION = __version__
DRY_RUN_NOTE = "dry run: the runner built the job graph; nothing ran and nothing was written"
#: In-process runner for small jobs (``synth``, ``lidarshard.write_manifest``): no worker processes.
LOCAL_RUNNER = ("--runner=FnApiRunner", "--direct_running_mode=in_memory")


def beam_options(beam_args: Sequence[str], default_runner: Sequence[str] | None = None):
    """Beam options; without ``--runner`` the local DirectRunner on all cores (multi_processing),
    or ``default_runner`` when given; runner aliases (``--runner=dask``) resolved (``pipelines.runners``)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    args = resolve_runner(beam_args)  # --runner=dask is Beam's DaskRunner
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args += list(default_runner) if default_runner is not None else [
            "--runner=DirectRunner",
            "--direct_running_mode=multi_processing",
            f"--direct_num_workers={os.cpu_count() or 1}",
        ]  # fmt: skip
    return PipelineOptions(args)


def _dry_run(options) -> bool:
    from apache_beam.options.pipeline_options import TestOptions

    return bool(options.view_as(TestOptions).dry_run)


def dry_run_requested(beam_argv: Sequence[str]) -> bool:
    """True when the Beam flags ask for ``--dry_run``: the job graph only, no data touched."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return _dry_run(PipelineOptions(list(beam_argv)))


def launch(
    write: Callable[[Any, str], None],
    beam_argv: Sequence[str],
    out: str,
    default_runner: Sequence[str] | None = None,
) -> bool:
    """Run the pipeline ``write(pipeline, staging)`` builds and publish its staging directory as ``out``.

    A stale ``OUT.rejects.parquet`` of an earlier failed run goes first.

    Returns:
        False for ``--dry_run``: the runner built the job graph, nothing ran, nothing is published
        (publishing would replace ``out`` with an empty directory).
    """
    import apache_beam as beam

    opts = beam_options(beam_argv, default_runner)
    if _dry_run(opts):
        staging = publish.sibling(out, ".staging-dryrun")
        pipeline = beam.Pipeline(options=opts)
        write(pipeline, staging)
        try:
            with running():
                pipeline.run().wait_until_finish()  # only DataflowRunner honours --dry_run; others run
        finally:
            if storage.is_local(staging):
                publish.discard(staging)
        return False
    if storage.exists(rejects_path(out)):
        storage.delete([rejects_path(out)])
    staging = publish.new_staging(out)

    publish.run_and_publish(
        lambda: run_pipeline(lambda pipeline: write(pipeline, staging), opts, "; nothing was published"),
        staging,
        out,
    )
    return True


def run_pipeline(write: Callable[[Any], None], opts: Any, note: str = "") -> None:
    """Run the pipeline ``write(pipeline)`` wires to its end behind the command's progress line (Beam's and
    the workers' output hidden unless -v); RuntimeError (ending in ``note``) unless it ends DONE."""
    import apache_beam as beam
    from apache_beam.runners.runner import PipelineState

    pipeline = beam.Pipeline(options=opts)
    write(pipeline)
    with running():
        result = pipeline.run()
        result.wait_until_finish()
    if result.state != PipelineState.DONE:
        raise RuntimeError(f"the pipeline ended in state {result.state}{note}")


def run_command(
    name: str,
    p: Any,
    argv: list[str] | None,
    options: type,
    settings_of: Callable[[Any, bool], Any],
    start: Callable[[Any, list[str]], bool],
    print_summary: Callable[[str], None],
) -> int:
    """The entry point of ``lidarshard NAME`` (scan, build): flags -> ``options`` -> settings (exit 2 on a
    usage error, through ``p.error``), the workers' reach checked, ``start(settings, beam_argv)``, the summary."""
    args, beam_argv = p.parse(argv)
    try:
        dry_run = dry_run_requested(beam_argv)
        opts: Any = from_flags(options, args)
        settings = settings_of(opts, dry_run)
        check_workers_reach(beam_argv, run_paths(settings), opts.shared_filesystem)
        if not dry_run:  # a dry run works offline
            check_locations(beam_argv)
    except UsageError as e:
        p.error(str(e))
    if not dry_run:
        understood.warn_live(settings.output, name)
    if start(settings, beam_argv):
        print_summary(settings.output)
    else:
        print(DRY_RUN_NOTE)
    return 0

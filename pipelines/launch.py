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
from lidarshard.pipelines import publish
from lidarshard.pipelines.cli import running
from lidarshard.pipelines.preflight import rejects_path
from lidarshard.transforms.io import storage

__all__ = ["VERSION", "DRY_RUN_NOTE", "LOCAL_RUNNER", "beam_options", "dry_run_requested", "launch"]

VERSION = __version__
DRY_RUN_NOTE = "dry run: the runner built the job graph; nothing ran and nothing was written"
#: In-process runner for small jobs (``synth``, ``lidarshard.write_manifest``): no worker processes.
LOCAL_RUNNER = ("--runner=FnApiRunner", "--direct_running_mode=in_memory")


def beam_options(beam_args: Sequence[str], default_runner: Sequence[str] | None = None):
    """Beam options; without ``--runner`` the local DirectRunner on all cores (multi_processing),
    or ``default_runner`` when given; runner aliases (``--runner=dask``) resolved (``pipelines.runners``)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from lidarshard.pipelines.runners import resolve_runner

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
    from apache_beam.runners.runner import PipelineState

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

    def run() -> None:
        pipeline = beam.Pipeline(options=opts)
        write(pipeline, staging)
        with running():  # the command's progress line; Beam's and the workers' output hidden unless -v
            result = pipeline.run()
            result.wait_until_finish()
        if result.state != PipelineState.DONE:
            raise RuntimeError(f"the pipeline ended in state {result.state}; nothing was published")

    publish.run_and_publish(run, staging, out)
    return True

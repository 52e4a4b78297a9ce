"""``lidarshard scan INPUT OUT``: size features of every point cloud, bad input to rejects.

Writes ``OUT/samples.parquet``, ``OUT/rejects.parquet``, ``OUT/_scan.json`` and ``OUT/_SUCCESS``.
Every flag this parser does not know goes to Beam (``--runner``, ``--direct_num_workers``, ...).

Our flags are parsed with plain argparse rather than a ``PipelineOptions`` subclass on purpose:
Beam registers every ``PipelineOptions`` subclass in one global parser, so two subcommands that
both define ``--seed`` (or a positional INPUT) would collide inside runners.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import apache_beam as beam
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions, TestOptions
from apache_beam.runners.runner import PipelineState

from lidarshard import schemas
from lidarshard.pipelines import _output
from lidarshard.pipelines._lifeline import interruptible
from lidarshard.pipelines.runners import resolve_runner
from lidarshard.pipelines.tools.validate import validate
from lidarshard.transforms import storage
from lidarshard.transforms.arrow import parquet_bytes
from lidarshard.transforms.beam.scan import ScanSamples
from lidarshard.transforms.beam.tagged import GatherTagged, tag
from lidarshard.transforms.features.accounting import fingerprint, settle
from lidarshard.transforms.features.sample import FEATURE_MODES, ScanConfig
from lidarshard.transforms.formats.readers import FORMATS

__all__ = [
    "run",
    "add_scan_arguments",
    "scan_config",
    "beam_options",
    "run_pipeline",
    "new_staging",
    "scan_results",
]

VERSION = "0.1.0"
DRY_RUN_NOTE = "dry run: the runner built the job graph; nothing ran and nothing was written"


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(","))


def add_scan_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags that decide what is read and how features are computed (shared with ``build``)."""
    g = parser.add_argument_group("scan")
    g.add_argument("--nuscenes-version", help="INPUT is a nuScenes dataroot; read its v1.0-xxx tables")
    g.add_argument(
        "--sweeps", type=int, default=0, help="previous sweeps aggregated per keyframe (tables mode)"
    )
    g.add_argument("--format", choices=FORMATS, help="override extension-based format detection")
    g.add_argument("--point-dims", type=int, help="float32 values per point of headerless .bin files")
    g.add_argument("--voxel-size", type=float, default=0.05, help="occupancy voxel edge, metres (0.05)")
    g.add_argument("--point-cloud-range", type=_floats, help="x0,y0,z0,x1,y1,z1 metres; default all points")
    g.add_argument("--features", choices=FEATURE_MODES, default="full", help="'stat' sizes .bin files unread")
    g.add_argument("--backend", choices=("numpy", "open3d"), default="numpy", help="reader for .pcd/.ply")
    g.add_argument("--max-file-bytes", type=int, default=2 << 30, help="reject larger files (too_large)")
    g.add_argument("--max-points", type=int, default=50_000_000, help="reject larger clouds (too_large)")
    g.add_argument(
        "--max-reject-fraction",
        type=float,
        default=0.01,
        help="fail (writing nothing) when more than this fraction of inputs is rejected (0.01)",
    )


def scan_config(args: argparse.Namespace) -> ScanConfig:
    return ScanConfig(
        voxel_size=args.voxel_size,
        point_cloud_range=args.point_cloud_range,
        point_dims=args.point_dims,
        format=args.format,
        features=args.features,
        max_file_bytes=args.max_file_bytes,
        max_points=args.max_points,
        backend=args.backend,
    )


def beam_options(beam_args: Sequence[str]) -> PipelineOptions:
    """Beam options; without ``--runner`` the local DirectRunner on all cores (multi_processing).
    ``--runner=dask`` is Beam's DaskRunner (``pipelines.runners``)."""
    args = resolve_runner(beam_args)
    if not any(a.startswith("--runner") for a in args):
        args += [
            "--runner=DirectRunner",
            "--direct_running_mode=multi_processing",
            f"--direct_num_workers={os.cpu_count() or 1}",
        ]
    return PipelineOptions(args)


def scan_results(gathered: dict[str, list]) -> tuple[int, pa.Table, pa.Table]:
    """``GatherScan``'s ``{"scanned": [n], "samples": [table], "rejects": [table]}`` -> the three;
    an absent key (nothing was gathered) is 0 or an empty table."""
    (scanned,) = gathered.get("scanned", [0])
    (samples,) = gathered.get("samples", [schemas.sample_schema().empty_table()])
    (rejects,) = gathered.get("rejects", [schemas.reject_schema().empty_table()])
    return scanned, samples, rejects


def _finalize(gathered: dict[str, list], staging: str, meta: dict, max_reject: float, empty_ok: bool) -> None:
    scanned, samples, rejects = scan_results(gathered)
    if scanned == 0 and not empty_ok:  # tables or a pattern that yield nothing: a mistake, not a dataset
        raise RuntimeError(
            f"nothing was scanned: {meta['input']} "
            + ("lists no LIDAR_TOP keyframe" if meta["nuscenes_version"] else "matched no file")
            + "; nothing was written"
        )
    samples, rejects, counts = settle(scanned, samples, rejects, max_reject)
    storage.write_bytes(storage.join(staging, schemas.SAMPLES_FILE), parquet_bytes(samples))
    storage.write_bytes(storage.join(staging, schemas.REJECTS_FILE), parquet_bytes(rejects))
    storage.write_json(
        storage.join(staging, schemas.SCAN_FILE),
        meta | {"counts": counts, "inputs_fingerprint": fingerprint(samples)},
    )


def scan_meta(args: argparse.Namespace, cfg: ScanConfig) -> dict:
    return {
        "schema_version": schemas.SCHEMA_VERSION,
        "created_by": f"lidarshard {VERSION}",
        "input": args.input,
        "nuscenes_version": args.nuscenes_version,
        "sweeps": args.sweeps,
        "max_reject_fraction": args.max_reject_fraction,
        "scan_config": {k: v for k, v in vars(cfg).items() if k != "extra"},
        "sample_schema": schemas.schema_to_json(schemas.sample_schema()),
    }


def new_staging(options: PipelineOptions, out: str) -> str:
    """``_output.new_staging(out)``; under ``--dry_run`` only a name, touching nothing (a dry run
    must work offline and never publish)."""
    if options.view_as(TestOptions).dry_run:
        return f"{out.rstrip('/')}.staging-dryrun"
    return _output.new_staging(out)


def _check_staged(staging: str) -> None:
    """Refuse to publish what ``lidarshard validate`` would reject: the same checks, on the staged copy.

    Raises:
        RuntimeError: one line naming the first problem and how many more there are.
    """
    problems, _ = validate(staging)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise RuntimeError(f"the output fails validation, nothing was published: {problems[0]}{more}")


def run_pipeline(pipeline: beam.Pipeline, staging: str, out: str) -> bool:
    """Run ``pipeline`` (which writes into ``staging``), then publish it as ``out`` or discard it.

    Returns False for ``--dry_run``: the runner built the job, nothing ran, nothing is published
    (publishing would replace ``out`` with an empty directory).
    """
    if pipeline.options.view_as(TestOptions).dry_run:
        try:
            pipeline.run().wait_until_finish()  # only DataflowRunner honours --dry_run; others run
        finally:
            if storage.is_local(staging):
                _output.discard(staging)
        return False
    try:
        with interruptible(lambda: _output.discard(staging), f"nothing was published ({out} is unchanged)"):
            result = pipeline.run()
            result.wait_until_finish()
            if result.state != PipelineState.DONE:
                raise RuntimeError(f"the pipeline ended in state {result.state}; nothing was published")
            storage.write_bytes(storage.join(staging, schemas.SUCCESS_FILE), b"")
            _check_staged(staging)
    except BaseException:
        _output.discard(staging)
        raise
    _output.commit(staging, out)
    return True


def _empty_ok(args: argparse.Namespace) -> bool:
    """Only an empty local directory may scan to empty tables; tables or a pattern that yield
    nothing are an error."""
    return not args.nuscenes_version and storage.is_local(args.input) and os.path.isdir(args.input)


def build_scan(pipeline: beam.Pipeline, args: argparse.Namespace, staging: str) -> None:
    cfg = scan_config(args)
    scan = pipeline | "Scan" >> ScanSamples(args.input, cfg, args.nuscenes_version, args.sweeps)
    _ = (
        (tag(scan.scanned, "scanned"), tag(scan.samples, "samples"), tag(scan.rejects, "rejects"))
        | "GatherScan" >> GatherTagged()
        | "Finalize"
        >> beam.Map(_finalize, staging, scan_meta(args, cfg), args.max_reject_fraction, _empty_ok(args))
    )


def print_summary(out: str) -> None:
    meta = storage.read_json(storage.join(out, schemas.SCAN_FILE))
    c = meta["counts"]
    print(f"scanned {c['scanned']}: accepted {c['accepted']}, rejected {c['rejected']}")
    for reason, n in sorted(c["rejected_by_reason"].items()):
        print(f"  rejected {reason}: {n}")
    print(f"wrote {out}")


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lidarshard scan", description=__doc__.split("\n\n")[0])
    parser.add_argument("input", help="directory, glob or nuScenes dataroot (local, gs://, s3://)")
    parser.add_argument("output", help="output directory (replaced atomically on success)")
    add_scan_arguments(parser)
    args, beam_args = parser.parse_known_args(argv)
    args.input, args.output = storage.absolute(args.input), storage.absolute(args.output)
    options = beam_options(beam_args)
    staging = new_staging(options, args.output)
    pipeline = beam.Pipeline(options=options)
    build_scan(pipeline, args, staging)
    if run_pipeline(pipeline, staging, args.output):
        print_summary(args.output)
    else:
        print(DRY_RUN_NOTE)
    return 0


if __name__ == "__main__":
    sys.exit(run())

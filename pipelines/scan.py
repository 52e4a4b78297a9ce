"""``lidarshard scan INPUT OUT``: size features of every point cloud, bad input to rejects.

Writes ``OUT/samples/part-NNNNN.parquet`` (in parallel), ``OUT/rejects.parquet``, ``OUT/_scan.json`` and ``OUT/_SUCCESS``.
Beam pipeline options (``--runner``, ``--direct_num_workers``, ...) pass through; unknown flags are refused.
"""

from __future__ import annotations

import argparse
import os
import sys

import apache_beam as beam

from lidarshard import schemas
from lidarshard.pipelines import launch, options
from lidarshard.transforms import storage
from lidarshard.transforms.arrow import parquet_bytes
from lidarshard.transforms.beam.scan import ScanSamples, scan_results
from lidarshard.transforms.features.previous import fingerprint_kept
from lidarshard.transforms.parts import open_parts

__all__ = ["run", "parser", "prepare", "build_scan"]


def parser() -> launch.CommandParser:
    p = launch.CommandParser("lidarshard scan", __doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument(
        "input", metavar="INPUT", help="directory, glob or nuScenes dataroot (local, gs://, s3://)"
    )
    p.add_argument("output", metavar="OUT", help="output directory (replaced atomically on success)")
    options.add_scan_arguments(p)
    return p


def _finalize(gathered: dict[str, list], staging: str, meta: dict, args: dict) -> None:
    """Accounting of the parts written, the inputs fingerprint (streamed), rejects, ``_scan.json``."""
    scanned, parts, rejects = scan_results(gathered)
    if (
        scanned == 0 and not args["empty_ok"]
    ):  # tables or a pattern that yield nothing: a mistake, not a dataset
        raise RuntimeError(
            f"nothing was scanned: {meta['input']} "
            + ("lists no LIDAR_TOP keyframe" if meta["nuscenes_version"] else "matched no file")
            + "; nothing was written"
        )
    accepted = sum(rows for _, rows, _ in parts)
    counts = launch.counts_or_stop(scanned, accepted, rejects, args["max_reject"], args["rejects_out"])
    with open_parts([storage.join(staging, entry["path"]) for _, _, entry in parts]) as file:
        digest = fingerprint_kept(file)
    storage.write_bytes(storage.join(staging, schemas.REJECTS_FILE), parquet_bytes(rejects))
    storage.write_json(
        storage.join(staging, schemas.SCAN_FILE), meta | {"counts": counts, "inputs_fingerprint": digest}
    )
    storage.remove_tree(storage.join(staging, launch.WORK_DIR))


def build_scan(pipeline: beam.Pipeline, args: argparse.Namespace, staging: str) -> None:
    cfg = options.scan_config(args)
    work = storage.join(staging, launch.WORK_DIR)
    parts = storage.join(staging, schemas.SAMPLES_DIR)
    scan = pipeline | "Scan" >> ScanSamples(
        args.input, cfg, args.nuscenes_version, args.sweeps, work, parts, args.part_rows
    )
    settings = {
        "max_reject": args.max_reject_fraction,
        "rejects_out": args.rejects_out,
        "empty_ok": _empty_ok(args),
    }
    meta = options.scan_meta(args, cfg, launch.VERSION)
    _ = scan.gathered() | "Finalize" >> beam.Map(_finalize, staging, meta, settings)


def _empty_ok(args: argparse.Namespace) -> bool:
    """Only an empty local directory may scan to empty tables; tables or a pattern that yield
    nothing are an error."""
    return not args.nuscenes_version and storage.is_local(args.input) and os.path.isdir(args.input)


def prepare(args: argparse.Namespace, dry_run: bool = False) -> None:
    """Check every value and path before Beam starts (raises UsageError with one line).

    ``dry_run``: only the job graph will be built; remote paths are not looked at (a dry run works
    offline) and OUT is not checked for replacing (nothing is published).
    """
    args.input, args.output = storage.absolute(args.input), storage.absolute(args.output)
    if not dry_run or storage.is_local(args.input):
        options.check_input(args.input)
        options.check_nuscenes(args.input, args.nuscenes_version)
    options.check_output(args.output, [args.input], publish=not dry_run)
    if args.max_reject_fraction is None:
        args.max_reject_fraction = options.DEFAULT_REJECT_FRACTION
    args.rejects_out = launch.rejects_path(args.output)


def print_summary(out: str) -> None:
    meta = storage.read_json(storage.join(out, schemas.SCAN_FILE))
    c = meta["counts"]
    print(f"scanned {c['scanned']}: accepted {c['accepted']}, rejected {c['rejected']}")
    for reason, n in sorted(c["rejected_by_reason"].items()):
        print(f"  rejected {reason}: {n}")
    print(f"wrote {out}")


def run(argv: list[str] | None = None) -> int:
    """Entry point of ``lidarshard scan``: exits 2 on a usage error, raises when the run fails."""
    p = parser()
    args, beam_argv = p.parse(argv)
    try:
        prepare(args, launch.dry_run_requested(beam_argv))
    except launch.UsageError as e:
        p.fail(str(e))
    opts = launch.beam_options(beam_argv)
    staging = launch.new_staging(opts, args.output)
    pipeline = beam.Pipeline(options=opts)
    build_scan(pipeline, args, staging)
    if launch.run_pipeline(pipeline, staging, args.output):
        print_summary(args.output)
    else:
        print(launch.DRY_RUN_NOTE)
    return 0


if __name__ == "__main__":
    sys.exit(run())

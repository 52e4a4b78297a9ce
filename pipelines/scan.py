"""``lidarshard scan INPUT OUT``: size features of every point cloud, bad input to rejects.

Writes ``OUT/samples/part-NNNNN.parquet`` (in parallel), ``OUT/rejects.parquet``, ``OUT/_scan.json`` and ``OUT/_SUCCESS``.
Beam pipeline options (``--runner``, ``--direct_num_workers``, ...) pass through; unknown flags are refused.
"""

from __future__ import annotations

import os
import sys

import apache_beam as beam

from lidarshard import schemas
from lidarshard.pipelines import launch, understood
from lidarshard.pipelines.options import BeamParser, ScanOptions
from lidarshard.pipelines.preflight import ScanSettings, scan_settings
from lidarshard.transforms.beam.scan_transform import ScanSamples, scan_results
from lidarshard.transforms.core.previous import fingerprint_kept
from lidarshard.transforms.features.accounting import counts_or_stop
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import parquet_bytes
from lidarshard.transforms.io.metadata import load_scan
from lidarshard.transforms.io.parts import open_parts
from lidarshard.transforms.layouts import FILES

__all__ = ["run", "parser", "build_scan", "scan_samples"]


def parser() -> BeamParser:
    """The ``scan`` command line: the arguments of ``ScanOptions``, Beam options; a plan's flags are refused
    naming build."""
    p = BeamParser("lidarshard scan", __doc__.split("\n\n")[0].replace("``", ""), ScanOptions)
    p.elsewhere = {"--dataset-weights": "weights a plan: give it to build (a scan plans nothing)"}
    return p


def _finalize(gathered: dict[str, list], staging: str, settings: ScanSettings, empty_ok: bool) -> None:
    """Accounting of the parts written, the inputs fingerprint (streamed), rejects, ``_scan.json``."""
    scanned, parts, rejects = scan_results(gathered)
    if scanned == 0 and not empty_ok:  # tables or a pattern that yield nothing: a mistake, not a dataset
        layouts_ = {d.layout for d in settings.datasets}
        what = "matched no file" if layouts_ == {FILES} else "lists no sample"
        if layouts_ == {"nuscenes"}:
            what = "lists no LIDAR_TOP keyframe"
        raise RuntimeError(f"nothing was scanned: {settings.input} {what}; nothing was written")
    accepted = sum(rows for _, rows, _ in parts)
    counts = counts_or_stop(scanned, accepted, rejects, settings.max_reject_fraction, settings.rejects_out)
    with open_parts([storage.join(staging, entry["path"]) for _, _, entry in parts]) as file:
        digest = fingerprint_kept(file)
    storage.write_bytes(storage.join(staging, schemas.REJECTS_FILE), parquet_bytes(rejects))
    meta = settings.meta() | {"counts": counts, "inputs_fingerprint": digest}
    storage.write_json(storage.join(staging, schemas.SCAN_FILE), meta)
    storage.remove_tree(storage.join(staging, schemas.WORK_DIR))


def scan_samples(settings: ScanSettings, work: str, parts: str) -> ScanSamples:
    """The scan of ``settings``' INPUTs, writing its samples parts under ``parts`` (``build`` uses it too)."""
    assert settings.datasets  # a scan always has INPUT
    return ScanSamples(
        settings.datasets,
        settings.layout_options,
        settings.options.config,
        work,
        parts,
        settings.options.part_rows,
        settings.label_maps,
    )


def build_scan(pipeline: beam.Pipeline, settings: ScanSettings, staging: str) -> None:
    """Wire the scan of ``settings.input`` into ``staging``."""
    work = storage.join(staging, schemas.WORK_DIR)
    parts = storage.join(staging, schemas.SAMPLES_DIR)
    scan = pipeline | "Scan" >> scan_samples(settings, work, parts)
    _ = scan.gathered() | "Finalize" >> beam.Map(_finalize, staging, settings, _empty_ok(settings))


def _empty_ok(settings: ScanSettings) -> bool:
    """Only empty local directories of files may scan to empty tables; a dataset layout or a pattern
    that yields nothing is an error."""
    return all(
        d.layout == FILES and storage.is_local(d.root) and os.path.isdir(d.root) for d in settings.datasets
    )


def print_summary(out: str) -> None:
    scan = load_scan(out)
    c = scan.counts
    for line in understood.input_lines(scan.provenance, *understood.by_input(out, scan.provenance)):
        print(line)
    print(understood.counts_line(c.scanned, c.accepted, c.rejected))
    for reason, n in sorted(c.rejected_by_reason.items()):
        print(f"  rejected {reason}: {n}")
    print(understood.points_line(scan.provenance))
    print(f"wrote {out}")


def run(argv: list[str] | None = None) -> int:
    """Entry point of ``lidarshard scan``: exits 2 on a usage error, raises when the run fails."""

    def start(settings: ScanSettings, beam_argv: list[str]) -> bool:
        return launch.launch(
            lambda pipeline, staging: build_scan(pipeline, settings, staging), beam_argv, settings.output
        )

    return launch.run_command("scan", parser(), argv, ScanOptions, scan_settings, start, print_summary)


if __name__ == "__main__":
    sys.exit(run())

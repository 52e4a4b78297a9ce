"""``lidarshard build INPUT OUT --world-size W --batch-size B``: balanced, rank-sharded manifests.

One Beam pipeline: the samples' source (the scan of INPUT, or ``--from-samples`` an earlier run's
samples) -> the build core (``lidarshard.transforms.beam.build_transform.BuildManifest``: settle, score, plan
each epoch once, write the samples parts and plan files in parallel, ``_manifest.json``) -> the one
publish (validate the staged copy, then commit it as OUT). ``lidarshard.build()`` and
``lidarshard.write_manifest()`` run the same pipeline (``launch_build``).

Bucket edges are exact quantiles of the gathered cost column, not Beam's ApproximateQuantiles,
whose result can depend on bundling and would break byte-identical output across runners.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Sequence

import apache_beam as beam

from lidarshard import schemas
from lidarshard.loaders.reader import read_samples
from lidarshard.pipelines import launch, understood
from lidarshard.pipelines.options import BeamParser, BuildOptions
from lidarshard.pipelines.preflight import BuildSettings, build_settings
from lidarshard.pipelines.scan import scan_samples
from lidarshard.tools.epoch_seconds import epoch_lines, plan_loads
from lidarshard.transforms.beam.build_transform import BuildManifest
from lidarshard.transforms.beam.scan_transform import scan_results
from lidarshard.transforms.core.score import Source, previous_source
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.metadata import load_manifest
from lidarshard.transforms.plan.epoch_time import untimed
from lidarshard.transforms.plan.explain import COLUMNS, plan_buys
from lidarshard.transforms.plan.memory import format_bytes

__all__ = ["run", "parser", "build_pipeline", "launch_build", "print_summary", "SCANNED_DIR"]

USAGE = (
    "lidarshard build INPUT [INPUT ...] OUT --world-size W --batch-size B [options] [beam options]\n"
    "       lidarshard build OUT --from-samples PREV/samples --world-size W --batch-size B [options]"
)
#: The scan's samples parts of a build, under the staging directory's scratch directory.
SCANNED_DIR = "scanned"


def _summary_help() -> str:
    """What the summary a build prints means (``--help``): ``explain.COLUMNS``, wrapped."""
    lines = ["After a build, a table per epoch and one line saying what the plan buys:"]
    for name, meaning in COLUMNS.items():
        lines.append(textwrap.fill(meaning, 100, initial_indent=f"  {name}: ", subsequent_indent="    "))
    return "\n".join(lines)


def parser() -> BeamParser:
    """The ``build`` command line: the arguments of ``BuildOptions`` (INPUT... OUT, scan, output, plan),
    Beam options; ``--help`` also says what the summary's numbers mean."""
    about = __doc__.split("\n\n")[0].replace("``", "")
    return BeamParser("lidarshard build", f"{about}\n\n{_summary_help()}", BuildOptions, usage=USAGE)


def _scan_source(gathered: dict[str, list], scratch: str, root: str | None) -> Source:
    """The scan's gathered results -> its samples parts (full paths, stored under ``root`` from now on)."""
    scanned, parts, rejects = scan_results(gathered)
    files = tuple(storage.join(scratch, schemas.part_name(k)) for k, _, _ in parts)
    return Source(files, rejects, scanned, (None, root))


def build_pipeline(
    pipeline: beam.Pipeline, settings: BuildSettings, staging: str, source: Source | None = None
) -> None:
    """Wire the build: ``source`` (a staged table), else the ``--from-samples`` samples, else the scan
    of INPUT, into the build core."""
    job = settings.job(staging)
    if source is not None:
        sources = pipeline | "Table" >> beam.Create([source])
    elif settings.options.from_samples:  # read where it is used: passing the table along would pickle it
        sources = (
            pipeline
            | "Previous" >> beam.Create([settings.options.from_samples])
            | "PreviousSource" >> beam.Map(previous_source, settings.path_root)
        )
    else:
        scratch = storage.join(job.work, SCANNED_DIR)
        scanned = pipeline | "Scan" >> scan_samples(settings, job.work, scratch)
        sources = scanned.gathered() | "ScanSource" >> beam.Map(_scan_source, scratch, settings.path_root)
    _ = sources | "Build" >> BuildManifest(job)


def launch_build(
    settings: BuildSettings,
    beam_argv: Sequence[str],
    stage: Callable[[str], Source] | None = None,
    default_runner: Sequence[str] | None = None,
) -> bool:
    """Run the checked build and publish it; False for a dry run (nothing published). ``stage(staging)``
    writes a table's source into the staging directory first (``lidarshard.write_manifest``)."""

    def write(pipeline: beam.Pipeline, staging: str) -> None:
        build_pipeline(pipeline, settings, staging, stage(staging) if stage is not None else None)

    return launch.launch(write, beam_argv, settings.output, default_runner)


def print_summary(out: str) -> None:
    """The build's summary: counts, the plan, a row of balance numbers per epoch (``lidarshard build
    --help`` says what each means), what the plan buys in plain words, and where the manifest is."""
    m = load_manifest(out)
    c = m.counts
    for line in understood.input_lines(m.provenance, *understood.by_input(out, m.provenance)):
        print(line)
    print(
        understood.counts_line(c.scanned, c.accepted, c.rejected, c.dropped, c.padded)
        + "".join(f"\n  rejected {r}: {n}" for r, n in sorted(c.rejected_by_reason.items()))
    )
    print(understood.points_line(m.provenance))
    print(
        f"plan: {m.strategy}, world size {m.world_size}, batch {m.batch_size}, "
        f"{m.buckets.k} buckets, cost model {m.cost_model.name} (columns: lidarshard build --help)"
    )
    print("epoch  steps  linearity  random  greedy_reference  spearman  samples/rank-step mean max")
    for b in m.balance:
        print(
            f"{b.epoch:>5}  {b.steps:>5}  {b.linearity:>9.4f}  {b.random_linearity:>6.4f}  "
            f"{b.greedy_reference:>16.4f}  {b.spearman_step_cost:>+8.3f}  "
            f"{b.mean_count:>22.3f} {b.max_count:>3}"
        )
    if m.repeat:
        rep = m.repeat
        scale = ",".join(f"{k}={v:g}" for k, v in sorted((rep.datasets or {}).items()))
        mode = " x ".join(w for w in (rep.mode, scale and f"datasets {scale}") if w)
        print(
            f"weights {mode}: copies per epoch expected/realized (mean of epochs), per class: "
            + ", ".join(
                f"{k} {v:.1f}/{sum(r.get(k, 0.0) for r in rep.realized) / len(rep.realized):.1f}"
                for k, v in sorted(rep.expected.items(), key=lambda kv: (len(kv[0]), kv[0]))
            )
        )
    if m.pair_repeat_rate:
        print(
            "pair repeat rate epoch 0->1: " + ", ".join(f"{k} {v:.4f}" for k, v in m.pair_repeat_rate.items())
        )
    if m.rank_speed is not None:
        speeds = ",".join(f"{v:g}" for v in m.rank_speed)
        print(
            f"rank speeds {speeds}: linearity of the ranks' times (cost / speed) per epoch "
            + ", ".join(f"{_or_nan(b.speed_linearity):.4f}" for b in m.balance)
            + " (random "
            + ", ".join(f"{_or_nan(b.random_speed_linearity):.4f}" for b in m.balance)
            + ")"
        )
    if m.memory_cap is not None:
        cap, mm = m.memory_cap, m.memory_cap.model
        print(
            f"memory cap {format_bytes(cap.max_step_bytes)} per rank-step: predicted peak = "
            f"{format_bytes(mm.base_bytes)} + {mm.bytes_per_point:.4g} B/point + {mm.bytes_per_voxel:.4g} B/voxel"
        )
    for line in filter(None, map(plan_buys, m.balance)):
        print(line)
    if untimed(m.cost_model) is None:  # a calibrated ms model: each epoch's seconds before it runs
        print("\n".join(epoch_lines(m, plan_loads(out, m, read_samples(out)))))
    print(f"wrote {out}")


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value


def run(argv: list[str] | None = None) -> int:
    """Entry point of ``lidarshard build``: exits 2 on a usage error, raises when the run fails."""
    return launch.run_command(
        "build", parser(), argv, BuildOptions, build_settings, launch_build, print_summary
    )


if __name__ == "__main__":
    sys.exit(run())

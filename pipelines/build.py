"""``lidarshard build INPUT OUT --world-size W --batch-size B``: balanced, rank-sharded manifests.

One Beam pipeline: scan (or ``--from-samples``) -> accounting check -> cost -> exact quantile
buckets -> samples parts (in parallel) -> per-epoch plans (epochs in parallel) -> plan files ->
``_manifest.json``; the launcher then writes ``_SUCCESS`` and publishes the staging directory as OUT.

No step holds the samples' paths. The scan writes its rows in hash shards of sample_id, then one
task per sample_id range merges that range from every shard into a scratch samples part
(``transforms.features.shards``); ``--from-samples`` streams the earlier samples (parts, or a 2.x
samples.parquet) when its ids are sorted, as lidarshard writes them. Either is settled and scored
from four numeric columns, then one task per part streams its rows into the new samples part a row
group at a time (``transforms.features.previous``). An epoch is planned from the numeric columns
(``transforms.plan.sharded``), then one task per (epoch, row range of the samples) writes each
rank's rows of that range to a scratch file under ``_work/``, and one task per (epoch, rank) sorts
its pieces into the rank's plan file.

Bucket edges are exact quantiles of the gathered cost column, not Beam's ApproximateQuantiles,
whose result can depend on bundling and would break byte-identical output across runners.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.metrics import Metrics

from lidarshard import schemas
from lidarshard.pipelines import _score, launch, options
from lidarshard.transforms import storage
from lidarshard.transforms.arrow import parquet_bytes, read_rows
from lidarshard.transforms.beam.scan import NAMESPACE, ScanSamples
from lidarshard.transforms.beam.tagged import GatherTagged, SplitTags, tag
from lidarshard.transforms.features import repeat
from lidarshard.transforms.features.cost import CostModel
from lidarshard.transforms.parts import open_parts, parts_holding, read_parts, samples_files
from lidarshard.transforms.plan import manifest, sharded
from lidarshard.transforms.plan.epochs import PlanConfig

__all__ = ["run", "parser", "prepare", "build_pipeline", "launch_build"]

USAGE = (
    "lidarshard build INPUT OUT --world-size W --batch-size B [options] [beam options]\n"
    "       lidarshard build OUT --from-samples PREV/samples --world-size W --batch-size B [options]"
)


def parser() -> launch.CommandParser:
    """The ``build`` command line: paths, scan flags, plan flags, Beam options."""
    p = launch.CommandParser("lidarshard build", __doc__.split("\n\n")[0].replace("``", ""), usage=USAGE)
    p.add_argument("paths", nargs="+", metavar="PATH", help="INPUT OUT, or only OUT with --from-samples")
    options.add_scan_arguments(p)
    options.add_plan_arguments(p)
    return p


def _plan_epoch(task: tuple[int, dict], cfg: PlanConfig, staging: str):
    """Plan epoch ``task[0]`` from the numeric columns of the samples: ``("stats", stats)``, one
    ``("shard", (epoch, start, stop, entries, (parts holding it, their first row)))`` per shard holding
    planned samples and one
    ``("rank", ((epoch, rank), -1))`` per rank (so every rank's file is written). ``task[1]``
    (the metadata once every samples part is written) names the parts."""
    epoch, checked = task
    parts = _score.written_parts(checked, staging)
    numeric = read_parts(parts, columns=sharded.NUMERIC_INPUT)
    part, stats = sharded.assignment(numeric, epoch, cfg)
    Metrics.counter(NAMESPACE, "planned").inc(stats["planned"])
    yield "stats", stats
    for start, stop in sharded.shard_bounds(numeric.num_rows):
        entries = sharded.slice_rows(part, start, stop)
        if entries["row"].size:
            yield (
                "shard",
                (epoch, start, stop, entries, parts_holding(parts, checked["part_rows"], start, stop)),
            )
    for rank in range(cfg.world_size):
        yield "rank", ((epoch, rank), -1)


def _piece_path(staging: str, epoch: int, rank: int, start: int) -> str:
    return storage.join(staging, launch.WORK_DIR, f"epoch={epoch}", f"rank={rank}", f"{start:012d}.parquet")


def _write_pieces(shard: tuple[int, int, int, dict, tuple[list[str], int]], staging: str):
    """Rows [start, stop) of the samples -> each rank's plan rows from them, in a scratch file:
    ``((epoch, rank), start)`` per file written."""
    epoch, start, stop, entries, (parts, first) = shard
    with open_parts(parts) as file:
        rows = read_rows(file, start - first, stop - first, sharded.COPIED)
    for rank, piece in sharded.rank_pieces(rows, start, entries).items():
        storage.write_bytes(_piece_path(staging, epoch, rank, start), parquet_bytes(piece))
        yield (epoch, rank), start


def _write_rank(grouped: tuple[tuple[int, int], list[int]], staging: str) -> dict:
    """Rank ``rank``'s plan file of epoch ``epoch`` from its pieces (``grouped``: ((epoch, rank),
    piece starts)); its ``files`` entry."""
    (epoch, rank), starts = grouped
    pieces = [storage.read_parquet(_piece_path(staging, epoch, rank, s)) for s in sorted(set(starts) - {-1})]
    data = parquet_bytes(sharded.finish_rank(pieces))
    return manifest.write_file(_score.writer(staging), schemas.plan_file(epoch, rank), data)


def _write_manifest(gathered: dict[str, list], staging: str, meta: dict, cfg: PlanConfig) -> None:
    """``gathered``: ``{"checked": [CheckAndScore's dict], "files": [...], "stats": [...]}``; then the
    scratch directory goes."""
    (checked,) = gathered["checked"]
    files, stats = [*checked["files"], *gathered.get("files", [])], gathered.get("stats", [])
    storage.write_json(
        storage.join(staging, schemas.MANIFEST_FILE), manifest.manifest_json(meta, cfg, checked, files, stats)
    )
    storage.remove_tree(storage.join(staging, launch.WORK_DIR))


def build_pipeline(
    pipeline: beam.Pipeline, args: argparse.Namespace, cfg: PlanConfig, model: CostModel, staging: str
) -> None:
    """Wire the build; ``args`` are the checked flags (``prepare``). Each step gets what it needs as
    its main input (``GatherTagged``), never as a singleton side input, so every runner computes
    each step once (see ``transforms.beam.tagged``)."""
    scan_cfg = options.scan_config(args)
    settings = {"max_reject": args.max_reject_fraction, "rejects_out": args.rejects_out, "staging": staging,
                "root": args.relative_to, "from_samples": bool(args.from_samples),
                "part_rows": args.part_rows}  # fmt: skip
    if args.from_samples:  # read where it is used: passing the table along would pickle it
        scored = (
            pipeline
            | "Previous" >> beam.Create([args.from_samples])
            | "CheckAndScore" >> beam.FlatMap(_score.settle_previous, model, cfg, settings)
        )
    else:
        work = storage.join(staging, launch.WORK_DIR)
        scratch = storage.join(work, _score.SCANNED_DIR)
        scan = pipeline | "Scan" >> ScanSamples(
            args.input, scan_cfg, args.nuscenes_version, args.sweeps, work, scratch, args.part_rows
        )
        scored = scan.gathered() | "CheckAndScore" >> beam.FlatMap(_score.settle_scan, model, cfg, settings)
    scored = scored | "SplitScored" >> SplitTags("scored", "part")
    written = (
        scored["part"]
        | "SpreadParts" >> beam.Reshuffle()
        | "WriteSamples" >> beam.Map(_score.write_part, staging)
    )
    checked = (
        (tag(scored["scored"], "scored"), tag(written, "written"))
        | "GatherSamples" >> GatherTagged()
        | "SamplesWritten" >> beam.Map(_score.samples_written)
    )
    planned = (
        checked
        | "Epochs" >> beam.FlatMap(lambda c: [(e, c) for e in range(cfg.epochs)])
        | "SpreadEpochs" >> beam.Reshuffle()
        | "PlanEpoch" >> beam.FlatMap(_plan_epoch, cfg, staging)
        | "SplitPlan" >> SplitTags("stats", "shard", "rank")
    )
    pieces = (
        planned["shard"]
        | "SpreadShards" >> beam.Reshuffle()
        | "WritePieces" >> beam.FlatMap(_write_pieces, staging)
    )
    files = (
        (planned["rank"], pieces)
        | "AllPieces" >> beam.Flatten()
        | "ByRank" >> beam.GroupByKey()
        | "WriteRanks" >> beam.Map(_write_rank, staging)
    )
    meta = options.scan_meta(args, scan_cfg, launch.VERSION)
    meta |= {"from_samples": args.from_samples, "path_root": args.relative_to}
    _ = (
        (tag(checked, "checked"), tag(files, "files"), tag(planned["stats"], "stats"))
        | "GatherAll" >> GatherTagged()
        | "WriteManifest" >> beam.Map(_write_manifest, staging, meta, cfg)
    )


def prepare(args: argparse.Namespace, dry_run: bool = False) -> tuple[PlanConfig, CostModel]:
    """Check every value and path before Beam starts (raises UsageError with one line).

    ``dry_run``: only the job graph will be built; remote paths are not looked at (a dry run works
    offline) and OUT is not checked for replacing (nothing is published).
    """
    want = 1 if args.from_samples else 2
    if len(args.paths) != want:
        raise launch.UsageError(
            "expected OUT with --from-samples" if args.from_samples else "expected INPUT OUT"
        )
    args.input, args.output = (args.from_samples, args.paths[0]) if args.from_samples else args.paths
    args.input, args.output = storage.absolute(args.input), storage.absolute(args.output)
    args.from_samples = storage.absolute(args.from_samples)
    if args.from_samples:  # a samples directory may be given with a trailing slash
        args.from_samples = args.from_samples.rstrip("/") or "/"
    args.relative_to = options.path_root(args)
    cfg = options.plan_config(args)
    model = options.cost_model(args.cost_model)
    look = not dry_run or storage.is_local(args.input)
    if args.from_samples and look:
        rows, recorded = options.check_from_samples(args.from_samples)
        if args.max_reject_fraction is None:
            args.max_reject_fraction = recorded
        if rows < cfg.world_size * cfg.batch_size and cfg.policy == "drop_last" and not cfg.weights:
            raise launch.UsageError(
                f"--world-size {cfg.world_size} x --batch-size {cfg.batch_size} = "
                f"{cfg.world_size * cfg.batch_size} samples per step, but {args.from_samples} holds {rows}; "
                "use --pad or a smaller --world-size/--batch-size"
            )
    elif look:
        options.check_input(args.input)
        options.check_nuscenes(args.input, args.nuscenes_version)
    _check_weights(args, cfg, look)
    if args.max_reject_fraction is None:
        args.max_reject_fraction = options.DEFAULT_REJECT_FRACTION
    options.check_output(args.output, [args.input], publish=not dry_run)
    args.rejects_out = launch.rejects_path(args.output)
    return cfg, model


def _check_weights(args: argparse.Namespace, cfg: PlanConfig, look: bool) -> None:
    """``--sample-weights`` names a good column of the ``--from-samples`` table; ``--repeat-factors``
    has lidarseg labels to read (a dataroot with ``lidarseg.json``, or labelled samples). Files are
    only looked at with ``look`` (not in an offline dry run)."""
    if args.sample_weights is not None and not args.from_samples:
        raise launch.UsageError(
            f"--sample-weights {args.sample_weights} reads a column of a --from-samples table: "
            "add --from-samples PREV/samples"
        )
    if not look:
        return
    files = samples_files(args.from_samples) if args.from_samples else []
    if args.sample_weights is not None:
        with open_parts(files) as file:
            schema = file.schema_arrow
        table = (  # only the column: a missing one gets named with the ones there are
            read_parts(files, columns=[args.sample_weights])
            if args.sample_weights in schema.names
            else schema.empty_table()
        )
        try:
            repeat.check_weights(table, args.sample_weights, cfg.max_plan_factor)
        except ValueError as e:
            raise launch.UsageError(f"--sample-weights {e}") from None
    if cfg.repeat.threshold is None:
        return
    if args.from_samples:
        labelled = read_parts(files, columns=["label_path"]).column("label_path")
        if labelled.null_count == len(labelled):
            raise launch.UsageError(
                f"--repeat-factors: no sample of {args.from_samples} has lidarseg labels (label_path)"
            )
    elif not args.nuscenes_version or not storage.exists(
        storage.join(args.input, args.nuscenes_version, "lidarseg.json")
    ):
        where = f"{args.input}/{args.nuscenes_version}" if args.nuscenes_version else args.input
        raise launch.UsageError(
            f"--repeat-factors reads lidarseg labels: {where} has no lidarseg.json "
            "(a nuScenes dataroot with lidarseg, read with --nuscenes-version)"
        )


def launch_build(
    args: argparse.Namespace, beam_argv: Sequence[str], cfg: PlanConfig, model: CostModel
) -> bool:
    """Run the checked build; False for a dry run (nothing published)."""
    opts = launch.beam_options(beam_argv)
    staging = launch.new_staging(opts, args.output)
    pipeline = beam.Pipeline(options=opts)
    build_pipeline(pipeline, args, cfg, model, staging)
    return launch.run_pipeline(pipeline, staging, args.output)


def print_summary(out: str) -> None:
    m = storage.read_json(storage.join(out, schemas.MANIFEST_FILE))
    c = m["counts"]
    print(
        f"scanned {c['scanned']}: accepted {c['accepted']}, rejected {c['rejected']}"
        + "".join(f"\n  rejected {r}: {n}" for r, n in sorted(c["rejected_by_reason"].items()))
    )
    print(
        f"plan: {m['strategy']}, world size {m['world_size']}, batch {m['batch_size']}, "
        f"{len(m['buckets']['counts'])} buckets, cost model {m['cost_model']['name']}"
    )
    print("epoch  steps  linearity  bound   random  spearman  count/rank-step mean max")
    for b in m["balance"]:
        print(
            f"{b['epoch']:>5}  {b['steps']:>5}  {b['linearity']:>9.4f}  {b['bound']:.4f}  "
            f"{b['random_linearity']:.4f}  {b['spearman_step_cost']:+.3f}  "
            f"{b.get('mean_count', m['batch_size']):>20.3f} {b.get('max_count', m['batch_size']):>3}"
        )
    if m.get("repeat"):
        rep = m["repeat"]
        print(
            f"weights {rep['mode']}: copies per epoch expected/realized (mean of epochs), per class: "
            + ", ".join(
                f"{k} {v:.1f}/{sum(r.get(k, 0.0) for r in rep['realized']) / len(rep['realized']):.1f}"
                for k, v in sorted(rep["expected"].items(), key=lambda kv: (len(kv[0]), kv[0]))
            )
        )
    if m.get("pair_repeat_rate"):
        print(
            "pair repeat rate epoch 0->1: "
            + ", ".join(f"{k} {v:.4f}" for k, v in m["pair_repeat_rate"].items())
        )
    print(f"wrote {out}")


def run(argv: list[str] | None = None) -> int:
    """Entry point of ``lidarshard build``: exits 2 on a usage error, raises when the run fails."""
    p = parser()
    args, beam_argv = p.parse(argv)
    try:
        cfg, model = prepare(args, launch.dry_run_requested(beam_argv))
    except launch.UsageError as e:
        p.fail(str(e))
    if launch_build(args, beam_argv, cfg, model):
        print_summary(args.output)
    else:
        print(launch.DRY_RUN_NOTE)
    return 0


if __name__ == "__main__":
    sys.exit(run())

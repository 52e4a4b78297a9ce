"""``lidarshard build INPUT OUT --world-size W --batch-size B``: balanced, rank-sharded manifests.

One Beam pipeline: scan (or ``--from-samples``) -> accounting check -> cost -> exact quantile
buckets -> per-epoch plans (epochs in parallel) -> Parquet files -> ``_manifest.json``; the
launcher then writes ``_SUCCESS`` and publishes the staging directory as OUT.

Bucket edges are exact quantiles of the gathered cost column, not Beam's ApproximateQuantiles,
whose result can depend on bundling and would break byte-identical output across runners.
"""

from __future__ import annotations

import argparse
import sys

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from lidarshard import schemas
from lidarshard.pipelines.scan import (
    DRY_RUN_NOTE,
    VERSION,
    add_scan_arguments,
    beam_options,
    new_staging,
    run_pipeline,
    scan_config,
    scan_meta,
    scan_results,
)
from lidarshard.transforms import paths, storage
from lidarshard.transforms.arrow import parquet_bytes, sha256_hex
from lidarshard.transforms.beam.scan import NAMESPACE, ScanSamples, input_root
from lidarshard.transforms.beam.tagged import GatherTagged, tag
from lidarshard.transforms.features.accounting import counts_of, fingerprint, settle
from lidarshard.transforms.features.cost import CostModel, parse_cost_model, sample_costs
from lidarshard.transforms.plan import DEFAULT_STRATEGY, STRATEGIES
from lidarshard.transforms.plan.caps import Caps, over_cap
from lidarshard.transforms.plan.epochs import PlanConfig, bucket_info, plan_tables, repeat_rates, score

__all__ = ["run", "add_plan_arguments", "plan_config"]


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("plan")
    g.add_argument("--world-size", type=int, required=True, help="data-parallel ranks W")
    g.add_argument("--batch-size", type=int, required=True, help="samples per rank per step B")
    g.add_argument("--epochs", type=int, default=1, help="epochs to plan (1)")
    g.add_argument("--seed", type=int, default=0, help="plan seed (0)")
    g.add_argument("--strategy", choices=sorted(STRATEGIES), default=DEFAULT_STRATEGY)
    g.add_argument("--buckets", type=int, help="cost buckets K (default: from the data)")
    g.add_argument(
        "--bucket-weights",
        type=lambda s: tuple(float(v) for v in s.split(",")),
        help="w0,w1,..: w>1 repeats a bucket's samples, w<1 thins them",
    )
    g.add_argument("--cost-model", default="voxels", help="points | voxels | linear:c0,a,b | @fit.json")
    pol = g.add_mutually_exclusive_group()
    pol.add_argument(
        "--drop-last",
        dest="policy",
        action="store_const",
        const="drop_last",
        help="drop the samples that do not fill a last step (default)",
    )
    pol.add_argument(
        "--pad",
        dest="policy",
        action="store_const",
        const="pad",
        help="repeat random samples to fill the last step",
    )
    g.add_argument("--from-samples", help="re-plan from a previous run's samples.parquet (no rescan)")
    g.add_argument(
        "--relative-to",
        metavar="ROOT",
        help="store sample paths relative to ROOT and record it, so the data can move (default: the "
        "dataroot for --nuscenes-version, INPUT for a directory, the part before the first wildcard "
        "for a glob; with --from-samples the previous run's root); 'none' stores full paths",
    )
    g.add_argument(
        "--max-points-per-rank-step",
        type=int,
        default=None,
        help="hard cap on points (num_points) one rank gets at one step (none); a sample above it is "
        "rejected as over_cap; budget plans within it, other strategies fail if they exceed it",
    )
    g.add_argument(
        "--max-cost-per-rank-step",
        type=float,
        default=None,
        help="hard cap on predicted cost one rank gets at one step (none); as --max-points-per-rank-step",
    )
    g.add_argument(
        "--max-samples-per-rank-step",
        type=int,
        default=None,
        help="hard cap on samples one rank gets at one step (none)",
    )
    parser.set_defaults(policy="drop_last")


def previous_root(samples_path: str) -> str | None:
    """The ``path_root`` recorded next to an earlier run's samples.parquet (None: full paths)."""
    base = samples_path.rsplit("/", 1)[0] if "/" in samples_path else "."
    for name in (schemas.MANIFEST_FILE, schemas.SCAN_FILE):
        try:
            meta = storage.read_json(storage.join(base, name))
            return meta.get("path_root") if isinstance(meta, dict) else None
        except (OSError, ValueError):
            continue
    return None


def path_root(args: argparse.Namespace) -> str | None:
    """ROOT the manifest's paths are stored relative to (``--relative-to``; None: full paths)."""
    if args.relative_to is not None:
        return None if args.relative_to.lower() == "none" else storage.absolute(args.relative_to.rstrip("/"))
    if args.from_samples:
        return previous_root(args.from_samples)
    if args.nuscenes_version:
        return args.input.rstrip("/")
    return input_root(args.input)


def plan_config(args: argparse.Namespace) -> PlanConfig:
    return PlanConfig(
        world_size=args.world_size,
        batch_size=args.batch_size,
        epochs=args.epochs,
        seed=args.seed,
        strategy=args.strategy,
        policy=args.policy,
        num_buckets=args.buckets,
        weights=args.bucket_weights,
        caps=Caps(args.max_points_per_rank_step, args.max_cost_per_rank_step, args.max_samples_per_rank_step),
    )


def _write(staging: str, rel: str, data: bytes) -> dict:
    storage.write_bytes(storage.join(staging, rel), data)
    Metrics.counter(NAMESPACE, "files_written").inc()
    Metrics.counter(NAMESPACE, "bytes_written").inc(len(data))
    return {"path": rel, "bytes": len(data), "sha256": sha256_hex(data)}


def _previous_samples(path: str) -> pa.Table:
    """The ``--from-samples`` table, checked and sorted by sample_id (``settle`` then rejects duplicates).

    Raises:
        ValueError: not a lidarshard samples table: columns missing or of another type, null or
            non-string sample ids (one line naming the file and the fix).
    """
    where = f"--from-samples {path}"
    try:
        samples = storage.read_parquet(path)
    except pa.ArrowException as e:
        raise ValueError(f"{where} is not a readable Parquet file ({str(e)[:120]})") from None
    want = schemas.sample_schema()
    missing = [n for n in want.names if n not in samples.column_names]
    if missing:
        raise ValueError(f"{where} lacks columns {missing}: pass a samples.parquet written by lidarshard")
    ids = samples.column("sample_id")
    if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
        raise ValueError(f"{where}: sample_id is {ids.type}, not strings: pass a lidarshard samples.parquet")
    if ids.null_count:
        raise ValueError(f"{where}: {ids.null_count} rows have a null sample_id")
    try:
        samples = samples.select(want.names).cast(want)
    except (pa.ArrowException, ValueError) as e:
        raise ValueError(f"{where}: columns do not match the samples contract ({str(e)[:160]})") from None
    return samples.sort_by([("sample_id", "ascending"), ("path", "ascending")])


def _previous(path: str, new_root: str | None) -> tuple[int, pa.Table, pa.Table]:
    """(scanned, samples, rejects) of an earlier scan/build whose samples.parquet is ``path``, with its
    sample paths re-rooted from the earlier run's ``path_root`` onto ``new_root``."""
    samples = _previous_samples(path)
    root = path.rsplit("/", 1)[0] if "/" in path else "."
    samples = paths.relative_to(paths.absolute(samples, previous_root(path)), new_root)
    try:
        rejects = storage.read_parquet(storage.join(root, schemas.REJECTS_FILE))
    except OSError:
        rejects = schemas.reject_schema().empty_table()
    return samples.num_rows + rejects.num_rows, samples, rejects


def _reject_over_cap(
    samples: pa.Table, rejects: pa.Table, model: CostModel, cfg: PlanConfig, scanned: int, max_reject: float
) -> tuple[pa.Table, pa.Table, dict]:
    """Move the samples that alone exceed a cap to rejects (reason ``over_cap``); recount."""
    points = samples.column("num_points").to_numpy(zero_copy_only=False)
    details = over_cap(sample_costs(samples, model), points, cfg.caps)
    bad = np.array([bool(d) for d in details], dtype=bool)
    if bad.any():
        rows = {
            "path": samples.column("path").filter(pa.array(bad)).to_pylist(),
            "reason": ["over_cap"] * int(bad.sum()),
            "detail": [d for d in details if d],
        }
        rejects = pa.concat_tables([rejects, pa.Table.from_pydict(rows, schema=rejects.schema)])
        rejects = rejects.sort_by([(c, "ascending") for c in ("path", "reason", "detail")])
        samples = samples.filter(pa.array(~bad))
    return samples, rejects, counts_of(scanned, samples, rejects, max_reject)


def _check_and_score(
    model: CostModel,
    cfg: PlanConfig,
    max_reject: float,
    staging: str,
    root: str | None,
    from_samples: bool,
    scanned: int,
    samples: pa.Table,
    rejects: pa.Table,
) -> dict:
    """Settle, score, write samples/rejects.parquet; returns only small metadata.

    The scored table is not returned: passed along it would be pickled to every epoch's worker
    (1M rows: ~250 MB a copy). Epochs read the columns they need back from the staged file.
    """
    samples, rejects, counts = settle(scanned, samples, rejects, max_reject)
    if cfg.caps.active:
        samples, rejects, counts = _reject_over_cap(samples, rejects, model, cfg, scanned, max_reject)
    if samples.num_rows == 0:
        raise ValueError(f"no sample was accepted ({counts}); nothing to plan")
    if root is not None and not from_samples:  # --from-samples re-rooted them when reading
        samples = paths.relative_to(samples, root)
    scored, edges = score(samples, model, cfg)
    return {
        "files": [
            _write(staging, schemas.SAMPLES_FILE, parquet_bytes(scored)),
            _write(staging, schemas.REJECTS_FILE, parquet_bytes(rejects)),
        ],
        "counts": counts,
        "model": model.to_json(),
        "buckets": bucket_info(scored, edges, cfg),
        "fingerprint": fingerprint(samples),
        "pair_repeat_rate": repeat_rates(scored, cfg),
    }


#: The columns of the scored samples an epoch's plan needs.
_PLAN_INPUT = ["sample_id", "path", "sweep_paths", "cost", "bucket_id", "num_points"]


def _plan_epoch(task: tuple[int, dict], cfg: PlanConfig, staging: str):
    """Plan epoch ``task[0]`` and write its rank files: ``("files", entry)`` per file, then
    ``("stats", stats)``. ``task[1]`` (CheckAndScore's metadata) only orders this after it."""
    epoch, _ = task
    scored = storage.read_parquet(storage.join(staging, schemas.SAMPLES_FILE), columns=_PLAN_INPUT)
    tables, stats = plan_tables(scored, epoch, cfg)
    Metrics.counter(NAMESPACE, "planned").inc(stats["planned"])
    for rank, table in enumerate(tables):
        yield "files", _write(staging, schemas.plan_file(epoch, rank), parquet_bytes(table))
    yield "stats", stats


def _write_manifest(gathered: dict[str, list], staging: str, meta: dict, cfg: PlanConfig) -> None:
    """``gathered``: ``{"checked": [CheckAndScore's dict], "files": [...], "stats": [...]}``."""
    (checked,), files, stats = gathered["checked"], gathered["files"], gathered["stats"]
    stats = sorted(stats, key=lambda s: s["epoch"])
    balance = [{k: v for k, v in s.items() if k not in ("planned", "dropped", "padded")} for s in stats]
    counts = dict(checked["counts"])
    for key in ("planned", "dropped", "padded"):
        counts[key] = [s[key] for s in stats]
    manifest = meta | {
        "world_size": cfg.world_size,
        "batch_size": cfg.batch_size,
        "epochs": cfg.epochs,
        "seed": cfg.seed,
        "strategy": cfg.strategy,
        "policy": cfg.policy,
        "caps": cfg.caps.to_json(),
        "cost_model": checked["model"],
        "buckets": checked["buckets"],
        "steps_per_epoch": [s["steps"] for s in stats],
        "counts": counts,
        "balance": balance,
        "pair_repeat_rate": checked["pair_repeat_rate"],
        "inputs_fingerprint": checked["fingerprint"],
        "files": {
            f["path"]: {"bytes": f["bytes"], "sha256": f["sha256"]}
            for f in sorted(files, key=lambda f: f["path"])
        },
        "plan_schema": schemas.schema_to_json(schemas.plan_schema()),
    }
    storage.write_json(storage.join(staging, schemas.MANIFEST_FILE), manifest)


def build_pipeline(pipeline: beam.Pipeline, args: argparse.Namespace, cfg: PlanConfig, staging: str) -> None:
    """Wire the build. Each step gets what it needs as its main input (``GatherTagged``), never as
    a singleton side input, so every runner computes each step once (see ``transforms.beam.tagged``)."""
    scan_cfg = scan_config(args)
    model = parse_cost_model(args.cost_model)  # launcher reads @file
    settings = (model, cfg, args.max_reject_fraction, staging, args.relative_to, bool(args.from_samples))
    if args.from_samples:  # read where it is used: passing the table along would pickle it
        checked = (
            pipeline
            | "Previous" >> beam.Create([args.from_samples])
            | "CheckAndScore"
            >> beam.Map(lambda path, *a: _check_and_score(*a, *_previous(path, args.relative_to)), *settings)
        )
    else:
        scan = pipeline | "Scan" >> ScanSamples(args.input, scan_cfg, args.nuscenes_version, args.sweeps)
        checked = (
            (tag(scan.scanned, "scanned"), tag(scan.samples, "samples"), tag(scan.rejects, "rejects"))
            | "GatherScan" >> GatherTagged()
            | "CheckAndScore" >> beam.Map(lambda g, *a: _check_and_score(*a, *scan_results(g)), *settings)
        )
    planned = (
        checked
        | "Epochs" >> beam.FlatMap(lambda c: [(e, c) for e in range(cfg.epochs)])
        | "SpreadEpochs" >> beam.Reshuffle()
        | "PlanEpoch" >> beam.FlatMap(_plan_epoch, cfg, staging)
    )
    sample_files = checked | "SampleFiles" >> beam.FlatMap(lambda c: [("files", f) for f in c["files"]])
    meta = scan_meta(args, scan_cfg) | {"from_samples": args.from_samples, "path_root": args.relative_to}
    _ = (
        (tag(checked, "checked"), sample_files, planned)
        | "GatherAll" >> GatherTagged()
        | "WriteManifest" >> beam.Map(_write_manifest, staging, meta, cfg)
    )


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
    if m.get("pair_repeat_rate"):
        print(
            "pair repeat rate epoch 0->1: "
            + ", ".join(f"{k} {v:.4f}" for k, v in m["pair_repeat_rate"].items())
        )
    print(f"wrote {out}")


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lidarshard build", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "paths", nargs="+", metavar="INPUT OUT", help="INPUT OUT, or just OUT with --from-samples"
    )
    add_scan_arguments(parser)
    add_plan_arguments(parser)
    args, beam_args = parser.parse_known_args(argv)
    want = 1 if args.from_samples else 2
    if len(args.paths) != want:
        parser.error("expected OUT with --from-samples, else INPUT OUT")
    args.input, args.output = (args.from_samples, args.paths[0]) if args.from_samples else args.paths
    args.input, args.output = storage.absolute(args.input), storage.absolute(args.output)
    args.from_samples = storage.absolute(args.from_samples)
    args.relative_to = path_root(args)
    try:
        cfg = plan_config(args)
        parse_cost_model(args.cost_model)
        if args.from_samples:
            _previous_samples(args.from_samples)  # refuse bad input before Beam starts
    except (ValueError, OSError) as e:
        parser.error(str(e))
    options = beam_options(beam_args)
    staging = new_staging(options, args.output)
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, args, cfg, staging)
    if run_pipeline(pipeline, staging, args.output):
        print_summary(args.output)
    else:
        print(DRY_RUN_NOTE)
    return 0


__version__ = VERSION

if __name__ == "__main__":
    sys.exit(run())

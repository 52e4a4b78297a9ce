"""What ``scan`` and ``build`` accept, declared once, and every check that runs before Beam starts.

Adding a flag is one :func:`~lidarshard.pipelines.launch.flag` call in ``add_scan_arguments`` /
``add_plan_arguments`` (name, validator, default, help) plus, for a cross-flag rule, a line in
``plan_config``. Path checks (INPUT, OUT, nuScenes version, ``--from-samples``) raise
:class:`~lidarshard.pipelines.launch.UsageError` with one line naming the path and what is wrong.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import tempfile

import pyarrow as pa

from lidarshard import schemas
from lidarshard.pipelines import _output
from lidarshard.pipelines.launch import UsageError, flag, float_in, float_list, int_in
from lidarshard.transforms import paths, storage
from lidarshard.transforms.features.cost import COST_MODEL_HELP, CostModel, parse_cost_model
from lidarshard.transforms.features.repeat import WeightSpec, parse_repeat_factors
from lidarshard.transforms.features.sample import FEATURE_MODES, ScanConfig
from lidarshard.transforms.formats.readers import FORMATS
from lidarshard.transforms.parts import PART_ROWS, open_parts, read_parts, samples_files
from lidarshard.transforms.plan import DEFAULT_STRATEGY, STRATEGIES, STRATEGY_HELP
from lidarshard.transforms.plan.caps import Caps
from lidarshard.transforms.plan.epochs import MAX_PLAN_FACTOR, PlanConfig

__all__ = [
    "DEFAULT_REJECT_FRACTION",
    "add_scan_arguments",
    "add_plan_arguments",
    "scan_config",
    "scan_meta",
    "plan_config",
    "path_root",
    "previous_root",
    "previous_dir",
    "cost_model",
    "check_input",
    "check_output",
    "check_output_parent",
    "check_nuscenes",
    "check_from_samples",
    "read_previous_samples",
]

DEFAULT_REJECT_FRACTION = 0.01
VOXEL_RANGE = (1e-3, 1e3)  # m: below 1 mm the int64 voxel grid of a 100 km cloud overflows


def add_scan_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags that decide what is read and how features are computed (shared by ``scan`` and ``build``)."""
    g = parser.add_argument_group("scan")
    flag(
        g, "--nuscenes-version", "INPUT is a nuScenes dataroot: read its v1.0-xxx tables", metavar="V1.0-XXX"
    )
    flag(g, "--sweeps", "previous sweeps aggregated per keyframe (nuScenes tables)", type=int_in(0, 1000),
         default=0, metavar="N")  # fmt: skip
    flag(g, "--format", "override extension-based format detection", choices=FORMATS, shown="by extension")
    flag(g, "--point-dims", "float32 values per point of headerless .bin files", type=int_in(3, 64),
         shown="by format", metavar="N")  # fmt: skip
    flag(g, "--voxel-size", f"occupancy voxel edge, metres, in [{VOXEL_RANGE[0]:g}, {VOXEL_RANGE[1]:g}]",
         type=float_in(*VOXEL_RANGE), default=0.05, metavar="M")  # fmt: skip
    flag(g, "--point-cloud-range", "x0,y0,z0,x1,y1,z1 metres: points outside are ignored",
         type=float_list(6), shown="all points", metavar="X0,Y0,Z0,X1,Y1,Z1")  # fmt: skip
    flag(g, "--features", "'stat' sizes fixed-record files from their byte count, unread",
         choices=FEATURE_MODES, default="full")  # fmt: skip
    flag(g, "--backend", "reader for .pcd/.ply", choices=("numpy", "open3d"), default="numpy")
    flag(g, "--max-file-bytes", "larger files are rejected as too_large before reading", type=int_in(1),
         default=2 << 30, shown="2 GiB", metavar="BYTES")  # fmt: skip
    flag(g, "--max-points", "larger clouds are rejected as too_large before allocation", type=int_in(1),
         default=50_000_000, shown="50M", metavar="N")  # fmt: skip
    flag(g, "--max-reject-fraction",
         "fail, publishing nothing, when more than this fraction of inputs is rejected; the rejects "
         "then go to OUT.rejects.parquet", type=float_in(0.0, 1.0),
         shown=f"{DEFAULT_REJECT_FRACTION}; with --from-samples the fraction that run recorded", metavar="F")  # fmt: skip
    flag(g, "--part-rows", "rows of each samples part (OUT/samples/part-NNNNN.parquet, one write task each); --from-samples "
         "cuts at whole 16,384-row groups and at each input file",
         type=int_in(1, 1 << 30), default=PART_ROWS, shown=f"{PART_ROWS:,}", metavar="N")  # fmt: skip


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the plan (``build`` only)."""
    g = parser.add_argument_group("plan")
    flag(g, "--world-size", "data-parallel ranks W", type=int_in(1, 1 << 20), required=True, metavar="W")  # fmt: skip
    flag(g, "--batch-size", "samples per rank per step B", type=int_in(1, 1 << 20), required=True, metavar="B")  # fmt: skip
    flag(g, "--epochs", "epochs to plan", type=int_in(1, 10_000), default=1, metavar="E")
    flag(g, "--seed", "plan seed", type=int_in(0, 2**63 - 1), default=0, metavar="S")
    flag(g, "--strategy", "how each step is filled, one of:\n" + STRATEGY_HELP, choices=sorted(STRATEGIES),
         default=DEFAULT_STRATEGY)  # fmt: skip
    flag(g, "--buckets", "cost buckets K in [1, 4096]", type=int_in(1, 4096), metavar="K",
         shown="clamp(sqrt(N)/4, 4, 64), or the number of --bucket-weights")  # fmt: skip
    flag(g, "--bucket-weights", "w0,w1,..: per-bucket sampling weight, w>1 repeats a bucket, w<1 thins it",
         type=float_list(lo=0.0), shown="all 1", metavar="W0,W1,..")  # fmt: skip
    flag(g, "--max-plan-factor", "refuse a plan with more than this many entries per input sample per epoch",
         type=float_in(1.0, 1e6), default=MAX_PLAN_FACTOR, metavar="X")  # fmt: skip
    flag(g, "--cost-model", COST_MODEL_HELP, default="voxels", metavar="MODEL")
    pol = g.add_mutually_exclusive_group()
    flag(pol, "--drop-last", "drop the samples that do not fill a last step", dest="policy", action="store_const",
         const="drop_last", shown="on")  # fmt: skip
    flag(pol, "--pad", "repeat random samples to fill the last step", dest="policy", action="store_const",
         const="pad", shown="off (--drop-last)")  # fmt: skip
    flag(g, "--from-samples", "re-plan from a previous run's samples, OUT/samples (or a 2.x samples.parquet); "
         "no rescan", metavar="SAMPLES")  # fmt: skip
    flag(g, "--relative-to", "store sample paths relative to ROOT and record it, so the data can move; 'none' "
         "stores full paths", metavar="ROOT", shown="the dataroot for --nuscenes-version, INPUT for a directory, "
         "the part before the first wildcard for a glob; with --from-samples the previous run's root")  # fmt: skip
    caps = (
        "; a sample above it is rejected as over_cap, budget plans within it, other strategies fail over it"
    )
    flag(g, "--max-points-per-rank-step", "hard cap on points (num_points) one rank gets at one step" + caps,
         type=int_in(1), metavar="N")  # fmt: skip
    flag(g, "--max-cost-per-rank-step", "hard cap on predicted cost one rank gets at one step" + caps,
         type=float_in(0.0, above=True), metavar="C")  # fmt: skip
    flag(g, "--max-samples-per-rank-step", "hard cap on samples one rank gets at one step", type=int_in(1),
         metavar="N")  # fmt: skip
    rep = g.add_mutually_exclusive_group()
    flag(rep, "--repeat-factors", "LVIS-style repeat factors from the lidarseg labels: a sample's weight is "
         "the max over its classes c of max(1, sqrt(T / f_c)), f_c the share of labelled samples holding c",
         type=_repeat_factors, metavar="lidarseg:t=T")  # fmt: skip
    flag(rep, "--sample-weights", "per-sample weights (CBGS, your own) from this numeric column of the "
         "--from-samples table; fractional weights are realized per epoch by seeded stochastic rounding",
         metavar="COLUMN")  # fmt: skip
    parser.set_defaults(policy="drop_last")


def _repeat_factors(text: str) -> float:
    try:
        return parse_repeat_factors(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def scan_config(args: argparse.Namespace) -> ScanConfig:
    """The scan flags as a ``ScanConfig`` (values were range-checked by the parser)."""
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


def scan_meta(args: argparse.Namespace, cfg: ScanConfig, version: str) -> dict:
    """Provenance recorded in ``_scan.json`` / ``_manifest.json``."""
    return {
        "schema_version": schemas.SCHEMA_VERSION,
        "created_by": f"lidarshard {version}",
        "input": args.input,
        "nuscenes_version": args.nuscenes_version,
        "sweeps": args.sweeps,
        "max_reject_fraction": args.max_reject_fraction,
        "scan_config": {k: v for k, v in vars(cfg).items() if k != "extra"},
        "part_rows": args.part_rows,
        "sample_schema": schemas.schema_to_json(schemas.sample_schema()),
    }


def previous_dir(samples_path: str) -> str:
    """The directory an earlier run's samples (``OUT/samples`` or a 2.x ``OUT/samples.parquet``) sit
    in: where its ``_manifest.json`` or ``_scan.json`` and ``rejects.parquet`` are."""
    return samples_path.rsplit("/", 1)[0] if "/" in samples_path else "."


def _recorded(samples_path: str) -> list[dict]:
    """The ``_manifest.json`` and ``_scan.json`` beside an earlier run's samples that can be read, in
    that order (lidarshard writes one of them)."""
    found = []
    for name in (schemas.MANIFEST_FILE, schemas.SCAN_FILE):
        try:
            found.append(storage.read_json(storage.join(previous_dir(samples_path), name)))
        except Exception:  # noqa: BLE001 - absent or unreadable (stores raise their own types)
            continue
    return found


def previous_root(samples_path: str) -> str | None:
    """The ``path_root`` recorded next to an earlier run's samples (None: full paths)."""
    recorded = _recorded(samples_path)
    return recorded[0].get("path_root") if recorded else None


def path_root(args: argparse.Namespace) -> str | None:
    """ROOT the manifest's paths are stored relative to (``--relative-to``; None: full paths)."""
    from lidarshard.transforms.beam.scan import input_root

    if args.relative_to is not None:
        return None if args.relative_to.lower() == "none" else storage.absolute(args.relative_to.rstrip("/"))
    if args.from_samples:
        return previous_root(args.from_samples)
    if args.nuscenes_version:
        return args.input.rstrip("/")
    return input_root(args.input)


def plan_config(args: argparse.Namespace) -> PlanConfig:
    """The plan flags as a ``PlanConfig``; cross-flag rules raise UsageError naming the flags."""
    weights, k = args.bucket_weights, args.buckets
    if weights is not None:
        if max(weights) <= 0:
            raise UsageError(f"--bucket-weights {_csv(weights)}: at least one weight must be > 0")
        if len(weights) > 1 and k is not None and k != len(weights):
            raise UsageError(
                f"--bucket-weights has {len(weights)} values but --buckets is {k}: give 1 or {k} weights"
            )
        if len(weights) > 1:
            k = len(weights)
        mean = sum(weights) / len(weights)  # plan entries per sample with equal-count buckets
        if mean > args.max_plan_factor:
            raise UsageError(
                f"--bucket-weights {_csv(weights)}: the plan would hold ~{mean:.3g}x the input samples per "
                f"epoch, more than --max-plan-factor {args.max_plan_factor:g}; lower the weights or raise it"
            )
    return PlanConfig(
        world_size=args.world_size,
        batch_size=args.batch_size,
        epochs=args.epochs,
        seed=args.seed,
        strategy=args.strategy,
        policy=args.policy,
        num_buckets=k,
        weights=weights,
        max_plan_factor=args.max_plan_factor,
        caps=Caps(args.max_points_per_rank_step, args.max_cost_per_rank_step, args.max_samples_per_rank_step),
        repeat=WeightSpec(args.repeat_factors, args.sample_weights),
    )


def _csv(values: tuple[float, ...]) -> str:
    return ",".join(f"{v:g}" for v in values)


def cost_model(spec: str) -> CostModel:
    """Parse ``--cost-model`` once, in the launcher (``@file.json`` is read here, not by workers)."""

    try:
        return parse_cost_model(spec)
    except FileNotFoundError:
        raise UsageError(f"--cost-model {spec}: no such file") from None
    except (ValueError, OSError) as e:
        raise UsageError(f"--cost-model {spec}: {getattr(e, 'strerror', None) or e}") from None


# ------------------------------------------------------------------------------------------ paths


def _exists(path: str) -> bool:
    from apache_beam.io.filesystems import FileSystems

    if storage.is_local(path):
        return os.path.lexists(path.removeprefix("file://"))
    try:
        return bool(FileSystems.match([path])[0].metadata_list) or FileSystems.exists(path)
    except Exception:  # noqa: BLE001 - a store that cannot be listed counts as "not found"
        return False


def _is_pattern(path: str) -> bool:
    """A glob: wildcard characters, unless a local file or directory has that very name."""
    return any(c in path for c in "*?[") and not (_output.is_local(path) and _exists(path))


def _root_of(path: str) -> str:
    """The directory INPUT names (the fixed part of a glob)."""
    cut = min((path.find(c) for c in "*?[" if c in path), default=-1) if _is_pattern(path) else -1
    return path[:cut].rsplit("/", 1)[0] if cut >= 0 else path.rstrip("/")


def check_input(path: str) -> None:
    """INPUT must exist: a file, a directory, or a glob matching something (local or remote)."""
    from apache_beam.io.filesystems import FileSystems

    if _is_pattern(path):
        if not FileSystems.match([path])[0].metadata_list:
            raise UsageError(f"INPUT {path}: the pattern matches no file")
        return
    if not _exists(path) and not (not storage.is_local(path) and _exists(path.rstrip("/") + "/**")):
        raise UsageError(f"INPUT {path} does not exist")


def check_output(out: str, inputs: list[str], publish: bool = True) -> None:
    """OUT must be replaceable: not a file, not INPUT or inside it, its parent writable
    (``publish=False``, a dry run: only the first two)."""
    out_root = out.rstrip("/")
    for inp in inputs:
        root = _root_of(inp)
        inside = (out_root + "/").startswith(root.rstrip("/") + "/")
        if out_root == root.rstrip("/"):
            raise UsageError(f"OUT {out} is INPUT: write the manifest to another directory")
        if inside:
            raise UsageError(
                f"OUT {out} is inside INPUT {root}: a later scan would read it; choose another OUT"
            )
    if not publish:
        return
    try:
        _output.check_replaceable(out)
    except FileExistsError as e:
        raise UsageError(f"OUT {e}".replace("OUT refusing to replace", "OUT")) from None
    check_output_parent(out)


def check_output_parent(out: str) -> None:
    """OUT must not be a file and (local) its nearest existing parent must be writable."""
    if not storage.is_local(out):
        return
    path = os.path.abspath(out.rstrip("/").removeprefix("file://"))
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UsageError(f"OUT {out}: it exists and is not a directory")
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    try:  # a real probe: access() says yes to root on a read-only or special filesystem
        os.rmdir(tempfile.mkdtemp(prefix=".lidarshard-probe-", dir=parent))
    except OSError as e:
        raise UsageError(f"OUT {out}: cannot write into {parent} ({e.strerror or e})") from None


def _versions(dataroot: str) -> list[str]:
    """The ``v1.0-*`` table folders under ``dataroot`` that hold ``sample_data.json``."""
    from apache_beam.io.filesystems import FileSystems

    if storage.is_local(dataroot):
        root = dataroot.removeprefix("file://")
        names = sorted(os.listdir(root)) if os.path.isdir(root) else []
        return [
            n
            for n in names
            if n.startswith("v1.0-") and os.path.isfile(os.path.join(root, n, "sample_data.json"))
        ]
    found = FileSystems.match([posixpath.join(dataroot.rstrip("/"), "v1.0-*", "sample_data.json")])[0]
    return sorted({m.path.rstrip("/").split("/")[-2] for m in found.metadata_list})


def check_nuscenes(input: str, version: str | None) -> None:
    """A dataroot needs ``--nuscenes-version``; a version must be one of the folders present."""
    if _is_pattern(input):
        if version:
            raise UsageError(
                f"--nuscenes-version {version}: INPUT must be the dataroot directory, not a pattern"
            )
        return
    present = _versions(input)
    if version is None:
        if present:
            raise UsageError(
                f"INPUT {input} is a nuScenes dataroot (found {', '.join(present)}): add "
                f"--nuscenes-version {present[0]} to read its tables"
            )
        return
    if version not in present:
        have = ", ".join(present) if present else "none"
        raise UsageError(
            f"--nuscenes-version {version}: no {version}/sample_data.json under {input}; present: {have}"
        )


def _check_previous_schema(where: str, table: pa.Table, want: pa.Schema | None = None) -> None:
    """The columns and types of a ``--from-samples`` table or row group: they cast to ``want`` (the
    samples contract; ValueError: one line naming the fix)."""
    want = schemas.sample_schema() if want is None else want
    schema = table.schema
    missing = [n for n in want.names if n not in schema.names]
    if missing:
        raise ValueError(f"{where} lacks columns {missing}: pass a lidarshard run's samples (OUT/samples)")
    ids = schema.field("sample_id").type if "sample_id" in want.names else pa.string()
    if not (pa.types.is_string(ids) or pa.types.is_large_string(ids)):
        raise ValueError(f"{where}: sample_id is {ids}, not strings: pass a lidarshard run's samples")
    try:
        table.select(want.names).cast(want)
    except (pa.ArrowException, ValueError) as e:
        raise ValueError(f"{where}: columns do not match the samples contract ({str(e)[:160]})") from None


def read_previous_samples(path: str) -> pa.Table:
    """The ``--from-samples`` table, checked and sorted by sample_id (``settle`` then rejects duplicates).
    Holds the whole table: ``build`` streams a sorted one instead (``transforms.features.previous``).

    Raises:
        ValueError: not a lidarshard samples table: columns missing or of another type, null or
            non-string sample ids (one line naming the file and the fix).
    """

    where = f"--from-samples {path}"
    try:
        samples = read_parts(samples_files(path))
    except pa.ArrowException as e:
        raise ValueError(f"{where} is not a readable Parquet file ({str(e)[:120]})") from None
    _check_previous_schema(where, samples)
    ids = samples.column("sample_id")
    if ids.null_count:
        raise ValueError(f"{where}: {ids.null_count} rows have a null sample_id")
    samples = samples.select(schemas.sample_schema().names).cast(schemas.sample_schema())
    return samples.sort_by([("sample_id", "ascending"), ("path", "ascending")])


def previous_rows(path: str) -> tuple[int, str | None]:
    """Rows of a ``--from-samples`` table after checking its schema and that no sample_id is null,
    reading its footer and the sample_id column a row group at a time (never the whole table), and
    the first stored ``path`` of its first row group (None: none).

    Raises:
        ValueError: as ``read_previous_samples``.
    """
    from lidarshard.transforms.arrow import row_groups

    where = f"--from-samples {path}"
    try:
        with open_parts(samples_files(path)) as file:
            _check_previous_schema(where, file.schema_arrow.empty_table())
            want = schemas.sample_schema()
            other = [f for f in want if not file.schema_arrow.field(f.name).type.equals(f.type)]
            nulls = 0
            names = list(dict.fromkeys(["sample_id", *(f.name for f in other)]))
            for t in row_groups(file, names):  # values of other types must cast
                nulls += t.column("sample_id").null_count
                if other:
                    _check_previous_schema(where, t.select([f.name for f in other]), pa.schema(other))
            rows = file.metadata.num_rows
            stored = file.read_row_group(0, columns=["path"]).column("path").drop_null() if rows else []
    except pa.ArrowException as e:
        raise ValueError(f"{where} is not a readable Parquet file ({str(e)[:120]})") from None
    if nulls:
        raise ValueError(f"{where}: {nulls} rows have a null sample_id")
    return rows, (stored[0].as_py() if len(stored) else None)


def check_from_samples(path: str) -> tuple[int, float | None]:
    """``--from-samples`` must be samples of ours, a samples directory or a 2.x samples.parquet
    (``previous_rows``). Returns
    (rows, the reject fraction its run recorded, or None)."""
    if not (_exists(path) or storage.is_dir(path)):  # a samples directory is a prefix on object stores
        raise UsageError(f"--from-samples {path} does not exist")
    try:
        rows, first = previous_rows(path)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    if first is not None and paths.is_relative(first) and not previous_root(path):
        raise UsageError(
            f"--from-samples {path} stores relative paths ({first!r}) but no _manifest.json or _scan.json "
            "beside it records their root: pass the samples where their run wrote them (OUT/samples)"
        )
    fractions = [m.get("max_reject_fraction") for m in _recorded(path)]
    recorded = next((f for f in fractions if f is not None), None)
    return rows, (float(recorded) if isinstance(recorded, (int, float)) else None)

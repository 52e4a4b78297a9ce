"""The checked settings of a run, built once before Beam starts and passed down frozen.

``scan_settings`` and ``build_settings`` turn the parsed flags (from the command line, or from the
Python API's keyword arguments through the same declarations) into a ``ScanSettings`` /
``BuildSettings``, checking every value and path on the way; a problem raises
:class:`~lidarshard.pipelines.flags.UsageError` with one line. Nothing downstream reads the flags again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lidarshard import __version__, schemas
from lidarshard.pipelines import checks, inputs
from lidarshard.pipelines.arguments import DEFAULT_REJECT_FRACTION
from lidarshard.pipelines.flags import UsageError
from lidarshard.pipelines.publish import sibling
from lidarshard.pipelines.replan import replan_settings
from lidarshard.schemas.manifest import MAX_EPOCH_ENTRIES
from lidarshard.schemas.records import label_maps
from lidarshard.transforms.beam.build_transform import BuildJob
from lidarshard.transforms.core import recorded
from lidarshard.transforms.core.epochs import PLAN_ENTRY_BYTES, PlanConfig, memory_bytes
from lidarshard.transforms.core.record import Kept
from lidarshard.transforms.core.score import ScoreSettings
from lidarshard.transforms.features import repeat
from lidarshard.transforms.features.cost import CostModel, parse_cost_model
from lidarshard.transforms.features.repeat import WeightSpec
from lidarshard.transforms.features.sample import ScanConfig
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.parts import open_parts, read_parts, samples_files
from lidarshard.transforms.layouts import FILES, Dataset
from lidarshard.transforms.layouts.task import LayoutOptions
from lidarshard.transforms.plan import VARIABLE_COUNT
from lidarshard.transforms.plan.caps import Caps

__all__ = [
    "ScanSettings",
    "BuildSettings",
    "scan_settings",
    "build_settings",
    "plan_config",
    "cost_model",
    "table_settings",
    "rejects_path",
    "check_plan_size",
]

#: Bytes ``storage``'s atomic write adds to a file's name while it writes (``.tmp-<8 hex>``).
_TMP_ROOM = len(".tmp-") + 8


def rejects_path(out: str) -> str:
    """Where a run stopped by ``--max-reject-fraction`` leaves its rejects (beside OUT, not in it; the
    name fitted to ``NAME_MAX``, with room for the atomic write's temporary suffix)."""
    return sibling(out, ".rejects.parquet", len(".rejects.parquet") + _TMP_ROOM)


def _location(path: str) -> str:
    """A path as the run uses it: ``file://`` URIs become plain absolute paths (Beam's filesystems do
    not know that scheme), local paths absolute, other URIs unchanged."""
    return storage.absolute(storage.local_path(path)) if storage.is_local(path) else path


@dataclass(frozen=True)
class ScanSettings:
    """What a scan reads and how (``input`` is None for a table handed to ``write_manifest``)."""

    input: str | None
    output: str
    config: ScanConfig = field(default_factory=ScanConfig)
    nuscenes_version: str | None = None
    sweeps: int = 0
    part_rows: int = 1
    max_reject_fraction: float = DEFAULT_REJECT_FRACTION
    created_by: str = f"lidarshard {__version__}"
    #: The INPUTs scanned, each with its layout (``input`` is the first; empty: nothing is scanned).
    datasets: tuple[Dataset, ...] = ()
    #: {dataset name: {raw label id: class id}} of the layouts that map their labels.
    label_maps: Mapping[str, Mapping[int, int]] = field(default_factory=dict)

    @property
    def rejects_out(self) -> str:
        return rejects_path(self.output)

    @property
    def layout_options(self) -> LayoutOptions:
        return LayoutOptions(self.sweeps, self.nuscenes_version)

    def meta(self) -> dict:
        """Provenance recorded in ``_scan.json`` / ``_manifest.json``."""
        return {
            "schema_version": schemas.SCHEMA_VERSION,
            "created_by": self.created_by,
            "input": self.input,
            "datasets": inputs.dataset_json(self.datasets, self.label_maps),
            "nuscenes_version": self.nuscenes_version,
            "sweeps": self.sweeps,
            "max_reject_fraction": self.max_reject_fraction,
            "scan_config": {k: v for k, v in vars(self.config).items() if k != "extra"},
            "part_rows": self.part_rows,
            "sample_schema": schemas.schema_to_json(schemas.sample_schema()),
        }


@dataclass(frozen=True)
class BuildSettings:
    """A checked build: what is scanned (or re-planned: ``from_samples``), the plan and the cost model."""

    scan: ScanSettings
    cfg: PlanConfig
    model: CostModel
    from_samples: str | None = None
    path_root: str | None = None
    kept: Kept | None = None  # ``--replan-from``: what the build keeps of the manifest it continues

    @property
    def output(self) -> str:
        return self.scan.output

    def meta(self) -> dict:
        return self.scan.meta() | {"from_samples": self.from_samples, "path_root": self.path_root}

    def job(self, staging: str) -> BuildJob:
        """What the build core (``transforms.beam.build.BuildManifest``) runs with."""
        settle = ScoreSettings(
            self.scan.max_reject_fraction, self.scan.rejects_out, self.scan.part_rows, self.scan.label_maps
        )
        return BuildJob(staging, self.meta(), self.cfg, self.model, settle, self.kept)


# ------------------------------------------------------------------------------------------ flags


def scan_config(args: argparse.Namespace) -> ScanConfig:
    """The scan flags as a ``ScanConfig`` (values were range-checked by the parser)."""
    box = args.point_cloud_range
    if box is not None and not all(box[i] < box[i + 3] for i in range(3)):
        raise UsageError(
            f"--point-cloud-range {','.join(f'{v:g}' for v in box)}: needs x0 < x1, y0 < y1, z0 < z1"
        )
    return ScanConfig(
        voxel_size=args.voxel_size,
        point_cloud_range=box,
        point_dims=args.point_dims,
        format=args.format,
        features=args.features,
        max_file_bytes=args.max_file_bytes,
        max_points=args.max_points,
        backend=args.backend,
    )


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
        repeat=WeightSpec(args.repeat_factors, args.sample_weights, _dataset_weights(args.dataset_weights)),
        heaviest_first=args.heaviest_first,
        rank_speed=_rank_speed(args),
    )


def _rank_speed(args: argparse.Namespace) -> tuple[float, ...] | None:
    speeds = args.rank_speed
    if speeds is not None and len(speeds) != args.world_size:
        raise UsageError(
            f"--rank-speed gives {len(speeds)} speeds but --world-size is {args.world_size}: give one per rank"
        )
    return speeds


def _dataset_weights(text: str | None) -> tuple[tuple[str, float], ...]:
    """``--dataset-weights NAME=W,...`` as sorted pairs (the names are checked against the INPUTs later)."""
    out = []
    for name, value in inputs.parse_pairs(text, "--dataset-weights").items():
        try:
            w = float(value)
        except ValueError:
            w = math.nan
        if not (math.isfinite(w) and w > 0):
            raise UsageError(
                f"--dataset-weights {text}: {name}'s weight must be a finite number > 0, got {value!r}"
            )
        out.append((name, w))
    return tuple(sorted(out))


def _csv(values: tuple[float, ...]) -> str:
    return ",".join(f"{v:g}" for v in values)


# --------------------------------------------------------------------------------------- plan size


def _manifest_bytes(cfg: PlanConfig) -> int:
    """Bytes ``_manifest.json`` takes to list the plan files of ``cfg`` (one per epoch and rank), at most."""
    from lidarshard.schemas import plan_file

    entry = {plan_file(cfg.epochs - 1, cfg.world_size - 1): {"bytes": 2**40, "sha256": "0" * 64}}
    one = len(json.dumps({"files": entry}, indent=2)) - len(json.dumps({"files": {}}, indent=2))
    return cfg.epochs * cfg.world_size * one


def check_plan_size(
    cfg: PlanConfig, rows: int | None = None, where: str = "", sample_weight: float | None = None
) -> None:
    """Refuse, before Beam starts, a plan the flags ask for that cannot be built or read here.

    * The manifest lists one plan file per epoch and rank; that list must fit the readers' cap on
      ``_manifest.json`` (``storage.METADATA_MAX_BYTES``), or nothing could read the result.
    * With ``rows`` known (``--from-samples``): one epoch plans about ``rows`` x the mean bucket weight
      (x the mean ``sample_weight``) entries, at most ``--max-plan-factor`` x ``rows``; planned, written
      and validated in one process at ~``PLAN_ENTRY_BYTES`` each, they must fit this machine's memory
      (``memory_bytes``) and ``MAX_EPOCH_ENTRIES``. (A scan's row count is known only after Beam: the
      planner checks its own pool then.)

    Raises:
        UsageError: one line with the numbers and what to lower.
    """
    listed = _manifest_bytes(cfg)
    if listed > storage.METADATA_MAX_BYTES:
        raise UsageError(
            f"--epochs {cfg.epochs} x --world-size {cfg.world_size} = {cfg.epochs * cfg.world_size:,} plan "
            f"files; _manifest.json would list them in ~{listed / 2**20:.0f} MiB, more than the "
            f"{storage.METADATA_MAX_BYTES >> 20} MiB any reader accepts: plan fewer epochs per build"
        )
    if rows is None:
        return
    factor = sum(cfg.weights) / len(cfg.weights) if cfg.weights else 1.0
    factor = min(factor * (1.0 if sample_weight is None else sample_weight), cfg.max_plan_factor)
    pad = 0 if cfg.strategy in VARIABLE_COUNT else cfg.step_size
    entries = math.ceil(rows * factor) + pad
    what = f"{where} holds {rows:,} samples; at ~{factor:.3g} plan entries each an epoch plans ~{entries:.3g}"
    if entries > MAX_EPOCH_ENTRIES:
        raise UsageError(
            f"{what} entries, more than the {MAX_EPOCH_ENTRIES:.3g} any epoch may hold: lower the weights"
        )
    memory = memory_bytes()
    need = entries * PLAN_ENTRY_BYTES
    if memory is not None and need > memory:
        raise UsageError(
            f"{what} entries, ~{need / 2**30:.3g} GiB to plan at ~{PLAN_ENTRY_BYTES} bytes an entry, more than "
            f"this machine's {memory / 2**30:.3g} GiB: lower --bucket-weights/--sample-weights, or plan on a "
            "machine with more memory"
        )


def cost_model(spec: str) -> CostModel:
    """Parse ``--cost-model`` once, in the launcher (``@file.json`` is read here, not by workers)."""
    try:
        return parse_cost_model(spec)
    except FileNotFoundError:
        raise UsageError(f"--cost-model {spec}: no such file") from None
    except (ValueError, OSError) as e:
        raise UsageError(f"--cost-model {spec}: {getattr(e, 'strerror', None) or e}") from None


# ---------------------------------------------------------------------------------------- settings


def scan_settings(
    args: argparse.Namespace, specs: Sequence[str], output: str, dry_run: bool = False
) -> ScanSettings:
    """INPUTs (``[NAME=]PATH`` each) and OUT checked, the scan flags as settings (``dry_run``: only the
    job graph will be built; remote paths are not looked at, and OUT is not checked for replacing)."""
    if args.dataset_weights is not None:
        raise UsageError(
            f"--dataset-weights {args.dataset_weights} weights a plan: give it to build (a scan plans nothing)"
        )
    output = _location(output)
    datasets = _datasets(args, specs, dry_run)
    checks.check_output(output, [d.root for d in datasets], publish=not dry_run)
    return _scan(args, datasets, output, args.max_reject_fraction, dry_run)


def _datasets(args: argparse.Namespace, specs: Sequence[str], dry_run: bool) -> tuple[Dataset, ...]:
    """The INPUTs, located, checked and given their layouts (``pipelines.inputs``)."""
    located = []
    for spec in specs:
        name, path = inputs.split_input(spec)
        located.append(f"{name}={_location(path)}" if name else _location(path))
    look = not dry_run or all(storage.is_local(inputs.split_input(s)[1]) for s in located)
    weights = dict(_dataset_weights(args.dataset_weights))
    return inputs.resolve_datasets(located, args.dataset, weights, args.nuscenes_version, look)


def _scan(
    args: argparse.Namespace,
    datasets: tuple[Dataset, ...],
    output: str,
    fraction: float | None,
    dry_run: bool,
) -> ScanSettings:
    """The scan flags of checked INPUTs as settings (``fraction`` None: the default)."""
    look = not dry_run or all(storage.is_local(d.root) for d in datasets)
    return ScanSettings(
        input=datasets[0].root if datasets else None,
        output=output,
        config=scan_config(args),
        nuscenes_version=args.nuscenes_version,
        sweeps=args.sweeps,
        part_rows=args.part_rows,
        max_reject_fraction=DEFAULT_REJECT_FRACTION if fraction is None else fraction,
        datasets=datasets,
        label_maps=inputs.label_maps(datasets, look),
    )


def build_settings(args: argparse.Namespace, dry_run: bool = False) -> BuildSettings:
    """The checked settings of ``lidarshard build`` (``args.paths``: INPUT... OUT, or OUT with
    ``--from-samples``); see ``scan_settings`` for ``dry_run``."""
    from_samples: str | None = args.from_samples
    if (len(args.paths) != 1) if from_samples else (len(args.paths) < 2):
        raise UsageError("expected OUT with --from-samples" if from_samples else "expected INPUT OUT")
    if args.replan_from is not None and not from_samples:
        raise UsageError(
            f"--replan-from {args.replan_from} re-plans a manifest: add --from-samples PREV/samples"
        )
    continued: Kept | None = None
    cfg, model = plan_config(args), cost_model(args.cost_model)
    check_plan_size(cfg)
    fraction = args.max_reject_fraction
    rows: int | None = None
    datasets: tuple[Dataset, ...] = ()
    if from_samples:  # a samples directory may be given with a trailing slash
        from_samples = _location(from_samples).rstrip("/") or "/"
        input, output = from_samples, _location(args.paths[0])
        look = not dry_run or storage.is_local(input)
        if look:
            rows, recorded_fraction = checks.check_from_samples(from_samples)
            fraction = recorded_fraction if fraction is None else fraction
            if rows < cfg.step_size and cfg.policy == "drop_last" and not cfg.weights:
                raise UsageError(
                    f"--world-size {cfg.world_size} x --batch-size {cfg.batch_size} = {cfg.step_size} samples "
                    f"per step, but {from_samples} holds {rows}; use --pad or a smaller --world-size/--batch-size"
                )
        roots = [input]
        if args.replan_from is not None:
            cfg, continued = replan_settings(cfg, from_samples, args.replan_from)
    else:
        output = _location(args.paths[-1])
        datasets = _datasets(args, args.paths[:-1], dry_run)
        look = not dry_run or all(storage.is_local(d.root) for d in datasets)
        roots = [d.root for d in datasets]
    weight = _check_weights(args, cfg, datasets, from_samples, look)
    if rows is not None:
        check_plan_size(cfg, rows, f"--from-samples {from_samples}", weight)
    checks.check_output(output, roots, publish=not dry_run)
    if from_samples:
        scan = _scan(args, (), output, fraction, dry_run)
        try:
            before = recorded.previous_datasets(from_samples) if look else ()
        except ValueError as e:
            raise UsageError(str(e)) from None
        scale = dict(cfg.repeat.datasets)
        kept = tuple(Dataset(d.name, d.root, d.layout, scale.get(d.name, 1.0)) for d in before)
        unknown = sorted(set(scale) - {d.name for d in kept})
        if unknown and look:
            have = ", ".join(d.name for d in kept) or "none recorded"
            raise UsageError(
                f"--dataset-weights {args.dataset_weights}: {from_samples} holds no dataset named "
                f"{unknown[0]!r} (datasets: {have})"
            )
        maps = label_maps(before)
        scan = dataclasses.replace(scan, input=from_samples, datasets=kept, label_maps=maps)
    else:
        scan = _scan(args, datasets, output, fraction, dry_run)
    return BuildSettings(scan, cfg, model, from_samples, _path_root(args, datasets, from_samples), continued)


def table_settings(args: argparse.Namespace, output: str, model: CostModel) -> BuildSettings:
    """The settings of ``lidarshard.write_manifest``: a user's table, its paths stored as given."""
    output = _location(output)
    checks.check_output(output, [])
    fraction = DEFAULT_REJECT_FRACTION if args.max_reject_fraction is None else args.max_reject_fraction
    created = f"lidarshard {__version__} write_manifest"
    scan = ScanSettings(None, output, ScanConfig(), None, 0, args.part_rows, fraction, created)
    cfg = plan_config(args)
    check_plan_size(cfg)
    return BuildSettings(scan, cfg, model)


def _path_root(args: argparse.Namespace, datasets: Sequence[Dataset], from_samples: str | None) -> str | None:
    """ROOT the manifest's paths are stored relative to (``--relative-to``; None: full paths): by
    default a dataset's root (a glob's fixed part), the INPUTs' common parent when there are several."""
    from lidarshard.transforms.beam.scan_transform import input_root

    if args.relative_to is not None:
        return None if args.relative_to.lower() == "none" else _location(args.relative_to.rstrip("/"))
    if from_samples:
        return recorded.previous_root(from_samples)
    roots = [input_root(d.root) if d.layout == FILES else d.root.rstrip("/") for d in datasets]
    return roots[0] if len(roots) == 1 else inputs.common_root(roots)


def _check_weights(
    args: argparse.Namespace,
    cfg: PlanConfig,
    datasets: Sequence[Dataset],
    from_samples: str | None,
    look: bool,
) -> float | None:
    """``--sample-weights`` names a good column of the ``--from-samples`` table; ``--repeat-factors``
    has lidarseg labels to read (a dataroot with ``lidarseg.json``, or labelled samples). Files are
    only looked at with ``look`` (not in an offline dry run). Returns the mean sample weight (None:
    no ``--sample-weights``, or not looked at)."""
    if args.sample_weights is not None and not from_samples:
        raise UsageError(
            f"--sample-weights {args.sample_weights} reads a column of a --from-samples table: "
            "add --from-samples PREV/samples"
        )
    if not look:
        return None
    mean: float | None = None
    files = samples_files(from_samples) if from_samples else []
    if args.sample_weights is not None:
        with open_parts(files) as file:
            schema = file.schema_arrow
        table = (  # only the column: a missing one gets named with the ones there are
            read_parts(files, columns=[args.sample_weights])
            if args.sample_weights in schema.names
            else schema.empty_table()
        )
        try:
            w = repeat.check_weights(table, args.sample_weights, cfg.max_plan_factor)
        except ValueError as e:
            raise UsageError(f"--sample-weights {e}") from None
        mean = float(w.mean()) if w.size else 0.0
    if cfg.repeat.threshold is None:
        return mean
    if from_samples:
        labelled = read_parts(files, columns=["label_path"]).column("label_path")
        if labelled.null_count == len(labelled):
            raise UsageError(
                f"--repeat-factors: no sample of {from_samples} has lidarseg labels (label_path)"
            )
    elif sum(_has_labels(d, args.nuscenes_version) for d in datasets) > 1:
        named = ", ".join(d.name for d in datasets if _has_labels(d, args.nuscenes_version))
        raise UsageError(
            f"--repeat-factors: INPUTs {named} all have labels, whose class ids mean different classes; "
            "repeat factors over them would mix the classes: give one labelled INPUT, or --dataset-weights"
        )
    elif not any(_has_labels(d, args.nuscenes_version) for d in datasets):
        d = datasets[0]
        where = f"{d.root}/{args.nuscenes_version}" if d.layout == "nuscenes" else d.root
        raise UsageError(
            f"--repeat-factors reads per-point labels: {where} has no lidarseg.json (a nuScenes dataroot "
            "with lidarseg) and no SemanticKITTI labels/*.label"
        )
    return mean


def _has_labels(d: Dataset, version: str | None) -> bool:
    """``d`` has per-point label files the scan reads (lidarseg tables, SemanticKITTI labels)."""
    if d.layout == "nuscenes":
        return bool(version) and storage.exists(storage.join(d.root, version or "", "lidarseg.json"))
    if d.layout == "semantickitti":
        return bool(inputs.LAYOUT_IO.glob(storage.join(d.root, "**", "labels", "*.label")))
    return False

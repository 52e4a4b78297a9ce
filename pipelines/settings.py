"""The settings of a run, frozen, and the pure conversion of the options into them.

``lidarshard.pipelines.preflight`` builds a ``ScanSettings`` / ``BuildSettings`` once before Beam
starts, from ``ScanOptions`` / ``BuildOptions`` (the command line's flags or the Python API's keyword
arguments) and what it reads of the files the user named; nothing downstream reads the options again.
This module reads no file: ``scan_config`` and ``plan_config`` turn options into the core's
``ScanConfig`` / ``PlanConfig`` and check the rules between flags; ``check_plan_size`` refuses a plan
too large for the manifest's readers or this machine's memory. A problem raises
:class:`~lidarshard.pipelines.flags.UsageError` with one line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from lidarshard import __version__, schemas
from lidarshard.pipelines import inputs
from lidarshard.pipelines.flags import UsageError
from lidarshard.pipelines.options import DEFAULT_REJECT_FRACTION, BuildOptions, ScanOptions
from lidarshard.pipelines.publish import sibling
from lidarshard.pipelines.understood import sweeps_of
from lidarshard.schemas.manifest import MAX_EPOCH_ENTRIES
from lidarshard.transforms.beam.build_transform import BuildJob
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.epochs import PLAN_ENTRY_BYTES, memory_bytes
from lidarshard.transforms.core.record import Kept
from lidarshard.transforms.core.score import ScoreSettings
from lidarshard.transforms.features.cost import CostModel
from lidarshard.transforms.features.repeat import WeightSpec
from lidarshard.transforms.features.sample import ScanConfig
from lidarshard.transforms.io import storage
from lidarshard.transforms.layouts import Dataset
from lidarshard.transforms.layouts.task import LayoutOptions
from lidarshard.transforms.plan import ANY_POOL
from lidarshard.transforms.plan.caps import Caps
from lidarshard.transforms.plan.memory import MemoryCap

__all__ = [
    "ScanSettings",
    "BuildSettings",
    "scan_config",
    "plan_config",
    "dataset_weights",
    "weights_text",
    "location",
    "rejects_path",
    "check_plan_size",
]

#: Bytes ``storage``'s atomic write adds to a file's name while it writes (``.tmp-<8 hex>``).
_TMP_ROOM = len(".tmp-") + 8


def rejects_path(out: str) -> str:
    """Where a run stopped by ``--max-reject-fraction`` leaves its rejects (beside OUT, not in it; the
    name fitted to ``NAME_MAX``, with room for the atomic write's temporary suffix)."""
    return sibling(out, ".rejects.parquet", len(".rejects.parquet") + _TMP_ROOM)


def location(path: str) -> str:
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
    #: previous sweeps per sample: N for every INPUT, or sorted (name, N) pairs (an INPUT not named: 0)
    sweeps: int | tuple[tuple[str, int], ...] = 0
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
    def recorded_sweeps(self) -> int | dict[str, int]:
        """``sweeps`` as ``_scan.json`` records it: N, or {INPUT name: N}."""
        return self.sweeps if isinstance(self.sweeps, int) else dict(self.sweeps)

    @property
    def layout_options(self) -> dict[str, LayoutOptions]:
        """{INPUT name: what shapes its layout's tasks}."""
        return {
            d.name: LayoutOptions(sweeps_of(self.recorded_sweeps, d.name), self.nuscenes_version)
            for d in self.datasets
        }

    def meta(self) -> dict:
        """Provenance recorded in ``_scan.json`` / ``_manifest.json``."""
        return {
            "schema_version": schemas.SCHEMA_VERSION,
            "created_by": self.created_by,
            "input": self.input,
            "datasets": inputs.dataset_json(self.datasets, self.label_maps),
            "nuscenes_version": self.nuscenes_version,
            "sweeps": self.recorded_sweeps,
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


# ---------------------------------------------------------------------------------------- options


def scan_config(args: ScanOptions) -> ScanConfig:
    """The scan options as a ``ScanConfig`` (each value was checked by its flag's validator)."""
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
        close_points=args.close_points,
    )


def plan_config(args: BuildOptions) -> PlanConfig:
    """The plan options as a ``PlanConfig``; cross-flag rules raise UsageError naming the flags."""
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
        caps=Caps(
            args.max_points_per_rank_step,
            args.max_cost_per_rank_step,
            args.max_samples_per_rank_step,
            _memory_cap(args),
        ),
        repeat=WeightSpec(args.repeat_factors, args.sample_weights, dataset_weights(args.dataset_weights)),
        heaviest_first=args.heaviest_first,
        rank_speed=_rank_speed(args),
        plan_groups=args.plan_groups,
    )


def _memory_cap(args: BuildOptions) -> MemoryCap | None:
    """``--max-step-memory`` with its ``--memory-model`` (each needs the other)."""
    if args.max_step_memory is None and args.memory_model is None:
        return None
    if args.memory_model is None:
        raise UsageError(
            "--max-step-memory needs --memory-model FILE: the JSON of lidarshard calibrate over timings "
            "recorded on the device (its memory_model)"
        )
    if args.max_step_memory is None:
        raise UsageError("--memory-model is used by --max-step-memory: give the cap too (e.g. 20GiB)")
    try:
        return MemoryCap(args.max_step_memory, args.memory_model)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _rank_speed(args: BuildOptions) -> tuple[float, ...] | None:
    speeds = args.rank_speed
    if speeds is not None and len(speeds) != args.world_size:
        raise UsageError(
            f"--rank-speed gives {len(speeds)} speeds but --world-size is {args.world_size}: give one per rank"
        )
    return speeds


def dataset_weights(text: str | None) -> tuple[tuple[str, float], ...]:
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


def weights_text(pairs: tuple[tuple[str, float], ...]) -> str:
    """``--dataset-weights`` pairs as the flag reads (``a=1,k=2``), for messages."""
    return ",".join(f"{name}={weight:g}" for name, weight in pairs)


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
      (``memory_bytes``) and ``MAX_EPOCH_ENTRIES``; an unweighted equal-count plan under ``--drop-last``
      needs ``rows`` to fill one step of W*B (``_check_pool``). (A scan's row count is known only after Beam: the
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
    _check_pool(cfg, rows, where, sample_weight)
    factor = sum(cfg.weights) / len(cfg.weights) if cfg.weights else 1.0
    factor = min(factor * (1.0 if sample_weight is None else sample_weight), cfg.max_plan_factor)
    pad = 0 if cfg.strategy in ANY_POOL else cfg.step_size
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


def _check_pool(cfg: PlanConfig, rows: int, where: str, sample_weight: float | None) -> None:
    """Refuse a batch larger than the pool before Beam: ``rows`` unweighted samples that do not fill one
    step of W*B of an equal-count plan under ``--drop-last`` would all be dropped (weights may repeat
    samples, ``--pad`` repeats them, ``budget`` plans every sample: those are left to the planner)."""
    repeat = cfg.repeat
    weighted = cfg.weights or sample_weight is not None or repeat.threshold is not None or repeat.datasets
    if rows >= cfg.step_size or cfg.policy != "drop_last" or weighted or cfg.strategy in ANY_POOL:
        return
    raise UsageError(
        f"--world-size {cfg.world_size} x --batch-size {cfg.batch_size} = {cfg.step_size} samples per step, "
        f"but {where} holds {rows}: every sample would be dropped; use --pad or a smaller --world-size/--batch-size"
    )

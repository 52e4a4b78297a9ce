"""The settings of a checked run, frozen: the options as the run uses them and what the pre-flight found.

``lidarshard.pipelines.preflight`` builds a ``ScanSettings`` / ``BuildSettings`` once before Beam starts,
from ``ScanOptions`` / ``BuildOptions`` (the command line's flags or the Python API's keyword arguments;
the core's ``ScanConfig`` and ``PlanConfig`` composed in them, never copied) with OUT located, defaults
resolved, what ``--from-samples`` recorded, and the INPUTs resolved; nothing downstream reads the flags
again. ``check_plan_size`` refuses a plan too large for the manifest's readers or this machine's memory.
This module reads no file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from lidarshard import __version__, schemas
from lidarshard.pipelines import inputs
from lidarshard.pipelines.options import BuildOptions, ScanOptions
from lidarshard.pipelines.publish import sibling
from lidarshard.pipelines.understood import sweeps_of
from lidarshard.schemas.manifest import MAX_EPOCH_ENTRIES
from lidarshard.transforms.beam.build_transform import BuildJob
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.manifest_writer import Kept
from lidarshard.transforms.core.pool import PLAN_ENTRY_BYTES, memory_bytes
from lidarshard.transforms.core.score import ScoreSettings
from lidarshard.transforms.features.cost import CostModel, parse_cost_model
from lidarshard.transforms.features.sample import ScanConfig
from lidarshard.transforms.io import storage
from lidarshard.transforms.layouts import Dataset
from lidarshard.transforms.layouts.task import LayoutOptions
from lidarshard.transforms.plan import ANY_POOL
from lidarshard.transforms.value_checks import UsageError

__all__ = ["ScanSettings", "BuildSettings", "location", "rejects_path", "check_plan_size"]

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
    """A checked scan: ``options`` as the run uses them (OUT located, the reject fraction resolved), the
    INPUTs resolved (``input``: what is read, None for a table handed to ``write_manifest``)."""

    options: ScanOptions
    input: str | None = None
    #: The INPUTs scanned, each with its layout (empty: nothing is scanned).
    datasets: tuple[Dataset, ...] = ()
    #: {dataset name: {raw label id: class id}} of the layouts that map their labels.
    label_maps: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    created_by: str = f"lidarshard {__version__}"

    @property
    def output(self) -> str:
        return self.options.out

    @property
    def config(self) -> ScanConfig:
        return self.options.config

    @property
    def max_reject_fraction(self) -> float:
        fraction = self.options.max_reject_fraction
        assert fraction is not None, "the pre-flight resolves the default"
        return fraction

    @property
    def rejects_out(self) -> str:
        return rejects_path(self.output)

    @property
    def layout_options(self) -> dict[str, LayoutOptions]:
        """{INPUT name: what shapes its layout's tasks}."""
        sweeps, version = self.options.recorded_sweeps, self.options.nuscenes_version
        return {d.name: LayoutOptions(sweeps_of(sweeps, d.name), version) for d in self.datasets}

    def meta(self) -> dict:
        """Provenance recorded in ``_scan.json`` / ``_manifest.json``."""
        o = self.options
        return {
            "schema_version": schemas.SCHEMA_VERSION,
            "created_by": self.created_by,
            "input": self.input,
            "datasets": inputs.dataset_json(self.datasets, self.label_maps),
            "nuscenes_version": o.nuscenes_version,
            "sweeps": o.recorded_sweeps,
            "max_reject_fraction": self.max_reject_fraction,
            "scan_config": {k: v for k, v in vars(o.config).items() if k != "extra"},
            "part_rows": o.part_rows,
            "sample_schema": schemas.schema_to_json(schemas.sample_schema()),
        }


@dataclass(frozen=True)
class BuildSettings(ScanSettings):
    """A checked build: the scan's settings, the plan in ``options`` (``options.plan`` is the one
    ``PlanConfig``), the cost model, where paths are stored relative to, and what a re-plan keeps."""

    options: BuildOptions
    model: CostModel = parse_cost_model("voxels")  # ``--cost-model``, read (``@file.json``) once
    path_root: str | None = None
    kept: Kept | None = None  # ``--replan-from``: what the build keeps of the manifest it continues

    @property
    def cfg(self) -> PlanConfig:
        return self.options.plan

    def meta(self) -> dict:
        return super().meta() | {"from_samples": self.options.from_samples, "path_root": self.path_root}

    def job(self, staging: str) -> BuildJob:
        """What the build core (``transforms.beam.build_transform.BuildManifest``) runs with."""
        settle = ScoreSettings(
            self.max_reject_fraction, self.rejects_out, self.options.part_rows, self.label_maps
        )
        return BuildJob(staging, self.meta(), self.cfg, self.model, settle, self.kept)


# --------------------------------------------------------------------------------------- plan size


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
    entry = {schemas.plan_file(cfg.epochs - 1, cfg.world_size - 1): {"bytes": 2**40, "sha256": "0" * 64}}
    one = len(json.dumps({"files": entry}, indent=2)) - len(json.dumps({"files": {}}, indent=2))
    listed = (
        cfg.epochs * cfg.world_size * one
    )  # bytes _manifest.json takes to list one file per epoch and rank
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

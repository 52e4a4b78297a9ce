"""The pre-flight of ``scan``, ``build`` and the Python API, before Beam starts: the frozen settings of a run.

``ScanSettings`` / ``BuildSettings`` hold the checked options (``ScanOptions`` / ``BuildOptions``, the core's
``ScanConfig`` and ``PlanConfig`` composed in them, never copied) with OUT located, defaults resolved, what
``--from-samples`` recorded and the INPUTs resolved (``inputs``); nothing downstream reads the flags again. A
re-plan's plan is constructed once, from the manifest it continues (``continued``). Problems: UsageError.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lidarshard import __version__, schemas
from lidarshard.pipelines import checks, inputs
from lidarshard.pipelines.options import DEFAULT_REJECT_FRACTION, BuildOptions, ScanOptions, cost_model
from lidarshard.pipelines.publish import sibling
from lidarshard.pipelines.understood import sweeps_of
from lidarshard.schemas.manifest import MAX_EPOCH_ENTRIES, Manifest
from lidarshard.schemas.records import label_maps
from lidarshard.transforms.beam.build_transform import BuildJob
from lidarshard.transforms.core import earlier_run
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.manifest_writer import Kept, kept_from
from lidarshard.transforms.core.pool import PLAN_ENTRY_BYTES, memory_bytes
from lidarshard.transforms.core.score import ScoreSettings
from lidarshard.transforms.features.cost import CostModel, parse_cost_model
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.metadata import load_manifest
from lidarshard.transforms.layouts import FILES, Dataset
from lidarshard.transforms.layouts.multisweep import DEFAULT_CLOSE_POINTS
from lidarshard.transforms.layouts.task import LayoutOptions
from lidarshard.transforms.plan import ANY_POOL
from lidarshard.transforms.value_checks import UsageError

__all__ = [
    "ScanSettings",
    "BuildSettings",
    "scan_settings",
    "build_settings",
    "table_settings",
    "continued",
    "check_plan_size",
    "location",
    "rejects_path",
    "KEPT_SETTINGS",
    "PLAN_ENTRY_BYTES",
]

_O = TypeVar("_O", bound=ScanOptions)


def rejects_path(out: str) -> str:
    """Where a run stopped by ``--max-reject-fraction`` leaves its rejects: beside OUT, its name fitted to
    ``NAME_MAX`` with room for the atomic write's ``.tmp-<8 hex>``."""
    return sibling(out, ".rejects.parquet", len(".rejects.parquet") + len(".tmp-") + 8)


def location(path: str) -> str:
    """A path as the run uses it: ``file://`` URIs and local paths absolute, other URIs unchanged."""
    return storage.absolute(storage.local_path(path)) if storage.is_local(path) else path


@dataclass(frozen=True)
class ScanSettings:
    """A checked scan: ``options`` as the run uses them, the INPUTs resolved (``input``: what is read, None for
    a ``write_manifest`` table; ``label_maps``: {dataset: {raw label id: class id}})."""

    options: ScanOptions
    input: str | None = None
    datasets: tuple[Dataset, ...] = ()
    label_maps: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    created_by: str = f"lidarshard {__version__}"

    @property
    def output(self) -> str:
        return self.options.out

    @property
    def max_reject_fraction(self) -> float:
        assert self.options.max_reject_fraction is not None, "the pre-flight resolves the default"
        return self.options.max_reject_fraction

    @property
    def rejects_out(self) -> str:
        return rejects_path(self.output)

    @property
    def layout_options(self) -> dict[str, LayoutOptions]:
        sweeps, version = self.options.recorded_sweeps, self.options.nuscenes_version
        return {d.name: LayoutOptions(sweeps_of(sweeps, d.name), version) for d in self.datasets}

    def meta(self) -> dict:
        """Provenance recorded in ``_scan.json`` / ``_manifest.json``."""
        o = self.options  # label maps' JSON keys are strings
        maps = {name: {str(k): v for k, v in sorted(m.items())} for name, m in self.label_maps.items()}
        return {
            "schema_version": schemas.SCHEMA_VERSION,
            "created_by": self.created_by,
            "input": self.input,
            "datasets": [d.to_json() | {"label_map": maps.get(d.name)} for d in self.datasets],
            "nuscenes_version": o.nuscenes_version,
            "sweeps": o.recorded_sweeps,
            "max_reject_fraction": self.max_reject_fraction,
            "scan_config": {k: v for k, v in vars(o.config).items() if k != "extra"},
            "part_rows": o.part_rows,
            "sample_schema": schemas.schema_to_json(schemas.sample_schema()),
        }


@dataclass(frozen=True)
class BuildSettings(ScanSettings):
    """A checked build: the scan's settings, the plan (``options.plan``, the one ``PlanConfig``), the cost model
    read once, where paths are stored relative to, and what a re-plan keeps."""

    options: BuildOptions
    model: CostModel = parse_cost_model("voxels")
    path_root: str | None = None
    kept: Kept | None = None

    def meta(self) -> dict:
        return super().meta() | {"from_samples": self.options.from_samples, "path_root": self.path_root}

    def job(self, staging: str) -> BuildJob:
        """What the build core (``build_transform.BuildManifest``) runs with."""
        settle = ScoreSettings(
            self.max_reject_fraction, self.rejects_out, self.options.part_rows, self.label_maps
        )
        return BuildJob(staging, self.meta(), self.options.plan, self.model, settle, self.kept)


def scan_settings(opts: ScanOptions, dry_run: bool = False) -> ScanSettings:
    """The checked scan (``dry_run``: only the job graph is built; remote paths are not looked at, OUT not
    checked for replacing)."""
    out, (datasets, look) = location(opts.out), _datasets(opts, dry_run)
    checks.check_output(out, [d.root for d in datasets], publish=not dry_run)
    maps = inputs.label_maps(datasets, look)
    return ScanSettings(_resolved(opts, out, opts.max_reject_fraction), datasets[0].root, datasets, maps)


def _datasets(opts: ScanOptions, dry_run: bool) -> tuple[tuple[Dataset, ...], bool]:
    """The INPUTs located and resolved (``inputs.resolve_datasets``), and whether their files were looked at."""
    located = [(name, location(where)) for name, where in map(inputs.split_input, opts.input)]
    look = not dry_run or all(storage.is_local(where) for _, where in located)
    weights = dict(opts.plan.repeat.datasets) if isinstance(opts, BuildOptions) else {}
    datasets = inputs.resolve_datasets(located, opts.dataset, weights, opts.nuscenes_version, look)
    if look:
        inputs.check_layout_flags(opts.recorded_sweeps, opts.nuscenes_version, datasets)
    return datasets, look


def _resolved(opts: _O, out: str, fraction: float | None, **changes: Any) -> _O:
    """``opts`` as the run uses them: OUT located, the reject fraction resolved (None: the default)."""
    fraction = DEFAULT_REJECT_FRACTION if fraction is None else fraction
    return dataclasses.replace(opts, out=out, max_reject_fraction=fraction, **changes)


def build_settings(opts: BuildOptions, dry_run: bool = False, kept: Kept | None = None) -> BuildSettings:
    """The checked build (INPUT... OUT, or OUT ``--from-samples``; ``dry_run`` as ``scan_settings``); ``kept``:
    a re-plan ``lidarshard.replan`` constructed already (else ``--replan-from`` is continued here)."""
    if (len(opts.input) != 0) if opts.from_samples else not opts.input:
        raise UsageError("expected OUT with --from-samples" if opts.from_samples else "expected INPUT OUT")
    if opts.from_samples and opts.sweeps:
        raise UsageError("--sweeps: --from-samples re-plans samples scanned already, with their sweeps")
    model = cost_model(opts.cost_model)
    opts = dataclasses.replace(opts, plan=_priced(opts.plan, model))
    check_plan_size(opts.plan)
    if opts.from_samples:
        return _from_samples(opts, model, dry_run, kept)
    out, (datasets, look) = location(opts.out), _datasets(opts, dry_run)
    inputs.check_weights(
        opts.plan.repeat, opts.plan.max_plan_factor, datasets, None, look, opts.nuscenes_version
    )
    checks.check_output(out, [d.root for d in datasets], publish=not dry_run)
    options, maps = _resolved(opts, out, opts.max_reject_fraction), inputs.label_maps(datasets, look)
    return BuildSettings(
        options, datasets[0].root, datasets, maps, model=model, path_root=_path_root(opts, datasets)
    )


def _from_samples(opts: BuildOptions, model: CostModel, dry_run: bool, kept: Kept | None) -> BuildSettings:
    """``build OUT --from-samples S`` (``--replan-from E``: continuing the manifest beside S)."""
    assert opts.from_samples is not None
    samples = location(opts.from_samples).rstrip("/") or "/"  # may be given with a trailing slash
    out, look = location(opts.out), not dry_run or storage.is_local(samples)
    fraction, rows = opts.max_reject_fraction, None
    if look:
        rows, recorded_fraction = checks.check_from_samples(samples)
        fraction = recorded_fraction if fraction is None else fraction
    if opts.replan_from is not None and kept is None:
        plan, kept = continued(samples, opts.replan_from, opts.plan.epochs, opts.plan)
        opts = dataclasses.replace(opts, plan=_priced(plan, model))
    weight = inputs.check_weights(
        opts.plan.repeat, opts.plan.max_plan_factor, (), samples, look, opts.nuscenes_version
    )
    if rows is not None:
        check_plan_size(opts.plan, rows, f"--from-samples {samples}", weight)
    checks.check_output(out, [samples], publish=not dry_run)
    datasets, maps = _recorded_datasets(opts, samples, look)
    recorded: dict[str, Any] = {}
    if look:  # the samples' features were computed under their scan's rule: the loaders must apply it
        rule = _recorded(earlier_run.previous_close_points, samples)
        if opts.config.close_points not in (rule, DEFAULT_CLOSE_POINTS):
            raise UsageError(
                f"--close-points {opts.config.close_points}: {samples} was scanned under --close-points {rule}; "
                "rescan to change the rule"
            )
        sweeps, version = _recorded(earlier_run.previous_sweeps, samples)
        pairs = sweeps if isinstance(sweeps, int) else tuple(sorted(sweeps.items()))
        config = dataclasses.replace(opts.config, close_points=rule)
        recorded = {"config": config, "sweeps": pairs, "nuscenes_version": version}
    options = _resolved(opts, out, fraction, from_samples=samples, **recorded)
    root = _path_root(opts, (), samples)
    return BuildSettings(options, samples, datasets, maps, model=model, path_root=root, kept=kept)


def _recorded(read: Any, samples: str) -> Any:
    try:
        return read(samples)
    except ValueError as e:
        raise UsageError(f"--from-samples {samples}: {e}") from None


def _recorded_datasets(
    opts: BuildOptions, samples: str, look: bool
) -> tuple[tuple[Dataset, ...], dict[str, dict[int, int]]]:
    """The datasets and label maps the run that wrote ``samples`` recorded, weighted by ``--dataset-weights``."""
    try:
        before = earlier_run.previous_datasets(samples) if look else ()
    except ValueError as e:
        raise UsageError(str(e)) from None
    scale = dict(opts.plan.repeat.datasets)
    kept = tuple(Dataset(d.name, d.root, d.layout, scale.get(d.name, 1.0)) for d in before)
    unknown = sorted(set(scale) - {d.name for d in kept})
    if unknown and look:
        have = ", ".join(d.name for d in kept) or "none recorded"
        given = ",".join(f"{name}={weight:g}" for name, weight in opts.plan.repeat.datasets)
        raise UsageError(
            f"--dataset-weights {given}: {samples} holds no dataset named {unknown[0]!r} (datasets: {have})"
        )
    return kept, label_maps(before)


def table_settings(opts: BuildOptions, model: CostModel) -> BuildSettings:
    """The settings of ``lidarshard.write_manifest``: a user's table, its paths stored as given."""
    out = location(opts.out)
    checks.check_output(out, [])
    opts = dataclasses.replace(opts, plan=_priced(opts.plan, model))
    check_plan_size(opts.plan)
    options = _resolved(opts, out, opts.max_reject_fraction)
    return BuildSettings(options, created_by=f"lidarshard {__version__} write_manifest", model=model)


def _priced(cfg: PlanConfig, model: CostModel) -> PlanConfig:
    """``cfg`` with the ``launch_ms`` of the ``model`` that plans it (what every rank-step adds)."""
    launch = model.launch_ms or 0.0
    return cfg if cfg.launch == launch else dataclasses.replace(cfg, launch=launch)


def _path_root(
    opts: BuildOptions, datasets: Sequence[Dataset], from_samples: str | None = None
) -> str | None:
    """ROOT the paths are stored relative to (None: full paths): ``--relative-to``, else a dataset's root (a
    glob's fixed part), the INPUTs' common parent, or what ``from_samples`` recorded."""
    from lidarshard.transforms.beam.scan_transform import input_root

    if opts.relative_to is not None:
        return None if opts.relative_to.lower() == "none" else location(opts.relative_to.rstrip("/"))
    if from_samples:
        return earlier_run.previous_root(from_samples)
    roots = [input_root(d.root) if d.layout == FILES else d.root.rstrip("/") for d in datasets]
    return roots[0] if len(roots) == 1 else inputs.common_root(roots)


# ------------------------------------------------------------------------------ a re-plan, plan size

#: The plan settings a re-plan keeps (each must be the previous manifest's), with the flags that set them.
KEPT_SETTINGS = (
    ("world_size", "--world-size"),
    ("batch_size", "--batch-size"),
    ("seed", "--seed"),
    ("strategy", "--strategy"),
    ("policy", "--drop-last/--pad"),
    ("caps", "--max-*-per-rank-step/--max-step-memory/--memory-model"),
    ("repeat", "--repeat-factors/--sample-weights/--dataset-weights"),
    ("heaviest_first", "--heaviest-first"),
    ("max_plan_factor", "--max-plan-factor"),
    ("rank_speed", "--rank-speed"),
    ("plan_groups", "--plan-groups"),
)


def continued(
    from_samples: str,
    epoch: int,
    epochs: int | None,
    given: PlanConfig | None = None,
    m: Manifest | None = None,
) -> tuple[PlanConfig, Kept]:
    """The plan of a re-plan from ``epoch`` on (over ``epochs``; None: its own) of the manifest beside
    ``from_samples`` (``m`` when held): epochs before keep its plan byte for byte, later ones are planned with
    the new cost model; every other setting is its own (``given``, the flags' plan, must agree). Returns
    (the plan, what the build must keep)."""
    prev = earlier_run.previous_dir(from_samples)
    if m is None:
        try:
            m = load_manifest(prev)
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(
                f"--replan-from {epoch} continues the manifest beside --from-samples: {e}"
            ) from None
    epochs = m.epochs if epochs is None else epochs
    if not epoch <= m.epochs or not epoch < epochs:
        raise UsageError(
            f"--replan-from {epoch}: {prev} plans epochs 0..{m.epochs - 1} and --epochs {epochs} plans "
            f"0..{epochs - 1}; E must be at most {m.epochs} and below --epochs"
        )
    if m.cost_model.name == "given":
        raise UsageError(
            f"--replan-from: {prev}'s costs were given with its samples: no cost model re-plans them"
        )
    try:
        cfg = PlanConfig.continuing(m, epoch, epochs)
    except (ValueError, TypeError) as e:
        raise UsageError(f"--replan-from {epoch}: {prev}'s plan settings cannot be used ({e})") from None
    for name, flag in KEPT_SETTINGS if given is not None else ():
        mine, theirs = getattr(given, name), getattr(cfg, name)
        if mine != theirs:
            raise UsageError(
                f"--replan-from keeps {prev}'s plan settings, but {flag} gives {name} {_shown(mine)} where it "
                f"planned {_shown(theirs)}: give the previous build's flags"
            )
    if cfg.weights is not None or (given is not None and given.weights is not None):
        raise UsageError(
            "--replan-from with --bucket-weights: the buckets are cost quantiles and move with the cost model; "
            "re-plan without bucket weights"
        )
    return cfg, kept_from(prev, m, epoch)


def _shown(value: object) -> str:
    to_json = getattr(value, "to_json", None)
    return "none" if value is None else str(to_json() if callable(to_json) else value)


def check_plan_size(
    cfg: PlanConfig, rows: int | None = None, where: str = "", sample_weight: float | None = None
) -> None:
    """Refuse before Beam a plan that cannot be built or read here: its list of plan files past the readers'
    cap on ``_manifest.json``; with ``rows`` known (``--from-samples``) an epoch of ~rows x the mean weight
    entries (at most ``--max-plan-factor`` x) past ``MAX_EPOCH_ENTRIES`` or this machine's memory at
    ``PLAN_ENTRY_BYTES`` each, or an unweighted ``--drop-last`` plan that drops every sample. UsageError."""
    entry = {schemas.plan_file(cfg.epochs - 1, cfg.world_size - 1): {"bytes": 2**40, "sha256": "0" * 64}}
    one = len(json.dumps({"files": entry}, indent=2)) - len(json.dumps({"files": {}}, indent=2))
    # bytes _manifest.json takes to list one file per epoch and rank
    listed = cfg.epochs * cfg.world_size * one
    if listed > storage.METADATA_MAX_BYTES:
        raise UsageError(
            f"--epochs {cfg.epochs} x --world-size {cfg.world_size} = {cfg.epochs * cfg.world_size:,} plan "
            f"files; _manifest.json would list them in ~{listed / 2**20:.0f} MiB, more than the "
            f"{storage.METADATA_MAX_BYTES >> 20} MiB any reader accepts: plan fewer epochs per build"
        )
    if rows is None:
        return
    repeat = cfg.repeat  # weights may repeat samples, --pad repeats them, budget plans every sample
    weighted = cfg.weights or sample_weight is not None or repeat.threshold is not None or repeat.datasets
    if rows < cfg.step_size and cfg.policy == "drop_last" and not weighted and cfg.strategy not in ANY_POOL:
        raise UsageError(
            f"--world-size {cfg.world_size} x --batch-size {cfg.batch_size} = {cfg.step_size} samples per step, "
            f"but {where} holds {rows}: every sample would be dropped; use --pad or a smaller --world-size/--batch-size"
        )
    factor = sum(cfg.weights) / len(cfg.weights) if cfg.weights else 1.0
    factor = min(factor * (1.0 if sample_weight is None else sample_weight), cfg.max_plan_factor)
    entries = math.ceil(rows * factor) + (0 if cfg.strategy in ANY_POOL else cfg.step_size)
    what = f"{where} holds {rows:,} samples; at ~{factor:.3g} plan entries each an epoch plans ~{entries:.3g}"
    if entries > MAX_EPOCH_ENTRIES:
        raise UsageError(
            f"{what} entries, more than the {MAX_EPOCH_ENTRIES:.3g} any epoch may hold: lower the weights"
        )
    memory, need = memory_bytes(), entries * PLAN_ENTRY_BYTES
    if memory is not None and need > memory:
        raise UsageError(
            f"{what} entries, ~{need / 2**30:.3g} GiB to plan at ~{PLAN_ENTRY_BYTES} bytes an entry, more than "
            f"this machine's {memory / 2**30:.3g} GiB: lower --bucket-weights/--sample-weights, or plan on a "
            "machine with more memory"
        )

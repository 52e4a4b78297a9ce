"""The pre-flight of ``scan``, ``build`` and the Python API: every check that reads what the user named
(INPUTs and their layouts, label maps, OUT, the ``--from-samples`` table and the manifest beside it), made
before Beam starts, and the settings of the run: the options with OUT located, defaults resolved and what
``--from-samples`` recorded. The options themselves were checked where they were built (flags or keywords,
``lidarshard.pipelines.options``). A problem raises :class:`~lidarshard.transforms.declare.UsageError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

from lidarshard import __version__
from lidarshard.pipelines import checks, inputs, understood
from lidarshard.pipelines.options import DEFAULT_REJECT_FRACTION, BuildOptions, ScanOptions, cost_model
from lidarshard.pipelines.replan import continued
from lidarshard.pipelines.settings import BuildSettings, ScanSettings, check_plan_size, location
from lidarshard.pipelines.understood import sweeps_of
from lidarshard.schemas.records import label_maps
from lidarshard.transforms.core import earlier_run
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.manifest_writer import Kept
from lidarshard.transforms.features import repeat
from lidarshard.transforms.features.cost import CostModel
from lidarshard.transforms.features.sample import ScanConfig
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.parts import open_parts, read_parts, samples_files
from lidarshard.transforms.layouts import FILES, Dataset
from lidarshard.transforms.layouts.multisweep import DEFAULT_CLOSE_POINTS
from lidarshard.transforms.value_checks import UsageError

__all__ = ["scan_settings", "build_settings", "table_settings"]

_O = TypeVar("_O", bound=ScanOptions)


def scan_settings(opts: ScanOptions, dry_run: bool = False) -> ScanSettings:
    """INPUTs and OUT checked, the scan's settings (``dry_run``: only the job graph will be built; remote
    paths are not looked at, and OUT is not checked for replacing)."""
    out, (datasets, look) = location(opts.out), _datasets(opts, dry_run)
    checks.check_output(out, [d.root for d in datasets], publish=not dry_run)
    maps = inputs.label_maps(datasets, look)
    return ScanSettings(_resolved(opts, out, opts.max_reject_fraction), datasets[0].root, datasets, maps)


def _datasets(opts: ScanOptions, dry_run: bool) -> tuple[tuple[Dataset, ...], bool]:
    """The INPUTs, located, checked, given their layouts (``pipelines.inputs``) and weights, and the flags
    their layouts must honour checked; and whether the files were looked at (not in an offline dry run)."""
    located = []
    for spec in opts.input:
        name, where = inputs.split_input(spec)
        located.append(f"{name}={location(where)}" if name else location(where))
    look = not dry_run or all(storage.is_local(inputs.split_input(s)[1]) for s in located)
    weights = dict(opts.plan.repeat.datasets) if isinstance(opts, BuildOptions) else {}
    datasets = inputs.resolve_datasets(located, opts.dataset, weights, opts.nuscenes_version, look)
    if look:
        _check_layout_flags(opts, datasets)
    return datasets, look


def _resolved(opts: _O, out: str, fraction: float | None, **changes: Any) -> _O:
    """``opts`` as the run uses them: OUT located, the reject fraction resolved (None: the default)."""
    fraction = DEFAULT_REJECT_FRACTION if fraction is None else fraction
    return dataclasses.replace(opts, out=out, max_reject_fraction=fraction, **changes)


def _check_layout_flags(opts: ScanOptions, datasets: Sequence[Dataset]) -> None:
    """A flag no INPUT's layout can honour is a usage error, not a value recorded and ignored:
    ``--sweeps`` of loose point-cloud files (they have no sweeps) or naming no INPUT, and
    ``--nuscenes-version`` where no INPUT is a nuScenes dataroot."""
    names = [d.name for d in datasets]
    if not datasets:  # --from-samples (checked in build_settings) or a table
        return
    sweeps = opts.recorded_sweeps
    shown = sweeps if isinstance(sweeps, int) else ",".join(f"{k}={v}" for k, v in sweeps.items())
    unknown = sorted(set(sweeps) - set(names)) if isinstance(sweeps, dict) else []
    if unknown:
        raise UsageError(f"--sweeps {shown}: no INPUT is named {unknown[0]!r} (INPUTs: {', '.join(names)})")
    for d in datasets:
        if d.layout == FILES and sweeps_of(sweeps, d.name):
            other = "; give sweeps per INPUT: --sweeps NAME=N,..." if len(datasets) > 1 else ""
            raise UsageError(
                f"--sweeps {shown}: INPUT {d.name} is loose point-cloud files, one sample each, with no sweeps "
                f"to aggregate (sweeps need a dataset layout's poses: nuScenes, Argoverse 2, SemanticKITTI, "
                f"Waymo v2){other}"
            )
    if opts.nuscenes_version and not any(d.layout == "nuscenes" for d in datasets):
        found = ", ".join(f"{d.name} ({understood.TITLES[d.layout]})" for d in datasets)
        raise UsageError(
            f"--nuscenes-version {opts.nuscenes_version}: no INPUT is a nuScenes dataroot ({found}); leave it out"
        )


def build_settings(opts: BuildOptions, dry_run: bool = False, kept: Kept | None = None) -> BuildSettings:
    """The checked settings of ``lidarshard build`` (INPUT... OUT, or OUT with ``--from-samples``); see
    ``scan_settings`` for ``dry_run``. ``kept``: a re-plan's, when ``lidarshard.replan`` constructed its plan
    from the manifest it holds (``replan.continued``); else a ``--replan-from`` is continued here."""
    if (len(opts.input) != 0) if opts.from_samples else not opts.input:
        raise UsageError("expected OUT with --from-samples" if opts.from_samples else "expected INPUT OUT")
    if opts.from_samples and opts.sweeps:
        raise UsageError("--sweeps: --from-samples re-plans samples scanned already, with their sweeps")
    model = cost_model(opts.cost_model)
    opts = dataclasses.replace(opts, plan=priced(opts.plan, model))
    check_plan_size(opts.plan)
    if opts.from_samples:
        return _from_samples(opts, model, dry_run, kept)
    out, (datasets, look) = location(opts.out), _datasets(opts, dry_run)
    _check_weights(opts, datasets, None, look)
    checks.check_output(out, [d.root for d in datasets], publish=not dry_run)
    options, maps = _resolved(opts, out, opts.max_reject_fraction), inputs.label_maps(datasets, look)
    root = _path_root(opts, datasets, None)
    return BuildSettings(options, datasets[0].root, datasets, maps, model=model, path_root=root)


def _from_samples(opts: BuildOptions, model: CostModel, dry_run: bool, kept: Kept | None) -> BuildSettings:
    """``build OUT --from-samples S`` (``--replan-from E``: continuing the manifest beside S)."""
    assert opts.from_samples is not None
    samples = location(opts.from_samples).rstrip("/") or "/"  # may be given with a trailing slash
    out = location(opts.out)
    look = not dry_run or storage.is_local(samples)
    fraction, rows = opts.max_reject_fraction, None
    if look:
        rows, recorded_fraction = checks.check_from_samples(samples)
        fraction = recorded_fraction if fraction is None else fraction
    if opts.replan_from is not None and kept is None:
        plan, kept = continued(samples, opts.replan_from, opts.plan.epochs, opts.plan)
        opts = dataclasses.replace(opts, plan=priced(plan, model))
    weight = _check_weights(opts, (), samples, look)
    if rows is not None:
        check_plan_size(opts.plan, rows, f"--from-samples {samples}", weight)
    checks.check_output(out, [samples], publish=not dry_run)
    datasets, maps = _recorded_datasets(opts, samples, look)
    recorded_scan: dict[str, Any] = {}
    if look:  # the samples' features were computed under their scan's rule: the loaders must apply it
        recorded_scan = {"config": _recorded_rule(opts.config, samples), **_recorded_sweeps(samples)}
    options = _resolved(opts, out, fraction, from_samples=samples, **recorded_scan)
    root = _path_root(opts, (), samples)
    return BuildSettings(options, samples, datasets, maps, model=model, path_root=root, kept=kept)


def _recorded_sweeps(samples: str) -> dict[str, Any]:
    """The sweeps and tables version the run that wrote ``samples`` recorded: its samples carry them."""
    try:
        sweeps, version = earlier_run.previous_sweeps(samples)
    except ValueError as e:
        raise UsageError(f"--from-samples {samples}: {e}") from None
    pairs = sweeps if isinstance(sweeps, int) else tuple(sorted(sweeps.items()))
    return {"sweeps": pairs, "nuscenes_version": version}


def _recorded_rule(config: ScanConfig, samples: str) -> ScanConfig:
    """``config`` with the close-point rule the scan of ``samples`` recorded; a different
    ``--close-points`` is a usage error (the recorded features were not computed under it)."""
    try:
        rule = earlier_run.previous_close_points(samples)
    except ValueError as e:
        raise UsageError(f"--from-samples {samples}: {e}") from None
    if config.close_points not in (rule, DEFAULT_CLOSE_POINTS):
        raise UsageError(
            f"--close-points {config.close_points}: {samples} was scanned under --close-points {rule}; "
            "rescan to change the rule"
        )
    return dataclasses.replace(config, close_points=rule)


def _recorded_datasets(
    opts: BuildOptions, samples: str, look: bool
) -> tuple[tuple[Dataset, ...], dict[str, dict[int, int]]]:
    """The datasets and label maps the run that wrote ``samples`` recorded, weighted by ``--dataset-weights``
    (each of whose names must be one of them); nothing when not looked at."""
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
    opts = dataclasses.replace(opts, plan=priced(opts.plan, model))
    check_plan_size(opts.plan)
    options = _resolved(opts, out, opts.max_reject_fraction)
    return BuildSettings(options, created_by=f"lidarshard {__version__} write_manifest", model=model)


def priced(cfg: PlanConfig, model: CostModel) -> PlanConfig:
    """``cfg`` with the ``launch_ms`` of the ``model`` that plans it (what every rank-step adds)."""
    launch = model.launch_ms or 0.0
    return cfg if cfg.launch == launch else dataclasses.replace(cfg, launch=launch)


def _path_root(opts: BuildOptions, datasets: Sequence[Dataset], from_samples: str | None) -> str | None:
    """ROOT the manifest's paths are stored relative to (``--relative-to``; None: full paths): by
    default a dataset's root (a glob's fixed part), the INPUTs' common parent when there are several."""
    from lidarshard.transforms.beam.scan_transform import input_root

    if opts.relative_to is not None:
        return None if opts.relative_to.lower() == "none" else location(opts.relative_to.rstrip("/"))
    if from_samples:
        return earlier_run.previous_root(from_samples)
    roots = [input_root(d.root) if d.layout == FILES else d.root.rstrip("/") for d in datasets]
    return roots[0] if len(roots) == 1 else inputs.common_root(roots)


def _check_weights(
    opts: BuildOptions, datasets: Sequence[Dataset], from_samples: str | None, look: bool
) -> float | None:
    """``--sample-weights`` names a good column of the ``--from-samples`` table; ``--repeat-factors``
    has lidarseg labels to read (a dataroot with ``lidarseg.json``, or labelled samples). Files are
    only looked at with ``look`` (not in an offline dry run). Returns the mean sample weight (None:
    no ``--sample-weights``, or not looked at)."""
    cfg = opts.plan
    column = cfg.repeat.column
    if column is not None and not from_samples:
        raise UsageError(
            f"--sample-weights {column} reads a column of a --from-samples table: add --from-samples PREV/samples"
        )
    if not look:
        return None
    files = samples_files(from_samples) if from_samples else []
    mean = None if column is None else _mean_weight(files, column, cfg.max_plan_factor)
    if cfg.repeat.threshold is None:
        return mean
    if from_samples:
        labelled = read_parts(files, columns=["label_path"]).column("label_path")
        if labelled.null_count == len(labelled):
            raise UsageError(
                f"--repeat-factors: no sample of {from_samples} has lidarseg labels (label_path)"
            )
    else:
        _check_labelled(datasets, opts.nuscenes_version)
    return mean


def _mean_weight(files: Sequence[str], column: str, max_plan_factor: float) -> float:
    """The mean of ``--sample-weights`` column ``column`` of the samples parts ``files``, checked."""
    with open_parts(files) as file:
        schema = file.schema_arrow
    table = (  # only the column: a missing one gets named with the ones there are
        read_parts(files, columns=[column]) if column in schema.names else schema.empty_table()
    )
    try:
        w = repeat.check_weights(table, column, max_plan_factor)
    except ValueError as e:
        raise UsageError(f"--sample-weights {e}") from None
    return float(w.mean()) if w.size else 0.0


def _check_labelled(datasets: Sequence[Dataset], version: str | None) -> None:
    """``--repeat-factors`` over INPUTs: exactly one of them has per-point labels."""
    labelled = [d for d in datasets if _has_labels(d, version)]
    if len(labelled) > 1:
        named = ", ".join(d.name for d in labelled)
        raise UsageError(
            f"--repeat-factors: INPUTs {named} all have labels, whose class ids mean different classes; "
            "repeat factors over them would mix the classes: give one labelled INPUT, or --dataset-weights"
        )
    if not labelled:
        d = datasets[0]
        where = f"{d.root}/{version}" if d.layout == "nuscenes" else d.root
        raise UsageError(
            f"--repeat-factors reads per-point labels: {where} has no lidarseg.json (a nuScenes dataroot "
            "with lidarseg) and no SemanticKITTI labels/*.label"
        )


def _has_labels(d: Dataset, version: str | None) -> bool:
    """``d`` has per-point label files the scan reads (lidarseg tables, SemanticKITTI labels)."""
    if d.layout == "nuscenes":
        return bool(version) and storage.exists(storage.join(d.root, version or "", "lidarseg.json"))
    if d.layout == "semantickitti":
        return bool(inputs.LAYOUT_IO.glob(storage.join(d.root, "**", "labels", "*.label")))
    return False

"""The pre-flight of ``scan``, ``build`` and the Python API: every check that reads what the user named
(INPUTs and their layouts, label maps, OUT, the ``--from-samples`` table, a ``@file.json`` cost model),
made before Beam starts, and the settings built from the options and what was read.

The conversion itself (options -> ``ScanConfig`` / ``PlanConfig``, the rules between flags) is pure and
lives in ``lidarshard.pipelines.settings``; this module adds what needs the files. A problem raises
:class:`~lidarshard.pipelines.flags.UsageError` with one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from lidarshard import __version__
from lidarshard.pipelines import checks, inputs, understood
from lidarshard.pipelines.flags import UsageError
from lidarshard.pipelines.options import DEFAULT_REJECT_FRACTION, BuildOptions, ScanOptions
from lidarshard.pipelines.replan import replan_settings
from lidarshard.pipelines.settings import (
    BuildSettings,
    ScanSettings,
    check_plan_size,
    dataset_weights,
    location,
    plan_config,
    scan_config,
    weights_text,
)
from lidarshard.pipelines.understood import sweeps_of
from lidarshard.schemas.manifest import Manifest
from lidarshard.schemas.records import label_maps
from lidarshard.transforms.core import recorded
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.features import repeat
from lidarshard.transforms.features.cost import CostModel, parse_cost_model
from lidarshard.transforms.features.sample import ScanConfig
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.parts import open_parts, read_parts, samples_files
from lidarshard.transforms.layouts import FILES, Dataset
from lidarshard.transforms.layouts.multisweep import DEFAULT_CLOSE_POINTS

__all__ = ["cost_model", "scan_settings", "build_settings", "table_settings"]


def cost_model(spec: str) -> CostModel:
    """Parse ``--cost-model`` once, in the launcher (``@file.json`` is read here, not by workers)."""
    try:
        return parse_cost_model(spec)
    except FileNotFoundError:
        raise UsageError(f"--cost-model {spec}: no such file") from None
    except (ValueError, OSError) as e:
        raise UsageError(f"--cost-model {spec}: {getattr(e, 'strerror', None) or e}") from None


def scan_settings(
    opts: ScanOptions, specs: Sequence[str], output: str, dry_run: bool = False
) -> ScanSettings:
    """INPUTs (``[NAME=]PATH`` each) and OUT checked, the scan options as settings (``dry_run``: only the
    job graph will be built; remote paths are not looked at, and OUT is not checked for replacing)."""
    if opts.dataset_weights is not None:
        raise UsageError(
            f"--dataset-weights {opts.dataset_weights} weights a plan: give it to build (a scan plans nothing)"
        )
    output = location(output)
    datasets = _datasets(opts, specs, dry_run)
    checks.check_output(output, [d.root for d in datasets], publish=not dry_run)
    return _scan(opts, datasets, output, opts.max_reject_fraction, dry_run)


def _datasets(opts: ScanOptions, specs: Sequence[str], dry_run: bool) -> tuple[Dataset, ...]:
    """The INPUTs, located, checked and given their layouts (``pipelines.inputs``)."""
    located = []
    for spec in specs:
        name, path = inputs.split_input(spec)
        located.append(f"{name}={location(path)}" if name else location(path))
    look = not dry_run or all(storage.is_local(inputs.split_input(s)[1]) for s in located)
    weights = dict(dataset_weights(opts.dataset_weights))
    return inputs.resolve_datasets(located, opts.dataset, weights, opts.nuscenes_version, look)


def _scan(
    opts: ScanOptions, datasets: tuple[Dataset, ...], output: str, fraction: float | None, dry_run: bool
) -> ScanSettings:
    """The scan options of checked INPUTs as settings (``fraction`` None: the default)."""
    look = not dry_run or all(storage.is_local(d.root) for d in datasets)
    if look:
        _check_layout_flags(opts, datasets)
    return ScanSettings(
        input=datasets[0].root if datasets else None,
        output=output,
        config=scan_config(opts),
        nuscenes_version=opts.nuscenes_version,
        sweeps=opts.sweeps,
        part_rows=opts.part_rows,
        max_reject_fraction=DEFAULT_REJECT_FRACTION if fraction is None else fraction,
        datasets=datasets,
        label_maps=inputs.label_maps(datasets, look),
    )


def _check_layout_flags(opts: ScanOptions, datasets: Sequence[Dataset]) -> None:
    """A flag no INPUT's layout can honour is a usage error, not a value recorded and ignored:
    ``--sweeps`` of loose point-cloud files (they have no sweeps) or naming no INPUT, and
    ``--nuscenes-version`` where no INPUT is a nuScenes dataroot."""
    names = [d.name for d in datasets]
    if not datasets:  # --from-samples (checked in build_settings) or a table
        return
    sweeps = opts.sweeps if isinstance(opts.sweeps, int) else dict(opts.sweeps)
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


def build_settings(
    opts: BuildOptions,
    paths: Sequence[str],
    dry_run: bool = False,
    replan: tuple[PlanConfig, Manifest] | None = None,
) -> BuildSettings:
    """The checked settings of ``lidarshard build`` (``paths``: INPUT... OUT, or OUT with
    ``--from-samples``); see ``scan_settings`` for ``dry_run``. ``replan``: the plan and the manifest
    it continues, which ``lidarshard.replan`` constructed from the manifest it holds; they stand for the
    plan options and the manifest beside ``--from-samples``."""
    if (len(paths) != 1) if opts.from_samples else (len(paths) < 2):
        raise UsageError("expected OUT with --from-samples" if opts.from_samples else "expected INPUT OUT")
    if opts.from_samples and opts.sweeps:
        raise UsageError("--sweeps: --from-samples re-plans samples scanned already, with their sweeps")
    if opts.replan_from is not None and not opts.from_samples:
        raise UsageError(
            f"--replan-from {opts.replan_from} re-plans a manifest: add --from-samples PREV/samples"
        )
    model = cost_model(opts.cost_model)
    cfg = priced(plan_config(opts) if replan is None else replan[0], model)
    check_plan_size(cfg)
    if opts.from_samples:
        return _from_samples(opts, cfg, model, location(paths[0]), dry_run, replan and replan[1])
    output = location(paths[-1])
    datasets = _datasets(opts, paths[:-1], dry_run)
    look = not dry_run or all(storage.is_local(d.root) for d in datasets)
    _check_weights(opts, cfg, datasets, None, look)
    checks.check_output(output, [d.root for d in datasets], publish=not dry_run)
    scan = _scan(opts, datasets, output, opts.max_reject_fraction, dry_run)
    return BuildSettings(scan, cfg, model, None, _path_root(opts, datasets, None))


def _from_samples(
    opts: BuildOptions,
    cfg: PlanConfig,
    model: CostModel,
    output: str,
    dry_run: bool,
    previous: Manifest | None,
) -> BuildSettings:
    """``build OUT --from-samples S`` (``--replan-from E``: continuing ``previous``, or the manifest beside S)."""
    assert opts.from_samples is not None
    samples = location(opts.from_samples).rstrip("/") or "/"  # may be given with a trailing slash
    look = not dry_run or storage.is_local(samples)
    fraction, rows = opts.max_reject_fraction, None
    if look:
        rows, recorded_fraction = checks.check_from_samples(samples)
        fraction = recorded_fraction if fraction is None else fraction
    kept = None
    if opts.replan_from is not None:
        cfg, kept = replan_settings(cfg, samples, opts.replan_from, previous)
    weight = _check_weights(opts, cfg, (), samples, look)
    if rows is not None:
        check_plan_size(cfg, rows, f"--from-samples {samples}", weight)
    checks.check_output(output, [samples], publish=not dry_run)
    datasets, maps = _recorded_datasets(opts, cfg, samples, look)
    scan = dataclasses.replace(
        _scan(opts, (), output, fraction, dry_run), input=samples, datasets=datasets, label_maps=maps
    )
    if look:  # the samples' features were computed under their scan's rule: the loaders must apply it
        scan = dataclasses.replace(scan, config=_recorded_rule(opts, scan.config, samples))
        scan = dataclasses.replace(scan, **_recorded_sweeps(samples))
    return BuildSettings(scan, cfg, model, samples, _path_root(opts, (), samples), kept)


def _recorded_sweeps(samples: str) -> dict[str, Any]:
    """The sweeps and tables version the run that wrote ``samples`` recorded: its samples carry them."""
    try:
        sweeps, version = recorded.previous_sweeps(samples)
    except ValueError as e:
        raise UsageError(f"--from-samples {samples}: {e}") from None
    pairs = sweeps if isinstance(sweeps, int) else tuple(sorted(sweeps.items()))
    return {"sweeps": pairs, "nuscenes_version": version}


def _recorded_rule(opts: BuildOptions, config: ScanConfig, samples: str) -> ScanConfig:
    """``config`` with the close-point rule the scan of ``samples`` recorded; a different
    ``--close-points`` is a usage error (the recorded features were not computed under it)."""
    try:
        rule = recorded.previous_close_points(samples)
    except ValueError as e:
        raise UsageError(f"--from-samples {samples}: {e}") from None
    if opts.close_points not in (rule, DEFAULT_CLOSE_POINTS):
        raise UsageError(
            f"--close-points {opts.close_points}: {samples} was scanned under --close-points {rule}; "
            "rescan to change the rule"
        )
    return dataclasses.replace(config, close_points=rule)


def _recorded_datasets(
    opts: BuildOptions, cfg: PlanConfig, samples: str, look: bool
) -> tuple[tuple[Dataset, ...], dict[str, dict[int, int]]]:
    """The datasets and label maps the run that wrote ``samples`` recorded, weighted by ``--dataset-weights``
    (each of whose names must be one of them); nothing when not looked at."""
    try:
        before = recorded.previous_datasets(samples) if look else ()
    except ValueError as e:
        raise UsageError(str(e)) from None
    scale = dict(cfg.repeat.datasets)
    kept = tuple(Dataset(d.name, d.root, d.layout, scale.get(d.name, 1.0)) for d in before)
    unknown = sorted(set(scale) - {d.name for d in kept})
    if unknown and look:
        have = ", ".join(d.name for d in kept) or "none recorded"
        given = opts.dataset_weights or weights_text(cfg.repeat.datasets)
        raise UsageError(
            f"--dataset-weights {given}: {samples} holds no dataset named {unknown[0]!r} (datasets: {have})"
        )
    return kept, label_maps(before)


def table_settings(opts: BuildOptions, output: str, model: CostModel) -> BuildSettings:
    """The settings of ``lidarshard.write_manifest``: a user's table, its paths stored as given."""
    output = location(output)
    checks.check_output(output, [])
    fraction = DEFAULT_REJECT_FRACTION if opts.max_reject_fraction is None else opts.max_reject_fraction
    created = f"lidarshard {__version__} write_manifest"
    scan = ScanSettings(None, output, ScanConfig(), None, 0, opts.part_rows, fraction, created)
    cfg = priced(plan_config(opts), model)
    check_plan_size(cfg)
    return BuildSettings(scan, cfg, model)


def priced(cfg: PlanConfig, model: CostModel) -> PlanConfig:
    """``cfg`` with the ``launch_ms`` of the ``model`` that plans it (what every rank-step adds)."""
    return dataclasses.replace(cfg, launch=model.launch_ms or 0.0)


def _path_root(opts: BuildOptions, datasets: Sequence[Dataset], from_samples: str | None) -> str | None:
    """ROOT the manifest's paths are stored relative to (``--relative-to``; None: full paths): by
    default a dataset's root (a glob's fixed part), the INPUTs' common parent when there are several."""
    from lidarshard.transforms.beam.scan_transform import input_root

    if opts.relative_to is not None:
        return None if opts.relative_to.lower() == "none" else location(opts.relative_to.rstrip("/"))
    if from_samples:
        return recorded.previous_root(from_samples)
    roots = [input_root(d.root) if d.layout == FILES else d.root.rstrip("/") for d in datasets]
    return roots[0] if len(roots) == 1 else inputs.common_root(roots)


def _check_weights(
    opts: BuildOptions, cfg: PlanConfig, datasets: Sequence[Dataset], from_samples: str | None, look: bool
) -> float | None:
    """``--sample-weights`` names a good column of the ``--from-samples`` table; ``--repeat-factors``
    has lidarseg labels to read (a dataroot with ``lidarseg.json``, or labelled samples). Files are
    only looked at with ``look`` (not in an offline dry run). Returns the mean sample weight (None:
    no ``--sample-weights``, or not looked at)."""
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

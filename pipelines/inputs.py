"""The INPUTs of a run, resolved once before Beam starts: each one's name, layout, weight and label map.

``INPUT`` is ``[NAME=]PATH``: a directory or glob of point clouds, or a dataset layout's root, recognised from
what is there (``transforms.layouts.detect``) unless ``--dataset`` names it. Several make one plan, each
sample_id prefixed with its NAME (default: the last path component). Problems: UsageError, one line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from lidarshard.pipelines import checks, understood
from lidarshard.transforms import layouts
from lidarshard.transforms.features import repeat
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.parts import open_parts, read_parts, samples_files
from lidarshard.transforms.layouts import FILES, Dataset
from lidarshard.transforms.value_checks import UsageError

__all__ = [
    "resolve_datasets",
    "split_input",
    "common_root",
    "label_maps",
    "check_layout_flags",
    "check_weights",
    "LAYOUT_IO",
]

LAYOUT_IO = layouts.STORAGE_IO
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_TITLES = understood.TITLES | {"nuscenes": "a nuScenes dataroot"}


def split_input(spec: str) -> tuple[str | None, str]:
    """``NAME=PATH`` -> (NAME, PATH); else (an existing path, a ``NAME=`` that is no plain name) (None, PATH)."""
    name, eq, path = spec.partition("=")
    if eq and _NAME.fullmatch(name) and path and not os.path.exists(spec):
        return name, path
    return None, spec


def _named(flag: str, given: Mapping[str, object], names: Sequence[str], fmt: str = "") -> None:
    """Each NAME of ``flag`` (``--dataset``, ``--dataset-weights``, ``--sweeps``) is an INPUT's."""
    for name in given:
        if name not in names:
            shown = ",".join(f"{k}={v:{fmt}}" for k, v in given.items())
            raise UsageError(f"{flag} {shown}: no INPUT is named {name!r} (INPUTs: {', '.join(names)})")


def _layout(path: str, forced: str | None, version: str | None, look: bool) -> str:
    """INPUT ``path``'s layout: ``forced`` (checked against what is there; ``version``: nuScenes), else detected;
    without ``look`` (an offline dry run) nothing is read."""
    if forced is None and version:
        forced = "nuscenes"
    if not look:
        return forced or FILES
    if checks.is_pattern(path):
        if forced not in (None, FILES):
            raise UsageError(
                f"--dataset {forced}: INPUT {path} must be the dataset's root directory, not a pattern"
            )
        return FILES
    if forced == FILES:
        return FILES
    try:
        if forced is None:
            return layouts.detect(path, LAYOUT_IO)  # several layouts at once: one line naming them
        found = layouts.describe(path, LAYOUT_IO)
    except (OSError, ValueError) as e:
        raise UsageError(f"INPUT {path}: {getattr(e, 'strerror', None) or e}") from None
    if forced == "nuscenes" and version and "nuscenes" not in found:
        if found:  # another layout: the flag cannot be honoured
            raise UsageError(
                f"--nuscenes-version {version}: INPUT {path} is {'; '.join(found.values())}, not a nuScenes "
                "dataroot; leave the flag out"
            )
        return forced  # a one-INPUT --nuscenes-version: check_nuscenes names the folders there are
    if forced not in found:
        lacking = None if found else layouts.incomplete(path, LAYOUT_IO)
        if lacking:
            raise UsageError(f"INPUT {path} (--dataset {forced}) {lacking}")
        seen = "; ".join(found.values()) or "no dataset layout"
        raise UsageError(f"INPUT {path} is not {_TITLES[forced]} (--dataset {forced}): found {seen}")
    return forced


def resolve_datasets(
    specs: Sequence[tuple[str | None, str]],
    dataset: str | tuple[tuple[str, str], ...] | None,
    weights: Mapping[str, float],
    version: str | None,
    look: bool,
) -> tuple[Dataset, ...]:
    """The checked INPUTs (``specs``: (NAME or None, PATH), paths absolute or URIs) with ``--dataset``'s layouts,
    ``--dataset-weights``' weights and ``version``."""
    names = [name or layouts.dataset_name(path) for name, path in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(
            f"two INPUTs are named {dup[0]!r}: name them, e.g. nusc=/data/nuscenes kitti=/data/kitti"
        )
    forced = dict(dataset) if isinstance(dataset, tuple) else dict.fromkeys(names, dataset) if dataset else {}
    _named("--dataset", forced, names)
    _named("--dataset-weights", weights, names, "g")
    _check_apart([path for _, path in specs], look)
    out = []
    for name, (_, path) in zip(names, specs, strict=True):
        if look:
            checks.check_input(path)
        # one INPUT: --nuscenes-version says it is a dataroot; several: it serves the nuScenes ones
        layout = _layout(path, forced.get(name), version if len(specs) == 1 else None, look)
        if layout == "nuscenes" and look:
            checks.check_nuscenes(path, version)
        out.append(Dataset(name, path, layout, weights.get(name, 1.0)))
    return tuple(out)


def _check_apart(paths: Sequence[str], look: bool) -> None:
    """No INPUT holds another or shares a file with it (directories by path, patterns with ``look`` by file)."""
    roots = [(checks.real(p), p) for p in paths if not checks.is_pattern(p)]
    for i, (a, shown_a) in enumerate(roots):
        for b, shown_b in roots[i + 1 :]:
            if a == b or checks.under(a, b) or checks.under(b, a):
                inner, outer = (shown_a, shown_b) if len(a) >= len(b) else (shown_b, shown_a)
                raise UsageError(
                    f"INPUT {outer} holds INPUT {inner}: its files would be scanned twice; give them apart"
                )
    if not look:
        return
    matched: list[tuple[str, set[str]]] = []
    for pattern in (p for p in paths if checks.is_pattern(p)):
        files = {checks.real(f) for f in storage.glob(pattern)}
        for root, shown in roots:
            inside = sorted(f for f in files if checks.under(f, root))
            if inside:
                raise UsageError(
                    f"INPUT {shown} holds {inside[0]}, which INPUT {pattern} matches too: "
                    "its files would be scanned twice; give them apart"
                )
        for other, seen in matched:
            both = sorted(files & seen)
            if both:
                raise UsageError(
                    f"INPUTs {other} and {pattern} both match {both[0]}: it would be scanned twice; "
                    "give them apart"
                )
        matched.append((pattern, files))


def label_maps(datasets: Sequence[Dataset], look: bool) -> dict[str, dict[int, int]]:
    """{dataset name: {raw label id: class id}} of the layouts that map labels (a bad map: one line now)."""
    out = {}
    for d in datasets:
        if not look or d.layout == FILES:
            continue
        find = getattr(layouts.module(d.layout), "find_label_map", None)
        if find is None:
            continue
        try:
            found = find(d.root.rstrip("/"), LAYOUT_IO)
        except (OSError, ValueError) as e:
            raise UsageError(f"INPUT {d.root}: {getattr(e, 'strerror', None) or e}") from None
        if found is not None:
            out[d.name] = dict(found)
    return out


def common_root(roots: Sequence[str]) -> str | None:
    """The deepest directory holding all ``roots`` (local, or URIs of one scheme and bucket), else None."""
    if not roots:
        return None
    if all(storage.is_local(r) for r in roots):
        try:
            return os.path.commonpath([r.rstrip("/") or "/" for r in roots])
        except ValueError:
            return None
    schemes = {r.split("://", 1)[0] for r in roots if "://" in r}
    if len(schemes) != 1 or not all("://" in r for r in roots):
        return None
    common = os.path.commonprefix([r.rstrip("/").split("/") for r in roots])
    # scheme://bucket is parts [scheme:, "", bucket]: a common root needs at least the bucket
    return "/".join(common) if len(common) >= 3 and common[2] else None


def check_layout_flags(
    sweeps: int | dict[str, int], version: str | None, datasets: Sequence[Dataset]
) -> None:
    """A flag no INPUT's layout can honour is refused, not recorded and ignored: ``--sweeps`` naming no INPUT
    or of loose files (they have no sweeps), ``--nuscenes-version`` where no INPUT is a nuScenes dataroot."""
    names = [d.name for d in datasets]
    if not datasets:  # --from-samples or a table
        return
    if isinstance(sweeps, dict):
        _named("--sweeps", sweeps, names)
    shown = sweeps if isinstance(sweeps, int) else ",".join(f"{k}={v}" for k, v in sweeps.items())
    for d in datasets:
        if d.layout == FILES and understood.sweeps_of(sweeps, d.name):
            other = "; give sweeps per INPUT: --sweeps NAME=N,..." if len(datasets) > 1 else ""
            raise UsageError(
                f"--sweeps {shown}: INPUT {d.name} is loose point-cloud files, one sample each, with no sweeps "
                f"to aggregate (sweeps need a dataset layout's poses: nuScenes, Argoverse 2, SemanticKITTI, "
                f"Waymo v2){other}"
            )
    if version and not any(d.layout == "nuscenes" for d in datasets):
        found = ", ".join(f"{d.name} ({understood.TITLES[d.layout]})" for d in datasets)
        raise UsageError(
            f"--nuscenes-version {version}: no INPUT is a nuScenes dataroot ({found}); leave it out"
        )


def check_weights(
    spec: repeat.WeightSpec,
    max_factor: float,
    datasets: Sequence[Dataset],
    from_samples: str | None,
    look: bool,
    version: str | None,
) -> float | None:
    """``--sample-weights`` names a good column of the ``--from-samples`` table, ``--repeat-factors`` has
    labels to read (files read only with ``look``). Returns the mean sample weight (None: none or unread)."""
    column = spec.column
    if column is not None and not from_samples:
        raise UsageError(
            f"--sample-weights {column} reads a column of a --from-samples table: add --from-samples PREV/samples"
        )
    if not look:
        return None
    files = samples_files(from_samples) if from_samples else []
    mean = None
    if column is not None:
        with open_parts(files) as file:
            schema = file.schema_arrow
        table = read_parts(files, columns=[column]) if column in schema.names else schema.empty_table()
        try:  # only the column: a missing one gets named with the ones there are
            w = repeat.check_weights(table, column, max_factor)
        except ValueError as e:
            raise UsageError(f"--sample-weights {e}") from None
        mean = float(w.mean()) if w.size else 0.0
    if spec.threshold is None:
        return mean
    if from_samples:
        labelled = read_parts(files, columns=["label_path"]).column("label_path")
        if labelled.null_count == len(labelled):
            raise UsageError(
                f"--repeat-factors: no sample of {from_samples} has lidarseg labels (label_path)"
            )
        return mean
    labelled_inputs = [d for d in datasets if _has_labels(d, version)]
    if len(labelled_inputs) > 1:
        named = ", ".join(d.name for d in labelled_inputs)
        raise UsageError(
            f"--repeat-factors: INPUTs {named} all have labels, whose class ids mean different classes; "
            "repeat factors over them would mix the classes: give one labelled INPUT, or --dataset-weights"
        )
    if not labelled_inputs:
        d = datasets[0]
        where = f"{d.root}/{version}" if d.layout == "nuscenes" else d.root
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
        return bool(LAYOUT_IO.glob(storage.join(d.root, "**", "labels", "*.label")))
    return False

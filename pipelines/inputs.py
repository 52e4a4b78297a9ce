"""The INPUTs of a run, resolved once before Beam starts: each one's name, layout and weight.

``INPUT`` is ``[NAME=]PATH``: a directory or glob of point-cloud files, or the root of a dataset
layout (nuScenes/Lyft tables, Argoverse 2 sensor logs, SemanticKITTI sequences, Waymo Open v2
components), recognised from what is there (``transforms.layouts.detect``) unless ``--dataset``
names it. Several INPUTs make one plan: each sample_id is prefixed with its dataset's NAME (default:
the INPUT's last path component), ``--dataset-weights NAME=W,...`` scales a dataset's expected copies
per epoch, and paths are stored relative to the INPUTs' common parent. Problems raise
:class:`~lidarshard.transforms.declare.UsageError` with one line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from lidarshard.pipelines import checks, understood
from lidarshard.transforms import layouts
from lidarshard.transforms.io import storage
from lidarshard.transforms.layouts import FILES, Dataset
from lidarshard.transforms.value_checks import UsageError

__all__ = [
    "resolve_datasets",
    "split_input",
    "common_root",
    "label_maps",
    "dataset_json",
    "LAYOUT_IO",
]

#: Layout access before Beam: the one over ``storage`` the pipeline uses too.
LAYOUT_IO = layouts.STORAGE_IO
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_TITLES = understood.TITLES | {"nuscenes": "a nuScenes dataroot"}


def split_input(spec: str) -> tuple[str | None, str]:
    """``NAME=PATH`` -> (NAME, PATH); a PATH alone (or one whose ``NAME=`` part is not a plain name,
    or an existing local path) -> (None, PATH)."""
    name, eq, path = spec.partition("=")
    if eq and _NAME.fullmatch(name) and path and not os.path.exists(spec):
        return name, path
    return None, spec


def _layouts_flag(given: str | tuple[tuple[str, str], ...] | None, names: Sequence[str]) -> dict[str, str]:
    """``--dataset`` (one layout for every INPUT, or (NAME, LAYOUT) pairs) -> {dataset name: layout}."""
    if given is None:
        return {}
    pairs = dict(given) if isinstance(given, tuple) else dict.fromkeys(names, given)
    for name in pairs:
        if name not in names:
            shown = ",".join(f"{k}={v}" for k, v in pairs.items())
            raise UsageError(f"--dataset {shown}: no INPUT is named {name!r} (INPUTs: {', '.join(names)})")
    return pairs


def _check_weights(weights: Mapping[str, float], names: Sequence[str]) -> None:
    """Each NAME of ``--dataset-weights`` (parsed and range-checked with the plan flags) is an INPUT's."""
    for name in weights:
        if name not in names:
            given = ",".join(f"{k}={v:g}" for k, v in weights.items())
            raise UsageError(
                f"--dataset-weights {given}: no INPUT is named {name!r} (INPUTs: {', '.join(names)})"
            )


def _layout(path: str, forced: str | None, version: str | None, look: bool) -> str:
    """The layout of INPUT ``path``: ``forced`` (checked against what is there), else detected; with
    ``version`` (``--nuscenes-version`` of a one-INPUT run) nuScenes. Without ``look`` (an offline dry
    run) nothing is read."""
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
    specs: Sequence[str],
    dataset: str | tuple[tuple[str, str], ...] | None,
    weights: Mapping[str, float],
    version: str | None,
    look: bool,
) -> tuple[Dataset, ...]:
    """The checked INPUTs of a run (``specs``: ``[NAME=]PATH`` each, paths already absolute or URIs;
    ``dataset``, ``weights``: the checked ``--dataset`` and ``--dataset-weights``).

    Raises:
        UsageError: a missing INPUT, two with one name, a layout flag that does not fit, bad weights.
    """
    split = [split_input(s) for s in specs]
    names = [name or layouts.dataset_name(path) for name, path in split]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(
            f"two INPUTs are named {dup[0]!r}: name them, e.g. nusc=/data/nuscenes kitti=/data/kitti"
        )
    forced = _layouts_flag(dataset, names)
    _check_weights(weights, names)
    _check_apart([path for _, path in split], look)
    out = []
    for name, (_, path) in zip(names, split, strict=True):
        if look:
            checks.check_input(path)
        # one INPUT: --nuscenes-version says it is a dataroot; several: it serves the nuScenes ones
        layout = _layout(path, forced.get(name), version if len(specs) == 1 else None, look)
        if layout == "nuscenes" and look:
            checks.check_nuscenes(path, version)
        out.append(Dataset(name, path, layout, weights.get(name, 1.0)))
    return tuple(out)


def _check_apart(paths: Sequence[str], look: bool) -> None:
    """No INPUT holds another or shares a file with it (its files would be scanned twice, under two
    names): directories by their paths, patterns (``look``: they are listed) by the files they match."""
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
    """{dataset name: {raw label id: class id}} for the datasets whose layout maps labels (read before
    Beam, so a bad map is one line now, not a failed run)."""
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
    """The deepest directory holding every one of ``roots`` (local paths, or URIs of one scheme and
    bucket), or None when they share none (then full paths are stored)."""
    if not roots:
        return None
    if all(storage.is_local(r) for r in roots):
        try:
            found = os.path.commonpath([r.rstrip("/") or "/" for r in roots])
        except ValueError:
            return None
        return found if found != "/" else "/"
    schemes = {r.split("://", 1)[0] for r in roots if "://" in r}
    if len(schemes) != 1 or not all("://" in r for r in roots):
        return None
    parts = [r.rstrip("/").split("/") for r in roots]
    common = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    # scheme://bucket is parts [scheme:, "", bucket]: a common root needs at least the bucket
    return "/".join(common) if len(common) >= 3 and common[2] else None


def dataset_json(datasets: Sequence[Dataset], maps: Mapping[str, Mapping[int, int]]) -> list[dict]:
    """The manifest's ``datasets``: each INPUT with its label map (JSON keys are strings)."""
    return [
        d.to_json()
        | {"label_map": {str(k): v for k, v in sorted(maps[d.name].items())} if d.name in maps else None}
        for d in datasets
    ]

"""``lidarshard validate``'s checks of per-sample weights (repeat factors, ``--sample-weights``). No Beam.

The samples' ``weight`` must be finite and >= 0, and 1 everywhere unless the manifest records a
``repeat`` object. Under ``lidarseg:t=T`` the weights are re-derived from the label files (resolved
against ``path_root``); ``repeat.expected`` is recomputed from the weights and bucket weights, and
``repeat.realized[e]`` from epoch ``e``'s plan rows. How many copies a weight allows is checked with
the other counts (``validate_plan.Coverage``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from lidarshard.schemas import ADDED_IN, is_before
from lidarshard.schemas.jsonsafe import short
from lidarshard.schemas.manifest import Manifest
from lidarshard.schemas.records import label_maps
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.features.buckets import resolve_weights
from lidarshard.transforms.features.repeat import (
    dataset_scale,
    decoded_labels,
    label_presence,
    lvis_factors,
    parse_repeat_factors,
    repeat_counts,
)
from lidarshard.transforms.io import paths, storage

__all__ = ["check_sample_weights", "check_realized"]

_WHERE = "_manifest.json"


def _same(got: object, want: dict[str, float]) -> bool:
    return (
        isinstance(got, dict)
        and set(got) == set(want)
        and all(
            isinstance(got[k], (int, float)) and abs(got[k] - v) <= 1e-6 * max(1.0, abs(v))
            for k, v in want.items()
        )
    )


def _datasets(samples: Any, m: Manifest) -> list:
    """Each sample's ``dataset`` (None each before schema 4.1)."""
    if is_before(m.schema_version, ADDED_IN["dataset"]):
        return [None] * samples.num_rows
    return samples.select(["dataset"]).column("dataset").to_pylist()


def _label_presence(
    problems: list[str], samples: Any, m: Manifest
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]] | None:
    found = paths.resolved(samples.select(["label_path"]).column("label_path").to_pylist(), m.path_root)
    try:
        maps = label_maps(m.datasets)
        return label_presence(decoded_labels(found, _datasets(samples, m), maps, storage.read_bytes))
    except ValueError as e:
        problems.append(f"{_WHERE}: datasets: {e}; the weights were not re-derived")
        return None
    except RejectError as e:
        problems.append(f"labels: {e.detail}; the weights were not re-derived")
        return None
    except OSError as e:
        problems.append(f"{e.filename or 'label_path'}: lidarseg labels unreadable ({e.strerror or e}); "
                        "the weights were not re-derived")  # fmt: skip
        return None


def check_sample_weights(
    problems: list[str], m: Manifest, samples: Any
) -> tuple[NDArray[np.bool_] | None] | None:
    """The ``weight`` column against ``m.repeat``; returns (lidarseg presence (N, C), or None when the
    counts are under ``'all'``) for :func:`check_realized`, or None when there is nothing (more) to check.
    ``samples``: validate's view (``validate_samples.Samples``). Without repeat factors the weights are
    read a chunk at a time; with them, re-deriving them holds the weights and bucket ids whole (12 bytes a
    sample; lidarseg's presence C more)."""
    rep, not_one, weight = m.repeat, -1, 1.0
    for start, t in samples.chunks(["weight"]):
        w = t.column("weight").to_numpy()
        if not (np.isfinite(w).all() and (w >= 0).all()):
            problems.append("samples: weight holds values that are not finite and >= 0")
            return None
        if not_one < 0 and (w != 1).any():
            not_one = start + int(np.flatnonzero(w != 1)[0])
            weight = w[not_one - start]
    if rep is None:
        if not_one >= 0:
            problems.append(f"samples: {samples.column('sample_id')[not_one]} has weight {weight:g} but the "
                            "manifest records no repeat factors or sample weights")  # fmt: skip
        return None
    whole = samples.table(["weight", "bucket_id"])
    w = whole.column("weight").to_numpy()
    mode, scale = rep.mode, rep.datasets or {}
    by_dataset = dataset_scale(_datasets(samples, m), scale)
    if mode is None and scale:  # only --dataset-weights
        if not np.allclose(w, by_dataset, rtol=1e-12, atol=0):
            i = int(np.flatnonzero(~np.isclose(w, by_dataset, rtol=1e-12, atol=0))[0])
            problems.append(f"samples: {samples.column('sample_id')[i]} has weight {w[i]:g} but its dataset's "
                            f"--dataset-weights give {by_dataset[i]:g}")  # fmt: skip
        mode = "column:"  # the counts below are per 'all', as for a column's weights
    if mode is None or not mode.startswith(("lidarseg:", "column:")):
        problems.append(f"{_WHERE}: repeat.mode {short(mode)} is not lidarseg:t=T or column:NAME")
        return None
    presence = None
    if mode.startswith("lidarseg:"):
        try:
            t = parse_repeat_factors(mode)
        except ValueError as e:
            problems.append(f"{_WHERE}: repeat.mode {short(mode)}: {e}")
            return None
        found = _label_presence(problems, samples, m)
        if found is None:
            return None
        presence = found[0]
        again = lvis_factors(found[0], found[1], t) * by_dataset
        bad = np.flatnonzero(np.abs(again - w) > 1e-9 * np.maximum(1.0, again))
        if bad.size:
            i = int(bad[0])
            problems.append(f"samples: {samples.column('sample_id')[i]} has weight {w[i]:.6g}, its "
                            f"labels give repeat factor {again[i]:.6g} ({bad.size} samples differ)")  # fmt: skip
    ids = whole.column("bucket_id").to_numpy()
    try:
        bucket = resolve_weights(m.buckets.weights, m.buckets.k)[ids]
    except (ValueError, IndexError):  # reported by the bucket checks
        return None
    want = repeat_counts(presence, w * bucket)
    if not _same(rep.expected, want):
        problems.append(
            f"{_WHERE}: repeat.expected recorded {short(dict(rep.expected))}, recomputed {short(want)}"
        )
    return (presence,)


def check_realized(problems: list[str], m: Manifest, e: int, want: dict[str, float]) -> None:
    """``repeat.realized[e]`` equals ``want``, the copies per class epoch ``e``'s plan holds
    (``repeat_counts`` over the copies of each sample, summed group by group: ``validate_plan.Coverage``)."""
    realized = m.repeat.realized if m.repeat is not None else ()
    got = realized[e] if e < len(realized) else None
    if not _same(got, want):
        problems.append(f"epoch {e}: repeat.realized recorded {short(got)}, the plan holds {short(want)}")

"""Per-sample sampling weights: LVIS-style repeat factors from lidarseg labels, or a user column.

Repeat-factor sampling (Gupta et al., LVIS 2019) oversamples scenes that contain rare classes::

    f_c = (samples containing class c) / (samples with labels)
    r_c = max(1, sqrt(t / f_c))
    r_i = max over the classes c present in sample i of r_c       (1 for a sample without labels)

A weight ``w`` is realized per epoch by deterministic stochastic rounding: the sample appears
``floor(w) + Bernoulli(w - floor(w))`` times, drawn from the epoch's seeded generator
(``lidarshard.transforms.features.buckets.weighted_pool``), so the expected count is exactly ``w``.
Pure numpy/pyarrow.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.transforms.declare import option
from lidarshard.transforms.formats.labels import decode_labels, label_format
from lidarshard.transforms.value_checks import float_in, parsed_by, per_name

__all__ = [
    "WeightSpec",
    "Weights",
    "parse_repeat_factors",
    "repeat_threshold",
    "label_presence",
    "decoded_labels",
    "dataset_scale",
    "lvis_factors",
    "column_weights",
    "check_weights",
    "class_counts",
    "repeat_counts",
]

#: Label values are uint8 (nuScenes lidarseg): at most 256 classes.
NUM_LABEL_VALUES = 256


@dataclass(frozen=True)
class WeightSpec:
    """Where per-sample weights come from: ``lidarseg`` repeat factors with threshold ``t``, or a
    ``column`` of the --from-samples table; ``None`` everywhere means weight 1."""

    threshold: float | None = option(
        "LVIS-style repeat factors from the lidarseg labels: a sample's weight is the max over its classes c of "
        "max(1, sqrt(T / f_c)), f_c the share of labelled samples holding c", None, flag="--repeat-factors",
        check=parsed_by(lambda spec: parse_repeat_factors(spec), lambda t: repeat_threshold(t)),
        metavar="lidarseg:t=T", exclusive="repeat")  # fmt: skip
    column: str | None = option(
        "per-sample weights (CBGS, your own) from this numeric column of the --from-samples table; fractional "
        "weights are realized per epoch by seeded stochastic rounding", None, flag="--sample-weights",
        metavar="COLUMN", exclusive="repeat")  # fmt: skip
    #: (dataset name, weight) pairs multiplying its samples' weights.
    datasets: tuple[tuple[str, float], ...] = option(
        "NAME=W,...: expected copies per epoch of each sample of INPUT NAME (x its repeat factor)", (),
        flag="--dataset-weights", check=per_name(float_in(0.0, above=True), pairs=True), shown="1 each",
        metavar="NAME=W")  # fmt: skip

    def __post_init__(self) -> None:
        if self.threshold is not None and self.column is not None:
            raise ValueError("use --repeat-factors or --sample-weights, not both")

    @property
    def mode(self) -> str | None:
        """The manifest's ``repeat.mode``: ``lidarseg:t=T``, ``column:NAME`` or None."""
        if self.threshold is not None:
            return f"lidarseg:t={self.threshold:g}"
        return f"column:{self.column}" if self.column is not None else None


def parse_repeat_factors(spec: str) -> float:
    """The threshold ``t`` of ``--repeat-factors lidarseg:t=T`` (0 < t <= 1)."""
    m = re.fullmatch(r"lidarseg:t=([0-9.eE+-]+)", spec.strip())
    try:
        t = float(m.group(1)) if m else float("nan")
    except ValueError:
        t = float("nan")
    return repeat_threshold(t, spec)


def repeat_threshold(t: object, spec: str | None = None) -> float:
    """``t`` as a repeat-factor threshold (0 < t <= 1); ``spec``: the text it was read from, for errors."""
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 < float(t) <= 1:
        raise ValueError(f"expected lidarseg:t=T with 0 < T <= 1, got {t if spec is None else spec!r}")
    return float(t)


def label_presence(
    labels: Iterable[bytes | NDArray[np.uint8] | None],
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """(N, 256) classes present per sample from its class ids (uint8 per point: raw lidarseg label
    bytes, or ids decoded by ``formats.labels.decode_labels``), and (N,) which samples have labels
    (None: no label file). Consumes ``labels`` one at a time."""
    rows, has = [], []
    for data in labels:
        has.append(data is not None)
        values = np.frombuffer(data or b"", np.uint8) if not isinstance(data, np.ndarray) else data
        rows.append(np.bincount(values, minlength=NUM_LABEL_VALUES) > 0)
    presence = np.array(rows, dtype=bool).reshape(len(rows), NUM_LABEL_VALUES)
    return presence, np.array(has, dtype=bool)


def decoded_labels(
    label_paths: Iterable[str | None],
    datasets: Iterable[str | None],
    label_maps: Mapping[str, Mapping[int, int]],
    read: Callable[[str], bytes],
) -> Iterator[NDArray[np.uint8] | None]:
    """Each sample's class ids (``formats.labels.decode_labels`` of its label file, through its
    dataset's label map), one file at a time; None for a sample without labels. The one way scoring
    and ``validate`` read labels for repeat factors."""
    for path, dataset in zip(label_paths, datasets, strict=True):
        if path is None:
            yield None
        else:
            yield decode_labels(read(path), label_format(path), label_maps.get(dataset) if dataset else None)


def dataset_scale(datasets: Iterable[str | None], scale: Mapping[str, float]) -> NDArray[np.float64]:
    """(N,) the ``--dataset-weights`` of each sample's dataset (1 for a dataset not named, or none)."""
    return np.array([scale.get(d, 1.0) if d is not None else 1.0 for d in datasets], dtype=np.float64)


def lvis_factors(presence: NDArray[np.bool_], has_labels: NDArray[np.bool_], t: float) -> NDArray[np.float64]:
    """(N,) repeat factors ``r_i`` (module docstring); 1.0 for samples without labels.

    Args:
        presence: (N, C) class c present in sample i; has_labels: (N,) which rows count for f_c.
    """
    labelled = int(has_labels.sum())
    if labelled == 0:
        return np.ones(presence.shape[0])
    f = presence[has_labels].sum(axis=0) / labelled  # (C,)
    r_c = np.where(f > 0, np.maximum(1.0, np.sqrt(t / np.where(f > 0, f, 1.0))), 1.0)
    r = np.where(presence, r_c[None, :], 1.0).max(axis=1, initial=1.0)
    return np.where(has_labels, r, 1.0)


def column_weights(table: pa.Table, column: str) -> NDArray[np.float64]:
    """(N,) weights from a numeric column: finite, >= 0, no nulls (else a one-line ValueError)."""
    if column not in table.column_names:
        raise ValueError(f"{column}: no such column (columns: {', '.join(table.column_names)})")
    col = table.column(column)
    if col.null_count or not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        raise ValueError(f"{column}: needs a numeric column without nulls, got {col.type}")
    w = col.to_numpy().astype(np.float64)
    if not (np.isfinite(w).all() and (w >= 0).all()):
        raise ValueError(f"{column}: weights must be finite and >= 0")
    return w


def check_weights(table: pa.Table, column: str, max_plan_factor: float) -> NDArray[np.float64]:
    """``column_weights`` that also plan something (sum > 0) and at most ``max_plan_factor`` copies per
    sample on average; the one-line ValueError starts with the column name."""
    w = column_weights(table, column)
    if w.size and w.sum() == 0:
        raise ValueError(f"{column}: every weight is 0, nothing would be planned")
    if w.size and w.mean() > max_plan_factor:
        raise ValueError(
            f"{column}: the mean weight {w.mean():.6g} exceeds --max-plan-factor {max_plan_factor:g}; "
            "lower the weights or raise it"
        )
    return w


def class_counts(presence: NDArray[np.bool_], copies: NDArray[np.number]) -> dict[str, float]:
    """{class: sum of ``copies`` over the samples containing it} for every class present anywhere."""
    totals = (presence * np.asarray(copies, dtype=np.float64)[:, None]).sum(axis=0)
    return {str(c): round(float(totals[c]), 6) for c in np.flatnonzero(presence.any(axis=0))}


@dataclass(frozen=True)
class Weights:
    """Per-sample weights of N settled samples: ``values`` (N,), and ``presence`` (N, 256) classes
    per sample for lidarseg repeat factors (None for a column's weights: counted under 'all')."""

    values: NDArray[np.float64]
    presence: NDArray[np.bool_] | None = None


def repeat_counts(presence: NDArray[np.bool_] | None, copies: NDArray[np.number]) -> dict[str, float]:
    """The manifest's ``repeat.expected`` / ``realized[e]`` counts of (N,) ``copies`` per sample, the
    one count the planner records and ``validate`` recomputes: ``class_counts`` over lidarseg
    ``presence`` (N, C), or ``{"all": total}`` without it (a column's or the datasets' weights)."""
    if presence is not None:
        return class_counts(presence, copies)
    return {"all": class_counts(np.ones((len(copies), 1), dtype=bool), copies).get("0", 0.0)}

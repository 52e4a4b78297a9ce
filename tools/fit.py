"""Fit the linear cost model ``ms = launch + c0 * count + a * points + b * voxels`` to measured timings. Pure.

A timing is one measured duration (ms) over a *group* of samples: one sample (a timings CSV with
``sample_id``), one rank's batch at one step (``step, rank``, mapped to samples through the
plan) or one row of the training recorder's files (``lidarshard.loaders.step_timer``: a rank-step's
``compute_s`` and its ``sample_ids``, no plan needed). A group contributes the row ``[count, sum points, sum voxels]`` of the design matrix, so
``c0`` is always per sample and the fitted model plugs straight into ``lidarshard.transforms.features.cost``.
A design of rank-steps may add a fourth column, the rank-steps a row holds (1 each): where the rows' sample
counts differ, ``launch`` (ms a rank pays once per rank-step whatever its samples: kernel launches) is fitted
beside ``c0``; where every row holds as many samples the two cannot be told apart and the constant stays
per sample (``c0``), as before.

``points`` and ``voxels`` are the features ``lidarshard.transforms.features.cost.sample_costs`` uses: ``num_in_range``
(``num_points`` when range features are missing) and ``occupied_voxels``.

The fit is non-negative least squares (a negative overhead or per-point cost is not physical and a
negative cost would be refused by the planners): every subset of the three terms that keeps
``a`` or ``b`` is fitted with ``numpy.linalg.lstsq``, subsets with a negative coefficient are
discarded, and the subset with the smallest squared error wins. For three terms this search is
exact NNLS; in effect a term whose unconstrained coefficient comes out negative is dropped and the
rest refitted (``dropped`` names it).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from numpy.typing import NDArray

from lidarshard.transforms.features.cost import points_column
from lidarshard.transforms.plan import seeds

__all__ = [
    "TERMS",
    "LinearFit",
    "fit_linear",
    "r_squared",
    "read_timings",
    "sample_features",
    "observations",
    "step_observations",
    "held_out_fit",
    "cross_validated_r2",
]

#: Coefficient names, in design-matrix column order: per-sample overhead, per point, per voxel, per rank-step.
TERMS = ("c0", "a", "b", "launch")


@dataclass(frozen=True)
class LinearFit:
    """A fitted ``c0 + a * points + b * voxels ** q`` (units of the timings, e.g. ms; the design matrix
    holds the voxels already raised to ``q``)."""

    c0: float
    a: float
    b: float
    r2: float
    rmse: float
    n: int
    dropped: tuple[str, ...] = ()
    q: float = 1.0
    launch: float = 0.0

    def predict(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """(n,) predictions for an (n, 3) design matrix ``[count, points, voxels]`` (NaN voxels = 0): the
        samples' work; an (n, 4) one ``[..., rank-steps]`` adds ``launch`` per rank-step."""
        x = np.nan_to_num(np.asarray(x, dtype=np.float64))
        work = x[:, :3] @ np.array([self.c0, self.a, self.b])
        return work + self.launch * x[:, 3] if x.shape[1] == 4 else work

    def to_json(self, units: str = "ms") -> dict:
        """The calibration file body; ``build --cost-model @file.json`` reads its ``cost_model``."""
        return {
            "cost_model": {"name": "linear", "c0": self.c0, "a": self.a, "b": self.b}
            | ({"q": self.q} if self.q != 1.0 else {})
            | ({"launch_ms": self.launch} if self.launch > 0 else {}),
            "r2": self.r2,
            "rmse": self.rmse,
            "n": self.n,
            "units": units,
            "dropped_terms": list(self.dropped),
        }


def r_squared(y: NDArray[np.float64], yhat: NDArray[np.float64]) -> float:
    """Coefficient of determination ``1 - SS_res / SS_tot`` (1.0 for a perfect fit of constant y)."""
    y, yhat = np.asarray(y, dtype=np.float64), np.asarray(yhat, dtype=np.float64)
    ss_res = float(((y - yhat) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum()) if y.size else 0.0
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


def fit_linear(x: NDArray[np.float64], ms: NDArray[np.float64]) -> LinearFit:
    """Non-negative least-squares fit of ``ms ~ c0 * count + a * points + b * voxels``.

    Args:
        x: (n, 3) design matrix ``[count, points, voxels]``, or (n, 4) with the rank-steps of each row
            (``launch`` is fitted where the counts differ between rows); an all-NaN voxels column means
            the feature is unavailable (the ``b`` term is then left out).
        ms: (n,) measured durations, finite.

    Returns:
        the best fit with ``c0, a, b, launch >= 0`` and ``a + b > 0``.

    Raises:
        ValueError: too few or non-finite observations, or no non-negative fit that grows with size
            explains the timings better than their mean (R^2 <= 0).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(ms, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] not in (3, 4) or y.shape != (x.shape[0],):
        raise ValueError(f"need x (n, 3) or (n, 4) and ms (n,), got {x.shape} and {y.shape}")
    terms = [0, 1, 2] if np.isfinite(x[:, 2]).all() else [0, 1]
    if x.shape[1] == 4 and np.isfinite(x[:, [0, 3]]).all() and np.ptp(x[:, 0]) > 0:
        terms.append(3)  # counts differ: a per-rank-step constant is told apart from the per-sample one
    if not (np.isfinite(x[:, terms]).all() and np.isfinite(y).all()):
        raise ValueError("timings and features must be finite")
    if y.size < len(terms):
        raise ValueError(f"need at least {len(terms)} timings to fit {len(terms)} terms, got {y.size}")
    scale = np.abs(x[:, terms]).max(axis=0)
    scale[scale == 0] = 1.0
    xs = x[:, terms] / scale  # columns of similar magnitude: points ~1e5 vs count ~1
    best: tuple[float, NDArray[np.float64]] | None = None
    for size in range(1, len(terms) + 1):
        for subset in combinations(range(len(terms)), size):
            cols = list(subset)
            sized = [terms[c] in (1, 2) for c in cols]
            if not any(sized):
                continue  # a model without points or voxels does not rank samples by size
            coef, *_ = np.linalg.lstsq(xs[:, cols], y, rcond=None)
            if (coef < 0).any() or not (coef[sized] > 0).any():
                continue
            full = np.zeros(len(terms))
            full[cols] = coef
            sse = float(((y - xs @ full) ** 2).sum())
            if best is None or sse < best[0] * (1 - 1e-12):
                best = (sse, full)
    if best is None:
        raise ValueError(
            "no non-negative fit: the measured times do not grow with points or voxels "
            "(check that the timings belong to this manifest)"
        )
    coef = np.zeros(4)
    coef[terms] = best[1] / scale
    fit = LinearFit(
        float(coef[0]), float(coef[1]), float(coef[2]), 0.0, 0.0, int(y.size), launch=float(coef[3])
    )
    yhat = fit.predict(x)
    r2 = r_squared(y, yhat)
    if r2 <= 0 and np.ptp(y) > 0:
        raise ValueError(
            f"no useful non-negative fit (R^2 = {r2:.3f}): the measured times do not grow with points "
            "or voxels (check that the timings belong to this manifest)"
        )
    dropped = tuple(TERMS[t] for t in terms if coef[t] == 0)
    rmse = float(np.sqrt(((y - yhat) ** 2).mean()))
    return LinearFit(fit.c0, fit.a, fit.b, r2, rmse, int(y.size), dropped, launch=fit.launch)


#: The longest step or sample a timing may say (ms; 1e9 ms is 11.6 days): beyond, a fit would overflow.
MAX_STEP_MS = 1e9
#: Columns a timings CSV may have (a header of a million columns is a corrupt file, not timings).
MAX_CSV_COLUMNS = 1000


def read_timings(data: bytes) -> pa.Table:
    """Parse a timings CSV: ``ms`` plus ``sample_id`` and/or ``step, rank`` (optional ``epoch``).

    Other columns (``num_points`` ...) are ignored. Raises ValueError for a CSV without the keys.
    """
    header = data.split(b"\n", 1)[0]
    if header.count(b",") >= MAX_CSV_COLUMNS:
        raise ValueError(
            f"timings CSV: its header has {header.count(b',') + 1} columns, more than {MAX_CSV_COLUMNS}; "
            "expected ms plus sample_id, or ms plus step, rank [, epoch]"
        )
    types = {"sample_id": pa.string(), "ms": pa.float64()}
    types |= {k: pa.int64() for k in ("epoch", "step", "rank")}
    table = pacsv.read_csv(io.BytesIO(data), convert_options=pacsv.ConvertOptions(column_types=types))
    names = set(table.column_names)
    if "ms" not in names or not ("sample_id" in names or {"step", "rank"} <= names):
        raise ValueError(
            f"timings CSV needs a 'ms' column and 'sample_id' or 'step' and 'rank'; got {sorted(names)}"
        )
    table = table.select([n for n in ("epoch", "step", "rank", "sample_id", "ms") if n in names])
    ms = table.column("ms").to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(~((ms >= 0) & (ms <= MAX_STEP_MS)))  # NaN (a null) fails both
    if bad.size:
        raise ValueError(
            f"timings CSV: every 'ms' must be a finite number in 0..{MAX_STEP_MS:g}; data row {bad[0] + 1} "
            f"holds {table.column('ms')[int(bad[0])].as_py()!r}"
        )
    return table


def sample_features(samples: pa.Table, q: float = 1.0) -> pa.Table:
    """``sample_id, points, voxels, cost`` (float64) of a scored samples table, as the cost model sees
    them: points = ``cost.points_column``, voxels ``** q``, null when unavailable."""
    points = samples.column(points_column(samples))
    voxels = samples.column("occupied_voxels")
    if voxels.null_count:
        voxels = pa.nulls(samples.num_rows, pa.float64())
    cost = samples.column("cost") if "cost" in samples.column_names else pa.nulls(samples.num_rows)
    return pa.table(
        {
            "sample_id": samples.column("sample_id"),
            "points": pc.cast(points, pa.float64()),
            "voxels": pc.power(pc.cast(voxels, pa.float64()), q)
            if q != 1.0
            else pc.cast(voxels, pa.float64()),
            "cost": pc.cast(cost, pa.float64()),
        }
    )


def observations(
    timings: pa.Table, samples: pa.Table, plan: pa.Table | None, epoch: int = 0, q: float = 1.0
) -> pa.Table:
    """Join timings to sample features: one row per timing that could be mapped.

    Args:
        timings: from ``read_timings``; ``sample_id`` rows map directly, else ``(epoch, step,
            rank)`` rows map to the rank's batch in ``plan`` (``epoch`` defaults to ``epoch``).
        samples: scored samples table (``sample_id``, features, ``cost``).
        plan: the manifest's plan rows (``epoch, step, rank, sample_id``); needed without sample_id.

    Returns:
        table ``count, points, voxels, cost, ms`` (float64; sums over each group; voxels NaN when
        unavailable). Timings whose key is not in the manifest are left out.
    """
    feats = sample_features(samples, q)  # q: the voxel exponent of the sums (``sample_features``)
    if "sample_id" in timings.column_names:
        keys = ["sample_id", "ms"]
        rows = timings.select(keys).join(feats, "sample_id", join_type="inner")
        rows = rows.append_column("count", pa.array(np.ones(rows.num_rows)))
    else:
        if plan is None:
            raise ValueError("step/rank timings need the manifest's plan")
        if "epoch" not in timings.column_names:
            timings = timings.append_column("epoch", pa.array(np.full(timings.num_rows, epoch), pa.int64()))
        keys = ["epoch", "step", "rank"]
        planned = plan.select([*keys, "sample_id"])
        planned = planned.cast(pa.schema([(k, pa.int64()) for k in keys] + [("sample_id", pa.string())]))
        per = planned.join(feats, "sample_id", join_type="inner")
        per = per.append_column("count", pa.array(np.ones(per.num_rows)))
        sums = per.group_by(keys).aggregate([(c, "sum") for c in ("count", "points", "voxels", "cost")])
        sums = sums.rename_columns([n.removesuffix("_sum") for n in sums.column_names])
        rows = timings.select([*keys, "ms"]).join(sums, keys, join_type="inner")
        keys = [*keys, "ms"]
    rows = rows.sort_by([(k, "ascending") for k in keys])  # joins do not keep row order
    cols = ("count", "points", "voxels", "cost", "ms")
    return pa.table({c: pc.fill_null(pc.cast(rows.column(c), pa.float64()), np.nan) for c in cols})


def step_observations(steps: pa.Table, samples: pa.Table, q: float = 1.0) -> pa.Table:
    """Sum each recorded rank-step's sample features: one row per step whose samples are all known.

    Args:
        steps: the recorder's rows (``lidarshard.loaders.step_timer.TIMING_FIELDS``: ``epoch, step, rank,
            world_size, sample_ids, compute_s``).
        samples: scored samples table (``sample_id``, features, ``cost``).

    Returns:
        table ``epoch, step, rank, world_size`` (int64) and ``count, points, voxels, cost, ms``
        (float64 sums over the step's samples; ``ms = 1000 * compute_s``; voxels NaN when unavailable),
        sorted by (epoch, step, rank). A step with no ids or an id outside the manifest is left out.
    """
    keys = ["epoch", "step", "rank", "world_size"]
    steps = steps.select([*keys, "sample_ids", "compute_s"])
    ids = steps.column("sample_ids").combine_chunks()
    per = pa.table(
        {
            "row": pc.list_parent_indices(ids),
            "sample_id": pc.cast(pc.list_flatten(ids), pa.string()),
        }
    ).join(sample_features(samples, q), "sample_id", join_type="inner")
    per = per.append_column("count", pa.array(np.ones(per.num_rows)))
    sums = per.group_by("row").aggregate([(c, "sum") for c in ("count", "points", "voxels", "cost")])
    sums = sums.rename_columns([n.removesuffix("_sum") for n in sums.column_names])
    row = sums.column("row").to_numpy()
    whole = sums.column("count").to_numpy() == pc.list_value_length(ids).to_numpy()[row]
    sums = sums.filter(pa.array(whole))
    picked = steps.take(sums.column("row"))
    out = {k: pc.cast(picked.column(k), pa.int64()) for k in keys}
    for c in ("count", "points", "voxels", "cost"):
        out[c] = pc.fill_null(pc.cast(sums.column(c), pa.float64()), np.nan)
    out["ms"] = pc.multiply(pc.cast(picked.column("compute_s"), pa.float64()), 1000.0)
    return pa.table(out).sort_by([(k, "ascending") for k in keys[:3]])


#: One held-out observation in this many (by a stable hash of its key).
HOLD_OUT_EVERY = 5


def held_out_fit(x: NDArray[np.float64], ms: NDArray[np.float64], keys: Sequence[str]) -> dict:
    """Fit on ~80% of the observations and score the fit on the other ~20%.

    The split is deterministic and does not depend on which other rows exist: an observation is held
    out when ``crc32(key) % 5 == 0`` (``seeds.folds``) (key: e.g. ``"epoch:step"``, so all ranks of a step go together).

    Returns:
        ``{"split", "train", "test", "r2", "rmse", "c0", "a", "b"}`` (test R^2 / RMSE of the training
        fit; ``r2``/``rmse`` None with a ``"note"`` when a side is too small or the fit fails).
    """
    test = seeds.folds(keys, HOLD_OUT_EVERY) == 0
    out: dict = {"split": f"crc32(key) % {HOLD_OUT_EVERY} == 0 held out", "train": int((~test).sum())}
    out["test"] = int(test.sum())
    try:
        if out["test"] < 2:
            raise ValueError(f"only {out['test']} held-out observations")
        fit = fit_linear(x[~test], ms[~test])
    except ValueError as e:
        return out | {"r2": None, "rmse": None, "note": str(e)}
    yhat = fit.predict(x[test])
    rmse = float(np.sqrt(((ms[test] - yhat) ** 2).mean()))
    launch = {"launch_ms": fit.launch} if fit.launch > 0 else {}
    return (
        out | {"r2": r_squared(ms[test], yhat), "rmse": rmse, "c0": fit.c0, "a": fit.a, "b": fit.b} | launch
    )


def cross_validated_r2(x: NDArray[np.float64], ms: NDArray[np.float64], keys: Sequence[str]) -> float:
    """R^2 of out-of-fold predictions over ``HOLD_OUT_EVERY`` folds (fold ``crc32(key) % HOLD_OUT_EVERY``,
    so all ranks of a step stay together): how well a design ``x`` (n, 3) predicts timings it was not
    fitted on; -inf when a fold cannot be fitted. Picks a model's shape without rewarding fitted noise."""
    fold = seeds.folds(keys, HOLD_OUT_EVERY)
    yhat = np.empty_like(ms)
    for f in np.unique(fold):
        out = fold == f
        try:
            yhat[out] = fit_linear(x[~out], ms[~out]).predict(x[out])
        except ValueError:
            return float("-inf")
    return r_squared(ms, yhat)

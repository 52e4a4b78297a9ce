"""Timings of a training run joined to a manifest's samples: the one reading ``lidarshard calibrate`` and
``lidarshard report --timings`` share. The timings are the recorder's Parquet files
(``lidarshard.loaders.timing.StepTimer``: a directory, or one ``.parquet`` file) or a CSV of ms per
sample or per rank-step (``tools.fit.read_timings``). No Beam.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.loaders.timing import read_timing_files
from lidarshard.tools import fit as cal
from lidarshard.transforms.io import storage
from lidarshard.transforms.plan.epoch_time import time_factors

__all__ = [
    "Timings",
    "Timed",
    "is_recorded",
    "read_timings_at",
    "at_mean_speed",
    "observe",
    "fit_cost",
    "design",
    "Q_GRID",
    "Q_MIN_GAIN",
]


def is_recorded(timings_path: str) -> bool:
    """Whether ``timings_path`` is the recorder's Parquet (a directory, or a ``.parquet`` file), not a CSV."""
    return timings_path.endswith(".parquet") or storage.is_dir(timings_path)


class Timings(NamedTuple):
    """Timings as read, once (``read_timings_at``): the recorder's rows or a CSV's."""

    path: str
    recorded: bool  # the recorder's Parquet (TIMING_FIELDS), else a CSV (cal.read_timings)
    rows: pa.Table


class Timed(NamedTuple):
    """Timings joined to a manifest's samples (``observe``)."""

    obs: pa.Table  # cal.observations columns; + epoch, step, rank, world_size for recorder files
    timed: str  # what one row timed: "sample", "rank-step" or "recorded rank-step"
    raw: pa.Table  # the rows read: the CSV's (cal.read_timings) or the recorder's (TIMING_FIELDS)
    keys: list[str]  # one per observation, for cal.held_out_fit (recorder: "epoch:step")


def read_timings_at(timings_path: str) -> Timings:
    """The timings at ``timings_path``: the recorder's Parquet files or a CSV, read once."""
    if is_recorded(timings_path):
        return Timings(timings_path, True, read_timing_files(timings_path))
    return Timings(timings_path, False, cal.read_timings(storage.read_bytes(timings_path)))


def at_mean_speed(timings: Timings, speeds: Sequence[float] | None) -> Timings:
    """``timings`` with each rank's times (``compute_s``, a CSV's ``ms``) divided by its time factor
    (``epoch_time.time_factors``: 1 / speed scaled to mean 1): the mean rank's times, which one cost model
    fits on a plan of ``--rank-speed`` (its slower ranks get less work, so raw times barely grow with it).
    Unchanged without speeds or a ``rank`` column; a rank outside the speeds keeps its times."""
    if speeds is None or "rank" not in timings.rows.column_names:
        return timings
    factors = time_factors(speeds, len(speeds))
    name = "compute_s" if timings.recorded else "ms"
    rank = timings.rows.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    known = (rank >= 0) & (rank < len(speeds))
    scale = np.where(known, factors[np.where(known, rank, 0)], 1.0)
    column = timings.rows.column(name)
    scaled = pa.array(column.to_numpy(zero_copy_only=False) / scale, column.type)
    rows = timings.rows.set_column(timings.rows.column_names.index(name), name, scaled)
    return Timings(timings.path, timings.recorded, rows)


def observe(
    timings: Timings, samples: pa.Table, plan: Callable[[], pa.Table], epoch: int = 0, q: float = 1.0
) -> Timed:
    """``timings`` joined to ``samples``: the one join calibrate and report share.

    Args:
        plan: gives the manifest's plan rows; called only for a CSV of step/rank rows without sample ids.
        epoch: the epoch of CSV step/rank rows without an epoch column.
        q: the exponent the samples' voxels are raised to before they are summed (a cost model's ``q``).
    """
    if timings.recorded:
        obs = cal.step_observations(timings.rows, samples, q)
        keys = [
            f"{e}:{s}"
            for e, s in zip(obs.column("epoch").to_pylist(), obs.column("step").to_pylist(), strict=True)
        ]
        return Timed(obs, "recorded rank-step", timings.rows, keys)
    per_sample = "sample_id" in timings.rows.column_names
    obs = cal.observations(timings.rows, samples, None if per_sample else plan(), epoch, q)
    return Timed(
        obs, "sample" if per_sample else "rank-step", timings.rows, [str(i) for i in range(obs.num_rows)]
    )


#: Voxel exponents the fit tries (``cost = c0 + a*points + b*voxels^q``); 1 is the linear model.
Q_GRID: tuple[float, ...] = tuple(round(1.0 + 0.05 * k, 2) for k in range(21))
#: Cross-validated R^2 a q other than 1 must add over the linear fit to be kept (noise must not bend the model).
Q_MIN_GAIN = 0.002


def design(obs: pa.Table) -> NDArray[np.float64]:
    """(n, 4) ``[count, points, voxels, rank-steps]`` of observations (``cal.fit_linear``'s design matrix;
    each observation is one rank-step, or one sample timed alone)."""
    cols = [obs.column(c).to_numpy() for c in ("count", "points", "voxels")]
    return np.stack([*cols, np.ones(obs.num_rows)], axis=1)


def fit_cost(
    timings: Timings, samples: pa.Table, plan: Callable[[], pa.Table], epoch: int = 0
) -> tuple[cal.LinearFit, Timed]:
    """The cost model fitted to the timings: ``c0 + a*points + b*voxels^q``, q the exponent of ``Q_GRID``
    whose fit best predicts the timings it was not fitted on (``cal.cross_validated_r2``, 5 folds of whole
    steps; 1 unless another adds ``Q_MIN_GAIN``: a noisy run must not bend the model), with the
    observations it was fitted on. The timings and the plan are read once for all exponents.
    The one fit ``calibrate`` writes and ``report --timings`` applies.

    Raises:
        ValueError: no timing matches the manifest, or no useful fit (one line).
    """
    plan = functools.lru_cache(maxsize=1)(plan)
    linear = observe(timings, samples, plan, epoch)
    if linear.obs.num_rows == 0:
        raise ValueError(f"no row of {timings.path} matches a sample (or step/rank) of this manifest")
    ms = linear.obs.column("ms").to_numpy()
    best = (cal.fit_linear(design(linear.obs), ms), linear)
    if np.isnan(linear.obs.column("voxels").to_numpy(zero_copy_only=False)).all():
        return best  # no voxels: nothing to bend
    score = cal.cross_validated_r2(design(linear.obs), ms, linear.keys)
    floor = score + Q_MIN_GAIN
    for q in Q_GRID[1:]:
        timed = observe(timings, samples, plan, epoch, q)
        try:
            fit = cal.fit_linear(design(timed.obs), timed.obs.column("ms").to_numpy())
        except ValueError:
            continue
        cv = cal.cross_validated_r2(design(timed.obs), timed.obs.column("ms").to_numpy(), timed.keys)
        if fit.b > 0 and cv >= floor and cv > score:
            best, score = (dataclasses.replace(fit, q=q), timed), cv
    return best

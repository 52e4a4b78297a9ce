"""Timings of a training run joined to a manifest's samples: the one reading ``lidarshard calibrate`` and
``lidarshard report --timings`` share. The timings are the recorder's Parquet files
(``lidarshard.loaders.step_timer.StepTimer``: a directory, or one ``.parquet`` file) or a CSV of ms per
sample or per rank-step (``tools.fit.read_timings``). No Beam.

**This plan** (``check_this_plan``, the one rule both commands apply before a number of the timings sizes
anything): timings placed by (epoch, step, rank) must be the manifest's plan's. A recorder row's
``world_size`` is the manifest's, its rank, epoch and step are in the plan (an epoch past those planned is
``epoch % epochs``, as ``cycle=True`` replays it) and its ``sample_ids`` are the plan's batch there, in
order; a CSV row's keys are in the plan (its epochs planned ones), once each, and its ``sample_id`` (when it
has one) is in the plan's batch there. Timings of another plan (another seed, world size, cost model or strategy, a re-plan's
later epochs, shifted steps) are refused in one line naming the first row that is not this plan's. A CSV of
``step, rank, ms`` carries no sample ids: its keys are all that can be checked. Timings keyed by sample alone
(``sample_id, ms``) are not placed in the plan: rows whose sample is not the manifest's are left out, counted.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from lidarshard.loaders.step_timer import read_timing_files
from lidarshard.schemas.manifest import Manifest
from lidarshard.tools import fit as cal
from lidarshard.transforms.io import storage
from lidarshard.transforms.plan.epoch_time import time_factors

__all__ = [
    "check_this_plan",
    "Timings",
    "Timed",
    "is_recorded",
    "missing_timings",
    "read_timings_at",
    "at_mean_speed",
    "observe",
    "fit_cost",
    "design",
    "Q_GRID",
    "Q_MIN_GAIN",
]


def missing_timings(timings_path: str) -> str | None:
    """The one line a ``--timings`` path that is not there gets (a usage error), else None."""
    if storage.exists(timings_path) or storage.is_dir(timings_path):
        return None
    return (
        f"--timings {timings_path}: no such file or directory; give the directory the training recorder wrote "
        "(StepTimer: examples/train_ddp.py --timings DIR) or a CSV of measured ms"
    )


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
    """The timings at ``timings_path``: the recorder's Parquet files or a CSV, read once.

    Raises:
        ValueError: no timings there, or a file that is not one (one line naming it and what to give).
        OSError: it cannot be read.
    """
    try:
        if is_recorded(timings_path):
            return Timings(timings_path, True, read_timing_files(timings_path))
        return Timings(timings_path, False, cal.read_timings(storage.read_bytes(timings_path)))
    except FileNotFoundError:
        raise FileNotFoundError(f"--timings {timings_path}: no such file or directory") from None
    except pa.ArrowException as e:  # Arrow's own words say what, not where: the file and what it should be
        raise ValueError(
            f"--timings {timings_path}: not a timings file ({' '.join(str(e).split())[:200]}); give the recorder's "
            "timings-rank-*.parquet (a directory or one file) or a CSV of ms plus sample_id, or step, rank [, epoch]"
        ) from None


def _keys(timings: Timings, epoch: int) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """(n,) int64 epoch, step and rank of each row (``epoch`` for a CSV without an epoch column)."""
    rows = timings.rows
    col = {k: rows.column(k).to_numpy(zero_copy_only=False).astype(np.int64) for k in ("step", "rank")}
    if "epoch" in rows.column_names:
        epochs = rows.column("epoch").to_numpy(zero_copy_only=False).astype(np.int64)
    else:
        epochs = np.full(rows.num_rows, epoch, np.int64)
    return epochs, col["step"], col["rank"]


def check_this_plan(
    timings: Timings, m: Manifest, plan_of: Callable[[list[int]], pa.Table], epoch: int = 0
) -> None:
    """Refuse ``timings`` unless every row placed by (epoch, step, rank) is manifest ``m``'s plan's (the rule
    in the module docstring). ``plan_of(epochs)`` gives those planned epochs' rows (``epoch, step, rank,
    slot, sample_id``; read only when rows carry sample ids); ``epoch``: that of CSV rows without one.

    Raises:
        ValueError: the first row that is not this plan's, named, with what to give instead (one line).
    """
    rows, w, n_epochs = timings.rows, m.world_size, m.epochs
    names = set(rows.column_names)
    if not {"step", "rank"} <= names:
        return  # keyed by sample alone: not placed in the plan
    another = "these timings are another plan's; give those of a run that trained this manifest"
    epochs, steps, ranks = _keys(timings, epoch)
    if timings.recorded:
        world = rows.column("world_size").to_numpy().astype(np.int64)
        bad = np.flatnonzero(world != w)
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"{_name(timings, epochs, steps, ranks, i)} was recorded at world_size {int(world[i])}, but the "
                f"manifest plans world_size {w}: {another} (at world_size {w})"
            )
    # a per-sample CSV without an epoch column holds the epochs in training order: any epoch's batch there
    anywhere = not timings.recorded and "sample_id" in names and "epoch" not in names
    planned = np.asarray(m.steps_per_epoch, dtype=np.int64)
    # a cycled run's epoch replays the plan of epoch % epochs
    of = np.where(epochs >= 0, epochs % n_epochs, 0)
    last = np.full(of.size, planned.max()) if anywhere else planned[of]
    unplanned = epochs >= (np.iinfo(np.int64).max if timings.recorded else n_epochs)  # a CSV is joined as is
    bad = np.flatnonzero(
        (epochs < 0) | unplanned | (ranks < 0) | (ranks >= w) | (steps < 0) | (steps >= last)
    )
    if bad.size:
        raise ValueError(
            f"{_name(timings, epochs, steps, ranks, int(bad[0]))} is not in the manifest's plan ({n_epochs} "
            f"epochs of {list(m.steps_per_epoch)} steps x ranks 0..{w - 1}): {another}"
        )
    if not timings.recorded and "sample_id" not in names:  # a CSV of rank-steps: each one timed once
        _, first, count = np.unique(
            np.stack([of, steps, ranks], axis=1), axis=0, return_index=True, return_counts=True
        )
        if (count > 1).any():
            raise ValueError(
                f"{_name(timings, epochs, steps, ranks, int(first[count > 1][0]))} is timed twice: one row per "
                "rank-step (add an epoch column to tell epochs apart)"
            )
        return
    plan = plan_of(list(range(n_epochs)) if anywhere else sorted({int(e) for e in np.unique(of)}))
    bad = _foreign(timings, of, steps, ranks, plan, anywhere)
    if bad.size:
        raise ValueError(
            f"{_name(timings, epochs, steps, ranks, int(bad[0]))} timed samples the manifest's plan does not "
            f"hold there: {another}"
        )


def _name(
    timings: Timings, epochs: NDArray[np.int64], steps: NDArray[np.int64], ranks: NDArray[np.int64], i: int
) -> str:
    return f"{timings.path}: epoch {epochs[i]} step {steps[i]} rank {ranks[i]}"


def _foreign(
    timings: Timings,
    epochs: NDArray[np.int64],
    steps: NDArray[np.int64],
    ranks: NDArray[np.int64],
    plan: pa.Table,
    anywhere: bool,
) -> NDArray[np.int64]:
    """Rows (ascending) whose samples are not the plan's batch at their (epoch, step, rank): a recorder row's
    ``sample_ids`` must be the whole batch in slot order (a row without ids, from a plain loop, is placed by
    its keys alone), a CSV row's ``sample_id`` one of the batch (of any epoch when ``anywhere``)."""
    keys = ["step", "rank"] if anywhere else ["epoch", "step", "rank"]
    plan = plan.select(["epoch", "step", "rank", "slot", "sample_id"]).cast(
        pa.schema([(k, pa.int64()) for k in ("epoch", "step", "rank", "slot")] + [("sample_id", pa.string())])
    )
    n = timings.rows.num_rows
    mine = {"row": np.arange(n), "epoch": epochs, "step": steps, "rank": ranks}
    if timings.recorded:
        ids = timings.rows.column("sample_ids").combine_chunks()
        parent = pc.list_parent_indices(ids).to_numpy().astype(np.int64)
        offsets = ids.offsets.to_numpy().astype(np.int64)
        got = pa.table({k: v[parent] for k, v in mine.items()})
        got = got.append_column("slot", pa.array(np.arange(parent.size, dtype=np.int64) - offsets[parent]))
        got = got.append_column("sample_id", pc.cast(pc.list_flatten(ids), pa.string()))
        on = [*keys, "slot", "sample_id"]
        sizes = plan.group_by(keys).aggregate([("slot", "count")])
        size = pa.table(mine).join(sizes, keys, join_type="left outer").sort_by("row").column("slot_count")
        had = np.diff(offsets)
        wrong = (had > 0) & (had != pc.fill_null(size, 0).to_numpy())
    else:
        got = pa.table(mine).append_column(
            "sample_id", pc.cast(timings.rows.column("sample_id"), pa.string())
        )
        on = [*keys, "sample_id"]
        wrong = np.zeros(n, dtype=bool)
    known = plan.select(on).group_by(on).aggregate([])
    known = known.append_column("planned", pa.array(np.ones(known.num_rows, dtype=bool)))
    found = got.select(["row", *on]).join(known, on, join_type="left outer")
    wrong[found.filter(pc.is_null(found.column("planned"))).column("row").to_numpy()] = True
    return np.flatnonzero(wrong)


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

    Raises:
        ValueError: no row of the timings matches the samples (or the plan's step/rank).
    """
    if timings.recorded:
        obs = cal.step_observations(timings.rows, samples, q)
    else:
        per_sample = "sample_id" in timings.rows.column_names
        obs = cal.observations(timings.rows, samples, None if per_sample else plan(), epoch, q)
    if obs.num_rows == 0:
        raise ValueError(f"--timings {timings.path}: no row matches a sample (or step/rank) of this manifest")
    if timings.recorded:
        keys = [
            f"{e}:{s}"
            for e, s in zip(obs.column("epoch").to_pylist(), obs.column("step").to_pylist(), strict=True)
        ]
        return Timed(obs, "recorded rank-step", timings.rows, keys)
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
    ms = linear.obs.column("ms").to_numpy()
    try:
        best = (cal.fit_linear(design(linear.obs), ms), linear)
    except ValueError as e:
        raise ValueError(f"--timings {timings.path}: {e}") from None
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

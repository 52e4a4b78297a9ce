"""Measured vs predicted balance of the training steps that timings cover completely. Pure.

Linearity here is the plan metric ``load_linearity`` (``sum_s mean_r / sum_s max_r``, 1 - idle
fraction) of per-rank loads (S, W): measured (timings, ms) beside predicted (the plan's costs).
``lidarshard.transforms.plan.metrics.step_linearity`` is another quantity: the linearity an
equal-count LPT split of given steps reaches.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from lidarshard.transforms.plan.metrics import load_linearity

__all__ = ["plan_linearity", "measured_balance"]


def _occurrence(table: pa.Table, keys: list[str]) -> pa.Array:
    """(n,) int64: how many earlier rows of ``table`` (in row order) have the same ``keys``."""
    n = table.num_rows
    if n == 0:
        return pa.array(np.empty(0, dtype=np.int64))
    codes = [np.unique(table.column(k).to_numpy(zero_copy_only=False), return_inverse=True)[1] for k in keys]
    _, group = np.unique(np.stack([c.ravel() for c in codes], axis=1), axis=0, return_inverse=True)
    group = group.ravel()
    order = np.argsort(group, kind="stable")
    start = np.flatnonzero(np.r_[True, np.diff(group[order]) != 0])
    out = np.empty(n, dtype=np.int64)
    out[order] = np.arange(n) - np.repeat(start, np.diff(np.r_[start, n]))
    return pa.array(out)


def plan_linearity(timings: pa.Table, plan: pa.Table, batch_size: int, epoch: int = 0) -> list[dict]:
    """Measured vs predicted linearity of the plan's steps that the timings cover completely.

    Timings rows are placed in the plan by ``(epoch, step, rank)``. Without an ``epoch`` column a
    per-sample row finds its epoch by ``(step, rank, sample_id)`` in the plan; when that triple is
    planned in several epochs, its k-th occurrence in the CSV goes to the k-th such epoch (rows in
    training order, as ``examples/train_ddp.py`` writes them). A per-batch row uses ``epoch``. A
    step counts when every rank has its whole batch timed.

    Returns:
        one ``{"epoch", "steps", "measured", "predicted"}`` per epoch with complete steps ([] when
        the timings hold no step/rank or do not come from this plan, e.g. a DistributedSampler run).
    """
    names = set(timings.column_names)
    if not {"step", "rank"} <= names:
        return []
    keys = ["epoch", "step", "rank"]
    plan = plan.select([*keys, "sample_id", "cost"]).cast(
        pa.schema([(k, pa.int64()) for k in keys] + [("sample_id", pa.string()), ("cost", pa.float64())])
    )
    if "sample_id" in names and "epoch" not in names:
        triple = ["step", "rank", "sample_id"]
        ordered = plan.sort_by([(k, "ascending") for k in keys])
        seen = ordered.select([*triple, "epoch"]).append_column("nth", _occurrence(ordered, triple))
        timings = timings.select([*triple, "ms"]).append_column("nth", _occurrence(timings, triple))
        timings = timings.join(seen, [*triple, "nth"], join_type="inner")
    elif "epoch" not in names:
        timings = timings.append_column("epoch", pa.array(np.full(timings.num_rows, epoch), pa.int64()))
    want = batch_size if "sample_id" in names else 1
    measured = timings.group_by(keys).aggregate([("ms", "sum"), ("ms", "count")])
    measured = measured.filter(pc.equal(measured.column("ms_count"), want))
    predicted = plan.group_by(keys).aggregate([("cost", "sum")])
    both = measured.join(predicted, keys, join_type="inner").sort_by([(k, "ascending") for k in keys])
    width = int(pc.max(plan.column("rank")).as_py()) + 1 if plan.num_rows else 0
    out = []
    for e in np.unique(both.column("epoch").to_numpy()):
        part = both.filter(pc.equal(both.column("epoch"), e))
        steps = part.column("step").to_numpy()
        uniq, counts = np.unique(steps, return_counts=True)
        keep = np.isin(steps, uniq[counts == width])
        if not keep.any():
            continue
        ms = part.column("ms_sum").to_numpy()[keep].reshape(-1, width)
        cost = part.column("cost_sum").to_numpy()[keep].reshape(-1, width)
        out.append(
            {
                "epoch": int(e),
                "steps": int(ms.shape[0]),
                "measured": load_linearity(ms),
                "predicted": load_linearity(cost),
            }
        )
    return out


def _max_mean(loads: NDArray[np.float64]) -> float:
    """Mean over steps of max/mean across ranks of an (S, W) array (1.0 = perfectly even)."""
    mean = loads.mean(axis=1)
    ok = mean > 0
    return float((loads.max(axis=1)[ok] / mean[ok]).mean()) if ok.any() else 1.0


def measured_balance(obs: pa.Table, columns: dict[str, NDArray[np.float64]]) -> list[dict]:
    """Per epoch, measured vs predicted balance over the steps every rank recorded.

    Args:
        obs: ``step_observations`` rows (``epoch, step, rank, world_size, ms``).
        columns: ``{name: (n,) values aligned with obs}`` to compare with ``ms``, e.g. the manifest's
            predicted ``cost`` and a fitted model's prediction.

    Returns:
        one ``{"epoch", "steps", "world_size", "measured": {"linearity", "max_mean"},
        name: {...} for each column}`` per epoch with complete steps. ``linearity`` is
        ``sum_s mean_r / sum_s max_r`` (1 - idle fraction); ``max_mean`` the mean over steps of
        max/mean across ranks.
    """
    epoch, step = obs.column("epoch").to_numpy(), obs.column("step").to_numpy()
    world = obs.column("world_size").to_numpy()
    values = {"measured": obs.column("ms").to_numpy(), **columns}
    out = []
    for e in np.unique(epoch):
        mine = np.flatnonzero(epoch == e)
        w = int(world[mine].max())
        uniq, counts = np.unique(step[mine], return_counts=True)
        keep = mine[np.isin(step[mine], uniq[counts == w])]  # rows sorted by (epoch, step, rank)
        if keep.size == 0:
            continue
        row: dict = {"epoch": int(e), "steps": int(keep.size // w), "world_size": w}
        for name, v in values.items():
            loads = np.asarray(v, dtype=np.float64)[keep].reshape(-1, w)
            row[name] = {"linearity": load_linearity(loads), "max_mean": _max_mean(loads)}
        out.append(row)
    return out

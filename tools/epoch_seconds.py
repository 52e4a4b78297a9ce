"""Each epoch's seconds predicted from the manifest's calibrated ms cost model (``transforms.plan.epoch_time``),
beside those the training recorder measured. What ``lidarshard report --timings`` and the build's summary
print; ``lidarshard calibrate`` fits the per-step overhead (``step_overhead_ms``) from the same files.

Measured: at each step every rank recorded, the slowest rank's ``wall_s`` (the loop body, waiting at the
all-reduce included; the data loading between loop bodies is not in it). Predicted over the same steps.
No Beam.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.loaders.epoch_plan import read_epoch_plan
from lidarshard.schemas.manifest import Manifest
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.planner import as_planned
from lidarshard.transforms.plan.epoch_time import epoch_ms, time_factors, untimed
from lidarshard.transforms.plan.metrics import rank_costs

__all__ = ["complete_steps", "step_overhead_ms", "plan_loads", "epoch_lines"]


def complete_steps(
    rows: pa.Table,
) -> dict[int, tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]]:
    """``{epoch: (steps, wall_s, compute_s)}`` of the recorder's ``rows`` (``TIMING_FIELDS``): the steps
    every rank recorded, each with its slowest rank's ``wall_s`` and largest ``compute_s``."""
    cols = {k: rows.column(k).to_numpy() for k in ("epoch", "step", "world_size", "wall_s", "compute_s")}
    out = {}
    for e in np.unique(cols["epoch"]):
        mine = cols["epoch"] == e
        steps, at, count = np.unique(cols["step"][mine], return_inverse=True, return_counts=True)
        wall, compute = np.zeros(steps.size), np.zeros(steps.size)
        np.maximum.at(wall, at, cols["wall_s"][mine])
        np.maximum.at(compute, at, cols["compute_s"][mine])
        whole = count == int(cols["world_size"][mine].max())
        if whole.any():
            out[int(e)] = (steps[whole].astype(np.int64), wall[whole], compute[whole])
    return out


def step_overhead_ms(rows: pa.Table) -> float | None:
    """Mean ms a recorded step lasts beyond its slowest rank's own compute (``max wall_s - max compute_s``
    over the steps every rank recorded), or None when no step is complete."""
    steps = complete_steps(rows)
    if not steps:
        return None
    gaps = np.concatenate([wall - compute for _, wall, compute in steps.values()])
    return float(1000.0 * np.maximum(gaps, 0.0).mean())


def plan_loads(out: str, m: Manifest, samples: pa.Table) -> list[NDArray[np.float64]]:
    """Per epoch, the (S, W) predicted cost of each rank at each step, in the costs that planned it (with the
    model's ``launch_ms`` at every rank-step)."""
    cfg = PlanConfig.from_manifest(m)
    ids = samples.column("sample_id")
    loads = []
    for e in range(m.epochs):
        plan = read_epoch_plan(out, m, e, ids).plan
        loads.append(
            rank_costs(plan, as_planned(samples, e, cfg).column("cost").to_numpy(), cfg.step_cost(e))
        )
    return loads


def epoch_lines(m: Manifest, loads: list[NDArray[np.float64]], rows: pa.Table | None = None) -> list[str]:
    """One line per epoch: its predicted seconds (the model that planned it, when that is in ms), and with
    the recorder's ``rows`` the measured seconds over the steps every rank recorded and the error in %."""
    cfg = PlanConfig.from_manifest(m)
    factors = time_factors(m.rank_speed, m.world_size)
    measured = complete_steps(rows) if rows is not None else {}
    lines = []
    for e, load in enumerate(loads):
        then = cfg.planned_with(e)
        model = then[0] if then is not None else m.cost_model
        why = untimed(model)
        if why is not None:
            lines.append(f"epoch {e}: no predicted time: {why}")
            continue
        step_ms = model.step_ms or 0.0
        whole = epoch_ms(load, factors, step_ms) / 1000.0
        line = f"epoch {e}: predicted {whole:.5g} s for {load.shape[0]} steps"
        if e in measured:
            steps, wall, _ = measured[e]
            steps = steps[steps < load.shape[0]]
            pred = epoch_ms(load[steps], factors, step_ms) / 1000.0
            got = float(wall[: steps.size].sum())
            error = 100.0 * (pred - got) / got if got > 0 else float("nan")
            if steps.size < load.shape[0]:
                line += f"; over the {steps.size} steps recorded predicted {pred:.5g} s"
            line += f", measured {got:.5g} s ({error:+.1f}%)"
        if model.step_ms is None:
            line += " (no per-step overhead recorded: compute only)"
        lines.append(line)
    return lines

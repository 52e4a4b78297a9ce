"""Fit the memory model ``peak bytes = base + per_point * points + per_voxel * voxels`` of a rank-step to the
recorder's ``peak_bytes`` (``lidarshard calibrate`` writes it as the JSON's ``memory_model``; ``build
--max-step-memory SIZE --memory-model FILE`` applies it, ``lidarshard.transforms.plan.memory``). Pure.

One observation is one recorded rank-step with a peak: the design row ``[1, sum points, sum voxels]`` over
its samples (``tools.fit.step_observations``), so ``base`` is per step (weights, gradients, optimizer
state) and the activations grow with the batch's sum. The fit is the cost fit's non-negative least squares
(``tools.fit.fit_linear``) with the per-step constant in place of the per-sample one.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lidarshard.tools import fit as cal
from lidarshard.tools.timings import Timings, design

__all__ = ["MIN_R2", "memory_model", "memory_line"]

#: The least R^2 a memory model is written with: below, the peaks are not explained by the samples' sizes.
MIN_R2 = 0.5


def memory_model(timings: Timings, samples: pa.Table) -> dict:
    """``{"memory_model": {...} | None, "memory_note": str}`` for the calibration JSON.

    The model holds ``base_bytes, bytes_per_point, bytes_per_voxel`` (what ``--memory-model`` reads) and
    ``r2``, ``rmse_bytes``, ``n`` (rank-steps fitted) and ``devices``; None, with the reason in the note,
    when the timings hold no peak (a CSV, CPU steps) or no non-negative fit explains them (R^2 below
    ``MIN_R2``); ``build --memory-model`` repeats the note.
    """
    if not timings.recorded:
        return _none("a timings CSV records no memory: record with lidarshard.loaders.timing.StepTimer")
    rows = timings.rows.filter(pc.is_valid(timings.rows.column("peak_bytes")))
    if rows.num_rows == 0:
        return _none(
            "no recorded step has peak_bytes (timed on the host clock, device 'cpu'): record on a GPU or NPU"
        )
    obs = cal.step_observations(rows, samples)
    keys = ["epoch", "step", "rank"]
    peaks = rows.select([*keys, "peak_bytes"]).cast(
        pa.schema([(k, pa.int64()) for k in keys] + [("peak_bytes", pa.int64())])
    )
    obs = obs.join(peaks, keys, join_type="inner").sort_by([(k, "ascending") for k in keys])
    if obs.num_rows < 3:
        return _none(f"{obs.num_rows} rank-steps with peak_bytes match this manifest's samples: need 3")
    x = design(obs)
    x[:, 0] = 1.0  # a per-step base, not a per-sample one
    y = obs.column("peak_bytes").to_numpy().astype(np.float64)
    try:
        fit = cal.fit_linear(x, y)
    except ValueError:
        return _none("no non-negative fit: the recorded peaks do not grow with points or voxels")
    if fit.r2 < MIN_R2:  # a cap on a model that does not explain the peaks would promise nothing
        return _none(
            f"the recorded peaks do not grow with points or voxels: the best non-negative fit explains R^2 "
            f"{fit.r2:.4f} of them over {fit.n} rank-steps, below {MIN_R2}; record steps of varied sizes on "
            "the device"
        )
    devices = sorted(set(rows.column("device").to_pylist()))
    model = {
        "base_bytes": fit.c0,
        "bytes_per_point": fit.a,
        "bytes_per_voxel": fit.b,
        "r2": fit.r2,
        "rmse_bytes": fit.rmse,
        "n": fit.n,
        "devices": devices,
    }
    return {"memory_model": model, "memory_note": f"fitted over {fit.n} rank-steps on {', '.join(devices)}"}


def _none(note: str) -> dict:
    return {"memory_model": None, "memory_note": note}


def memory_line(found: dict) -> str:
    """The printed line: the model with its R^2, or why there is none."""
    m = found["memory_model"]
    if m is None:
        return f"memory: no model ({found['memory_note']})"
    return (
        f"memory: peak bytes = {m['base_bytes']:.6g} + {m['bytes_per_point']:.6g} * points + "
        f"{m['bytes_per_voxel']:.6g} * voxels per rank-step; R^2 {m['r2']:.4f}, rmse {m['rmse_bytes']:.4g} B, "
        f"{found['memory_note']}"
    )

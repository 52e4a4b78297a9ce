"""An epoch's time before it runs, from a cost model fitted to measured milliseconds. Pure numpy.

A synchronous data-parallel step lasts as long as its slowest rank, plus what every step costs beyond the
ranks' own compute (the all-reduce, the optimizer, the rest of the loop body: the cost model's
``step_ms``)::

    epoch_ms = sum_s max_r (load[s, r] * factor[r]) + S * step_ms

``load`` (S, W) are the ranks' predicted costs (ms) at each step and ``factor`` (W,) each rank's time per
ms of predicted cost: ``1 / speed`` scaled to mean 1 (``time_factors``), so that with equal speeds a
rank-step takes its predicted ms and, with ``--rank-speed``, the ranks on average do too (a cost model
fitted to all ranks' timings is the average rank's). The one place this is computed: ``lidarshard
report --timings`` and the build's summary both call ``epoch_ms``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from lidarshard.schemas.records import CostModel

__all__ = ["time_factors", "epoch_ms", "untimed"]


def time_factors(speeds: Sequence[float] | None, world_size: int) -> NDArray[np.float64]:
    """(W,) each rank's time per predicted ms: ``1 / speed`` scaled to mean 1 (ones without speeds).

    Raises:
        ValueError: not ``world_size`` speeds > 0.
    """
    if speeds is None:
        return np.ones(world_size)
    given = np.asarray(speeds, dtype=np.float64)
    if given.shape != (world_size,) or not (np.isfinite(given).all() and (given > 0).all()):
        raise ValueError(f"need {world_size} rank speeds > 0, got {list(speeds)}")
    inverse = 1.0 / given
    return inverse / inverse.mean()


def epoch_ms(loads: NDArray[np.float64], factors: NDArray[np.float64], step_ms: float) -> float:
    """Predicted ms of the steps ``loads`` (S, W) (predicted ms per rank-step): each step its slowest rank's
    ``load * factor`` (``factors`` (W,), ``time_factors``) plus ``step_ms``."""
    loads = np.asarray(loads, dtype=np.float64)
    if loads.ndim != 2 or loads.shape[1] != len(factors):
        raise ValueError(f"need loads (S, {len(factors)}), got {loads.shape}")
    slowest = (loads * np.asarray(factors, dtype=np.float64)[None, :]).max(axis=1, initial=0.0)
    return float(slowest.sum() + loads.shape[0] * step_ms)


def untimed(model: CostModel) -> str | None:
    """Why ``model`` predicts no time (one plain line), or None when it is a calibrated ms model."""
    if model.units == "ms":
        return None
    return (
        f"cost model {model.name} is not in ms (only a model lidarshard calibrate fitted to measured "
        "timings is): calibrate, then build or re-plan with --cost-model @fit.json"
    )

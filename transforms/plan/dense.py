"""Plan rows -> the dense ``(S, W, M)`` plan array, the one way. Pure numpy.

Plan files hold one row per planned slot (step, rank, slot, sample); every consumer that needs the
whole epoch at once (validate's re-derivation, the report, the elastic re-plan) turns those rows into
the array the planners produce: ``plan[step, rank, slot]`` = sample row index, ``-1`` = empty slot.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["dense_plan"]


def dense_plan(
    step: NDArray[np.integer],
    rank: NDArray[np.integer],
    slot: NDArray[np.integer],
    row: NDArray[np.integer],
    steps: int,
    world_size: int,
    slots: int | None = None,
) -> NDArray[np.int64]:
    """Scatter plan rows into a ``(steps, world_size, M)`` int64 array, ``-1`` where no row is.

    Args:
        step, rank, slot, row: (n,) the rows' step, rank, slot and sample row index (>= 0).
        steps, world_size: S and W of the epoch (from the manifest, checked by the caller).
        slots: M; default ``max(slot) + 1`` (at least 1).

    Raises:
        ValueError: a row outside ``steps x world_size x M``, or two rows in one slot (one line).
    """
    step, rank, slot = (np.asarray(a, dtype=np.int64) for a in (step, rank, slot))
    m = int(slot.max(initial=0)) + 1 if slots is None else int(slots)
    outside = (step < 0) | (step >= steps) | (rank < 0) | (rank >= world_size) | (slot < 0) | (slot >= m)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise ValueError(
            f"plan row (step {step[i]}, rank {rank[i]}, slot {slot[i]}) is outside {steps} steps x "
            f"{world_size} ranks x {m} slots"
        )
    flat = (step * world_size + rank) * m + slot
    out = np.full(steps * world_size * m, -1, dtype=np.int64)
    out[flat] = row
    if np.count_nonzero(out >= 0) != flat.size or (np.asarray(row) < 0).any():
        raise ValueError("two plan rows share one (step, rank, slot), or a row has no sample")
    return out.reshape(steps, world_size, m)

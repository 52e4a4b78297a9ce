"""Mixed hardware: per-rank relative speeds (``--rank-speed 1,1,0.6,0.6``). Pure numpy.

A rank of speed ``s`` takes ``cost / s`` to train what costs ``cost``; a plan is balanced when every rank's
*time* ``load / s_r`` is the same at every step. ``budget`` (variable counts) targets ``load_r ∝ s_r`` at
every step; an equal-count strategy cannot change counts, so each of its steps hands the heaviest rank
batch to the fastest rank (:func:`fastest_heaviest`), which is all a fixed batch size allows. The
manifest's balance then also records ``metrics.speed_linearity``, and the loss scale of
a step stays ``W / N`` over its samples (``loaders``), however they are spread.

Plans are ``(S, W, M)`` int64 indices into ``costs``, ``-1`` = empty slot.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.io import storage
from lidarshard.transforms.plan.metrics import rank_costs

__all__ = ["SPEED_RANGE", "parse_rank_speed", "rank_speeds", "normalized", "fastest_heaviest"]

#: Relative rank speeds lidarshard plans for (a 5e-324 speed made every time a NaN).
SPEED_RANGE = (1e-6, 1e6)


def parse_rank_speed(text: str) -> tuple[float, ...]:
    """``S0,S1,...`` or ``@file.json`` (a list, or ``{"rank_speed": [...]}`` as ``lidarshard calibrate``
    writes it when the timings tell the ranks apart): speeds in ``SPEED_RANGE``.

    Raises:
        ValueError: not such a list (one line).
    """
    if text.startswith("@"):
        try:
            obj = storage.read_json(text[1:], what="the file")
        except FileNotFoundError:
            raise ValueError(f"{text[1:]}: no such file") from None
        except OSError as e:  # a directory, a FIFO, unreadable: the user's to fix, like a missing file
            raise ValueError(f"{text[1:]}: {e.strerror or e}") from None
        values = obj.get("rank_speed") if isinstance(obj, dict) else obj
        learned = obj.get("rank_speeds") if isinstance(obj, dict) else None
        if isinstance(learned, dict):  # lidarshard calibrate's output: its learned speeds
            values = _learned(text[1:], values, learned)
        if not isinstance(values, list):
            raise ValueError(
                f'{text[1:]} must hold a list of speeds or {{"rank_speed": [...]}}, got {json.dumps(obj)[:60]}'
            )
    else:
        values = [v.strip() for v in text.split(",")]
    return rank_speeds(values, text)


def _learned(path: str, values: object, learned: dict) -> object:
    """The speeds of a calibrate output (``rank_speed`` beside its ``rank_speeds`` record): ValueError
    (one line, calibrate's own note) when calibrate could not tell the ranks apart, or the record's world
    size is not the number of speeds."""
    if values is None:
        note = learned.get("note")
        why = note if isinstance(note, str) else "it holds no rank_speed"
        raise ValueError(f"{path} gives no rank speeds: {why[:200]}; plan without --rank-speed")
    world = learned.get("world_size")
    if isinstance(values, list) and isinstance(world, int) and world != len(values):
        raise ValueError(f"{path}: rank_speed holds {len(values)} speeds but its timings had {world} ranks")
    return values


def rank_speeds(values: Sequence[object], shown: str | None = None) -> tuple[float, ...]:
    """(W,) speeds of ``values`` (numbers or their text), each in ``SPEED_RANGE``; ``shown`` names them in errors.

    Raises:
        ValueError: not such a list (one line).
    """
    shown = repr(values) if shown is None else shown
    try:
        values = list(values)
        speeds = tuple(float(v) for v in values if not isinstance(v, bool))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"rank speeds must be numbers, got {shown[:80]!r}") from None
    lo, hi = SPEED_RANGE
    if len(speeds) != len(values) or not speeds or not all(lo <= s <= hi for s in speeds):
        raise ValueError(
            f"rank speeds must be finite numbers > 0 (in {lo:g}..{hi:g}), one per rank, got {shown[:80]!r}"
        )
    return speeds


def normalized(speeds: tuple[float, ...] | NDArray[np.float64]) -> NDArray[np.float64]:
    """(W,) speeds scaled to mean 1."""
    s = np.asarray(speeds, dtype=np.float64)
    return s / s.mean()


def fastest_heaviest(
    plan: NDArray[np.int64], costs: NDArray[np.float64], speeds: NDArray[np.float64]
) -> NDArray[np.int64]:
    """``plan`` (S, W, M) with each step's rank batches reordered so the k-th heaviest goes to the k-th
    fastest rank (stable: ties keep rank order). The steps, their batches and their counts are unchanged."""
    if plan.size == 0:
        return plan
    loads = rank_costs(plan, costs)  # (S, W)
    by_load = np.argsort(-loads, axis=1, kind="stable")  # batch of each load rank, heaviest first
    by_speed = np.argsort(-np.asarray(speeds, dtype=np.float64), kind="stable")  # ranks, fastest first
    out = np.empty_like(plan)
    out[:, by_speed] = np.take_along_axis(plan, by_load[:, :, None], axis=1)
    return out

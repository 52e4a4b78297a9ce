"""Hard per-rank-step caps (points, cost, samples, predicted peak memory) and the check every plan must pass.

A user sets caps from GPU memory: no rank may ever receive, at one step, more than ``max_points``
points, ``max_cost`` predicted cost or ``max_samples`` samples. ``budget`` plans within them; every
other strategy is checked against them, and a plan that exceeds one is an error before anything
is published. A single sample above a cap can never be planned: ``over_cap`` finds those so the
pipeline rejects them (reason ``over_cap``) instead of failing or dropping them silently. The memory
cap (``--max-step-memory``, ``lidarshard.transforms.plan.memory``) bounds ``base + sum`` of the samples'
predicted bytes.

Plans are ``(S, W, M)`` int64 pool indices where ``-1`` marks an empty slot (variable counts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from lidarshard.schemas.memory_cap import MemoryCapRecord, MemoryModelRecord
from lidarshard.schemas.records import CapsRecord
from lidarshard.transforms.declare import nested, option
from lidarshard.transforms.plan.memory import OVER_CAP, MemoryCap, format_bytes, model_of_record
from lidarshard.transforms.value_checks import float_in, int_in

__all__ = [
    "Caps", "PoolLimits", "Breach", "over_cap", "rank_step_sums", "cap_breaches", "check_caps",
]  # fmt: skip


@dataclass(frozen=True)
class Caps:
    """Per-rank-step limits; ``None`` means no limit."""

    max_points: int | None = option(
        "hard cap on points (num_points) one rank gets at one step" + OVER_CAP, None,
        flag="--max-points-per-rank-step", check=int_in(1), metavar="N")  # fmt: skip
    max_cost: float | None = option(
        "hard cap on predicted cost one rank gets at one step" + OVER_CAP, None, flag="--max-cost-per-rank-step",
        check=float_in(0.0, above=True), metavar="C")  # fmt: skip
    max_samples: int | None = option(
        "hard cap on samples one rank gets at one step", None, flag="--max-samples-per-rank-step",
        check=int_in(1), metavar="N")  # fmt: skip
    memory: MemoryCap | None = nested(None)  # --max-step-memory with its memory model

    def __post_init__(self) -> None:
        for name, value in (("points", self.max_points), ("samples", self.max_samples)):
            if value is not None and (int(value) != value or value < 1):
                raise ValueError(f"--max-{name}-per-rank-step must be an integer >= 1, got {value}")
        if self.max_cost is not None and not (np.isfinite(self.max_cost) and self.max_cost > 0):
            raise ValueError(f"--max-cost-per-rank-step must be finite and > 0, got {self.max_cost}")

    @property
    def active(self) -> bool:
        """True when at least one cap is set."""
        return any(v is not None for v in (self.max_points, self.max_cost, self.max_samples, self.memory))

    # The one conversion between the caps and their records (the manifest's ``caps`` and ``memory_cap``).

    def to_record(self, heaviest_first: str = "off") -> tuple[CapsRecord, MemoryCapRecord | None]:
        """The manifest's ``caps`` (with ``heaviest_first``) and ``memory_cap`` (None: no memory cap)."""
        caps = CapsRecord(self.max_points, self.max_cost, self.max_samples, heaviest_first)
        if self.memory is None:
            return caps, None
        m = self.memory.model
        return caps, MemoryCapRecord(
            self.memory.max_bytes, MemoryModelRecord(m.base, m.per_point, m.per_voxel)
        )

    @classmethod
    def from_record(cls, rec: CapsRecord | None, memory: MemoryCapRecord | None = None) -> Caps:
        """A manifest's typed ``caps`` and ``memory_cap`` (None: none), checked as the flags are."""
        mem = None if memory is None else MemoryCap(memory.max_step_bytes, model_of_record(memory.model))
        if rec is None:
            return cls(memory=mem)
        return cls(
            rec.max_points_per_rank_step, rec.max_cost_per_rank_step, rec.max_samples_per_rank_step, mem
        )


@dataclass(frozen=True)
class PoolLimits:
    """Caps bound to one epoch's pool: ``points`` (P,) int64 per pool entry (needed for max_points),
    ``memory`` (P,) float64 bytes each entry adds to its rank-step's peak (needed for the memory cap)."""

    caps: Caps
    points: NDArray[np.int64] | None = None
    memory: NDArray[np.float64] | None = None


def over_cap(
    costs: NDArray[np.float64],
    points: NDArray[np.int64] | None,
    caps: Caps,
    memory: NDArray[np.float64] | None = None,
) -> list[str]:
    """One detail string per sample (index order) that alone exceeds a cap, "" where it fits.

    Args:
        costs: (N,) predicted costs; points: (N,) points per sample, or None (no points cap check);
        memory: (N,) bytes per sample (``MemoryModel.sample_bytes``), or None (no memory cap check).
    """
    out = [""] * len(costs)
    if caps.max_cost is not None:
        for i in np.flatnonzero(np.asarray(costs) > caps.max_cost):
            out[i] = f"cost {float(costs[i]):.6g} > --max-cost-per-rank-step {caps.max_cost:g}"
    if caps.max_points is not None and points is not None:
        for i in np.flatnonzero(np.asarray(points) > caps.max_points):
            out[i] = f"{int(points[i])} points > --max-points-per-rank-step {caps.max_points}"
    if caps.memory is not None and memory is not None:
        peaks = caps.memory.peaks(memory)
        for i in np.flatnonzero(peaks > caps.memory.max_bytes):
            out[i] = caps.memory.detail(float(peaks[i]))
    return out


def rank_step_sums(plan: NDArray[np.int64], values: NDArray) -> NDArray:
    """(S, W) sum of ``values`` over each rank-step; ``-1`` slots count 0."""
    padded = np.append(np.asarray(values), np.zeros(1, dtype=np.asarray(values).dtype))
    return padded[plan].sum(axis=-1)


@dataclass(frozen=True)
class Breach:
    """The first rank-step (step, rank) of a plan over one cap, its sum, and how many rank-steps are over."""

    name: str  # "samples", "cost", "points" or "memory" (value and cap in bytes)
    step: int
    rank: int
    value: float
    cap: float
    count: int

    def detail(self) -> str:
        """``value name > --max-name-per-rank-step cap`` (memory: ``predicted peak X GiB > ...``)."""
        if self.name == "memory":
            return f"predicted peak {format_bytes(self.value)} > --max-step-memory {format_bytes(self.cap)}"
        return f"{self.value:.6g} {self.name} > --max-{self.name}-per-rank-step {self.cap:g}"


def cap_breaches(
    plan: NDArray[np.int64],
    caps: Caps,
    costs: NDArray[np.float64],
    points: NDArray[np.int64] | None,
    memory: NDArray[np.float64] | None = None,
) -> list[Breach]:
    """The one caps check: one ``Breach`` per cap that a rank-step of ``plan`` (S, W, M) exceeds, in
    the order samples, cost, points, memory (``points`` / ``memory`` None: that cap is not checked).

    Args:
        costs: (P,) costs of what ``plan`` indexes; points: (P,) their points; memory: (P,) the bytes
            each adds to its rank-step's predicted peak (``caps.memory.model``).
    """
    sums: list[tuple[str, float | None, NDArray]] = [("samples", caps.max_samples, (plan >= 0).sum(axis=-1))]
    if caps.max_cost is not None:
        sums.append(("cost", caps.max_cost, rank_step_sums(plan, costs)))
    if caps.max_points is not None and points is not None:
        sums.append(("points", caps.max_points, rank_step_sums(plan, points)))
    if caps.memory is not None and memory is not None:
        sums.append(("memory", caps.memory.max_bytes, caps.memory.peaks(rank_step_sums(plan, memory))))
    out = []
    for name, cap, got in sums:
        bad = np.argwhere(got > cap) if cap is not None else np.empty((0, 2), dtype=np.int64)
        if bad.size:
            s, r = (int(v) for v in bad[0])
            out.append(Breach(name, s, r, float(got[s, r]), cap, len(bad)))  # type: ignore[arg-type]
    return out


def check_caps(
    plan: NDArray[np.int64], limits: PoolLimits | None, costs: NDArray[np.float64], epoch: int
) -> None:
    """Raise ValueError naming the first (step, rank) of ``plan`` (S, W, M) that exceeds a cap.

    Args:
        costs: (P,) pool costs; ``limits.points`` (P,) pool points.
    """
    if limits is None or not limits.caps.active or plan.size == 0:
        return
    if limits.points is None and limits.caps.max_points is not None:
        raise ValueError("--max-points-per-rank-step needs the samples' num_points")
    if limits.memory is None and limits.caps.memory is not None:
        raise ValueError("--max-step-memory needs the samples' points and voxels")
    for b in cap_breaches(plan, limits.caps, costs, limits.points, limits.memory)[:1]:
        raise ValueError(
            f"epoch {epoch} step {b.step} rank {b.rank}: {b.detail()} ({b.count} rank-steps over the cap); "
            "the strategy cannot honour it: use --strategy budget or raise the cap"
        )

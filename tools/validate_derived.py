"""``lidarshard validate``'s checks against the plan re-derived from the samples: each epoch planned
again with the recorded strategy, seed and settings (``plan_samples``) must give the plan files' plan
and counts, and epochs 0 and 1 the recorded ``pair_repeat_rate``. Pure numpy; appends
``"<where>: <what>"`` lines to ``problems``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.schemas.jsonsafe import short
from lidarshard.schemas.manifest import Manifest
from lidarshard.transforms.core.epochs import EpochPlan, PlanConfig, plan_samples, repeat_rates

__all__ = ["derive", "check_replan", "check_repeat_rate"]


def _add(problems: list[str], where: str, what: str) -> None:
    problems.append(f"{where}: {what}")


def derive(
    problems: list[str], m: Manifest, cfg: PlanConfig | None, e: int, samples: pa.Table
) -> EpochPlan | None:
    """Epoch ``e`` planned again from the samples with the recorded settings ``cfg`` (``plan_samples``:
    the plan, its random baseline, its stats); None when ``cfg`` is None or planning fails (a problem)."""
    if cfg is None:
        return None
    try:
        return plan_samples(samples, e, cfg)
    except (ValueError, TypeError, KeyError) as err:
        _add(
            problems, f"epoch {e}", f"the plan cannot be recomputed from strategy {short(m.strategy)}: {err}"
        )
        return None


def _trim(plan: NDArray[np.int64]) -> NDArray[np.int64]:
    """``plan`` (S, W, M) without trailing slot columns that are empty (-1) everywhere."""
    used = np.flatnonzero((plan >= 0).any(axis=(0, 1)))
    return plan[:, :, : int(used[-1]) + 1 if used.size else 0]


def check_replan(
    problems: list[str], m: Manifest, e: int, plan: NDArray[np.int64], derived: EpochPlan, samples: pa.Table
) -> None:
    """Epoch ``e``'s plan (S, W, M) and its planned/dropped/padded counts equal those the recorded
    strategy and seed re-derive from the samples (``derived``): catches swapped ranks or steps and a
    forged strategy or seed, whatever the hashes say."""
    for key in ("planned", "dropped", "padded"):
        got = getattr(m.counts, key)[e]
        if got != derived.stats[key]:
            _add(problems, f"epoch {e}", f"counts.{key} recorded {got}, re-derived {derived.stats[key]}")
    want, plan = _trim(derived.plan), _trim(plan)
    how = f"the plan strategy {m.strategy} with seed {m.seed} recomputes"
    if want.shape != plan.shape:
        _add(problems, f"epoch {e}", f"plan shape {plan.shape} differs from {how} {want.shape}")
        return
    diff = np.argwhere(want != plan)
    if diff.size:
        s, r, k = (int(v) for v in diff[0])
        sid = samples.column("sample_id")
        _add(
            problems,
            f"{m.plan_file(e, r)}: epoch {e} rank {r} step {s} slot {k}",
            f"{sid[int(plan[s, r, k])]} differs from {how} ({sid[int(want[s, r, k])]}); {len(diff)} slots differ",
        )


def check_repeat_rate(problems: list[str], m: Manifest, plans: list[EpochPlan | None]) -> None:
    """``pair_repeat_rate`` against ``repeat_rates`` of epochs 0 and 1 as re-derived (``plans``; None:
    not derived, reported), within 1e-6; null when the manifest has one epoch."""
    got = None if m.pair_repeat_rate is None else dict(m.pair_repeat_rate)
    if m.epochs < 2:
        if got is not None:
            _add(
                problems, "_manifest.json", f"pair_repeat_rate recorded {short(got)}, expected null (1 epoch)"
            )
        return
    first, second = plans
    if first is None or second is None:
        _add(
            problems,
            "_manifest.json",
            "pair_repeat_rate cannot be recomputed (epoch 0 or 1 was not re-derived)",
        )
        return
    again = repeat_rates(first, second, m.strategy)
    same = (
        got is not None and set(got) == set(again) and all(abs(got[k] - v) <= 1e-6 for k, v in again.items())
    )
    if not same:
        _add(problems, "_manifest.json", f"pair_repeat_rate recorded {short(got)}, recomputed {again}")

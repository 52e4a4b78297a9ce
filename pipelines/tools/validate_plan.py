"""Plan checks of ``lidarshard validate``: one rank's file, an epoch's sample lookup, coverage and balance.

Pure pyarrow/numpy. Each check appends ``"<where>: <what>"`` lines to ``problems``; where names the
file, epoch, rank, step and slot as precisely as the problem allows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.pipelines.tools.validate_repeat import check_realized
from lidarshard.pipelines.tools.validate_samples import SamplesView, release_memory, row_keys
from lidarshard.transforms.jsonsafe import short
from lidarshard.transforms.plan import VARIABLE_COUNT, plan_epoch
from lidarshard.transforms.plan.caps import Caps, rank_step_sums
from lidarshard.transforms.plan.epochs import PlanConfig, repeat_rates, replan
from lidarshard.transforms.plan.metrics import balance_summary, equal_count_pool

__all__ = [
    "check_plan", "lookup", "rank_rows", "padded_plan", "check_counts", "check_epoch_files", "check_caps", "check_epoch", "check_replan",
    "check_repeat_rate",
]  # fmt: skip

_MAX_SHOWN = 5


def _add(problems: list[str], where: str, what: str) -> None:
    problems.append(f"{where}: {what}")


def check_plan(problems: list[str], rel: str, t: pa.Table, e: int, r: int, steps: int, b: int | None) -> bool:
    """Structure of rank ``r``'s plan ``t`` (file ``rel``) for epoch ``e``: no nulls, exactly ``steps`` x
    ``b`` rows in (step, slot) order (``b=None``, variable counts: every step holds slots ``0..n-1``
    with ``n >= 1`` equal to ``rank_count``). Epoch and rank are the file's directories (the schema
    check refuses them as columns). Returns True when the file is usable."""
    if b is None:
        return _check_variable(problems, rel, t, e, r, steps)
    for name in ("step", "slot", "sample_id", "cost", "bucket_id", "path"):
        if t.column(name).null_count:
            _add(problems, rel, f"column {name} holds {t.column(name).null_count} nulls")
            return False
    step, slot = t.column("step").to_numpy().astype(np.int64), t.column("slot").to_numpy().astype(np.int64)
    if t.num_rows != steps * b:
        _add(
            problems,
            rel,
            f"epoch {e} rank {r}: {t.num_rows} rows, but steps_per_epoch[{e}] = {steps} steps x batch_size "
            f"{b} = {steps * b}",
        )
        return False
    outside = (step < 0) | (step >= steps)
    if outside.any():
        _add(
            problems,
            rel,
            f"epoch {e} rank {r}: step {step[outside][0]} outside steps_per_epoch[{e}] = {steps}",
        )
        return False
    per_step = np.bincount(step, minlength=steps)
    if (per_step != b).any():
        s = int(np.flatnonzero(per_step != b)[0])
        _add(problems, rel, f"epoch {e} rank {r} step {s}: {per_step[s]} rows, expected batch_size {b}")
        return False
    order = (step != np.repeat(np.arange(steps), b)) | (slot != np.tile(np.arange(b), steps))
    if order.any():
        i = int(np.flatnonzero(order)[0])
        _add(
            problems,
            rel,
            f"epoch {e} rank {r}: row {i} is (step {step[i]}, slot {slot[i]}); rows must be sorted by "
            f"(step, slot) with slots 0..{b - 1}",
        )
        return False
    return True


def _check_variable(problems: list[str], rel: str, t: pa.Table, e: int, r: int, steps: int) -> bool:
    for name in ("step", "slot", "sample_id", "cost", "bucket_id", "path", "rank_count", "global_count"):
        if t.column(name).null_count:
            _add(problems, rel, f"column {name} holds {t.column(name).null_count} nulls")
            return False
    step, slot = t.column("step").to_numpy().astype(np.int64), t.column("slot").to_numpy().astype(np.int64)
    if step.size and (step.min() < 0 or step.max() >= steps):
        _add(problems, rel, f"epoch {e} rank {r}: a step outside steps_per_epoch[{e}] = {steps}")
        return False
    counts = np.bincount(step, minlength=steps)
    if (counts < 1).any():
        s = int(np.argmin(counts))
        _add(problems, rel, f"epoch {e} rank {r} step {s}: no sample (every rank needs one per step)")
        return False
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    if (np.diff(step) < 0).any() or not np.array_equal(slot, np.arange(step.size) - starts):
        i = int(np.flatnonzero((slot != np.arange(step.size) - starts) | np.r_[False, np.diff(step) < 0])[0])
        _add(
            problems,
            rel,
            f"epoch {e} rank {r}: row {i} is (step {step[i]}, slot {slot[i]}); rows must be "
            "sorted by (step, slot) with slots 0..n-1",
        )
        return False
    rank_count = t.column("rank_count").to_numpy().astype(np.int64)
    if not np.array_equal(rank_count, counts[step]):
        i = int(np.flatnonzero(rank_count != counts[step])[0])
        _add(
            problems,
            rel,
            f"epoch {e} rank {r} step {step[i]}: rank_count {rank_count[i]}, the step holds "
            f"{counts[step[i]]} rows",
        )
        return False
    return True


#: Plan rows whose strings are joined and hashed at a time (a whole rank's file at 10M samples
#: with 9 sweeps would join ~150 MB of strings at once).
_KEY_ROWS = 1 << 16
#: What an epoch keeps of each rank's plan file once its strings are checked: (n,) int32 columns.
_KEPT = ("step", "slot", "rank_count", "global_count")


def rank_rows(t: pa.Table, idx: NDArray[np.int64], n: int) -> dict[str, NDArray]:
    """The numbers an epoch's checks need of one rank's plan table ``t`` (its strings checked):
    ``_KEPT`` as int32 copies (nothing of ``t`` stays referenced) and ``row``, the sample index of each
    of the (m,) rows (``lookup``), int32 when the ``n`` samples allow it."""
    out = {k: np.array(t.column(k).to_numpy(), dtype=np.int32) for k in _KEPT}
    out["row"] = idx.astype(np.int32) if n < 2**31 else idx
    return out


def padded_plan(ranks: list[dict[str, NDArray]], steps: int) -> NDArray[np.int64]:
    """(S, W, M) plan of sample indices from the ``rank_rows`` of ranks 0..W-1, ``-1`` = empty slot."""
    m = max((int(p["slot"].max(initial=0)) for p in ranks), default=0) + 1
    out = np.full((steps, len(ranks), m), -1, dtype=np.int64)
    for r, p in enumerate(ranks):
        out[p["step"], r, p["slot"]] = p["row"]
    return out


def check_counts(
    problems: list[str], e: int, ranks: list[dict[str, NDArray]], plan: NDArray[np.int64], b: int | None
) -> None:
    """``rank_count`` and ``global_count`` of every row (``rank_rows`` of ranks 0..W-1) against the plan
    (S, W, M) of epoch ``e``."""
    counts = (plan >= 0).sum(axis=-1)
    totals = counts.sum(axis=1)
    for name in ("rank_count", "global_count"):
        for r, p in enumerate(ranks):
            got, want = p[name], counts[p["step"], r] if name == "rank_count" else totals[p["step"]]
            if not np.array_equal(got, want):
                i = int(np.flatnonzero(got != want)[0])
                _add(
                    problems,
                    f"{schemas.plan_file(e, r)}: epoch {e} rank {r} step {p['step'][i]}",
                    f"{name} {got[i]}, the plan holds {want[i]}",
                )
                break
    if b is not None and (counts != b).any():
        _add(problems, f"epoch {e}", f"a rank-step holds {counts[counts != b][0]} samples, batch_size is {b}")


def check_caps(problems: list[str], e: int, caps: Caps, plan: NDArray[np.int64], samples: pa.Table) -> None:
    """Every rank-step of epoch ``e``'s plan (S, W, M) within the manifest's caps."""
    sums = [("samples", caps.max_samples, (plan >= 0).sum(axis=-1))]
    sums.append(("cost", caps.max_cost, rank_step_sums(plan, samples.column("cost").to_numpy())))
    sums.append(("points", caps.max_points, rank_step_sums(plan, samples.column("num_points").to_numpy())))
    for name, cap, got in sums:
        bad = np.argwhere(got > cap) if cap is not None else np.empty((0, 2), dtype=np.int64)
        if bad.size:
            s, r = (int(v) for v in bad[0])
            _add(
                problems,
                f"{schemas.plan_file(e, r)}: epoch {e} step {s} rank {r}",
                f"{got[s, r]:.6g} {name} > --max-{name}-per-rank-step {cap:g} ({len(bad)} rank-steps over)",
            )


def lookup(
    problems: list[str], e: int, r: int, t: pa.Table, samples: SamplesView
) -> NDArray[np.int64] | None:
    """(n,) row indices into ``samples`` of the n rows of rank ``r``'s plan table ``t`` (epoch ``e``),
    after checking that every sample_id exists and cost, bucket_id, path and sweep_paths equal the
    sample's (the strings through their row keys)."""

    def where(i: int) -> str:
        step, slot = (t.column(k)[i].as_py() for k in ("step", "slot"))
        return f"{schemas.plan_file(e, r)}: epoch {e} rank {r} step {step} slot {slot}"

    ids = t.column("sample_id")
    idx = samples.find(ids)
    if (idx < 0).any():
        i = int(np.flatnonzero(idx < 0)[0])
        _add(problems, where(i), f"sample_id {ids[i]} is not in the samples")
        return None
    for name in ("cost", "bucket_id", "path"):
        if name == "path":
            got, want = _row_keys(t), samples.row_key[idx]
        else:
            got, want = t.column(name).to_numpy(), samples.column(name).to_numpy()[idx]
        if np.array_equal(got, want):
            continue
        i = int(np.flatnonzero(got != want)[0])
        what = "path or sweep_paths" if name == "path" else name
        _add(problems, where(i), f"{what} of {ids[i]} differs from the samples")
        return None
    return idx


def _row_keys(t: pa.Table) -> NDArray[np.uint64]:
    """``row_keys`` of plan table ``t``, ``_KEY_ROWS`` rows at a time."""
    parts = [t.slice(a, _KEY_ROWS) for a in range(0, t.num_rows, _KEY_ROWS)]
    keys = [row_keys(p.column("sample_id"), p.column("path"), p.column("sweep_paths")) for p in parts]
    return np.concatenate(keys) if keys else np.empty(0, np.uint64)


def check_epoch_files(
    problems: list[str],
    read: Callable[[str], pa.Table | None],
    m: dict,
    e: int,
    samples: SamplesView,
    caps: Caps,
    held: tuple | None,
    last: bool,
) -> int:
    """Epoch ``e``'s plan files (``read(rel)``: the table, or None when unusable) one at a time, each
    one's strings checked and then only its numbers kept (~20 bytes a row), then the whole epoch's plan.

    Memory is handed back between the steps, so the peak is one check's temporaries over the samples
    view and the plan, not their sum; after the ``last`` epoch's files the view's keys are dropped
    (the re-plan, the peak, runs without them). Returns the epoch's plan rows."""
    w, steps = m["world_size"], m["steps_per_epoch"][e]
    per_step = None if m["strategy"] in VARIABLE_COUNT else m["batch_size"]
    ranks, rows = [], 0
    for r in range(w):
        rel = schemas.plan_file(e, r)
        t = read(rel)
        rows += t.num_rows if t is not None else 0
        if t is not None and check_plan(problems, rel, t, e, r, steps, per_step):
            idx = lookup(problems, e, r, t, samples)
            if idx is not None:
                ranks.append(rank_rows(t, idx, samples.num_rows))
        del t
        release_memory()
    if last:
        samples.drop_keys()
    if len(ranks) < w:
        return rows
    plan = padded_plan(ranks, steps)
    check_counts(problems, e, ranks, plan, per_step)
    del ranks
    release_memory()
    check_caps(problems, e, caps, plan, samples)
    check_epoch(problems, m, e, plan, samples)
    release_memory()
    check_replan(problems, m, e, plan, samples, caps)
    if held is not None:
        check_realized(problems, m, e, plan, held)
    return rows


def check_epoch(problems: list[str], m: dict, e: int, plan: NDArray[np.int64], samples: pa.Table) -> None:
    """Coverage and balance of epoch ``e`` against manifest ``m``; ``plan`` is (S, W, M) sample indices,
    ``-1`` = empty slot (variable counts).

    Weights all 1: drop_last plans each sample at most once and planned = accepted - dropped; pad plans
    each at least once and planned = accepted + padded. Other weights: no sample beyond
    ceil(bucket weight x sample weight) copies (+1 under pad). Every ``balance`` number is recomputed from the plan's costs (within 1e-6).
    """
    counts, n = m["counts"], samples.num_rows
    planned, dropped, padded = (counts[k][e] for k in ("planned", "dropped", "padded"))
    where = f"epoch {e}"
    entries = plan[plan >= 0]
    if planned != entries.size:
        _add(problems, where, f"counts.planned {planned} != {entries.size} plan rows")
    seen = np.bincount(entries, minlength=n)
    ids = samples.column("bucket_id").to_numpy()
    weights = np.asarray(m["buckets"]["weights"], dtype=np.float64)[ids] * samples.column("weight").to_numpy()
    sid = samples.column("sample_id")
    if (weights == 1).all():
        if m["policy"] == "drop_last":
            if seen.max(initial=0) > 1:
                _add(
                    problems,
                    where,
                    f"sample {sid[int(np.argmax(seen))]} planned {seen.max()} times under drop_last",
                )
            if planned != n - dropped or padded:
                _add(
                    problems,
                    where,
                    f"planned {planned} != accepted {n} - dropped {dropped} (padded {padded})",
                )
        else:
            if (seen == 0).any():
                _add(
                    problems,
                    where,
                    f"{int((seen == 0).sum())} samples never planned under pad, first {sid[int(np.argmin(seen))]}",
                )
            if planned != n + padded or dropped:
                _add(
                    problems,
                    where,
                    f"planned {planned} != accepted {n} + padded {padded} (dropped {dropped})",
                )
    elif (seen > np.ceil(weights) + (m["policy"] == "pad")).any():
        i = int(np.flatnonzero(seen > np.ceil(weights) + (m["policy"] == "pad"))[0])
        _add(
            problems,
            where,
            f"sample {sid[i]} planned {seen[i]} times, more than bucket weight x sample weight {weights[i]:.6g} allows",
        )
    del seen, weights, ids
    entries.sort()  # the pool, sorted
    pool, costs = entries, samples.column("cost").to_numpy()[entries]
    in_pool = np.searchsorted(pool, plan)
    in_pool[plan < 0] = -1
    del pool, entries
    w, b = m["world_size"], m["batch_size"]
    baseline = plan_epoch("random", equal_count_pool(costs, w, b), w, b, seed=m["seed"], epoch=e)
    again = balance_summary(in_pool, costs, w, b, baseline=baseline, epoch=e)
    recorded = m["balance"][e] if e < len(m["balance"]) else {}
    for key, value in again.items():
        if key not in recorded or not abs(float(recorded[key]) - value) <= 1e-6:
            _add(problems, where, f"balance.{key} recorded {recorded.get(key)}, recomputed {value:.6f}")


def _plan_config(m: dict, samples: pa.Table, caps: Caps) -> PlanConfig:
    """The PlanConfig the manifest records (weights cut to the buckets that hold samples, as planning sees them)."""
    k = int(samples.column("bucket_id").to_numpy().max(initial=-1)) + 1
    weights = tuple(float(w) for w in m["buckets"]["weights"][: max(k, 1)])
    return PlanConfig(
        world_size=m["world_size"],
        batch_size=m["batch_size"],
        epochs=m["epochs"],
        seed=m["seed"],
        strategy=m["strategy"],
        policy=m["policy"],
        weights=weights,
        caps=caps,
    )


def _trim(plan: NDArray[np.int64]) -> NDArray[np.int64]:
    """``plan`` (S, W, M) without trailing slot columns that are empty (-1) everywhere."""
    used = np.flatnonzero((plan >= 0).any(axis=(0, 1)))
    return plan[:, :, : int(used[-1]) + 1 if used.size else 0]


def check_replan(
    problems: list[str], m: dict, e: int, plan: NDArray[np.int64], samples: pa.Table, caps: Caps
) -> None:
    """Epoch ``e``'s plan (S, W, B) equals the one the recorded strategy and seed recompute from samples
    (catches swapped ranks or steps and a forged strategy or seed, whatever the hashes say)."""
    try:
        want = replan(samples, e, _plan_config(m, samples, caps))
    except (ValueError, TypeError, KeyError) as err:
        _add(
            problems,
            f"epoch {e}",
            f"the plan cannot be recomputed from strategy {short(m.get('strategy'))}: {err}",
        )
        return
    want, plan = _trim(want), _trim(plan)
    if want.shape != plan.shape:
        _add(
            problems,
            f"epoch {e}",
            f"plan shape {plan.shape} differs from the plan strategy "
            f"{m['strategy']} with seed {m['seed']} recomputes {want.shape}",
        )
        return
    diff = np.argwhere(want != plan)
    if diff.size:
        s, r, k = (int(v) for v in diff[0])
        sid = samples.column("sample_id")
        _add(
            problems,
            f"{schemas.plan_file(e, r)}: epoch {e} rank {r} step {s} slot {k}",
            f"{sid[int(plan[s, r, k])]} differs from the plan strategy {m['strategy']} with seed {m['seed']} "
            f"recomputes ({sid[int(want[s, r, k])]}); {len(diff)} slots differ",
        )


def check_repeat_rate(problems: list[str], m: dict, samples: pa.Table, caps: Caps) -> None:
    """``pair_repeat_rate`` recomputed from the samples and the recorded settings (within 1e-6)."""
    try:
        again = repeat_rates(samples, _plan_config(m, samples, caps))
    except (ValueError, TypeError, KeyError) as err:
        _add(problems, "_manifest.json", f"pair_repeat_rate cannot be recomputed ({err})")
        return
    got = m.get("pair_repeat_rate")
    same = (again is None and got is None) or (
        isinstance(got, dict)
        and again is not None
        and set(got) == set(again)
        and all(isinstance(got[k], (int, float)) and abs(got[k] - v) <= 1e-6 for k, v in again.items())
    )
    if not same:
        _add(problems, "_manifest.json", f"pair_repeat_rate recorded {short(got)}, recomputed {again}")

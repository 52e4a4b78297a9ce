"""Plan checks of ``lidarshard validate``: one rank's file, an epoch's sample lookup, coverage and balance.

Pure pyarrow/numpy. Each check appends ``"<where>: <what>"`` lines to ``problems``; where names the
file, epoch, rank, step and slot as precisely as the problem allows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.transforms.plan.metrics import balance_summary

__all__ = ["check_plan", "lookup", "check_epoch"]

_MAX_SHOWN = 5


def _add(problems: list[str], where: str, what: str) -> None:
    problems.append(f"{where}: {what}")


def check_plan(problems: list[str], rel: str, t: pa.Table, e: int, r: int, steps: int, b: int) -> bool:
    """Structure of rank ``r``'s plan ``t`` (file ``rel``) for epoch ``e``: no nulls, exactly ``steps`` x
    ``b`` rows in (step, slot) order. Epoch and rank are the file's directories (the schema check refuses
    them as columns). Returns True when the file is usable."""
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


def lookup(problems: list[str], e: int, t: pa.Table, samples: pa.Table) -> NDArray[np.int64] | None:
    """(W*S*B,) row indices into ``samples`` of epoch ``e``'s plan ``t`` (all ranks, rank-major, with a
    ``rank`` column added from the file paths), after checking that every sample_id exists and path, cost, bucket_id, sweep_paths equal the sample's."""

    def where(i: int) -> str:
        rank, step, slot = (t.column(k)[i].as_py() for k in ("rank", "step", "slot"))
        return f"{schemas.plan_file(e, rank)}: epoch {e} rank {rank} step {step} slot {slot}"

    idx = pc.index_in(t.column("sample_id"), value_set=samples.column("sample_id"))
    if idx.null_count:
        i = int(np.flatnonzero(idx.is_null().to_numpy(zero_copy_only=False))[0])
        _add(problems, where(i), f"sample_id {t.column('sample_id')[i]} is not in samples.parquet")
        return None
    idx = idx.to_numpy().astype(np.int64)
    for name in ("path", "cost", "bucket_id", "sweep_paths"):
        got = t.column(name).combine_chunks()
        want = samples.column(name).take(pa.array(idx)).combine_chunks()
        if got.equals(want):
            continue
        if name == "sweep_paths":
            i = next(i for i in range(len(got)) if got[i] != want[i])
        else:
            i = int(np.flatnonzero(~pc.equal(got, want).to_numpy(zero_copy_only=False))[0])
        _add(problems, where(i), f"{name} of {t.column('sample_id')[i]} differs from samples.parquet")
        return None
    return idx


def check_epoch(problems: list[str], m: dict, e: int, plan: NDArray[np.int64], samples: pa.Table) -> None:
    """Coverage and balance of epoch ``e`` against manifest ``m``; ``plan`` is (S, W, B) sample indices.

    Weights all 1: drop_last plans each sample at most once and planned = accepted - dropped; pad plans
    each at least once and planned = accepted + padded. Other weights: no sample beyond ceil(weight)
    copies (+1 under pad). Every ``balance`` number is recomputed from the plan's costs (within 1e-6).
    """
    counts, n = m["counts"], samples.num_rows
    planned, dropped, padded = (counts[k][e] for k in ("planned", "dropped", "padded"))
    where = f"epoch {e}"
    if planned != plan.size:
        _add(problems, where, f"counts.planned {planned} != {plan.size} plan rows")
    seen = np.bincount(plan.ravel(), minlength=n)
    weights = np.asarray(m["buckets"]["weights"], dtype=np.float64)
    ids = samples.column("bucket_id").to_numpy()
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
    elif (seen > np.ceil(weights[ids]) + (m["policy"] == "pad")).any():
        i = int(np.flatnonzero(seen > np.ceil(weights[ids]) + (m["policy"] == "pad"))[0])
        _add(problems, where, f"sample {sid[i]} planned {seen[i]} times, more than its bucket weight allows")
    pool = np.sort(plan.ravel())
    costs = samples.column("cost").to_numpy()[pool]
    again = balance_summary(
        np.searchsorted(pool, plan), costs, m["world_size"], m["batch_size"], seed=m["seed"], epoch=e
    )
    recorded = m["balance"][e] if e < len(m["balance"]) else {}
    for key, value in again.items():
        if key not in recorded or not abs(float(recorded[key]) - value) <= 1e-6:
            _add(problems, where, f"balance.{key} recorded {recorded.get(key)}, recomputed {value:.6f}")

"""Epoch checks of ``lidarshard validate``: each plan row's sample, the epoch's dense plan, counts, caps,
the step order (``--heaviest-first``), coverage and balance; the epoch re-derived from the samples
(``plan_samples``, once per epoch) is checked by ``validate_derived``. One plan file's own structure:
``validate_files.check_plan``.

Pure pyarrow/numpy. Each check appends ``"<where>: <what>"`` lines to ``problems``; where names the
file, epoch, rank, step and slot as precisely as the problem allows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.schemas.manifest import Manifest
from lidarshard.tools.validate_derived import check_replan, derive
from lidarshard.tools.validate_files import check_plan
from lidarshard.tools.validate_repeat import check_realized
from lidarshard.tools.validate_samples import SamplesView, row_keys
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.epochs import EpochPlan, as_planned
from lidarshard.transforms.io.arrow import release_memory
from lidarshard.transforms.plan.caps import Caps, cap_breaches, rank_step_sums
from lidarshard.transforms.plan.dense import dense_plan
from lidarshard.transforms.plan.memory import MemoryModel
from lidarshard.transforms.plan.metrics import REFERENCE_KEY, balance_summary
from lidarshard.transforms.plan.order import step_peaks

__all__ = [
    "lookup", "rank_rows", "epoch_rows", "check_counts", "check_epoch_files", "check_caps",
    "check_heaviest_first", "check_epoch",
]  # fmt: skip


def _add(problems: list[str], where: str, what: str) -> None:
    problems.append(f"{where}: {what}")


#: Plan rows whose strings are joined and hashed at a time (a whole rank's file at 10M samples
#: with 9 sweeps would join ~150 MB of strings at once).
_KEY_ROWS = 1 << 16
#: What an epoch keeps of each rank's plan file once its strings are checked: (n,) int32 columns.
_KEPT = ("step", "slot", "rank_count", "global_count")


def rank_rows(t: pa.Table, idx: NDArray[np.int64], n: int) -> dict[str, NDArray]:
    """The numbers an epoch's checks need of one rank's plan table ``t`` (its strings checked):
    ``_KEPT`` as int32 copies (nothing of ``t`` stays referenced) and ``row``, the sample index of each
    of the (m,) rows (``lookup``), int32 when the ``n`` samples allow it."""
    out: dict[str, NDArray] = {k: np.array(t.column(k).to_numpy(), dtype=np.int32) for k in _KEPT}
    out["row"] = idx.astype(np.int32) if n < 2**31 else idx
    return out


def epoch_rows(ranks: list[dict[str, NDArray]]) -> dict[str, NDArray]:
    """The ``rank_rows`` of ranks 0..W-1 as one set of (n,) columns plus ``rank``, rank-major; each
    rank's arrays are released as their column is joined."""
    rank = [np.full(p["row"].size, r, dtype=np.int32) for r, p in enumerate(ranks)]
    out = {"rank": np.concatenate(rank) if rank else np.empty(0, np.int32)}
    for k in (*_KEPT, "row"):
        out[k] = np.concatenate([p.pop(k) for p in ranks]) if ranks else np.empty(0, np.int32)
    return out


def check_counts(
    problems: list[str],
    e: int,
    rows: dict[str, NDArray],
    plan: NDArray[np.int64],
    b: int | None,
    file_of: Callable[[int, int], str] = schemas.plan_file,
) -> None:
    """``rank_count`` and ``global_count`` of every row (``epoch_rows``) against the plan (S, W, M) of
    epoch ``e``; with ``b`` (equal counts) every rank-step holds ``b`` samples. ``file_of(e, r)``: the
    rank's plan file, for the message (``Manifest.plan_file``)."""
    counts = (plan >= 0).sum(axis=-1)
    step, rank = rows["step"], rows["rank"]
    for name, want in (("rank_count", counts[step, rank]), ("global_count", counts.sum(axis=1)[step])):
        bad = np.flatnonzero(rows[name] != want)
        if bad.size:
            i = int(bad[0])
            _add(
                problems,
                f"{file_of(e, int(rank[i]))}: epoch {e} rank {rank[i]} step {step[i]}",
                f"{name} {rows[name][i]}, the plan holds {want[i]}",
            )
    if b is not None and (counts != b).any():
        _add(problems, f"epoch {e}", f"a rank-step holds {counts[counts != b][0]} samples, batch_size is {b}")


def check_caps(
    problems: list[str],
    e: int,
    caps: Caps,
    plan: NDArray[np.int64],
    samples: pa.Table,
    file_of: Callable[[int, int], str] = schemas.plan_file,
) -> None:
    """Every rank-step of epoch ``e``'s plan (S, W, M) within the manifest's caps, its predicted peak
    memory included (``file_of``: as in ``check_counts``)."""
    costs, points = samples.column("cost").to_numpy(), samples.column("num_points").to_numpy()
    memory = None
    if caps.memory is not None:
        try:
            memory = caps.memory.model.sample_bytes(samples)
        except (ValueError, KeyError) as err:
            _add(problems, f"epoch {e}", f"the memory cap cannot be checked: {err}")
    for b in cap_breaches(plan, caps, costs, points, memory):
        _add(
            problems,
            f"{file_of(e, b.rank)}: epoch {e} step {b.step} rank {b.rank}",
            f"{b.detail()} ({b.count} rank-steps over)",
        )


def check_heaviest_first(
    problems: list[str],
    e: int,
    mode: str,
    plan: NDArray[np.int64],
    samples: pa.Table,
    file_of: Callable[[int, int], str] = schemas.plan_file,
    model: MemoryModel | None = None,
) -> None:
    """With ``mode`` ``points``, ``cost`` or ``memory`` (the manifest's ``heaviest_first``), step 0 of epoch
    ``e``'s plan (S, W, M) holds its heaviest rank-step by that sum (``order.step_peaks``; cost and memory
    sums within a relative 1e-9, as summation order may round them); ``off``: nothing to check
    (``file_of``: as in ``check_counts``; ``memory``: the bytes of ``model``, the manifest's memory model)."""
    if mode not in ("points", "cost", "memory") or plan.shape[0] < 2:
        return
    if mode == "memory":
        if model is None:
            return  # a manifest without a memory cap cannot ask for it: PlanConfig refuses it
        values = model.sample_bytes(samples)
    else:
        values = samples.column("num_points" if mode == "points" else "cost").to_numpy()
    peaks = step_peaks(plan, values)
    k = int(np.argmax(peaks))
    top, first = float(peaks[k]), float(peaks[0])
    if top - first > (0 if mode == "points" else 1e-9 * max(abs(top), 1.0)):
        r = int(np.argmax(rank_step_sums(plan[k : k + 1], values)[0]))
        _add(
            problems,
            f"{file_of(e, r)}: epoch {e} step {k} rank {r}",
            f"{top:.6g} {mode} is more than step 0's heaviest rank-step ({first:.6g}), but the manifest "
            f"records heaviest_first {mode}: step 0 must hold the epoch's heaviest rank-step",
        )


def lookup(
    problems: list[str], rel: str, e: int, r: int, t: pa.Table, samples: SamplesView
) -> NDArray[np.int64] | None:
    """(n,) row indices into ``samples`` of the n rows of rank ``r``'s plan table ``t`` (epoch ``e``,
    file ``rel``),
    after checking that every sample_id exists and cost, bucket_id, path and sweep_paths equal the
    sample's (the strings through their row keys)."""

    def where(i: int) -> str:
        step, slot = (t.column(k)[i].as_py() for k in ("step", "slot"))
        return f"{rel}: epoch {e} rank {r} step {step} slot {slot}"

    ids = t.column("sample_id")
    idx = samples.find(ids)
    if (idx < 0).any():
        i = int(np.flatnonzero(idx < 0)[0])
        _add(problems, where(i), f"sample_id {ids[i]} is not in the samples")
        return None
    for name in ("cost", "bucket_id", "path"):
        if name == "path":
            got, want = _row_keys(t), samples.path_keys(idx)
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


def _epoch_plan(
    problems: list[str], m: Manifest, e: int, ranks: list[dict[str, NDArray]], steps: int, b: int | None
) -> NDArray[np.int64] | None:
    """Epoch ``e``'s (S, W, M) plan of sample indices (``dense_plan``) from the ``rank_rows`` of every
    rank (emptied), its counts checked; None and a problem when the rows do not fit S x W."""
    rows = epoch_rows(ranks)
    try:
        plan = dense_plan(rows["step"], rows["rank"], rows["slot"], rows["row"], steps, len(ranks))
    except ValueError as err:
        _add(problems, f"epoch {e}", str(err))
        return None
    check_counts(problems, e, rows, plan, b, m.plan_file)
    return plan


def check_epoch_files(
    problems: list[str],
    read: Callable[[str], pa.Table | None],
    m: Manifest,
    cfg: PlanConfig | None,
    e: int,
    samples: SamplesView,
    held: tuple | None,
    last: bool,
) -> tuple[int, EpochPlan | None]:
    """Epoch ``e``'s plan files (``read(rel)``: the table, or None when unusable) one at a time, each
    one's strings checked and then only its numbers kept (~20 bytes a row), then the whole epoch's plan
    against the epoch re-derived with the recorded settings ``cfg`` (None: not valid, reported).

    Memory is handed back between the steps, so the peak is one check's temporaries over the samples
    view and the plan, not their sum; after the ``last`` epoch's files the view's keys are dropped
    (the re-derivation, the peak, runs without them).

    Returns:
        (the epoch's plan rows, the re-derived epoch or None when it could not be derived).
    """
    w, steps = m.world_size, m.steps(e)
    per_step = None if m.variable_count else m.batch_size
    if cfg is not None:  # an epoch before a re-plan is checked with the costs that planned it
        try:
            samples = as_planned(samples, e, cfg)
        except ValueError as err:
            _add(problems, f"epoch {e}", f"the costs of cost_history cannot be recomputed: {err}")
            cfg = None
    ranks, rows = [], 0
    for r in range(w):
        rel = m.plan_file(e, r)
        t = read(rel)
        rows += t.num_rows if t is not None else 0
        if t is not None and check_plan(problems, rel, t, e, r, steps, per_step):
            idx = lookup(problems, rel, e, r, t, samples)
            if idx is not None:
                ranks.append(rank_rows(t, idx, samples.num_rows))
        del t
        release_memory()
    if last:
        samples.drop_keys()
    plan = _epoch_plan(problems, m, e, ranks, steps, per_step) if len(ranks) == w else None
    del ranks
    release_memory()
    derived = derive(problems, m, cfg, e, samples)
    if plan is None:
        return rows, derived
    if cfg is not None:
        check_caps(problems, e, cfg.caps, plan, samples, m.plan_file)
        model = None if cfg.caps.memory is None else cfg.caps.memory.model
        check_heaviest_first(problems, e, cfg.heaviest_first, plan, samples, m.plan_file, model)
    check_epoch(problems, m, e, plan, samples, derived)
    release_memory()
    if derived is not None:
        check_replan(problems, m, e, plan, derived, samples)
    if held is not None:
        check_realized(problems, m, e, plan, held)
    return rows, derived


def check_epoch(
    problems: list[str],
    m: Manifest,
    e: int,
    plan: NDArray[np.int64],
    samples: pa.Table,
    derived: EpochPlan | None,
) -> None:
    """Coverage and balance of epoch ``e`` against manifest ``m``; ``plan`` is (S, W, M) sample indices,
    ``-1`` = empty slot (variable counts).

    Weights all 1: drop_last plans each sample at most once and planned = accepted - dropped; pad plans
    each at least once and planned = accepted + padded. Other weights: no sample beyond
    ceil(bucket weight x sample weight) copies (+1 under pad). Every ``balance`` number is recomputed
    from the plan's costs (within 1e-6), but ``random_linearity``: the files hold no random plan, so it
    is the re-derived epoch's (``derived``; not checked when None); so are ``greedy_reference`` and
    ``spearman_step_cost`` of a plan of several step groups (its groups' numbers, ``group_stats``).
    """
    n, where = samples.num_rows, f"epoch {e}"
    planned, dropped, padded = m.counts.planned[e], m.counts.dropped[e], m.counts.padded[e]
    entries = plan[plan >= 0]
    if planned != entries.size:
        _add(problems, where, f"counts.planned {planned} != {entries.size} plan rows")
    seen = np.bincount(entries, minlength=n)
    ids = samples.column("bucket_id").to_numpy()
    per_bucket = np.asarray(m.buckets.weights, dtype=np.float64)
    weights = samples.column("weight").to_numpy()  # x bucket weights, all 1 in a re-plan's earlier epochs
    weights = weights if (per_bucket == 1).all() else per_bucket[ids] * weights
    sid = samples.column("sample_id")
    if (weights == 1).all():
        if m.policy == "drop_last":
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
    elif (seen > np.ceil(weights) + (m.policy == "pad")).any():
        i = int(np.flatnonzero(seen > np.ceil(weights) + (m.policy == "pad"))[0])
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
    w, b = m.world_size, m.batch_size
    again = balance_summary(
        in_pool, costs, w, b, baseline=np.empty((0, w, b), np.int64), epoch=e, speeds=m.rank_speed
    )
    recorded = m.balance[e]
    derived_keys = ["random_linearity", "random_speed_linearity"]  # of the empty baseline: the derived one's
    if m.groups > 1:  # the groups' references and orders (transforms.plan.group_stats): as re-derived
        derived_keys += [REFERENCE_KEY, "spearman_step_cost"]
    for key in derived_keys:
        again.pop(key, None)
        known = key != "random_speed_linearity" or recorded.value(key) is not None
        if derived is not None and key in derived.stats and known:
            again[key] = derived.stats[key]  # absent from manifests written before it was
    for key, value in again.items():
        got = recorded.value(key) if key not in ("epoch", "steps", "max_count") else getattr(recorded, key)
        if got is None or not abs(got - value) <= 1e-6:
            _add(problems, where, f"balance.{key} recorded {got}, recomputed {value:.6f}")

"""One epoch of ``lidarshard validate``: its plan files as the DuckDB table ``epoch_rows``, checked by queries
(each row's sample, path, cost and bucket; rows per rank-step and step; coverage), then one step group at a
time: its plan (S_g, W, M) of sample rows (caps, ``--heaviest-first``, balance sums) against the plan
re-derived alone (``validate_derived``). A group's rows are those ``groups.deal`` gives it (the table
``dealt``, joined once into ``epoch_rows``' ``grp`` when G > 1); G = 1 is one group. Problems are ``"<where>: <what>"`` lines naming file, epoch, rank, step, slot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.loaders.planfiles import plan_problem
from lidarshard.schemas.jsonsafe import short
from lidarshard.schemas.manifest import Manifest
from lidarshard.tools.validate_db import ID_KEY, ROW_KEY, Engine
from lidarshard.tools.validate_derived import Derived, PairRepeat, check_replan, check_steps, planned_values
from lidarshard.tools.validate_samples import Samples, same_counts
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.planner import as_planned
from lidarshard.transforms.features.repeat import repeat_counts
from lidarshard.transforms.io.arrow import release_memory
from lidarshard.transforms.plan.caps import Breach, Caps, cap_breaches, rank_step_sums
from lidarshard.transforms.plan.metrics import balance_entry, plan_sums
from lidarshard.transforms.plan.order import step_peaks

__all__ = ["check_epoch_files", "cap_values", "group_breaches", "report_breaches"]

#: ``read_plans(rels)``: per usable file (recorded bytes, contract schema) (rel, its columns but sweep_paths,
#: None), then (rel, None, its next rows) to its end; (rel, None, None) when not usable (a problem said).
ReadPlans = Callable[[Sequence[str]], Iterator[tuple[str, pa.Table | None, pa.Table | None]]]
#: The plan files' columns ``epoch_rows`` is made of (``path`` and ``sweep_paths`` only as their ``ROW_KEY``).
_PLAN_COLUMNS = "rank step slot rank_count global_count cost bucket_id sample_id path sweep_paths".split()
#: (costs (n,), points (n,), predicted bytes (n,) or None) of one group's samples: what caps are checked on.
CapValues = tuple[NDArray, NDArray | None, NDArray | None]


def cap_values(problems: list[str], e: int, caps: Caps, samples: Any) -> CapValues:
    """Epoch ``e``'s cap values of a group's ``samples`` (predicted bytes only under a memory cap)."""
    memory = None
    if caps.memory is not None:
        try:
            memory = caps.memory.model.sample_bytes(samples)
        except (ValueError, KeyError) as err:
            problems.append(f"epoch {e}: the memory cap cannot be checked: {err}")
    return samples.column("cost").to_numpy(), samples.column("num_points").to_numpy(), memory


def group_breaches(
    plan: NDArray[np.int64], steps: NDArray[np.integer], caps: Caps, values: CapValues
) -> list[Breach]:
    """``cap_breaches`` of one group's plan (S_g, W, M), steps renumbered to the epoch's (``steps`` (S_g,))."""
    return [dataclasses.replace(b, step=int(steps[b.step])) for b in cap_breaches(plan, caps, *values)]


def report_breaches(
    problems: list[str], e: int, breaches: Sequence[Breach], file_of: Callable[[int, int], str]
) -> None:
    """One line per cap any group breaches: the epoch's first (step, rank) over it and how many are."""
    for name in ("samples", "cost", "points", "memory"):
        found = [b for b in breaches if b.name == name]
        if found:
            b = min(found, key=lambda x: (x.step, x.rank))
            problems.append(
                f"{file_of(e, b.rank)}: epoch {e} step {b.step} rank {b.rank}: "
                f"{b.detail()} ({sum(x.count for x in found)} rank-steps over)"
            )


def _load(
    problems: list[str], read_plans: ReadPlans, m: Manifest, e: int, db: Engine
) -> tuple[int, set[int]]:
    """Epoch ``e``'s rank files, each checked (``plan_problem``) and its rows joined to their samples into
    ``epoch_rows`` -> (plan rows read, the ranks whose every row has its sample and the sample's paths)."""
    count, usable, broken = 0, set(), set()
    ranks = {m.plan_file(e, r): r for r in range(m.world_size)}

    def rows() -> Iterator[pa.Table]:
        """Each usable file's rows with their ``rank``: DuckDB pulls them as it inserts."""
        nonlocal count
        for rel, head, batch in read_plans(list(ranks)):
            r = ranks[rel]
            if batch is not None and r in usable:
                rank = pa.array(np.full(batch.num_rows, r, np.int32))  # plan_problem checked the column
                yield batch.set_column(batch.schema.get_field_index("rank"), "rank", rank)
                release_memory(heap=False)
            elif head is None and batch is None and r in usable:  # not usable (said): none of its rows
                broken.add(r)
            elif head is not None:
                count += head.num_rows
                problem = plan_problem(head, e, r, m.steps(e), None if m.variable_count else m.batch_size)
                if problem is not None:
                    problems.append(f"{rel}: {problem}")
                else:
                    usable.add(r)
            del head, batch

    schema = pa.schema([schemas.plan_schema().field(n) for n in _PLAN_COLUMNS])
    select = f"SELECT {', '.join(_PLAN_COLUMNS[:-2])}, {ID_KEY} AS skey, {ROW_KEY} AS rkey FROM t"
    db.run(f"CREATE OR REPLACE TABLE plan_rows AS {select} LIMIT 0", t=schema.empty_table())
    db.insert(f"INSERT INTO plan_rows {select}", schema, rows())
    if broken:
        usable -= broken
        db.run(f"DELETE FROM plan_rows WHERE rank IN ({', '.join(map(str, sorted(broken)))})")
    db.run(
        "CREATE OR REPLACE TABLE epoch_rows AS SELECT p.rank, p.step, p.slot, p.rank_count, p.global_count, "
        "p.cost, p.bucket_id, s.rid, p.rkey = s.rkey AS same, p.rowid AS prow FROM plan_rows p "
        "LEFT JOIN (SELECT skey, rid, rkey FROM samples) s USING (skey)"
    )
    first = db.rows(
        "SELECT e.rank, e.step, e.slot, p.sample_id, s.sample_id FROM (SELECT * FROM epoch_rows WHERE rid "
        "IS NULL OR NOT same QUALIFY row_number() OVER (PARTITION BY rank ORDER BY rid IS NULL DESC, step, "
        "slot) = 1) e JOIN plan_rows p ON p.rowid = e.prow LEFT JOIN samples s USING (rid) ORDER BY "
        "e.rank"
    )
    db.run("DROP TABLE plan_rows")
    for r, step, slot, unknown, sid in first:
        what = (
            f"sample_id {unknown} is not in the samples"
            if sid is None
            else f"path or sweep_paths of {sid} differs from the samples"
        )
        problems.append(f"{m.plan_file(e, r)}: epoch {e} rank {r} step {step} slot {slot}: {what}")
        usable.discard(r)
    return count, usable


def _check_rows(problems: list[str], m: Manifest, e: int, db: Engine) -> set[int]:
    """Each row's cost and bucket_id against its sample's as planned: one line per rank file that differs (its
    first row in (step, slot) order whose cost differs, else whose bucket_id does) -> those ranks."""
    bad = db.rows(
        "SELECT rank, step, slot, name, s.sample_id FROM (SELECT r.rank, r.step, r.slot, r.rid, CASE WHEN "
        "r.cost IS DISTINCT FROM p.cost THEN 'cost' ELSE 'bucket_id' END AS name FROM epoch_rows r JOIN planned p "
        "USING (rid) WHERE r.cost IS DISTINCT FROM p.cost OR r.bucket_id IS DISTINCT FROM p.bucket_id) JOIN "
        "samples s USING (rid) QUALIFY row_number() OVER (PARTITION BY rank ORDER BY name = 'bucket_id', step, "
        "slot) = 1 ORDER BY rank"
    )
    for r, step, slot, name, sid in bad:
        problems.append(
            f"{m.plan_file(e, r)}: epoch {e} rank {r} step {step} slot {slot}: {name} of {sid} differs from the samples"
        )
    return {r for r, *_ in bad}


def _check_counts(problems: list[str], m: Manifest, e: int, db: Engine) -> None:
    """``batch_size`` rows per rank-step (equal-count strategies); ``rank_count``/``global_count`` against the
    rows of the row's rank-step/step: the first row (rank, step, slot) that differs, once per column."""
    if not m.variable_count:
        for (n,) in db.rows(
            "SELECT count(*) AS n FROM epoch_rows GROUP BY step, rank HAVING n <> ? ORDER BY "
            "step, rank LIMIT 1",
            [m.batch_size],
        ):
            problems.append(f"epoch {e}: a rank-step holds {n} samples, batch_size is {m.batch_size}")
    for name, part in (("rank_count", "step, rank"), ("global_count", "step")):  # windows: no join to spill
        for r, step, value, count in db.rows(
            f"SELECT rank, step, {name}, n FROM (SELECT rank, step, slot, {name}, count(*) OVER (PARTITION BY "
            f"{part}) AS n FROM epoch_rows) WHERE {name} <> n ORDER BY rank, step, slot LIMIT 1"
        ):
            problems.append(
                f"{m.plan_file(e, r)}: epoch {e} rank {r} step {step}: {name} {value}, the plan holds {count}"
            )


def _coverage(m: Manifest, e: int, samples: Samples, held: tuple | None) -> list[str]:
    """Epoch ``e``'s coverage from the copies of each sample. Weights (x bucket weights) all 1: drop_last plans
    each at most once and planned = accepted - dropped; pad each at least once, planned = accepted + padded.
    Else no sample beyond ceil(weight) copies (+1 under pad). ``held``: ``repeat.realized[e]`` is checked."""
    bucket, pad, where = [float(w) for w in m.buckets.weights], int(m.policy == "pad"), f"epoch {e}"
    db, ids = samples.db, samples.column("sample_id")
    w = "s.weight" if all(b == 1 for b in bucket) else f"s.weight * {bucket}[p.bucket_id + 1]"
    seen = (
        "FROM samples s JOIN planned p USING (rid) LEFT JOIN (SELECT rid, count(*) AS n FROM epoch_rows "
        "GROUP BY rid) USING (rid)"
    )
    ((n, ones, entries, most, never, unseen, over),) = db.rows(
        f"SELECT count(*), coalesce(bool_and(w = 1), true), coalesce(sum(n), 0), arg_max([n, rid], [n, -rid]), count(*) "
        f"FILTER (n = 0), min(rid) FILTER (n = 0), arg_min([rid, n, w], rid) FILTER (n > ceil(w) + {pad}) FROM "
        f"(SELECT rid, coalesce(n, 0) AS n, {w} AS w {seen})"
    )
    k, out = m.counts, []
    planned, dropped, padded = k.planned[e], k.dropped[e], k.padded[e]
    if planned != entries:
        out.append(f"{where}: counts.planned {planned} != {entries} plan rows")
    if ones and m.policy == "drop_last":
        if most is not None and most[0] > 1:
            out.append(f"{where}: sample {ids[most[1]]} planned {most[0]} times under drop_last")
        if planned != n - dropped or padded:
            out.append(f"{where}: planned {planned} != accepted {n} - dropped {dropped} (padded {padded})")
    elif ones:
        if never:
            out.append(f"{where}: {never} samples never planned under pad, first {ids[unseen]}")
        if planned != n + padded or dropped:
            out.append(f"{where}: planned {planned} != accepted {n} + padded {padded} (dropped {dropped})")
    elif over is not None:
        out.append(
            f"{where}: sample {ids[over[0]]} planned {int(over[1])} times, more than bucket weight x "
            f"sample weight {over[2]:.6g} allows"
        )
    if held is not None:
        copies = db.table(f"SELECT coalesce(n, 0) AS n {seen} ORDER BY rid").column("n").to_numpy()
        want = repeat_counts(held[0], copies)
        got = m.repeat.realized[e] if m.repeat is not None and e < len(m.repeat.realized) else None
        if not same_counts(got, want):
            out.append(f"{where}: repeat.realized recorded {short(got)}, the plan holds {short(want)}")
    return out


class _Epoch:
    """The checks of one epoch whose every rank file was usable, fed one group at a time."""

    def __init__(
        self, problems: list[str], m: Manifest, cfg: PlanConfig | None, e: int, coverage: list[str]
    ) -> None:
        self.problems, self.m, self.cfg, self.e, self.coverage = problems, m, cfg, e, coverage
        self.broken = False  # a group's rows do not form a plan: the epoch's sums are not checked
        self.owner = np.full(m.steps(e), -1, np.int32)  # the group of each step, as the files hold it
        self.owned: list[NDArray[np.int64]] = []
        self.sums: list = []
        self.breaches: list = []
        self.caps_failed = False  # the memory cap cannot be checked (said once)
        self.top: tuple[float, int, int] | None = None  # --heaviest-first: (peak, its step, its rank)
        self.first: float | None = None  # step 0's peak

    def plan(self, g: int, groups: int, db: Engine) -> tuple[NDArray[np.int64], NDArray[np.int64]] | None:
        """Group ``g``'s plan as the files hold it: (plan (S_g, W, M) of sample rows, its steps in the epoch
        (S_g,)), filled ``BATCH_ROWS`` rows at a time; None when two rows share a slot (a problem)."""
        of = "FROM epoch_rows" + f" WHERE grp = {int(g)}" * (groups > 1)
        steps = np.asarray(db.table(f"SELECT DISTINCT step {of} ORDER BY step")["step"], np.int64)
        ((slots, count),) = db.rows(f"SELECT coalesce(max(slot) + 1, 1), count(*) {of}")
        plan = np.full((steps.size, self.m.world_size, int(slots)), -1, np.int64)
        for t in db.batches(f"SELECT step, rank, slot, rid {of}"):
            step, rank, slot, rid = (t.column(k).to_numpy() for k in ("step", "rank", "slot", "rid"))
            plan[np.searchsorted(steps, step), rank, slot] = rid
        if np.count_nonzero(plan >= 0) == count:
            return plan, steps
        self.problems.append(
            f"epoch {self.e}: two plan rows share one (step, rank, slot), or a row has no sample"
        )
        self.broken = True
        return None

    def group(self, g: int, groups: int, samples: Any, plan: NDArray, steps: NDArray) -> None:
        """Group ``g``: its samples as planned (``row`` (n_g,) ascending), its ``plan``: steps, caps, step
        order and balance sums."""
        m, e, cfg = self.m, self.e, self.cfg
        if groups > 1 and (taken := steps[self.owner[steps] >= 0]).size:
            s = int(taken[0])
            self.problems.append(f"epoch {e} step {s}: holds samples of step groups {self.owner[s]} and {g}")
        self.owner[steps] = g
        self.owned.append(steps)
        # the entries sorted (each search walks its array once) as group sample indexes: after the -1s, its pool
        order = np.argsort(plan, axis=None)
        pool = plan.ravel()[order]
        k = int(np.searchsorted(pool, 0))
        pool[k:] = np.searchsorted(samples.column("row").to_numpy(), pool[k:])
        mine = np.empty_like(pool)
        mine[order] = pool
        del order
        mine, pool = mine.reshape(plan.shape), pool[k:]
        in_pool = np.searchsorted(pool, np.arange(samples.num_rows))[mine]  # each entry's first place in pool
        in_pool[mine < 0] = -1
        step_cost = cfg.step_cost(e) if cfg is not None else m.cost_model.launch_ms or 0.0
        costs = samples.column("cost").to_numpy()[pool]
        self.sums.append(plan_sums(in_pool, costs, m.batch_size, None, m.rank_speed, step_cost))
        del in_pool, pool, costs
        if cfg is not None:
            lines: list[str] = []
            values = cap_values(lines, e, cfg.caps, samples)
            if not self.caps_failed:
                self.problems.extend(lines)
            self.caps_failed |= bool(lines)
            self.breaches += group_breaches(mine, steps, cfg.caps, values)
            self._heaviest(cfg, mine, steps, values)

    def _heaviest(self, cfg: PlanConfig, plan: NDArray, steps: NDArray, caps: CapValues) -> None:
        """``--heaviest-first``: the epoch's heaviest rank-step so far (``order.step_peaks``) and step 0's, by the
        group's ``cap_values`` the mode names."""
        values = dict(zip(("cost", "points", "memory"), caps, strict=True)).get(cfg.heaviest_first)
        if values is None or not plan.shape[0]:
            return
        peaks = step_peaks(plan, values)
        k = int(np.argmax(peaks))
        top, step = float(peaks[k]), int(steps[k])
        if self.top is None or top > self.top[0] or (top == self.top[0] and step < self.top[1]):
            self.top = (top, step, int(np.argmax(rank_step_sums(plan[k : k + 1], values)[0])))
        if (at := np.flatnonzero(steps == 0)).size:
            self.first = float(peaks[int(at[0])])

    def finish(self, derived: Derived) -> None:
        """After every group: caps, step order, coverage, balance (within 1e-6) and the groups' steps."""
        m, e, problems = self.m, self.e, self.problems
        report_breaches(problems, e, self.breaches, m.plan_file)
        mode = self.cfg.heaviest_first if self.cfg is not None else "off"
        if m.steps(e) > 1 and self.top is not None and self.first is not None:
            (top, k, r), first = self.top, self.first
            if top - first > (0 if mode == "points" else 1e-9 * max(abs(top), 1.0)):  # sums may round
                problems.append(
                    f"{m.plan_file(e, r)}: epoch {e} step {k} rank {r}: {top:.6g} {mode} is more than step 0's "
                    f"heaviest rank-step ({first:.6g}), but the manifest records heaviest_first {mode}: step 0 "
                    "must hold the epoch's heaviest rank-step"
                )
        problems.extend(self.coverage)
        again: dict = balance_entry(self.sums, e)
        for key in ("random_linearity", "random_speed_linearity"):  # the files hold no random plan
            again.pop(key, None)
            known = key != "random_speed_linearity" or m.balance[e].value(key) is not None
            if derived.stats is not None and key in derived.stats and known:
                again[key] = derived.stats[key]
        for key, value in again.items():
            rec = m.balance[e]
            got = getattr(rec, key) if key in ("epoch", "steps", "max_count") else rec.value(key)
            if got is None or not abs(got - value) <= 1e-6:
                problems.append(f"epoch {e}: balance.{key} recorded {got}, recomputed {value:.6f}")
        labels = derived.labels()
        if labels is not None and derived.groups > 1:
            check_steps(problems, m, e, labels, self.owned)


def check_epoch_files(
    problems: list[str],
    read_plans: ReadPlans,
    m: Manifest,
    cfg: PlanConfig | None,
    e: int,
    samples: Samples,
    held: tuple | None,
    pairs: PairRepeat | None,
) -> int:
    """Epoch ``e``'s plan files checked and its plan re-derived with ``cfg`` (None: not valid, said) group by
    group; epochs 0 and 1 go to ``pairs``. Returns the epoch's plan rows."""
    cfg = planned_values(problems, samples, e, cfg)
    groups = cfg.groups(samples.num_rows) if cfg is not None else m.groups
    seed, db = cfg.seed if cfg is not None else m.seed, samples.db
    if groups > 1:
        samples.deal(seed, e, groups)
    rows, usable = _load(problems, read_plans, m, e, db)
    usable -= _check_rows(problems, m, e, db)  # a file whose costs or buckets are not its samples' stops here
    keep = f"rank IN ({', '.join(map(str, sorted(usable))) or -1})"
    # G > 1: each row's step group, joined in a statement of its own (beside the samples' join, 10M did not spill)
    if groups > 1:
        select = f"SELECT epoch_rows.*, grp FROM epoch_rows JOIN dealt USING (rid) WHERE {keep}"
        db.run(f"CREATE OR REPLACE TABLE epoch_rows AS {select}")
    else:
        db.run(f"DELETE FROM epoch_rows WHERE NOT {keep}")
    derived, epoch = Derived(problems, m, cfg, e, groups), None
    if len(usable) == m.world_size:
        _check_counts(problems, m, e, db)
        epoch = _Epoch(problems, m, cfg, e, _coverage(m, e, samples, held))
    for g in range(groups):  # the files' side first: only its plan (8 B an entry) waits for the planner's
        files = epoch.plan(g, groups, db) if epoch is not None and not epoch.broken else None
        group = samples.group(g, seed, e, groups)  # its queries run while only the plan is held
        group = group if cfg is None else as_planned(group, e, cfg)
        with db.lean():  # the numpy checks and the planner: DuckDB gives back its cached pages meanwhile
            if epoch is not None and files is not None:
                epoch.group(g, groups, group, *files)
                release_memory()
            planned = derived.group(g, group)
        del group
        if pairs is not None:
            pairs.add(e, g, groups, planned)
        if planned is not None and files is not None:
            check_replan(
                problems, m, e, files[0], planned[0], files[1], samples, f" step group {g}" * (groups > 1)
            )
        del planned, files
        release_memory()
    db.run("DROP TABLE epoch_rows")
    if epoch is not None and not epoch.broken:
        epoch.finish(derived)
    derived.check_counts()
    return rows

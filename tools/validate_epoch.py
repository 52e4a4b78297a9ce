"""One epoch of ``lidarshard validate``: its plan files as a DuckDB table, checked one step group at a time.

    for each rank file:   its structure (``planfiles.plan_problem``, the readers' rule), then its rows into
                          ``plan_rows`` a batch at a time (the numbers, sample_id, ``validate_db.ROW_KEY`` of the paths)
    queries:              each row joined to its sample (``rid``) by sample_id: an unknown id or a path that
                          differs is named, first per file, and the file not checked further; then its cost and
                          bucket id against its sample's as planned (``planned``: ``planner.as_planned``); the
                          rows of each rank-step and step (batch_size, rank_count, global_count)
    for each group g:     its plan filled from its rows, its caps, coverage and balance sums; re-derived alone
                          (``validate_derived.Derived``, DuckDB lean meanwhile) and checked against it
    then:                 the interleave of the groups' steps, the step order under --heaviest-first,
                          the balance entry (``metrics.balance_entry``) against the manifest

A group's rows are those whose sample the build's rule deals to it (``groups.deal`` from the recorded seed
and G: the table ``dealt``); G = 1 is the same path with one group (planned by ``plan_samples``).
Problems are ``"<where>: <what>"`` lines naming file, epoch, rank, step and slot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.loaders.planfiles import plan_problem
from lidarshard.schemas.manifest import Manifest
from lidarshard.tools.validate_db import ROW_KEY, Engine
from lidarshard.tools.validate_derived import (
    Derived,
    PairRepeat,
    check_derived_counts,
    check_replan,
    check_steps,
)
from lidarshard.tools.validate_plan import (
    Coverage,
    Heaviest,
    cap_values,
    check_balance,
    file_sums,
    group_breaches,
    heaviest_values,
    local_rows,
    report_breaches,
)
from lidarshard.tools.validate_samples import Samples
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.planner import as_planned
from lidarshard.transforms.io.arrow import release_memory

__all__ = ["check_epoch_files"]

#: ``read_plans(rels)``: for each of ``rels`` there at its recorded size, in order: (rel, its columns but
#: sweep_paths, None) when it is usable (its bytes as recorded, its schema the contract's), then (rel, None, its
#: next rows) to its end; (rel, None, None) and a problem said when it is not (at once or midway).
ReadPlans = Callable[[Sequence[str]], Iterator[tuple[str, pa.Table | None, pa.Table | None]]]


def _add(problems: list[str], where: str, what: str) -> None:
    problems.append(f"{where}: {what}")


def _load(
    problems: list[str], read_plans: ReadPlans, m: Manifest, e: int, db: Engine
) -> tuple[int, set[int]]:
    """Epoch ``e``'s rank files checked one at a time and their rows joined to their samples in the table
    ``rows`` -> (plan rows read, the ranks whose every row has its sample and its sample's paths)."""
    count, usable = 0, set()
    insert = f"SELECT 0 AS rank, step, slot, rank_count, global_count, cost, bucket_id, sample_id, {ROW_KEY} AS rkey FROM t"
    db.run(f"CREATE OR REPLACE TABLE plan_rows AS {insert} LIMIT 0", t=schemas.plan_schema().empty_table())
    ranks = {m.plan_file(e, r): r for r in range(m.world_size)}
    for rel, head, rows in read_plans(list(ranks)):
        r = ranks[rel]
        if rows is not None:
            if r in usable:
                db.run(f"INSERT INTO plan_rows {insert.replace('0 AS rank', str(r), 1)}", t=rows)
        elif head is None:  # not usable (said): none of its rows
            if r in usable:
                usable.discard(r)
                db.run("DELETE FROM plan_rows WHERE rank = ?", [r])
        else:
            count += head.num_rows
            problem = plan_problem(head, e, r, m.steps(e), None if m.variable_count else m.batch_size)
            if problem is not None:
                _add(problems, rel, problem)
            else:
                usable.add(r)
        del head, rows
    db.run("CREATE OR REPLACE TABLE epoch_rows AS SELECT p.rank, p.step, p.slot, p.rank_count, p.global_count, "
           "p.cost, p.bucket_id, s.rid, p.rkey = s.rkey AS same, "
           "CASE WHEN s.rid IS NULL THEN p.sample_id END AS unknown "
           "FROM plan_rows p LEFT JOIN samples s USING (sample_id)")  # fmt: skip
    db.run("DROP TABLE plan_rows")
    first = db.rows("SELECT rank, step, slot, unknown, rid FROM epoch_rows WHERE rid IS NULL OR NOT same QUALIFY "
                    "row_number() OVER (PARTITION BY rank ORDER BY rid IS NULL DESC, step, slot) = 1 ORDER BY rank")  # fmt: skip
    ids = db.rows  # the ids of the samples whose paths differ, for the messages
    for r, step, slot, unknown, rid in first:
        where = f"{m.plan_file(e, r)}: epoch {e} rank {r} step {step} slot {slot}"
        if rid is None:
            _add(problems, where, f"sample_id {unknown} is not in the samples")
        else:
            sid = ids("SELECT sample_id FROM samples WHERE rid = ?", [rid])[0][0]
            _add(problems, where, f"path or sweep_paths of {sid} differs from the samples")
        usable.discard(r)
    _keep(db, usable)
    return count, usable


def _keep(db: Engine, ranks: set[int]) -> None:
    """Drop the rows of every rank file but ``ranks``."""
    keep = f" WHERE rank NOT IN ({', '.join(map(str, sorted(ranks)))})" if ranks else ""
    db.run(f"DELETE FROM epoch_rows{keep}")


def _of_group(g: int, groups: int) -> str:
    """The clause that keeps group ``g``'s rows of ``epoch_rows`` (none when the epoch is one group)."""
    return "" if groups == 1 else f" JOIN dealt USING (rid) WHERE grp = {int(g)}"


def _files_plan(db: Engine, g: int, groups: int, w: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Group ``g``'s plan as the rank files hold it -> (its plan (S_g, W, M) of sample rows, its steps in the
    epoch (S_g,)), filled from its rows ``BATCH_ROWS`` at a time (no row is held).

    Raises:
        ValueError: two rows in one slot (the rank files' own structure is checked before: ``plan_problem``).
    """
    steps = db.arrays(f"SELECT DISTINCT step FROM epoch_rows{_of_group(g, groups)} ORDER BY step")["step"]
    steps = steps.astype(np.int64)
    ((slots, count),) = db.rows(
        f"SELECT coalesce(max(slot) + 1, 1), count(*) FROM epoch_rows{_of_group(g, groups)}"
    )
    plan = np.full((steps.size, w, int(slots)), -1, np.int64)
    for t in db.batches(f"SELECT step, rank, slot, rid FROM epoch_rows{_of_group(g, groups)}"):
        step, rank, slot, rid = (t.column(k).to_numpy() for k in ("step", "rank", "slot", "rid"))
        plan[np.searchsorted(steps, step), rank, slot] = rid
    if np.count_nonzero(plan >= 0) != count:
        raise ValueError("two plan rows share one (step, rank, slot), or a row has no sample")
    return plan, steps


def _planned(group: pa.Table, e: int, cfg: PlanConfig | None) -> Any:
    """A group's samples as epoch ``e`` is planned (``as_planned``; as they are when ``cfg`` is None)."""
    return group if cfg is None else as_planned(group, e, cfg)


class _Epoch:
    """The checks of one epoch whose every rank file was usable, fed one group at a time."""

    def __init__(self, problems: list[str], m: Manifest, cfg: PlanConfig | None, e: int,
                 held: tuple | None) -> None:  # fmt: skip
        self.problems, self.m, self.cfg, self.e = problems, m, cfg, e
        self.broken = False  # a group's rows do not form a plan: the epoch's sums are not checked
        self.owner = np.full(m.steps(e), -1, np.int32)  # the group of each step, as the files hold it
        self.owned: list[NDArray[np.int64]] = []
        self.sums: list = []
        self.breaches: list = []
        self.caps_failed = False  # the memory cap cannot be checked (said once)
        self.coverage = Coverage(m, held)
        self.model = None if cfg is None or cfg.caps.memory is None else cfg.caps.memory.model
        self.heaviest = Heaviest("off" if cfg is None else cfg.heaviest_first)

    def plan(self, g: int, groups: int, db: Engine) -> tuple[NDArray[np.int64], NDArray[np.int64]] | None:
        """Group ``g``'s ``_files_plan``, or None when its rows do not form a plan (a problem; the epoch's sums
        are then not checked)."""
        try:
            return _files_plan(db, g, groups, self.m.world_size)
        except ValueError as err:
            _add(self.problems, f"epoch {self.e}", str(err))
            self.broken = True
            return None

    def group(
        self, g: int, groups: int, samples: Any, plan: NDArray[np.int64], steps: NDArray[np.int64]
    ) -> None:
        """Group ``g``: its samples ``samples`` (``Samples.group`` as planned), its plan (S_g, W, M) of sample
        rows as the files hold it and its steps in the epoch (S_g,) (``plan``): its steps, coverage, caps,
        step order and balance sums."""
        m, e, problems = self.m, self.e, self.problems
        if groups > 1:
            taken = self.owner[steps]
            if (taken >= 0).any():
                s = int(steps[np.flatnonzero(taken >= 0)[0]])
                _add(problems, f"epoch {e} step {s}", f"holds samples of step groups {self.owner[s]} and {g}")
            self.owner[steps] = g
        self.owned.append(steps)
        self.coverage.add(samples, plan[plan >= 0])
        # the plan over the group's samples: entries index its columns (its rows are ascending)
        mine = local_rows(samples.column("row").to_numpy(), plan)
        mine[plan < 0] = -1
        if self.cfg is not None:
            lines: list[str] = []
            values = cap_values(lines, e, self.cfg.caps, samples)
            if not self.caps_failed:
                for line in lines:
                    problems.append(line)
            self.caps_failed |= bool(lines)
            self.breaches += group_breaches(mine, steps, self.cfg.caps, values)
            self.heaviest.add(mine, steps, heaviest_values(self.cfg.heaviest_first, samples, self.model))
        costs = samples.column("cost").to_numpy()
        step_cost = self.cfg.step_cost(e) if self.cfg is not None else m.cost_model.launch_ms or 0.0
        self.sums.append(file_sums(mine, costs, m.batch_size, m.rank_speed, step_cost))

    def finish(self, derived: Derived, samples: Samples) -> None:
        """After every group: what needs the whole epoch's few numbers (``samples``: to name one)."""
        m, e, problems = self.m, self.e, self.problems
        report_breaches(problems, e, self.breaches, m.plan_file)
        self.heaviest.check(problems, e, m.steps(e), m.plan_file)
        self.coverage.check(problems, m, e, samples)
        check_balance(problems, m, e, self.sums, derived.stats)
        labels = derived.labels()
        if labels is not None and derived.groups > 1:
            check_steps(problems, m, e, labels, self.owned)


def _planned_values(
    problems: list[str], samples: Samples, e: int, cfg: PlanConfig | None
) -> PlanConfig | None:
    """The view ``planned`` (rid, cost, bucket_id): each sample's values as epoch ``e`` is planned
    (``as_planned`` a chunk at a time into the table ``recosted``; the samples' own when no re-plan recosts
    it) -> ``cfg``, or None when those costs cannot be recomputed (a problem)."""
    db, own = samples.db, "CREATE OR REPLACE VIEW planned AS SELECT rid, cost, bucket_id FROM samples"
    if cfg is None or cfg.planned_with(e) is None:
        db.run(own)
        return cfg
    db.run("CREATE OR REPLACE TABLE recosted (rid BIGINT, cost DOUBLE, bucket_id BIGINT)")
    db.run("CREATE OR REPLACE VIEW planned AS SELECT * FROM recosted")
    try:
        for start, chunk in samples.chunks():
            again = as_planned(chunk, e, cfg)
            ids = np.asarray(again.column("bucket_id").to_numpy(), np.int64)
            part = pa.table({"rid": np.arange(start, start + chunk.num_rows), "cost": again.column("cost").to_numpy(), "bucket_id": ids})  # fmt: skip
            db.run("INSERT INTO recosted SELECT * FROM part", part=part)
    except ValueError as err:
        _add(problems, f"epoch {e}", f"the costs of cost_history cannot be recomputed: {err}")
        db.run(own)
        return None
    return cfg


def _values(problems: list[str], m: Manifest, e: int, db: Engine) -> set[int]:
    """Each plan row's cost and bucket_id against its sample's as planned (``planned``): one line for each
    rank file whose rows differ (its first row, in (step, slot) order, whose cost differs, else whose
    bucket_id does) -> those ranks."""
    bad = db.rows(
        "SELECT rank, step, slot, name, s.sample_id FROM (SELECT r.rank, r.step, r.slot, r.rid, CASE WHEN "
        "r.cost IS DISTINCT FROM p.cost THEN 'cost' ELSE 'bucket_id' END AS name FROM epoch_rows r JOIN planned p "
        "USING (rid) WHERE r.cost IS DISTINCT FROM p.cost OR r.bucket_id IS DISTINCT FROM p.bucket_id) JOIN "
        "samples s USING (rid) QUALIFY row_number() OVER (PARTITION BY rank ORDER BY name = 'bucket_id', step, "
        "slot) = 1 ORDER BY rank"
    )
    for r, step, slot, name, sid in bad:
        _add(problems, f"{m.plan_file(e, r)}: epoch {e} rank {r} step {step} slot {slot}",
             f"{name} of {sid} differs from the samples")  # fmt: skip
    return {r for r, *_ in bad}


def _check_counts(problems: list[str], m: Manifest, e: int, db: Engine) -> None:
    """Every rank-step holds ``batch_size`` rows (equal-count strategies); ``rank_count`` and ``global_count``
    of every plan row against the rows its rank-step and its step hold: the first row (in (rank, step, slot)
    order) that differs, once per column."""
    if not m.variable_count:
        odd = db.rows("SELECT count(*) AS n FROM epoch_rows GROUP BY step, rank HAVING n <> ? ORDER BY step, rank "
                      "LIMIT 1", [m.batch_size])  # fmt: skip
        for (n,) in odd:
            _add(problems, f"epoch {e}", f"a rank-step holds {n} samples, batch_size is {m.batch_size}")
    for name, want in (("rank_count", "n"), ("global_count", "sum(n) OVER (PARTITION BY step)")):
        got = db.rows(
            f"WITH c AS (SELECT step, rank, n, {want} AS want FROM (SELECT step, rank, count(*) AS n FROM "
            f"epoch_rows GROUP BY step, rank)) SELECT rank, step, {name}, want FROM epoch_rows JOIN c USING "
            f"(step, rank) WHERE {name} <> want ORDER BY rank, step, slot LIMIT 1"
        )
        for r, step, value, count in got:
            _add(
                problems,
                f"{m.plan_file(e, r)}: epoch {e} rank {r} step {step}",
                f"{name} {value}, the plan holds {count}",
            )


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
    """Epoch ``e``'s plan files checked and its plan re-derived with the recorded settings ``cfg`` (None:
    not valid, reported) group by group; epochs 0 and 1's groups go to ``pairs``. Returns the epoch's plan
    rows."""
    cfg = _planned_values(problems, samples, e, cfg)
    groups = cfg.groups(samples.num_rows) if cfg is not None else m.groups
    seed = cfg.seed if cfg is not None else m.seed
    w, db = m.world_size, samples.db
    if groups > 1:
        samples.deal(seed, e, groups)
    rows, usable = _load(problems, read_plans, m, e, db)
    usable -= _values(problems, m, e, db)  # a file whose costs or buckets are not its samples' stops there
    _keep(db, usable)
    derived = Derived(problems, m, cfg, e, groups)
    epoch = None
    if len(usable) == w:
        _check_counts(problems, m, e, db)
        epoch = _Epoch(problems, m, cfg, e, held)
    _groups(problems, m, e, cfg, samples, (seed, groups), epoch, derived, pairs)
    db.run("DROP TABLE epoch_rows")
    if epoch is not None and not epoch.broken:
        epoch.finish(derived, samples)
    if derived.stats is not None:
        check_derived_counts(problems, m, e, derived.stats)
    return rows


def _groups(problems: list[str], m: Manifest, e: int, cfg: PlanConfig | None, samples: Samples,
            dealt: tuple[int, int], epoch: _Epoch | None, derived: Derived, pairs: PairRepeat | None) -> None:  # fmt: skip
    """Each group of epoch ``e``: its plan rows checked (``epoch``, when every rank file is usable) and against
    the plan ``derived`` re-derives (epochs 0 and 1 go to ``pairs``)."""
    (seed, groups), db = dealt, samples.db
    for g in range(groups):  # the files' side first: only its plan (8 B an entry) waits for the planner's
        group = _planned(samples.group(g, seed, e, groups), e, cfg)
        held_plan = epoch.plan(g, groups, db) if epoch is not None and not epoch.broken else None
        with db.lean():  # the numpy checks and the planner: DuckDB gives back its cached pages meanwhile
            if epoch is not None and held_plan is not None:
                epoch.group(g, groups, group, *held_plan)
                release_memory()
            planned = derived.group(g, group)
        del group
        if pairs is not None:
            pairs.add(e, g, groups, planned)
        if planned is not None and held_plan is not None:
            where = f" step group {g}" * (groups > 1)
            check_replan(problems, m, e, held_plan[0], planned[0], held_plan[1], samples, where)
        del planned, held_plan
        release_memory()

"""One epoch of ``lidarshard validate``, one step group at a time: its peak is one group's samples and
plan, not the epoch's.

    for each rank file:   stream it (its path columns a row group at a time: row keys), check its rows
                          (``validate_files.check_plan``, ``validate_plan.lookup``), park their numbers
                          by the step group of their sample (``groups.deal``: the build's rule, from the
                          recorded seed and G) in a temporary directory (``scratch.spill_path``)
    for each group g:     its samples (``SamplesView.group``, as planned: ``epochs.as_planned``) against
                          its parked rows' costs and bucket ids (``validate_plan.Values``)
    for each group g:     re-derive it alone (``validate_derived.Derived``), read its samples and parked
                          rows back, check them against it, the counts, caps and coverage, add its
                          balance sums
    then:                 the interleave of the groups' steps, the step order under --heaviest-first,
                          the combined balance (``group_stats.combine``) against the manifest

Nothing of the epoch's N samples is held: a group's samples index its plan by their position (``row``
is ascending), so every value check reads one group's columns.

G = 1 is the same path with one group (planned by ``plan_samples``, the single pool's plan). Pure
pyarrow/numpy; problems are ``"<where>: <what>"`` lines naming file, epoch, rank, step and slot.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from lidarshard.schemas.manifest import Manifest
from lidarshard.tools.validate_derived import (
    Derived,
    PairRepeat,
    check_derived_counts,
    check_replan,
    check_steps,
)
from lidarshard.tools.validate_files import check_plan, unreadable
from lidarshard.tools.validate_plan import (
    KEY_ROWS,
    Coverage,
    Heaviest,
    Values,
    cap_values,
    check_balance,
    check_counts,
    file_row_keys,
    file_sums,
    group_breaches,
    heaviest_values,
    lookup,
    rank_rows,
    report_breaches,
)
from lidarshard.tools.validate_samples import SamplesView
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.epochs import as_planned
from lidarshard.transforms.core.groups import deal
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import release_memory
from lidarshard.transforms.io.scratch import read_columns, spill_path, write_columns
from lidarshard.transforms.plan.dense import dense_plan

__all__ = ["check_epoch_files"]

#: ``open_plan(rel)``: the plan file ``rel`` opened for streaming when it is usable, else None.
OpenPlan = Callable[[str], AbstractContextManager[pq.ParquetFile | None]]
_PATHS = ("path", "sweep_paths")


def _add(problems: list[str], where: str, what: str) -> None:
    problems.append(f"{where}: {what}")


def _rank_rows(
    problems: list[str], file: pq.ParquetFile, rel: str, e: int, r: int, m: Manifest, samples: SamplesView
) -> dict[str, NDArray] | None:
    """Rank ``r``'s plan file checked (its numbers read whole, N/W rows; its paths streamed) -> its
    ``rank_rows`` plus ``rank`` and ``group_key`` (of each row's sample), or None when it is not usable (a problem)."""
    t = file.read(columns=[n for n in file.schema_arrow.names if n not in _PATHS], use_threads=False)
    batches = file.iter_batches(batch_size=KEY_ROWS, columns=["path"], use_threads=False)
    nulls = {"path": sum(b.column(0).null_count for b in batches)}
    per_step = None if m.variable_count else m.batch_size
    if not check_plan(problems, rel, t, e, r, m.steps(e), per_step, nulls):
        return None
    found = lookup(problems, rel, e, r, t, samples, lambda: file_row_keys(file))
    if found is None:
        return None
    rows = rank_rows(t, found.rows, samples.num_rows)
    rows["rank"] = np.full(found.rows.size, r, np.int32)
    rows["group_key"] = found.group_keys
    return rows


def _spill(
    problems: list[str],
    open_plan: OpenPlan,
    m: Manifest,
    e: int,
    samples: SamplesView,
    dealt: tuple[int, int],
    work: str,
) -> tuple[int, NDArray[np.int32], int]:
    """Epoch ``e``'s rank files checked one at a time, their rows parked by the step group of their
    sample (``groups.deal`` with ``dealt`` (seed, G)) -> (plan rows read, rows per rank-step (S, W),
    usable files)."""
    w, steps = m.world_size, m.steps(e)
    counts = np.zeros((steps, w), np.int32)
    rows = usable = 0
    for r in range(w):
        rel = m.plan_file(e, r)
        got = None
        with open_plan(rel) as file:
            if file is None:
                continue
            rows += file.metadata.num_rows
            try:
                got = _rank_rows(problems, file, rel, e, r, m, samples)
            except (pa.ArrowException, OSError) as err:
                _add(problems, rel, unreadable(err))
        if got is None:
            continue
        usable += 1
        counts[:, r] = np.bincount(got["step"], minlength=steps)[:steps]
        group = deal(got.pop("group_key"), dealt[0], e, dealt[1])
        for g in np.unique(group).tolist():
            at = np.flatnonzero(group == g)
            write_columns(spill_path(work, e, g, r), {k: v[at] for k, v in got.items()})
        del got, group
        release_memory()
    return rows, counts, usable


def _parked(work: str, e: int, g: int, w: int) -> dict[str, NDArray]:
    """Group ``g``'s parked rows of every rank, rank-major (each rank's in (step, slot) order)."""
    parts = []
    for r in range(w):
        path = spill_path(work, e, g, r)
        if storage.exists(path):
            parts.append(read_columns(path))
    names = ("step", "slot", "rank_count", "global_count", "row", "rank", "cost", "bucket_id")
    return {k: np.concatenate([p[k] for p in parts]) if parts else np.empty(0, np.int32) for k in names}


def _planned(group: pa.Table, e: int, cfg: PlanConfig | None) -> Any:
    """A group's samples as epoch ``e`` is planned (``as_planned``; as they are when ``cfg`` is None)."""
    return group if cfg is None else as_planned(group, e, cfg)


class _Epoch:
    """The checks of one epoch whose every rank file was usable, fed one group at a time."""

    def __init__(self, problems: list[str], m: Manifest, cfg: PlanConfig | None, e: int,
                 held: tuple | None, counts: NDArray[np.int32]) -> None:  # fmt: skip
        self.problems, self.m, self.cfg, self.e = problems, m, cfg, e
        self.counts = counts  # (S, W) rows per rank-step
        self.broken = False  # a group's rows do not form a plan: the epoch's sums are not checked
        self.skip: set[str] = set()
        self.owner = np.full(counts.shape[0], -1, np.int32)  # the group of each step, as the files hold it
        self.owned: list[NDArray[np.int64]] = []
        self.sums: list = []
        self.breaches: list = []
        self.caps_failed = False  # the memory cap cannot be checked (said once)
        self.coverage = Coverage(m, held)
        self.model = None if cfg is None or cfg.caps.memory is None else cfg.caps.memory.model
        self.heaviest = Heaviest("off" if cfg is None else cfg.heaviest_first)

    def group(
        self, g: int, groups: int, samples: Any, rows: dict
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]] | None:
        """Group ``g``: its samples ``samples`` (``SamplesView.group`` as planned), its parked plan rows
        ``rows`` (emptied) -> (its plan (S_g, W, M) of sample rows as the files hold it, its steps in the
        epoch (S_g,)), or None when its rows do not form a plan (a problem; the epoch's sums are then not
        checked)."""
        m, e, problems = self.m, self.e, self.problems
        steps = np.unique(rows["step"]).astype(np.int64)  # its steps in the epoch, in order
        try:
            local = np.searchsorted(steps, rows["step"])
            plan = dense_plan(local, rows["rank"], rows["slot"], rows["row"], steps.size, m.world_size)
        except ValueError as err:
            _add(problems, f"epoch {e}", str(err))
            self.broken = True
            return None
        del local
        if groups > 1:
            taken = self.owner[steps]
            if (taken >= 0).any():
                s = int(steps[np.flatnonzero(taken >= 0)[0]])
                _add(problems, f"epoch {e} step {s}", f"holds samples of step groups {self.owner[s]} and {g}")
            self.owner[steps] = g
        self.owned.append(steps)
        check_counts(problems, e, rows, self.counts, m.plan_file, self.skip)
        self.coverage.add(samples, rows["row"])
        rows.clear()  # the parked rows are in ``plan`` now
        # the plan over the group's samples: entries index its columns (its rows are ascending)
        mine = np.searchsorted(samples.column("row").to_numpy(), plan)
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
        return plan, steps

    def finish(self, derived: Derived, samples: SamplesView) -> None:
        """After every group: what needs the whole epoch's few numbers (``samples``: to name one)."""
        m, e, problems = self.m, self.e, self.problems
        b = None if m.variable_count else m.batch_size
        if b is not None and (self.counts != b).any():
            _add(
                problems,
                f"epoch {e}",
                f"a rank-step holds {self.counts[self.counts != b][0]} samples, batch_size is {b}",
            )
        report_breaches(problems, e, self.breaches, m.plan_file)
        self.heaviest.check(problems, e, self.counts.shape[0], m.plan_file)
        self.coverage.check(problems, m, e, samples)
        check_balance(problems, m, e, self.sums, derived.stats)
        labels = derived.labels()
        if labels is not None and derived.groups > 1:
            check_steps(problems, m, e, labels, self.owned)


def check_epoch_files(
    problems: list[str],
    open_plan: OpenPlan,
    m: Manifest,
    cfg: PlanConfig | None,
    e: int,
    samples: SamplesView,
    held: tuple | None,
    last: bool,
    work: str,
    pairs: PairRepeat | None,
) -> int:
    """Epoch ``e``'s plan files checked and its plan re-derived with the recorded settings ``cfg`` (None:
    not valid, reported) group by group, parking in ``work`` (a temporary directory); epochs 0 and 1's
    groups go to ``pairs``. After the ``last`` epoch's files the view's keys are dropped. Returns the
    epoch's plan rows."""
    if cfg is not None and cfg.planned_with(e) is not None:  # recomputed costs plan it: can they be?
        try:
            for _, chunk in samples.chunks():
                as_planned(chunk, e, cfg)
        except ValueError as err:
            _add(problems, f"epoch {e}", f"the costs of cost_history cannot be recomputed: {err}")
            cfg = None
    groups = cfg.groups(samples.num_rows) if cfg is not None else m.groups
    seed = cfg.seed if cfg is not None else m.seed
    w = m.world_size
    rows, counts, usable = _spill(problems, open_plan, m, e, samples, (seed, groups), work)
    if last:
        samples.drop_keys()
    values = Values()
    for g in range(groups):  # a file whose costs or buckets are not its samples' is not checked further
        values.add(_parked(work, e, g, w), _planned(samples.group(g, seed, e, groups), e, cfg))
        release_memory()
    usable -= len(values.report(problems, m, e, samples))
    derived = Derived(problems, m, cfg, e, groups)
    epoch = _Epoch(problems, m, cfg, e, held, counts) if usable == w else None
    for g in range(groups):  # the files' side first: only its plan (8 B an entry) waits for the planner's
        group = _planned(samples.group(g, seed, e, groups), e, cfg)
        held_plan = None
        if epoch is not None and not epoch.broken:
            held_plan = epoch.group(g, groups, group, _parked(work, e, g, w))
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
    shutil.rmtree(storage.local_path(storage.join(work, "spill", f"epoch-{e}")), ignore_errors=True)
    if epoch is not None and not epoch.broken:
        epoch.finish(derived, samples)
    if derived.stats is not None:
        check_derived_counts(problems, m, e, derived.stats)
    return rows

"""Elastic world size: continue an epoch at a different number of ranks, balanced, nothing lost.

A job planned for ``W`` ranks restarts on ``W'`` (a node died, 16 -> 8 GPUs; or it grows back).
Every rank re-derives the same new plan in-process from the manifest, in seconds for 1M samples:

* the steps already finished by all ranks (``consumed_steps``) stay consumed;
* the remaining entries of the epoch are redistributed over ``W'`` ranks of ``B'`` slots:

  - **merge** when ``W'`` divides ``W``: new rank ``r'`` takes old ranks ``r'k .. r'k+k-1``
    (``k = W / W'``) of every step. With ``B' = k*B`` (the default: global batch unchanged) their
    batches are concatenated; with ``B' = B`` their batches run one after another (``k`` times the
    steps). Each old rank was balanced against the others of its step, so a merged plan's
    linearity is never below the original's over the same steps. No randomness, nothing dropped.
  - **re-plan** otherwise: the remaining entries are planned again with the manifest's strategy
    (``lidarshard.transforms.plan.plan_epoch``) for ``W' x B'``. They are first fitted to whole steps of
    ``W'*B'`` with the manifest's policy (``lidarshard.transforms.features.buckets.fit_pool``): ``drop_last`` leaves
    out fewer than ``W'*B'`` entries, ``pad`` repeats as many; both are recorded on the plan.
  - a ``budget`` manifest (variable counts per rank-step, ``-1`` pads in ``rows``) is always re-planned
    with ``budget`` on any new size: nothing is dropped or padded, the mean count stays ``B'``.

The result of any chain of switches is a pure function of the manifest, the epoch and the
switch history ``[(consumed_steps, W', B'), ...]``, which is small and JSON-able: store it in the
checkpoint (:meth:`ElasticBatchSampler.state_dict`) and every later restart reproduces the plan.

Pure numpy/pyarrow; imports neither Beam nor torch. :class:`ElasticBatchSampler` yields plain
lists of ints, which ``torch.utils.data.DataLoader(batch_sampler=...)`` accepts as is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds
from numpy.typing import NDArray

from lidarshard.loaders.position import Position, caller_self
from lidarshard.loaders.reader import PathLike, load_manifest, plan_dataset, read_samples
from lidarshard.transforms.features.buckets import fit_pool
from lidarshard.transforms.plan import STRATEGIES, VARIABLE_COUNT, plan_epoch
from lidarshard.transforms.plan.metrics import bound_linearity, linearity

__all__ = ["ElasticPlan", "ElasticBatchSampler", "load_epoch_plan", "merge_ranks", "replan_remaining"]

#: One switch: after ``consumed_steps`` steps of the current plan, continue on ``(W', B')``.
Switch = tuple[int, int, int]


def merge_ranks(
    rows: NDArray[np.int64], world_size: int, *, keep_batch_size: bool = False
) -> NDArray[np.int64]:
    """Fold ``W`` ranks onto ``W'`` (a divisor of ``W``): new rank ``r'`` takes old ranks ``r'k..r'k+k-1``.

    Args:
        rows: (S, W, B) plan of any ids.
        world_size: W' with ``W % W' == 0``; ``k = W / W'``.
        keep_batch_size: False: concatenate the k batches, (S, W', k*B), global batch unchanged.
            True: run them one after another, (k*S, W', B), step ``s*k + j`` holding old rank
            ``r'k + j`` of step ``s`` on rank ``r'``.

    Returns:
        The merged plan, a rearrangement of ``rows`` (same multiset, steps stay in order).
    """
    s, w, b = rows.shape
    if world_size < 1 or w % world_size:
        raise ValueError(f"world_size {world_size} does not divide the plan's {w} ranks")
    k = w // world_size
    rows = np.ascontiguousarray(rows)
    if not keep_batch_size:
        return rows.reshape(s, world_size, k * b)
    return rows.reshape(s, world_size, k, b).transpose(0, 2, 1, 3).reshape(s * k, world_size, b)


def _seed(*parts: int) -> int:
    """A stable 63-bit seed from ints (sha256, never ``hash()``): same on every rank and run."""
    digest = hashlib.sha256("/".join(str(int(p)) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _minus(a: NDArray[np.int64], b: NDArray[np.int64], n: int) -> NDArray[np.int64]:
    """Multiset ``a - b`` over ids in ``[0, n)`` (entries of b missing from a are ignored), sorted."""
    diff = np.bincount(a, minlength=n) - np.bincount(b, minlength=n)
    return np.repeat(np.arange(n, dtype=np.int64), np.maximum(diff, 0))


@dataclass(frozen=True, eq=False)
class ElasticPlan:
    """The rest of one epoch on the current world size, with the accounting of what came before.

    ``rows`` index the samples' rows (the default dataset order). Invariant: the multiset
    ``consumed + rows + dropped - padded`` equals the manifest's plan of the epoch.

    Attributes:
        rows: (S, W, B) int64 samples row of every slot of the steps still to run; for a
            variable-count (``budget``) plan (S, W, M) with ``-1`` after each rank-step's rows.
        costs: (N,) float64 cost of every samples row (cost-model units).
        consumed: (C,) rows trained before the last switch, in training order (step, rank, slot).
        dropped: rows a ``drop_last`` re-plan left out of this epoch.
        padded: rows a ``pad`` re-plan added a second time.
        epoch, seed, strategy, policy: from the manifest; they seed and shape re-plans.
        history: the switches applied so far, ``((consumed_steps, W', B'), ...)``.
    """

    rows: NDArray[np.int64]
    costs: NDArray[np.float64]
    consumed: NDArray[np.int64]
    dropped: NDArray[np.int64]
    padded: NDArray[np.int64]
    epoch: int
    seed: int
    strategy: str
    policy: str
    history: tuple[Switch, ...] = ()
    mean_batch: int | None = None  # B of a variable-count plan (rows.shape[2] is its largest count)

    @property
    def steps(self) -> int:
        return int(self.rows.shape[0])

    @property
    def world_size(self) -> int:
        return int(self.rows.shape[1])

    @property
    def batch_size(self) -> int:
        return int(self.mean_batch or self.rows.shape[2])

    def balance(self) -> dict[str, float]:
        """``{"linearity", "bound"}`` of the remaining steps (``lidarshard.transforms.plan.metrics``);
        the equal-count bound over the first ``P - P % (W*B)`` entries."""
        valid = self.rows >= 0
        pool = np.full(self.rows.shape, -1, dtype=np.int64)
        pool[valid] = np.arange(int(valid.sum()))
        c = self.costs[self.rows[valid]]
        fitted = c[: c.size - c.size % (self.world_size * self.batch_size)]
        return {
            "linearity": linearity(pool, c),
            "bound": bound_linearity(fitted, self.world_size, self.batch_size),
        }

    def switch(self, consumed_steps: int, world_size: int, batch_size: int | None = None) -> ElasticPlan:
        """Continue after ``consumed_steps`` finished steps on ``world_size`` ranks of ``batch_size``.

        Args:
            consumed_steps: steps of this plan every rank has finished, ``0..steps``.
            world_size: W' >= 1.
            batch_size: B' >= 1; default ``W*B / W'`` (global batch unchanged), which must be whole.

        Returns:
            The new plan: merged when W' divides W and B' is ``B`` or ``(W/W')*B``, re-planned
            otherwise (module docstring); unchanged rows when ``(W', B') == (W, B)``.
        """
        s, w, b = self.steps, self.world_size, self.batch_size
        if not 0 <= consumed_steps <= s:
            raise ValueError(f"consumed_steps {consumed_steps} is outside 0..{s}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if batch_size is None:
            if (w * b) % world_size:
                raise ValueError(
                    f"the global batch {w}x{b} = {w * b} does not split over {world_size} ranks: pass batch_size"
                )
            batch_size = w * b // world_size
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        done, rest = self.rows[:consumed_steps].ravel(), self.rows[consumed_steps:]
        done = done[done >= 0]
        out = replace(
            self,
            consumed=np.concatenate([self.consumed, done]),
            history=(*self.history, (int(consumed_steps), int(world_size), int(batch_size))),
        )
        if (world_size, batch_size) == (w, b):
            return replace(out, rows=np.ascontiguousarray(rest))
        if self.strategy in VARIABLE_COUNT:
            return self._replan(out, rest[rest >= 0], world_size, batch_size)
        if w % world_size == 0 and batch_size in (b, (w // world_size) * b):
            return replace(out, rows=merge_ranks(rest, world_size, keep_batch_size=batch_size == b))
        return self._replan(out, rest.ravel(), world_size, batch_size)

    def _replan(self, out: ElasticPlan, pool: NDArray[np.int64], w: int, b: int) -> ElasticPlan:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"the manifest's strategy {self.strategy!r} is not one of {sorted(STRATEGIES)}: cannot re-plan"
            )
        seed = _seed(self.seed, self.epoch, len(out.history), *np.ravel(out.history))
        if self.strategy in VARIABLE_COUNT:  # plans any pool size: nothing dropped or padded
            if pool.size < w:
                raise ValueError(f"{pool.size} samples are left in the epoch, fewer than world_size {w}")
            order = np.sort(pool)[np.random.default_rng(seed + 1).permutation(pool.size)]
            plan = plan_epoch(self.strategy, self.costs[order], w, b, seed=seed, epoch=self.epoch)
            return replace(out, rows=np.where(plan >= 0, order[plan], -1), mean_batch=b)
        fitted, n_drop, n_pad = fit_pool(pool, w * b, self.policy, np.random.default_rng(seed))
        n = self.costs.size
        dropped = _minus(pool, fitted, n) if n_drop else np.empty(0, np.int64)
        padded = _minus(fitted, pool, n) if n_pad else np.empty(0, np.int64)
        # fit_pool sorts; restore a seeded order so the planner's tie-breaks do not follow row ids.
        fitted = fitted[np.random.default_rng(seed + 1).permutation(fitted.size)]
        plan = plan_epoch(self.strategy, self.costs[fitted], w, b, seed=seed, epoch=self.epoch)
        return replace(
            out,
            rows=fitted[plan],
            dropped=np.concatenate([self.dropped, dropped]),
            padded=np.concatenate([self.padded, padded]),
        )


def load_epoch_plan(out_dir: PathLike, epoch: int) -> ElasticPlan:
    """The manifest's plan of ``epoch`` for all ranks, as an :class:`ElasticPlan` with no history.

    Reads the samples (sample_id, cost) and the epoch's plan files; ``epoch`` must be planned.
    """
    manifest = load_manifest(out_dir)
    w, b, epochs = int(manifest["world_size"]), int(manifest["batch_size"]), int(manifest["epochs"])
    if not 0 <= epoch < epochs:
        raise ValueError(f"epoch {epoch} was not planned: the manifest holds epochs 0..{epochs - 1}")
    s = int(manifest["steps_per_epoch"][epoch])
    variable = str(manifest["strategy"]) in VARIABLE_COUNT
    samples = read_samples(out_dir, ["sample_id", "cost"])
    plan = plan_dataset(out_dir).to_table(
        columns=["step", "rank", "slot", "sample_id"], filter=ds.field("epoch") == epoch
    )
    if plan.num_rows != s * w * b and not variable:
        raise ValueError(f"epoch {epoch}: {plan.num_rows} plan rows, expected {s}x{w}x{b} = {s * w * b}")
    found = pc.index_in(plan["sample_id"], value_set=samples["sample_id"])
    if found.null_count:
        raise ValueError(f"epoch {epoch}: {found.null_count} planned sample_ids are not in the samples")
    step, rank, slot = (plan[c].to_numpy().astype(np.int64) for c in ("step", "rank", "slot"))
    m = int(slot.max(initial=-1)) + 1 if variable else b
    if variable and (step.min(initial=0) < 0 or step.max(initial=0) >= s or rank.max(initial=0) >= w):
        raise ValueError(f"epoch {epoch}: plan rows outside {s} steps x {w} ranks")
    rows = np.full(s * w * m, -1, dtype=np.int64)
    rows[(step * w + rank) * m + slot] = found.to_numpy().astype(np.int64)
    filled = (rows >= 0).reshape(s, w, m)
    if (~filled[..., 0]).any() if variable else (rows < 0).any():
        raise ValueError(f"epoch {epoch}: the plan does not fill every (step, rank, slot) exactly once")
    return ElasticPlan(
        rows=rows.reshape(s, w, m),
        mean_batch=b if variable else None,
        costs=samples["cost"].to_numpy().astype(np.float64),
        consumed=np.empty(0, np.int64),
        dropped=np.empty(0, np.int64),
        padded=np.empty(0, np.int64),
        epoch=int(epoch),
        seed=int(manifest["seed"]),
        strategy=str(manifest["strategy"]),
        policy=str(manifest.get("policy", "drop_last")),
    )


def replan_remaining(
    out_dir: PathLike, epoch: int, consumed_steps: int, new_world_size: int, new_batch_size: int | None = None
) -> ElasticPlan:
    """The manifest's epoch after ``consumed_steps`` steps at its world size, continued on ``new_world_size``.

    Shorthand for ``load_epoch_plan(out_dir, epoch).switch(consumed_steps, new_world_size, new_batch_size)``.
    """
    return load_epoch_plan(out_dir, epoch).switch(consumed_steps, new_world_size, new_batch_size)


class ElasticBatchSampler(Position):
    """Like ``lidarshard.loaders.torch.BalancedBatchSampler``, for any world size: yields this rank's batches.

    With the manifest's world size and no switch it replays the manifest exactly. On another world
    size every epoch is re-planned from step 0 (``switch(0, W', B')``); a checkpoint taken at one world
    size and loaded at another switches mid-epoch at the saved step (nothing skipped or repeated).

    Args:
        out_dir: committed manifest directory (local path or URI).
        rank: this rank, ``0 <= rank < world_size``.
        world_size: ranks the job runs now.
        batch_size: samples per rank per step; default ``W*B / world_size`` of the manifest.
        index_of: sample_id -> dataset index (mapping or callable); default the samples' row order.
        cycle: reuse the plan of ``epoch % epochs`` for epochs past those planned.

    ``state_dict()`` holds ``epoch``, ``step``, ``world_size``, ``batch_size`` and ``history``; under a
    ``lidarshard.loaders.torch.PlanLoader`` ``step`` counts the batches the training loop received
    (exact with any number of workers), otherwise the batches yielded. ``len()`` is the batches the
    next iteration yields.
    """

    def __init__(
        self,
        out_dir: PathLike,
        rank: int,
        world_size: int,
        *,
        batch_size: int | None = None,
        index_of: Mapping[str, int] | Callable[[str], int] | None = None,
        cycle: bool = False,
    ) -> None:
        self.out_dir = out_dir
        self.manifest = load_manifest(out_dir)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        w0, b0 = int(self.manifest["world_size"]), int(self.manifest["batch_size"])
        if batch_size is None:
            if (w0 * b0) % world_size:
                raise ValueError(
                    f"the manifest's global batch {w0}x{b0} = {w0 * b0} does not split over {world_size} "
                    "ranks: pass batch_size"
                )
            batch_size = w0 * b0 // world_size
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.rank, self.world_size, self.batch_size = int(rank), int(world_size), int(batch_size)
        self.cycle = cycle
        self._index = self._index_array(index_of)
        self.epoch = 0
        self._reset_position()
        self.history: list[Switch] = self._default_history()
        self._cache: tuple[tuple, ElasticPlan] | None = None

    def _index_array(
        self, index_of: Mapping[str, int] | Callable[[str], int] | None
    ) -> NDArray[np.int64] | None:
        if index_of is None:
            return None
        ids = read_samples(self.out_dir, ["sample_id"])["sample_id"].to_pylist()
        if isinstance(index_of, Mapping):
            return np.fromiter((index_of.get(sid, -1) for sid in ids), dtype=np.int64, count=len(ids))

        def get(sid: str) -> int:
            try:
                return int(index_of(sid))
            except KeyError:
                return -1

        return np.fromiter((get(sid) for sid in ids), dtype=np.int64, count=len(ids))

    def _default_history(self) -> list[Switch]:
        w0, b0 = int(self.manifest["world_size"]), int(self.manifest["batch_size"])
        return (
            [] if (self.world_size, self.batch_size) == (w0, b0) else [(0, self.world_size, self.batch_size)]
        )

    def plan(self) -> ElasticPlan:
        """The current epoch's plan after ``history`` (cached)."""
        key = (self.epoch, tuple(self.history))
        if self._cache is None or self._cache[0] != key:
            epochs = int(self.manifest["epochs"])
            if self.epoch >= epochs and not self.cycle:
                raise ValueError(
                    f"epoch {self.epoch} was not planned (epochs 0..{epochs - 1}); pass cycle=True"
                )
            p = load_epoch_plan(self.out_dir, self.epoch % epochs)
            for c, w, b in self.history:
                p = p.switch(c, w, b)
            self._cache = (key, p)
        return self._cache[1]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration yields; a new epoch starts at step 0 on the current size."""
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self._reset_position()
            self.history = self._default_history()

    def __len__(self) -> int:
        return self.plan().steps - self._resume

    def __iter__(self) -> Iterator[list[int]]:
        self._note_caller(caller_self(1))
        rows = self.plan().rows[:, self.rank]
        start = self._step = self._resume
        for s in range(start, rows.shape[0]):
            step_rows = rows[s][rows[s] >= 0]  # -1 pads a variable-count rank-step
            idx = step_rows if self._index is None else self._index[step_rows]
            if (idx < 0).any():
                sid = read_samples(self.out_dir, ["sample_id"])["sample_id"][int(step_rows[idx < 0][0])]
                raise KeyError(f"sample_id {sid.as_py()!r} of the plan is not in index_of")
            self._yielded(s)
            yield idx.tolist()
        self._resume = 0

    def state_dict(self) -> dict:
        """JSON-able position: ``{"epoch", "step", "world_size", "batch_size", "history"}``."""
        return {
            "epoch": self.epoch,
            "step": self._saved_step(),
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "history": [list(h) for h in self.history],
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Resume at ``state``; a different world or batch size switches the plan at the saved step."""
        self.epoch, step = int(state["epoch"]), int(state["step"])
        self.history = [tuple(int(v) for v in h) for h in state.get("history", [])]
        if not self.history and "world_size" in state:
            w0, b0 = int(self.manifest["world_size"]), int(self.manifest["batch_size"])
            if (int(state["world_size"]), int(state["batch_size"])) != (w0, b0):
                self.history = [(0, int(state["world_size"]), int(state["batch_size"]))]
        saved = (int(state.get("world_size", self.world_size)), int(state.get("batch_size", self.batch_size)))
        if saved != (self.world_size, self.batch_size):
            self.history.append((step, self.world_size, self.batch_size))
            step = 0
        self._reset_position(step)

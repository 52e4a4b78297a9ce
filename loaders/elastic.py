"""Elastic world size: continue an epoch at a different number of ranks, balanced, exact.

A job planned for ``W`` ranks restarts on ``W'`` (a node died, 16 -> 8 GPUs; or it grows back). Every
rank re-derives the same new plan in-process from the manifest, in seconds for 1M samples: the steps
all ranks finished (``consumed_steps``) stay consumed and the remaining entries are merged onto ``W'``
ranks or planned again with the manifest's strategy (``lidarshard.loaders.reshard`` says when and how).
Steps of a re-plan may hold uneven counts: scale the summed loss by :meth:`ElasticBatchSampler.loss_scale`.

Every entry of the epoch is trained exactly as often as the manifest plans it, whatever the chain of
switches. The result is a pure function of the manifest, the epoch and the switch history
``[(consumed_steps, W', B'), ...]``, small and JSON-able: the checkpoint stores it
(:meth:`ElasticBatchSampler.state_dict`) and every later restart reproduces the plan.

Pure numpy/pyarrow; imports neither Beam nor torch. :class:`ElasticBatchSampler` yields plain
lists of ints, which ``torch.utils.data.DataLoader(batch_sampler=...)`` accepts as is.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from lidarshard.loaders.epoch_plan import read_epoch_plan
from lidarshard.loaders.position import saved_shape
from lidarshard.loaders.reader import PathLike, check_int, load_manifest, read_samples
from lidarshard.loaders.replay import IndexOf, PlanReplay
from lidarshard.loaders.reshard import ElasticPlan, Switch, check_exact, merge_ranks
from lidarshard.schemas.manifest import Manifest
from lidarshard.transforms.core.pool import plan_input
from lidarshard.transforms.plan.caps import Caps, PoolLimits

__all__ = ["ElasticPlan", "ElasticBatchSampler", "load_epoch_plan", "merge_ranks", "replan_remaining"]


def load_epoch_plan(out_dir: PathLike, epoch: int, manifest: Manifest | None = None) -> ElasticPlan:
    """The manifest's plan of ``epoch`` for all ranks, as an :class:`ElasticPlan` with no history.

    Reads the samples and the epoch's plan files (``epoch_plan.read_epoch_plan``: each checked against
    its recorded size and sha256); ``epoch`` must be planned. ``manifest``: the ``load_manifest`` of
    ``out_dir`` a sampler read when it was made (default: read now); the files must still be its own.

    Raises:
        ValueError: the epoch is not planned, or its files do not hold exactly the plan the manifest
            records (``steps_per_epoch``, ``counts.planned``, every slot filled once; one line).
        lidarshard.loaders.held.RebuiltError: OUT was rebuilt since ``manifest`` was read.
    """
    manifest = load_manifest(out_dir) if manifest is None else manifest
    caps = Caps.from_record(manifest.caps, manifest.memory_cap)
    heaviest = manifest.caps.heaviest_first if manifest.caps is not None else "off"
    # the columns the build plans from (the costs come from the plan rows: no earlier model to apply again)
    samples = read_samples(out_dir, ["sample_id", *plan_input(caps.memory is not None)], manifest=manifest)
    read = read_epoch_plan(os.fspath(out_dir), manifest, epoch, samples["sample_id"], ["cost", "bucket_id"])
    plan, at, rows = read.table, read.at, read.plan
    costs = samples["cost"].to_numpy().astype(np.float64)  # the costs that planned the epoch: its rows'
    costs[at] = plan["cost"].to_numpy()  # (an epoch before a re-plan was planned with earlier ones)
    bucket_ids = samples["bucket_id"].to_numpy().astype(np.int32)
    bucket_ids[at] = plan["bucket_id"].to_numpy()
    points = (
        samples["num_points"].to_numpy().astype(np.int64) if "num_points" in samples.column_names else None
    )
    memory = None if caps.memory is None else caps.memory.model.sample_bytes(samples)
    return ElasticPlan(
        rows=rows,
        costs=costs,
        consumed=np.empty(0, np.int64),
        epoch=int(epoch),
        seed=manifest.seed,
        strategy=manifest.strategy,
        batch=manifest.batch_size,
        bucket_ids=bucket_ids,
        limits=PoolLimits(caps, points, memory) if caps.active else None,
        heavy={"points": points, "cost": costs, "memory": memory}.get(heaviest),
    )


def replan_remaining(
    out_dir: PathLike, epoch: int, consumed_steps: int, new_world_size: int, new_batch_size: int | None = None
) -> ElasticPlan:
    """The manifest's epoch after ``consumed_steps`` steps at its world size, continued on ``new_world_size``.

    Shorthand for ``load_epoch_plan(out_dir, epoch).switch(consumed_steps, new_world_size, new_batch_size)``.
    """
    return load_epoch_plan(out_dir, epoch).switch(consumed_steps, new_world_size, new_batch_size)


class ElasticBatchSampler(PlanReplay):
    """Like ``lidarshard.loaders.torch.BalancedBatchSampler``, for any world size: yields this rank's batches.

    With the manifest's world size and no switch it replays the manifest exactly. On another world
    size every epoch is planned from step 0 (``switch(0, W', B')``); a checkpoint of any lidarshard
    sampler (this one, ``BalancedBatchSampler``, ``PlanSampler``, the mmengine and Pointcept adapters)
    taken at one world size and loaded at another switches mid-epoch at the saved step: every entry of
    the epoch is then trained exactly as often as planned.

    Args:
        out_dir: committed manifest directory (local path or URI).
        rank: this rank, ``0 <= rank < world_size``.
        world_size: ranks the job runs now.
        batch_size: samples per rank per step; default ``ceil(W*B / world_size)`` of the manifest:
            the smallest that keeps the planned global batch (``W*B / world_size`` where it divides).
        index_of: sample_id -> dataset index (mapping or callable); default the samples' row order.
        cycle: reuse the plan of ``epoch % epochs`` for epochs past those planned.

    ``state_dict()`` holds ``epoch``, ``step``, ``world_size``, ``batch_size``, ``history`` and the plan's
    ``seed``, ``strategy``, ``plan_fingerprint``; under a ``lidarshard.loaders.torch.PlanLoader`` ``step``
    counts the batches the training loop received (exact with any number of workers), otherwise the
    batches yielded. ``len()`` is the batches the next iteration yields. Steps of a re-plan may hold
    different counts per rank: scale the summed loss by :meth:`loss_scale`.
    """

    def __init__(
        self,
        out_dir: PathLike,
        rank: int,
        world_size: int,
        *,
        batch_size: int | None = None,
        index_of: IndexOf | None = None,
        cycle: bool = False,
    ) -> None:
        super().__init__(out_dir, rank, world_size, index_of=index_of, cycle=cycle)
        world_size = check_int("world_size", world_size, 1)
        rank = check_int("rank", rank, 0, world_size - 1)
        w0, b0 = self.manifest.world_size, self.manifest.batch_size
        if batch_size is None:  # the smallest batch that keeps the global batch: ceil(W*B / W')
            batch_size = -(-w0 * b0 // world_size)
        self.rank, self.world_size = rank, world_size
        self.batch_size = check_int("batch_size", batch_size, 1)
        self._index = self._index_array(index_of)
        self.history: list[Switch] = self._default_history()
        self._base: ElasticPlan | None = None
        self._cache: tuple[tuple, ElasticPlan] | None = None

    def _index_array(self, index_of: IndexOf | None) -> NDArray[np.int64] | None:
        """(N,) dataset index of every sample row (-1: not in ``index_of``); None: the row order itself."""
        if index_of is None:
            return None
        ids = self.sample_ids()
        if isinstance(index_of, Mapping):
            return np.fromiter((index_of.get(sid, -1) for sid in ids), dtype=np.int64, count=len(ids))

        def get(sid: str) -> int:
            try:
                return int(index_of(sid))
            except KeyError:
                return -1

        return np.fromiter((get(sid) for sid in ids), dtype=np.int64, count=len(ids))

    def _default_history(self) -> list[Switch]:
        here = (self.world_size, self.batch_size)
        return [] if here == (self.manifest.world_size, self.manifest.batch_size) else [(0, *here)]

    def _plan_for(self, epoch: int, history: list[Switch]) -> ElasticPlan:
        """Epoch ``epoch`` after ``history``, checked against the manifest's plan (cached)."""
        key = (epoch, tuple(history))
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        epochs = self.manifest.epochs
        if epoch >= epochs and not self.cycle:
            raise ValueError(f"epoch {epoch} was not planned (epochs 0..{epochs - 1}); pass cycle=True")
        if self._base is None or self._base.epoch != epoch % epochs:
            self._base = load_epoch_plan(self.out_dir, epoch % epochs, self.manifest)  # the plan opened
        p = self._base
        for c, w, b in history:
            p = p.switch(c, w, b)
        check_exact(self._base.rows, p.consumed, p.rows, p.costs.size, epoch)
        self._cache = (key, p)
        return p

    def _plan_changed(self) -> None:
        """After ``switch_plan`` (see ``BalancedBatchSampler.switch_plan``): the switch history of the
        current epoch is kept (its plan is the same file for file)."""
        self._base, self._cache = None, None

    def plan(self) -> ElasticPlan:
        """The current epoch's plan after ``history`` (cached; checked to be the epoch's plan exactly)."""
        return self._plan_for(self.epoch, self.history)

    def scales(self) -> np.ndarray:
        """(S,) float64 loss scale ``W' / N_s`` of every step of the current epoch (``loss_scale``)."""
        return self.plan().loss_scales()

    def _new_epoch(self) -> None:
        """A new epoch starts at step 0 on the current size."""
        self.history = self._default_history()

    def _steps(self) -> int:
        return self.plan().steps

    def _planned(self, start: int) -> Iterator[tuple[int, list[int]]]:
        rows = self.plan().rows[:, self.rank]
        return ((s, self._indices(rows[s])) for s in range(start, rows.shape[0]))

    def _indices(self, step_rows: np.ndarray) -> list[int]:
        """Dataset indices of one rank-step's sample rows (-1 pads a rank-step holding fewer)."""
        step_rows = step_rows[step_rows >= 0]
        idx = step_rows if self._index is None else self._index[step_rows]
        if (idx < 0).any():
            sid = self.sample_ids()[int(step_rows[idx < 0][0])]
            raise KeyError(f"sample_id {sid!r} of the plan is not in index_of")
        return idx.tolist()

    def _state_extra(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.history]}

    def load_state_dict(self, state: Mapping) -> None:
        """Resume at ``state``, from any lidarshard sampler of this manifest's plan; a different world or
        batch size switches the plan at the saved step.

        A state without ``world_size``/``batch_size`` was saved at the manifest's; one without
        ``plan_fingerprint`` is taken as this plan's.

        Raises:
            ValueError: the state belongs to another plan (naming both), is inconsistent, or the rest of
                the epoch cannot be spread over this world size (fewer entries left than ranks).
        """
        epoch, step = check_int("epoch", state["epoch"], 0), check_int("step", state["step"], 0)
        w, b, history = saved_shape(state, self.manifest, os.fspath(self.out_dir))
        manifest_shape = (self.manifest.world_size, self.manifest.batch_size)
        if not history and (w, b) != manifest_shape:
            history = [(0, w, b)]  # an epoch planned whole on (w, b) from step 0
        ends = tuple(history[-1][1:]) if history else manifest_shape
        if (w, b) != ends:
            raise ValueError(
                f"the resume state runs world_size {w}, batch_size {b} but its history {history} ends at "
                f"{ends}: not a state lidarshard wrote"
            )
        steps = self._plan_for(epoch, history).steps
        if step > steps:
            raise ValueError(f"step {step} is outside 0..{steps} of epoch {epoch} after {history}")
        if (w, b) != (self.world_size, self.batch_size):
            history, step = [*history, (step, self.world_size, self.batch_size)], 0
            self._plan_for(epoch, history)  # raises here, not in the training loop
        self.epoch, self.history = epoch, history
        self._reset_position(step)

"""Where a batch sampler stands: batches yielded vs batches the training loop received.

A ``DataLoader`` with workers draws up to ``num_workers * prefetch_factor`` batches from its batch
sampler ahead of the loop, so "yielded" is not "trained". ``lidarshard.loaders.torch.PlanLoader``
tells the sampler, batch by batch, which (epoch, step) the loop just received; the sampler's state
then counts those. Pure Python: shared by the torch and elastic samplers, with the resume state's
ties to its plan (:func:`plan_keys`, :func:`saved_shape`).
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Iterator, Mapping
from itertools import islice

from lidarshard.loaders.reader import PathLike, check_int, load_manifest
from lidarshard.loaders.reshard import Switch
from lidarshard.schemas.manifest import Manifest

__all__ = ["Position", "PlannedBatch", "caller_self", "plan_keys", "saved_shape", "continued_from"]


class PlannedBatch(list):
    """One planned batch of dataset indices (a ``list[int]``), with where it stands in the plan.

    Attributes:
        step: the step of the epoch this batch is.
        ahead: the index lists of the next batches the same consumer (DataLoader worker) will be
            given, nearest first, from the plan (``Position.lookahead``); empty when nothing asked.
            A dataset may start reading their files now (``PointCloudDataset``'s prefetch).
    """

    def __init__(self, indices: list[int], step: int, ahead: tuple[tuple[int, ...], ...] = ()) -> None:
        super().__init__(indices)
        self.step, self.ahead = step, ahead

    def __reduce__(self):  # pickled to DataLoader workers whole
        return (PlannedBatch, (list(self), self.step, self.ahead))


def plan_keys(manifest: Manifest, epoch: int) -> dict[str, int | str]:
    """The keys that tie a resume state to epoch ``epoch``'s plan: ``seed``, ``strategy``, ``plan_fingerprint``
    (``Manifest.plan_fingerprint`` of the planned epoch ``epoch % epochs``)."""
    return {
        "seed": manifest.seed,
        "strategy": manifest.strategy,
        "plan_fingerprint": manifest.plan_fingerprint(epoch % manifest.epochs),
    }


def saved_shape(state: Mapping, manifest: Manifest, where: object) -> tuple[int, int, list[Switch]]:
    """``(world_size, batch_size, history)`` a resume state was saved at, once it is known to be this plan's.

    A state without ``world_size`` / ``batch_size`` (written by an older lidarshard) was saved at the
    manifest's W, B; one without ``plan_fingerprint`` cannot be tied to its plan and is taken as this one's.

    Raises:
        ValueError: the state belongs to another plan (other seed, world size, batch size, strategy or a
            rebuilt manifest): one line naming both.
        TypeError: a value is not an int.
    """
    epoch = check_int("epoch", state["epoch"], 0)
    mine = manifest.plan_fingerprint(epoch % manifest.epochs)
    theirs = state.get("plan_fingerprint")
    w = check_int("world_size", state.get("world_size", manifest.world_size), 1)
    b = check_int("batch_size", state.get("batch_size", manifest.batch_size), 1)
    if theirs is not None and theirs != mine:
        raise ValueError(
            f"the resume state belongs to another plan: saved on plan {theirs} (seed {state.get('seed', '?')}, "
            f"strategy {state.get('strategy', '?')}, running world_size {w}, batch_size {b}) but {where} epoch "
            f"{epoch % manifest.epochs} is plan {mine} (seed {manifest.seed}, strategy {manifest.strategy}, "
            f"world_size {manifest.world_size}, batch_size {manifest.batch_size}): resume on the manifest the "
            "checkpoint trained on, or start this plan's epoch from step 0"
        )
    raw = state.get("history") or []
    if not isinstance(raw, (list, tuple)) or any(
        not isinstance(h, (list, tuple)) or len(h) != 3 for h in raw
    ):
        raise ValueError(f"history must list [consumed_steps, world_size, batch_size] switches, got {raw!r}")
    history: list[Switch] = [
        (
            check_int("history step", c, 0),
            check_int("history world_size", hw, 1),
            check_int("history batch_size", hb, 1),
        )
        for c, hw, hb in raw
    ]
    return w, b, history


def continued_from(current: Manifest, new: Manifest, here: object, there: object) -> int:
    """The epoch E from which ``new`` (a ``build --replan-from E`` of ``current``) plans anew, after checking
    that it continues ``current``: the same samples, W, B, seed and strategy, and every epoch before E
    the same plan file for file (so a position or resume state of those epochs means the same batches).

    Raises:
        ValueError: ``new`` does not continue ``current`` (one line naming what differs).
    """
    if not new.cost_history:
        raise ValueError(
            f"{there} is not a re-plan (no cost_history): build it with --from-samples {here}/samples --replan-from E"
        )
    start = new.cost_history[-1].until_epoch
    for what in ("world_size", "batch_size", "seed", "strategy", "inputs_fingerprint"):
        mine, theirs = getattr(current, what), getattr(new, what)
        if mine != theirs:
            raise ValueError(f"{there} does not continue {here}: {what} {theirs} != {mine}")
    differs = next(
        (
            e
            for e in range(start)
            if e >= current.epochs or new.plan_fingerprint(e) != current.plan_fingerprint(e)
        ),
        None,
    )
    if differs is not None:
        raise ValueError(
            f"{there} does not continue {here}: its epoch {differs} is another plan (it re-plans from epoch {start})"
        )
    return start


def caller_self(depth: int) -> object:
    """The ``self`` of the frame ``depth`` levels above the caller (who iterates a sampler), or None."""
    return sys._getframe(depth + 1).f_locals.get("self")


class Position:
    """Mixin for batch samplers that resume: call :meth:`_reset_position` in ``__init__``,
    :meth:`_yielded` for every batch, :meth:`_saved_step` in ``state_dict``.

    Attributes read by subclasses: ``epoch`` (set by them), ``_resume`` (first step of the next pass).
    """

    epoch: int
    manifest: Manifest
    out_dir: PathLike

    def lookahead(self, batches: int, consumers: int = 1) -> None:
        """Hand out with every batch the index lists of the next ``batches`` batches the same consumer
        gets (``PlannedBatch.ahead``), for ``consumers`` taking batches in turn (a DataLoader's workers:
        batch n goes to worker n mod num_workers). ``PlanLoader`` sets this from the dataset's
        ``prefetch`` and ``num_workers``; 0 turns it off."""
        self._ahead = (max(0, int(batches)), max(1, int(consumers)))

    def _serve(self, planned: Iterator[tuple[int, list[int]]]) -> Iterator[PlannedBatch]:
        """``planned`` (step, indices) pairs as :class:`PlannedBatch` es, each counted as yielded when
        it is handed out (peeking ahead counts nothing)."""
        k, stride = getattr(self, "_ahead", (0, 1))
        window = deque(islice(planned, k * stride + 1))
        while window:
            step, indices = window.popleft()
            ahead = tuple(
                tuple(window[j * stride - 1][1]) for j in range(1, k + 1) if j * stride <= len(window)
            )
            self._yielded(step)
            yield PlannedBatch(indices, step, ahead)
            window.extend(islice(planned, 1))

    def _continuation(self, out_dir: PathLike) -> tuple[Manifest, int]:
        """(the manifest at ``out_dir``, E) once it is a re-plan of this sampler's manifest from epoch E
        (``continued_from``) that may take over now: before epoch E's first batch. The samplers'
        ``switch_plan`` starts here.

        Raises:
            ValueError: it does not continue this manifest, or epoch E has begun (one line).
        """
        here, there = os.fspath(self.out_dir), os.fspath(out_dir)
        new = load_manifest(out_dir)
        start = continued_from(self.manifest, new, here, there)
        if self.epoch > start or (self.epoch == start and (self._step or self._resume)):
            raise ValueError(
                f"{there} re-plans from epoch {start}, but this sampler is already at epoch {self.epoch} "
                f"step {max(self._step, self._resume)}: switch before epoch {start} begins (or restart on it)"
            )
        return new, start

    def _reset_position(self, step: int = 0) -> None:
        """Position ``step`` of ``self.epoch``: nothing handed out beyond it."""
        self._step = self._resume = self._trained = step
        self._handed: deque[tuple[int, int]] = deque()  # (epoch, step) yielded, not yet delivered
        if not hasattr(self, "_tracked"):
            self._tracked = False  # a PlanLoader reports deliveries
            self._prefetcher: str | None = None  # a plain multi-worker DataLoader drives the sampler

    def _note_caller(self, caller: object) -> None:
        """Remember a plain prefetching DataLoader iterating us (its state would run ahead)."""
        if type(caller).__name__ == "_MultiProcessingDataLoaderIter" and not self._tracked:
            self._prefetcher = f"a DataLoader with num_workers={getattr(caller, '_num_workers', '?')}"

    def _yielded(self, step: int) -> None:
        self._step = step + 1
        if self._tracked:
            self._handed.append((self.epoch, step))

    def _begin_delivery(self) -> None:
        """A new pass of the loader: batches an abandoned pass prefetched are not coming."""
        self._handed.clear()
        self._trained = self._resume

    def _delivered(self) -> None:
        """The loop received the oldest batch handed out."""
        epoch, step = self._handed.popleft()
        if epoch == self.epoch:
            self._trained = step + 1

    def _saved_step(self) -> int:
        """Batches of ``self.epoch`` the training loop received.

        Raises:
            RuntimeError: a plain multi-worker ``DataLoader`` drives the sampler, so only the
                batches handed to workers are known; build the loader with ``PlanLoader``.
        """
        if self._tracked:
            return self._trained
        if self._prefetcher is not None:
            raise RuntimeError(
                f"{self._prefetcher} prefetches batches ahead of training, so this sampler cannot tell "
                "how many were trained: build the loader with lidarshard.loaders.torch.PlanLoader("
                "dataset, sampler, ...), whose state counts delivered batches"
            )
        return self._step

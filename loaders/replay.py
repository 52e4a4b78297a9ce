"""The one sampler core: :class:`PlanReplay` replays one rank's plan of a committed manifest, step by
step, and knows where it stands (batches handed out vs batches the training loop received).

Every lidarshard sampler is this core or a view of it:

- ``BalancedBatchSampler`` (``loaders.sampler``): the core over the rank's plan files, at the manifest's
  world size; ``ElasticBatchSampler`` (``loaders.elastic``): the core over the epoch re-derived for any
  world size. They differ only in where an epoch's steps come from (``_steps``, ``_planned``,
  ``scales``) and in the resume states they accept.
- ``PlanLoader``, ``PlanSampler``, ``PlanBatchSampler`` (``loaders.torch``), mmengine's
  ``LidarshardSampler`` / ``LidarshardBatchSampler`` and the Pointcept adapter wrap one of those two.

The manifest is read once, when the sampler is made; its readers are built from that read.

A ``DataLoader`` with workers draws up to ``num_workers * prefetch_factor`` batches ahead of the loop,
so "yielded" is not "trained". ``lidarshard.loaders.torch.PlanLoader`` tells the sampler, batch by
batch, which (epoch, step) the loop just received; the state then counts those. A plain ``DataLoader``
tells nothing, but its worker processes get every batch pickled (``PlannedBatch.sent``): then the
state refuses to guess. Pure Python/numpy; imports neither torch nor Beam.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from itertools import islice
from typing import Any

import numpy as np

from lidarshard.loaders.position import PlannedBatch, continued_from, plan_keys
from lidarshard.loaders.reader import ManifestReader, PathLike, check_int, load_manifest, read_samples
from lidarshard.schemas.manifest import Manifest

__all__ = ["IndexOf", "PlanReplay"]

#: sample_id -> dataset index, as a mapping or a callable.
IndexOf = Mapping[str, int] | Callable[[str], int]

#: What a plain DataLoader whose workers got our batches is called in the state_dict refusal.
_PREFETCHER = "a DataLoader with worker processes (num_workers > 0)"


class PlanReplay:
    """The sampler core: one rank's planned batches of ``epoch``, resumable at a step.

    Subclasses set ``batch_size`` and provide ``_steps()`` (steps of the current epoch), ``_planned(start)``
    ((step, dataset indices) from ``start``, after checking the epoch) and ``scales()`` ((S,) loss scales).
    Hooks with defaults: ``_new_epoch``, ``_check_plan``, ``_plan_changed``, ``_state_extra``.
    """

    batch_size: int
    _step: int  # the step after the last batch handed out
    _resume: int  # where the next iteration starts (len() counts from there)
    _trained: int  # the step after the last batch a PlanLoader delivered

    def __init__(
        self,
        out_dir: PathLike,
        rank: int,
        world_size: int,
        *,
        index_of: IndexOf | None = None,
        cycle: bool = False,
    ) -> None:
        self.out_dir, self.rank, self.world_size, self.cycle = out_dir, rank, world_size, cycle
        self.manifest: Manifest = load_manifest(out_dir)  # the one read of _manifest.json
        self.index_of = index_of
        self.epoch = 0
        self._ids: list[str] | None = None  # the samples' ids in row order, read when first needed
        self._readers: dict[int, ManifestReader] = {}  # epoch -> this rank's reader (the last two)
        self._tracked = False  # a PlanLoader reports deliveries
        self._prefetcher: str | None = None  # a plain DataLoader's worker processes got our batches
        self._ahead = (0, 1)
        self._reset_position()
        self._finished = False  # the current epoch was iterated to its end
        super().__init__()

    # ------------------------------------------------------------------------------ what subclasses give

    def _steps(self) -> int:
        """Steps of the current epoch (raises when it is not planned)."""
        raise NotImplementedError

    def _planned(self, start: int) -> Iterator[tuple[int, list[int]]]:
        """(step, dataset indices) of the current epoch from ``start``, once the epoch is checked."""
        raise NotImplementedError

    def scales(self) -> np.ndarray:
        """(S,) float64 loss scale ``W / N_s`` of every step of the current epoch."""
        raise NotImplementedError

    def _new_epoch(self) -> None:
        """``set_epoch`` moved to another epoch (after the position was reset)."""

    def _check_plan(self, out_dir: PathLike, manifest: Manifest) -> None:
        """``switch_plan`` is about to replay ``out_dir``: raise if this rank cannot."""

    def _plan_changed(self) -> None:
        """``switch_plan`` replaced ``out_dir`` and ``manifest``: drop what was derived from them."""

    def _state_extra(self) -> dict[str, Any]:
        """Keys of ``state_dict()`` between ``batch_size`` and the plan's keys."""
        return {}

    # ------------------------------------------------------------------------------------ the plan

    def reader(self, epoch: int) -> ManifestReader:
        """This rank's :class:`ManifestReader` of ``epoch`` at the manifest's world size, built from the
        manifest read when the sampler was made (cached: the last two epochs asked for)."""
        found = self._readers.get(epoch)
        if found is None:
            found = ManifestReader(
                self.out_dir, self.rank, self.world_size, epoch, cycle=self.cycle, manifest=self.manifest
            )
            if len(self._readers) >= 2:
                del self._readers[next(iter(self._readers))]
            self._readers[epoch] = found
        return found

    def sample_ids(self) -> list[str]:
        """The samples' ids in row order (the default dataset order), read once."""
        if self._ids is None:
            table = read_samples(self.out_dir, ["sample_id"], manifest=self.manifest)
            self._ids = table["sample_id"].to_pylist()
        return self._ids

    def loss_scale(self, step: int) -> float:
        """Multiply the *sum* of the per-sample losses of ``step`` by this: ``W / N`` with N the samples of
        all ranks at that step (``1 / B`` with equal counts, the plain mean)."""
        return float(self.scales()[step])

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration replays; a new epoch starts at step 0."""
        epoch = check_int("epoch", epoch, 0)
        if epoch != self.epoch:
            self.epoch, self._finished = epoch, False
            self._reset_position()
            self._new_epoch()

    def switch_plan(self, out_dir: PathLike) -> int:
        """Replay ``out_dir`` from now on: a re-plan of this sampler's manifest (``lidarshard build
        --from-samples THIS/samples --replan-from E``), whose epochs before E are this manifest's plans
        file for file, so nothing already trained changes and resume states stay valid. Call it before
        epoch E's first batch (e.g. after calibrating on the epochs trained so far); returns E.

        Raises:
            ValueError: ``out_dir`` does not continue this manifest (naming what differs), or epoch E
                has begun.
        """
        new, start = self._continuation(out_dir)
        self._check_plan(out_dir, new)
        self.out_dir, self.manifest, self._readers, self._ids = out_dir, new, {}, None
        self._plan_changed()
        return start

    def __len__(self) -> int:
        """Batches the next (or current) iteration yields: the epoch's steps less a resumed position."""
        return self._steps() - self._resume

    def __iter__(self) -> Iterator[list[int]]:  # PlannedBatch es
        start = self._resume
        planned = self._planned(start)
        self._finished, self._step = False, start
        yield from self._serve(planned)
        self._resume, self._finished = 0, True

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch": e, "step": batches of epoch e the training loop received, "world_size", "batch_size",
        ...the subclass's keys, "seed", "strategy", "plan_fingerprint"}`` (the last three tie it to this plan).

        Raises:
            RuntimeError: a plain multi-worker ``DataLoader`` drives this sampler, so the batches it
                yielded run ahead of training; build the loader with ``PlanLoader``.
        """
        return {
            "epoch": self.epoch,
            "step": self._saved_step(),
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            **self._state_extra(),
            **plan_keys(self.manifest, self.epoch),
        }

    def _lookup(self, sample_id: str) -> int:
        """The dataset index of ``sample_id`` (``index_of``; default the samples' row order)."""
        if self.index_of is None:
            self.index_of = {sid: i for i, sid in enumerate(self.sample_ids())}
        if not isinstance(self.index_of, Mapping):
            return int(self.index_of(sample_id))
        try:
            return int(self.index_of[sample_id])
        except KeyError:
            raise KeyError(f"sample_id {sample_id!r} of the plan is not in index_of") from None

    def _continuation(self, out_dir: PathLike) -> tuple[Manifest, int]:
        """(the manifest at ``out_dir``, E) once it is a re-plan of this sampler's manifest from epoch E
        (``continued_from``) that may take over now: before epoch E's first batch.

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

    # ------------------------------------------------------------------------------------ the position

    def lookahead(self, batches: int, consumers: int = 1) -> None:
        """Hand out with every batch the index lists of the next ``batches`` batches the same consumer
        gets (``PlannedBatch.ahead``), for ``consumers`` taking batches in turn (a DataLoader's workers:
        batch n goes to worker n mod num_workers). ``PlanLoader`` sets this from the dataset's
        ``prefetch`` and ``num_workers``; 0 turns it off."""
        self._ahead = (max(0, int(batches)), max(1, int(consumers)))

    def _serve(self, planned: Iterator[tuple[int, list[int]]]) -> Iterator[PlannedBatch]:
        """``planned`` (step, indices) pairs as :class:`PlannedBatch` es, each counted as yielded when
        it is handed out (peeking ahead counts nothing)."""
        k, stride = self._ahead
        window = deque(islice(planned, k * stride + 1))
        while window:
            step, indices = window.popleft()
            ahead = tuple(
                tuple(window[j * stride - 1][1]) for j in range(1, k + 1) if j * stride <= len(window)
            )
            self._yielded(step)
            yield PlannedBatch(indices, step, ahead, sent=self._sent_to_worker)
            window.extend(islice(planned, 1))

    def _sent_to_worker(self) -> None:
        """A batch was pickled for a worker process: untracked, the state would run ahead of training."""
        if not self._tracked:
            self._prefetcher = _PREFETCHER

    def _reset_position(self, step: int = 0) -> None:
        """Position ``step`` of ``self.epoch``: nothing handed out beyond it."""
        self._step = self._resume = self._trained = step
        self._handed: deque[tuple[int, int]] = deque()  # (epoch, step) yielded, not yet delivered

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

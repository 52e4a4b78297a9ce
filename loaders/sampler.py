"""The batch sampler that replays one rank's manifest step by step (``BalancedBatchSampler``).

Re-exported by ``lidarshard.loaders.torch`` (use it from there, with ``PlanLoader``). Needs PyTorch:
``pip install "lidarshard[torch]"``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from lidarshard.loaders.reader import ManifestReader, PathLike, check_int, needs_torch

try:
    import torch.distributed as dist
    from torch.utils.data import Sampler
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise needs_torch(__name__) from e

from lidarshard.loaders.position import saved_shape
from lidarshard.loaders.replay import IndexOf, PlanReplay
from lidarshard.schemas.manifest import Manifest

__all__ = ["BalancedBatchSampler", "rank_world"]


def rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values win; otherwise take them from an initialized ``torch.distributed``."""
    if rank is None or world_size is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("pass rank and world_size, or initialize torch.distributed first")
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    world_size = check_int("world_size", world_size, 1)
    return check_int("rank", rank, 0, world_size - 1), world_size


class BalancedBatchSampler(PlanReplay, Sampler[list[int]]):
    """Yields, step by step, the dataset indices of this rank's planned batch.

    Use as ``DataLoader(dataset, batch_sampler=sampler)``. Call :meth:`set_epoch` before each epoch
    as with ``DistributedSampler``. ``len(sampler)`` is the number of steps of the current epoch.

    Args:
        out_dir: committed manifest directory (local path or URI).
        rank: data-parallel rank; default ``torch.distributed.get_rank()``.
        world_size: ranks; default ``torch.distributed.get_world_size()``; must match the manifest.
        index_of: sample_id -> dataset index, as a mapping or a callable. Default: the row order of
            the samples (by sample_id), which is ``PointCloudDataset``'s order.
        cycle: allow epochs past those planned, reusing the plan of ``epoch % epochs`` (warns).

    Resume: ``state_dict()`` is ``{"epoch", "step", "world_size", "batch_size", "seed", "strategy",
    "plan_fingerprint"}``, ``step`` = the batches of the epoch the training loop has received. Under a
    ``lidarshard.loaders.torch.PlanLoader`` that is exact with any ``num_workers``, ``prefetch_factor`` and
    ``persistent_workers`` (the loader records each delivered batch's step; the workers' prefetch does not
    count). Without one it counts the batches this sampler yielded, which equals the trained batches only
    when nothing prefetches (direct iteration, ``num_workers=0``); a plain ``DataLoader`` with workers makes
    ``state_dict()`` raise rather than save a position ahead of training. After ``load_state_dict`` the next
    iteration yields exactly the remaining batches and ``len()`` is their number (``set_epoch`` with the
    same epoch keeps the position). A state of another plan (seed, world size, batch size, rebuilt
    manifest) is refused naming both; on another world size, resume with
    ``lidarshard.loaders.elastic.ElasticBatchSampler``, which takes this state as it is. Each iteration
    first checks that the rank's plan holds the epoch's planned entries (``counts.planned``).

    Misuse: ``check_loader(loader)`` refuses a ``DataLoader`` given this sampler as ``sampler=`` (TypeError
    naming ``batch_sampler=``; ``PlanLoader`` refuses ``sampler=`` itself); iterating an epoch a second time
    without ``set_epoch`` while later epochs are planned warns once.
    """

    def __init__(
        self,
        out_dir: PathLike,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        index_of: IndexOf | None = None,
        cycle: bool = False,
    ) -> None:
        rank, world_size = rank_world(rank, world_size)
        super().__init__(out_dir, rank, world_size, index_of=index_of, cycle=cycle)
        self.reader(0)  # fail early on a bad dir or world size; epoch 0 reuses it
        self.batch_size = self.manifest.batch_size
        if index_of is None:
            self.index_of = {sid: i for i, sid in enumerate(self.sample_ids())}
        self._warned = False
        self._counts: tuple[int, np.ndarray] | None = None  # (epoch, (S,) samples of all ranks per step)

    @property
    def variable(self) -> bool:
        """True when batches hold a variable number of samples (``--strategy budget``)."""
        return self.manifest.variable_count

    def _step_counts(self) -> np.ndarray:
        """(S,) int64 samples of all ranks at each step of the current epoch (cached), checked: S and their
        sum must be the manifest's ``steps_per_epoch`` and ``counts.planned`` of the epoch.

        Raises:
            ValueError: the rank's plan is not the epoch the manifest records (one line).
        """
        if self._counts is None or self._counts[0] != self.epoch:
            reader = self.reader(self.epoch)
            counts = np.array([reader.batch(s).global_count for s in range(reader.steps)], dtype=np.int64)
            e = reader.plan_epoch
            planned = self.manifest.counts.planned[e]
            if counts.size != self.manifest.steps(e) or int(counts.sum()) != planned or (counts < 1).any():
                raise ValueError(
                    f"{self.out_dir}: epoch {e} rank {self.rank}'s plan holds {int(counts.sum())} entries over "
                    f"{counts.size} steps but the manifest records {planned} over {self.manifest.steps(e)}: "
                    "refusing to train a wrong epoch; rebuild the manifest"
                )
            self._counts = (self.epoch, counts)
        return self._counts[1]

    def scales(self) -> np.ndarray:
        """(S,) float64 loss scale ``W / N_s`` of every step of the current epoch (cached)."""
        return self.world_size / self._step_counts().astype(np.float64)

    def check_loader(self, loader: Any) -> None:
        """Refuse a ``DataLoader`` built with this batch sampler as ``sampler=`` (it would hand whole planned
        batches to the dataset as single indices). Call it on a plain DataLoader you build yourself.

        Raises:
            TypeError: ``loader.batch_sampler`` is not this sampler (one line naming ``batch_sampler=``).
        """
        if getattr(loader, "batch_sampler", None) is not self:
            raise TypeError(
                f"{type(self).__name__} yields whole batches: pass it as DataLoader(dataset, "
                "batch_sampler=sampler), not sampler= (or use PlanSampler with sampler= and batch_size=)"
            )

    def _check_plan(self, out_dir: PathLike, manifest: Manifest) -> None:
        ManifestReader(out_dir, self.rank, self.world_size, 0, manifest=manifest)  # its files for this rank

    def _plan_changed(self) -> None:
        self._counts = None

    def _steps(self) -> int:
        epochs = self.manifest.epochs
        if self.epoch >= epochs and not self.cycle:
            return len(self.reader(self.epoch))  # raises the reader's "not planned" error
        return self.manifest.steps(self.epoch % epochs)

    def _planned(self, start: int) -> Iterator[tuple[int, list[int]]]:
        epochs = self.manifest.epochs
        if self._finished and self.epoch + 1 < epochs and not self._warned:
            self._warned = True
            warnings.warn(
                f"epoch {self.epoch} is being iterated again although the manifest plans {epochs} epochs: "
                "call sampler.set_epoch(epoch) before each epoch, or every epoch replays the same plan",
                stacklevel=3,
            )
        reader = self.reader(self.epoch)
        self._step_counts()  # the epoch the manifest records, before a batch is handed out
        lookup = self._lookup
        return ((s, [lookup(sid) for sid in reader.batch(s).sample_ids]) for s in range(start, reader.steps))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields the batches of ``state["epoch"]`` from ``state["step"]``.

        A state without ``world_size``/``batch_size``/``plan_fingerprint`` (older lidarshard) is taken as
        saved on this manifest's plan.

        Raises:
            ValueError: the state belongs to another plan (naming both), or was saved at another world or
                batch size (resume with ``ElasticBatchSampler``), or its step is outside the epoch.
        """
        epoch = check_int("epoch", state["epoch"], 0)
        w, b, history = saved_shape(state, self.manifest, self.out_dir)
        if (w, b) != (self.world_size, self.manifest.batch_size) or history:
            raise ValueError(
                f"the resume state was saved at world_size {w}, batch_size {b}"
                f"{f' after elastic switches {history}' if history else ''}, but {os.fspath(self.out_dir)} is "
                f"replayed here at its world_size {self.world_size}, batch_size {self.manifest.batch_size}: "
                f"resume with lidarshard.loaders.elastic.ElasticBatchSampler({os.fspath(self.out_dir)!r}, "
                "rank, world_size)"
            )
        self.epoch = epoch
        self._reset_position(check_int("step", state["step"], 0, self._steps()))
        self._finished = False

"""PyTorch adapters: a batch sampler that replays a rank's manifest, and a point-cloud dataset.

Typical use with ``torch.distributed`` initialized::

    dataset = PointCloudDataset(out_dir)
    sampler = BalancedBatchSampler(out_dir)          # rank / world size from torch.distributed
    loader = PlanLoader(dataset, sampler, collate_fn=collate, num_workers=4)  # a DataLoader
    if resuming:
        sampler.load_state_dict(checkpoint["sampler"])   # continues after the last trained batch
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)
        for step, batch in enumerate(loader, start=sampler.state_dict()["step"]):  # still to come
            train(batch, scale=sampler.loss_scale(step))  # loss = scale * sum(per-sample losses)
            checkpoint["sampler"] = sampler.state_dict()  # counts trained batches, not prefetched ones

``loss_scale(step)`` is ``W / N`` (N: samples of all ranks at that step), so under DDP's gradient
averaging ``loss = scale * sum(per-sample losses)`` gives the mean over the global batch even when
ranks hold different counts (``--strategy budget``); see :class:`lidarshard.loaders.reader.Batch`.

Needs PyTorch: ``pip install "lidarshard[torch]"``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from lidarshard.loaders.reader import (
    ManifestReader,
    PathLike,
    check_int,
    load_manifest,
    needs_torch,
    read_samples,
)

try:
    import torch.distributed as dist
    from torch.utils.data import BatchSampler, DataLoader, Sampler
    from torch.utils.data.dataloader import _BaseDataLoaderIter
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise needs_torch(__name__) from e

from lidarshard.loaders.dataset import IGNORE_LABEL, PointCloudDataset, collate
from lidarshard.loaders.position import Position, caller_self
from lidarshard.transforms.plan import VARIABLE_COUNT

__all__ = [
    "BalancedBatchSampler",
    "PlanLoader",
    "PlanSampler",
    "PlanBatchSampler",
    "PointCloudDataset",
    "collate",
    "IGNORE_LABEL",
]


def _rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values win; otherwise take them from an initialized ``torch.distributed``."""
    if rank is None or world_size is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("pass rank and world_size, or initialize torch.distributed first")
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    world_size = check_int("world_size", world_size, 1)
    return check_int("rank", rank, 0, world_size - 1), world_size


class BalancedBatchSampler(Position, Sampler[list[int]]):
    """Yields, step by step, the dataset indices of this rank's planned batch.

    Use as ``DataLoader(dataset, batch_sampler=sampler)``. Call :meth:`set_epoch` before each epoch
    as with ``DistributedSampler``. ``len(sampler)`` is the number of steps of the current epoch.

    Args:
        out_dir: committed manifest directory (local path or URI).
        rank: data-parallel rank; default ``torch.distributed.get_rank()``.
        world_size: ranks; default ``torch.distributed.get_world_size()``; must match the manifest.
        index_of: sample_id -> dataset index, as a mapping or a callable. Default: the row order of
            the samples (by sample_id), which is :class:`PointCloudDataset`'s order.
        cycle: allow epochs past those planned, reusing the plan of ``epoch % epochs`` (warns).

    Resume: ``state_dict()`` is ``{"epoch", "step"}``, ``step`` = the batches of the epoch the training
    loop has received. Under a :class:`PlanLoader` that is exact with any ``num_workers``,
    ``prefetch_factor`` and ``persistent_workers`` (the loader records each delivered batch's step; the
    workers' prefetch does not count). Without one it counts the batches this sampler yielded, which
    equals the trained batches only when nothing prefetches (direct iteration, ``num_workers=0``); a
    plain ``DataLoader`` with workers makes ``state_dict()`` raise rather than save a position ahead of
    training. After ``load_state_dict`` the next iteration yields exactly the remaining batches and
    ``len()`` is their number (``set_epoch`` with the same epoch keeps the position).

    Misuse is refused where it happens: passed as ``sampler=`` (TypeError naming ``batch_sampler=``);
    iterating an epoch a second time without ``set_epoch`` while later epochs are planned warns once.
    """

    def __init__(
        self,
        out_dir: PathLike,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        index_of: Mapping[str, int] | Callable[[str], int] | None = None,
        cycle: bool = False,
    ) -> None:
        super().__init__()
        self.rank, self.world_size = _rank_world(rank, world_size)
        self.out_dir = out_dir
        self.cycle = cycle
        ManifestReader(out_dir, self.rank, self.world_size, 0)  # fail early on a bad dir or world size
        self.manifest = load_manifest(out_dir)
        if index_of is None:
            ids = read_samples(out_dir, ["sample_id"])["sample_id"].to_pylist()
            index_of = {sid: i for i, sid in enumerate(ids)}
        self.index_of = index_of
        self.epoch = 0
        self._reset_position()  # _resume: where the next iteration starts (len() counts from there)
        self._finished = False  # the current epoch was iterated to its end
        self._warned = False
        self._scales: tuple[int, np.ndarray] | None = None  # (epoch, (S,) loss scales)

    @property
    def variable(self) -> bool:
        """True when batches hold a variable number of samples (``--strategy budget``)."""
        return self.manifest.get("strategy") in VARIABLE_COUNT

    def scales(self) -> np.ndarray:
        """(S,) float64 loss scale ``W / N_s`` of every step of the current epoch (cached)."""
        if self._scales is None or self._scales[0] != self.epoch:
            reader = self._reader()
            self._scales = (self.epoch, np.array([reader.batch(s).scale for s in range(reader.steps)]))
        return self._scales[1]

    def loss_scale(self, step: int) -> float:
        """Multiply the *sum* of the per-sample losses of ``step`` by this: ``W / N`` with N the
        samples of all ranks at that step (``1 / B`` with equal counts, the plain mean)."""
        return float(self.scales()[step])

    def _lookup(self, sample_id: str) -> int:
        if not isinstance(self.index_of, Mapping):
            return int(self.index_of(sample_id))
        try:
            return int(self.index_of[sample_id])
        except KeyError:
            raise KeyError(f"sample_id {sample_id!r} of the plan is not in index_of") from None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration replays; a new epoch starts at step 0."""
        epoch = check_int("epoch", epoch, 0)
        if epoch != self.epoch:
            self.epoch, self._finished = epoch, False
            self._reset_position()

    def _reader(self, start_step: int = 0) -> ManifestReader:
        return ManifestReader(
            self.out_dir, self.rank, self.world_size, self.epoch, start_step=start_step, cycle=self.cycle
        )

    def _steps(self) -> int:
        epochs = int(self.manifest["epochs"])
        if self.epoch >= epochs and not self.cycle:
            return len(self._reader())  # raises the reader's "not planned" error
        return int(self.manifest["steps_per_epoch"][self.epoch % epochs])

    def __len__(self) -> int:
        """Batches the next (or current) iteration yields: the epoch's steps less a resumed position."""
        return self._steps() - self._resume

    def _check_caller(self) -> None:
        """Refuse ``DataLoader(sampler=<this batch sampler>)``; note a prefetching plain DataLoader."""
        caller = caller_self(2)
        as_sampler = isinstance(caller, BatchSampler) and caller.sampler is self
        as_sampler |= isinstance(caller, _BaseDataLoaderIter) and not caller._auto_collation
        if as_sampler:
            raise TypeError(
                f"{type(self).__name__} yields whole batches: pass it as DataLoader(dataset, "
                "batch_sampler=sampler), not sampler= (or use PlanSampler with sampler= and batch_size=)"
            )
        self._note_caller(caller)

    def __iter__(self) -> Iterator[list[int]]:
        self._check_caller()
        epochs = int(self.manifest["epochs"])
        if self._finished and self.epoch + 1 < epochs and not self._warned:
            self._warned = True
            warnings.warn(
                f"epoch {self.epoch} is being iterated again although the manifest plans {epochs} epochs: "
                "call sampler.set_epoch(epoch) before each epoch, or every epoch replays the same plan",
                stacklevel=2,
            )
        reader = self._reader(self._resume)
        self._finished = False
        self._step = reader.start_step
        for batch in reader:
            indices = [self._lookup(sid) for sid in batch.sample_ids]
            self._yielded(batch.step)
            yield indices
        self._resume, self._finished = 0, True

    def state_dict(self) -> dict[str, int]:
        """``{"epoch": e, "step": batches of epoch e the training loop received}``.

        Raises:
            RuntimeError: a plain multi-worker ``DataLoader`` drives this sampler, so the batches it
                yielded run ahead of training; build the loader with :class:`PlanLoader`.
        """
        return {"epoch": self.epoch, "step": self._saved_step()}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume: the next iteration yields the batches of ``state["epoch"]`` from ``state["step"]``."""
        self.epoch = check_int("epoch", state["epoch"], 0)
        self._reset_position(check_int("step", state["step"], 0, self._steps()))
        self._finished = False


class PlanLoader(DataLoader):
    """A ``DataLoader`` over a lidarshard batch sampler whose resume state counts trained batches.

    The loader delivers batches in sampler order (``in_order=True``, PyTorch's default), so the n-th
    batch the loop receives is the n-th (epoch, step) the sampler handed out, however many the workers
    hold. Each delivery advances ``sampler.state_dict()["step"]``; prefetched batches do not.

    Args:
        dataset: a map-style dataset indexed like the sampler's ``index_of``.
        batch_sampler: the rank's :class:`BalancedBatchSampler` (or
            ``lidarshard.loaders.elastic.ElasticBatchSampler``).
        **kwargs: any other ``DataLoader`` argument (``num_workers``, ``collate_fn``, ``prefetch_factor``,
            ``persistent_workers``, ``pin_memory`` ...); ``batch_size``, ``shuffle``, ``sampler``,
            ``drop_last`` belong to the plan and ``in_order=False`` would break the count.
    """

    def __init__(self, dataset: Any, batch_sampler: Position, **kwargs: Any) -> None:
        if not isinstance(batch_sampler, Position):
            raise TypeError(
                f"PlanLoader needs a BalancedBatchSampler or ElasticBatchSampler, got {type(batch_sampler).__name__}"
            )
        owned = sorted({"batch_size", "shuffle", "sampler", "drop_last"} & set(kwargs))
        if owned:
            raise TypeError(f"PlanLoader: {owned} come from the manifest's plan; remove them")
        if kwargs.get("in_order", True) is not True:
            raise ValueError("PlanLoader needs in_order=True: resume counts batches in delivery order")
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        batch_sampler._tracked = True

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        sampler: Position = self.batch_sampler  # type: ignore[assignment]
        sampler._begin_delivery()
        for batch in super().__iter__():
            sampler._delivered()
            yield batch

    def state_dict(self) -> dict[str, int]:
        """The sampler's ``state_dict()``: ``{"epoch", "step"}`` with step = trained batches."""
        return self.batch_sampler.state_dict()  # type: ignore[union-attr]

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """The sampler's ``load_state_dict``: the next iteration starts after the last trained batch."""
        self.batch_sampler.load_state_dict(state)  # type: ignore[union-attr]


class PlanSampler(Sampler[int]):
    """Per-sample form of :class:`~lidarshard.loaders.torch.BalancedBatchSampler` for ``sampler=`` + ``batch_size=``.

    Yields this rank's planned dataset indices step after step, ``batch_size`` per step, so a
    ``DataLoader(batch_size=sampler.batch_size)`` rebuilds exactly the planned batches.
    ``len(sampler)`` is ``steps * batch_size`` of the current epoch. Arguments, :meth:`set_epoch`,
    ``state_dict`` / ``load_state_dict`` (positions in *steps*) are the batch sampler's.

    Args:
        passes: planned epochs per trainer epoch (Pointcept's ``data.train.loop``): trainer epoch
            ``e`` replays planned epochs ``e*passes .. e*passes+passes-1`` back to back. With
            ``passes > 1`` a resumed position (``load_state_dict``) is not kept.

    A ``DataLoader`` whose ``batch_size`` is not the manifest's would cut across planned steps: the
    first iteration raises ValueError naming both sizes.
    """

    def __init__(
        self,
        out_dir: PathLike,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        index_of: Mapping[str, int] | Callable[[str], int] | None = None,
        cycle: bool = False,
        passes: int = 1,
    ) -> None:
        super().__init__()
        check_int("passes", passes, 1)
        self.batches = BalancedBatchSampler(out_dir, rank, world_size, index_of=index_of, cycle=cycle)
        self.batch_size = int(self.batches.manifest["batch_size"])
        self.passes = int(passes)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration replays (``DistributedSampler`` convention)."""
        self.epoch = check_int("epoch", epoch, 0)
        self.batches.set_epoch(self.epoch * self.passes)

    def num_steps(self) -> int:
        """Planned steps of the current trainer epoch (all passes)."""
        if self.passes == 1:
            return len(self.batches)
        steps = 0
        for j in range(self.passes):
            self.batches.set_epoch(self.epoch * self.passes + j)
            steps += len(self.batches)
        self.batches.set_epoch(self.epoch * self.passes)
        return steps

    def __len__(self) -> int:
        return self.num_steps() * self.batch_size

    def iter_batches(self) -> Iterator[list[int]]:
        """This rank's planned batches (lists of indices, any length) over all passes."""
        for j in range(self.passes):
            if self.passes > 1:
                self.batches.set_epoch(self.epoch * self.passes + j)
            yield from self.batches

    def loss_scale(self, step: int) -> float:
        """:meth:`BalancedBatchSampler.loss_scale` of the planned epoch being replayed."""
        return self.batches.loss_scale(step)

    def __iter__(self) -> Iterator[int]:
        if self.batches.variable:
            raise TypeError(
                "this manifest has a variable number of samples per rank-step (--strategy budget): "
                "a DataLoader with batch_size= would cut across steps; use "
                "batch_sampler=PlanBatchSampler(sampler) (or BalancedBatchSampler)"
            )
        caller = caller_self(1)
        if (
            isinstance(caller, BatchSampler)
            and caller.sampler is self
            and caller.batch_size != self.batch_size
        ):
            raise ValueError(
                f"the DataLoader's batch_size={caller.batch_size} but the manifest was planned with "
                f"--batch-size {self.batch_size}: use batch_size={self.batch_size}, or every batch would "
                "cut across planned steps"
            )
        for batch in self.iter_batches():
            yield from batch

    def state_dict(self) -> dict[str, int]:
        return self.batches.state_dict()

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.batches.load_state_dict(state)
        self.epoch = int(state["epoch"]) // self.passes


class PlanBatchSampler(Sampler[list[int]]):
    """The planned batches of a :class:`PlanSampler`, whole steps of any length (``batch_sampler=``).

    Needed for variable-count manifests (``--strategy budget``), where a fixed ``batch_size`` cannot
    rebuild the steps; works for equal-count ones too. ``set_epoch``, ``loss_scale`` and the state
    dict are the wrapped sampler's (``self.sampler``).
    """

    def __init__(self, sampler: PlanSampler) -> None:
        super().__init__()
        self.sampler = sampler

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return self.sampler.num_steps()

    def __iter__(self) -> Iterator[list[int]]:
        return self.sampler.iter_batches()

    def loss_scale(self, step: int) -> float:
        return self.sampler.loss_scale(step)

"""PyTorch adapters: the batch sampler that replays a rank's manifest (``BalancedBatchSampler``, from
``loaders.sampler``), ``PlanLoader`` that counts trained batches, the per-sample ``PlanSampler`` of the
framework adapters, and the point-cloud dataset (``loaders.dataset``).

``loss_scale(step)`` is ``W / N`` (N: samples of all ranks at that step), so under DDP's gradient
averaging ``loss = scale * sum(per-sample losses)`` is the global-batch mean even when ranks hold
different counts (``--strategy budget``). The checkpointed state names its plan: another plan's state
is refused (``ElasticBatchSampler`` resumes it on any world size). Usage: README.md, docs/GUIDE.md.
Needs PyTorch: ``pip install "lidarshard[torch]"``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from lidarshard.loaders.reader import PathLike, check_int, needs_torch

if TYPE_CHECKING:
    from lidarshard.loaders.elastic import ElasticBatchSampler

try:
    from torch.utils.data import DataLoader, Sampler
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise needs_torch(__name__) from e

from lidarshard.loaders.dataset import IGNORE_LABEL, PointCloudDataset, collate
from lidarshard.loaders.replay import IndexOf, PlanReplay
from lidarshard.loaders.sampler import BalancedBatchSampler

__all__ = [
    "BalancedBatchSampler",
    "PlanLoader",
    "PlanSampler",
    "PlanBatchSampler",
    "PointCloudDataset",
    "collate",
    "IGNORE_LABEL",
]


class PlanLoader(DataLoader):
    """A ``DataLoader`` over a lidarshard batch sampler whose resume state counts trained batches.

    The loader delivers batches in sampler order (``in_order=True``, PyTorch's default), so the n-th
    batch the loop receives is the n-th (epoch, step) the sampler handed out, however many the workers
    hold. Each delivery advances ``sampler.state_dict()["step"]``; prefetched batches do not.

    With a dataset that prefetches (``PointCloudDataset(..., prefetch=k)``), every batch also carries
    the index lists of the next ``k`` batches its worker will be given (batch n goes to worker
    n mod ``num_workers``), from the plan, so the worker reads their files while this step trains.

    Args:
        dataset: a map-style dataset indexed like the sampler's ``index_of``.
        batch_sampler: the rank's :class:`BalancedBatchSampler` (or
            ``lidarshard.loaders.elastic.ElasticBatchSampler``).
        **kwargs: any other ``DataLoader`` argument (``num_workers``, ``collate_fn``, ``prefetch_factor``,
            ``persistent_workers``, ``pin_memory`` ...); ``batch_size``, ``shuffle``, ``sampler``,
            ``drop_last`` belong to the plan and ``in_order=False`` would break the count.
    """

    def __init__(
        self, dataset: Any, batch_sampler: BalancedBatchSampler | ElasticBatchSampler, **kwargs: Any
    ) -> None:
        if not isinstance(batch_sampler, PlanReplay):
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
        # Plan-aware prefetch: each batch carries the next ones its worker gets (PlannedBatch.ahead).
        batch_sampler.lookahead(getattr(dataset, "prefetch", 0), max(1, self.num_workers))

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        sampler: PlanReplay = self.batch_sampler  # type: ignore[assignment]
        sampler._begin_delivery()
        for batch in super().__iter__():
            sampler._delivered()
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The sampler's ``state_dict()``: ``{"epoch", "step", ...}`` with step = trained batches."""
        return self.batch_sampler.state_dict()  # type: ignore[union-attr]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The sampler's ``load_state_dict``: the next iteration starts after the last trained batch."""
        self.batch_sampler.load_state_dict(state)  # type: ignore[union-attr]

    def switch_plan(self, out_dir: PathLike) -> int:
        """The sampler's ``switch_plan``: from epoch E on, replay ``out_dir`` (a ``build --replan-from E``
        of this manifest) without restarting the loader or its workers; returns E."""
        return self.batch_sampler.switch_plan(out_dir)  # type: ignore[union-attr]


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

    A ``DataLoader`` whose ``batch_size`` is not the manifest's would cut across planned steps:
    ``check_loader(loader)`` (or ``check_batch_size``) raises ValueError naming both sizes; mmengine's
    ``LidarshardBatchSampler`` and the Pointcept adapter's loader call it.
    """

    def __init__(
        self,
        out_dir: PathLike,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        index_of: IndexOf | None = None,
        cycle: bool = False,
        passes: int = 1,
    ) -> None:
        super().__init__()
        check_int("passes", passes, 1)
        self.batches = BalancedBatchSampler(out_dir, rank, world_size, index_of=index_of, cycle=cycle)
        self.batch_size = self.batches.manifest.batch_size
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
        for batch in self.iter_batches():
            yield from batch

    def check_batch_size(self, batch_size: object, what: str = "the DataLoader's batch_size") -> None:
        """Refuse a loader batch size other than the manifest's: every batch would cut across planned steps.

        Raises:
            ValueError: ``batch_size`` is not the manifest's ``--batch-size`` (one line naming both).
        """
        if batch_size != self.batch_size:
            raise ValueError(
                f"{what}={batch_size} but the manifest was planned with --batch-size {self.batch_size}: "
                f"use batch_size={self.batch_size}, or every batch would cut across planned steps"
            )

    def check_loader(self, loader: Any) -> None:
        """:meth:`check_batch_size` of a ``DataLoader(dataset, sampler=self, batch_size=...)`` you built."""
        if getattr(loader, "sampler", None) is self:
            self.check_batch_size(loader.batch_size)

    def switch_plan(self, out_dir: PathLike) -> int:
        """:meth:`BalancedBatchSampler.switch_plan` (``E`` counts planned epochs, ``passes`` per trainer epoch)."""
        start = self.batches.switch_plan(out_dir)
        self.batch_size = self.batches.manifest.batch_size
        return start

    def state_dict(self) -> dict[str, int | str]:
        """:meth:`BalancedBatchSampler.state_dict` (``epoch`` is the planned epoch being replayed)."""
        return self.batches.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """:meth:`BalancedBatchSampler.load_state_dict`; refuses a state of another plan."""
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

"""Pointcept adapter: plug a lidarshard manifest into Pointcept's ``Trainer`` train loader.

The manifest enters as a per-sample :class:`PlanSampler` with the manifest's ``batch_size``, so every
``DataLoader`` batch is one planned step; :func:`offset_collate` gives Pointcept's offset layout and
:class:`LoopTimer` records step timings for any framework loop. Usage: docs/FRAMEWORKS.md ("Pointcept").
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError('lidarshard.loaders.pointcept needs PyTorch: pip install "lidarshard[torch]"') from e

from lidarshard.loaders.reader import PathLike
from lidarshard.loaders.step_timer import StepTimer
from lidarshard.loaders.torch import PlanBatchSampler, PlanSampler

__all__ = [
    "index_from_dataset",
    "offset_collate",
    "build_train_loader",
    "plan_sampler_of",
    "PlanSteps",
    "LoopTimer",
    "LidarshardTrainerMixin",
]

IdOf = str | Callable[[int], str] | None


def index_from_dataset(dataset: Any, id_of: IdOf, info: str = "data_list") -> dict[str, int] | None:
    """sample_id -> dataset index from a framework dataset; None keeps the samples' row order.

    Args:
        dataset: the training dataset (indices ``0..len(infos)-1``).
        id_of: a key into each info dict (e.g. ``"token"``, the nuScenes sample token that
            ``lidarshard scan --nuscenes`` uses as sample_id), a callable ``index -> sample_id``, or None.
        info: how to reach info ``i`` when ``id_of`` is a key: ``"data_list"`` (Pointcept:
            ``dataset.data_list[i]``) or ``"get_data_info"`` (mmengine: ``dataset.get_data_info(i)``).

    A sample_id listed twice keeps its first index (wrappers that repeat a dataset).
    """
    if id_of is None:
        return None
    if callable(id_of):
        get = id_of
        n = len(dataset)
    elif info == "data_list":
        n = len(dataset.data_list)
        get = lambda i: dataset.data_list[i][id_of]  # noqa: E731
    else:
        n = len(dataset)
        get = lambda i: dataset.get_data_info(i)[id_of]  # noqa: E731
    out: dict[str, int] = {}
    for i in range(n):
        out.setdefault(str(get(i)), i)
    return out


def offset_collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Pointcept's batch layout from ``PointCloudDataset`` items.

    Returns:
        ``{"coord": (sum N_b, 3) float32 m, "feat": (sum N_b, C) float32 all channels,
        "offset": (B,) int64 cumulative point counts (Pointcept's ``offset``), "index": (B,) int64,
        "sample_id": [B str]}``.
    """
    points = torch.cat([it["points"] for it in items], dim=0)
    counts = torch.tensor([it["points"].shape[0] for it in items], dtype=torch.int64)
    return {
        "coord": points[:, :3].contiguous(),
        "feat": points,
        "offset": torch.cumsum(counts, dim=0),
        "index": torch.tensor([it["index"] for it in items], dtype=torch.int64),
        "sample_id": [it["sample_id"] for it in items],
    }


def _worker_init(worker_id: int, num_workers: int, rank: int, seed: int) -> None:
    """Pointcept's ``worker_init_fn``: seed python, numpy and torch with ``num_workers*rank + id + seed``."""
    s = num_workers * rank + worker_id + seed
    random.seed(s)
    np.random.seed(s % 2**32)  # noqa: NPY002 - Pointcept transforms draw from the global RNG
    torch.manual_seed(s)


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def build_train_loader(
    trainer: Any,
    manifest: PathLike,
    dataset: Any = None,
    *,
    id_of: IdOf = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> DataLoader:
    """Pointcept's ``Trainer.build_train_loader`` with the manifest's plan as the sampler.

    Args:
        trainer: a Pointcept trainer (or its ``cfg``): ``batch_size_per_gpu``, ``num_worker_per_gpu``,
            ``mix_prob``, ``seed`` and, without ``dataset``, ``data.train``.
        manifest: committed manifest planned for this world size and ``--batch-size`` = ``batch_size_per_gpu``;
            a dataset with ``loop = L`` trains L planned epochs per trainer epoch (plan ``--epochs`` = ``cfg.epoch``).
        dataset: default ``pointcept.datasets.build_dataset(cfg.data.train)``.
        id_of: dataset items -> sample_ids (:func:`index_from_dataset`); None: the samples' row order.
        collate_fn: default ``partial(pointcept.datasets.point_collate_fn, mix_prob=cfg.mix_prob)``.

    Raises:
        ValueError: ``batch_size_per_gpu`` differs from the manifest's batch size.
    """
    cfg = getattr(trainer, "cfg", trainer)
    if dataset is None or collate_fn is None:
        try:
            from pointcept.datasets import build_dataset, point_collate_fn
        except ImportError as e:
            raise ImportError("pass dataset= and collate_fn=, or run inside a Pointcept checkout") from e
        dataset = build_dataset(cfg.data.train) if dataset is None else dataset
        collate_fn = collate_fn or partial(point_collate_fn, mix_prob=cfg.mix_prob)
    rank, world = _rank_world()
    passes = int(getattr(dataset, "loop", 1))  # Pointcept repeats data_list `loop` times per epoch
    sampler = PlanSampler(manifest, rank, world, index_of=index_from_dataset(dataset, id_of), passes=passes)
    if int(cfg.batch_size_per_gpu) != sampler.batch_size:
        raise ValueError(
            f"batch_size_per_gpu={cfg.batch_size_per_gpu} but the manifest at {manifest} was planned with "
            f"--batch-size {sampler.batch_size}: set batch_size = {sampler.batch_size * world} in the config, "
            "or rebuild the manifest"
        )
    workers = int(cfg.num_worker_per_gpu)
    seed = getattr(cfg, "seed", None)
    # variable counts (--strategy budget): whole steps through a batch sampler; offsets collate them
    batching = (
        {"batch_sampler": PlanBatchSampler(sampler)}
        if sampler.batches.variable
        else {"batch_size": sampler.batch_size, "sampler": sampler, "drop_last": True}
    )
    return DataLoader(
        dataset,
        **batching,
        num_workers=workers,
        collate_fn=collate_fn,
        pin_memory=torch.cuda.is_available(),
        worker_init_fn=partial(_worker_init, num_workers=workers, rank=rank, seed=seed)
        if seed is not None
        else None,
        persistent_workers=workers > 0,
    )


def plan_sampler_of(loader: DataLoader) -> PlanSampler:
    """The :class:`PlanSampler` a train loader replays (its ``sampler`` or its batch sampler's); TypeError if none."""
    sampler = loader.sampler
    if not isinstance(sampler, PlanSampler):
        sampler = getattr(loader.batch_sampler, "sampler", sampler)
    if not isinstance(sampler, PlanSampler):
        raise TypeError(
            f"the train loader replays no lidarshard manifest (sampler {type(sampler).__name__}): use the "
            "adapter's sampler (LidarshardSampler, LidarshardTrainerMixin, build_train_loader)"
        )
    return sampler


class PlanSteps:
    """Where the batches a training loop receives from a loader over a :class:`PlanSampler` stand in the plan.

    A loader delivers batches in sampler order, so batch ``index`` (0-based, as the loop counts them) after
    ``set_epoch(epoch)`` is known from the plan alone, however far the loader's workers prefetched.
    """

    def __init__(self, sampler: PlanSampler) -> None:
        self.sampler = sampler
        self._at = (-1, 0, 0)  # (trainer epoch, planned epoch, index of that planned epoch's step 0)

    def __call__(self, epoch: int, index: int) -> tuple[int, int, list[str]]:
        """(planned epoch, step, this rank's sample ids) of batch ``index`` after ``set_epoch(epoch)``.

        Past a planned epoch's end the count goes on into the next: the sampler's ``passes`` (Pointcept's
        ``loop``), or mmengine's ``IterBasedTrainLoop`` (``epoch`` 0, ``index`` = the global iteration).
        """
        s, m = self.sampler.batches, self.sampler.batches.manifest
        first, planned, base = self._at
        if first != epoch or index < base:
            first, planned, base = epoch, epoch * self.sampler.passes, 0
        while index - base >= m.steps(planned % m.epochs):
            base, planned = base + m.steps(planned % m.epochs), planned + 1
        self._at = (first, planned, base)
        return planned, index - base, s.reader(planned).batch(index - base).sample_ids


class LoopTimer:
    """A :class:`~lidarshard.loaders.step_timer.StepTimer` driven by a framework's training loop.

    Each step's (epoch, step, sample ids) comes from the loader's plan (:class:`PlanSteps`); a
    ``DistributedDataParallel`` model gets the timer's comm hook, so ``compute_s`` ends before the
    all-reduce waits for the slowest rank. ``flush_every`` and ``device`` are ``StepTimer``'s.
    """

    def __init__(
        self,
        loader: DataLoader,
        directory: str,
        model: Any = None,
        *,
        flush_every: int = 1000,
        device: str = "auto",
    ) -> None:
        sampler = plan_sampler_of(loader)
        self.where = PlanSteps(sampler)
        b = sampler.batches
        self.timer = StepTimer(directory, b.rank, b.world_size, flush_every=flush_every, device=device)
        if isinstance(model, DistributedDataParallel):
            self.timer.attach_ddp(model)

    def start(self, epoch: int, index: int) -> None:
        """Batch ``index`` of trainer epoch ``epoch`` (as :class:`PlanSteps` counts) begins now."""
        self.timer.start(*self.where(epoch, index))

    def stop(self) -> None:
        """The step begun by :meth:`start` ends now (nothing when none is open)."""
        if self.timer.in_step:
            self.timer.stop()

    def flush(self) -> None:
        """Write the finished steps (at a checkpoint, an epoch's end)."""
        self.timer.flush()

    def close(self) -> None:
        """Flush all; a step still open is dropped."""
        self.timer.close()


class LidarshardTrainerMixin:
    """Mix into Pointcept's ``Trainer`` (first base) to train on ``cfg.lidarshard = dict(manifest=..., id_key=None, timings=None)``.

    Pointcept calls ``set_epoch`` only with more than one GPU, so the mixin selects the epoch itself
    (``before_train``: ``start_epoch`` after the resume hooks; ``after_epoch``: the next). ``timings=True``
    records each step with a :class:`LoopTimer` into ``cfg.save_path/model`` (a string names another folder),
    flushed after every epoch, before the checkpoint.
    """

    cfg: Any
    train_loader: DataLoader
    start_epoch: int
    epoch: int
    comm_info: dict[str, Any]
    _lidarshard_timer: LoopTimer | None = None

    def build_train_loader(self) -> DataLoader:
        opts = self.cfg.lidarshard
        return build_train_loader(self, opts["manifest"], id_of=opts.get("id_key"))

    def _plan_sampler(self) -> PlanSampler:
        return plan_sampler_of(self.train_loader)

    def before_train(self) -> None:
        super().before_train()  # type: ignore[misc]
        self._plan_sampler().set_epoch(self.start_epoch)
        where = self.cfg.lidarshard.get("timings")
        if where is True:
            where = os.path.join(str(self.cfg.save_path), "model")
        self._lidarshard_timer = (
            LoopTimer(self.train_loader, str(where), getattr(self, "model", None)) if where else None
        )

    def before_step(self) -> None:
        super().before_step()  # type: ignore[misc]
        if self._lidarshard_timer is not None:
            self._lidarshard_timer.start(self.epoch, self.comm_info["iter"])

    def after_step(self) -> None:
        if self._lidarshard_timer is not None:
            self._lidarshard_timer.stop()
        super().after_step()  # type: ignore[misc]

    def after_epoch(self) -> None:
        if self._lidarshard_timer is not None:
            self._lidarshard_timer.flush()
        super().after_epoch()  # type: ignore[misc]
        self._plan_sampler().set_epoch(self.epoch + 1)

    def after_train(self) -> None:
        if self._lidarshard_timer is not None:
            self._lidarshard_timer.close()
        super().after_train()  # type: ignore[misc]

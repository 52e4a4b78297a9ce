"""Pointcept adapter: plug a lidarshard manifest into Pointcept's ``Trainer`` train loader.

Pointcept (``pointcept/engines/train.py``) builds its train loader as
``DataLoader(train_data, batch_size=cfg.batch_size_per_gpu, sampler=DistributedSampler(...),
collate_fn=partial(point_collate_fn, mix_prob=cfg.mix_prob), drop_last=True, ...)`` and, with more
than one GPU, calls ``train_loader.sampler.set_epoch(epoch)`` before each epoch. So the manifest
enters as a per-sample :class:`PlanSampler` (this rank's planned indices, step after step) with
``batch_size`` equal to the manifest's: every ``DataLoader`` batch is then exactly one planned step.
Mix the trainer class in (Pointcept is not imported here; nothing to install but torch)::

    from pointcept.engines.train import TRAINERS, Trainer
    from lidarshard.loaders.pointcept import LidarshardTrainerMixin

    @TRAINERS.register_module("LidarshardTrainer")
    class LidarshardTrainer(LidarshardTrainerMixin, Trainer):
        pass

    # config: train = dict(type="LidarshardTrainer"); lidarshard = dict(manifest="gs://.../out", id_key="token")

Pointcept's collate convention is offset-based: points of the batch concatenated, ``offset`` the
cumulative point counts; :func:`offset_collate` produces it from ``lidarshard.loaders.torch.PointCloudDataset``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

try:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError('lidarshard.loaders.pointcept needs PyTorch: pip install "lidarshard[torch]"') from e

from lidarshard.loaders.reader import PathLike
from lidarshard.loaders.torch import PlanBatchSampler, PlanSampler

__all__ = [
    "index_from_dataset",
    "offset_collate",
    "build_train_loader",
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
        trainer: a Pointcept trainer (or its ``cfg``): reads ``batch_size_per_gpu``,
            ``num_worker_per_gpu``, ``mix_prob``, ``seed`` and, without ``dataset``, ``data.train``.
        manifest: committed manifest directory, planned for this job's world size and
            ``--batch-size`` = ``batch_size_per_gpu``. A dataset with ``loop = L`` (Pointcept sets
            ``cfg.epoch // cfg.eval_epoch``) trains L planned epochs per trainer epoch: plan
            ``--epochs`` = ``cfg.epoch``.
        dataset: the train dataset; default ``pointcept.datasets.build_dataset(cfg.data.train)``.
        id_of: how dataset items map to sample_ids (:func:`index_from_dataset`); None: the dataset
            is in the samples' row order (``PointCloudDataset``).
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


class LidarshardTrainerMixin:
    """Mix into Pointcept's ``Trainer`` (first base) to train on a manifest.

    Reads ``cfg.lidarshard = dict(manifest=..., id_key=None)``. Pointcept only calls
    ``train_loader.sampler.set_epoch`` with more than one GPU; the mixin selects the epoch itself:
    ``start_epoch`` after the resume hooks ran (``before_train``), and the next epoch after each
    one (``after_epoch``), so single-GPU runs and resumed runs replay the planned epochs too.
    """

    cfg: Any
    train_loader: DataLoader
    start_epoch: int
    epoch: int

    def build_train_loader(self) -> DataLoader:
        opts = self.cfg.lidarshard
        return build_train_loader(self, opts["manifest"], id_of=opts.get("id_key"))

    def _plan_sampler(self) -> PlanSampler:
        sampler, batches = self.train_loader.sampler, self.train_loader.batch_sampler
        if not isinstance(sampler, PlanSampler) and isinstance(batches, PlanBatchSampler):
            sampler = batches.sampler
        if not isinstance(sampler, PlanSampler):
            raise TypeError(f"train_loader holds no PlanSampler (sampler {type(sampler).__name__})")
        return sampler

    def before_train(self) -> None:
        super().before_train()  # type: ignore[misc]
        self._plan_sampler().set_epoch(self.start_epoch)

    def after_epoch(self) -> None:
        super().after_epoch()  # type: ignore[misc]
        self._plan_sampler().set_epoch(self.epoch + 1)

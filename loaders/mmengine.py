"""OpenMMLab adapter: ``LidarshardSampler`` in mmengine's ``DATA_SAMPLERS`` registry (mmdet3d, mmseg ...).

Importing this module registers four names; then a config only swaps the sampler::

    custom_imports = dict(imports=["lidarshard.loaders.mmengine"], allow_failed_imports=False)
    train_dataloader = dict(
        batch_size=4,                      # == the manifest's --batch-size
        num_workers=4,
        sampler=dict(type="LidarshardSampler", manifest="gs://bucket/out", id_key="token"),
        batch_sampler=dict(type="LidarshardBatchSampler"),  # checks batch_size against the manifest
        dataset=dict(type="NuScenesDataset", ...),
    )
    custom_hooks = [dict(type="LidarshardTimingHook")]  # optional: step timings for `lidarshard calibrate`
    val_dataloader = dict(            # every validation sample exactly once, cost-balanced ranks
        batch_size=1,
        sampler=dict(type="LidarshardEvalSampler", manifest="gs://bucket/val_out", id_key="token"),
        dataset=dict(type="NuScenesDataset", ...),
    )

How it meets mmengine's conventions:

* **ranks**: rank and world size come from ``mmengine.dist.get_dist_info()``; the manifest must be
  planned for that world size.
* **epochs**: ``DistSamplerSeedHook`` (a default hook) calls ``set_epoch(runner.epoch)`` before each
  epoch, which selects that epoch's plan. ``IterBasedTrainLoop`` restarts the loader when it runs
  out and calls ``set_epoch(1, 2, ...)`` itself. Epochs past those planned need ``cycle=True``.
* **seed**: the runner's ``randomness.seed`` reaches the sampler as ``seed`` but does not change
  the order: that is fixed offline by the manifest's ``--seed`` (the same on every rank).
* **evaluation**: ``LidarshardEvalSampler`` shards the validation set without mmengine's
  ``DefaultSampler`` padding (which repeats samples); mmengine's ``collect_results`` interleaves the
  ranks' results, so metrics must match predictions by sample id (mmdet3d's do), not by position.
* **timings**: ``LidarshardTimingHook`` (``HOOKS``) records each rank's own compute time and sample ids
  per step (``lidarshard.loaders.step_timer``) beside the checkpoints, for ``lidarshard calibrate OUT --timings``.
* **resume**: ``EpochBasedTrainLoop`` resumes at an epoch boundary and replays that epoch's plan;
  ``IterBasedTrainLoop`` skips ``iter`` batches of the same deterministic order, so a resumed run
  sees exactly the batches of an uninterrupted one.

Needs ``pip install "lidarshard[mmengine]"`` (mmengine >= 0.10, pure Python, any torch it accepts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    from mmengine.dist import get_dist_info
    from mmengine.hooks import CheckpointHook, Hook
    from mmengine.registry import DATA_SAMPLERS, HOOKS
except ImportError as e:  # pragma: no cover - exercised only without mmengine
    raise ImportError('lidarshard.loaders.mmengine needs mmengine: pip install "lidarshard[mmengine]"') from e

from lidarshard.loaders.evaluation import EvalSampler, eval_costs
from lidarshard.loaders.pointcept import LoopTimer, index_from_dataset
from lidarshard.loaders.reader import PathLike
from lidarshard.loaders.torch import PlanBatchSampler, PlanSampler

__all__ = ["LidarshardSampler", "LidarshardBatchSampler", "LidarshardEvalSampler", "LidarshardTimingHook"]


@DATA_SAMPLERS.register_module()
class LidarshardSampler(PlanSampler):
    """This rank's planned dataset indices, step after step (``train_dataloader.sampler``).

    Args:
        dataset: passed by mmengine's ``Runner.build_dataloader``.
        manifest: committed manifest directory (local path or URI).
        seed: passed by mmengine; recorded only (the manifest's seed fixes the order).
        id_key: key of ``dataset.get_data_info(i)`` holding the sample_id (e.g. ``"token"``), or a
            callable ``i -> sample_id``; None: the dataset is in the samples' row order.
        cycle: reuse the plan of ``epoch % epochs`` past the planned epochs (warns).
    """

    def __init__(
        self,
        dataset: Any,
        manifest: PathLike,
        seed: int | None = None,
        id_key: str | Callable[[int], str] | None = None,
        cycle: bool = False,
    ) -> None:
        rank, world_size = get_dist_info()
        index_of = index_from_dataset(dataset, id_key, info="get_data_info")
        super().__init__(manifest, rank, world_size, index_of=index_of, cycle=cycle)
        self.seed = seed


@DATA_SAMPLERS.register_module()
class LidarshardBatchSampler(PlanBatchSampler):
    """``train_dataloader.batch_sampler``: batches of a :class:`LidarshardSampler`, size checked.

    mmengine passes the built ``sampler`` and the dataloader's ``batch_size``; a batch size other
    than the manifest's (its mean count per rank-step under ``--strategy budget``) is refused
    (``PlanSampler.check_batch_size``). Batches are the planned steps, of variable length under
    ``budget`` (``PlanBatchSampler``); the sampler's ``loss_scale(step)`` turns a summed loss into the
    global-batch mean under DDP.
    """

    def __init__(self, sampler: LidarshardSampler, batch_size: int) -> None:
        if not isinstance(sampler, PlanSampler):
            raise TypeError(
                f"LidarshardBatchSampler needs sampler=dict(type='LidarshardSampler'), got {sampler!r}"
            )
        sampler.check_batch_size(int(batch_size), "train_dataloader.batch_size")
        super().__init__(sampler)
        self.batch_size, self.drop_last = sampler.batch_size, True


@DATA_SAMPLERS.register_module()
class LidarshardEvalSampler(EvalSampler):
    """``val_dataloader.sampler`` / ``test_dataloader.sampler``: this rank's cost-balanced shard.

    Args:
        dataset: passed by mmengine's ``Runner.build_dataloader``.
        manifest: committed manifest built on this validation set (its predicted costs weight the shards).
        seed: passed by mmengine; unused (evaluation shards are deterministic).
        id_key: as for :class:`LidarshardSampler`; None: the dataset is in the samples' row order.
    """

    def __init__(
        self,
        dataset: Any,
        manifest: PathLike,
        seed: int | None = None,
        id_key: str | Callable[[int], str] | None = None,
    ) -> None:
        rank, world_size = get_dist_info()
        index_of = index_from_dataset(dataset, id_key, info="get_data_info")
        super().__init__(eval_costs(manifest, len(dataset), index_of), rank, world_size)
        self.seed = seed


@HOOKS.register_module()
class LidarshardTimingHook(Hook):
    """``custom_hooks = [dict(type="LidarshardTimingHook")]``: per-step timings for ``lidarshard calibrate``.

    Each train iteration, from ``before_train_iter`` to ``after_train_iter`` (priority ``VERY_HIGH``: the
    other hooks' work after the step, logging and checkpoints, is not counted), is one step of a
    :class:`~lidarshard.loaders.pointcept.LoopTimer`: this rank's own compute time and the plan's epoch,
    step and sample ids, under DDP (``MMDistributedDataParallel``) up to the first gradient bucket. Both
    loops count: epoch-based (``batch_idx`` of ``runner.epoch``) and iter-based (the global iteration,
    through the planned epochs the loop restarts the loader on; a resumed run continues the count).

    Args:
        out_dir: folder of the ``timings-rank-*.parquet`` files; default the ``CheckpointHook``'s (the
            ``work_dir``, or its ``out_dir``), so they travel with the checkpoints.
        flush_every, device: as for ``lidarshard.loaders.step_timer.StepTimer``. Files are also flushed
            before every checkpoint, after every epoch and at the end of training.

    Needs the train loader to replay a manifest (``LidarshardSampler``); refuses another sampler.
    """

    priority = "VERY_HIGH"

    def __init__(self, out_dir: str | None = None, flush_every: int = 1000, device: str = "auto") -> None:
        self.out_dir, self.flush_every, self.device = out_dir, flush_every, device
        self.timer: LoopTimer | None = None

    def _directory(self, runner: Any) -> str:
        if self.out_dir is not None:
            return str(self.out_dir)
        saver = next((h for h in runner.hooks if isinstance(h, CheckpointHook)), None)
        return str(getattr(saver, "out_dir", None) or runner.work_dir)  # resolved in its before_train

    def before_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None) -> None:
        if self.timer is None:  # after every before_train: the checkpoint folder is known
            self.timer = LoopTimer(
                runner.train_dataloader,
                self._directory(runner),
                runner.model,
                flush_every=self.flush_every,
                device=self.device,
            )
        self.timer.start(runner.epoch, batch_idx)

    def after_train_iter(
        self, runner: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        if self.timer is not None:
            self.timer.stop()

    def before_save_checkpoint(self, runner: Any, checkpoint: dict) -> None:
        if self.timer is not None:
            self.timer.flush()

    def after_train_epoch(self, runner: Any) -> None:
        if self.timer is not None:
            self.timer.flush()

    def after_train(self, runner: Any) -> None:
        if self.timer is not None:
            self.timer.close()

    def after_run(self, runner: Any) -> None:
        self.after_train(runner)

"""OpenMMLab adapter: ``LidarshardSampler`` in mmengine's ``DATA_SAMPLERS`` registry (mmdet3d, mmseg ...).

Importing this module registers ``LidarshardSampler``, ``LidarshardBatchSampler``, ``LidarshardEvalSampler``
and ``LidarshardTimingHook``; a config then only swaps the sampler. Ranks come from
``mmengine.dist.get_dist_info()``; ``DistSamplerSeedHook``'s ``set_epoch`` selects the epoch's plan; the
runner's seed does not change the order (the manifest's ``--seed`` fixed it). ``LidarshardEvalSampler``
does not pad like ``DefaultSampler``, and ``collect_results`` interleaves the ranks' results, so metrics
must match predictions by sample id. Config, resume and timings: docs/FRAMEWORKS.md ("mmengine").
Needs ``pip install "lidarshard[mmengine]"``.
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
    """``train_dataloader.batch_sampler``: the planned steps of a :class:`LidarshardSampler`.

    A ``batch_size`` other than the manifest's is refused (``PlanSampler.check_batch_size``); steps are of
    variable length under ``--strategy budget`` (``PlanBatchSampler``).
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

    Each train iteration (``before_train_iter`` .. ``after_train_iter``, priority ``VERY_HIGH`` so logging and
    checkpoints are not counted) is one step of a :class:`~lidarshard.loaders.pointcept.LoopTimer`, in
    epoch- and iter-based loops alike. Files are flushed before every checkpoint, after every epoch and at
    the end.

    Args:
        out_dir: folder of the ``timings-rank-*.parquet`` files; default the ``CheckpointHook``'s.
        flush_every, device: as for ``lidarshard.loaders.step_timer.StepTimer``.
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

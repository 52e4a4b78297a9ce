"""PyTorch adapters: a batch sampler that replays a rank's manifest, and a point-cloud dataset.

Typical use with ``torch.distributed`` initialized::

    dataset = PointCloudDataset(out_dir)
    sampler = BalancedBatchSampler(out_dir)          # rank / world size from torch.distributed
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=4)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for step, batch in enumerate(loader):
            ...

Needs PyTorch: ``pip install "lidarshard[torch]"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

try:
    import torch
    import torch.distributed as dist
    from torch.utils.data import Dataset, Sampler
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError(
        'lidarshard.loaders.torch needs PyTorch, which is an optional extra: pip install "lidarshard[torch]"'
    ) from e

from lidarshard.loaders.reader import ManifestReader, PathLike, load_manifest, load_points, read_samples

__all__ = ["BalancedBatchSampler", "PlanSampler", "PointCloudDataset", "collate"]


def _rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values win; otherwise take them from an initialized ``torch.distributed``."""
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    if dist.is_available() and dist.is_initialized():
        return (
            dist.get_rank() if rank is None else int(rank),
            dist.get_world_size() if world_size is None else int(world_size),
        )
    raise ValueError("pass rank and world_size, or initialize torch.distributed first")


class BalancedBatchSampler(Sampler[list[int]]):
    """Yields, step by step, the dataset indices of this rank's planned batch.

    Use as ``DataLoader(dataset, batch_sampler=sampler)``. Call :meth:`set_epoch` before each epoch
    as with ``DistributedSampler``. ``len(sampler)`` is the number of steps of the current epoch.

    Args:
        out_dir: committed manifest directory (local path or URI).
        rank: data-parallel rank; default ``torch.distributed.get_rank()``.
        world_size: ranks; default ``torch.distributed.get_world_size()``; must match the manifest.
        index_of: sample_id -> dataset index, as a mapping or a callable. Default: the row order of
            samples.parquet, which is :class:`PointCloudDataset`'s order.
        cycle: allow epochs past those planned, reusing the plan of ``epoch % epochs`` (warns).

    Resume: ``state_dict()`` is ``{"epoch", "step"}`` where ``step`` counts the batches this sampler
    has yielded in the epoch; after ``load_state_dict`` the next iteration yields exactly the remaining
    batches (``set_epoch`` with the same epoch keeps the position). A ``DataLoader`` with workers
    draws up to ``num_workers * prefetch_factor`` batches ahead of the training loop, so when saving a
    checkpoint from the loop, store the steps the loop has finished instead:
    ``{"epoch": epoch, "step": steps_done}``.
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
        self._step = 0  # batches yielded so far in this epoch
        self._resume = 0  # where the next iteration starts

    def _lookup(self, sample_id: str) -> int:
        if not isinstance(self.index_of, Mapping):
            return int(self.index_of(sample_id))
        try:
            return int(self.index_of[sample_id])
        except KeyError:
            raise KeyError(f"sample_id {sample_id!r} of the plan is not in index_of") from None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration replays; a new epoch starts at step 0."""
        if epoch != self.epoch:
            self.epoch, self._step, self._resume = int(epoch), 0, 0

    def _reader(self, start_step: int = 0) -> ManifestReader:
        return ManifestReader(
            self.out_dir, self.rank, self.world_size, self.epoch, start_step=start_step, cycle=self.cycle
        )

    def __len__(self) -> int:
        epochs = int(self.manifest["epochs"])
        if self.epoch >= epochs and not self.cycle:
            return len(self._reader())  # raises the reader's "not planned" error
        return int(self.manifest["steps_per_epoch"][self.epoch % epochs])

    def __iter__(self) -> Iterator[list[int]]:
        reader = self._reader(self._resume)
        self._resume = 0
        self._step = reader.start_step
        for batch in reader:
            indices = [self._lookup(sid) for sid in batch.sample_ids]
            self._step = batch.step + 1
            yield indices

    def state_dict(self) -> dict[str, int]:
        """``{"epoch": e, "step": batches yielded in epoch e}``."""
        return {"epoch": self.epoch, "step": self._step}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume: the next iteration yields the batches of ``state["epoch"]`` from ``state["step"]``."""
        self.epoch = int(state["epoch"])
        self._step = self._resume = int(state["step"])


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
        if passes < 1:
            raise ValueError(f"passes must be >= 1, got {passes}")
        self.batches = BalancedBatchSampler(out_dir, rank, world_size, index_of=index_of, cycle=cycle)
        self.batch_size = int(self.batches.manifest["batch_size"])
        self.passes = int(passes)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration replays (``DistributedSampler`` convention)."""
        self.epoch = int(epoch)
        self.batches.set_epoch(self.epoch * self.passes)

    def __len__(self) -> int:
        if self.passes == 1:
            return len(self.batches) * self.batch_size
        steps = 0
        for j in range(self.passes):
            self.batches.set_epoch(self.epoch * self.passes + j)
            steps += len(self.batches)
        self.batches.set_epoch(self.epoch * self.passes)
        return steps * self.batch_size

    def __iter__(self) -> Iterator[int]:
        for j in range(self.passes):
            if self.passes > 1:
                self.batches.set_epoch(self.epoch * self.passes + j)
            for batch in self.batches:
                yield from batch

    def state_dict(self) -> dict[str, int]:
        return self.batches.state_dict()

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.batches.load_state_dict(state)
        self.epoch = int(state["epoch"]) // self.passes


class PointCloudDataset(Dataset[dict[str, Any]]):
    """The accepted samples of a manifest, in samples.parquet row order.

    ``dataset[i]`` reads sample i's keyframe and, with ``sweeps=True``, its planned sweeps moved into
    the keyframe frame (``lidarshard.transforms.nuscenes.multisweep.aggregate``), and returns
    ``{"index": i, "sample_id": str, "points": torch.float32 (N, C)}`` with x, y, z (m) first.

    Args:
        out_dir: committed manifest directory (local path or URI).
        sweeps: aggregate the sweeps listed in samples.parquet (False: keyframe only).
        point_dims: channels per point for raw ``bin`` files.
    """

    def __init__(self, out_dir: PathLike, *, sweeps: bool = True, point_dims: int | None = None) -> None:
        cols = ["sample_id", "path", "sweep_paths", "sweep_transforms", "format"]
        table = read_samples(out_dir, cols).combine_chunks()
        self.sample_ids: list[str] = table["sample_id"].to_pylist()
        # Per-sample paths and matrices stay in Arrow buffers: compact, and no Python objects whose
        # refcounts would un-share forked DataLoader workers' memory page by page.
        self._paths = table["path"].chunk(0) if table.num_rows else pa.array([], pa.string())
        self._formats = table["format"].chunk(0) if table.num_rows else pa.array([], pa.string())
        self._sweeps = (
            table["sweep_paths"].chunk(0) if table.num_rows else pa.array([], pa.list_(pa.string()))
        )
        tf = table["sweep_transforms"].chunk(0) if table.num_rows else pa.array([], pa.list_(pa.float64()))
        self._tf_values = tf.values.to_numpy(zero_copy_only=False).astype(np.float64)
        self._tf_offsets = tf.offsets.to_numpy().astype(np.int64)
        self.sweeps = sweeps
        self.point_dims = point_dims

    def __len__(self) -> int:
        return len(self.sample_ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        sweep_paths = (self._sweeps[i].as_py() or []) if self.sweeps else []
        lo, hi = self._tf_offsets[i], self._tf_offsets[i + 1]
        points = load_points(
            self._paths[i].as_py(),
            self._formats[i].as_py(),
            sweep_paths,
            self._tf_values[lo:hi],
            self.point_dims,
        )
        return {"index": int(i), "sample_id": self.sample_ids[i], "points": torch.from_numpy(points)}


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate variable-size clouds with a batch index (the usual point-cloud convention).

    Returns:
        ``{"sample_id": [B str], "index": (B,) int64, "points": (sum N_b, C) float32,
        "batch": (sum N_b,) int64 sample position b of each point, "num_points": (B,) int64}``.
    """
    counts = torch.tensor([it["points"].shape[0] for it in items], dtype=torch.int64)
    return {
        "sample_id": [it["sample_id"] for it in items],
        "index": torch.tensor([it["index"] for it in items], dtype=torch.int64),
        "points": torch.cat([it["points"] for it in items], dim=0),
        "batch": torch.repeat_interleave(torch.arange(len(items)), counts),
        "num_points": counts,
    }

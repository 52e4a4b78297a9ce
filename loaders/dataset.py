"""PyTorch dataset of a manifest's samples (points, sweeps, lidarseg labels) and its ``collate``;
re-exported by ``lidarshard.loaders.torch``.

Needs PyTorch: ``pip install "lidarshard[torch]"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.loaders.points import load_points
from lidarshard.loaders.reader import PathLike, load_manifest, needs_torch, read_samples

try:
    import torch
    from torch.utils.data import Dataset
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise needs_torch(__name__) from e

from lidarshard.transforms import storage
from lidarshard.transforms.paths import PathResolver

__all__ = ["PointCloudDataset", "collate", "IGNORE_LABEL"]

#: Label of points lidarseg does not label (aggregated sweep rows); pass as ``ignore_index``.
IGNORE_LABEL = -1


class PointCloudDataset(Dataset[dict[str, Any]]):
    """The accepted samples of a manifest, in the samples' row order (by sample_id).

    ``dataset[i]`` reads sample i's keyframe and, with ``sweeps=True``, its planned sweeps moved into
    the keyframe frame (``lidarshard.transforms.nuscenes.multisweep.aggregate``), and returns
    ``{"index": i, "sample_id": str, "points": torch.float32 (N, C)}`` with x, y, z (m) first; with
    ``labels=True`` also ``"labels": torch.int64 (N,)``: the keyframe's lidarseg class ids (its rows
    come first), ``IGNORE_LABEL`` (-1) on sweep rows, which lidarseg does not label.

    Args:
        out_dir: committed manifest directory (local path or URI).
        sweeps: aggregate the sweeps listed in the samples (False: keyframe only).
        point_dims: channels per point for raw ``bin`` files.
        root: where the data lives now, for a manifest of relative paths (default: its ``path_root``).
        path_map: ``{"/old/prefix": "/new/prefix"}`` for a manifest of full paths.
        labels: also read each sample's lidarseg file (the samples' ``label_path``); every
            sample must have one.
    """

    def __init__(
        self,
        out_dir: PathLike,
        *,
        sweeps: bool = True,
        point_dims: int | None = None,
        root: str | None = None,
        path_map: Mapping[str, str] | None = None,
        labels: bool = False,
    ) -> None:
        cols = ["sample_id", "path", "sweep_paths", "sweep_transforms", "format", "label_path"]
        self.resolve_path = PathResolver(load_manifest(out_dir).path_root, root, path_map)
        table = read_samples(out_dir, cols).combine_chunks()
        self._labels = table["label_path"].chunk(0) if labels and table.num_rows else None
        if self._labels is not None and self._labels.null_count:
            first = table["sample_id"].filter(self._labels.is_null())[0].as_py()
            raise ValueError(
                f"{self._labels.null_count} samples have no lidarseg labels (first: {first}); "
                "build from a nuScenes dataroot whose lidarseg.json lists them"
            )
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
        sweep_paths = [self.resolve_path(p) for p in self._sweeps[i].as_py() or []] if self.sweeps else []
        lo, hi = self._tf_offsets[i], self._tf_offsets[i + 1]
        points = load_points(
            self.resolve_path(self._paths[i].as_py()),
            self._formats[i].as_py(),
            sweep_paths,
            self._tf_values[lo:hi],
            self.point_dims,
        )
        item = {"index": int(i), "sample_id": self.sample_ids[i], "points": torch.from_numpy(points)}
        if self._labels is not None:
            label_path = self.resolve_path(self._labels[i].as_py())
            item["labels"] = torch.from_numpy(_keyframe_labels(label_path, len(points)))
        return item


def _keyframe_labels(label_path: str, num_points: int) -> NDArray[np.int64]:
    """(num_points,) int64: the uint8 lidarseg ids of the keyframe rows, then ``IGNORE_LABEL``."""
    keyframe = np.frombuffer(storage.read_bytes(label_path), dtype=np.uint8)
    if keyframe.size > num_points:
        raise ValueError(f"{label_path}: {keyframe.size} labels for a sample of {num_points} points")
    out = np.full(num_points, IGNORE_LABEL, dtype=np.int64)
    out[: keyframe.size] = keyframe
    return out


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate variable-size clouds with a batch index (the usual point-cloud convention).

    Returns:
        ``{"sample_id": [B str], "index": (B,) int64, "points": (sum N_b, C) float32,
        "batch": (sum N_b,) int64 sample position b of each point, "num_points": (B,) int64}``, plus
        ``"labels": (sum N_b,) int64`` when the items carry labels.
    """
    counts = torch.tensor([it["points"].shape[0] for it in items], dtype=torch.int64)
    labels = {"labels": torch.cat([it["labels"] for it in items])} if items and "labels" in items[0] else {}
    return labels | {
        "sample_id": [it["sample_id"] for it in items],
        "index": torch.tensor([it["index"] for it in items], dtype=torch.int64),
        "points": torch.cat([it["points"] for it in items], dim=0),
        "batch": torch.repeat_interleave(torch.arange(len(items)), counts),
        "num_points": counts,
    }

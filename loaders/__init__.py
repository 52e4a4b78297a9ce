"""The trainer side: read a rank's manifest. Imports no Beam; this package, ``reader``, ``elastic`` and
``replan`` (restarts on another world size) import no torch.

``lidarshard.loaders.torch`` (``BalancedBatchSampler``, ``PlanLoader``; ``PointCloudDataset`` and ``collate``
from ``loaders.dataset``) and the framework adapters need PyTorch: ``pip install "lidarshard[torch]"``.
"""

from lidarshard.loaders.points import load_points
from lidarshard.loaders.reader import (
    Batch,
    ManifestReader,
    load_manifest,
    plan_dataset,
    read_samples,
)

__all__ = [
    "Batch",
    "ManifestReader",
    "load_manifest",
    "load_points",
    "plan_dataset",
    "read_samples",
]

"""The trainer side: read a rank's manifest. Imports no Beam; torch only in ``lidarshard.loaders.torch``.

``lidarshard.loaders.torch`` (``BalancedBatchSampler``, ``PointCloudDataset``, ``collate``) needs PyTorch:
``pip install "lidarshard[torch]"``.
"""

from lidarshard.loaders.reader import (
    Batch,
    ManifestReader,
    load_manifest,
    load_points,
    plan_dataset,
    read_samples,
)

__all__ = ["Batch", "ManifestReader", "load_manifest", "load_points", "plan_dataset", "read_samples"]

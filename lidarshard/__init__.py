"""lidarshard: cost-balanced, rank-sharded Parquet manifests for distributed LiDAR training.

The public API is loaded lazily, so ``import lidarshard`` costs nothing and a trainer install
(numpy + pyarrow) never touches Beam or torch::

    import lidarshard
    reader = lidarshard.ManifestReader("OUT", rank=0, world_size=4, epoch=0)
    sampler = lidarshard.BalancedBatchSampler("OUT")  # needs torch
    lidarshard.write_manifest(table, "OUT", world_size=4, batch_size=2)  # from your own sample list
    lidarshard.build("data/", "OUT", world_size=4, batch_size=2)  # scan + plan with Beam

Stage packages (the repository's top-level folders): ``lidarshard.transforms`` (pure steps),
``lidarshard.pipelines`` (Beam commands and tools), ``lidarshard.schemas`` (the manifest
contract), ``lidarshard.loaders`` (the trainer side).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

__version__ = "0.3.0"
#: Set to 1 to get the full traceback of a failed run (same as ``--debug``).
DEBUG_ENV = "LIDARSHARD_DEBUG"

# The editable install (`make`, strict mode) links the whole package into
# build/__editable__.lidarshard-*/lidarshard/. Run from the repository root, the bare lidarshard/ folder
# there (this file alone) comes first on sys.path: the stage packages are then found in the linked copy,
# the other lidarshard/ on sys.path. Anywhere else the package is the one lidarshard/ and nothing changes.
__path__ = pkgutil.extend_path(__path__, __name__)

#: public name -> module that defines it
_API: dict[str, str] = {
    "ManifestReader": "lidarshard.loaders.reader",
    "Batch": "lidarshard.loaders.reader",
    "load_manifest": "lidarshard.loaders.reader",
    "load_points": "lidarshard.loaders.points",
    "read_samples": "lidarshard.loaders.reader",
    "plan_dataset": "lidarshard.loaders.reader",
    "BalancedBatchSampler": "lidarshard.loaders.torch",
    "PlanLoader": "lidarshard.loaders.torch",
    "EvalSampler": "lidarshard.loaders.evaluation",
    "PlanSampler": "lidarshard.loaders.torch",
    "ElasticBatchSampler": "lidarshard.loaders.elastic",
    "Manifest": "lidarshard.schemas.manifest",
    "PointCloudDataset": "lidarshard.loaders.torch",
    "collate": "lidarshard.loaders.torch",
    "build": "lidarshard.pipelines.api",
    "replan": "lidarshard.pipelines.api",
    "write_manifest": "lidarshard.pipelines.api",
    "plan_epoch": "lidarshard.transforms.plan",
    "STRATEGIES": "lidarshard.transforms.plan",
}

__all__ = ["__version__", *_API]


#: the optional extra that installs a missing top-level module the public API needs
_EXTRAS: dict[str, tuple[str, str]] = {
    "apache_beam": ("Apache Beam", "pipeline"),
    "torch": ("PyTorch", "torch"),
}


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'lidarshard' has no attribute {name!r}")
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as e:  # a core install (numpy + pyarrow): name the extra, in one line
        missing = (e.name or "").split(".")[0]
        if missing not in _EXTRAS:
            raise
        what, extra = _EXTRAS[missing]
        raise ModuleNotFoundError(
            f'lidarshard.{name} needs {what}, which is an optional extra: pip install "lidarshard[{extra}]"',
            name=missing,
        ) from None
    value = getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

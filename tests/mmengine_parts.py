"""The mmengine parts of tests/test_mmengine.py, imported by the tests that use them rather than when pytest
collects: mmengine pulls in torch.distributed, FSDP and sympy, ~5 s in every pytest worker."""

from __future__ import annotations

import torch
from mmengine.model import BaseModel
from mmengine.registry import DATA_SAMPLERS
from mmengine.runner import Runner

import lidarshard.loaders.mmengine  # noqa: F401  (registers the samplers)

__all__ = ["CLOCK", "DATA_SAMPLERS", "PointCountModel", "Runner"]

#: The step timer's host clock in the timing tests (``fake_clock``): the model advances it 1 us per point.
CLOCK = {"t": 0.0}


class PointCountModel(BaseModel):
    """Fits one scale to the mean |xyz| of each batch; records the dataset indices it trained on; advances
    ``CLOCK`` by 1 us per point (the work a real model would do)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def forward(self, points, index, mode="tensor", **_):  # noqa: ANN001, ANN201 - mmengine's signature
        self.seen.append(index.tolist())
        CLOCK["t"] += 1e-6 * points.shape[0]
        return {"loss": (self.scale - points[:, :3].abs().mean()) ** 2}

"""The manifest's ``memory_cap`` (4.4): the per-rank-step memory cap in bytes and the memory model that
predicts a rank-step's peak (``lidarshard calibrate`` fits it from the recorder's ``peak_bytes``). Pure:
imports nothing else of lidarshard but the contract.

A record checks shapes and types; whether the model can be applied (coefficients >= 0, room under the
cap) is the consumer's check (``lidarshard.transforms.plan.memory``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lidarshard.schemas.jsonread import Reader

__all__ = ["MemoryModelRecord", "MemoryCapRecord", "MEMORY_MODEL_KEYS", "MAX_BYTES"]

#: The most bytes a cap, a recorded peak or a predicted one may be (1 EiB): beyond, the sums of a plan would
#: lose their integer precision, and no device holds more.
MAX_BYTES = 1 << 60

#: A memory model's keys: predicted peak bytes of a rank-step = base_bytes + bytes_per_point * its points
#: + bytes_per_voxel * its occupied voxels (sums over the rank's samples at the step).
MEMORY_MODEL_KEYS = ("base_bytes", "bytes_per_point", "bytes_per_voxel")


@dataclass(frozen=True)
class MemoryModelRecord:
    """``{"base_bytes", "bytes_per_point", "bytes_per_voxel"}``: finite numbers (bytes)."""

    base_bytes: float
    bytes_per_point: float
    bytes_per_voxel: float

    @classmethod
    def parse(cls, obj: object, where: str) -> MemoryModelRecord:
        """``obj``: a parsed JSON object holding the three keys (others are ignored: a calibrate file's
        ``memory_model`` adds its fit statistics)."""
        if not isinstance(obj, dict):
            raise ValueError(
                f"{where} must be a JSON object of {list(MEMORY_MODEL_KEYS)}, got {type(obj).__name__}"
            )
        r = Reader(obj, where)
        values = [r.number(k) for k in MEMORY_MODEL_KEYS]
        return cls(*(float(v) for v in values if v is not None))

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in MEMORY_MODEL_KEYS}


@dataclass(frozen=True)
class MemoryCapRecord:
    """``{"max_step_bytes": int >= 1, "model": MemoryModelRecord}``: every rank-step's predicted peak is at
    most ``max_step_bytes`` (``build --max-step-memory``)."""

    max_step_bytes: int
    model: MemoryModelRecord

    @classmethod
    def parse(cls, r: Reader) -> MemoryCapRecord | None:
        """``r.obj['memory_cap']``, or None when it is absent or null."""
        if r.obj_("memory_cap", optional=True) is None:
            return None
        c = r.sub("memory_cap")
        if set(c.obj) != {"max_step_bytes", "model"}:
            raise r.fail("memory_cap", "an object of ['max_step_bytes', 'model']", c.obj)
        return cls(c.int_("max_step_bytes", 1), MemoryModelRecord.parse(c.obj["model"], f"{c.where}: model"))

    def to_json(self) -> dict[str, Any]:
        return {"max_step_bytes": self.max_step_bytes, "model": self.model.to_json()}

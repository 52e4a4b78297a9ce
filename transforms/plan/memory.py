"""Memory in bytes: ``--max-step-memory 20GiB`` and the memory model that predicts a rank-step's peak. Pure.

A rank-step's predicted peak device memory is ``base + per_point * sum(points) + per_voxel * sum(voxels)``
over the rank's samples at that step: the per-step ``base`` holds what every step keeps (weights,
gradients, optimizer state, the allocator's cache), and the activations of a batch grow with the *sum*
of its members, because a batch is one concatenated (sparse) tensor whose activations all stay alive
until the backward pass. (The max over the members would model samples processed one after the other.)
``points`` and ``voxels`` are the features the cost model reads (``num_in_range``, else ``num_points``;
``occupied_voxels``). ``lidarshard calibrate`` fits the model to the recorder's ``peak_bytes``.

The cap rides with the other caps (``caps.Caps.memory``): a sample alone over it is rejected
(``over_cap``), ``budget`` plans within it, every strategy's plan is checked against it
(``caps.cap_breaches``, which ``validate`` runs again), and ``--heaviest-first memory`` puts each epoch's
heaviest rank-step by predicted peak at step 0. The manifest's and calibrate's records of the model and
the cap convert to these types in one place each: ``model_of_record`` here, ``caps.Caps.from_record``.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.schemas.memory_cap import MAX_BYTES, MemoryModelRecord
from lidarshard.transforms.declare import option
from lidarshard.transforms.features.cost import points_column
from lidarshard.transforms.io import storage
from lidarshard.transforms.value_checks import parsed_by

__all__ = [
    "UNITS",
    "parse_bytes",
    "checked_bytes",
    "format_bytes",
    "MemoryModel",
    "MemoryCap",
    "sample_features",
    "load_memory_model",
    "model_of_record",
    "memory_model_of",
    "OVER_CAP",
]

#: What a per-rank-step cap does, as its flag's help says.
OVER_CAP = (
    "; a sample above it is rejected as over_cap, budget plans within it, other strategies fail over it"
)

#: Byte units ``--max-step-memory`` takes (binary: 1 KiB = 1024 B).
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB)")


def parse_bytes(text: str) -> int:
    """``"20GiB"``, ``"1.5 TiB"``, ``"512MiB"``, ``"4096B"`` -> bytes (int, rounded down), at least 1.

    Raises:
        ValueError: anything else (no unit, a decimal unit such as GB, negative, zero, NaN), one line.
    """
    m = _SIZE.fullmatch(str(text).strip())
    if m is None:
        raise ValueError(
            f"--max-step-memory {text!r}: give a size with a unit, one of {', '.join(UNITS)} (e.g. 20GiB)"
        )
    value = int(float(m.group(1)) * UNITS[m.group(2)])
    if not 1 <= value <= MAX_BYTES:
        raise ValueError(f"--max-step-memory {text!r}: give a size of at least 1B and at most 1 EiB")
    return value


def checked_bytes(value: object) -> int:
    """A cap given to the Python API: an int of bytes, or a size text (``parse_bytes``)."""
    if isinstance(value, str):
        return parse_bytes(value)
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, numbers.Integral)
        or not 1 <= int(value) <= MAX_BYTES
    ):
        raise ValueError(f"max_step_memory {value!r}: give bytes (an int >= 1) or a size such as '20GiB'")
    return int(value)


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest unit that keeps it >= 1, e.g. ``21.5 GiB``."""
    unit = next((u for u in reversed(UNITS) if abs(n) >= UNITS[u]), "B")
    return f"{n / UNITS[unit]:.4g} {unit}"


def sample_features(
    samples: pa.Table, lacking: Mapping[str, int] | None = None
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
    """(points (N,), voxels (N,) or None when any sample lacks them) as the cost model reads them:
    ``cost.points_column`` (``num_in_range``, else ``num_points``), ``occupied_voxels``. ``lacking``:
    {column: nulls in the whole input} when ``samples`` is a slice of it (``cost.sample_costs``)."""
    points = samples.column(points_column(samples, lacking)).to_numpy(zero_copy_only=False)
    name, voxels = "occupied_voxels", None
    if (
        name in samples.column_names
        and (samples.column(name).null_count if lacking is None else lacking.get(name, 0)) == 0
    ):
        voxels = samples.column(name).to_numpy().astype(np.float64)
    return points.astype(np.float64), voxels


@dataclass(frozen=True)
class MemoryModel:
    """Predicted peak bytes of a rank-step: ``base + per_point * sum(points) + per_voxel * sum(voxels)``."""

    base: float
    per_point: float
    per_voxel: float

    def __post_init__(self) -> None:
        values = (self.base, self.per_point, self.per_voxel)
        if not all(math.isfinite(v) and v >= 0 for v in values) or self.per_point + self.per_voxel <= 0:
            raise ValueError(
                f"memory model base_bytes {self.base}, bytes_per_point {self.per_point}, bytes_per_voxel "
                f"{self.per_voxel}: need finite numbers >= 0 and a per-point or per-voxel term > 0"
            )

    def sample_bytes(
        self, samples: pa.Table, lacking: Mapping[str, int] | None = None
    ) -> NDArray[np.float64]:
        """(N,) bytes each sample adds to its rank-step's peak (the base not included).

        Raises:
            ValueError: the model has a voxel term but a sample lacks ``occupied_voxels``.
        """
        points, voxels = sample_features(samples, lacking)
        out = self.per_point * points
        if self.per_voxel:
            if voxels is None:
                raise ValueError(
                    "the memory model has a bytes_per_voxel term but some samples lack occupied_voxels "
                    "(--features stat?)"
                )
            out = out + self.per_voxel * voxels
        return out


@dataclass(frozen=True)
class MemoryCap:
    """``--max-step-memory``: every rank-step's predicted peak (``model``) at most ``max_bytes``."""

    max_bytes: int = option(
        "SIZE, e.g. 20GiB (B, KiB, MiB, GiB, TiB): hard cap on every rank-step's predicted peak device memory, "
        "by the --memory-model" + OVER_CAP, flag="--max-step-memory", metavar="SIZE",
        check=parsed_by(parse_bytes, checked_bytes), alone="needs --memory-model FILE: the JSON of lidarshard "
        "calibrate over timings recorded on the device (its memory_model)")  # fmt: skip
    model: MemoryModel = option(
        "FILE: lidarshard calibrate's JSON whose memory_model (fitted to the recorder's peak_bytes) predicts a "
        "rank-step's peak; needed by --max-step-memory and recorded in the manifest", flag="--memory-model",
        metavar="FILE", check=parsed_by(lambda path: load_memory_model(path), lambda v: memory_model_of(v, "memory_model")),
        alone="is used by --max-step-memory: give the cap too (e.g. 20GiB)")  # fmt: skip

    def __post_init__(self) -> None:
        if not 1 <= self.max_bytes <= MAX_BYTES:
            raise ValueError(f"--max-step-memory must be 1B .. 1 EiB, got {self.max_bytes} bytes")
        if self.model.base >= self.max_bytes:
            raise ValueError(
                f"--max-step-memory {format_bytes(self.max_bytes)} leaves no room: the memory model's "
                f"base_bytes ({format_bytes(self.model.base)}) alone reach it; raise the cap"
            )

    def peaks(self, sums: NDArray[np.float64]) -> NDArray[np.float64]:
        """Predicted peaks of rank-steps whose samples add ``sums`` bytes (any shape)."""
        return self.model.base + np.asarray(sums, dtype=np.float64)

    def detail(self, peak: float) -> str:
        """``predicted peak X > --max-step-memory Y`` for a rank-step or a sample."""
        return f"predicted peak {format_bytes(peak)} > --max-step-memory {format_bytes(self.max_bytes)}"


def model_of_record(rec: MemoryModelRecord) -> MemoryModel:
    """The memory model of its record (checked as the flags are)."""
    return MemoryModel(rec.base_bytes, rec.bytes_per_point, rec.bytes_per_voxel)


def memory_model_of(obj: object, where: str) -> MemoryModel:
    """The memory model in ``obj``: ``lidarshard calibrate``'s JSON (its ``memory_model``), or the model's
    object itself; ``where`` names it in errors.

    Raises:
        ValueError: no usable model there (one line).
    """
    if isinstance(obj, MemoryModel):
        return obj
    if isinstance(obj, dict) and "memory_model" in obj:
        note = obj.get("memory_note")
        obj, where = obj["memory_model"], f"{where}: memory_model"
        if obj is None:  # calibrate wrote why it fitted none
            why = note if isinstance(note, str) and note else "the timings recorded no peak memory"
            raise ValueError(f"{where} is null: {' '.join(why.split())} (calibrate wrote no memory model)")
    return model_of_record(MemoryModelRecord.parse(obj, where))


def load_memory_model(path: str) -> MemoryModel:
    """``--memory-model FILE``: the memory model in ``lidarshard calibrate``'s JSON at ``path``.

    Raises:
        ValueError: the file cannot be read or holds no usable model (one line).
    """
    try:
        obj = storage.read_json(path, what="the file")
    except FileNotFoundError:
        raise ValueError(f"--memory-model {path}: no such file") from None
    except OSError as e:
        raise ValueError(f"--memory-model {path}: {e.strerror or e}") from None
    return memory_model_of(obj, f"--memory-model {path}")

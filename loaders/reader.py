"""Read a committed lidarshard manifest directory: metadata, samples and one rank's plan, step by step.

Pure pyarrow/numpy; imports neither Beam nor torch. ``out_dir`` may be a local path or any URI that
``pyarrow.fs.FileSystem.from_uri`` understands (``gs://``, ``s3://``, ``file://`` ...).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from numpy.typing import NDArray

from lidarshard.schemas import (
    MANIFEST_FILE,
    SAMPLES_FILE,
    SCHEMA_VERSION,
    SUCCESS_FILE,
    plan_file,
)
from lidarshard.transforms.formats.readers import detect_format, read_points
from lidarshard.transforms.nuscenes.multisweep import aggregate

__all__ = [
    "Batch",
    "ManifestReader",
    "load_manifest",
    "load_points",
    "plan_dataset",
    "read_bytes",
    "read_samples",
    "resolve",
]

PathLike = str | os.PathLike[str]

_PLAN_COLUMNS = ["step", "slot", "sample_id", "path", "sweep_paths", "cost"]


class Batch(NamedTuple):
    """One step of one rank's plan: ``batch_size`` samples in slot order."""

    step: int
    sample_ids: list[str]
    paths: list[str]
    sweep_paths: list[list[str]]
    costs: NDArray[np.float64]  # (batch_size,), predicted cost, cost-model units


def resolve(location: PathLike) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or a URI; local paths become absolute."""
    s = os.fspath(location)
    if "://" not in s:
        return pafs.LocalFileSystem(), os.path.abspath(s)
    fs, path = pafs.FileSystem.from_uri(s)
    return fs, path.rstrip("/")


def read_bytes(location: PathLike) -> bytes:
    """The bytes of a local file or a URI (gs://, s3://, ... through pyarrow.fs)."""
    s = os.fspath(location)
    if "://" not in s:
        with open(s, "rb") as f:
            return f.read()
    fs, path = resolve(s)
    with fs.open_input_stream(path) as f:
        return f.read()


def load_manifest(out_dir: PathLike) -> dict[str, Any]:
    """The ``_manifest.json`` of a committed manifest directory.

    Raises:
        FileNotFoundError: ``_SUCCESS`` is missing (the build did not finish, or not a manifest dir).
        ValueError: the writer's schema major version differs from this reader's.
    """
    fs, base = resolve(out_dir)
    if fs.get_file_info(f"{base}/{SUCCESS_FILE}").type != pafs.FileType.File:
        raise FileNotFoundError(
            f"{os.fspath(out_dir)} is not a committed lidarshard manifest: {SUCCESS_FILE} is missing "
            "(the build did not finish, or this is not a manifest directory)"
        )
    with fs.open_input_stream(f"{base}/{MANIFEST_FILE}") as f:
        manifest = json.loads(f.read())
    version = str(manifest.get("schema_version", ""))
    if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise ValueError(
            f"{os.fspath(out_dir)} was written with schema version {version!r}; this reader supports "
            f"{SCHEMA_VERSION.split('.')[0]}.x ({SCHEMA_VERSION}): rebuild the manifest or upgrade lidarshard"
        )
    return manifest


def read_samples(out_dir: PathLike, columns: Sequence[str] | None = None) -> pa.Table:
    """samples.parquet of a committed manifest, in its row order (the default dataset index order)."""
    load_manifest(out_dir)
    fs, base = resolve(out_dir)
    dataset = ds.dataset(f"{base}/{SAMPLES_FILE}", filesystem=fs, format="parquet")
    return dataset.to_table(columns=list(columns) if columns is not None else None)


def plan_dataset(out_dir: PathLike) -> ds.Dataset:
    """All plan partitions ``epoch=E/rank=R/*.parquet`` as one hive-partitioned pyarrow dataset.

    Only the plan files are included (not samples.parquet / rejects.parquet at the top level), so
    ``plan_dataset(out).to_table(filter=(ds.field("epoch") == 0) & (ds.field("rank") == 1))`` works.
    """
    load_manifest(out_dir)
    fs, base = resolve(out_dir)
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    files = sorted(
        i.path
        for i in infos
        if i.type == pafs.FileType.File
        and i.path.endswith(".parquet")
        and _is_plan_path(i.path[len(base) :].lstrip("/"))
    )
    if not files:
        raise FileNotFoundError(f"{os.fspath(out_dir)} holds no plan files (epoch=E/rank=R/*.parquet)")
    partitioning = ds.partitioning(pa.schema([("epoch", pa.int32()), ("rank", pa.int32())]), flavor="hive")
    return ds.dataset(
        files, filesystem=fs, format="parquet", partitioning=partitioning, partition_base_dir=base
    )


def _is_plan_path(rel: str) -> bool:
    parts = rel.split("/")
    return len(parts) == 3 and parts[0].startswith("epoch=") and parts[1].startswith("rank=")


class ManifestReader:
    """Rank ``rank``'s plan for one epoch, yielded step by step as :class:`Batch` es.

    Args:
        out_dir: committed manifest directory (local path or URI).
        rank: this trainer's data-parallel rank, ``0 <= rank < world_size``.
        world_size: ranks the trainer runs; must equal the manifest's ``world_size``.
        epoch: training epoch, 0-based.
        start_step: first step to yield (resume mid-epoch); ``0 <= start_step <= steps``.
        cycle: allow ``epoch >= epochs planned`` by reusing the plan of ``epoch % epochs`` (warns).

    ``len(reader)`` is the number of batches iteration yields: ``steps - start_step``.
    """

    def __init__(
        self,
        out_dir: PathLike,
        rank: int,
        world_size: int,
        epoch: int,
        *,
        start_step: int = 0,
        cycle: bool = False,
    ) -> None:
        self.out_dir = out_dir
        self.manifest = load_manifest(out_dir)
        planned_ws = int(self.manifest["world_size"])
        if int(world_size) != planned_ws:
            raise ValueError(
                f"world size mismatch: the trainer runs world_size={world_size} but the manifest at "
                f"{os.fspath(out_dir)} was planned for world_size={planned_ws}; rebuild it with "
                f"--world-size {world_size}"
            )
        if not 0 <= rank < planned_ws:
            raise ValueError(f"rank {rank} is outside 0..{planned_ws - 1}")
        epochs = int(self.manifest["epochs"])
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch >= epochs:
            if not cycle:
                raise ValueError(
                    f"epoch {epoch} was not planned: the manifest holds epochs 0..{epochs - 1}; build "
                    f"with --epochs {epoch + 1}, or pass cycle=True to reuse the plan of epoch % {epochs}"
                )
            warnings.warn(
                f"epoch {epoch} was not planned (the manifest holds {epochs} epochs); cycle=True reuses "
                f"the plan of epoch {epoch % epochs}",
                stacklevel=2,
            )
        self.rank = int(rank)
        self.world_size = planned_ws
        self.epoch = int(epoch)
        self.plan_epoch = self.epoch % epochs
        self.batch_size = int(self.manifest["batch_size"])
        self.steps = int(self.manifest["steps_per_epoch"][self.plan_epoch])
        if not 0 <= start_step <= self.steps:
            raise ValueError(f"start_step {start_step} is outside 0..{self.steps}")
        self.start_step = int(start_step)
        self._load_plan()

    def _load_plan(self) -> None:
        fs, base = resolve(self.out_dir)
        rank_dir = f"{base}/{os.path.dirname(plan_file(self.plan_epoch, self.rank))}"
        if fs.get_file_info(rank_dir).type != pafs.FileType.Directory:
            raise FileNotFoundError(f"the manifest has no plan for epoch {self.plan_epoch} rank {self.rank}")
        table = ds.dataset(rank_dir, filesystem=fs, format="parquet").to_table(columns=_PLAN_COLUMNS)
        table = table.sort_by([("step", "ascending"), ("slot", "ascending")])
        steps, slots = table["step"].to_numpy(), table["slot"].to_numpy()
        expect = self.steps * self.batch_size
        if (
            table.num_rows != expect
            or not np.array_equal(steps, np.repeat(np.arange(self.steps), self.batch_size))
            or not np.array_equal(slots, np.tile(np.arange(self.batch_size), self.steps))
        ):
            raise ValueError(
                f"plan for epoch {self.plan_epoch} rank {self.rank} is malformed: expected exactly "
                f"{self.batch_size} slots for each of {self.steps} steps ({expect} rows), "
                f"got {table.num_rows} rows"
            )
        self._ids: list[str] = table["sample_id"].to_pylist()
        self._paths: list[str] = table["path"].to_pylist()
        self._sweeps: list[list[str]] = [s or [] for s in table["sweep_paths"].to_pylist()]
        self._costs = table["cost"].to_numpy().astype(np.float64)

    def __len__(self) -> int:
        return self.steps - self.start_step

    def batch(self, step: int) -> Batch:
        """The planned batch of ``step`` (``0 <= step < steps``)."""
        if not 0 <= step < self.steps:
            raise IndexError(f"step {step} is outside 0..{self.steps - 1}")
        lo, hi = step * self.batch_size, (step + 1) * self.batch_size
        return Batch(step, self._ids[lo:hi], self._paths[lo:hi], self._sweeps[lo:hi], self._costs[lo:hi])

    def __iter__(self) -> Iterator[Batch]:
        for step in range(self.start_step, self.steps):
            yield self.batch(step)


def load_points(
    path: str,
    fmt: str | None,
    sweep_paths: Sequence[str] = (),
    sweep_transforms: Sequence[float] | NDArray[np.float64] | None = None,
    point_dims: int | None = None,
) -> NDArray[np.float32]:
    """One sample's points: the keyframe plus its sweeps moved into the keyframe's sensor frame.

    Args:
        path: keyframe path/URI.
        fmt: reader name from samples.parquet ``format`` (None: detect from ``path``); sweeps use it too.
        sweep_paths: S sweep paths/URIs, newest first.
        sweep_transforms: 16*S floats, row-major 4x4 sweep-sensor -> keyframe-sensor per sweep.
        point_dims: channels per point for raw ``bin`` files, passed to the reader.

    Returns:
        (N + sum M', C) float32, xyz first (keyframe only when ``sweep_paths`` is empty).
    """
    fmt = fmt or detect_format(path)
    keyframe = read_points(read_bytes(path), fmt, point_dims=point_dims)
    if not sweep_paths:
        return np.ascontiguousarray(keyframe, dtype=np.float32)
    mats = np.asarray(sweep_transforms if sweep_transforms is not None else [], dtype=np.float64)
    if mats.size != 16 * len(sweep_paths):
        raise ValueError(f"{path}: {len(sweep_paths)} sweeps but {mats.size} transform values (want 16 each)")
    sweeps = [read_points(read_bytes(p), fmt, point_dims=point_dims) for p in sweep_paths]
    return aggregate(keyframe, sweeps, list(mats.reshape(-1, 4, 4)))

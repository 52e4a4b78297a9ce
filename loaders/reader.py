"""Read a committed lidarshard manifest directory: metadata, samples and one rank's plan, step by step
(a sample's points: ``lidarshard.loaders.points``).

Pure pyarrow/numpy; imports neither Beam nor torch. ``out_dir`` may be a local path or a URI
(``gs://``, ``s3://``, ``file://`` ...): every read goes through ``lidarshard.transforms.storage``.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

if TYPE_CHECKING:  # pyarrow.dataset is imported where it is used: it doubles the import time
    import pyarrow.dataset as ds

from lidarshard.schemas import (
    MANIFEST_FILE,
    PLAN_DIR,
    SUCCESS_FILE,
    check_version,
    partition_schema,
    plan_file,
    plan_schema,
)
from lidarshard.schemas.manifest import FileEntry, Manifest
from lidarshard.transforms import storage
from lidarshard.transforms.arrow import parquet_table
from lidarshard.transforms.parts import listed_parts, read_parts
from lidarshard.transforms.paths import PathResolver, path_problem
from lidarshard.transforms.storage.base import FileTooLargeError

__all__ = [
    "Batch",
    "ManifestReader",
    "load_manifest",
    "plan_dataset",
    "plan_files",
    "read_samples",
    "check_int",
    "needs_torch",
]

PathLike = str | os.PathLike[str]

_PLAN_COLUMNS = ["step", "slot", "sample_id", "path", "sweep_paths", "cost", "global_count"]


class Batch(NamedTuple):
    """One step of one rank's plan: its samples in slot order (``batch_size`` of them, or a
    variable number under ``--strategy budget``).

    ``scale`` makes DDP's gradient the mean over the global batch: with ``n_r`` samples on rank r
    and ``N = sum_r n_r``, each rank uses ``loss = scale * sum(per-sample losses)`` with
    ``scale = W / N``; DDP averages gradients over the W ranks, giving
    ``(1/W) sum_r (W/N) sum_i grad l_i = (1/N) sum_i grad l_i``. (A per-rank *mean* loss would weight
    each sample by ``1 / (W n_r)``, overweighting the samples of ranks that hold few.) With equal
    counts ``N = W*B`` and ``scale = 1/B``, the usual mean.
    """

    step: int
    sample_ids: list[str]
    paths: list[str]
    sweep_paths: list[list[str]]
    costs: NDArray[np.float64]  # (n,), predicted cost, cost-model units
    global_count: int = 0  # N: samples of all ranks at this step
    scale: float = 1.0  # W / N: multiply the summed per-sample loss by it


def needs_torch(module: str) -> ImportError:
    """The error a trainer-side module ``module`` raises when imported without PyTorch (one line)."""
    return ImportError(f'{module} needs PyTorch, which is an optional extra: pip install "lidarshard[torch]"')


def check_int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    """``value`` as an int in ``lo..hi``; refuses bools, floats, strings and numpy floats.

    Raises:
        TypeError: ``value`` is not an integer (``True``, ``0.5``, ``"0"`` ...).
        ValueError: it is outside ``lo..hi``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if hi is None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and not lo <= value <= hi:
        raise ValueError(f"{name} {value} is outside {lo}..{hi}")
    return int(value)


def load_manifest(out_dir: PathLike) -> Manifest:
    """The checked ``_manifest.json`` of a committed manifest directory (``lidarshard.schemas.manifest``).

    Raises:
        FileNotFoundError: ``_SUCCESS`` is missing (the build did not finish, or not a manifest dir).
        ValueError: the writer's schema major version differs from this reader's (the message names
            both and the rebuild command), or a key is missing or malformed (named).
    """
    base = os.fspath(out_dir)
    if not storage.exists(storage.join(base, SUCCESS_FILE)):
        raise FileNotFoundError(
            f"{os.fspath(out_dir)} is not a committed lidarshard manifest: {SUCCESS_FILE} is missing "
            "(the build did not finish, or this is not a manifest directory)"
        )
    where = os.fspath(out_dir).rstrip("/")
    raw = storage.read_json(storage.join(base, MANIFEST_FILE), what=f"{where}/{MANIFEST_FILE}")
    if not isinstance(raw, dict):
        raise ValueError(f"{where}/{MANIFEST_FILE} is not a JSON object")
    check_version(raw.get("schema_version", ""), where, raw)
    return Manifest.from_json(raw, f"{where}/{MANIFEST_FILE}")


def read_samples(out_dir: PathLike, columns: Sequence[str] | None = None) -> pa.Table:
    """The samples of a committed manifest (the parts its ``files`` lists, in order): the default
    dataset index order."""
    base = os.fspath(out_dir)
    return read_parts(
        [storage.join(base, rel) for rel in listed_parts(load_manifest(out_dir).files)], columns
    )


def plan_files(out_dir: PathLike) -> list[str]:
    """Paths (inside the manifest's filesystem) of every file under ``OUT/plan``, sorted.

    Raises:
        ValueError: a file that is not ``plan/epoch=E/rank=R/part-NNNNN.parquet`` (a stray note, a
            partial copy), naming it; the plan directory is the contract, nothing else may live there.
        FileNotFoundError: there is no plan directory or it holds no file.
    """
    _, base = storage.arrow_filesystem(os.fspath(out_dir))
    listed = storage.list_files(storage.join(os.fspath(out_dir), PLAN_DIR))
    found = sorted((f"{base}/{PLAN_DIR}/{rel}", info.size) for rel, info in listed.items())
    for path, size in found:
        if not _is_plan_path(path[len(base) :].lstrip("/")):
            raise ValueError(
                f"{path}: not a plan file (only {PLAN_DIR}/epoch=E/rank=R/part-NNNNN.parquet may live in "
                f"{PLAN_DIR}/); move it out of the manifest directory"
            )
        if not size:
            raise ValueError(f"{path}: not a readable plan file (0 bytes); rebuild the manifest")
    files = [path for path, _ in found]
    if not files:
        raise FileNotFoundError(
            f"{os.fspath(out_dir)} holds no plan files ({PLAN_DIR}/epoch=E/rank=R/*.parquet)"
        )
    return files


def plan_dataset(out_dir: PathLike) -> ds.Dataset:
    """The whole plan ``OUT/plan`` as one hive-partitioned pyarrow dataset with int32 ``epoch``, ``rank``.

    ``plan_dataset(out).to_table(filter=(ds.field("epoch") == 0) & (ds.field("rank") == 1))`` reads one
    rank's plan. Any Parquet reader can do the same from ``OUT/plan`` alone; this one also checks the
    manifest is committed and of this schema version, and that nothing foreign lives in the plan tree.
    """
    import pyarrow.dataset as ds

    load_manifest(out_dir)
    fs, base = storage.arrow_filesystem(os.fspath(out_dir))
    return ds.dataset(
        plan_files(out_dir),
        schema=pa.unify_schemas([plan_schema(), partition_schema()]),
        filesystem=fs,
        format="parquet",
        partitioning=ds.partitioning(partition_schema(), flavor="hive"),
        partition_base_dir=f"{base}/{PLAN_DIR}",
    )


def _is_plan_path(rel: str) -> bool:
    parts = rel.split("/")
    return (
        len(parts) == 4
        and parts[0] == PLAN_DIR
        and parts[1].startswith("epoch=")
        and parts[1][6:].isdigit()
        and parts[2].startswith("rank=")
        and parts[2][5:].isdigit()
        and parts[3].startswith("part-")
        and parts[3].endswith(".parquet")
    )


def _verified_bytes(path: str, recorded: FileEntry | None) -> bytes:
    """The bytes of ``path`` when they match the size and sha256 ``_manifest.json`` recorded for it.

    Raises:
        ValueError: the file is not listed, or its size or sha256 differs (rewritten after the commit).
    """
    if recorded is None:
        raise ValueError(
            f"{path}: not a readable plan file (not listed in {MANIFEST_FILE}); rebuild the manifest"
        )
    try:
        data = storage.read_bytes(path, recorded.bytes)  # never more than the recorded size
    except FileTooLargeError:
        data = b""
    if len(data) != recorded.bytes or hashlib.sha256(data).hexdigest() != recorded.sha256:
        raise ValueError(
            f"{path}: not a readable plan file (size or sha256 differs from {MANIFEST_FILE}: modified "
            "after the build); rebuild the manifest, or pass verify=False to read it anyway"
        )
    return data


def read_plan_file(
    path: str, columns: Sequence[str], recorded: FileEntry | None = None, verify: bool = False
) -> pa.Table:
    """``columns`` of one plan file; an empty, truncated or foreign file raises ValueError naming it.

    With ``verify``, the bytes must first match ``recorded`` (its ``_manifest.json`` 'files' entry).
    """
    try:
        if verify:
            table = parquet_table(_verified_bytes(path, recorded), columns)
        else:
            table = storage.read_parquet(path, columns)
    except (pa.ArrowInvalid, OSError, KeyError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(
            f"{path}: not a readable plan file ({str(e).splitlines()[0]}); rebuild the manifest"
        ) from None
    return table


class ManifestReader:
    """Rank ``rank``'s plan for one epoch, yielded step by step as :class:`Batch` es.

    Args:
        out_dir: committed manifest directory (local path or URI).
        rank: this trainer's data-parallel rank, an int ``0 <= rank < world_size``.
        world_size: ranks the trainer runs (int); must equal the manifest's ``world_size``.
        epoch: training epoch, an int >= 0.
        start_step: first step to yield (resume mid-epoch); ``0 <= start_step <= steps``.
        verify: check each plan file's size and sha256 against ``_manifest.json`` when it is opened
            (default); False reads a plan edited after the build, at the user's risk.

    Raises:
        TypeError: rank, world_size, epoch or start_step is not an int (``True``, ``0.5``, ``"0"``).
        ValueError: a value out of range, or a plan file that is empty, foreign or malformed (named).
        cycle: allow ``epoch >= epochs planned`` by reusing the plan of ``epoch % epochs`` (warns).
        root: where the data lives now (local path or URI) for a manifest of relative paths
            (``build --relative-to``); default the recorded ``path_root``.
        path_map: ``{"/old/prefix": "/new/prefix"}`` for full paths (``lidarshard.transforms.paths``).

    ``Batch.paths`` and ``sweep_paths`` are resolved, ready to open. ``len(reader)`` is the number of batches iteration yields: ``steps - start_step``.
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
        root: str | None = None,
        path_map: Mapping[str, str] | None = None,
        verify: bool = True,
    ) -> None:
        self.out_dir = out_dir
        self.verify = bool(verify)
        self.manifest = load_manifest(out_dir)
        self.resolve_path = PathResolver(self.manifest.path_root, root, path_map)
        planned_ws = self.manifest.world_size
        if check_int("world_size", world_size, 1) != planned_ws:
            raise ValueError(
                f"world size mismatch: the trainer runs world_size={world_size} but the manifest at "
                f"{os.fspath(out_dir)} was planned for world_size={planned_ws}; rebuild it with "
                f"--world-size {world_size}"
            )
        self.rank = check_int("rank", rank, 0, planned_ws - 1)
        self.epoch = check_int("epoch", epoch, 0)
        epochs = self.manifest.epochs
        if self.epoch >= epochs:
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
        self.world_size = planned_ws
        self.plan_epoch = self.epoch % epochs
        self.batch_size = self.manifest.batch_size
        self.steps = self.manifest.steps(self.plan_epoch)
        self.start_step = check_int("start_step", start_step, 0, self.steps)
        self._load_plan()

    def _load_plan(self) -> None:
        rel_dir = os.path.dirname(plan_file(self.plan_epoch, self.rank))
        rank_dir = storage.join(os.fspath(self.out_dir), rel_dir)
        if not storage.is_dir(rank_dir):
            raise FileNotFoundError(f"the manifest has no plan for epoch {self.plan_epoch} rank {self.rank}")
        files = [(storage.join(rank_dir, rel), rel) for rel in sorted(storage.list_files(rank_dir))]
        for path, rel in files:
            if not _is_plan_path(f"{rel_dir}/{rel}"):
                raise ValueError(
                    f"{path}: not a plan file (only part-NNNNN.parquet may live in a rank directory); "
                    "move it out of the manifest directory"
                )
        if not files:
            raise ValueError(f"{rank_dir}: the rank directory holds no plan file; rebuild the manifest")
        listed = self.manifest.files
        table = pa.concat_tables(
            read_plan_file(path, _PLAN_COLUMNS, listed.get(f"{rel_dir}/{rel}"), self.verify)
            for path, rel in files
        )
        table = table.sort_by([("step", "ascending"), ("slot", "ascending")])
        steps, slots = table["step"].to_numpy(), table["slot"].to_numpy()
        counts = np.bincount(steps, minlength=self.steps) if steps.size and steps.min() >= 0 else None
        starts = np.concatenate([[0], np.cumsum(counts)]) if counts is not None else None
        fixed = not self.manifest.variable_count
        if (
            counts is None
            or starts is None
            or counts.size != self.steps
            or (counts < 1).any()
            or (fixed and (counts != self.batch_size).any())
            or not np.array_equal(slots, np.arange(steps.size) - np.repeat(starts[:-1], counts))
        ):
            raise ValueError(
                f"{rank_dir}: plan for epoch {self.plan_epoch} rank {self.rank} is malformed: expected "
                f"slots 0..n-1 ({'n = batch_size ' + str(self.batch_size) if fixed else 'n >= 1'}) for "
                f"each of {self.steps} steps, got {table.num_rows} rows"
            )
        self._starts = starts
        self._global = table["global_count"].to_numpy()[starts[:-1]].astype(np.int64)
        self._ids: list[str] = table["sample_id"].to_pylist()
        problem = path_problem(table, self.manifest.path_root)
        if problem:  # a forged plan must not point the trainer outside the dataset
            raise ValueError(f"{rank_dir}: {problem}; refusing to read it (rebuild the manifest)")
        fix = self.resolve_path
        self._paths: list[str] = [fix(p) for p in table["path"].to_pylist()]
        self._sweeps: list[list[str]] = [[fix(p) for p in s or []] for s in table["sweep_paths"].to_pylist()]
        self._costs = table["cost"].to_numpy().astype(np.float64)

    def __len__(self) -> int:
        return self.steps - self.start_step

    def batch(self, step: int) -> Batch:
        """The planned batch of ``step`` (``0 <= step < steps``)."""
        if not 0 <= step < self.steps:
            raise IndexError(f"step {step} is outside 0..{self.steps - 1}")
        lo, hi = int(self._starts[step]), int(self._starts[step + 1])
        n = int(self._global[step])
        return Batch(
            step,
            self._ids[lo:hi],
            self._paths[lo:hi],
            self._sweeps[lo:hi],
            self._costs[lo:hi],
            n,
            self.world_size / n,
        )

    def __iter__(self) -> Iterator[Batch]:
        for step in range(self.start_step, self.steps):
            yield self.batch(step)

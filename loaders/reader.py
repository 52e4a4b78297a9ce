"""Read a committed lidarshard manifest directory: metadata, samples and one rank's plan, step by step
(a sample's points: ``lidarshard.loaders.points``; the plan files checked against ``_manifest.json``
before a row is read: ``lidarshard.loaders.planfiles``).

Pure pyarrow/numpy; imports neither Beam nor torch. ``out_dir`` may be a local path or a URI
(``gs://``, ``s3://``, ``file://`` ...): every read goes through ``lidarshard.transforms.io.storage``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

if TYPE_CHECKING:  # pyarrow.dataset is imported where it is used: it doubles the import time
    import pyarrow.dataset as ds

from lidarshard.loaders.held import same_plan
from lidarshard.loaders.planfiles import listed_plan_files, modified_message, read_rank_plan, verified_bytes
from lidarshard.loaders.planfiles import read_plan_file as read_plan_file  # re-exported; home: planfiles
from lidarshard.schemas import (
    MANIFEST_FILE,
    SAMPLES_DIR,
    plan_schema,
)
from lidarshard.schemas.manifest import Manifest
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import parquet_file
from lidarshard.transforms.io.metadata import load_manifest as load_manifest  # re-exported; the one reader
from lidarshard.transforms.io.parts import listed_parts
from lidarshard.transforms.io.paths import PATH_COLUMNS, PathResolver, path_problem

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


def read_samples(
    out_dir: PathLike,
    columns: Sequence[str] | None = None,
    *,
    verify: bool = True,
    manifest: Manifest | None = None,
) -> pa.Table:
    """The samples of a committed manifest (the parts its ``files`` lists, in order): the default
    dataset index order.

    The stored paths follow the plan files' rules (``path_problem``: relative to the recorded
    ``path_root`` and inside it, or full paths when none is recorded). With ``verify`` (default) each
    part must have the size ``_manifest.json`` records, and a read that includes a path column (what
    a trainer opens) also checks each part's sha256; ``verify=False`` reads parts edited after the
    build, at the user's risk. ``manifest``: its ``load_manifest``, when already read.

    Raises:
        FileNotFoundError: a listed part is missing.
        ValueError: a part's size or sha256 differs from ``_manifest.json``, or a stored path leaves
            ``path_root`` (one line naming it).
    """
    base = os.fspath(out_dir)
    manifest = load_manifest(out_dir) if manifest is None else manifest
    whole = columns is None or any(c in PATH_COLUMNS for c in columns)  # then each part's sha256 is checked
    with same_plan(
        base, manifest, None, verify and whole
    ):  # OUT still holds the samples ``manifest`` records
        table = _read_parts(base, manifest, columns, verify)
    problem = path_problem(table, manifest.path_root)
    if problem:  # a forged part must not point the trainer outside the dataset
        raise ValueError(
            f"{base.rstrip('/')}/{SAMPLES_DIR}: {problem}; refusing to read it (rebuild the manifest)"
        )
    return table


def _read_parts(base: str, manifest: Manifest, columns: Sequence[str] | None, verify: bool) -> pa.Table:
    """The samples parts ``manifest`` lists, concatenated (``read_samples``'s checks of each part)."""
    rels = listed_parts(manifest.files)
    present = storage.list_files(storage.join(base, SAMPLES_DIR)) if verify else {}
    whole = columns is None or any(c in PATH_COLUMNS for c in columns)  # a trainer opens those paths
    tables = []
    for rel in rels:
        path, entry = storage.join(base, rel), manifest.files[rel]
        if verify:
            info = present.get(rel[len(SAMPLES_DIR) + 1 :])
            if info is None:
                raise FileNotFoundError(
                    f"{path}: listed in {MANIFEST_FILE} but missing; rebuild the manifest"
                )
            if info.size != entry.bytes:
                raise ValueError(
                    modified_message(
                        path, "samples part", f"{info.size} bytes, not the {entry.bytes} recorded in"
                    )
                )
        try:
            if verify and whole:
                with parquet_file(pa.BufferReader(verified_bytes(path, entry, "samples part"))) as f:
                    tables.append(f.read(columns=_columns(columns), use_threads=False))
            else:
                tables.append(storage.read_parquet(path, columns))
        except (pa.ArrowInvalid, OSError, KeyError) as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise ValueError(f"{path}: not a readable samples part ({str(e).splitlines()[0]})") from None
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def _columns(columns: Sequence[str] | None) -> list[str] | None:
    return list(columns) if columns is not None else None


def plan_files(out_dir: PathLike, manifest: Manifest | None = None) -> list[str]:
    """The plan files of the committed manifest at ``out_dir``, each checked against what ``OUT/plan``
    holds (``planfiles.listed_plan_files``); ``manifest``: its ``load_manifest``, when already read."""
    m = load_manifest(out_dir) if manifest is None else manifest
    return listed_plan_files(os.fspath(out_dir), m)


def plan_dataset(out_dir: PathLike) -> ds.Dataset:
    """The whole plan ``OUT/plan`` as one pyarrow dataset with int32 ``epoch``, ``rank`` first.

    ``plan_dataset(out).to_table(filter=(ds.field("epoch") == 0) & (ds.field("rank") == 1))`` reads one
    rank's plan. Any Parquet reader can do the same from ``OUT/plan`` alone; this one also checks the
    manifest is committed and of a schema version this lidarshard reads, and that the plan tree holds
    exactly the files ``_manifest.json`` lists, at their recorded sizes (``plan_files``).
    """
    import pyarrow.dataset as ds

    manifest = load_manifest(out_dir)
    fs, _ = storage.arrow_filesystem(os.fspath(out_dir))
    return ds.dataset(plan_files(out_dir, manifest), schema=plan_schema(), filesystem=fs, format="parquet")


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
        path_map: ``{"/old/prefix": "/new/prefix"}`` for full paths (``lidarshard.transforms.io.paths``).
        manifest: the ``load_manifest`` of ``out_dir`` when the caller already read it (a sampler reads
            it once and builds its readers from it).

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
        manifest: Manifest | None = None,
    ) -> None:
        self.out_dir = out_dir
        self.verify = bool(verify)
        self.manifest = load_manifest(out_dir) if manifest is None else manifest
        self.resolve_path = PathResolver(self.manifest.path_root, root, path_map)
        planned_ws = self.manifest.world_size
        if check_int("world_size", world_size, 1) != planned_ws:
            raise ValueError(
                f"world size mismatch: the trainer runs world_size={world_size} but the manifest at "
                f"{os.fspath(out_dir)} was planned for world_size={planned_ws}: train on with "
                f"lidarshard.ElasticBatchSampler(out_dir, rank, {world_size}) (any world size, exact), "
                f"or rebuild with --world-size {world_size}"
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
        with same_plan(
            self.out_dir, self.manifest, self.plan_epoch, self.verify
        ):  # OUT holds the plan opened
            table, rank_dir = read_rank_plan(
                os.fspath(self.out_dir), self.manifest, self.plan_epoch, self.rank, _PLAN_COLUMNS, self.verify
            )
            starts = self._step_starts(table, rank_dir)
            global_count = table["global_count"].to_numpy()[starts[:-1]].astype(np.int64)
            self._check_counts(np.diff(starts), global_count, rank_dir)
        self._starts = starts
        self._global = global_count
        self._ids: list[str] = table["sample_id"].to_pylist()
        problem = path_problem(table, self.manifest.path_root)
        if problem:  # a forged plan must not point the trainer outside the dataset
            raise ValueError(f"{rank_dir}: {problem}; refusing to read it (rebuild the manifest)")
        fix = self.resolve_path
        self._paths: list[str] = [fix(p) for p in table["path"].to_pylist()]
        self._sweeps: list[list[str]] = [[fix(p) for p in s or []] for s in table["sweep_paths"].to_pylist()]
        self._costs = table["cost"].to_numpy().astype(np.float64)

    def _step_starts(self, table: pa.Table, rank_dir: str) -> NDArray[np.int64]:
        """(steps + 1,) first row of each step in ``table`` (sorted by step, slot), once the rows are
        checked to be ``steps`` runs of slots 0..n-1 (n = batch_size, or n >= 1 under budget). The row
        count is compared with ``steps`` before anything is sized by it: a forged ``steps_per_epoch``
        (1e12) costs one line, not an allocation."""
        steps, slots = table["step"].to_numpy(), table["slot"].to_numpy()
        fixed = not self.manifest.variable_count
        rows, n = table.num_rows, self.steps
        ok = (rows == n * self.batch_size) if fixed else (n <= rows)
        ok = ok and (rows == 0 or (0 <= int(steps.min()) and int(steps.max()) < n))
        counts = np.bincount(steps, minlength=n) if ok else None
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64) if counts is not None else None
        if (
            counts is None
            or starts is None
            or (counts < 1).any()
            or (fixed and (counts != self.batch_size).any())
            or not np.array_equal(slots, np.arange(steps.size) - np.repeat(starts[:-1], counts))
        ):
            raise ValueError(
                f"{rank_dir}: plan for epoch {self.plan_epoch} rank {self.rank} is malformed: expected "
                f"slots 0..n-1 ({'n = batch_size ' + str(self.batch_size) if fixed else 'n >= 1'}) for "
                f"each of {n} steps, got {rows} rows"
            )
        return starts

    def _check_counts(
        self, counts: NDArray[np.int64], global_count: NDArray[np.int64], rank_dir: str
    ) -> None:
        """Each step's ``global_count`` (samples of all ranks) against this rank's own count and the
        manifest's world size: the other W-1 ranks hold at least one sample each, and exactly
        ``batch_size`` each when counts are fixed. A ``world_size`` forged to 1 while the rows say 4
        samples a step is refused here (``Batch.scale`` would be wrong)."""
        w = self.world_size
        if self.manifest.variable_count:
            bad = (global_count < counts + (w - 1)) | (w == 1) & (global_count != counts)
        else:
            bad = global_count != w * self.batch_size
        if bad.any():
            step = int(np.argmax(bad))
            raise ValueError(
                f"{rank_dir}: step {step} records global_count {int(global_count[step])}, impossible for "
                f"world_size {w} x batch_size {self.batch_size} with {int(counts[step])} samples on this rank "
                f"({MANIFEST_FILE} and the plan disagree); rebuild the manifest"
            )

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

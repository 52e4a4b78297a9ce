"""PyTorch dataset of a manifest's samples (points, sweeps, lidarseg labels) and its ``collate``;
re-exported by ``lidarshard.loaders.torch``.

Needs PyTorch: ``pip install "lidarshard[torch]"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.loaders._atexit import drain_arrow_at_exit
from lidarshard.loaders.fetch import Fetcher, File, FileCache
from lidarshard.loaders.points import Recorded, check_time_lags, load_points, moved_hint
from lidarshard.loaders.reader import PathLike, load_manifest, needs_torch, read_samples
from lidarshard.schemas.records import label_maps
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.formats.labels import decode_labels, label_format
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.paths import PathResolver
from lidarshard.transforms.layouts.multisweep import (
    check_close_points,
    non_finite_rows,
    recorded_close_points,
)

try:
    import torch
    from torch.utils.data import Dataset
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise needs_torch(__name__) from e

__all__ = ["PointCloudDataset", "collate", "IGNORE_LABEL", "VERIFY"]

#: Label of points lidarseg does not label (aggregated sweep rows); pass as ``ignore_index``.
IGNORE_LABEL = -1
#: What ``PointCloudDataset(verify=...)`` checks of each file against the scan's record.
VERIFY = ("size", "hash")
#: Batches a worker reads ahead by default when the data is remote (local files: 0, no prefetch).
REMOTE_PREFETCH = 4
_COLUMNS = ["sample_id", "path", "sweep_paths", "sweep_transforms", "format", "label_path"]
#: Columns schema 4.1 added: the sample's dataset (its label map) and row keys of multi-frame files;
#: 4.3: the sweeps' time lags.
_LAYOUT_COLUMNS = ("dataset", "frame", "sweep_frames", "sweep_time_lags")


class PointCloudDataset(Dataset[dict[str, Any]]):
    """The accepted samples of a manifest, in the samples' row order (by sample_id).

    ``dataset[i]`` reads sample i's keyframe and, with ``sweeps=True``, its planned sweeps moved into
    the keyframe frame (``lidarshard.transforms.layouts.multisweep.aggregate``), and returns
    ``{"index": i, "sample_id": str, "points": torch.float32 (N, C)}`` with x, y, z (m) first; with
    ``labels=True`` also ``"labels": torch.int64 (N,)``: the keyframe's lidarseg class ids (its rows
    come first), ``IGNORE_LABEL`` (-1) on sweep rows, which lidarseg does not label.

    Every file read is checked against what the scan recorded of it (``schemas.INTEGRITY_FIELDS``):
    its size always (a file of another size raises ``loaders.points.FileChangedError`` naming it,
    after reading at most one byte more than recorded), its CRC-32 too with ``verify="hash"``. Files
    whose size was not recorded (a table given to ``write_manifest``) are read
    unchecked. The samples parts themselves are checked by ``read_samples`` (sha256, and paths inside
    ``path_root``, no ``..``, as the plan's).

    Args:
        out_dir: committed manifest directory (local path or URI).
        sweeps: aggregate the sweeps listed in the samples (False: keyframe only).
        point_dims: channels per point for raw ``bin`` files.
        root: where the data lives now, for a manifest of relative paths (default: its ``path_root``);
            refused for a manifest of full paths, which moves with ``path_map``.
        path_map: ``{"/old/prefix": "/new/prefix"}`` for a manifest of full paths.
        labels: also read each sample's lidarseg file (the samples' ``label_path``); every
            sample must have one.
        verify: ``"size"`` (default) or ``"hash"``: also the CRC-32 of every byte read (~2 GB/s);
            every sample must have one recorded (not a ``--features stat`` scan).
        prefetch: batches each DataLoader worker reads ahead, from the plan (``PlanLoader`` hands every
            batch the next ones its worker gets); the files of a batch are also read concurrently.
            Default: 4 when the data is remote (gs://, s3://, any pyarrow filesystem), 0 for local
            files, where the page cache does the job. Reads ahead are bounded by
            ``loaders.fetch.DEFAULT_MAX_BYTES`` per worker and checked like any other read.
        cache: a ``loaders.fetch.FileCache`` (a size-bounded local directory shared by the workers and
            ranks of a host) that remote files are kept in; an entry is used only when it matches the
            scan's record.
        close_points: None (default) applies the close-point rule the scan recorded
            (``scan_config.close_points``, ``multisweep.CLOSE_POINTS``), under which its size features
            were computed; naming another rule is refused. Under ``"devkit"`` the keyframe loses rows,
            so ``labels=True`` is refused (its labels would no longer line up).
        time_lag: append the time-lag channel, the last column of ``points``: float32 seconds before
            the keyframe (its rows 0, each sweep's rows its ``sweep_time_lags``), the fifth input of
            multi-sweep detectors (CenterPoint, mmdet3d's nuScenes configs); every sample with sweeps
            must record its lags (schema 4.3 scans).
        keep_nan: keep the rows with a NaN or infinite x, y or z (organised PCDs' no-return pixels, AV2
            nulls, +inf "no return" values). Default: they are dropped, as open3d's
            ``remove_non_finite_points`` does (with their labels), and ``points`` holds the rows the scan's
            ``num_points`` counts (``multisweep.NON_FINITE_RULE``).

    Raises:
        ValueError: a samples part edited after the build (``read_samples``), sweep records not
            aligned with the sweeps, ``root`` for a manifest of full paths, or as described for
            ``labels``/``verify``.
        FileNotFoundError: the first sample's keyframe is not where the manifest says (checked here,
            in the main process, so a moved dataset is not first seen in a DataLoader worker), or
            later any file ``dataset[i]`` reads: ``"not found: PATH (the manifest's path_root is X; pass
            root= if the dataset moved)"``.
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
        verify: str = "size",
        prefetch: int | None = None,
        cache: FileCache | None = None,
        close_points: str | None = None,
        time_lag: bool = False,
        keep_nan: bool = False,
    ) -> None:
        drain_arrow_at_exit()  # it holds Arrow tables in a torch process (loaders/_atexit.py)
        if verify not in VERIFY:
            raise ValueError(f"verify must be one of {VERIFY}, got {verify!r}")
        if prefetch is not None and (type(prefetch) is not int or prefetch < 0):
            raise ValueError(f"prefetch must be an int >= 0 (batches ahead), got {prefetch!r}")
        if cache is not None and not isinstance(cache, FileCache):
            raise TypeError(f"cache must be a lidarshard.loaders.fetch.FileCache, got {type(cache).__name__}")
        manifest = load_manifest(out_dir)
        self.resolve_path = PathResolver(manifest.path_root, root, path_map)
        self._moved = moved_hint(manifest.path_root, root, path_map)
        stored = schemas.scored_schema(manifest.schema_version).names  # 3.0 recorded no file sizes
        layout_cols = [c for c in _LAYOUT_COLUMNS if c in stored]  # 4.1: datasets, multi-frame files
        table = read_samples(
            out_dir, [*_COLUMNS, *layout_cols, *(c for c in schemas.INTEGRITY_FIELDS if c in stored)]
        )
        for name in _LAYOUT_COLUMNS:
            if name not in table.column_names:
                table = table.append_column(
                    name, pa.nulls(table.num_rows, schemas.sample_schema().field(name).type)
                )
        self._label_maps = label_maps(manifest.datasets)
        self.close_points = _close_points(manifest.provenance, close_points, labels)
        table = _with_integrity(table.combine_chunks(), verify == "hash")
        problem = _misaligned(table)  # read_samples checked the parts' sha256 and path rules
        if problem:
            raise ValueError(
                f"{out_dir}/{schemas.SAMPLES_DIR}: {problem}; refusing to read it (rebuild the manifest)"
            )
        self._labels = table["label_path"].chunk(0) if labels and table.num_rows else None
        if self._labels is not None and self._labels.null_count:
            first = table["sample_id"].filter(self._labels.is_null())[0].as_py()
            raise ValueError(
                f"{self._labels.null_count} samples have no per-point labels (first: {first}); build from a "
                "nuScenes dataroot whose lidarseg.json lists them, or SemanticKITTI sequences with labels/"
            )
        unhashed = table["path_crc32"].null_count if verify == "hash" else 0
        if unhashed:
            first = table["sample_id"].filter(table["path_crc32"].is_null())[0].as_py()
            raise ValueError(
                f'verify="hash": {unhashed} samples have no recorded {schemas.CONTENT_HASH} (first: {first}; '
                'a --features stat scan or a table given to write_manifest); use verify="size"'
            )
        if time_lag and sweeps:
            check_time_lags(table)
        self.time_lag = time_lag
        self.keep_nan = keep_nan
        self._ids = _column(table, "sample_id")
        # Per-sample paths, sizes and matrices stay in Arrow buffers: compact, and no Python objects
        # whose refcounts would un-share forked DataLoader workers' memory page by page.
        self._cols = {name: _column(table, name) for name in (*_KEPT, *_LAYOUT_COLUMNS)}
        tf = _column(table, "sweep_transforms")
        self._tf_values = tf.values.to_numpy(zero_copy_only=False).astype(np.float64)
        self._tf_offsets = tf.offsets.to_numpy().astype(np.int64)
        self.sweeps = sweeps
        self.point_dims = point_dims
        self._fetcher = Fetcher(cache=cache)
        remote = False
        if len(self):  # one stat: a dataset that moved fails here, naming path_root and root=
            first = self.resolve_path(self._cols["path"][0].as_py())
            if not storage.exists(first):
                raise FileNotFoundError(f"not found: {first} ({self._moved})")
            remote = not storage.is_local(first)
        self.prefetch = (REMOTE_PREFETCH if remote else 0) if prefetch is None else prefetch

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def sample_ids(self) -> list[str]:
        """The samples' ids, in dataset order (a new list: the dataset keeps them in one Arrow buffer,
        so forked DataLoader workers never touch a Python object per sample)."""
        return self._ids.to_pylist()

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self._item(i, self.files(i))

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        """A whole batch (what a DataLoader with a batch sampler asks for): with ``prefetch``, its files
        are read concurrently and those of the batches ahead (``PlannedBatch.ahead``) start reading."""
        files = [self.files(i) for i in indices]
        if self.prefetch:  # whole files: not those holding many frames, which are read by row group
            ahead = getattr(indices, "ahead", ())[: self.prefetch]
            self._fetcher.prepare(
                [f for i, fs in zip(indices, files, strict=True) for f in self._whole(i, fs)],
                [f for b in ahead for i in b for f in self._whole(i, self.files(i))],
            )
        return [self._item(i, fs) for i, fs in zip(indices, files, strict=True)]

    def files(self, i: int) -> list[File]:
        """The files ``dataset[i]`` reads, in order (keyframe, sweeps, label), each with what the scan
        recorded of it: ``[(path or URI, Recorded)]``."""
        c = self._cols
        files: list[File] = [
            (
                self.resolve_path(c["path"][i].as_py()),
                Recorded(c["path_bytes"][i].as_py(), c["path_crc32"][i].as_py()),
            )
        ]
        if self.sweeps:
            sweep_paths = [self.resolve_path(p) for p in c["sweep_paths"][i].as_py() or []]
            sizes = c["sweep_bytes"][i].as_py() or [None] * len(sweep_paths)
            hashes = c["sweep_crc32"][i].as_py() or [None] * len(sweep_paths)
            files += [(p, Recorded(n, h)) for p, n, h in zip(sweep_paths, sizes, hashes, strict=True)]
        if self._labels is not None:
            label = Recorded(c["label_bytes"][i].as_py(), c["label_crc32"][i].as_py())
            files.append((self.resolve_path(self._labels[i].as_py()), label))
        return files

    def _whole(self, i: int, files: list[File]) -> list[File]:
        """The files of sample ``i`` read whole (a multi-frame sample's points files are read by row
        group, only its label file whole)."""
        if self._cols["frame"][i].is_valid:
            return files[-1:] if self._labels is not None else []
        return files

    def _item(self, i: int, files: list[File]) -> dict[str, Any]:
        """Sample ``i`` from its ``files`` (``files(i)``)."""
        try:
            return self._read_item(i, files)
        except FileNotFoundError as e:  # read_recorded's "not found: PATH", with what to do about it
            raise FileNotFoundError(f"{e} ({self._moved})") from None

    def _read_item(self, i: int, files: list[File]) -> dict[str, Any]:
        points_files = files[:-1] if self._labels is not None else files
        lo, hi = self._tf_offsets[i], self._tf_offsets[i + 1]
        c = self._cols
        frames = None
        if c["frame"][i].is_valid:
            frames = [c["frame"][i].as_py(), *((c["sweep_frames"][i].as_py() or []) if self.sweeps else [])]
        points = load_points(
            points_files[0][0],
            c["format"][i].as_py(),
            [p for p, _ in points_files[1:]],
            self._tf_values[lo:hi] if self.sweeps else None,
            self.point_dims,
            [r for _, r in points_files],
            read=self._fetcher.read,
            frames=frames,
            close_points=self.close_points,
            time_lags=self._lags(i),
            drop_nan=False,  # below, with the labels' rows
        )
        labels = None
        if self._labels is not None:
            data = self._fetcher.read(*files[-1])
            label_map = self._label_maps.get(c["dataset"][i].as_py() or "")
            labels = _keyframe_labels(files[-1][0], data, len(points), label_map)
        if not self.keep_nan:
            bad = non_finite_rows(points)
            if bad.any():
                points = points[~bad]
                labels = labels[~bad] if labels is not None else None
        item = {"index": int(i), "sample_id": self._ids[i].as_py(), "points": torch.from_numpy(points)}
        if labels is not None:
            item["labels"] = torch.from_numpy(labels)
        return item

    def _lags(self, i: int) -> list[float] | None:
        """Sample ``i``'s sweep time lags (s) when the time-lag channel is asked for, else None."""
        if not self.time_lag:
            return None
        return (self._cols["sweep_time_lags"][i].as_py() or []) if self.sweeps else []


#: The columns ``__getitem__`` reads, kept as Arrow arrays.
_KEPT = ("path", "format", "sweep_paths", *schemas.INTEGRITY_FIELDS)


def _close_points(provenance: Mapping[str, Any], given: str | None, labels: bool) -> str:
    """The close-point rule to apply: the one the scan recorded; ``given`` must be that one (or None)."""
    rule = recorded_close_points(provenance)
    if given is not None and check_close_points(given) != rule:
        raise ValueError(
            f"close_points={given!r}: this manifest's size features were computed under {rule!r} "
            f"(scan_config.close_points); rebuild with --close-points {given}, or leave close_points unset"
        )
    if labels and rule == "devkit":
        raise ValueError(
            "labels=True: under close_points 'devkit' the keyframe loses its close points, so its lidarseg "
            "labels no longer line up; rebuild with --close-points sweeps (or none) to train on labels"
        )
    return rule


def _column(table: pa.Table, name: str) -> pa.Array:
    """Column ``name`` as one Arrow array (an empty one of the column's type for an empty table)."""
    col = table[name]
    return col.chunk(0) if col.num_chunks else pa.array([], col.type)


def _with_integrity(table: pa.Table, hashes: bool) -> pa.Table:
    """``table`` with every ``schemas.INTEGRITY_FIELDS`` column (null where not recorded: a 3.0
    manifest); the hash columns all null unless ``hashes``, so only sizes are checked."""
    fields = schemas.sample_schema()
    for name in schemas.INTEGRITY_FIELDS:
        keep = name in table.column_names and (hashes or not name.endswith("_crc32"))
        if not keep:
            values = pa.nulls(table.num_rows, fields.field(name).type)
            table = table.drop_columns([name]) if name in table.column_names else table
            table = table.append_column(fields.field(name), values)
    return table


def _misaligned(table: pa.Table) -> str | None:
    """The first sample whose recorded sweep sizes or hashes are not one per sweep path, as a problem."""
    paths = pc.list_value_length(table["sweep_paths"])
    for name in ("sweep_bytes", "sweep_crc32", "sweep_time_lags"):
        values = table[name]
        bad = pc.and_kleene(pc.is_valid(values), pc.not_equal(pc.list_value_length(values), paths))
        bad = pc.fill_null(bad, True)  # a null list of sweep paths with recorded values
        if pc.any(bad).as_py():
            first = table["sample_id"].filter(bad)[0].as_py()
            return f"sample {first!r}: {name} does not hold one value per sweep path"
    return None


def _keyframe_labels(
    label_path: str, data: bytes, num_points: int, label_map: Mapping[int, int] | None = None
) -> NDArray[np.int64]:
    """(num_points,) int64: the keyframe rows' class ids (``data``, the label file's bytes, decoded by
    ``formats.labels.decode_labels``: lidarseg uint8 ids, SemanticKITTI ids through ``label_map``),
    then ``IGNORE_LABEL`` on the sweep rows."""
    try:
        keyframe = decode_labels(data, label_format(label_path), label_map)
    except RejectError as e:
        raise ValueError(f"{label_path}: {e.detail}") from None
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

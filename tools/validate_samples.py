"""The samples parts for ``lidarshard validate``, read one row group at a time.

What the checks need of every sample is numeric (``NUMERIC``) plus two 64-bit keys: one of its
sample_id (to find a plan row's sample) and one of (sample_id, path, sweep_paths) (to check that a
plan row copies its sample). Paths and sweep paths are hashed as they stream by and never held:
1M samples with 9 sweeps are ~1 GB of strings, 16 MB of keys. The numbers and keys are parked on local
disk as they stream by (``validate_columns``, ``validate_keys``): validate holds one step group's,
not the epoch's. A sample_id is read back from its row group only to name it in a message. Keys are
BLAKE2b-64 of the values with separators; the rare case of two ids sharing a key is detected and
reported as a problem of the validator, not a pass.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.schemas.jsonsafe import short
from lidarshard.schemas.manifest import Manifest
from lidarshard.tools.validate_columns import ParkedColumns
from lidarshard.tools.validate_keys import Match, ParkedKeys
from lidarshard.transforms.core.groups import deal
from lidarshard.transforms.features.accounting import fingerprint_update, first_not_increasing
from lidarshard.transforms.features.buckets import assign_buckets
from lidarshard.transforms.features.cost import checked_model, sample_costs
from lidarshard.transforms.io import paths, storage
from lidarshard.transforms.io.arrow import parquet_file, read_rows, release_memory, row_groups
from lidarshard.transforms.io.parts import ParquetParts, open_parts, read_parts
from lidarshard.transforms.plan.seeds import sample_keys

__all__ = [
    "NUMERIC",
    "SamplesView",
    "check_samples",
    "id_keys",
    "row_keys",
    "read_samples",
    "cost_model_of",
    "check_scored",
]

#: Sample columns parked (those absent from a scan's samples are skipped): what plans are checked and
#: re-planned from, 28 bytes a sample on disk.
NUMERIC = ["cost", "bucket_id", "num_points", "weight"]


def _digests(values: pa.Array) -> NDArray[np.uint64]:
    """BLAKE2b-64 of each (non-null) string of ``values``, as uint64 (little-endian digest bytes).

    The loop is the cost of validate at scale (~0.4 us a short row): one copy of a keyed-once hasher
    per row and one join of the digests, no per-row int conversion."""
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    arr = arr.cast(pa.large_string()) if not pa.types.is_large_string(arr.type) else arr
    if len(arr) == 0:
        return np.empty(0, dtype=np.uint64)
    offsets = np.frombuffer(arr.buffers()[1], np.int64, count=arr.offset + len(arr) + 1)[
        arr.offset :
    ].tolist()
    data = memoryview(arr.buffers()[2] or b"")
    new = hashlib.blake2b(digest_size=8).copy
    out: list[bytes] = []
    add = out.append
    for a, b in zip(offsets, offsets[1:]):  # noqa: B905 (one shorter by construction)
        h = new()
        h.update(data[a:b])
        add(h.digest())
    return np.frombuffer(b"".join(out), dtype="<u8").astype(np.uint64, copy=False)


def id_keys(ids: pa.Array) -> NDArray[np.uint64]:
    """(N,) key of each sample_id."""
    return _digests(ids)


def row_keys(ids: pa.Array, path: pa.Array, sweep_paths: pa.Array) -> NDArray[np.uint64]:
    """(N,) key of each (sample_id, path, sweep_paths): equal rows, equal keys."""
    sweeps = pc.fill_null(pc.binary_join(sweep_paths, "\x1f"), "\x00")
    count = pc.cast(pc.fill_null(pc.list_value_length(sweep_paths), -1), pa.string())
    joined = pc.binary_join_element_wise(ids, pc.fill_null(path, "\x00"), count, sweeps, "\x1e")
    return _digests(joined)


class _LazyIds:
    """``ids[i]``: the sample_id of row ``i`` of the samples parts at ``files`` (``file``, their
    ``ParquetParts``), read from its row group of its part when asked (for messages)."""

    def __init__(self, files: list[str], file: ParquetParts) -> None:
        self.files = files
        self._starts = np.cumsum([0, *file.part_rows])

    def __getitem__(self, i: int) -> str:
        part = int(np.searchsorted(self._starts, int(i), side="right")) - 1
        row = int(i) - int(self._starts[part])
        with storage.open_read(self.files[part]) as f:
            return read_rows(parquet_file(f), row, row + 1, ["sample_id"]).column(0)[0].as_py()


class SamplesView:
    """The samples as validate's checks see them, nothing O(N) held: the ``NUMERIC`` columns (and any kept)
    parked on disk (``validate_columns.ParkedColumns``: ``chunks`` in row order, or one step ``group``
    at a time), the id, row and group keys parked too (``validate_keys.ParkedKeys``: ``match``),
    ``column("sample_id")`` indexable for messages (read from its row group when asked).

    ``cost_mismatch`` is (rows whose cost differs from the recorded cost model, the first such row,
    its cost, the model's), or None when no model was applied.
    """

    def __init__(
        self,
        columns: ParkedColumns,
        ids: _LazyIds,
        keys: ParkedKeys,
        cost_mismatch: tuple[int, int, np.float64, np.float64] | None = None,
    ):
        self.columns, self._ids, self.keys = columns, ids, keys
        self.cost_mismatch = cost_mismatch
        self.num_rows = columns.num_rows

    def column(self, name: str) -> _LazyIds:
        """``column("sample_id")[i]``: row ``i``'s id (the numbers: ``chunks``, ``group``)."""
        if name != "sample_id":
            raise KeyError(f"validate's samples view holds {name!r} on disk: read it by chunks or group")
        return self._ids

    def chunks(self, names: Sequence[str] | None = None) -> Iterator[tuple[int, pa.Table]]:
        """(first row, the columns ``names`` (None: all parked) of the next rows), in row order."""
        return self.columns.chunks(names)

    def group(self, g: int, seed: int, e: int, groups: int) -> pa.Table:
        """Step group ``g`` of epoch ``e`` (``groups.deal`` of the group keys with ``seed``): the parked
        columns of its samples and ``row`` (n_g,), their rows, ascending. One group: every sample."""
        if groups == 1:
            whole = self.columns.table()
            return whole.append_column("row", pa.array(np.arange(self.num_rows, dtype=np.int64)))
        self.columns.deal(
            lambda a, n: deal(self.keys.group_keys(a, n), seed, e, groups), groups, (seed, e, groups)
        )
        return self.columns.group(g)

    def select(self, names: list[str]) -> pa.Table:
        """Other columns, read from the file when asked (e.g. ``label_path`` to re-derive repeat factors)."""
        return read_parts(self._ids.files, columns=names)

    def drop_keys(self) -> None:
        """Remove the parked id and row keys once no plan file is left to look up (the group keys stay
        for ``group``); ``find`` refuses afterwards."""
        self.keys.drop()

    def key_clash(self) -> bool:
        """True when two sample ids share a key (then ``find`` cannot be trusted)."""
        return self.keys.clash

    def match(self, ids: pa.Array) -> Match:
        """The samples of the sample_ids ``ids`` (n,): rows (-1 when no sample has its key), row keys
        (``row_keys``: path and sweep_paths) and group keys."""
        return self.keys.match(id_keys(ids))

    def find(self, ids: pa.Array) -> NDArray[np.int64]:
        """(n,) row of each sample_id in ``ids``, -1 when no sample has its key."""
        return self.match(ids).rows


def read_samples(
    files: list[str],
    file: ParquetParts,
    root: object,
    problem: Callable[[str], None],
    scratch: str,
    model_cost: Callable[[pa.Table], NDArray[np.float64]] | None = None,
    keep: Sequence[str] = (),
    part_keys: int | None = None,
) -> tuple[SamplesView, str, str | None]:
    """Stream ``file`` (the samples parts at ``files`` as one, its schema checked), reporting null or unordered ids
    through ``problem``; ``model_cost(row group) -> (n,)`` costs are compared with ``cost`` row group
    by row group (``view.cost_mismatch``; the feature columns they need are kept only when named in
    ``keep``: an earlier cost model's epochs, ``epochs.as_planned``); the numbers and keys are parked in
    ``scratch`` (a local directory the caller removes), the keys ``part_keys`` samples a partition (None:
    ``validate_keys.PART_KEYS``). Returns (the view,
    the inputs fingerprint, the first stored-path problem for ``path_root`` ``root`` or None)."""
    names = file.schema_arrow.names
    numeric_names = [n for n in dict.fromkeys([*NUMERIC, *keep]) if n in names]
    features = ["file_bytes", "num_points", "num_in_range", "occupied_voxels"]  # fingerprint, cost models
    columns = list(
        dict.fromkeys(
            ["sample_id", *(n for n in paths.PATH_COLUMNS if n in names), *numeric_names, *features]
        )
    )
    h, keys = hashlib.sha256(), ParkedKeys(sum(file.part_rows), os.path.join(scratch, "keys"), part_keys)
    schema = file.schema_arrow
    parked = ParkedColumns(
        pa.schema([schema.field(n) for n in numeric_names]), os.path.join(scratch, "columns")
    )
    last, first_row, path_bad = None, 0, None
    mismatch = None if model_cost is None else (0, -1, np.float64(0), np.float64(0))
    for t in row_groups(file, columns):
        ids = t.column("sample_id").combine_chunks()
        if ids.null_count:
            problem(f"{ids.null_count} rows have a null sample_id")
        elif len(ids):
            i = first_not_increasing(ids, last)
            if i is not None:
                problem(f"sample_id not strictly increasing at row {first_row + i} ({ids[i]})")
            last = ids[-1].as_py()
        if path_bad is None:
            path_bad = paths.path_problem(t, root)
        fingerprint_update(h, t)
        parked.add(t.select(numeric_names))
        if mismatch is not None and model_cost is not None:  # both or neither
            mismatch = _cost_mismatch(mismatch, t, model_cost(t), first_row)
        keys.add(id_keys(ids), row_keys(ids, t.column("path"), t.column("sweep_paths")), _group_keys(ids))
        first_row += t.num_rows
        del t, ids
        release_memory()  # the row group's strings: Arrow's pool keeps freed pages otherwise
    keys.seal()
    view = SamplesView(parked, _LazyIds(files, file), keys, mismatch)
    release_memory()
    return view, h.hexdigest(), path_bad


def _group_keys(ids: pa.Array) -> NDArray[np.uint64]:
    """(n,) ``seeds.sample_keys`` of a row group's ids (a null id, reported, keys as the empty one)."""
    return sample_keys(pc.fill_null(ids, "") if ids.null_count else ids)


def _cost_mismatch(
    seen: tuple[int, int, np.float64, np.float64], t: pa.Table, want: NDArray[np.float64], start: int
) -> tuple[int, int, np.float64, np.float64]:
    """``seen`` (count, first row, its cost, its model cost) updated with row group ``t`` (first row
    ``start``) and its model costs ``want``."""
    cost = t.column("cost").to_numpy()
    bad = np.flatnonzero(~np.isclose(cost, want, rtol=1e-12, atol=0))
    if seen[0] or not bad.size:
        return (seen[0] + int(bad.size), *seen[1:])
    i = int(bad[0])
    return int(bad.size), start + i, cost[i], want[i]


def check_samples(
    files: list[str],
    accepted: object,
    fingerprint: str,
    root: object,
    problem: Callable[[str, str], None],
    scratch: str,
    model_cost: Callable[[pa.Table], NDArray[np.float64]] | None = None,
    keep: Sequence[str] = (),
) -> SamplesView | None:
    """The samples parts at ``files`` (in order, schemas checked) streamed as one (``read_samples``, parked
    in ``scratch``) and checked against ``counts.accepted`` and ``inputs_fingerprint``; stored paths against
    a manifest's ``path_root`` ``root`` (``False``: not checked, a scan directory). ``problem(where, what)``
    reports; None when the parts cannot be read."""
    rel = schemas.SAMPLES_DIR
    try:
        with open_parts(files) as file:
            view, digest, path_bad = read_samples(
                files, file, root or None, lambda what: problem(rel, what), scratch, model_cost, keep
            )
    except (pa.ArrowException, OSError, ValueError) as e:
        problem(rel, f"not readable Parquet parts ({type(e).__name__}: {str(e)[:120]})")
        return None
    if path_bad and root is not False:
        problem(rel, path_bad)
    if view.key_clash():
        problem(rel, "two sample ids share a 64-bit key: validate cannot check this manifest's plan rows")
    if view.num_rows != accepted:
        problem(rel, f"{view.num_rows} rows, counts.accepted is {accepted}")
    if digest != fingerprint:
        problem(rel, "inputs_fingerprint recomputed from (sample_id, file_bytes) differs")
    return view


def cost_model_of(m: Manifest) -> tuple[Callable[[pa.Table], np.ndarray] | None, str | None]:
    """(row group -> costs under the recorded cost model, or None for "given" costs; the reason the
    model cannot be applied, or None)."""
    try:
        model = checked_model(m.cost_model, given_ok=True)  # the one reading of a recorded model
    except ValueError as e:
        return None, f"cost_model {short(m.cost_model.to_json())} cannot be applied ({e})"
    # "given": costs came with the samples (lidarshard.write_manifest), nothing to re-derive
    return (None if model.name == "given" else lambda t: sample_costs(t, model)), None


def check_scored(
    problem: Callable[[str, str], None], m: Manifest, samples: SamplesView, bad_model: str | None
) -> None:
    """Costs from the recorded cost model (``samples.cost_mismatch``), bucket ids from the edges, bucket
    counts, a chunk of samples at a time; ``problem(where, what)`` reports, ``bad_model`` is
    ``cost_model_of``'s reason. (K-1 edges, K weights and K counts: checked by ``Manifest.from_json``.)"""
    rel = schemas.SAMPLES_DIR
    if bad_model:
        problem("_manifest.json", bad_model)
    elif samples.cost_mismatch is not None and samples.cost_mismatch[0]:
        count, first, got, want = samples.cost_mismatch
        sid = samples.column("sample_id")[first]
        problem(rel, f"{count} costs differ from cost_model, first {sid}: {got} != {want}")
    edges = np.asarray(m.buckets.edges, dtype=np.float64)
    counts = np.zeros(m.buckets.k, np.int64)
    bad_count, first_bad, negative, nulls = 0, -1, False, 0
    for start, t in samples.chunks(["cost", "bucket_id"]):
        if t.column("bucket_id").null_count:
            nulls += t.column("bucket_id").null_count
            continue
        ids = t.column("bucket_id").to_numpy()
        try:
            bad = np.flatnonzero(assign_buckets(t.column("cost").to_numpy(), edges) != ids)
        except ValueError as e:
            problem(rel, f"costs or bucket edges are invalid ({e})")
            return
        if bad.size and first_bad < 0:
            first_bad = start + int(bad[0])
        bad_count += bad.size
        if (ids < 0).any():
            negative = True
            continue
        here = np.bincount(ids, minlength=m.buckets.k)
        if here.size > counts.size:
            counts = np.concatenate([counts, np.zeros(here.size - counts.size, np.int64)])
        counts[: here.size] += here
    if nulls:
        problem(rel, f"{nulls} rows have a null bucket_id")
        return
    if bad_count:
        problem(
            rel,
            f"{bad_count} bucket_ids disagree with buckets.edges, first {samples.column('sample_id')[first_bad]}",
        )
    if negative or tuple(counts.tolist()) != m.buckets.counts:
        problem("_manifest.json", "buckets.counts differ from the bucket_ids in the samples")

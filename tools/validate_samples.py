"""The samples parts for ``lidarshard validate``: one pass in row order, into validate's DuckDB tables.

Each row group is checked as it streams by (non-null, strictly increasing ids; stored paths against
``path_root``; the inputs fingerprint; costs against the recorded cost model) and its numbers go to the
table ``samples``: the row index ``rid``, the sample_id, ``rkey`` (``validate_db.ROW_KEY`` of its path and
sweep paths: the strings are never held) and the ``NUMERIC`` columns. :class:`Samples` reads them back a chunk, a step group or a row at
a time. ``check_scored`` checks bucket ids and counts; ``cost_model_of`` reads the recorded cost model.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from lidarshard.schemas.jsonsafe import short
from lidarshard.schemas.manifest import Manifest
from lidarshard.tools.validate_db import ROW_KEY, Engine, in_order
from lidarshard.transforms.core.groups import deal
from lidarshard.transforms.core.plan_writer import NUMERIC_INPUT
from lidarshard.transforms.features.accounting import fingerprint_update, first_not_increasing
from lidarshard.transforms.features.buckets import assign_buckets
from lidarshard.transforms.features.cost import checked_model, sample_costs
from lidarshard.transforms.io import paths
from lidarshard.transforms.io.arrow import release_memory
from lidarshard.transforms.io.parts import read_parts
from lidarshard.transforms.plan.seeds import sample_keys

__all__ = ["NUMERIC", "Samples", "sample_columns", "check_samples", "cost_model_of", "check_scored"]

#: Sample columns kept in the ``samples`` table (those absent from the parts are skipped): what a plan is
#: decided from (``plan_writer.NUMERIC_INPUT``); ``keep`` adds the cost features where they are needed.
NUMERIC = NUMERIC_INPUT
_FEATURES = ["file_bytes", "num_points", "num_in_range", "occupied_voxels"]  # fingerprint, cost models
#: (rows whose cost differs from the cost model, the first such row, its cost, the model's)
Mismatch = tuple[int, int, float, float]


class _Ids:
    """``ids[i]``: the sample_id of samples row ``i`` (for messages)."""

    def __init__(self, db: Engine) -> None:
        self.db = db

    def __getitem__(self, i: int) -> str | None:
        got = self.db.rows("SELECT sample_id FROM samples WHERE rid = ?", [int(i)])
        return got[0][0] if got else None


class Samples:
    """The samples as validate's checks see them: ``num_rows``, ``column("sample_id")[i]``, the numbers
    by ``chunks``, whole (``table``) or a step ``group`` at a time, other columns from the files (``select``).
    ``cost_mismatch``: see ``Mismatch`` (None: no model applied)."""

    def __init__(self, db: Engine, files: list[str], names: list[str], num_rows: int,
                 cost_mismatch: Mismatch | None) -> None:  # fmt: skip
        self.db, self.files, self.names, self.num_rows = db, files, names, num_rows
        self.cost_mismatch = cost_mismatch
        self._dealt: tuple[int, int, int] | None = None

    def column(self, name: str) -> _Ids:
        if name != "sample_id":
            raise KeyError(f"validate's samples hold {name!r} in a table: read it by chunks or group")
        return _Ids(self.db)

    def _cols(self, names: Sequence[str] | None) -> str:
        return ", ".join(f'"{n}"' for n in (self.names if names is None else names))

    def chunks(self, names: Sequence[str] | None = None) -> Iterator[tuple[int, pa.Table]]:
        """(first row, the columns ``names`` (None: all kept) of the next rows), in row order."""
        start = 0
        for t in self.db.batches(f"SELECT {self._cols(names)} FROM samples ORDER BY rid"):
            yield start, t
            start += t.num_rows

    def table(self, names: Sequence[str] | None = None) -> pa.Table:
        """Every sample's columns ``names`` (None: all kept), in row order."""
        return self.db.table(f"SELECT {self._cols(names)} FROM samples ORDER BY rid")

    def deal(self, seed: int, e: int, groups: int) -> None:
        """The table ``dealt`` (rid, grp): the step group of each sample in epoch ``e`` (``groups.deal`` of
        its ``groups.sample_keys``, kept in the table ``gkeys`` once made)."""
        if self._dealt == (seed, e, groups):
            return
        if self._dealt is None:
            self.db.run("CREATE OR REPLACE TABLE gkeys (rid BIGINT, gkey UBIGINT)")
            for t in self.db.batches("SELECT rid, sample_id FROM samples"):
                keys = sample_keys(pc.fill_null(t.column("sample_id"), ""))
                self.db.run(
                    "INSERT INTO gkeys SELECT * FROM k", k=pa.table({"rid": t.column("rid"), "gkey": keys})
                )
        self.db.run("CREATE OR REPLACE TABLE dealt (rid BIGINT, grp INTEGER)")
        for t in self.db.batches("SELECT rid, gkey FROM gkeys"):
            grp = pa.table(
                {"rid": t.column("rid"), "grp": deal(t.column("gkey").to_numpy(), seed, e, groups)}
            )
            self.db.run("INSERT INTO dealt SELECT * FROM grp", grp=grp)
        self._dealt = (seed, e, groups)

    def group(self, g: int, seed: int, e: int, groups: int) -> pa.Table:
        """Step group ``g`` of epoch ``e``: the kept columns of its samples and ``row`` (n_g,), ascending."""
        if groups == 1:
            return self.db.table(f'SELECT {self._cols(None)}, rid AS "row" FROM samples ORDER BY rid')
        self.deal(
            seed, e, groups
        )  # a join sorted by DuckDB would pin it whole: sorted here, a column at a time
        t = self.db.table(
            f'SELECT {self._cols(None)}, rid AS "row" FROM samples JOIN dealt USING (rid) WHERE grp = ?', [g]
        )
        order, names, columns = pc.sort_indices(t.column("row")), t.column_names, []
        for name in names:
            columns.append(t.column(name).take(order))
            t = t.drop_columns([name])
        return pa.table(columns, names=names)

    def select(self, names: list[str]) -> pa.Table:
        """Other columns, read from the files (e.g. ``label_path`` to re-derive repeat factors)."""
        return read_parts(self.files, columns=names)


def sample_columns(have: Sequence[str], keep: Sequence[str] = ()) -> list[str]:
    """The columns of samples parts (of columns ``have``) that ``check_samples`` reads, ``keep`` among them."""
    wanted = ["sample_id", *paths.PATH_COLUMNS, *NUMERIC, *keep, *_FEATURES]
    return [n for n in dict.fromkeys(wanted) if n in have]


def check_samples(
    db: Engine,
    groups: Iterable[tuple[str, pa.Table | None]],
    accepted: object,
    fingerprint: str,
    root: object,
    problem: Callable[[str, str], None],
    model_cost: Callable[[pa.Table], NDArray[np.float64]] | None = None,
    keep: Sequence[str] = (),
) -> Samples | None:
    """The samples parts' row groups (part path, its ``sample_columns``, or None for an unusable part), in
    order, streamed into ``db`` and checked against ``accepted`` and ``fingerprint``; stored paths against a
    manifest's ``path_root`` ``root`` (``False``: not checked, a scan directory); ``model_cost(row group) ->
    (n,)`` costs compared with ``cost`` (the feature columns they need kept only when named in ``keep``).
    ``problem(where, what)`` reports; None when the parts cannot be used."""
    rel, held = "samples", []  # problems of the parts, reported when every part was usable
    h, last, first, path_bad, names = hashlib.sha256(), None, 0, None, None
    mismatch: Mismatch | None = None if model_cost is None else (0, -1, 0.0, 0.0)
    files: list[str] = []
    for path, t, bad, want in in_order(functools.partial(_prepare, root, model_cost), groups):
        if t is None:
            return None
        if not files or files[-1] != path:
            files.append(path)
        if names is None:
            names = [n for n in dict.fromkeys([*NUMERIC, *keep]) if n in t.column_names]
            db.run(f'CREATE OR REPLACE TABLE samples AS SELECT 0::BIGINT AS rid, sample_id, {ROW_KEY} AS rkey, '
                   f'{", ".join(names)} FROM t LIMIT 0', t=t.slice(0, 0))  # fmt: skip
        ids = t.column("sample_id").combine_chunks()
        if ids.null_count:
            held.append(f"{ids.null_count} rows have a null sample_id")
        elif len(ids):
            i = first_not_increasing(ids, last)
            if i is not None:
                held.append(f"sample_id not strictly increasing at row {first + i} ({ids[i]})")
            last = ids[-1].as_py()
        path_bad = path_bad or bad
        fingerprint_update(h, t)
        if mismatch is not None and want is not None:
            mismatch = _cost_mismatch(mismatch, t, want, first)
        batch = t.append_column("rid", pa.array(np.arange(first, first + len(ids))))
        db.run(f"INSERT INTO samples SELECT rid, sample_id, {ROW_KEY}, {', '.join(names)} FROM batch",
               batch=batch)  # fmt: skip
        first += t.num_rows
        del t, ids, batch
        release_memory()  # the row group's strings: Arrow's pool keeps freed pages otherwise
    if names is None:
        problem(rel, "not readable Parquet parts (ValueError: no samples part to read)")
        return None
    for line in held:
        problem(rel, line)
    if path_bad and root is not False:
        problem(rel, path_bad)
    if first != accepted:
        problem(rel, f"{first} rows, counts.accepted is {accepted}")
    if h.hexdigest() != fingerprint:
        problem(rel, "inputs_fingerprint recomputed from (sample_id, file_bytes) differs")
    return Samples(db, files, names, first, mismatch)


def _prepare(root: object, model_cost: Callable[[pa.Table], NDArray[np.float64]] | None,
             item: tuple[str, pa.Table | None]) -> tuple[str, pa.Table | None, str | None, NDArray | None]:  # fmt: skip
    """What a row group's checks need that no other row group does, made on a core of its own: (part path,
    the row group, its stored paths' problem (``root`` False: not checked), its costs under ``model_cost``)."""
    path, t = item
    if t is None:
        return path, None, None, None
    bad = None if root is False else paths.path_problem(t, root)
    return path, t, bad, None if model_cost is None else model_cost(t)


def _cost_mismatch(seen: Mismatch, t: pa.Table, want: NDArray[np.float64], start: int) -> Mismatch:
    """``seen`` updated with row group ``t`` (first row ``start``) and its model costs ``want``."""
    cost = t.column("cost").to_numpy()
    bad = np.flatnonzero(~np.isclose(cost, want, rtol=1e-12, atol=0))
    if seen[0] or not bad.size:
        return (seen[0] + int(bad.size), *seen[1:])
    i = int(bad[0])
    return int(bad.size), start + i, float(cost[i]), float(want[i])


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
    problem: Callable[[str, str], None], m: Manifest, samples: Samples, bad_model: str | None
) -> None:
    """Costs from the recorded cost model (``samples.cost_mismatch``), bucket ids from the edges, bucket
    counts; ``problem(where, what)`` reports, ``bad_model`` is ``cost_model_of``'s reason. (K-1 edges, K
    weights and K counts: checked by ``Manifest.from_json``.)"""
    rel = "samples"
    if bad_model:
        problem("_manifest.json", bad_model)
    elif samples.cost_mismatch is not None and samples.cost_mismatch[0]:
        count, first, got, want = samples.cost_mismatch
        sid = samples.column("sample_id")[first]
        problem(rel, f"{count} costs differ from cost_model, first {sid}: {got} != {want}")
    nulls = samples.db.rows("SELECT count(*) FROM samples WHERE bucket_id IS NULL")[0][0]
    if nulls:
        problem(rel, f"{nulls} rows have a null bucket_id")
        return
    edges = np.asarray(m.buckets.edges, dtype=np.float64)
    bad_count, first_bad = 0, -1
    for start, t in samples.chunks(["cost", "bucket_id"]):
        try:
            bad = np.flatnonzero(assign_buckets(t.column("cost").to_numpy(), edges) != t.column(1).to_numpy())
        except ValueError as e:
            problem(rel, f"costs or bucket edges are invalid ({e})")
            return
        if bad.size and first_bad < 0:
            first_bad = start + int(bad[0])
        bad_count += bad.size
    if bad_count:
        problem(
            rel,
            f"{bad_count} bucket_ids disagree with buckets.edges, first {samples.column('sample_id')[first_bad]}",
        )
    counts = dict(samples.db.rows("SELECT bucket_id, count(*) FROM samples GROUP BY bucket_id"))
    if counts != {k: n for k, n in enumerate(m.buckets.counts) if n}:
        problem("_manifest.json", "buckets.counts differ from the bucket_ids in the samples")

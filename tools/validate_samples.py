"""The samples parts for ``lidarshard validate``: one pass in row order into validate's DuckDB table ``samples``.

Each row group is checked as it streams by (non-null, strictly increasing ids; stored paths against
``path_root``; the inputs fingerprint; costs against the recorded cost model); ``samples`` keeps the row
index ``rid``, the sample_id and its ``skey`` (``ID_KEY``), ``rkey`` (``validate_db.ROW_KEY`` of its paths: no string is held) and the
``NUMERIC`` columns. ``check_scored`` checks bucket ids and counts, ``check_sample_weights`` the weights
against the manifest's ``repeat`` (repeat factors re-derived from the label files under ``lidarseg:t=T``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from lidarshard.schemas import ADDED_IN, is_before
from lidarshard.schemas.jsonsafe import short
from lidarshard.schemas.manifest import Manifest
from lidarshard.schemas.records import label_maps
from lidarshard.tools.validate_db import ID_KEY, ROW_KEY, Engine, in_order
from lidarshard.transforms.core.groups import deal
from lidarshard.transforms.core.plan_writer import NUMERIC_INPUT as NUMERIC
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.features import repeat
from lidarshard.transforms.features.accounting import fingerprint_update, first_not_increasing
from lidarshard.transforms.features.buckets import assign_buckets, resolve_weights
from lidarshard.transforms.features.cost import checked_model, sample_costs
from lidarshard.transforms.io import paths, storage
from lidarshard.transforms.io.arrow import release_memory
from lidarshard.transforms.io.parts import read_parts
from lidarshard.transforms.plan.seeds import sample_keys

__all__ = [
    "Samples",
    "sample_columns",
    "check_samples",
    "cost_model_of",
    "check_scored",
    "check_sample_weights",
]

_FEATURES = ["file_bytes", "num_points", "num_in_range", "occupied_voxels"]  # fingerprint, cost models
#: Rows between two trims of glibc's heap while the samples stream in (Arrow's pool is trimmed each row group).
_TRIM_ROWS = 1 << 16
#: (rows whose cost differs from the cost model, the first such row, its cost, the model's)
Mismatch = tuple[int, int, float, float]


class _Ids:
    """``ids[i]``: the sample_id of samples row ``i`` (for messages)."""

    def __init__(self, db: Engine) -> None:
        self.db = db

    def __getitem__(self, i: int) -> str | None:
        got = self.db.rows("SELECT sample_id FROM samples WHERE rid = ?", [int(i)])
        return got[0][0] if got else None


@dataclasses.dataclass
class Samples:
    """The samples as validate's checks see them: ``num_rows``, ``column("sample_id")[i]``, the kept
    numbers by ``chunks``, whole (``table``) or a step ``group`` at a time; other columns from the files
    (``select``)."""

    db: Engine
    files: list[str]
    names: list[str]
    num_rows: int
    cost_mismatch: Mismatch | None  # None: no model applied
    _dealt: tuple[int, int, int] | None = None

    def column(self, name: str) -> _Ids:
        if name != "sample_id":
            raise KeyError(f"validate's samples hold {name!r} in a table: read it by chunks or group")
        return _Ids(self.db)

    def _cols(self, names: Sequence[str] | None) -> str:
        return ", ".join(f'"{n}"' for n in (self.names if names is None else names))

    def chunks(self, names: Sequence[str] | None = None) -> Iterator[tuple[int, pa.Table]]:
        """(first row, the columns ``names`` (None: all kept) of the next rows), in row order (``Engine.pages``:
        the caller may write meanwhile)."""
        query = f"SELECT {self._cols(names)} FROM samples WHERE rid >= {{lo}} AND rid < {{hi}} ORDER BY rid"
        yield from self.db.pages(query, self.num_rows)

    def table(self, names: Sequence[str] | None = None) -> pa.Table:
        """Every sample's columns ``names`` (None: all kept), in row order."""
        return self.db.table(f"SELECT {self._cols(names)} FROM samples ORDER BY rid")

    def deal(self, seed: int, e: int, groups: int) -> None:
        """The table ``dealt`` (rid, grp): each sample's step group in epoch ``e`` (``groups.deal`` of its
        ``seeds.sample_keys``, kept in the table ``gkeys``)."""
        if self._dealt is None:
            self.db.run("CREATE OR REPLACE TABLE gkeys (rid BIGINT, gkey UBIGINT)")
            for start, t in self.chunks(["sample_id"]):
                keys = sample_keys(pc.fill_null(t["sample_id"], ""))
                part = pa.table({"rid": np.arange(start, start + t.num_rows), "gkey": keys})
                self.db.run("INSERT INTO gkeys SELECT * FROM part", part=part)
        if self._dealt != (seed, e, groups):
            self.db.run("CREATE OR REPLACE TABLE dealt (rid BIGINT, grp INTEGER)")
            pages = self.db.pages(
                "SELECT gkey FROM gkeys WHERE rid >= {lo} AND rid < {hi} ORDER BY rid", self.num_rows
            )
            for start, t in pages:
                grp = deal(t["gkey"].to_numpy(), seed, e, groups)
                part = pa.table({"rid": np.arange(start, start + t.num_rows), "grp": grp})
                self.db.run("INSERT INTO dealt SELECT * FROM part", part=part)
        self._dealt = (seed, e, groups)

    def group(self, g: int, seed: int, e: int, groups: int) -> pa.Table:
        """Step group ``g`` of epoch ``e``: the kept columns of its samples and ``row`` (n_g,), ascending."""
        if groups == 1:
            return self.db.table(f'SELECT {self._cols(None)}, rid AS "row" FROM samples ORDER BY rid')
        self.deal(seed, e, groups)
        # a join sorted by DuckDB would pin it whole: sorted here, column by column
        t = self.db.table(
            f'SELECT {self._cols(None)}, rid AS "row" FROM samples JOIN dealt USING (rid) WHERE grp = {int(g)}'
        )
        order, names, columns = pc.sort_indices(t["row"]), t.column_names, []
        for name in names:
            columns.append(t[name].take(order))
            t = t.drop_columns([name])
        return pa.table(columns, names=names)

    def select(self, names: list[str]) -> pa.Table:
        """Other columns, read from the files (e.g. ``label_path`` to re-derive repeat factors)."""
        return read_parts(self.files, columns=names)


def sample_columns(have: Sequence[str], keep: Sequence[str] = ()) -> list[str]:
    """The columns of samples parts (of columns ``have``) that ``check_samples`` reads, ``keep`` among them."""
    return [
        n for n in dict.fromkeys(["sample_id", *paths.PATH_COLUMNS, *NUMERIC, *keep, *_FEATURES]) if n in have
    ]


def check_samples(
    db: Engine,
    groups: Iterable[tuple[str, pa.Table | None]],
    accepted: object,
    fingerprint: str,
    root: object,
    problem: Callable[[str, str], None],
    model_cost: Callable[[pa.Table], NDArray] | None = None,
    keep: Sequence[str] = (),
) -> Samples | None:
    """The parts' row groups ((part path, its ``sample_columns``), None: an unusable part) in order, streamed
    into ``db`` and checked against ``accepted`` and ``fingerprint``; stored paths against ``path_root``
    ``root`` (``False``: not checked); ``model_cost(row group) -> (n,)`` against ``cost`` (features kept only
    when in ``keep``). ``problem(where, what)`` reports; None when the parts cannot be used."""
    held: list[str] = []  # the parts' problems, said when every part was usable
    h, last, first, path_bad, unusable = hashlib.sha256(), None, 0, None, False
    mismatch: Mismatch | None = None if model_cost is None else (0, -1, 0.0, 0.0)
    files: list[str] = []

    def checked() -> Iterator[pa.Table]:
        """Each row group checked, with its ``rid``: DuckDB pulls them as it inserts."""
        nonlocal last, first, path_bad, mismatch, unusable
        for path, t, bad, want in in_order(functools.partial(_prepare, root, model_cost), groups):
            if t is None:
                unusable = True
                return
            if not files or files[-1] != path:
                files.append(path)
            t = t.append_column("rid", pa.array(np.arange(first, first + t.num_rows)))
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
            first += t.num_rows
            del ids
            yield t
            release_memory(heap=first % _TRIM_ROWS < t.num_rows)  # the row group's strings: kept else

    rows = checked()
    head, names = next(rows, None), None
    if head is not None:
        names = [n for n in dict.fromkeys([*NUMERIC, *keep]) if n in head.column_names]
        select = f"rid, sample_id, {ID_KEY} AS skey, {ROW_KEY} AS rkey, {', '.join(names)} FROM t"
        db.run(f"CREATE OR REPLACE TABLE samples AS SELECT {select} LIMIT 0", t=head)
        db.insert(f"INSERT INTO samples SELECT {select}", head.schema, itertools.chain([head], rows))
        del head
    if unusable:
        return None
    if names is None:
        problem("samples", "not readable Parquet parts (ValueError: no samples part to read)")
        return None
    if path_bad and root is not False:
        held.append(path_bad)
    for line in held:
        problem("samples", line)
    if first != accepted:
        problem("samples", f"{first} rows, counts.accepted is {accepted}")
    if h.hexdigest() != fingerprint:
        problem("samples", "inputs_fingerprint recomputed from (sample_id, file_bytes) differs")
    return Samples(db, files, names, first, mismatch)


def _prepare(
    root: object, model_cost: Callable[[pa.Table], NDArray] | None, item: tuple[str, pa.Table | None]
) -> tuple[str, pa.Table | None, str | None, NDArray | None]:
    """(part path, row group, its stored paths' problem, its costs under ``model_cost``), made on a core of
    its own (``root`` False: paths not checked)."""
    path, t = item
    if t is None:
        return path, None, None, None
    return path, t, None if root is False else paths.path_problem(t, root), model_cost and model_cost(t)


def _cost_mismatch(seen: Mismatch, t: pa.Table, want: NDArray[np.float64], start: int) -> Mismatch:
    """``seen`` updated with row group ``t`` (first row ``start``) and its model costs ``want``."""
    cost = t.column("cost").to_numpy()
    bad = np.flatnonzero(~np.isclose(cost, want, rtol=1e-12, atol=0))
    if seen[0] or not bad.size:
        return (seen[0] + int(bad.size), *seen[1:])
    i = int(bad[0])
    return int(bad.size), start + i, float(cost[i]), float(want[i])


def cost_model_of(m: Manifest) -> tuple[Callable[[pa.Table], np.ndarray] | None, str | None]:
    """(row group -> costs under the recorded cost model, or None for "given" costs; why the model cannot
    be applied, or None)."""
    try:
        model = checked_model(m.cost_model, given_ok=True)  # the one reading of a recorded model
    except ValueError as e:
        return None, f"cost_model {short(m.cost_model.to_json())} cannot be applied ({e})"
    return (None if model.name == "given" else lambda t: sample_costs(t, model)), None


def check_scored(
    problem: Callable[[str, str], None], m: Manifest, samples: Samples, bad_model: str | None
) -> None:
    """Costs against the cost model (``bad_model``: ``cost_model_of``'s reason), bucket ids against the
    edges, bucket counts (K-1 edges, K weights and counts: checked by ``Manifest.from_json``)."""
    sid = samples.column("sample_id")
    if bad_model:
        problem("_manifest.json", bad_model)
    elif samples.cost_mismatch is not None and samples.cost_mismatch[0]:
        count, first, got, want = samples.cost_mismatch
        problem("samples", f"{count} costs differ from cost_model, first {sid[first]}: {got} != {want}")
    nulls = samples.db.rows("SELECT count(*) FROM samples WHERE bucket_id IS NULL")[0][0]
    if nulls:
        problem("samples", f"{nulls} rows have a null bucket_id")
        return
    edges, bad_count, first_bad = np.asarray(m.buckets.edges, dtype=np.float64), 0, -1
    for start, t in samples.chunks(["cost", "bucket_id"]):
        try:
            bad = np.flatnonzero(assign_buckets(t.column("cost").to_numpy(), edges) != t.column(1).to_numpy())
        except ValueError as e:
            problem("samples", f"costs or bucket edges are invalid ({e})")
            return
        first_bad = start + int(bad[0]) if bad.size and first_bad < 0 else first_bad
        bad_count += bad.size
    if bad_count:
        problem("samples", f"{bad_count} bucket_ids disagree with buckets.edges, first {sid[first_bad]}")
    counts = dict(samples.db.rows("SELECT bucket_id, count(*) FROM samples GROUP BY bucket_id"))
    if counts != {k: n for k, n in enumerate(m.buckets.counts) if n}:
        problem("_manifest.json", "buckets.counts differ from the bucket_ids in the samples")


def same_counts(got: object, want: dict[str, float]) -> bool:
    """``got`` (a recorded ``repeat`` count) holds ``want``'s keys, each within 1e-6 relative."""
    return (
        isinstance(got, dict)
        and set(got) == set(want)
        and all(
            isinstance(got[k], (int, float)) and abs(got[k] - v) <= 1e-6 * max(1.0, abs(v))
            for k, v in want.items()
        )
    )


def _datasets(samples: Samples, m: Manifest) -> list:
    """Each sample's ``dataset`` (None each before schema 4.1)."""
    if is_before(m.schema_version, ADDED_IN["dataset"]):
        return [None] * samples.num_rows
    return samples.select(["dataset"]).column("dataset").to_pylist()


def _presence(problems: list[str], samples: Samples, m: Manifest) -> tuple[NDArray, NDArray] | None:
    """``repeat.label_presence`` of every sample's label file, or None (a problem)."""
    found = paths.resolved(samples.select(["label_path"]).column("label_path").to_pylist(), m.path_root)
    try:
        labels = repeat.decoded_labels(
            found, _datasets(samples, m), label_maps(m.datasets), storage.read_bytes
        )
        return repeat.label_presence(labels)
    except ValueError as e:
        problems.append(f"_manifest.json: datasets: {e}; the weights were not re-derived")
    except RejectError as e:
        problems.append(f"labels: {e.detail}; the weights were not re-derived")
    except OSError as e:
        problems.append(
            f"{e.filename or 'label_path'}: lidarseg labels unreadable ({e.strerror or e}); "
            "the weights were not re-derived"
        )
    return None


def check_sample_weights(problems: list[str], m: Manifest, samples: Samples) -> tuple[NDArray | None] | None:
    """The ``weight`` column against ``m.repeat`` -> (lidarseg presence (N, C), None under ``'all'``) for
    ``repeat.realized``, or None when there is nothing (more) to check. Re-deriving the factors holds the
    weights and bucket ids whole (12 bytes a sample; lidarseg's presence C more)."""
    rep, sid = m.repeat, samples.column("sample_id")
    ((bad, not_one, weight),) = samples.db.rows(
        "SELECT count(*) FILTER (NOT coalesce(isfinite(weight) AND weight >= 0, false)), min(rid) FILTER "
        "(weight <> 1), arg_min(weight, rid) FILTER (weight <> 1) FROM samples"
    )
    if bad:
        problems.append("samples: weight holds values that are not finite and >= 0")
        return None
    if rep is None:
        if not_one is not None:
            problems.append(
                f"samples: {sid[not_one]} has weight {weight:g} but the manifest records no repeat "
                "factors or sample weights"
            )
        return None
    whole = samples.table(["weight", "bucket_id"])
    w, mode, scale = whole.column("weight").to_numpy(), rep.mode, rep.datasets or {}
    by_dataset = repeat.dataset_scale(_datasets(samples, m), scale)
    if mode is None and scale:  # only --dataset-weights
        if not np.allclose(w, by_dataset, rtol=1e-12, atol=0):
            i = int(np.flatnonzero(~np.isclose(w, by_dataset, rtol=1e-12, atol=0))[0])
            problems.append(
                f"samples: {sid[i]} has weight {w[i]:g} but its dataset's --dataset-weights give "
                f"{by_dataset[i]:g}"
            )
        mode = "column:"  # the counts below are per 'all', as for a column's weights
    if mode is None or not mode.startswith(("lidarseg:", "column:")):
        problems.append(f"_manifest.json: repeat.mode {short(mode)} is not lidarseg:t=T or column:NAME")
        return None
    presence = None
    if mode.startswith("lidarseg:"):
        try:
            t = repeat.parse_repeat_factors(mode)
        except ValueError as e:
            problems.append(f"_manifest.json: repeat.mode {short(mode)}: {e}")
            return None
        if (found := _presence(problems, samples, m)) is None:
            return None
        presence = found[0]
        again = repeat.lvis_factors(found[0], found[1], t) * by_dataset
        if (diff := np.flatnonzero(np.abs(again - w) > 1e-9 * np.maximum(1.0, again))).size:
            i = int(diff[0])
            problems.append(
                f"samples: {sid[i]} has weight {w[i]:.6g}, its labels give repeat factor "
                f"{again[i]:.6g} ({diff.size} samples differ)"
            )
    try:
        bucket = resolve_weights(m.buckets.weights, m.buckets.k)[whole.column("bucket_id").to_numpy()]
    except (ValueError, IndexError):  # reported by the bucket checks
        return None
    want = repeat.repeat_counts(presence, w * bucket)
    if not same_counts(rep.expected, want):
        problems.append(
            f"_manifest.json: repeat.expected recorded {short(dict(rep.expected))}, recomputed {short(want)}"
        )
    return (presence,)

"""The samples' 64-bit keys for ``lidarshard validate``, parked on local disk instead of held: the resident
part is one key partition (~``PART_KEYS`` samples) at a time, not N.

    while the samples stream:  each row group's (id key, row, row key, group key) appended to the
                               partition of its id key's range (``part_of``: P = ceil(N / part_keys)
                               equal ranges of the hash), its group keys appended in row order
    then (``seal``):           each partition sorted by id key (stable: equal keys in row order), a
                               clash of two ids on one key noted
    a plan file's rows:        ``match`` looks their ids up partition by partition (one held at a time)
    a step group's members:    ``group_keys`` reads the row-ordered group keys a range at a time (the
                               samples' columns are dealt by them: ``validate_columns``)

Files live in a directory the caller gives (validate's temporary one, never inside the output checked),
which the caller removes. Pure numpy.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

__all__ = ["PART_KEYS", "Match", "ParkedKeys", "append_raw", "append_split", "load_raw"]

#: Samples per key partition: what one lookup holds (24 bytes a sample: id key, row, row key, group key).
PART_KEYS = 1 << 20
_RECORD = np.dtype([("id", "<u8"), ("row", "<i8"), ("key", "<u8"), ("group", "<u8")])


class Match(NamedTuple):
    """``ParkedKeys.match`` of n plan rows: (n,) sample row (-1: no sample has the id), its row key
    (path and sweep_paths) and its group key (0 where not found)."""

    rows: NDArray[np.int64]
    row_keys: NDArray[np.uint64]
    group_keys: NDArray[np.uint64]


class ParkedKeys:
    """Keys of ``expected`` samples in ``parts`` = ceil(expected / ``part_keys``) partitions on disk, in
    the new directory ``dir`` (``part_keys`` None: ``PART_KEYS``)."""

    def __init__(self, expected: int, dir: str, part_keys: int | None = None) -> None:
        per = PART_KEYS if part_keys is None else part_keys  # the module's, read now (tests set it)
        self.parts = max(1, -(-int(expected) // max(1, int(per))))
        self.dir = dir
        os.makedirs(dir)
        self.num_rows, self.clash, self.sealed, self.dropped = 0, False, False, False
        self._held: tuple[int, dict[str, NDArray]] | None = None
        self._turn = 0

    def _path(self, p: int, kind: str) -> str:
        return os.path.join(self.dir, f"{kind}-{p:05d}.bin")

    def part_of(self, id_keys: NDArray[np.uint64]) -> NDArray[np.int64]:
        """(n,) the partition of each id key: equal ranges of the top 32 bits (the keys are hashes)."""
        top = (id_keys >> np.uint64(32)).astype(np.uint64)
        return ((top * np.uint64(self.parts)) >> np.uint64(32)).astype(np.int64)

    def add(
        self, id_keys: NDArray[np.uint64], row_keys: NDArray[np.uint64], group_keys: NDArray[np.uint64]
    ) -> None:
        """Park the keys of the next ``id_keys.size`` samples (one row group, in row order)."""
        n = id_keys.size
        cols = {"id": id_keys, "row": np.arange(n) + self.num_rows, "key": row_keys, "group": group_keys}
        cols = {name: np.asarray(values, _RECORD[name]) for name, values in cols.items()}
        # unsorted, one file a column (appended, then closed)
        append_split(self.part_of(id_keys), self.parts, cols, lambda p, name: self._path(p, f"new-{name}"))
        append_raw(self._path(0, "dealt-by"), np.asarray(group_keys, np.uint64))
        self.num_rows += n

    def seal(self) -> None:
        """After the last ``add``: each partition sorted by id key, ``clash`` set when two ids share one."""
        for p in range(self.parts):  # one column at a time: ~4 columns of a partition's, not 8
            ids = load_raw(self._path(p, "new-id"), _RECORD["id"])
            order = np.argsort(ids, kind="stable")
            ids = ids[order]
            self.clash |= bool(ids.size > 1 and (np.diff(ids) == 0).any())
            ids.tofile(self._path(p, "id"))
            del ids
            for name in ("row", "key", "group"):
                load_raw(self._path(p, f"new-{name}"), _RECORD[name])[order].tofile(self._path(p, name))
            for name in _RECORD.names or ():
                if os.path.exists(self._path(p, f"new-{name}")):
                    os.remove(self._path(p, f"new-{name}"))
            del order
        self.sealed = True

    def _part(self, p: int) -> dict[str, NDArray]:
        """Partition ``p``'s columns (sorted by id key); the last one read stays held."""
        if self._held is None or self._held[0] != p:
            self._held = None
            cols = {n: np.fromfile(self._path(p, n), _RECORD[n]) for n in _RECORD.names or ()}
            self._held = (p, cols)
        return self._held[1]

    def match(self, id_keys: NDArray[np.uint64]) -> Match:
        """The samples of n plan rows' ``id_keys`` (n,), looked up partition by partition."""
        if not self.sealed or self.dropped:
            raise RuntimeError("the keys were dropped (drop_keys): no lookups after the last plan file")
        n = id_keys.size
        out = Match(np.full(n, -1, np.int64), np.zeros(n, np.uint64), np.zeros(n, np.uint64))
        part = self.part_of(id_keys)
        self._turn ^= 1  # every other call walks back: the partition held last is used first
        for p in range(self.parts)[:: -1 if self._turn else 1]:
            at = np.flatnonzero(part == p)
            if not at.size:
                continue
            cols = self._part(p)
            s, want = cols["id"], id_keys[at]
            if not s.size:
                continue
            i = np.minimum(np.searchsorted(s, want), s.size - 1)
            hit = s[i] == want
            at, i = at[hit], i[hit]
            out.rows[at], out.row_keys[at], out.group_keys[at] = (
                cols["row"][i],
                cols["key"][i],
                cols["group"][i],
            )
        return out

    def drop(self) -> None:
        """Free the held partition and remove the lookup files (``match`` refuses afterwards); the
        row-ordered group keys stay (``group_keys``)."""
        self._held, self.dropped = None, True
        for p in range(self.parts):
            for name in _RECORD.names or ():
                if os.path.exists(self._path(p, name)):
                    os.remove(self._path(p, name))

    def group_keys(self, start: int = 0, count: int = -1) -> NDArray[np.uint64]:
        """(count,) the group keys of rows [start, start + count) (count -1: to the end)."""
        return load_raw(self._path(0, "dealt-by"), np.dtype(np.uint64), start, count)


def append_raw(path: str, values: NDArray) -> None:
    """``values`` appended to the raw file at ``path`` (no header: the reader knows the dtype)."""
    with open(path, "ab") as f:
        values.tofile(f)


def load_raw(path: str, dtype: np.dtype, start: int = 0, count: int = -1) -> NDArray:
    """``count`` (-1: all) of the raw values ``append_raw`` wrote to ``path`` from the ``start``-th on (none
    when it was never written)."""
    if not count or not os.path.exists(path):
        return np.empty(0, dtype)
    return np.fromfile(path, dtype, count=count, offset=dtype.itemsize * start)


def append_split(
    labels: NDArray[np.integer],
    k: int,
    columns: Mapping[str, NDArray],
    path: Callable[[int, str], str],
) -> None:
    """Each (n,) column of ``columns`` split by ``labels`` (n,) in [0, k), each part in row order, appended
    to ``path(label, name)`` (``append_raw``): how keys are partitioned and samples or pairs dealt."""
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(k + 1))
    for p in range(k):
        at = order[bounds[p] : bounds[p + 1]]
        if at.size:
            for name, values in columns.items():
                append_raw(path(p, name), values[at])

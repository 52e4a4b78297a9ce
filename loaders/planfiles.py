"""The files of a committed manifest directory, checked against what ``_manifest.json`` records before
a row of them is read: the plan tree holds exactly the listed plan files at their sizes
(``listed_plan_files``); one rank's plan files and nothing else (``read_rank_plan``); one plan file read
whole, bounded by the rows its epoch plans (``read_plan_file``); the structure every plan file must have
(``plan_problem``: ``ManifestReader`` and ``lidarshard validate`` apply it); any listed file's bytes at its recorded
size and sha256 (``verified_bytes``: plan files and samples parts alike).

Pure pyarrow; imports neither Beam nor torch. ``out`` is a local path or a URI: every read goes through
``lidarshard.transforms.io.storage``. The manifest itself is read by ``lidarshard.loaders.reader``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from lidarshard.schemas import MANIFEST_FILE, PLAN_DIR, PLAN_DIR_NAMES, misplaced_key
from lidarshard.schemas.manifest import FileEntry, Manifest
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import parquet_file
from lidarshard.transforms.io.storage import FileTooLargeError

__all__ = [
    "is_plan_path",
    "listed_plan_files",
    "modified_message",
    "plan_problem",
    "read_plan_file",
    "read_rank_plan",
    "recorded_bytes",
    "recorded_file",
    "verified_bytes",
]


def listed_plan_files(out: str, m: Manifest) -> list[str]:
    """Paths (inside the manifest's filesystem) of the plan files ``m`` (``out``'s ``_manifest.json``)
    lists, sorted, each checked against what ``OUT/plan`` holds (one listing; sizes compared, contents
    not read).

    Raises:
        ValueError: a file under ``OUT/plan`` that is not ``plan/epoch-E/rank-R/part-NNNNN.parquet`` or that the manifest does not list (a stray note, a copy such as
            ``plan/epoch-00``), or whose
            size differs from the recorded one, naming it: the plan directory is the contract.
        FileNotFoundError: a listed plan file is missing, or the manifest lists none.
    """
    _, base = storage.arrow_filesystem(out)
    listed = {rel: e for rel, e in m.files.items() if rel.startswith(PLAN_DIR + "/")}
    present = storage.list_files(storage.join(out, PLAN_DIR))
    for rel, info in sorted(present.items()):
        path, entry = f"{base}/{PLAN_DIR}/{rel}", listed.get(f"{PLAN_DIR}/{rel}")
        if not is_plan_path(f"{PLAN_DIR}/{rel}"):
            raise ValueError(
                f"{path}: not a plan file (only {_SHAPE} may live in {PLAN_DIR}/); move it "
                "out of the manifest directory"
            )
        if entry is None:
            raise ValueError(
                f"{path}: not a plan file of this manifest (not listed in {MANIFEST_FILE}); move it out of "
                "the manifest directory"
            )
        if info.size != entry.bytes:
            raise ValueError(
                modified_message(path, "plan file", f"{info.size} bytes, not the {entry.bytes} recorded in")
            )
    missing = sorted(set(listed) - {f"{PLAN_DIR}/{rel}" for rel in present})
    if missing:
        raise FileNotFoundError(
            f"{base}/{missing[0]}: listed in {MANIFEST_FILE} but missing; rebuild the manifest"
        )
    if not listed:
        raise FileNotFoundError(f"{out} holds no plan files ({_SHAPE})")
    return [f"{base}/{rel}" for rel in sorted(listed)]


_BLOCK = 8 << 20  # bytes hashed at a time (``recorded_file``)
_SHAPE = f"{PLAN_DIR}/{PLAN_DIR_NAMES[0]}E/{PLAN_DIR_NAMES[1]}R/part-NNNNN.parquet"


def is_plan_path(rel: str) -> bool:
    """True when ``rel`` (relative to OUT) has the shape ``plan/epoch-E/rank-R/part-*.parquet``."""
    e, r = PLAN_DIR_NAMES
    parts = rel.split("/")
    return (
        len(parts) == 4
        and parts[0] == PLAN_DIR
        and parts[1].startswith(e)
        and parts[1][len(e) :].isdigit()
        and parts[2].startswith(r)
        and parts[2][len(r) :].isdigit()
        and parts[3].startswith("part-")
        and parts[3].endswith(".parquet")
    )


def modified_message(path: str, what: str, how: str) -> str:
    """The one line naming a listed file that differs from ``_manifest.json`` (``how``: in what way)."""
    return (
        f"{path}: not a readable {what} ({how} {MANIFEST_FILE}: modified after the build); rebuild the "
        "manifest, or pass verify=False to read it anyway"
    )


def verified_bytes(path: str, recorded: FileEntry | None, what: str = "plan file") -> bytes:
    """The bytes of ``path`` when they match the size and sha256 ``_manifest.json`` recorded for it.

    Raises:
        ValueError: the file is not listed, or its size or sha256 differs (rewritten after the commit).
    """
    if recorded is None:
        raise ValueError(
            f"{path}: not a readable {what} (not listed in {MANIFEST_FILE}); rebuild the manifest"
        )
    data = recorded_bytes(path, recorded)
    if data is None:
        raise ValueError(modified_message(path, what, "size or sha256 differs from"))
    return data


def recorded_file(path: str, recorded: FileEntry) -> BinaryIO | None:
    """The listed file ``path`` open at its start when its bytes are the ones ``_manifest.json`` recorded (size,
    sha256, hashed ``_BLOCK`` bytes at a time), else None: its reader reads what was hashed through the same open
    file, never holding it whole (a samples part). The caller closes it.

    Raises:
        OSError: the file cannot be read (missing, not a regular file, permissions).
    """
    f = storage.open_read(path)
    try:
        h, seen = hashlib.sha256(), 0
        while seen <= recorded.bytes and (block := f.read(min(_BLOCK, recorded.bytes + 1 - seen))):
            h.update(block)
            seen += len(block)
        if seen == recorded.bytes and h.hexdigest() == recorded.sha256:
            f.seek(0)
            return f
    except BaseException:
        f.close()
        raise
    f.close()
    return None


def recorded_bytes(path: str, recorded: FileEntry) -> bytes | None:
    """The bytes of the listed file ``path`` when they are the ones ``_manifest.json`` recorded (size, sha256;
    never more than the recorded size read), else None: what a reader checks is what was hashed (every reader
    of listed files: the loaders, ``lidarshard validate``).

    Raises:
        OSError: the file cannot be read (missing, not a regular file, permissions).
    """
    try:
        data = storage.read_bytes(path, recorded.bytes)
    except FileTooLargeError:
        return None
    if len(data) != recorded.bytes or hashlib.sha256(data).hexdigest() != recorded.sha256:
        return None
    return data


def read_plan_file(
    path: str,
    columns: Sequence[str],
    recorded: FileEntry | None = None,
    verify: bool = False,
    max_rows: int | None = None,
    key: tuple[int, int] | None = None,
) -> pa.Table:
    """``columns`` of one plan file; an empty, truncated or foreign file raises ValueError naming it.

    With ``verify``, the bytes must first match ``recorded`` (its ``_manifest.json`` 'files' entry);
    a file of more than ``max_rows`` rows is refused from its footer, before a row is decoded. With
    ``key`` (epoch, rank), a file that carries ``epoch``/``rank`` columns (schema 4) must hold only
    that key: a plan file copied to another rank's place is refused.
    """
    try:
        source = pa.BufferReader(verified_bytes(path, recorded)) if verify else storage.open_read(path)
        with source, parquet_file(source) as f:
            rows = f.metadata.num_rows
            if max_rows is not None and rows > max_rows:
                raise ValueError(
                    f"{path}: not a readable plan file ({rows} rows, more than the {max_rows} entries its "
                    "epoch plans); rebuild the manifest"
                )
            extra = [c for c in ("epoch", "rank") if key is not None and c not in columns]
            table = f.read(columns=[*columns, *extra], use_threads=False)
            if key is not None:
                _check_key(path, table, key)
            return table.drop_columns(extra)
    except (pa.ArrowInvalid, OSError, KeyError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(
            f"{path}: not a readable plan file ({str(e).splitlines()[0]}); rebuild the manifest"
        ) from None


def _check_key(path: str, table: pa.Table, key: tuple[int, int]) -> None:
    """Every row of ``table`` has (``epoch``, ``rank``) == ``key``, else ValueError naming ``path``."""
    wrong = misplaced_key(table, *key)
    if wrong is not None:
        name, want = wrong
        raise ValueError(
            f"{path}: not a readable plan file (its {name} column is not {want}, the {name} its place "
            "names); rebuild the manifest"
        )


def read_rank_plan(
    out: str, m: Manifest, epoch: int, rank: int, columns: Sequence[str], verify: bool
) -> tuple[pa.Table, str]:
    """(``columns`` of rank ``rank``'s plan for planned epoch ``epoch``, sorted by (step, slot); the rank
    directory). Each file is bounded by the entries the epoch plans and, with ``verify``, must match its
    recorded size and sha256 (``read_plan_file``).

    Raises:
        FileNotFoundError: the manifest has no plan for (``epoch``, ``rank``).
        ValueError: the rank directory holds no plan file, or anything but ``part-NNNNN.parquet``; a
            file is empty, truncated, foreign, too long or (with ``verify``) modified, named.
    """
    rel_dir = os.path.dirname(m.plan_file(epoch, rank))
    rank_dir = storage.join(out, rel_dir)
    if not storage.is_dir(rank_dir):
        raise FileNotFoundError(f"the manifest has no plan for epoch {epoch} rank {rank}")
    files = [(storage.join(rank_dir, rel), rel) for rel in sorted(storage.list_files(rank_dir))]
    for path, rel in files:
        if not is_plan_path(f"{rel_dir}/{rel}"):
            raise ValueError(
                f"{path}: not a plan file (only part-NNNNN.parquet may live in a rank directory); "
                "move it out of the manifest directory"
            )
    if not files:
        raise ValueError(f"{rank_dir}: the rank directory holds no plan file; rebuild the manifest")
    listed, planned = m.files, m.counts.planned[epoch]
    table = pa.concat_tables(
        read_plan_file(path, columns, listed.get(f"{rel_dir}/{rel}"), verify, planned, (epoch, rank))
        for path, rel in files
    )
    return table.sort_by([("step", "ascending"), ("slot", "ascending")]), rank_dir


def plan_problem(t: pa.Table, e: int, r: int, steps: int, b: int | None) -> str | None:
    """What is wrong with rank ``r``'s plan table ``t`` for epoch ``e`` (the one rule every reader of plan
    files applies), or None: no nulls, exactly ``steps`` x ``b`` rows in (step, slot) order (``b=None``,
    variable counts: every step holds slots ``0..n-1`` with ``n >= 1``, equal to ``rank_count``). A 4.x
    file's ``epoch`` and ``rank`` columns hold ``e`` and ``r`` on every row. Columns ``t`` was read without
    are not checked. The row count is compared with ``steps`` before anything is sized by it."""
    wrong = misplaced_key(t, e, r)
    if wrong is not None:
        return f"column {wrong[0]} is not {wrong[1]} on every row (a plan file of another place)"
    names = ["step", "slot", "sample_id", "cost", "bucket_id", "path"]
    names += ["rank_count", "global_count"] if b is None else []
    for name in (n for n in names if n in t.column_names):
        if t.column(name).null_count:
            return f"column {name} holds {t.column(name).null_count} nulls"
    step, slot = (t.column(k).to_numpy().astype(np.int64) for k in ("step", "slot"))
    where, rows = f"epoch {e} rank {r}", t.num_rows
    if b is not None and rows != steps * b:
        return (
            f"{where}: {rows} rows, but steps_per_epoch[{e}] = {steps} steps x batch_size {b} = {steps * b}"
        )
    if b is None and rows < steps:
        return f"{where}: {rows} rows, fewer than steps_per_epoch[{e}] = {steps} (each step holds a sample)"
    outside = (step < 0) | (step >= steps)
    if outside.any():
        return f"{where}: step {step[outside][0]} outside steps_per_epoch[{e}] = {steps}"
    counts = np.bincount(step, minlength=steps)
    if b is not None and (counts != b).any():
        s = int(np.flatnonzero(counts != b)[0])
        return f"{where} step {s}: {counts[s]} rows, expected batch_size {b}"
    if (counts < 1).any():
        return f"{where} step {int(np.argmin(counts))}: no sample (every rank needs one per step)"
    if b is not None:
        order = (step != np.repeat(np.arange(steps), b)) | (slot != np.tile(np.arange(b), steps))
    else:
        order = (slot != np.arange(step.size) - np.repeat(np.cumsum(counts) - counts, counts)) | np.r_[
            False, np.diff(step) < 0
        ]
    if order.any():
        i = int(np.flatnonzero(order)[0])
        return (f"{where}: row {i} is (step {step[i]}, slot {slot[i]}); rows must be sorted by (step, slot) "
                f"with slots 0..{'n-1' if b is None else b - 1}")  # fmt: skip
    if b is None and "rank_count" in t.column_names:
        rank_count = t.column("rank_count").to_numpy().astype(np.int64)
        if not np.array_equal(rank_count, counts[step]):
            i = int(np.flatnonzero(rank_count != counts[step])[0])
            return (
                f"{where} step {step[i]}: rank_count {rank_count[i]}, the step holds {counts[step[i]]} rows"
            )
    return None

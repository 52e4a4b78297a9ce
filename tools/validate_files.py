"""The data files of a manifest for ``lidarshard validate``, each on its own: the list in
``_manifest.json`` is exactly the samples parts (numbered from 0), rejects.parquet and one plan file
per (epoch, rank) (from the listed names only, so a forged ``world_size`` costs one problem line, not
a loop over it); every listed file has its recorded size and sha256 and nothing unlisted lies beside
them (a scan directory: only its samples and rejects); one plan file's rows are in (step, slot) order
with the steps and counts recorded."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

import numpy as np
import pyarrow as pa

from lidarshard import schemas
from lidarshard.schemas.manifest import FileEntry
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.parts import listed_parts

__all__ = ["samples_parts", "check_listed", "check_recorded", "verified", "check_scan_files", "check_plan", "unreadable"]

#: ``problem(where, what)``: report one problem.
Problem = Callable[[str, str], None]
_META = schemas.META_FILES
#: Directories of derived, non-contract files that may sit in OUT (reports, calibrations).
_DERIVED_PREFIXES = (schemas.REPORT_DIR + "/",)


def samples_parts(problem: Problem, rels: list[str]) -> list[str] | None:
    """The samples parts among ``rels`` in order (``parts.listed_parts``), or None and a problem."""
    try:
        return listed_parts(rels)
    except ValueError as e:
        problem(schemas.SAMPLES_DIR, str(e))
        return None


def check_listed(
    problem: Problem,
    files: Mapping[str, object],
    w: int,
    epochs: int,
    enumerate_up_to: int,
) -> tuple[bool, list[str] | None]:
    """The files ``_manifest.json`` lists are exactly the samples parts, rejects and one plan file
    per (epoch, rank) (``schemas.plan_key``); missing plan files
    are named one by one when at most ``enumerate_up_to``.
    Returns (whether the list is complete, the samples parts in order or None: ``samples_parts``).
    """
    plans: set[tuple[int, int]] = set()
    for rel in sorted(files):
        key = schemas.plan_key(rel)
        if key is not None and key[0] < epochs and key[1] < w:
            plans.add(key)
        elif rel != schemas.REJECTS_FILE and not rel.startswith(schemas.SAMPLES_DIR + "/"):
            problem(rel, f"recorded in 'files' but not part of a world_size {w}, {epochs}-epoch plan")
    missing = [rel for rel in (schemas.REJECTS_FILE,) if rel not in files]
    parts = samples_parts(problem, list(files))
    gap = w * epochs - len(plans)
    if 0 < gap <= enumerate_up_to:  # then w * epochs <= len(files) + enumerate_up_to: cheap to enumerate
        missing += [schemas.plan_file(e, r) for e in range(epochs) for r in range(w) if (e, r) not in plans]
    elif gap:
        problem(
            "_manifest.json",
            f"world_size {w} x epochs {epochs} need {w * epochs} plan files, 'files' lists {len(plans)}",
        )
    for rel in missing:
        problem(rel, f"not recorded in _manifest.json 'files' (world_size {w}, epochs {epochs} need it)")
    return not missing and gap == 0 and parts is not None, parts


def check_recorded(
    problem: Problem, present: Mapping[str, int], recorded: Mapping[str, FileEntry]
) -> set[str]:
    """The ``recorded`` files against ``present`` ({relative path: bytes} of every file there): each there
    at its recorded size, and no file there unlisted; returns those of the right size (their sha256 is
    checked as they are read: ``verified``)."""
    sized: set[str] = set()
    extras = {rel for rel in present if rel.startswith(_DERIVED_PREFIXES)}  # `lidarshard report` output
    for rel in sorted(set(present) - _META - set(recorded) - extras):
        problem(rel, "file is not listed in _manifest.json 'files' (left over or added)")
    for rel, info in sorted(recorded.items()):
        if rel not in present:
            problem(rel, f"missing (recorded {info.bytes} bytes at commit)")
        elif present[rel] != info.bytes:
            problem(rel, f"{present[rel]} bytes, recorded {info.bytes} at commit (truncated or rewritten)")
        else:
            sized.add(rel)
    return sized


def verified(problem: Problem, root: str, rel: str, entry: FileEntry) -> bytes | None:
    """The bytes of ``rel`` under ``root`` when they are the ``entry`` recorded at commit (size, sha256),
    else None and a problem: what is checked is what was hashed."""
    try:
        data = storage.read_bytes(storage.join(root, rel), entry.bytes)
    except OSError as e:
        problem(rel, f"cannot be read ({e})")
        return None
    if len(data) != entry.bytes or hashlib.sha256(data).hexdigest() != entry.sha256:
        problem(rel, "sha256 differs from the one recorded at commit (file was modified)")
        return None
    return data


def check_scan_files(problem: Problem, present: Mapping[str, int]) -> list[str]:
    """A scan directory (``present``: {relative path: bytes}) holds its metadata, rejects.parquet and
    files under samples/ only; returns the latter (``samples_parts`` checks their names)."""
    in_samples = [rel for rel in present if rel.startswith(schemas.SAMPLES_DIR + "/")]
    for rel in sorted(set(present) - _META - {schemas.REJECTS_FILE} - set(in_samples)):
        problem(rel, "unexpected file in a scan directory")
    if schemas.REJECTS_FILE not in present:
        problem(schemas.REJECTS_FILE, "missing")
    return in_samples


def _add(problems: list[str], where: str, what: str) -> None:
    problems.append(f"{where}: {what}")


def unreadable(err: Exception) -> str:
    """The problem of a Parquet file that does not read: the error's type and its first 120 characters."""
    return f"not a readable Parquet file ({type(err).__name__}: {str(err)[:120]})"


def check_plan(
    problems: list[str],
    rel: str,
    t: pa.Table,
    e: int,
    r: int,
    steps: int,
    b: int | None,
) -> bool:
    """Structure of rank ``r``'s plan ``t`` (file ``rel``) for epoch ``e``: no nulls, exactly ``steps`` x
    ``b`` rows in (step, slot) order (``b=None``, variable counts: every step holds slots ``0..n-1``
    with ``n >= 1`` equal to ``rank_count``). A 4.x file's ``epoch`` and ``rank`` columns hold ``e`` and
    ``r`` on every row (a 3.x file has none: the schema check refuses them).
    Returns True when the file is usable."""
    wrong = schemas.misplaced_key(t, e, r)
    if wrong is not None:
        _add(
            problems, rel, f"column {wrong[0]} is not {wrong[1]} on every row (a plan file of another place)"
        )
        return False
    names: tuple[str, ...] = ("step", "slot", "sample_id", "cost", "bucket_id", "path")
    if b is None:
        names += ("rank_count", "global_count")
    for name in names:
        count = t.column(name).null_count
        if count:
            _add(problems, rel, f"column {name} holds {count} nulls")
            return False
    if b is None:
        return _check_variable(problems, rel, t, e, r, steps)
    step, slot = t.column("step").to_numpy().astype(np.int64), t.column("slot").to_numpy().astype(np.int64)
    if t.num_rows != steps * b:
        _add(
            problems,
            rel,
            f"epoch {e} rank {r}: {t.num_rows} rows, but steps_per_epoch[{e}] = {steps} steps x batch_size "
            f"{b} = {steps * b}",
        )
        return False
    outside = (step < 0) | (step >= steps)
    if outside.any():
        _add(
            problems,
            rel,
            f"epoch {e} rank {r}: step {step[outside][0]} outside steps_per_epoch[{e}] = {steps}",
        )
        return False
    per_step = np.bincount(step, minlength=steps)
    if (per_step != b).any():
        s = int(np.flatnonzero(per_step != b)[0])
        _add(problems, rel, f"epoch {e} rank {r} step {s}: {per_step[s]} rows, expected batch_size {b}")
        return False
    order = (step != np.repeat(np.arange(steps), b)) | (slot != np.tile(np.arange(b), steps))
    if order.any():
        i = int(np.flatnonzero(order)[0])
        _add(
            problems,
            rel,
            f"epoch {e} rank {r}: row {i} is (step {step[i]}, slot {slot[i]}); rows must be sorted by "
            f"(step, slot) with slots 0..{b - 1}",
        )
        return False
    return True


def _check_variable(problems: list[str], rel: str, t: pa.Table, e: int, r: int, steps: int) -> bool:
    step, slot = t.column("step").to_numpy().astype(np.int64), t.column("slot").to_numpy().astype(np.int64)
    if step.size and (step.min() < 0 or step.max() >= steps):
        _add(problems, rel, f"epoch {e} rank {r}: a step outside steps_per_epoch[{e}] = {steps}")
        return False
    counts = np.bincount(step, minlength=steps)
    if (counts < 1).any():
        s = int(np.argmin(counts))
        _add(problems, rel, f"epoch {e} rank {r} step {s}: no sample (every rank needs one per step)")
        return False
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    if (np.diff(step) < 0).any() or not np.array_equal(slot, np.arange(step.size) - starts):
        i = int(np.flatnonzero((slot != np.arange(step.size) - starts) | np.r_[False, np.diff(step) < 0])[0])
        _add(
            problems,
            rel,
            f"epoch {e} rank {r}: row {i} is (step {step[i]}, slot {slot[i]}); rows must be "
            "sorted by (step, slot) with slots 0..n-1",
        )
        return False
    rank_count = t.column("rank_count").to_numpy().astype(np.int64)
    if not np.array_equal(rank_count, counts[step]):
        i = int(np.flatnonzero(rank_count != counts[step])[0])
        _add(
            problems,
            rel,
            f"epoch {e} rank {r} step {step[i]}: rank_count {rank_count[i]}, the step holds "
            f"{counts[step[i]]} rows",
        )
        return False
    return True

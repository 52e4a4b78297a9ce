"""``lidarshard validate OUT``: re-derive everything checkable in a manifest (or scan) directory.

Checks ``_SUCCESS``, ``_manifest.json`` (read once into the typed ``Manifest``), every data file's name, size,
sha256 and schema (``validate_files``), the samples and rejects (``validate_samples``), each epoch's plan files
(``validate_epoch``) and the plan re-derived from the samples with the recorded settings (``validate_derived``);
a scan directory its samples, rejects and counts; with ``--data`` the files the samples name (``validate_data``).
Exit 0 with a summary line; 1 with one line per problem (the first 50 printed), or one line when its own
scratch directory fails (``ScratchError``: no verdict) or OUT changes while read; 2 for bad arguments.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from collections.abc import Callable
from typing import TypeVar

from lidarshard import schemas
from lidarshard.schemas.jsonsafe import short
from lidarshard.schemas.manifest import Manifest
from lidarshard.schemas.scan_record import ScanRecord
from lidarshard.tools import validate_data
from lidarshard.tools.validate_db import Engine, ScratchError, scratch_error
from lidarshard.tools.validate_derived import PairRepeat, check_repeat_rate
from lidarshard.tools.validate_epoch import check_epoch_files
from lidarshard.tools.validate_files import (
    DERIVED_PREFIXES,
    Checker,
    Problems,
    check_listed,
    check_recorded,
    check_scan_files,
    samples_parts,
)
from lidarshard.tools.validate_samples import check_sample_weights, check_scored, cost_model_of
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.pool import plan_input
from lidarshard.transforms.declare import Parser
from lidarshard.transforms.io import metadata, scratch, storage
from lidarshard.transforms.io.arrow import release_memory

__all__ = ["run", "validate", "Problems", "ScratchError"]

#: Problems kept (and printed); the rest are counted. Bounds memory whatever a forged manifest claims.
MAX_PROBLEMS = 200
_Record = TypeVar("_Record", Manifest, ScanRecord)


class Invalid(Exception):
    """A problem that stops validation (nothing further can be checked meaningfully)."""


def _read(c: Checker, load: Callable[..., _Record], rel: str) -> _Record:
    """``rel`` read once by the one metadata reader into its typed record, or ``Invalid`` with its line."""
    try:
        return load(c.root, where=rel)
    except OSError as e:
        raise Invalid(f"{rel}: cannot be read ({e})") from None
    except ValueError as e:
        raise Invalid(str(e)) from None


def _plan_config(c: Checker, m: Manifest) -> PlanConfig | None:
    """The settings ``m`` was planned with (``plan_groups`` as a build records them), or None (a problem)."""
    try:
        cfg = PlanConfig.from_manifest(m)
    except (ValueError, TypeError) as err:
        caps = {k: v for k, v in (m.caps.to_json() if m.caps else {}).items() if v is not None}
        c.problem(
            schemas.MANIFEST_FILE,
            f"the plan settings (strategy {short(m.strategy)}, caps {short(caps)}) "
            f"cannot be used ({err}); the plan is not re-derived",
        )
        return None
    want = cfg.groups_record(m.counts.accepted)
    if m.plan_groups is not None and m.plan_groups.to_json() != want:
        c.problem(
            schemas.MANIFEST_FILE,
            f"plan_groups {short(m.plan_groups.to_json())} contradicts itself: a "
            f"build with these settings and {m.counts.accepted} accepted samples records {short(want)}",
        )
    return cfg


def _check_manifest(c: Checker) -> str:
    m: Manifest = _read(c, functools.partial(metadata.load_manifest, committed=False), schemas.MANIFEST_FILE)
    complete, parts = check_listed(c.problem, m.files, m.world_size, m.epochs, MAX_PROBLEMS)
    c.listed, c.sized = m.files, check_recorded(c.problem, c.sizes(), m.files)
    model_cost, bad_model = cost_model_of(m)
    samples = c.samples(
        parts,
        schemas.scored_schema(),
        m.counts.accepted,
        m.inputs_fingerprint,
        m.path_root,
        model_cost if bad_model is None else None,
        plan_input(bool(m.cost_history) or m.memory_cap is not None),
    )
    c.rejects(schemas.REJECTS_FILE in c.sized, m.counts)
    if samples is None:
        return "samples unusable"
    check_scored(c.problem, m, samples, bad_model)
    held = check_sample_weights(c.problems, m, samples)
    cfg = _plan_config(c, m)
    if not complete:  # a plan file is missing from the list: per-epoch checks would mislead
        return ""
    rows, pairs = 0, PairRepeat(c.db) if m.epochs > 1 else None
    for e in range(m.epochs):
        rows += check_epoch_files(c.problems, c.plans, m, cfg, e, samples, held, pairs)
        if e == min(m.epochs, 2) - 1:
            check_repeat_rate(c.problems, m, pairs.rates(m.strategy) if pairs is not None else None)
    k, plan_files = m.counts, sum(m.plan_key(p) is not None for p in m.files)
    return (
        f"{k.scanned} scanned, {k.accepted} accepted, {k.rejected} rejected; world size {m.world_size}, batch "
        f"{m.batch_size}, {m.epochs} epoch{'s' * (m.epochs != 1)}, {rows} plan rows in {plan_files} plan files"
    )


def _check_scan(c: Checker) -> str:
    counts = (scan := _read(c, metadata.load_scan, schemas.SCAN_FILE)).counts
    present = c.sizes()
    c.samples(
        samples_parts(c.problem, check_scan_files(c.problem, present)),
        schemas.sample_schema(),
        counts.accepted,
        scan.inputs_fingerprint,
    )
    c.rejects(schemas.REJECTS_FILE in present, counts, listed=False)
    return f"scan: {counts.scanned} scanned, {counts.accepted} accepted, {counts.rejected} rejected"


def _leftover_hint(out: str) -> str:
    """Names the ``OUT.old-*``/``OUT.staging-*`` siblings an interrupted run left (local paths)."""
    parent, name = os.path.split(os.path.abspath(storage.local_path(out)))
    if not storage.is_local(out) or not os.path.isdir(parent):
        return ""
    left = sorted(n for n in os.listdir(parent) if n.startswith((name + ".old-", name + ".staging-")))
    return (
        f"; leftovers of an interrupted run: {left[:3]} (the next scan/build recovers them)" if left else ""
    )


def validate(out: str) -> tuple[Problems, str]:
    """(problems, summary) of the directory ``out``; no problems: valid. Its database lives in a local
    temporary directory (``scratch.temporary_dir``), removed when it returns.

    Raises:
        ScratchError: that directory failed (full, read-only): the data was not judged (one line).
    """
    try:
        with scratch.temporary_dir("lidarshard-validate-") as tmp:
            db = Engine(tmp)
            try:
                return _validate(Checker(out, db, Problems([], MAX_PROBLEMS)), out)
            finally:
                db.close()
    except ScratchError:
        raise
    except OSError as e:  # making or removing the temporary directory itself
        raise scratch_error(getattr(e, "filename", None) or tempfile.gettempdir(), e) from None


def _snapshot(c: Checker) -> tuple[bytes, dict] | None:
    """``_manifest.json``'s bytes and every file's (size, mtime) but the derived ones (a report may be written)."""
    try:
        listing = {rel: info for rel, info in c.listing().items() if not rel.startswith(DERIVED_PREFIXES)}
        return storage.read_bytes(
            storage.join(c.root, schemas.MANIFEST_FILE), storage.METADATA_MAX_BYTES
        ), listing
    except (OSError, ValueError):
        return None


def _validate(c: Checker, out: str) -> tuple[Problems, str]:
    release_memory()  # in a build's launcher: what the pipeline run left in Arrow's pool and the heap
    before, summary = None, ""
    try:
        if storage.is_local(out) and not os.path.isdir(storage.local_path(out)):
            raise Invalid(f"{out}: no such directory{_leftover_hint(out)}")
        present = c.sizes()
        if schemas.SUCCESS_FILE not in present:
            raise Invalid(
                f"{out}: no {schemas.SUCCESS_FILE}, so it is not a committed lidarshard output{_leftover_hint(out)}"
            )
        scan = schemas.MANIFEST_FILE not in present and schemas.SCAN_FILE in present
        before = None if scan else _snapshot(c)
        summary = _check_scan(c) if scan else _check_manifest(c)
        c.hash_the_rest()
    except Invalid as e:
        c.problems.append(str(e))
    except ScratchError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError, RecursionError) as e:
        c.problems.append(f"_manifest.json: malformed ({type(e).__name__}: {str(e)[:200]})")
        summary = ""
    changed = _changed(out, before, c)
    return (Problems([changed], MAX_PROBLEMS), "") if changed else (c.problems, summary)


def _changed(out: str, before: tuple[bytes, dict] | None, c: Checker) -> str | None:
    """The one line when OUT is no longer what validate started reading (a build published into it)."""
    now = _snapshot(c) if before is not None else None
    if before is None or now == before:
        return None
    if now is None:
        what = "it is gone"
    elif now[0] != before[0]:
        what = f"{schemas.MANIFEST_FILE} was rewritten"
    else:
        moved = set(now[1]) ^ set(before[1]) or {r for r in now[1] if now[1][r] != before[1].get(r)}
        what = f"{min(moved)} changed"
    return (
        f"{out}: changed while validate read it ({what}): another run published into it, so nothing was "
        "judged; run validate again once that run is done"
    )


def parser() -> Parser:
    """The ``validate`` command line: the arguments of ``validate_data.ValidateOptions``."""
    return Parser("lidarshard validate", __doc__.split("\n\n")[0], validate_data.ValidateOptions)


def run(argv: list[str] | None = None) -> int:
    """CLI entry: prints ``OK <summary>`` and returns 0, or prints the problems and returns 1."""
    args, _ = parser().read(argv)
    with scratch.signals_exit():  # its temporary directory goes on SIGTERM, SIGHUP and SIGQUIT too
        try:
            problems, summary = validate(args.out)
        except ScratchError as e:
            print(f"lidarshard validate: {e.strerror}", file=sys.stderr)
            return 1
        if args.data:
            problems, summary = _with_data(args, problems, summary)
    if not problems:
        print(f"OK {args.out}: {summary}")
        return 0
    print(f"INVALID {args.out}: {problems.total} problem(s)", file=sys.stderr)
    shown = [line for line in problems if not line.startswith("... and ")][:50]
    for line in shown:
        print(f"  {line}", file=sys.stderr)
    if problems.total > len(shown):
        print(f"  ... and {problems.total - len(shown)} more problems", file=sys.stderr)
    return 1


def _with_data(args: validate_data.ValidateOptions, problems: Problems, summary: str) -> tuple[Problems, str]:
    """``--data``: the files the samples name, checked once the directory is valid (its samples are
    then the ones committed)."""
    if problems:
        problems.append("--data: files not checked (the problems above come first)")
        return problems, summary
    kept = Problems([], MAX_PROBLEMS)
    try:
        where = validate_data.check_data(
            args.out, args.root, lambda w, x: kept.append(f"{w}: {x}"), args.workers
        )
    except (OSError, ValueError) as e:
        return Problems([f"--data: the samples cannot be read ({str(e)[:200]})"], MAX_PROBLEMS), summary
    return kept, f"{summary}; {where}"


if __name__ == "__main__":
    sys.exit(run())

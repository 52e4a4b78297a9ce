"""``lidarshard validate OUT``: re-derive everything checkable in a manifest (or scan) directory.

Checks, in order: ``_SUCCESS``; ``_manifest.json`` (schema version, then read once into the typed
``lidarshard.schemas.manifest.Manifest``: a missing or malformed key is one line naming it); every data
file against the size and sha256 recorded at commit, no missing or unlisted file (``validate_files``);
each file's Arrow schema against ``schemas``; samples (sorted unique ids, cost model, bucket ids, bucket
counts, inputs fingerprint); rejects (reasons, counts); every ``plan/epoch-E/rank-R`` file (its epoch and rank columns,
exactly ``batch_size`` rows per step in (step, slot) order, or at least one under ``budget``,
``rank_count`` / ``global_count``, ``steps_per_epoch``, every sample id known with matching path,
sweeps, cost and bucket; the caps); coverage per epoch (drop_last: each sample at most once, planned =
accepted - dropped; pad: each at least once, planned = accepted + padded; with weights at most
ceil(bucket weight x sample weight) copies); the sample weights and the manifest's ``repeat`` counts
(``validate_repeat``); the recorded balance numbers recomputed from the plan files (within 1e-6).
Each epoch is re-derived once from the samples and the recorded settings (``PlanConfig.from_manifest``),
one step group at a time (``validate_epoch``: a group's plan and the rank files' rows of that group, a
query on validate's DuckDB tables: ``validate_db``), and must equal the plan files; epochs 0 and 1's
re-derived plans give ``pair_repeat_rate``. The plan's table work (joins by sample_id, counts, partitions
by step group, step-mate pairs) is DuckDB's, in a database in a local temporary directory of its own;
the numbers are made from its sums by the build's functions (``metrics``, ``caps``, the planners). A scan directory (``_scan.json``) gets the samples/rejects/counts checks. Files of
an earlier 4.x minor are checked against the contract as that version wrote it (``schemas.ADDED_IN``).
With ``--data`` [``--root DIR``], every keyframe, sweep and label file the samples name must also be
the one scanned: size and CRC-32 (``validate_data``).

Exit status 0 with a one-line summary when valid, 1 with one precise line per problem otherwise
(file, epoch, rank, step; the true count, the first 50 printed), 1 with one line when its own scratch
directory fails (full, read-only: ``ScratchError``, no verdict) or OUT changes while it reads it, 2 for
bad arguments; also ``python -m lidarshard.tools.validate OUT``. Reads local paths and URIs (gs://,
s3://, ...) through ``lidarshard.transforms.io.storage``.
"""

from __future__ import annotations

import functools
import os
import sys
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
from lidarshard.tools.validate_repeat import check_sample_weights
from lidarshard.tools.validate_samples import (
    check_scored,
    cost_model_of,
)
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.pool import plan_input
from lidarshard.transforms.declare import Parser
from lidarshard.transforms.io import metadata, scratch, storage
from lidarshard.transforms.io.arrow import release_memory
from lidarshard.transforms.io.storage import FileInfo

__all__ = ["run", "validate", "Problems", "ScratchError"]

#: Problems kept (and printed); the rest are counted. Bounds memory whatever a forged manifest claims.
MAX_PROBLEMS = 200


_Record = TypeVar("_Record", Manifest, ScanRecord)


class Invalid(Exception):
    """A problem that stops validation (nothing further can be checked meaningfully)."""


def _read(c: Checker, load: Callable[..., _Record], rel: str) -> _Record:
    """``rel`` read once by the one metadata reader into its typed record; any failure stops validation
    with its one line ("_manifest.json: <key> must be ...")."""
    try:
        return load(c.store.root, where=rel)
    except OSError as e:
        raise Invalid(f"{rel}: cannot be read ({e})") from None
    except ValueError as e:
        raise Invalid(str(e)) from None


def _read_manifest(c: Checker) -> Manifest:
    """``_manifest.json`` read once into the typed ``Manifest`` (not required to be committed: every
    number is compared with the files below)."""
    return _read(c, functools.partial(metadata.load_manifest, committed=False), schemas.MANIFEST_FILE)


def _plan_config(c: Checker, m: Manifest) -> PlanConfig | None:
    """The settings ``m`` was planned with, or None and a problem when they are not valid ones."""
    try:
        return PlanConfig.from_manifest(m)
    except (ValueError, TypeError) as err:
        caps = {
            k: v for k, v in (m.caps.to_json() if m.caps else {}).items() if v is not None
        }  # the caps set
        c.problem(
            schemas.MANIFEST_FILE,
            f"the plan settings (strategy {short(m.strategy)}, caps {short(caps)}) cannot be used ({err}); "
            "the plan is not re-derived",
        )
        return None


def _check_groups(c: Checker, m: Manifest, cfg: PlanConfig) -> None:
    """The recorded ``plan_groups`` is what the build records for these settings (``groups_record``): a rule
    that contradicts its G (the auto rule's text with another G, or a rule of no build) is refused."""
    want = cfg.groups_record(m.counts.accepted)
    if m.plan_groups is not None and m.plan_groups.to_json() != want:
        c.problem(
            schemas.MANIFEST_FILE,
            f"plan_groups {short(m.plan_groups.to_json())} contradicts itself: a build with these settings and "
            f"{m.counts.accepted} accepted samples records {short(want)}",
        )


def _check_manifest(c: Checker) -> str:
    m = _read_manifest(c)
    complete, parts = check_listed(c.problem, m.files, m.world_size, m.epochs, MAX_PROBLEMS)
    c.listed = m.files
    c.sized = check_recorded(c.problem, c.store.sizes(), m.files)
    model_cost, bad_model = cost_model_of(m)
    samples = c.samples(
        parts, schemas.scored_schema(), m.counts.accepted, m.inputs_fingerprint, m.path_root,
        model_cost if bad_model is None else None,
        plan_input(bool(m.cost_history) or m.memory_cap is not None),  # planner.plan_columns' rule
    )  # fmt: skip
    c.rejects(schemas.REJECTS_FILE in c.sized, m.counts)
    if samples is None:
        return "samples unusable"
    check_scored(c.problem, m, samples, bad_model)
    held = check_sample_weights(c.problems, m, samples)
    cfg = _plan_config(c, m)
    if cfg is not None:
        _check_groups(c, m, cfg)
    if not complete:  # a plan file is missing from the list: per-epoch checks would mislead
        return ""
    rows = 0
    pairs = PairRepeat(c.db) if m.epochs > 1 else None
    for e in range(m.epochs):
        rows += check_epoch_files(c.problems, c.plans, m, cfg, e, samples, held, pairs)
        if e == min(m.epochs, 2) - 1:
            check_repeat_rate(c.problems, m, pairs.rates(m.strategy) if pairs is not None else None)
    k = m.counts
    plan_files = sum(m.plan_key(p) is not None for p in m.files)
    return (
        f"{k.scanned} scanned, {k.accepted} accepted, {k.rejected} rejected; world size {m.world_size}, "
        f"batch {m.batch_size}, {m.epochs} epoch{'s' * (m.epochs != 1)}, {rows} plan rows in {plan_files} plan files"
    )


def _check_scan(c: Checker) -> str:
    scan = _read(c, metadata.load_scan, schemas.SCAN_FILE)
    counts = scan.counts
    present = c.store.sizes()
    parts = samples_parts(c.problem, check_scan_files(c.problem, present))
    c.samples(parts, schemas.sample_schema(), counts.accepted, scan.inputs_fingerprint)
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
    """(problems, summary) for the directory ``out``; no problems means valid. Its tables live in a DuckDB
    database in one local temporary directory (``scratch.temporary_dir``), removed when it returns.

    Raises:
        ScratchError: that directory failed (full, read-only): the data was not judged (one line).
    """
    try:
        with scratch.temporary_dir("lidarshard-validate-") as tmp:
            db = Engine(tmp)
            try:
                return _validate(Checker(out, db, Problems(cap=MAX_PROBLEMS)), out)
            finally:
                db.close()
    except ScratchError:
        raise
    except OSError as e:  # making or removing the temporary directory itself
        raise scratch_error(getattr(e, "filename", None) or _tmp_root(), e) from None


def _tmp_root() -> str:
    import tempfile

    return tempfile.gettempdir()


def _snapshot(c: Checker) -> tuple[bytes, dict[str, FileInfo]] | None:
    """What identifies OUT's contents: ``_manifest.json``'s bytes and every file's (size, mtime) but the
    derived ones (``lidarshard report`` may write its own while validate reads)."""
    try:
        listing = {
            rel: info for rel, info in c.store.listing().items() if not rel.startswith(DERIVED_PREFIXES)
        }
        return c.store.read(schemas.MANIFEST_FILE), listing
    except (OSError, ValueError):
        return None


def _changed(out: str, before: tuple[bytes, dict[str, FileInfo]] | None, c: Checker) -> str | None:
    """The one line when OUT is no longer what validate started reading (a build published into it)."""
    now = _snapshot(c)
    if before is None or now == before:
        return None
    what = "it is gone" if now is None else (
        f"{schemas.MANIFEST_FILE} was rewritten" if now[0] != before[0] else
        f"{min(set(now[1]) ^ set(before[1]) or {r for r in now[1] if now[1][r] != before[1].get(r)})} changed"
    )  # fmt: skip
    return (
        f"{out}: changed while validate read it ({what}): another run published into it, so nothing was "
        "judged; run validate again once that run is done"
    )


def _validate(c: Checker, out: str) -> tuple[Problems, str]:
    release_memory()  # in a build's launcher: what the pipeline run left in Arrow's pool and the heap
    before = None
    try:
        if storage.is_local(out) and not os.path.isdir(storage.local_path(out)):
            raise Invalid(f"{out}: no such directory{_leftover_hint(out)}")
        present = c.store.sizes()
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
        summary = ""
    except ScratchError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError, RecursionError) as e:
        c.problems.append(f"_manifest.json: malformed ({type(e).__name__}: {str(e)[:200]})")
        summary = ""
    changed = _changed(out, before, c)
    if changed:
        return Problems([changed], MAX_PROBLEMS), ""
    return c.problems, summary


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
    kept = Problems(cap=MAX_PROBLEMS)
    try:
        where = validate_data.check_data(
            args.out, args.root, lambda w, x: kept.append(f"{w}: {x}"), args.workers
        )
    except (OSError, ValueError) as e:
        return Problems([f"--data: the samples cannot be read ({str(e)[:200]})"], MAX_PROBLEMS), summary
    return kept, f"{summary}; {where}"


if __name__ == "__main__":
    sys.exit(run())

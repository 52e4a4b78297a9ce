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
one step group at a time (``validate_epoch``: a group's plan and the rank files' rows of that group,
parked in a temporary directory), and must equal the plan files; epochs 0 and 1's re-derived plans give
``pair_repeat_rate``. A scan directory (``_scan.json``) gets the samples/rejects/counts checks. Files of
an earlier 4.x minor are checked against the contract as that version wrote it (``schemas.ADDED_IN``).
With ``--data`` [``--root DIR``], every keyframe, sweep and label file the samples name must also be
the one scanned: size and CRC-32 (``validate_data``).

Exit status 0 with a one-line summary when valid, 1 with one precise line per problem otherwise
(file, epoch, rank, step), 2 for bad arguments; also ``python -m lidarshard.tools.validate
OUT``. Vectorized with pyarrow/numpy (1M plan rows in a few seconds). Reads local paths and URIs
(gs://, s3://, ...) through ``lidarshard.transforms.io.storage``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lidarshard import schemas
from lidarshard.schemas.jsonsafe import short
from lidarshard.schemas.manifest import Manifest
from lidarshard.schemas.records import ScanCounts
from lidarshard.schemas.scan_record import ScanRecord
from lidarshard.tools import validate_data
from lidarshard.tools.validate_db import Engine, ScratchError, ahead, scratch_error
from lidarshard.tools.validate_derived import PairRepeat, check_repeat_rate
from lidarshard.tools.validate_epoch import check_epoch_files
from lidarshard.tools.validate_files import (
    check_listed,
    check_recorded,
    check_scan_files,
    samples_parts,
    unreadable,
    verified,
)
from lidarshard.tools.validate_repeat import check_sample_weights
from lidarshard.tools.validate_samples import (
    Samples,
    check_samples,
    check_scored,
    cost_model_of,
    sample_columns,
)
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.epochs import COST_FEATURES
from lidarshard.transforms.io import metadata, scratch, storage
from lidarshard.transforms.io.arrow import parquet_file, release_memory
from lidarshard.transforms.io.base import FileInfo

__all__ = ["run", "validate", "Problems", "ScratchError"]

_MAX_SHOWN = 5  # list items shown in one message
#: Problems kept (and printed); the rest are counted. Bounds memory whatever a forged manifest claims.
MAX_PROBLEMS = 200


_Record = TypeVar("_Record", Manifest, ScanRecord)


class Invalid(Exception):
    """A problem that stops validation (nothing further can be checked meaningfully)."""


class _Store:
    """Read-only view of one directory (local path or URI) through ``storage``."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/") or "/"

    def listing(self) -> dict[str, FileInfo]:
        """{relative path: (bytes, mtime)} of every file below the root."""
        return storage.list_files(self.root)

    def sizes(self) -> dict[str, int]:
        """{relative path: bytes} of every file below the root."""
        return {rel: info.size for rel, info in self.listing().items()}

    def read(self, rel: str, max_bytes: int | None = storage.METADATA_MAX_BYTES) -> bytes:
        """The file ``rel``, never more than ``max_bytes`` (raises OSError)."""
        return storage.read_bytes(storage.join(self.root, rel), max_bytes)


def _type(t: pa.DataType) -> str:
    """Type name ignoring the list item's field name (Parquet round trips call it 'element')."""
    return f"list<{_type(t.value_type)}>" if pa.types.is_list(t) else str(t)


def _schema_problem(table: pa.Table, want: pa.Schema) -> str | None:
    """What is wrong with ``table``'s columns against ``want`` (a current contract) as the version the
    file names wrote it (``schemas.as_written``: a 4.0 file has no 4.1 columns)."""
    version = (table.schema.metadata or {}).get(b"lidarshard.schema_version", b"").decode()
    if not schemas.is_readable(version):
        return f"written with schema version {version!r}, expected {schemas.SCHEMA_VERSION!r} (or an earlier minor)"
    want = schemas.as_written(want, version)
    got = {f.name: _type(f.type) for f in table.schema}
    exp = {f.name: _type(f.type) for f in want}
    twice = sorted({n for n in table.schema.names if table.schema.names.count(n) > 1})
    if twice:
        return f"schema differs from the contract: column {twice[0]!r} appears more than once"
    if got != exp or list(got) != list(exp):
        missing, extra = [n for n in exp if n not in got], [n for n in got if n not in exp]
        typed = [f"{n} is {got[n]}, expected {t}" for n, t in exp.items() if n in got and got[n] != t]
        parts = [f"missing {missing}"] * bool(missing) + [f"extra {extra}"] * bool(extra) + typed[:3]
        return "schema differs from the contract: " + ("; ".join(parts) or "column order differs")
    return None


class Problems(list):
    """Problem lines: the first ``MAX_PROBLEMS`` kept (and a last line counting the rest), ``total`` all of
    them. Bounds memory whatever a forged manifest claims."""

    def __init__(self, lines: Sequence[str] = ()) -> None:
        super().__init__()
        self.total = 0
        for line in lines:
            self.append(line)

    def append(self, line: str) -> None:
        self.total += 1
        if self.total <= MAX_PROBLEMS:
            super().append(line)
        elif self.total == MAX_PROBLEMS + 1:
            super().append("... and 1 more problems")
        else:
            self[-1] = f"... and {self.total - MAX_PROBLEMS} more problems"


class _Checker:
    """Accumulates problems (``problem`` lines read ``<where>: <what>``); reads OUT's files, each listed
    file's bytes checked against its recorded size and sha256 as they are read (``verified``)."""

    def __init__(self, out: str, db: Engine) -> None:
        self.store = _Store(out)
        self.problems = Problems()
        self.db = db
        self.listed: dict = {}  # the manifest's files: {rel: FileEntry}
        self.sized: set[str] = set()  # listed files there at their recorded size
        self.read: set[str] = set()  # those read (and hashed) so far

    def problem(self, where: str, what: str) -> None:
        self.problems.append(f"{where}: {what}")

    def verified(self, rel: str) -> bytes | None:
        """The bytes of the listed file ``rel`` when they are the ones recorded at commit, else None (a
        problem said: here, or by ``check_recorded`` for a missing file or another size)."""
        if rel not in self.sized or rel in self.read:
            return None
        self.read.add(rel)
        return verified(self.problem, self.store.root, rel, self.listed[rel])

    def hash_the_rest(self) -> None:
        """Every listed file not read by a check (it was not needed) is hashed all the same."""
        for rel in sorted(self.sized - self.read):
            self.verified(rel)

    def _load(self, rel: str, want: pa.Schema, listed: bool) -> tuple[pq.ParquetFile | None, list[str]]:
        """(the Parquet file ``rel`` when it reads and has the ``want`` schema, else None; the problem lines):
        a listed file from its bytes as recorded (``verified``), read whole. Runs on the reading thread."""
        lines: list[str] = []
        try:
            if listed:
                data = verified(lambda w, x: lines.append(f"{w}: {x}"), self.store.root, rel, self.listed[rel])
            else:
                data = self.store.read(rel, None)
            if data is None:
                return None, lines
            file = parquet_file(pa.BufferReader(data))
            bad = _schema_problem(file.schema_arrow.empty_table(), want)
        except (pa.ArrowException, OSError, ValueError) as e:
            file, bad = None, unreadable(e)
        if bad:
            return None, [*lines, f"{rel}: {bad}"]
        return file, lines

    def plans(self, rels: Sequence[str]) -> Iterator[tuple[str, pa.Table | None]]:
        """(rel, the plan file whole when it is usable, else None and a problem) for each of ``rels``."""

        def read(rel: str) -> tuple[str, pa.Table | None, list[str]]:
            file, lines = self._load(rel, schemas.plan_schema(), True)
            try:
                return rel, None if file is None else file.read(use_threads=False), lines
            except (pa.ArrowException, OSError, ValueError) as e:
                return rel, None, [*lines, f"{rel}: {unreadable(e)}"]

        listed = [r for r in rels if r in self.sized]
        self.read.update(listed)
        for rel, table, lines in ahead(read(r) for r in listed):
            for line in lines:
                self.problems.append(line)
            yield rel, table

    def samples(
        self,
        parts: list[str] | None,
        want: pa.Schema,
        accepted: object,
        fingerprint: str,
        root: object = False,
        model_cost: Callable[[pa.Table], np.ndarray] | None = None,
        keep: Sequence[str] = (),
    ) -> Samples | None:
        """The samples ``parts`` (relative paths in order; None: unusable) streamed as one into the database
        (``validate_samples``), a row group decoded ahead on the reading thread, against the recorded
        ``accepted`` count and ``fingerprint``; stored paths checked against a manifest's ``path_root``
        ``root`` (``False``: not checked, a scan directory, whose parts are not listed)."""
        if parts is None:
            return None
        listed = root is not False
        if listed and not set(parts) <= self.sized:
            return None
        if listed:
            self.read.update(parts)

        def groups() -> Iterator[tuple[str, pa.Table | None, list[str]]]:
            for rel in parts:
                file, lines = self._load(rel, want, listed)
                path = storage.join(self.store.root, rel)
                if file is None:
                    yield path, None, lines
                    return
                columns = sample_columns(file.schema_arrow.names, keep)
                for g in range(file.metadata.num_row_groups):
                    yield path, file.read_row_group(g, columns=columns, use_threads=False), lines
                    lines = []
                if lines:
                    yield path, file.schema_arrow.empty_table().select(columns), lines

        def reported() -> Iterator[tuple[str, pa.Table | None]]:
            for path, t, lines in ahead(groups()):
                for line in lines:
                    self.problems.append(line)
                yield path, t

        try:
            return check_samples(self.db, reported(), accepted, fingerprint, root, self.problem, model_cost, keep)
        except (pa.ArrowException, OSError, ValueError, KeyError) as e:
            if isinstance(e, ScratchError):
                raise
            self.problem(schemas.SAMPLES_DIR, f"not readable Parquet parts ({type(e).__name__}: {str(e)[:120]})")
            return None

    def rejects(self, usable: bool, counts: ScanCounts, listed: bool = True) -> None:
        """rejects.parquet (read when ``usable``) against the recorded ``counts``, and
        scanned = accepted + rejected."""
        rel = schemas.REJECTS_FILE
        file, lines = self._load(rel, schemas.reject_schema(), listed) if usable else (None, [])
        if listed and usable:
            self.read.add(rel)
        for line in lines:
            self.problems.append(line)
        rejects = file.read(use_threads=False) if file is not None else None
        if rejects is not None:
            reasons = rejects.column("reason").to_pylist()
            unknown = sorted({r for r in reasons if r not in schemas.REJECT_REASONS}, key=str)
            if unknown:
                self.problem(rel, f"unknown reject reasons {unknown[:_MAX_SHOWN]}")
            if rejects.num_rows != counts.rejected:
                self.problem(rel, f"{rejects.num_rows} rows, counts.rejected is {counts.rejected}")
            by_reason = {r: reasons.count(r) for r in set(reasons)}
            if by_reason != counts.rejected_by_reason:
                self.problem(
                    rel, f"reasons {by_reason} != counts.rejected_by_reason {counts.rejected_by_reason}"
                )
        accepted, rejected = counts.accepted, counts.rejected
        if counts.scanned != accepted + rejected:
            self.problem("counts", f"scanned {counts.scanned} != accepted {accepted} + rejected {rejected}")


def _read(c: _Checker, load: Callable[..., _Record], rel: str) -> _Record:
    """``rel`` read once by the one metadata reader into its typed record; any failure stops validation
    with its one line ("_manifest.json: <key> must be ...")."""
    try:
        return load(c.store.root, where=rel)
    except OSError as e:
        raise Invalid(f"{rel}: cannot be read ({e})") from None
    except ValueError as e:
        raise Invalid(str(e)) from None


def _read_manifest(c: _Checker) -> Manifest:
    """``_manifest.json`` read once into the typed ``Manifest`` (not required to be committed: every
    number is compared with the files below)."""
    return _read(c, functools.partial(metadata.load_manifest, committed=False), schemas.MANIFEST_FILE)


def _plan_config(c: _Checker, m: Manifest) -> PlanConfig | None:
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


def _check_groups(c: _Checker, m: Manifest, cfg: PlanConfig) -> None:
    """The recorded ``plan_groups`` is what the build records for these settings (``groups_record``): a rule
    that contradicts its G (the auto rule's text with another G, or a rule of no build) is refused."""
    want = cfg.groups_record(m.counts.accepted)
    if m.plan_groups is not None and m.plan_groups.to_json() != want:
        c.problem(
            schemas.MANIFEST_FILE,
            f"plan_groups {short(m.plan_groups.to_json())} contradicts itself: a build with these settings and "
            f"{m.counts.accepted} accepted samples records {short(want)}",
        )


def _check_manifest(c: _Checker) -> str:
    m = _read_manifest(c)
    complete, parts = check_listed(c.problem, m.files, m.world_size, m.epochs, MAX_PROBLEMS)
    c.listed = m.files
    c.sized = check_recorded(c.problem, c.store.sizes(), m.files)
    model_cost, bad_model = cost_model_of(m)
    samples = c.samples(
        parts, schemas.scored_schema(), m.counts.accepted, m.inputs_fingerprint, m.path_root,
        model_cost if bad_model is None else None,
        COST_FEATURES if m.cost_history or m.memory_cap is not None else (),
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


def _check_scan(c: _Checker) -> str:
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
                return _validate(_Checker(out, db), out)
            finally:
                db.close()
    except ScratchError:
        raise
    except OSError as e:  # making or removing the temporary directory itself
        raise scratch_error(getattr(e, "filename", None) or _tmp_root(), e) from None


def _tmp_root() -> str:
    import tempfile

    return tempfile.gettempdir()


def _snapshot(c: _Checker) -> tuple[bytes, dict[str, FileInfo]] | None:
    """What identifies OUT's contents: ``_manifest.json``'s bytes and every file's (size, mtime)."""
    try:
        return c.store.read(schemas.MANIFEST_FILE), c.store.listing()
    except (OSError, ValueError):
        return None


def _changed(out: str, before: tuple[bytes, dict[str, FileInfo]] | None, c: _Checker) -> str | None:
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


def _validate(c: _Checker, out: str) -> tuple[Problems, str]:
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
        return Problems([changed]), ""
    return c.problems, summary


def run(argv: list[str] | None = None) -> int:
    """CLI entry: prints ``OK <summary>`` and returns 0, or prints the problems and returns 1."""
    parser = argparse.ArgumentParser(
        prog="lidarshard validate", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    parser.add_argument("out", help="manifest (or scan) directory: local path or URI")
    validate_data.add_flags(parser)
    args = parser.parse_args(argv)
    if args.root is not None and not args.data:
        parser.error("--root needs --data")
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
        print(f"  ... and {problems.total - len(shown)} more", file=sys.stderr)
    return 1


def _with_data(args: argparse.Namespace, problems: Problems, summary: str) -> tuple[Problems, str]:
    """``--data``: the files the samples name, checked once the directory is valid (its samples are
    then the ones committed)."""
    if problems:
        problems.append("--data: files not checked (the problems above come first)")
        return problems, summary
    kept = Problems()
    try:
        where = validate_data.check_data(
            args.out, args.root, lambda w, x: kept.append(f"{w}: {x}"), args.workers
        )
    except (OSError, ValueError) as e:
        return Problems([f"--data: the samples cannot be read ({str(e)[:200]})"]), summary
    return kept, f"{summary}; {where}"


if __name__ == "__main__":
    sys.exit(run())

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

import contextlib
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
from lidarshard.tools.validate_derived import PairRepeat, check_repeat_rate
from lidarshard.tools.validate_epoch import check_epoch_files
from lidarshard.tools.validate_files import (
    check_listed,
    check_recorded,
    check_scan_files,
    samples_parts,
    unreadable,
)
from lidarshard.tools.validate_repeat import check_sample_weights
from lidarshard.tools.validate_samples import (
    SamplesView,
    check_samples,
    check_scored,
    cost_model_of,
)
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.epochs import COST_FEATURES
from lidarshard.transforms.declare import Parser
from lidarshard.transforms.io import metadata, scratch, storage
from lidarshard.transforms.io.arrow import parquet_file, release_memory

__all__ = ["run", "validate"]

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

    def sizes(self) -> dict[str, int]:
        """{relative path: bytes} of every file below the root."""
        return {rel: info.size for rel, info in storage.list_files(self.root).items()}

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


class _Problems(list):
    """A list of problem lines that keeps the first ``MAX_PROBLEMS`` and counts the rest in ``more``."""

    def __init__(self) -> None:
        super().__init__()
        self.more = 0

    def append(self, line: str) -> None:
        if len(self) < MAX_PROBLEMS:
            super().append(line)
        else:
            self.more += 1

    def lines(self) -> list[str]:
        return [*self, f"... and {self.more} more problems"] if self.more else list(self)


class _Checker:
    """Accumulates problems; ``problem`` lines read ``<where>: <what>``."""

    def __init__(self, out: str, scratch: str) -> None:
        self.store = _Store(out)
        self.problems = _Problems()
        self.scratch = scratch  # validate's local temporary directory (never inside OUT)

    def problem(self, where: str, what: str) -> None:
        self.problems.append(f"{where}: {what}")

    def table(self, rel: str, want: pa.Schema) -> pa.Table | None:
        """The Parquet file ``rel`` when it reads and has the ``want`` schema (else a problem, None)."""
        try:
            table = storage.read_parquet(storage.join(self.store.root, rel))
        except (pa.ArrowException, OSError) as e:
            self.problem(rel, unreadable(e))
            return None
        bad = _schema_problem(table, want)
        if bad:
            self.problem(rel, bad)
            return None
        return table

    @contextlib.contextmanager
    def plan(self, rel: str) -> Iterator[pq.ParquetFile | None]:
        """The plan file ``rel`` open for streaming when it reads and has the plan schema (else a
        problem, None)."""
        file, bad = None, None
        with contextlib.ExitStack() as stack:
            try:
                file = parquet_file(
                    stack.enter_context(storage.open_read(storage.join(self.store.root, rel)))
                )
                bad = _schema_problem(file.schema_arrow.empty_table(), schemas.plan_schema())
            except (pa.ArrowException, OSError, ValueError) as e:
                bad = unreadable(e)
            if bad:
                self.problem(rel, bad)
            yield None if bad else file

    def samples(
        self,
        parts: list[str] | None,
        want: pa.Schema,
        accepted: object,
        fingerprint: str,
        root: object = False,
        model_cost: Callable[[pa.Table], np.ndarray] | None = None,
        keep: Sequence[str] = (),
    ) -> SamplesView | None:
        """The samples ``parts`` (relative paths in order; None: unusable) streamed as one
        (``validate_samples``), against the recorded ``accepted`` count and ``fingerprint``; stored
        paths checked against a manifest's ``path_root`` ``root`` (``False``: not checked, a scan
        directory)."""
        if parts is None:
            return None
        for one in parts:  # each part's own schema, named
            try:
                with storage.open_read(storage.join(self.store.root, one)) as f:
                    bad = _schema_problem(parquet_file(f).schema_arrow.empty_table(), want)
            except (pa.ArrowException, OSError, ValueError) as e:
                bad = f"not readable Parquet ({type(e).__name__}: {str(e)[:120]})"
            if bad:
                self.problem(one, bad)
                return None
        files = [storage.join(self.store.root, p) for p in parts]
        where = os.path.join(self.scratch, "samples")
        return check_samples(files, accepted, fingerprint, root, self.problem, where, model_cost, keep)

    def rejects(self, usable: bool, counts: ScanCounts) -> None:
        """rejects.parquet (read when ``usable``) against the recorded ``counts``, and
        scanned = accepted + rejected."""
        rel = schemas.REJECTS_FILE
        rejects = self.table(rel, schemas.reject_schema()) if usable else None
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


def _check_manifest(c: _Checker) -> str:
    m = _read_manifest(c)
    complete, parts = check_listed(c.problem, m.files, m.world_size, m.epochs, MAX_PROBLEMS)
    good = check_recorded(c.problem, c.store.root, c.store.sizes(), m.files)
    model_cost, bad_model = cost_model_of(m)
    samples = c.samples(
        parts if parts is not None and set(parts) <= good else None, schemas.scored_schema(),
        m.counts.accepted, m.inputs_fingerprint, m.path_root, model_cost if bad_model is None else None,
        COST_FEATURES if m.cost_history or m.memory_cap is not None else (),
    )  # fmt: skip
    c.rejects(schemas.REJECTS_FILE in good, m.counts)
    if samples is None:
        return "samples unusable"
    check_scored(c.problem, m, samples, bad_model)
    held = check_sample_weights(c.problems, m, samples)
    cfg = _plan_config(c, m)
    if not complete:  # a plan file is missing from the list: per-epoch checks would mislead
        return ""

    def open_plan(rel: str) -> contextlib.AbstractContextManager[pq.ParquetFile | None]:
        return c.plan(rel) if rel in good else contextlib.nullcontext(None)

    rows, work = 0, os.path.join(c.scratch, "plan")
    pairs = PairRepeat(work, samples.num_rows) if m.epochs > 1 else None
    for e in range(m.epochs):
        last = e == m.epochs - 1
        rows += check_epoch_files(c.problems, open_plan, m, cfg, e, samples, held, last, work, pairs)
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
    c.rejects(schemas.REJECTS_FILE in present, counts)
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


def validate(out: str) -> tuple[list[str], str]:
    """(problems, summary) for the directory ``out``; no problems means valid. What it parks goes to one
    local temporary directory (``scratch.temporary_dir``), removed when it returns."""
    with scratch.temporary_dir("lidarshard-validate-") as tmp:
        return _validate(_Checker(out, tmp), out)


def _validate(c: _Checker, out: str) -> tuple[list[str], str]:
    release_memory()  # in a build's launcher: what the pipeline run left in Arrow's pool and the heap
    try:
        if storage.is_local(out) and not os.path.isdir(storage.local_path(out)):
            raise Invalid(f"{out}: no such directory{_leftover_hint(out)}")
        present = c.store.sizes()
        if schemas.SUCCESS_FILE not in present:
            raise Invalid(
                f"{out}: no {schemas.SUCCESS_FILE}, so it is not a committed lidarshard output{_leftover_hint(out)}"
            )
        scan = schemas.MANIFEST_FILE not in present and schemas.SCAN_FILE in present
        summary = _check_scan(c) if scan else _check_manifest(c)
    except Invalid as e:
        return [*c.problems.lines(), str(e)], ""
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError, RecursionError) as e:
        return [*c.problems.lines(), f"_manifest.json: malformed ({type(e).__name__}: {str(e)[:200]})"], ""
    return c.problems.lines(), summary


def parser() -> Parser:
    """The ``validate`` command line: the arguments of ``validate_data.ValidateOptions``."""
    return Parser("lidarshard validate", __doc__.split("\n\n")[0], validate_data.ValidateOptions)


def run(argv: list[str] | None = None) -> int:
    """CLI entry: prints ``OK <summary>`` and returns 0, or prints the problems and returns 1."""
    args, _ = parser().read(argv)
    with scratch.sigterm_exits():  # its temporary directory goes on SIGTERM too
        problems, summary = validate(args.out)
        if args.data:
            problems, summary = _with_data(args, problems, summary)
    if not problems:
        print(f"OK {args.out}: {summary}")
        return 0
    print(f"INVALID {args.out}: {len(problems)} problem(s)", file=sys.stderr)
    for line in problems[:50]:
        print(f"  {line}", file=sys.stderr)
    if len(problems) > 50:
        print(f"  ... and {len(problems) - 50} more", file=sys.stderr)
    return 1


def _with_data(
    args: validate_data.ValidateOptions, problems: list[str], summary: str
) -> tuple[list[str], str]:
    """``--data``: the files the samples name, checked once the directory is valid (its samples are
    then the ones committed)."""
    if problems:
        return [*problems, "--data: files not checked (the problems above come first)"], summary
    kept = _Problems()
    try:
        where = validate_data.check_data(
            args.out, args.root, lambda w, x: kept.append(f"{w}: {x}"), args.workers
        )
    except (OSError, ValueError) as e:
        return [f"--data: the samples cannot be read ({str(e)[:200]})"], summary
    return kept.lines(), f"{summary}; {where}"


if __name__ == "__main__":
    sys.exit(run())

"""The data files of a manifest for ``lidarshard validate``, each on its own: the list in
``_manifest.json`` is exactly the samples parts (numbered from 0), rejects.parquet and one plan file
per (epoch, rank) (from the listed names only, so a forged ``world_size`` costs one problem line, not
a loop over it); every listed file has its recorded size and sha256 and nothing unlisted lies beside
them (a scan directory: only its samples and rejects); one plan file's rows are in (step, slot) order
with the steps and counts recorded."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lidarshard import schemas
from lidarshard.loaders.planfiles import recorded_file
from lidarshard.schemas.manifest import FileEntry
from lidarshard.schemas.records import ScanCounts
from lidarshard.tools.validate_db import Engine, ScratchError, ahead
from lidarshard.tools.validate_samples import Samples, check_samples, sample_columns
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import parquet_file
from lidarshard.transforms.io.parts import listed_parts
from lidarshard.transforms.io.storage import FileInfo

__all__ = [
    "MAX_PROBLEMS", "DERIVED_PREFIXES", "Problems", "Store", "Checker", "schema_problem", "samples_parts", "check_listed",
    "check_recorded", "check_scan_files", "unreadable",
]  # fmt: skip

#: Problems kept by default (``lidarshard validate``'s own: ``validate.MAX_PROBLEMS``); the rest are counted.
MAX_PROBLEMS = 200
_MAX_SHOWN = 5  # list items shown in one message
#: Samples rows checked (and decoded ahead) at a time: at 9 sweeps a row, ~6 MB of strings.
_SAMPLE_ROWS = 8192
#: Plan rows read (and decoded ahead) at a time: a rank file is never held whole (N / W rows).
_PLAN_ROWS = 8192

#: ``problem(where, what)``: report one problem.
Problem = Callable[[str, str], None]
_META = schemas.META_FILES
#: Directories of derived, non-contract files that may sit in OUT (reports, calibrations).
DERIVED_PREFIXES = (schemas.REPORT_DIR + "/",)


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
    checked as they are read: ``Checker``)."""
    sized: set[str] = set()
    extras = {rel for rel in present if rel.startswith(DERIVED_PREFIXES)}  # `lidarshard report` output
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


def check_scan_files(problem: Problem, present: Mapping[str, int]) -> list[str]:
    """A scan directory (``present``: {relative path: bytes}) holds its metadata, rejects.parquet and
    files under samples/ only; returns the latter (``samples_parts`` checks their names)."""
    in_samples = [rel for rel in present if rel.startswith(schemas.SAMPLES_DIR + "/")]
    for rel in sorted(set(present) - _META - {schemas.REJECTS_FILE} - set(in_samples)):
        problem(rel, "unexpected file in a scan directory")
    if schemas.REJECTS_FILE not in present:
        problem(schemas.REJECTS_FILE, "missing")
    return in_samples


def unreadable(err: Exception) -> str:
    """The problem of a Parquet file that does not read: the error's type and its first 120 characters."""
    return f"not a readable Parquet file ({type(err).__name__}: {str(err)[:120]})"


class Store:
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


def schema_problem(table: pa.Table, want: pa.Schema) -> str | None:
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
    """Problem lines: the first ``cap`` kept (and a last line counting the rest), ``total`` all of them.
    Bounds memory whatever a forged manifest claims."""

    def __init__(self, lines: Sequence[str] = (), cap: int = MAX_PROBLEMS) -> None:
        super().__init__()
        self.total, self.cap = 0, cap
        for line in lines:
            self.append(line)

    def append(self, line: str) -> None:
        self.total += 1
        if self.total <= self.cap:
            super().append(line)
        elif self.total == self.cap + 1:
            super().append("... and 1 more problems")
        else:
            self[-1] = f"... and {self.total - self.cap} more problems"


class Checker:
    """Accumulates problems (``problem`` lines read ``<where>: <what>``); reads OUT's files, each listed
    file's bytes checked against its recorded size and sha256 as they are read (``_open``)."""

    def __init__(self, out: str, db: Engine, problems: Problems) -> None:
        self.store = Store(out)
        self.problems = problems
        self.db = db
        self.listed: Mapping[str, FileEntry] = {}  # the manifest's files
        self.sized: set[str] = set()  # listed files there at their recorded size
        self.read: set[str] = set()  # those read (and hashed) so far

    def problem(self, where: str, what: str) -> None:
        self.problems.append(f"{where}: {what}")

    def hash_the_rest(self) -> None:
        """Every listed file not read by a check (it was not needed) is hashed all the same."""
        for rel in sorted(self.sized - self.read):
            self.read.add(rel)
            with self._open(rel, None, True) as (_, lines):
                for line in lines:
                    self.problems.append(line)

    @contextlib.contextmanager
    def _open(
        self, rel: str, want: pa.Schema | None, listed: bool
    ) -> Iterator[tuple[pq.ParquetFile | None, list[str]]]:
        """(the Parquet file ``rel`` when it reads and has the ``want`` schema, else None; the problem lines): a
        listed file read through the open file its recorded sha256 was checked on (``planfiles.recorded_file``:
        what is checked is what was hashed). Runs on the reading thread."""
        lines: list[str] = []
        with contextlib.ExitStack() as stack:
            file, bad = None, None
            try:
                if listed:
                    source = recorded_file(storage.join(self.store.root, rel), self.listed[rel])
                    if source is None:
                        lines.append(
                            f"{rel}: sha256 differs from the one recorded at commit (file was modified)"
                        )
                else:
                    source = storage.open_read(storage.join(self.store.root, rel))
                if source is not None:
                    stack.enter_context(source)
                    if want is not None:  # None: only hashed
                        file = parquet_file(source)
                        bad = schema_problem(file.schema_arrow.empty_table(), want)
            except OSError as e:
                bad = f"cannot be read ({e})" if not isinstance(e, pa.ArrowException) else unreadable(e)
            except (pa.ArrowException, ValueError) as e:
                bad = unreadable(e)
            if bad:
                file, lines = None, [*lines, f"{rel}: {bad}"]
            yield file, lines

    def plans(self, rels: Sequence[str]) -> Iterator[tuple[str, pa.Table | None, pa.Table | None]]:
        """Each of ``rels``, read on the reading thread: (rel, its columns but ``sweep_paths`` (its structure),
        None), then (rel, None, its next ``_PLAN_ROWS`` rows) until its end; (rel, None, None) and a problem
        when it is not usable (at once, or midway: its rows are then not to be used)."""

        def read(rel: str) -> Iterator[tuple[str, pa.Table | None, pa.Table | None, list[str]]]:
            with self._open(rel, schemas.plan_schema(), True) as (file, lines):
                try:
                    if file is None:
                        yield rel, None, None, lines
                        return
                    names = [n for n in file.schema_arrow.names if n != "sweep_paths"]
                    yield rel, file.read(names, use_threads=False), None, lines
                    for batch in file.iter_batches(_PLAN_ROWS, use_threads=False):
                        yield rel, None, pa.Table.from_batches([batch]), []
                except (pa.ArrowException, OSError, ValueError) as e:
                    yield rel, None, None, [f"{rel}: {unreadable(e)}"]

        listed = [r for r in rels if r in self.sized]
        self.read.update(listed)
        for rel, head, rows, lines in ahead(item for r in listed for item in read(r)):
            for line in lines:
                self.problems.append(line)
            yield rel, head, rows

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
                path = storage.join(self.store.root, rel)
                with self._open(rel, want, listed) as (file, lines):
                    if file is None:
                        yield path, None, lines
                        return
                    columns, empty = sample_columns(file.schema_arrow.names, keep), True
                    for batch in file.iter_batches(_SAMPLE_ROWS, columns=columns, use_threads=False):
                        yield path, pa.Table.from_batches([batch]), lines
                        lines, empty = [], False
                    if empty:  # a part of no rows (an empty scan): its schema all the same
                        yield path, file.schema_arrow.empty_table().select(columns), lines

        def reported() -> Iterator[tuple[str, pa.Table | None]]:
            for path, t, lines in ahead(groups(), depth=1):
                for line in lines:
                    self.problems.append(line)
                yield path, t

        try:
            return check_samples(
                self.db, reported(), accepted, fingerprint, root, self.problem, model_cost, keep
            )
        except (pa.ArrowException, OSError, ValueError, KeyError) as e:
            if isinstance(e, ScratchError):
                raise
            self.problem(
                schemas.SAMPLES_DIR, f"not readable Parquet parts ({type(e).__name__}: {str(e)[:120]})"
            )
            return None

    def rejects(self, usable: bool, counts: ScanCounts, listed: bool = True) -> None:
        """rejects.parquet (read when ``usable``) against the recorded ``counts``, and
        scanned = accepted + rejected."""
        rel = schemas.REJECTS_FILE
        rejects = None
        if usable:
            self.read.add(rel)
            with self._open(rel, schemas.reject_schema(), listed) as (file, lines):
                rejects = file.read(use_threads=False) if file is not None else None
            for line in lines:
                self.problems.append(line)
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

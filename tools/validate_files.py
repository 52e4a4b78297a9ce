"""The data files of an output for ``lidarshard validate``: the list in ``_manifest.json`` is exactly the
samples parts (numbered from 0), rejects.parquet and one plan file per (epoch, rank) (judged from the listed
names: a forged ``world_size`` costs one line, not a loop over it); every listed file has its recorded size
and sha256, nothing unlisted lies beside them (a scan directory: only samples and rejects); each file's
Arrow schema is the contract's as its version wrote it. :class:`Checker` reads them, hashing as it reads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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

__all__ = ["DERIVED_PREFIXES", "Problems", "Checker", "check_listed", "check_recorded", "check_scan_files"]

#: Rows read (and decoded ahead) at a time, several batches in flight: at validate_bench's 1M manifest (9 sweeps)
#: 8192 peaked at 351-365 MiB in 9.3-9.6 s, 4096 at 329-330 MiB in 10.2 s, 2048 at 330-332 MiB in 11.4-12 s.
_ROWS = 4096
#: ``problem(where, what)``: report one problem.
Problem = Callable[[str, str], None]
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
    problem: Problem, files: Mapping[str, object], w: int, epochs: int, enumerate_up_to: int
) -> tuple[bool, list[str] | None]:
    """``files`` (the manifest's list) is exactly the samples parts, rejects and one plan file per (epoch,
    rank); missing plan files are named one by one when at most ``enumerate_up_to`` -> (whether the list is
    complete, the samples parts in order or None)."""
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
    """The ``recorded`` files against ``present`` ({relative path: bytes}): each there at its recorded size,
    nothing unlisted -> those of the right size (their sha256 is checked as they are read)."""
    extras = {rel for rel in present if rel.startswith(DERIVED_PREFIXES)}  # `lidarshard report` output
    for rel in sorted(set(present) - schemas.META_FILES - set(recorded) - extras):
        problem(rel, "file is not listed in _manifest.json 'files' (left over or added)")
    for rel, info in sorted(recorded.items()):
        if rel not in present:
            problem(rel, f"missing (recorded {info.bytes} bytes at commit)")
        elif present[rel] != info.bytes:
            problem(rel, f"{present[rel]} bytes, recorded {info.bytes} at commit (truncated or rewritten)")
    return {rel for rel, info in recorded.items() if present.get(rel) == info.bytes}


def check_scan_files(problem: Problem, present: Mapping[str, int]) -> list[str]:
    """A scan directory holds its metadata, rejects.parquet and files under samples/ only -> the latter."""
    in_samples = [rel for rel in present if rel.startswith(schemas.SAMPLES_DIR + "/")]
    for rel in sorted(set(present) - schemas.META_FILES - {schemas.REJECTS_FILE} - set(in_samples)):
        problem(rel, "unexpected file in a scan directory")
    if schemas.REJECTS_FILE not in present:
        problem(schemas.REJECTS_FILE, "missing")
    return in_samples


def _unreadable(err: Exception) -> str:
    return f"not a readable Parquet file ({type(err).__name__}: {str(err)[:120]})"


def _type(t: pa.DataType) -> str:
    """Type name ignoring the list item's field name (Parquet round trips call it 'element')."""
    return f"list<{_type(t.value_type)}>" if pa.types.is_list(t) else str(t)


def schema_problem(schema: pa.Schema, want: pa.Schema) -> str | None:
    """What is wrong with ``schema`` against the contract ``want`` as the version the file names wrote it
    (``schemas.as_written``: a 4.0 file has no 4.1 columns)."""
    version = (schema.metadata or {}).get(b"lidarshard.schema_version", b"").decode()
    if not schemas.is_readable(version):
        return f"written with schema version {version!r}, expected {schemas.SCHEMA_VERSION!r} (or an earlier minor)"
    got = {f.name: _type(f.type) for f in schema}
    exp = {f.name: _type(f.type) for f in schemas.as_written(want, version)}
    twice = sorted({n for n in schema.names if schema.names.count(n) > 1})
    if twice:
        return f"schema differs from the contract: column {twice[0]!r} appears more than once"
    if got != exp or list(got) != list(exp):
        missing, extra = [n for n in exp if n not in got], [n for n in got if n not in exp]
        typed = [f"{n} is {got[n]}, expected {t}" for n, t in exp.items() if n in got and got[n] != t]
        parts = [f"missing {missing}"] * bool(missing) + [f"extra {extra}"] * bool(extra) + typed[:3]
        return "schema differs from the contract: " + ("; ".join(parts) or "column order differs")
    return None


class Problems(list):
    """Problem lines: the first ``cap`` kept (then one line counting the rest), ``total`` all of them.
    Bounds memory whatever a forged manifest claims."""

    def __init__(self, lines: Sequence[str], cap: int) -> None:
        super().__init__()
        self.total, self.cap = 0, cap
        self.extend(lines)

    def extend(self, lines: Iterable[str]) -> None:
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
    """Reads OUT (local path or URI), each listed file's bytes checked against its recorded size and sha256
    as they are read (``_open``); accumulates ``problems`` (``problem`` lines read ``<where>: <what>``)."""

    def __init__(self, out: str, db: Engine, problems: Problems) -> None:
        self.root, self.db, self.problems = out.rstrip("/") or "/", db, problems
        self.listed: Mapping[str, FileEntry] = {}  # the manifest's files
        self.sized: set[str] = set()  # listed files there at their recorded size
        self.read: set[str] = set()  # those read (and hashed) so far

    def problem(self, where: str, what: str) -> None:
        self.problems.append(f"{where}: {what}")

    def listing(self) -> dict[str, FileInfo]:
        """{relative path: (bytes, mtime)} of every file below the root."""
        return storage.list_files(self.root)

    def sizes(self) -> dict[str, int]:
        return {rel: info.size for rel, info in self.listing().items()}

    def hash_the_rest(self) -> None:
        """Every listed file no check read is hashed all the same."""
        for rel in sorted(self.sized - self.read):
            self.read.add(rel)
            with self._open(rel, None, True) as (_, lines):
                self.problems.extend(lines)

    @contextlib.contextmanager
    def _open(
        self, rel: str, want: pa.Schema | None, listed: bool
    ) -> Iterator[tuple[pq.ParquetFile | None, list[str]]]:
        """(the Parquet file ``rel`` when it reads with the ``want`` schema, else None; problem lines): a listed
        file is read through the open file its sha256 was checked on (``planfiles.recorded_file``)."""
        lines: list[str] = []
        with contextlib.ExitStack() as stack:
            file, bad = None, None
            try:
                path = storage.join(self.root, rel)
                source = recorded_file(path, self.listed[rel]) if listed else storage.open_read(path)
                if source is None:
                    lines.append(f"{rel}: sha256 differs from the one recorded at commit (file was modified)")
                else:
                    stack.enter_context(source)
                    if want is not None:  # None: only hashed
                        file = parquet_file(source)
                        bad = schema_problem(file.schema_arrow, want)
            except OSError as e:
                bad = f"cannot be read ({e})" if not isinstance(e, pa.ArrowException) else _unreadable(e)
            except (pa.ArrowException, ValueError) as e:
                bad = _unreadable(e)
            if bad:
                file, lines = None, [*lines, f"{rel}: {bad}"]
            yield file, lines

    def plans(self, rels: Sequence[str]) -> Iterator[tuple[str, pa.Table | None, pa.Table | None]]:
        """Each of ``rels`` read on the reading thread: (rel, its columns but ``sweep_paths``, None), then (rel,
        None, its next rows) to its end; (rel, None, None) and a problem when not usable (at once or midway)."""

        def read(rel: str) -> Iterator[tuple[str, pa.Table | None, pa.Table | None, list[str]]]:
            with self._open(rel, schemas.plan_schema(), True) as (file, lines):
                try:
                    if file is None:
                        yield rel, None, None, lines
                        return
                    names = [n for n in file.schema_arrow.names if n != "sweep_paths"]
                    yield rel, file.read(names, use_threads=False), None, lines
                    for batch in file.iter_batches(_ROWS, use_threads=False):
                        yield rel, None, pa.Table.from_batches([batch]), []
                except (pa.ArrowException, OSError, ValueError) as e:
                    yield rel, None, None, [f"{rel}: {_unreadable(e)}"]

        listed = [r for r in rels if r in self.sized]
        self.read.update(listed)
        for rel, head, rows, lines in ahead(item for r in listed for item in read(r)):
            self.problems.extend(lines)
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
        """The samples ``parts`` (None: unusable) into the database (``check_samples``), a row group decoded
        ahead, against ``accepted`` and ``fingerprint``; stored paths against a manifest's ``path_root``
        ``root`` (``False``: not checked, a scan directory, whose parts are not listed)."""
        listed = root is not False
        if parts is None or (listed and not set(parts) <= self.sized):
            return None
        self.read.update(parts if listed else ())

        def groups() -> Iterator[tuple[str, pa.Table | None, list[str]]]:
            for rel in parts:
                path = storage.join(self.root, rel)
                with self._open(rel, want, listed) as (file, lines):
                    if file is None:
                        yield path, None, lines
                        return
                    columns, empty = sample_columns(file.schema_arrow.names, keep), True
                    for batch in file.iter_batches(_ROWS, columns=columns, use_threads=False):
                        yield path, pa.Table.from_batches([batch]), lines
                        lines, empty = [], False
                    if empty:  # a part of no rows (an empty scan): its schema all the same
                        yield path, file.schema_arrow.empty_table().select(columns), lines

        def reported() -> Iterator[tuple[str, pa.Table | None]]:
            for path, t, lines in ahead(groups(), depth=1):
                self.problems.extend(lines)
                yield path, t

        try:
            return check_samples(
                self.db, reported(), accepted, fingerprint, root, self.problem, model_cost, keep
            )
        except ScratchError:
            raise
        except (pa.ArrowException, OSError, ValueError, KeyError) as e:
            self.problem(
                schemas.SAMPLES_DIR, f"not readable Parquet parts ({type(e).__name__}: {str(e)[:120]})"
            )
            return None

    def rejects(self, usable: bool, counts: ScanCounts, listed: bool = True) -> None:
        """rejects.parquet (read when ``usable``) against the recorded ``counts``; scanned = accepted + rejected."""
        rel, rejects = schemas.REJECTS_FILE, None
        if usable:
            self.read.add(rel)
            with self._open(rel, schemas.reject_schema(), listed) as (file, lines):
                rejects = file.read(["reason"], use_threads=False) if file is not None else None
            self.problems.extend(lines)
        if rejects is not None:
            by_reason = {
                d["values"]: d["counts"] for d in pc.value_counts(rejects.column("reason")).to_pylist()
            }
            unknown = sorted((r for r in by_reason if r not in schemas.REJECT_REASONS), key=str)
            if unknown:
                self.problem(rel, f"unknown reject reasons {unknown[:5]}")
            if rejects.num_rows != counts.rejected:
                self.problem(rel, f"{rejects.num_rows} rows, counts.rejected is {counts.rejected}")
            if by_reason != counts.rejected_by_reason:
                self.problem(
                    rel, f"reasons {by_reason} != counts.rejected_by_reason {counts.rejected_by_reason}"
                )
        if counts.scanned != counts.accepted + counts.rejected:
            self.problem(
                "counts",
                f"scanned {counts.scanned} != accepted {counts.accepted} + rejected {counts.rejected}",
            )

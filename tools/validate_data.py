"""``lidarshard validate OUT --data``: every file the samples name is the file the scan read.

For each sample, its keyframe (``path``), each sweep (``sweep_paths``) and its label file
(``label_path``) must exist, be a regular file of the recorded size and, where the scan recorded one,
have the recorded ``schemas.content_hash`` (``schemas.INTEGRITY_FIELDS``). One problem line per file
that differs, in sample order.

Bounded memory whatever the dataset: the samples parts are streamed a row group at a time, and a pool
of threads checks the files in order with at most ``WINDOW_PER_WORKER`` files in flight per thread,
each hashed in ``BLOCK``-byte reads (``zlib.crc32`` releases the GIL, so threads hash in parallel).
A file two samples name is checked twice: remembering every path would not stay bounded.

A file whose size was not recorded (a table given to ``write_manifest``) is only checked to exist (the
summary says so). Reads local paths and URIs through ``lidarshard.transforms.io.storage``.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from lidarshard import schemas
from lidarshard.loaders.points import Recorded, difference
from lidarshard.transforms.declare import option, switch
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import row_groups
from lidarshard.transforms.io.metadata import load_manifest, load_scan
from lidarshard.transforms.io.parts import listed_parts, open_parts, part_files
from lidarshard.transforms.io.paths import PathResolver
from lidarshard.transforms.value_checks import UsageError, int_in, path

__all__ = ["check_data", "ValidateOptions", "DEFAULT_WORKERS", "MAX_WORKERS", "BLOCK", "WINDOW_PER_WORKER"]

#: Threads checking files (``--workers``): I/O bound on object stores, CPU bound (hashing) on a local disk.
DEFAULT_WORKERS = 8
#: The most ``--workers`` takes.
MAX_WORKERS = 256
#: Bytes read (and hashed) at a time per file.
BLOCK = 1 << 20
#: Files submitted ahead of the one whose result is awaited, per thread.
WINDOW_PER_WORKER = 4

#: ``problem(where, what)``: report one problem.
Problem = Callable[[str, str], None]


@dataclass(frozen=True)
class _File:
    """One file a sample names: ``what`` it is to the sample (``keyframe``, ``sweep 3``, ``labels``)."""

    sample_id: str
    what: str
    path: str
    recorded: Recorded


@dataclass
class _Tally:
    files: int = 0
    bytes: int = 0
    unsized: int = 0
    unhashed: int = 0


def _hash_file(path: str, size: int) -> tuple[int, int]:
    """(bytes read, content hash) of ``path``, reading at most ``size + 1`` bytes (a file that grew
    shows it, a huge replacement is not read whole)."""
    running, seen = 0, 0
    with storage.open_read(path) as f:
        while seen <= size and (block := f.read(min(BLOCK, size + 1 - seen))):
            running = schemas.content_hash(block, running)
            seen += len(block)
    return seen, running


def _check(file: _File) -> tuple[str | None, int]:
    """(what differs, or None; bytes hashed) for one file."""
    try:
        size = storage.size(file.path)
    except FileNotFoundError:
        return "missing", 0
    except (OSError, ValueError) as e:  # a FIFO or directory, permissions, a store's error, a bad URI
        return f"cannot be read ({str(e)[:160]})", 0
    rec = file.recorded
    if rec.crc32 is None or (rec.size is not None and size != rec.size):
        return difference(rec, size), 0
    try:
        seen, crc = _hash_file(file.path, rec.size if rec.size is not None else size)
    except (OSError, ValueError) as e:
        return f"cannot be read ({str(e)[:160]})", 0
    return difference(rec, seen, crc), seen


def _samples(out: str) -> tuple[list[str], str, str | None]:
    """(the samples parts of OUT in order, the schema version that wrote them, the recorded path_root)."""
    if storage.exists(storage.join(out, schemas.MANIFEST_FILE)):
        m = load_manifest(out)
        return [storage.join(out, rel) for rel in listed_parts(m.files)], m.schema_version, m.path_root
    version = load_scan(out).schema_version
    return part_files(storage.join(out, schemas.SAMPLES_DIR)), version, None  # a scan: full paths


def _files(parts: list[str], version: str, resolve: PathResolver, problem: Problem) -> Iterator[_File]:
    """Every file the samples name, in sample order, with what the scan recorded of it."""
    stored = set(schemas.sample_schema(version).names)
    names = ["sample_id", "path", "sweep_paths", "label_path"]
    names += [n for n in schemas.INTEGRITY_FIELDS if n in stored]
    with open_parts(parts) as file:
        for t in row_groups(file, names):
            for row in t.to_pylist():  # a missing column (schema 3.0) reads as None
                yield from _row_files(row, resolve, problem)


def _row_files(row: dict, resolve: PathResolver, problem: Problem) -> Iterator[_File]:
    """The keyframe, sweeps and label file of one sample row."""
    sid, sweeps = row["sample_id"], row["sweep_paths"] or []
    yield _File(sid, "keyframe", resolve(row["path"]), Recorded(row.get("path_bytes"), row.get("path_crc32")))
    sizes, hashes = row.get("sweep_bytes"), row.get("sweep_crc32")
    if any(v is not None and len(v) != len(sweeps) for v in (sizes, hashes)):
        problem(f"sample {sid!r}", f"sweep_bytes/sweep_crc32 do not hold one value per sweep ({len(sweeps)})")
        sizes = hashes = None
    for k, p in enumerate(sweeps):
        yield _File(sid, f"sweep {k}", resolve(p), Recorded(sizes and sizes[k], hashes and hashes[k]))
    if row["label_path"] is not None:
        label = Recorded(row.get("label_bytes"), row.get("label_crc32"))
        yield _File(sid, "labels", resolve(row["label_path"]), label)


def _in_order(files: Iterator[_File], workers: int) -> Iterator[tuple[_File, str | None, int]]:
    """``_check`` of every file on ``workers`` threads, results in the files' order, at most
    ``workers * WINDOW_PER_WORKER`` files in flight."""
    window: collections.deque[tuple[_File, Future]] = collections.deque()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lidarshard-data") as pool:
        for file in files:
            window.append((file, pool.submit(_check, file)))
            if len(window) >= workers * WINDOW_PER_WORKER:
                done, future = window.popleft()
                yield done, *future.result()
        while window:
            done, future = window.popleft()
            yield done, *future.result()


def check_data(out: str, root: str | None, problem: Problem, workers: int = DEFAULT_WORKERS) -> str:
    """Check every file the samples of ``out`` name (``root``: where the data lives now, for relative
    paths; default the recorded ``path_root``). Reports one ``problem(path, what)`` per file that
    differs; returns the summary.

    Raises:
        ValueError, OSError: the samples cannot be read (the caller validated them first).
    """
    parts, version, path_root = _samples(out)
    resolve = PathResolver(path_root, root)
    tally = _Tally()
    for file, what, hashed in _in_order(_files(parts, version, resolve, problem), workers):
        tally.files += 1
        tally.bytes += hashed
        tally.unsized += file.recorded.size is None
        tally.unhashed += file.recorded.crc32 is None
        if what:
            problem(file.path, f"{file.what} of sample {file.sample_id!r}: {what}")
    return _summary(tally)


def _summary(t: _Tally) -> str:
    """The summary of a check that found no problem."""
    line = f"data: {t.files} files as recorded ({t.bytes / 1e9:.2f} GB hashed)"
    if t.unsized:
        line += (
            f"; {t.unsized} of them only checked to exist (none recorded: rescan to record sizes and hashes)"
        )
    elif t.unhashed:
        line += f"; {t.unhashed} of them by size only (no {schemas.CONTENT_HASH} recorded: --features stat)"
    return line


@dataclass(frozen=True, kw_only=True)
class ValidateOptions:
    """``lidarshard validate``'s arguments (``--data``, ``--root`` and ``--workers`` are this module's)."""

    out: str = option("manifest (or scan) directory: local path or URI", positional=True, check=path(),
                      metavar="OUT")  # fmt: skip
    data: bool = switch(f"also check that every keyframe, sweep and label file exists with the size and "
                        f"{schemas.CONTENT_HASH} the scan recorded (reads every byte; one line per file that differs)")  # fmt: skip
    root: str | None = option(
        "with --data: where the data lives now", None, check=path(), shown="the recorded path_root"
    )
    workers: int = option(f"with --data: files checked at once, 1..{MAX_WORKERS}",
                          DEFAULT_WORKERS, check=int_in(1, MAX_WORKERS))  # fmt: skip

    def __post_init__(self) -> None:
        if self.root is not None and not self.data:
            raise UsageError("--root needs --data")

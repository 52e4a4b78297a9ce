"""``lidarshard validate OUT --data``: every file the samples name is the file the scan read.

Each sample's keyframe (``path``), sweeps (``sweep_paths``) and label file (``label_path``) must be a regular
file of the recorded size and, where the scan recorded one, ``schemas.content_hash``; one line per file that
differs, in sample order. Bounded memory: the parts stream a row group at a time and ``--workers`` threads
check the files in order, ``WINDOW_PER_WORKER`` in flight each, hashed ``BLOCK`` bytes at a time (a file two
samples name is checked twice). A file of no recorded size is only checked to exist (the summary says so).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from lidarshard import schemas
from lidarshard.loaders.points import Recorded, difference
from lidarshard.tools.validate_db import in_order
from lidarshard.transforms.declare import option, switch
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import row_groups
from lidarshard.transforms.io.metadata import load_manifest, load_scan
from lidarshard.transforms.io.parts import listed_parts, open_parts, part_files
from lidarshard.transforms.io.paths import PathResolver
from lidarshard.transforms.value_checks import UsageError, int_in, path

__all__ = ["check_data", "ValidateOptions"]

DEFAULT_WORKERS, MAX_WORKERS = 8, 256  # --workers: I/O bound on object stores, CPU bound (hashing) locally
BLOCK = 1 << 20  # bytes read (and hashed) at a time per file
WINDOW_PER_WORKER = 4  # files submitted ahead of the one whose result is awaited, per thread
#: One file a sample names: (sample_id, what it is to the sample: ``keyframe``, ``sweep 3``, ``labels``, path,
#: what the scan recorded of it).
_File = tuple[str, str, str, Recorded]


def _check(file: _File) -> tuple[_File, str | None, int]:
    """(``file``, what differs or None, bytes hashed): at most its recorded size + 1 bytes are read (a file
    that grew shows it, a huge replacement is not read whole)."""
    where, rec = file[2], file[3]
    try:
        size = storage.size(where)
        if rec.crc32 is None or (rec.size is not None and size != rec.size):
            return file, difference(rec, size), 0
        crc, seen, limit = 0, 0, rec.size if rec.size is not None else size
        with storage.open_read(where) as f:
            while seen <= limit and (block := f.read(min(BLOCK, limit + 1 - seen))):
                crc, seen = schemas.content_hash(block, crc), seen + len(block)
    except FileNotFoundError:
        return file, "missing", 0
    except (OSError, ValueError) as e:  # a FIFO or directory, permissions, a store's error, a bad URI
        return file, f"cannot be read ({str(e)[:160]})", 0
    return file, difference(rec, seen, crc), seen


def _files(out: str, root: str | None, problem: Callable[[str, str], None]) -> Iterator[_File]:
    """Every file the samples of ``out`` name, in sample order (``root``: where relative paths live now)."""
    if storage.exists(storage.join(out, schemas.MANIFEST_FILE)):
        m = load_manifest(out)
        parts, version, resolve = (
            [storage.join(out, rel) for rel in listed_parts(m.files)],
            m.schema_version,
            PathResolver(m.path_root, root),
        )
    else:  # a scan: full paths
        parts, version = part_files(storage.join(out, schemas.SAMPLES_DIR)), load_scan(out).schema_version
        resolve = PathResolver(None, root)
    stored = set(schemas.sample_schema(version).names)
    names = [
        "sample_id",
        "path",
        "sweep_paths",
        "label_path",
        *(n for n in schemas.INTEGRITY_FIELDS if n in stored),
    ]
    with open_parts(parts) as file:
        for t in row_groups(file, names):
            for row in t.to_pylist():  # a missing column (schema 3.0) reads as None
                sid, sweeps, get = row["sample_id"], row["sweep_paths"] or [], row.get
                yield sid, "keyframe", resolve(row["path"]), Recorded(get("path_bytes"), get("path_crc32"))
                sizes, hashes = get("sweep_bytes"), get("sweep_crc32")
                if any(v is not None and len(v) != len(sweeps) for v in (sizes, hashes)):
                    problem(
                        f"sample {sid!r}",
                        f"sweep_bytes/sweep_crc32 do not hold one value per sweep ({len(sweeps)})",
                    )
                    sizes = hashes = None
                for k, p in enumerate(sweeps):
                    yield sid, f"sweep {k}", resolve(p), Recorded(sizes and sizes[k], hashes and hashes[k])
                if row["label_path"] is not None:
                    yield (
                        sid,
                        "labels",
                        resolve(row["label_path"]),
                        Recorded(get("label_bytes"), get("label_crc32")),
                    )


def check_data(
    out: str, root: str | None, problem: Callable[[str, str], None], workers: int = DEFAULT_WORKERS
) -> str:
    """Check every file the samples of ``out`` name (``root``: where the data lives now; default the recorded
    ``path_root``): one ``problem(path, what)`` per file that differs -> the summary.

    Raises:
        ValueError, OSError: the samples cannot be read (the caller validated them first).
    """
    files = hashed = unsized = unhashed = 0
    for (sid, what, where, rec), bad, seen in in_order(
        _check, _files(out, root, problem), workers, WINDOW_PER_WORKER
    ):
        files, hashed, unsized, unhashed = (
            files + 1,
            hashed + seen,
            unsized + (rec.size is None),
            unhashed + (rec.crc32 is None),
        )
        if bad:
            problem(where, f"{what} of sample {sid!r}: {bad}")
    line = f"data: {files} files as recorded ({hashed / 1e9:.2f} GB hashed)"
    if unsized:
        return f"{line}; {unsized} of them only checked to exist (none recorded: rescan to record sizes and hashes)"
    if unhashed:
        return (
            f"{line}; {unhashed} of them by size only (no {schemas.CONTENT_HASH} recorded: --features stat)"
        )
    return line


@dataclass(frozen=True, kw_only=True)
class ValidateOptions:
    """``lidarshard validate``'s arguments (``--data``, ``--root`` and ``--workers`` are this module's)."""

    out: str = option(
        "manifest (or scan) directory: local path or URI", positional=True, check=path(), metavar="OUT"
    )
    data: bool = switch(
        f"also check that every keyframe, sweep and label file exists with the size and "
        f"{schemas.CONTENT_HASH} the scan recorded (reads every byte; one line per file that differs)"
    )
    root: str | None = option(
        "with --data: where the data lives now", None, check=path(), shown="the recorded path_root"
    )
    workers: int = option(
        f"with --data: files checked at once, 1..{MAX_WORKERS}", DEFAULT_WORKERS, check=int_in(1, MAX_WORKERS)
    )

    def __post_init__(self) -> None:
        if self.root is not None and not self.data:
            raise UsageError("--root needs --data")

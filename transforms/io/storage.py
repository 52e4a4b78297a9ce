"""One storage layer: every file lidarshard reads or writes goes through these functions. No Beam.

Paths are local paths, ``file://`` URIs, or URIs of an object store / remote filesystem. Local
paths are served here with ``os`` (regular files only, bounded reads, atomic writes). Other URIs go
to the first registered backend that handles them, else to ``pyarrow.fs`` (gs://, s3://, hdfs://,
abfs://), whose filesystem objects are cached per process (one per scheme and bucket/host).

Why pyarrow.fs and not fsspec: pyarrow is already a core dependency and ships GCS/S3/HDFS clients,
so the trainer install stays numpy + pyarrow; fsspec would add a package and per-scheme plugins.
The pipeline registers an adapter over Beam's ``FileSystems`` (``lidarshard.transforms.beam.filesystems``)
on import of the Beam layer, so schemes only Beam knows keep working and Beam's own
credentials/options (``--s3_endpoint_url`` ...) apply where a pipeline runs.

Modules: ``safeio`` (hostile local files: regular files only, capped reads), ``base`` (types, path rules), ``local`` (``os``: regular files, bounded reads, atomic writes
and directory swaps), ``arrow`` (``pyarrow.fs``); this package's functions dispatch between them.
"""

from __future__ import annotations

import glob as _glob
import json
import os
import shutil
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, BinaryIO

import pyarrow as pa

from lidarshard.schemas.jsonsafe import loads
from lidarshard.transforms.io.arrow import parquet_file, parquet_table
from lidarshard.transforms.io.arrowfs import ArrowBackend, arrow_filesystem
from lidarshard.transforms.io.base import (
    Backend,
    FileInfo,
    FileTooLargeError,
    NotRegularFileError,
    absolute,
    has_scheme,
    is_local,
    join,
    local_path,
)
from lidarshard.transforms.io.local import (
    exchange,
    list_local,
    open_write_local,
    read_local,
    size_local,
    write_local,
)
from lidarshard.transforms.io.safeio import open_local

__all__ = [
    "Backend",
    "FileInfo",
    "FileTooLargeError",
    "NotRegularFileError",
    "absolute",
    "arrow_filesystem",
    "copy",
    "delete",
    "exchange",
    "exists",
    "glob",
    "has_scheme",
    "is_dir",
    "is_local",
    "join",
    "list_files",
    "local_path",
    "open_read",
    "open_write",
    "read_bytes",
    "read_json",
    "read_parquet",
    "register_backend",
    "remove_tree",
    "size",
    "write_bytes",
    "write_json",
]

#: Cap on metadata reads (``_manifest.json``, ``_scan.json``, cost-model files), bytes.
METADATA_MAX_BYTES = 64 << 20


_BACKENDS: list[Backend] = []


def register_backend(backend: Backend) -> None:
    """Serve the URIs ``backend.handles`` before pyarrow.fs (idempotent per backend type)."""
    if not any(type(b) is type(backend) for b in _BACKENDS):
        _BACKENDS.append(backend)


_ARROW = ArrowBackend()


def _backend(uri: str) -> Backend:
    return next((b for b in _BACKENDS if b.handles(uri)), _ARROW)


def read_bytes(path: str, max_bytes: int | None = None) -> bytes:
    """The whole file at ``path``, never more than ``max_bytes`` read (None: no cap).

    Raises:
        FileNotFoundError: nothing there. IsADirectoryError: a directory.
        NotRegularFileError: a local FIFO, device or socket (also behind a symlink).
        FileTooLargeError: larger than ``max_bytes``.
        OSError: any other failure to read.
    """
    if is_local(path):
        return read_local(local_path(path), max_bytes)
    backend = _backend(path)
    try:  # bounded without a stat first: one round trip less a file
        data = backend.read(path, None if max_bytes is None else max_bytes + 1)
    except FileNotFoundError:
        raise
    except OSError:
        backend.stat(path)  # FileNotFoundError / IsADirectoryError when that is what failed
        raise
    if max_bytes is not None and len(data) > max_bytes:
        raise FileTooLargeError(path, len(data), max_bytes)
    return data


def read_json(path: str, max_bytes: int = METADATA_MAX_BYTES, what: str | None = None) -> Any:
    """Parse the JSON file at ``path`` with ``jsonsafe.loads`` (bounded nesting and integers);
    ValueError naming ``what`` (default: the path) when it is not JSON."""
    return loads(read_bytes(path, max_bytes), what or path)


def read_parquet(path: str, columns: Sequence[str] | None = None, max_bytes: int | None = None) -> pa.Table:
    """One Parquet file as a table (``columns``: a subset, in that order). Without ``max_bytes`` the file
    is read through ``open_read``: only the chunks of ``columns`` are fetched."""
    if max_bytes is not None:
        return parquet_table(read_bytes(path, max_bytes), columns)
    with open_read(path) as f:
        cols = list(columns) if columns is not None else None
        return parquet_file(f).read(columns=cols, use_threads=False)


def write_bytes(path: str, data: bytes) -> None:
    """Create/replace ``path`` (parents created); local files appear whole or not at all."""
    if is_local(path):
        write_local(local_path(path), data)
    else:
        _backend(path).write(path, data)


def open_read(path: str) -> BinaryIO:
    """``path`` opened for reading: a binary, seekable stream the caller closes (a local path must be a
    regular file). For what reads parts of a file, e.g. Parquet row groups."""
    if is_local(path):
        return open_local(local_path(path))
    return _backend(path).open_read(path)


def open_write(path: str) -> AbstractContextManager[BinaryIO]:
    """A binary stream (``with``) that becomes ``path`` when the block ends (parents created); a local
    file appears whole or not at all. For what is too large to build in memory first."""
    if is_local(path):
        return open_write_local(local_path(path))
    return _backend(path).open_write(path)


def write_json(path: str, obj: object) -> None:
    """Pretty, key-sorted JSON: equal objects give equal bytes."""
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def size(path: str) -> int:
    """Bytes of the file at ``path``, literally (FileNotFoundError when absent; NotRegularFileError for a
    local FIFO, device or directory; IsADirectoryError for a remote directory)."""
    if is_local(path):
        return size_local(path)
    return _backend(path).stat(path).size


def exists(path: str) -> bool:
    """True when a file (not a directory) is at ``path``."""
    if is_local(path):
        return os.path.isfile(local_path(path))
    try:
        _backend(path).stat(path)
    except (FileNotFoundError, IsADirectoryError):
        return False
    return True


def is_dir(path: str) -> bool:
    """True for a local directory, or a URI prefix that holds at least one file (object stores
    have no directories)."""
    if is_local(path):
        return os.path.isdir(local_path(path))
    return bool(list_files(path))


def list_files(root: str) -> dict[str, FileInfo]:
    """{path relative to ``root`` with '/': FileInfo} of every file below ``root`` ({} when absent)."""
    if is_local(root):
        return list_local(local_path(root))
    return _backend(root).list_files(root.rstrip("/"))


def glob(pattern: str) -> list[str]:
    """Sorted paths of the files matching ``pattern`` (``*``, ``?``, ``[..]``; ``**`` spans folders)."""
    if is_local(pattern):
        prefix = "file://" if pattern.startswith("file://") else ""
        hits = _glob.glob(local_path(pattern), recursive=True)
        return sorted(prefix + p for p in hits if os.path.isfile(p))
    return _backend(pattern).glob(pattern)


def delete(paths: Sequence[str]) -> None:
    """Delete files (FileNotFoundError for one that is absent)."""
    local = [p for p in paths if is_local(p)]
    for p in local:
        os.unlink(local_path(p))
    remote = [p for p in paths if not is_local(p)]
    if remote:
        _backend(remote[0]).delete(remote)


def copy(sources: Sequence[str], destinations: Sequence[str]) -> None:
    """Copy files pairwise (same filesystem on both sides)."""
    for src, dst in zip(sources, destinations, strict=True):
        if is_local(src):
            os.makedirs(os.path.dirname(os.path.abspath(local_path(dst))), exist_ok=True)
            shutil.copyfile(local_path(src), local_path(dst))
    remote = [(s, d) for s, d in zip(sources, destinations, strict=True) if not is_local(s)]
    if remote:
        _backend(remote[0][0]).copy([s for s, _ in remote], [d for _, d in remote])


def remove_tree(path: str) -> None:
    """Delete a directory tree (or a file, or a symlink to either); absent is fine."""
    if is_local(path):
        p = local_path(path)
        if os.path.islink(p) or os.path.isfile(p):
            os.unlink(p)
        else:
            shutil.rmtree(p, ignore_errors=True)
        return
    files = list_files(path)
    if files:
        delete([join(path, f) for f in sorted(files)])

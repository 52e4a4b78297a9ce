"""One storage layer: every file lidarshard reads or writes goes through these functions. No Beam.

Paths are local paths, ``file://`` URIs, or URIs of an object store / remote filesystem. Local
paths are served here with ``os`` (regular files only, bounded reads, atomic writes). Other URIs go
to the first registered backend that handles them, else to ``pyarrow.fs`` (gs://, s3://, hdfs://,
abfs://), whose filesystem objects are cached per process (one per scheme and bucket/host).

Why pyarrow.fs and not fsspec: pyarrow is already a core dependency and ships GCS/S3/HDFS clients,
so the trainer install stays numpy + pyarrow; fsspec would add a package and per-scheme plugins.
The pipeline registers an adapter over Beam's ``FileSystems`` (``lidarshard.transforms.beam.storage``)
on import of the Beam layer, so schemes only Beam knows keep working and Beam's own
credentials/options (``--s3_endpoint_url`` ...) apply where a pipeline runs.
"""

from __future__ import annotations

import ctypes
import errno
import fnmatch
import functools
import glob as _glob
import json
import os
import posixpath
import shutil
import stat
import sys
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

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


class FileInfo(NamedTuple):
    """One file: ``size`` in bytes, ``mtime`` in seconds since the epoch (0.0 when unknown)."""

    size: int
    mtime: float


class NotRegularFileError(OSError):
    """A local path that is not a regular file (FIFO, device, socket): never read."""


class FileTooLargeError(OSError):
    """A file larger than the read's cap; ``size`` and ``limit`` in bytes (``size`` may be a lower bound)."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(errno.EFBIG, f"{size} bytes > the limit of {limit} bytes", path)
        self.size, self.limit = size, limit


class Backend(Protocol):
    """What a URI backend provides; paths are full URIs, ``list`` keys are relative to ``root``."""

    def handles(self, uri: str) -> bool: ...
    def stat(self, uri: str) -> FileInfo: ...  # FileNotFoundError / IsADirectoryError
    def read(self, uri: str, nbytes: int | None) -> bytes: ...  # at most nbytes (None: all)
    def write(self, uri: str, data: bytes) -> None: ...
    def list(self, root: str) -> dict[str, FileInfo]: ...
    def glob(self, pattern: str) -> list[str]: ...  # '*' within a segment, '**' across them
    def delete(self, uris: Sequence[str]) -> None: ...
    def copy(self, sources: Sequence[str], destinations: Sequence[str]) -> None: ...


_BACKENDS: list[Backend] = []


def register_backend(backend: Backend) -> None:
    """Serve the URIs ``backend.handles`` before pyarrow.fs (idempotent per backend type)."""
    if not any(type(b) is type(backend) for b in _BACKENDS):
        _BACKENDS.append(backend)


# ------------------------------------------------------------------------------------------ paths


def has_scheme(path: str) -> bool:
    """True for any URI (``scheme://...``), ``file://`` included."""
    return "://" in path


def is_local(path: str) -> bool:
    """True for plain paths and ``file://`` URIs."""
    return not has_scheme(path) or path.startswith("file://")


def local_path(path: str) -> str:
    """A local path or ``file://`` URI as a plain path."""
    return path.removeprefix("file://")


def absolute(path: str | None) -> str | None:
    """A local path made absolute (workers may run elsewhere); URIs and None pass unchanged."""
    return path if path is None or has_scheme(path) else os.path.abspath(path)


def join(root: str, *parts: str) -> str:
    """Join path parts: ``/`` for URIs, ``os.path.join`` for local paths."""
    return posixpath.join(root.rstrip("/"), *parts) if has_scheme(root) else os.path.join(root, *parts)


# ------------------------------------------------------------------------------------------ local


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def _read_local(path: str, limit: int | None) -> bytes:
    # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused right after by fstat.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb", closefd=True) as f:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(
                errno.EINVAL, f"{_kind(st.st_mode)}, not a regular file: refusing to read it", path
            )
        if limit is None:
            return f.read()
        if st.st_size > limit:
            raise FileTooLargeError(path, st.st_size, limit)
        data = f.read(st.st_size + 1)  # one byte more tells a file that grew since fstat
    if len(data) > limit:
        raise FileTooLargeError(path, len(data), limit)
    return data


def _write_local(path: str, data: bytes) -> None:
    """Write through a temporary sibling and rename: readers see the old file or the new one."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def _list_local(root: str) -> dict[str, FileInfo]:
    out: dict[str, FileInfo] = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            try:
                st = os.stat(p)
                info = FileInfo(st.st_size, st.st_mtime)
            except OSError:  # a dangling link: listed, with a size no recorded file has
                info = FileInfo(-1, 0.0)
            out[os.path.relpath(p, root).replace(os.sep, "/")] = info
    return out


# ------------------------------------------------------------------------------------- pyarrow.fs


@functools.lru_cache(maxsize=64)
def _arrow_fs(scheme: str, authority: str, probe: str) -> tuple[pafs.FileSystem, int]:
    """(filesystem, chars to drop from ``authority/path`` to get its path) for one scheme+bucket/host."""
    fs, path = pafs.FileSystem.from_uri(probe)
    return fs, len(probe.split("://", 1)[1]) - len(path)


def arrow_filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path inside it) for a local path or URI; cached per process.

    Local paths become absolute. Raises ValueError for a scheme pyarrow does not know.
    """
    if is_local(path):
        return _local_fs(), os.path.abspath(local_path(path))
    scheme, rest = path.split("://", 1)
    authority = rest.split("/", 1)[0]
    try:
        fs, drop = _arrow_fs(scheme, authority, f"{scheme}://{authority}/")
    except (pa.ArrowException, ValueError) as e:
        raise ValueError(f"no filesystem for {path!r}: {e}") from None
    return fs, rest[drop:].rstrip("/") or "/"


@functools.lru_cache(maxsize=1)
def _local_fs() -> pafs.LocalFileSystem:
    return pafs.LocalFileSystem()


class _ArrowBackend:
    """Any URI ``pyarrow.fs.FileSystem.from_uri`` understands."""

    def handles(self, uri: str) -> bool:
        return True

    def stat(self, uri: str) -> FileInfo:
        fs, p = arrow_filesystem(uri)
        info = fs.get_file_info(p)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(errno.ENOENT, "no such file", uri)
        if info.type == pafs.FileType.Directory:
            raise IsADirectoryError(errno.EISDIR, "is a directory", uri)
        mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
        return FileInfo(int(info.size or 0), mtime)

    def read(self, uri: str, nbytes: int | None) -> bytes:
        fs, p = arrow_filesystem(uri)
        with fs.open_input_stream(p) as f:
            return f.read() if nbytes is None else f.read(nbytes)

    def write(self, uri: str, data: bytes) -> None:
        fs, p = arrow_filesystem(uri)
        fs.create_dir(posixpath.dirname(p), recursive=True)
        with fs.open_output_stream(p) as f:
            f.write(data)

    def list(self, root: str) -> dict[str, FileInfo]:
        fs, base = arrow_filesystem(root)
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        return {
            i.path[len(base) :].lstrip("/"): FileInfo(
                int(i.size or 0), i.mtime.timestamp() if i.mtime else 0.0
            )
            for i in infos
            if i.type == pafs.FileType.File
        }

    def glob(self, pattern: str) -> list[str]:
        cut = min(i for i in (pattern.find(c) for c in "*?[") if i >= 0)
        root = pattern[:cut].rsplit("/", 1)[0]
        fs, base = arrow_filesystem(root)
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        found = (f"{root}/{i.path[len(base) :].lstrip('/')}" for i in infos if i.type == pafs.FileType.File)
        return sorted(p for p in found if fnmatch.fnmatchcase(p, pattern))

    def delete(self, uris: Sequence[str]) -> None:
        for uri in uris:
            fs, p = arrow_filesystem(uri)
            fs.delete_file(p)

    def copy(self, sources: Sequence[str], destinations: Sequence[str]) -> None:
        for src, dst in zip(sources, destinations, strict=True):
            fs, p = arrow_filesystem(src)
            fs.copy_file(p, arrow_filesystem(dst)[1])


_ARROW = _ArrowBackend()


def _backend(uri: str) -> Backend:
    return next((b for b in _BACKENDS if b.handles(uri)), _ARROW)


# ----------------------------------------------------------------------------------------- public


def read_bytes(path: str, max_bytes: int | None = None) -> bytes:
    """The whole file at ``path``, never more than ``max_bytes`` read (None: no cap).

    Raises:
        FileNotFoundError: nothing there. IsADirectoryError: a directory.
        NotRegularFileError: a local FIFO, device or socket (also behind a symlink).
        FileTooLargeError: larger than ``max_bytes``.
        OSError: any other failure to read.
    """
    if is_local(path):
        return _read_local(local_path(path), max_bytes)
    backend = _backend(path)
    if max_bytes is None:
        return backend.read(path, None)
    info = backend.stat(path)
    if info.size > max_bytes:
        raise FileTooLargeError(path, info.size, max_bytes)
    data = backend.read(path, max_bytes + 1)
    if len(data) > max_bytes:
        raise FileTooLargeError(path, len(data), max_bytes)
    return data


def read_json(path: str, max_bytes: int = METADATA_MAX_BYTES) -> Any:
    """Parse the JSON file at ``path`` (ValueError when it is not JSON)."""
    return json.loads(read_bytes(path, max_bytes))


def read_parquet(path: str, columns: Sequence[str] | None = None, max_bytes: int | None = None) -> pa.Table:
    """One Parquet file as a table (``columns``: a subset, in that order)."""
    data = read_bytes(path, max_bytes)
    return pq.read_table(pa.BufferReader(data), columns=list(columns) if columns is not None else None)


def write_bytes(path: str, data: bytes) -> None:
    """Create/replace ``path`` (parents created); local files appear whole or not at all."""
    if is_local(path):
        _write_local(local_path(path), data)
    else:
        _backend(path).write(path, data)


def write_json(path: str, obj: object) -> None:
    """Pretty, key-sorted JSON: equal objects give equal bytes."""
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def size(path: str) -> int:
    """Bytes of the file at ``path`` (FileNotFoundError when absent, IsADirectoryError for a dir)."""
    if is_local(path):
        p = local_path(path)
        if os.path.isdir(p):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        return os.stat(p).st_size
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
        return _list_local(local_path(root))
    return _backend(root).list(root.rstrip("/"))


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


# ------------------------------------------------------------------------------ atomic publish

_RENAME_EXCHANGE = 2
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EPERM}


def exchange(a: str, b: str) -> bool:
    """Atomically swap two local paths with ``renameat2(RENAME_EXCHANGE)``; False where unsupported.

    Raises:
        OSError: the call is supported but failed (e.g. a path is missing).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # glibc < 2.28, musl
        return False
    at_fdcwd = -100
    a, b = local_path(a), local_path(b)
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _NO_EXCHANGE:
        return False
    raise OSError(err, f"renameat2(RENAME_EXCHANGE) {a} <-> {b}: {os.strerror(err)}")

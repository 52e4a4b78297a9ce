"""One storage layer: every file lidarshard reads, writes or lists goes through these functions, on
``pyarrow.fs``. No Beam (Beam's ``FileSystems`` opens only what Beam itself writes: its temp and staging).

Paths are local paths, ``file://`` URIs, or URIs of an object store / remote filesystem that
``pyarrow.fs.FileSystem.from_uri`` knows (gs://, s3://, hdfs://, abfs://, mock://), or of a scheme a
process registered (``register_filesystem``: an fsspec filesystem through ``pyarrow.fs.FSSpecHandler``,
the tests' in-memory store). Filesystem objects are made once per process, scheme and bucket/host;
endpoints and credentials come from the environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, Google
application default credentials, ...), in the launcher, on every worker and in a trainer alike.

Local writes go through ``pyarrow.fs.LocalFileSystem`` too (a temporary sibling renamed into place: a
file appears whole or not at all). Local reads, sizes, listings and removals keep the rules pyarrow's
local filesystem cannot (regular files only on the opened descriptor, capped reads, no link followed
in a listing or a removal, atomic directory swaps): ``lidarshard.transforms.io.safeio``, the one home.

Why pyarrow.fs and not fsspec: pyarrow is already a core dependency and ships GCS/S3/HDFS clients,
so the trainer install stays numpy + pyarrow; fsspec would add a package and per-scheme plugins.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import glob as _glob
import json
import os
import posixpath
import re
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO, NamedTuple, overload

import pyarrow as pa
import pyarrow.fs as pafs

from lidarshard.schemas.jsonsafe import loads
from lidarshard.transforms.io import safeio
from lidarshard.transforms.io.arrow import parquet_file, parquet_table
from lidarshard.transforms.io.safeio import NotRegularFile, exchange, is_local, local_path

__all__ = [
    "FileInfo", "FileTooLargeError", "NotRegularFileError", "METADATA_MAX_BYTES",
    "absolute", "has_scheme", "is_local", "join", "local_path",
    "arrow_filesystem", "register_filesystem",
    "read_bytes", "read_json", "read_parquet", "open_read", "size", "exists", "is_dir", "list_files", "glob",
    "write_bytes", "write_json", "open_write", "copy", "delete", "remove_tree", "exchange",
]  # fmt: skip

#: Cap on metadata reads (``_manifest.json``, ``_scan.json``, cost-model files), bytes.
METADATA_MAX_BYTES = 64 << 20

#: A local path that is not a regular file (FIFO, device, socket, directory): never read.
NotRegularFileError = NotRegularFile


class FileInfo(NamedTuple):
    """One file: ``size`` in bytes, ``mtime`` in seconds since the epoch (0.0 when unknown)."""

    size: int
    mtime: float


class FileTooLargeError(OSError):
    """A file larger than the read's cap; ``size`` and ``limit`` in bytes (``size`` may be a lower bound)."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(errno.EFBIG, f"{size} bytes > the limit of {limit} bytes", path)
        self.size, self.limit = size, limit


# ------------------------------------------------------------------------------------------- paths


def has_scheme(path: str) -> bool:
    """True for any URI (``scheme://...``), ``file://`` included."""
    return "://" in path


@overload
def absolute(path: str) -> str: ...
@overload
def absolute(path: None) -> None: ...
def absolute(path: str | None) -> str | None:
    """A local path made absolute (workers may run elsewhere); URIs and None pass unchanged."""
    return path if path is None or has_scheme(path) else os.path.abspath(path)


def join(root: str, *parts: str) -> str:
    """Join path parts: ``/`` for URIs, ``os.path.join`` for local paths."""
    return posixpath.join(root.rstrip("/"), *parts) if has_scheme(root) else os.path.join(root, *parts)


# ------------------------------------------------------------------------------------- filesystems

#: Schemes served by a filesystem this process registered, before ``FileSystem.from_uri``.
_REGISTERED: dict[str, pafs.FileSystem] = {}
#: Last segment of the URI probed for a filesystem's path prefix (no file of that name is touched).
_PROBE = "_"
#: ``type_name`` s of pyarrow filesystems without directories: a file needs no parents there, and
#: ``create_dir`` would write an empty ``dir/`` marker object at every level, which other clients list.
_FLAT = frozenset({"s3", "gcs"})


def register_filesystem(scheme: str, fs: pafs.FileSystem) -> None:
    """Serve ``scheme://REST`` with ``fs`` in this process, REST being the path inside it."""
    _REGISTERED[scheme] = fs


@functools.lru_cache(maxsize=64)
def _arrow_fs(scheme: str, authority: str, pid: int) -> tuple[pafs.FileSystem, str]:
    """(filesystem, its path of ``scheme://authority/``) for one scheme+bucket/host, made in process
    ``pid``: a forked DataLoader worker makes its own (an S3/GCS client's connections and threads do
    not survive ``fork``).

    The prefix is what the filesystem puts before a URI's path: ``"bucket/"`` for s3 and gs (the
    bucket is the first segment), ``"c/"`` for abfs (the container), ``""`` for mock. It is read off a
    probe URI because ``from_uri`` keeps or drops the authority and the trailing slash by scheme.
    """
    fs, path = pafs.FileSystem.from_uri(f"{scheme}://{authority}/{_PROBE}")
    if not path.endswith(_PROBE):
        raise ValueError(f"pyarrow maps {scheme}://{authority}/{_PROBE} to {path!r}")
    return fs, path[: -len(_PROBE)]


@functools.lru_cache(maxsize=1)
def _local_fs() -> pafs.LocalFileSystem:
    return pafs.LocalFileSystem()


def arrow_filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path inside it) for a local path or URI; cached per process.

    Local paths become absolute; ``s3://bucket/a/b`` is ``bucket/a/b`` in its S3FileSystem. A URI's query
    string is not an option. Raises ValueError ("no filesystem for ...") for a scheme nothing serves.
    """
    if is_local(path):
        return _local_fs(), os.path.abspath(local_path(path))
    scheme, rest = path.split("://", 1)
    if scheme in _REGISTERED:
        return _REGISTERED[scheme], rest.rstrip("/") or "/"
    authority, _, inside = rest.partition("/")
    try:
        fs, prefix = _arrow_fs(scheme, authority, os.getpid())
    except (pa.ArrowException, ValueError) as e:
        raise ValueError(f"no filesystem for {path!r}: {e}") from None
    return fs, (prefix + inside).rstrip("/") or "/"


def _info(path: str) -> pafs.FileInfo:
    fs, p = arrow_filesystem(path)
    return fs.get_file_info(p)


def _stat(path: str) -> FileInfo:
    """A remote file's size and mtime (FileNotFoundError / IsADirectoryError)."""
    info = _info(path)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(errno.ENOENT, "no such file", path)
    if info.type == pafs.FileType.Directory:
        raise IsADirectoryError(errno.EISDIR, "is a directory", path)
    return FileInfo(int(info.size or 0), info.mtime.timestamp() if info.mtime is not None else 0.0)


# ------------------------------------------------------------------------------------------- reads


def read_bytes(path: str, max_bytes: int | None = None) -> bytes:
    """The whole file at ``path``, never more than ``max_bytes`` read (None: no cap).

    Raises:
        FileNotFoundError: nothing there. IsADirectoryError: a directory.
        NotRegularFileError: a local FIFO, device or socket (also behind a symlink).
        FileTooLargeError: larger than ``max_bytes``.
        OSError: any other failure to read.
    """
    if is_local(path):
        if max_bytes is not None and (found := safeio.size_local(local_path(path))) > max_bytes:
            raise FileTooLargeError(path, found, max_bytes)  # known before a byte is read
        data = safeio.read_local(local_path(path), max_bytes)
    else:
        fs, p = arrow_filesystem(path)
        try:  # bounded without a stat first: one round trip less a file
            with fs.open_input_stream(p, compression=None) as f:  # the bytes as stored, never inflated
                data = f.read() if max_bytes is None else f.read(max_bytes + 1)
        except FileNotFoundError:
            raise
        except OSError:
            _stat(path)  # FileNotFoundError / IsADirectoryError when that is what failed
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


def open_read(path: str) -> BinaryIO:
    """``path`` opened for reading: a binary, seekable stream the caller closes (a local path must be a
    regular file). For what reads parts of a file, e.g. Parquet row groups."""
    if is_local(path):
        return safeio.open_local(local_path(path))
    fs, p = arrow_filesystem(path)
    return fs.open_input_file(p)


def size(path: str) -> int:
    """Bytes of the file at ``path``, literally (FileNotFoundError when absent; NotRegularFileError for a
    local FIFO, device or directory; IsADirectoryError for a remote directory)."""
    return safeio.size_local(path) if is_local(path) else _stat(path).size


def exists(path: str) -> bool:
    """True when a file (not a directory) is at ``path``."""
    if is_local(path):
        return os.path.isfile(local_path(path))
    return _info(path).type == pafs.FileType.File


def is_dir(path: str) -> bool:
    """True for a local directory, or a URI prefix that holds something (object stores have no
    directories): one listing of one level."""
    if is_local(path):
        return os.path.isdir(local_path(path))
    fs, base = arrow_filesystem(path)
    return bool(fs.get_file_info(pafs.FileSelector(base, recursive=False, allow_not_found=True)))


def list_files(root: str) -> dict[str, FileInfo]:
    """{path relative to ``root`` with '/': FileInfo} of every file below ``root`` ({} when absent); a
    local listing follows no directory link and shows a dangling link with size -1."""
    if is_local(root):
        return {k: FileInfo(*v) for k, v in safeio.list_local(local_path(root)).items()}
    fs, base = arrow_filesystem(root.rstrip("/"))
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    return {
        i.path[len(base) :].lstrip("/"): FileInfo(int(i.size or 0), i.mtime.timestamp() if i.mtime else 0.0)
        for i in infos
        if i.type == pafs.FileType.File
    }


def glob(pattern: str) -> list[str]:
    """Sorted paths of the files matching ``pattern``: ``*``, ``?`` and ``[..]`` within a folder, ``**``
    across folders (``**/`` also none). Locally Python's ``glob`` (hidden names need a literal dot,
    directory links are followed), every entry but a directory or a dangling link: a FIFO or a device
    is matched too, for its reader to refuse (``NotRegularFileError``), never dropped unseen. Remotely
    the files listed below the pattern's fixed folder."""
    if is_local(pattern):
        prefix = "file://" if pattern.startswith("file://") else ""
        hits = _glob.glob(local_path(pattern), recursive=True)
        return sorted(prefix + p for p in hits if os.path.exists(p) and not os.path.isdir(p))
    cut = min((i for i in (pattern.find(c) for c in "*?[") if i >= 0), default=len(pattern))
    root = pattern[:cut].rsplit("/", 1)[0]
    regex = re.compile(_translate(pattern))
    return sorted(p for p in (f"{root}/{rel}" for rel in list_files(root)) if regex.fullmatch(p))


def _translate(pattern: str) -> str:
    """The regular expression of a ``glob`` pattern."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "[" and (end := pattern.find("]", i + 2)) > 0:
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            out.append("[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]")
            i = end + 1
            continue
        out.append("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c))
        i += 1
    return "".join(out)


# ------------------------------------------------------------------------------------------ writes


def write_bytes(path: str, data: bytes) -> None:
    """Create/replace ``path`` (parents created); local files appear whole or not at all."""
    with open_write(path) as f:
        f.write(data)


def write_json(path: str, obj: object) -> None:
    """Pretty, key-sorted JSON: equal objects give equal bytes."""
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def _commit(fs: pafs.FileSystem, tmp: str, path: str) -> None:
    fs.move(tmp, path)  # a rename: readers see the old file or the new one


@contextlib.contextmanager
def open_write(path: str) -> Iterator[BinaryIO]:
    """A binary stream (``with``) that becomes ``path`` when the block ends (parents created); a local
    file appears whole or not at all (a temporary sibling renamed), on an error nothing does. For what is
    too large to build in memory first."""
    fs, p = arrow_filesystem(path)
    if fs.type_name not in _FLAT:
        fs.create_dir(posixpath.dirname(p), recursive=True)
    if not is_local(path):  # an object appears when its stream closes
        with fs.open_output_stream(p, compression=None) as f:  # as given, never deflated by extension
            yield f
        return
    tmp = f"{p}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with fs.open_output_stream(tmp, compression=None) as f:
            yield f
        _commit(fs, tmp, p)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def delete(paths: Sequence[str]) -> None:
    """Delete files (FileNotFoundError for one that is absent)."""
    for path in paths:
        if is_local(path):
            os.unlink(local_path(path))  # a link itself, never its target
        else:
            fs, p = arrow_filesystem(path)
            fs.delete_file(p)


def copy(sources: Sequence[str], destinations: Sequence[str]) -> None:
    """Copy files pairwise (same filesystem on both sides; parents created)."""
    for src, dst in zip(sources, destinations, strict=True):
        fs, p = arrow_filesystem(src)
        target = arrow_filesystem(dst)[1]
        if fs.type_name not in _FLAT:
            fs.create_dir(posixpath.dirname(target), recursive=True)
        fs.copy_file(p, target)


def remove_tree(path: str) -> None:
    """Delete a directory tree (or a file, or a symlink to either: the link); absent is fine."""
    if is_local(path):
        safeio.remove_local(local_path(path))
        return
    files = list_files(path)
    if files:
        delete([join(path, f) for f in sorted(files)])

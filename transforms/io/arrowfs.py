"""URIs through ``pyarrow.fs`` for ``lidarshard.transforms.io.storage``, one filesystem object per
scheme and bucket/host per process."""

from __future__ import annotations

import errno
import fnmatch
import functools
import os
import posixpath
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import BinaryIO

import pyarrow as pa
import pyarrow.fs as pafs

from lidarshard.transforms.io.base import FileInfo, is_local, local_path

__all__ = ["ArrowBackend", "arrow_filesystem"]


#: Last segment of the URI probed for a filesystem's path prefix (no file of that name is touched).
_PROBE = "_"


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


def arrow_filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path inside it) for a local path or URI; cached per process.

    Local paths become absolute; ``s3://bucket/a/b`` is ``bucket/a/b`` in its S3FileSystem. Endpoints
    and credentials come from the environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), read
    when a bucket is first used; a URI's query string is not an option. Raises ValueError for a scheme
    pyarrow does not know.
    """
    if is_local(path):
        return _local_fs(), os.path.abspath(local_path(path))
    scheme, rest = path.split("://", 1)
    authority, _, inside = rest.partition("/")
    try:
        fs, prefix = _arrow_fs(scheme, authority, os.getpid())
    except (pa.ArrowException, ValueError) as e:
        raise ValueError(f"no filesystem for {path!r}: {e}") from None
    return fs, (prefix + inside).rstrip("/") or "/"


#: ``type_name`` s of pyarrow filesystems without directories: a file needs no parents there, and
#: ``create_dir`` would write an empty ``dir/`` marker object at every level, which other clients
#: (Beam's ``FileSystems.match``) list as files.
_FLAT = frozenset({"s3", "gcs"})


def _make_parents(fs: pafs.FileSystem, path: str) -> None:
    if fs.type_name not in _FLAT:
        fs.create_dir(posixpath.dirname(path), recursive=True)


@functools.lru_cache(maxsize=1)
def _local_fs() -> pafs.LocalFileSystem:
    return pafs.LocalFileSystem()


class ArrowBackend:
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
        with fs.open_input_stream(p, compression=None) as f:  # the bytes as stored, never inflated
            return f.read() if nbytes is None else f.read(nbytes)

    def write(self, uri: str, data: bytes) -> None:
        fs, p = arrow_filesystem(uri)
        _make_parents(fs, p)
        with fs.open_output_stream(p, compression=None) as f:  # as given, never deflated by extension
            f.write(data)

    def open_read(self, uri: str) -> BinaryIO:
        fs, p = arrow_filesystem(uri)
        return fs.open_input_file(p)

    def open_write(self, uri: str) -> AbstractContextManager[BinaryIO]:
        fs, p = arrow_filesystem(uri)
        _make_parents(fs, p)
        return fs.open_output_stream(p, compression=None)

    def list_files(self, root: str) -> dict[str, FileInfo]:
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

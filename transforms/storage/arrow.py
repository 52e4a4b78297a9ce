"""URIs through ``pyarrow.fs`` for ``lidarshard.transforms.storage``, one filesystem object per
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

from lidarshard.transforms.storage.base import FileInfo, is_local, local_path

__all__ = ["ArrowBackend", "arrow_filesystem"]


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
        with fs.open_input_stream(p) as f:
            return f.read() if nbytes is None else f.read(nbytes)

    def write(self, uri: str, data: bytes) -> None:
        fs, p = arrow_filesystem(uri)
        fs.create_dir(posixpath.dirname(p), recursive=True)
        with fs.open_output_stream(p) as f:
            f.write(data)

    def open_read(self, uri: str) -> BinaryIO:
        fs, p = arrow_filesystem(uri)
        return fs.open_input_file(p)

    def open_write(self, uri: str) -> AbstractContextManager[BinaryIO]:
        fs, p = arrow_filesystem(uri)
        fs.create_dir(posixpath.dirname(p), recursive=True)
        return fs.open_output_stream(p)

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

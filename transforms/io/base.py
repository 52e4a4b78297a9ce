"""Types and path rules shared by the storage backends (see ``lidarshard.transforms.io.storage``)."""

from __future__ import annotations

import errno
import os
import posixpath
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import BinaryIO, NamedTuple, Protocol, overload

from lidarshard.transforms.io.safeio import NotRegularFile, is_local, local_path

__all__ = [
    "Backend",
    "FileInfo",
    "FileTooLargeError",
    "NotRegularFileError",
    "absolute",
    "has_scheme",
    "is_local",
    "join",
    "local_path",
]


class FileInfo(NamedTuple):
    """One file: ``size`` in bytes, ``mtime`` in seconds since the epoch (0.0 when unknown)."""

    size: int
    mtime: float


#: A local path that is not a regular file (FIFO, device, socket, directory): never read.
NotRegularFileError = NotRegularFile


class FileTooLargeError(OSError):
    """A file larger than the read's cap; ``size`` and ``limit`` in bytes (``size`` may be a lower bound)."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(errno.EFBIG, f"{size} bytes > the limit of {limit} bytes", path)
        self.size, self.limit = size, limit


class Backend(Protocol):
    """What a URI backend provides; paths are full URIs, ``list_files`` keys are relative to ``root``."""

    def handles(self, uri: str) -> bool: ...
    def stat(self, uri: str) -> FileInfo: ...  # FileNotFoundError / IsADirectoryError
    def read(self, uri: str, nbytes: int | None) -> bytes: ...  # at most nbytes (None: all)
    def write(self, uri: str, data: bytes) -> None: ...
    def open_read(self, uri: str) -> BinaryIO: ...  # seekable
    def open_write(self, uri: str) -> AbstractContextManager[BinaryIO]: ...
    def list_files(self, root: str) -> dict[str, FileInfo]: ...
    def glob(self, pattern: str) -> list[str]: ...  # '*' within a segment, '**' across them
    def delete(self, uris: Sequence[str]) -> None: ...
    def copy(self, sources: Sequence[str], destinations: Sequence[str]) -> None: ...


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

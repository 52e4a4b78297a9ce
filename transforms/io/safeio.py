"""Reading local files that may be hostile: regular files only, reads capped, names taken literally. Pure.

A name is a name: nothing here expands ``*?[`` (only a user's INPUT pattern is a pattern). A path
that resolves (after symlinks) to a FIFO, socket, device or directory raises ``NotRegularFile``
before a byte is read, so ``/dev/zero`` cannot grow memory and a FIFO cannot hang the reader (it is
opened non-blocking and refused). Reads stop at ``limit + 1`` bytes, whatever the size reported.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

__all__ = ["NotRegularFile", "is_local", "local_path", "read_local", "size_local"]


class NotRegularFile(OSError):
    """The path exists but is not a regular file (after following symlinks)."""


def is_local(path: str) -> bool:
    """True for plain paths and ``file://`` URIs."""
    return "://" not in path or path.startswith("file://")


def local_path(path: str) -> str:
    """``path`` without a ``file://`` prefix."""
    return path.removeprefix("file://")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def _require_regular(path: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise NotRegularFile(f"{path} is {_kind(mode)}, not a regular file (after following symlinks)")


def size_local(path: str) -> int:
    """Bytes of the regular file at ``path`` (symlinks followed, no pattern matching).

    Raises:
        FileNotFoundError: nothing there (or a dangling link). NotRegularFile: FIFO, device, directory.
        OSError: any other stat failure (ELOOP, EACCES).
    """
    st = os.stat(local_path(path))
    _require_regular(path, st.st_mode)
    return st.st_size


def read_local(path: str, limit: int | None = None) -> bytes:
    """The bytes of the regular file at ``path``; at most ``limit + 1`` of them when ``limit`` is set
    (more than ``limit`` bytes returned means the file is larger than ``limit``).

    Raises:
        FileNotFoundError, NotRegularFile, OSError: as ``size_local``; the type is checked on the opened
            descriptor, so a file swapped for a FIFO or device after a stat is still refused.
    """
    fd = os.open(local_path(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        _require_regular(path, st.st_mode)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            if limit is None:
                return f.read()
            return f.read(min(st.st_size + 1, limit + 1))  # +1: a file that grew shows it
    finally:
        os.close(fd)


def open_local(path: str) -> BinaryIO:
    """The regular file at ``path`` opened for reading (binary, seekable); type checked on the descriptor
    as in ``read_local``."""
    fd = os.open(local_path(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        _require_regular(path, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise

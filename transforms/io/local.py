"""Local files for ``lidarshard.transforms.io.storage``: regular files only, bounded reads, atomic
writes and directory swaps. Plain ``os``."""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

from lidarshard.transforms.io import safeio
from lidarshard.transforms.io.base import FileInfo, FileTooLargeError, local_path

__all__ = ["read_local", "size_local", "write_local", "open_write_local", "list_local", "exchange"]


def read_local(path: str, limit: int | None) -> bytes:
    """``safeio.read_local`` (regular files only, never more than ``limit + 1`` bytes read), with a
    file larger than ``limit`` raised as ``FileTooLargeError`` -- before reading when its size says so."""
    if limit is not None:
        size = safeio.size_local(path)
        if size > limit:
            raise FileTooLargeError(path, size, limit)
    data = safeio.read_local(path, limit)
    if limit is not None and len(data) > limit:
        raise FileTooLargeError(path, len(data), limit)
    return data


def size_local(path: str) -> int:
    """Bytes of the regular file at ``path`` (``NotRegularFileError`` for a FIFO, device or directory)."""
    return safeio.size_local(path)


def write_local(path: str, data: bytes) -> None:
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


@contextmanager
def open_write_local(path: str) -> Iterator[BinaryIO]:
    """A binary stream that becomes ``path`` when the block ends without error (temporary sibling and
    rename, as ``write_local``); on an error nothing appears."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def list_local(root: str) -> dict[str, FileInfo]:
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

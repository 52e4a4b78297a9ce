"""Local files for ``lidarshard.transforms.storage``: regular files only, bounded reads, atomic
writes and directory swaps. Plain ``os``."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys
import uuid

from lidarshard.transforms.storage.base import FileInfo, FileTooLargeError, NotRegularFileError, local_path

__all__ = ["read_local", "write_local", "list_local", "exchange"]


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def read_local(path: str, limit: int | None) -> bytes:
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

"""The local rules ``pyarrow.fs`` cannot keep, in one place: what ``storage`` does with local paths itself.

``pyarrow.fs.LocalFileSystem`` opens a FIFO blocking (a reader hangs), reads ``/dev/zero`` as a file,
checks no type on the opened descriptor, lists a directory by following links (a link loop is walked
40 levels deep) and drops dangling links from a listing. So local reads, stats, listings and removals
are here, on ``os``:

- a name is a name: nothing here expands ``*?[`` (only a user's INPUT pattern is a pattern);
- a path that resolves (after symlinks) to a FIFO, socket, device or directory raises ``NotRegularFile``
  before a byte is read (checked on the opened descriptor, opened non-blocking), so ``/dev/zero`` cannot
  grow memory and a FIFO cannot hang the reader; reads stop at ``limit + 1`` bytes, whatever the size;
- a listing follows no directory link and shows every entry, a dangling link too (with size -1); a
  removal removes a link, never what it points at; ``exchange`` swaps two directories atomically;
- a file lidarshard keeps in a shared place (``open_own``, ``own_directory``) is never a link and is
  this user's.

Local writes (a temporary sibling renamed into place) go through ``pyarrow.fs`` in ``storage``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
import sys
from typing import BinaryIO

__all__ = [
    "NotRegularFile",
    "NotOwnedError",
    "is_local",
    "local_path",
    "open_own",
    "own_directory",
    "read_local",
    "size_local",
    "list_local",
    "remove_local",
    "exchange",
]


class NotRegularFile(OSError):
    """The path exists but is not a regular file (after following symlinks)."""


class NotOwnedError(PermissionError):
    """A file or directory in a shared place that this user does not own, or that others may write."""


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


def open_own(path: str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """A descriptor of the regular file at ``path`` that this user owns, for a file lidarshard keeps in
    a shared or user-writable place (cache entries, locks, timings): the last component is never
    followed as a link, the open never blocks (a FIFO cannot hang it), and the type and owner are
    checked on the opened descriptor. ``flags`` may add ``os.O_CREAT``, ``os.O_RDWR`` ...

    Raises:
        FileNotFoundError: nothing there (without ``O_CREAT``). NotRegularFile: a link, FIFO, socket,
            device or directory. NotOwnedError: another user's file. OSError: any other failure.
    """
    extra = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | extra, mode)
    except OSError as e:
        if os.path.islink(path):  # ELOOP (O_NOFOLLOW on a link) says it in other words
            raise NotRegularFile(f"{path} is a symbolic link, not a regular file") from None
        raise e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path} is {_kind(st.st_mode)}, not a regular file")
        if st.st_uid != os.geteuid():
            raise NotOwnedError(f"{path} belongs to uid {st.st_uid}, not to this user ({os.geteuid()})")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def own_directory(path: str) -> str:
    """Create (mode 0700) or check the directory ``path`` that lidarshard keeps files in, as ssh checks
    its own: not a link, owned by this user, not writable by group or others, inside a directory that
    others cannot rename it out of (owned by this user or root, or sticky like ``/tmp``). Returns it.

    Raises:
        NotRegularFile: ``path`` is a link or not a directory. NotOwnedError: another owner, or a place
            others may write; the message says what to change.
    """
    parent = os.path.dirname(os.path.abspath(path))
    pst = os.stat(parent)
    sticky = bool(pst.st_mode & stat.S_ISVTX)
    if not sticky and (pst.st_mode & 0o022 or pst.st_uid not in (0, os.geteuid())):
        raise NotOwnedError(
            f"{parent} may be written by others (mode {stat.S_IMODE(pst.st_mode):o}, uid {pst.st_uid}): "
            "keep lidarshard's files in a directory of your own"
        )
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else _kind(st.st_mode)
        raise NotRegularFile(f"{path} is {what}, not a directory of lidarshard's: remove it")
    if st.st_uid != os.geteuid():
        raise NotOwnedError(
            f"{path} belongs to uid {st.st_uid}, not to this user ({os.geteuid()}): remove it"
        )
    if st.st_mode & 0o022:
        raise NotOwnedError(
            f"{path} may be written by others (mode {stat.S_IMODE(st.st_mode):o}): chmod go-w {path}"
        )
    return path


def list_local(root: str) -> dict[str, tuple[int, float]]:
    """{path relative to ``root`` with '/': (size, mtime)} of every entry below ``root`` that is not a
    directory ({} when absent); directory links are not followed, a dangling link is listed with size -1."""
    out: dict[str, tuple[int, float]] = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            try:
                st = os.stat(p)
                info = (st.st_size, st.st_mtime)
            except OSError:  # a dangling link: listed, with a size no recorded file has
                info = (-1, 0.0)
            out[os.path.relpath(p, root).replace(os.sep, "/")] = info
    return out


def remove_local(path: str) -> None:
    """Delete a directory tree, a file or a link (the link, never its target); absent is fine."""
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


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

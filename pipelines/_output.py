"""Output directories on any Beam filesystem: staging, atomic commit, crash recovery, small files.

Every run writes into a sibling staging directory ``OUT.staging-<tag>`` (``<tag>`` = host hash, launcher
pid, random suffix), with ``_SUCCESS`` written last; ``commit`` refuses a staging directory without it
and then publishes it as ``OUT``, replacing a previous ``OUT`` wholesale (never merging: an old
``epoch=E/rank=R`` file cannot survive into a new run with another world size or schema version).

Guarantees, by filesystem:

* **Local disk, Linux** (ext4, xfs, btrfs, tmpfs, ...): one ``renameat2(RENAME_EXCHANGE)`` swaps the
  staging directory and ``OUT`` atomically; the previous tree, now at the staging path, is deleted
  afterwards. At every instant ``OUT`` is either the complete previous directory or the complete new
  one: a run killed at any moment (SIGKILL included) leaves the previous manifests intact, and a reader
  never sees a gap or a half-written directory. (Process crashes, not machine crashes: nothing is
  fsynced, so after a power loss the filesystem's own rename ordering decides.)
* **Local disk without exchange** (macOS, NFS, ...): ``OUT -> OUT.old-<tag>`` then
  ``staging -> OUT``. Between the two renames (microseconds) ``OUT`` does not exist, so a reader gets
  "not found", never a partial directory; a crash there is repaired by ``recover`` (``OUT.old`` is put
  back). Same for the first publish of a new ``OUT`` (one rename).
* **Object stores** (gs://, s3://, any Beam filesystem; no directory rename): ``OUT/_SUCCESS`` is
  deleted first, then files the new run does not write, then staged files are copied (data, then the
  JSON metadata, then ``_SUCCESS`` last) and the staging directory is deleted. While this runs ``OUT``
  has no ``_SUCCESS`` and readers refuse it; a crash leaves it refused, the staged copy complete, and
  ``recover`` finishes the publish (roll forward). The previous manifest is not kept once the commit
  started on these filesystems.

``recover(OUT)`` runs at the start of every run (``new_staging``) and of every ``commit``. It only touches
leftovers whose owner is provably dead: same host and the launcher pid no longer running. Leftovers of
live runs or other hosts are left alone. Concurrent runs into one ``OUT`` are not supported (on local
disks the last commit wins, atomically). A reader that opens ``OUT``'s files one by one across a commit
may mix two versions; ``lidarshard validate`` checks every file against the sha256 recorded at commit.

Test hook: ``LIDARSHARD_TEST_CRASH_AT=<point>`` makes the process ``os._exit(CRASH_EXIT)`` at that point
of a commit (``commit_start``, ``after_exchange``, ``after_move_aside``, ``remote_unpublished``,
``remote_before_success``), the way git's ``GIT_TEST_*`` variables expose failure points to tests.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import posixpath
import re
import shutil
import socket
import sys
import uuid

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from lidarshard.schemas import MANIFEST_FILE, SCAN_FILE, SUCCESS_FILE

__all__ = [
    "join",
    "is_local",
    "absolute",
    "write_bytes",
    "write_json",
    "read_json",
    "new_staging",
    "commit",
    "discard",
    "recover",
    "leftovers",
    "check_replaceable",
    "CRASH_ENV",
    "CRASH_EXIT",
]

CRASH_ENV = "LIDARSHARD_TEST_CRASH_AT"
CRASH_EXIT = 86
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]
_TAG = re.compile(r"(?P<host>[0-9a-f]{6})-(?P<pid>[0-9]{1,10})-[0-9a-f]{8}")
_KINDS = (".staging-", ".old-")
_RENAME_EXCHANGE = 2
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EPERM}


def join(root: str, *parts: str) -> str:
    """Join path parts with '/', for local paths and URIs alike."""
    return posixpath.join(root.rstrip("/"), *parts) if "://" in root else os.path.join(root, *parts)


def absolute(path: str | None) -> str | None:
    """A local path made absolute by the launcher (workers may run in another directory or host);
    URIs (gs://, s3://, ...) and None pass unchanged."""
    return path if path is None or "://" in path else os.path.abspath(path)


def is_local(path: str) -> bool:
    """True for plain paths and ``file://`` URIs."""
    return "://" not in path or path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def write_bytes(path: str, data: bytes) -> None:
    """Create/overwrite ``path`` with ``data`` (parent directories are created as needed)."""
    if is_local(path):
        os.makedirs(os.path.dirname(os.path.abspath(_local(path))), exist_ok=True)
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(data)


def write_json(path: str, obj: object) -> None:
    """Pretty, key-sorted JSON (stable bytes for equal objects)."""
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def read_json(path: str) -> dict:
    """Parse the JSON file at ``path`` (any Beam filesystem)."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return json.loads(f.read())


def _crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os._exit(CRASH_EXIT)


def _new_tag() -> str:
    return f"{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _owner_dead(tag: str) -> bool:
    """True only when ``tag`` names a launcher on this host that is no longer running."""
    m = _TAG.fullmatch(tag)
    if m is None or m["host"] != _HOST or os.name != "posix":  # os.kill(pid, 0) kills on Windows
        return False
    pid = int(m["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: alive, someone else's
        return False
    return False


# ------------------------------------------------------------------------------------ listing, deleting


def _list_remote(root: str) -> dict[str, float]:
    """{path relative to ``root``: last-updated seconds} of every file under ``root``."""
    root = root.rstrip("/")
    found = FileSystems.match([root + "/**"])[0].metadata_list
    return {m.path[len(root) + 1 :]: float(m.last_updated_in_seconds or 0.0) for m in found}


def _remove(path: str) -> None:
    """Delete a directory tree (or a symlink to one), local or remote; absent is fine."""
    if is_local(path):
        p = _local(path)
        if os.path.islink(p) or os.path.isfile(p):
            os.unlink(p)
        else:
            shutil.rmtree(p, ignore_errors=True)
        return
    files = list(_list_remote(path))
    if files:
        FileSystems.delete([join(path, f) for f in files])


def leftovers(out: str) -> dict[str, tuple[str, str]]:
    """{path: (kind, tag)} of the ``OUT.staging-<tag>`` and ``OUT.old-<tag>`` siblings of ``out``;
    kind is ``"staging"`` or ``"old"``."""
    out = out.rstrip("/")
    found: dict[str, tuple[str, str]] = {}
    if is_local(out):
        parent, name = os.path.split(os.path.abspath(_local(out)))
        for entry in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
            for kind in _KINDS:
                tag = entry[len(name + kind) :]
                if entry.startswith(name + kind) and _TAG.fullmatch(tag):
                    found[os.path.join(parent, entry)] = (kind.strip(".-"), tag)
        return found
    for kind in _KINDS:
        for m in FileSystems.match([f"{out}{kind}*/**"])[0].metadata_list:
            top = m.path[: m.path.index("/", len(out) + len(kind))]
            if _TAG.fullmatch(top[len(out) + len(kind) :]):
                found[top] = (kind.strip(".-"), top[len(out) + len(kind) :])
    return found


def _has_success(path: str) -> bool:
    if is_local(path):
        return os.path.isfile(os.path.join(_local(path), SUCCESS_FILE))
    return bool(FileSystems.match([join(path, SUCCESS_FILE)])[0].metadata_list)


def check_replaceable(out: str) -> None:
    """Refuse to publish over an ``out`` that is not a committed output (it could be anyone's data).

    Raises:
        FileExistsError: ``out`` is a file, or a non-empty directory without ``_SUCCESS``.
    """
    if is_local(out):
        p = _local(out)
        if not os.path.lexists(p):
            return
        if not os.path.isdir(p):
            raise FileExistsError(f"refusing to replace {out}: it exists and is not a directory")
        empty = not os.listdir(p)
    else:
        empty = not _list_remote(out)
    if not empty and not _has_success(out):
        raise FileExistsError(
            f"refusing to replace {out}: it is not empty and has no {SUCCESS_FILE}, so it is not a "
            "committed lidarshard output (or another host's commit was interrupted); move or delete it"
        )


# ------------------------------------------------------------------------------------------ recovery


def recover(out: str, keep: str = "") -> list[str]:
    """Repair what a crashed run left next to ``out``; returns what was done, one line per action.

    Local: when ``out`` is missing (a crash between the fallback's two renames), the newest complete
    ``OUT.old-*`` of a dead run is put back. Object stores: when ``out`` lacks ``_SUCCESS`` (a crash
    mid-commit), the newest complete ``OUT.staging-*`` of a dead run is published. Then every other
    leftover of a dead run is deleted. Leftovers of live or foreign runs, and ``keep``, are never touched.
    """
    out = out.rstrip("/")
    keep = os.path.abspath(_local(keep)) if keep and is_local(keep) else keep.rstrip("/")
    dead = {p: kind for p, (kind, tag) in leftovers(out).items() if _owner_dead(tag) and p != keep}
    done: list[str] = []
    if is_local(out) and not os.path.lexists(_local(out)):
        olds = [p for p, kind in dead.items() if kind == "old" and _has_success(p)]
        if olds:
            best = max(olds, key=os.path.getmtime)
            os.rename(best, _local(out))
            done.append(f"restored {out} from {best} (a commit was interrupted)")
            del dead[best]
    elif not is_local(out) and not _has_success(out):
        staged = {p: _list_remote(p) for p, kind in dead.items() if kind == "staging"}
        complete = {p: files for p, files in staged.items() if SUCCESS_FILE in files}
        if complete:
            best = max(complete, key=lambda p: complete[p][SUCCESS_FILE])
            _commit_remote(best, out)
            done.append(f"published {best} as {out} (finishing an interrupted commit)")
            del dead[best]
    for path in sorted(dead):
        _remove(path)
        done.append(f"deleted {path} (left by a dead run)")
    return done


def new_staging(out: str) -> str:
    """Recover ``out`` from earlier crashes, check it may be replaced, and name a fresh staging dir.

    Raises:
        FileExistsError: see ``check_replaceable`` (raised before any work is done).
    """
    out = out.rstrip("/")
    recover(out)
    check_replaceable(out)
    return f"{out}.staging-{_new_tag()}"


# ------------------------------------------------------------------------------------------- publish


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths with ``renameat2(RENAME_EXCHANGE)``; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # glibc < 2.28, musl
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _NO_EXCHANGE:
        return False
    raise OSError(err, f"renameat2(RENAME_EXCHANGE) {a} <-> {b}: {os.strerror(err)}")


def _commit_local(staging: str, out: str) -> None:
    staging, out = _local(staging), _local(out)
    if not os.path.lexists(out):
        os.rename(staging, out)
        return
    if not os.path.islink(out) and _exchange(staging, out):
        _crash_point("after_exchange")
        _remove(staging)  # the previous OUT now lives here
        return
    old = f"{out}.old-{_new_tag()}"
    os.rename(out, old)
    _crash_point("after_move_aside")
    os.rename(staging, out)
    _remove(old)


def _commit_remote(staging: str, out: str) -> None:
    staging = staging.rstrip("/")
    new = set(_list_remote(staging))
    prev = set(_list_remote(out))
    if SUCCESS_FILE in prev:
        FileSystems.delete([join(out, SUCCESS_FILE)])
    _crash_point("remote_unpublished")
    stale = sorted(prev - new - {SUCCESS_FILE})
    if stale:
        FileSystems.delete([join(out, f) for f in stale])
    meta = {MANIFEST_FILE, SCAN_FILE, SUCCESS_FILE}
    for group in (sorted(new - meta), sorted(new & {MANIFEST_FILE, SCAN_FILE})):
        if group:
            FileSystems.copy([join(staging, f) for f in group], [join(out, f) for f in group])
    _crash_point("remote_before_success")
    FileSystems.copy([join(staging, SUCCESS_FILE)], [join(out, SUCCESS_FILE)])
    _remove(staging)


def commit(staging: str, out: str) -> None:
    """Publish ``staging`` (which must hold ``_SUCCESS``) as ``out``, replacing a previous ``out``.

    Raises:
        FileNotFoundError: ``staging`` has no ``_SUCCESS`` (nothing half-written is ever published).
        FileExistsError: ``out`` exists but is not a committed output (see ``check_replaceable``).
    """
    out = out.rstrip("/")
    if not _has_success(staging):
        raise FileNotFoundError(f"refusing to publish {staging}: it has no {SUCCESS_FILE}")
    recover(out, keep=staging)
    check_replaceable(out)
    _crash_point("commit_start")
    if is_local(out):
        _commit_local(staging, out)
    else:
        _commit_remote(staging, out)


def discard(staging: str) -> None:
    """Remove an unpublished staging directory."""
    _remove(staging)

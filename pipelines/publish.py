"""The one publish: every run (``scan``, ``build``, ``lidarshard.build``, ``lidarshard.write_manifest``)
writes into a staging directory; ``run_and_publish`` runs it with Ctrl-C and SIGTERM handled, writes
``_SUCCESS``, validates the staged copy and only then commits it as OUT. Nothing reaches OUT that
``lidarshard validate`` rejects.

Every run writes into a sibling staging directory ``OUT.staging-<tag>`` (``<tag>`` = host hash, launcher
pid, random suffix; the name of OUT is shortened with a hash of it when the result would exceed
``NAME_MAX``), with ``_SUCCESS`` written last; ``commit`` refuses a staging directory without it
and then publishes it as ``OUT``, replacing a previous ``OUT`` wholesale (never merging: an old
``epoch-E/rank-R`` file cannot survive into a new run with another world size or schema version).

**Publish touches only what lidarshard wrote** (``lidarshard.pipelines.owned``): a previous ``OUT``
holding anything its ``_manifest.json`` (or ``_scan.json``) does not list -- a user's ``raw/``, a stray
file -- refuses the run before Beam starts and again right before the commit, naming it; the previous
tree is deleted entry by entry, only what it lists.

All I/O goes through ``lidarshard.transforms.io.storage``. Guarantees, by filesystem:

* **Local disk, Linux** (ext4, xfs, btrfs, tmpfs, ...): one ``renameat2(RENAME_EXCHANGE)`` swaps the
  staging directory and ``OUT`` atomically; the previous tree, now at the staging path, is deleted
  afterwards (what it lists). At every instant ``OUT`` is either the complete previous directory or the complete new
  one: a run killed at any moment (SIGKILL included) leaves the previous manifests intact, and a reader
  never sees a gap or a half-written directory. (Process crashes, not machine crashes: nothing is
  fsynced, so after a power loss the filesystem's own rename ordering decides.)
* **Local disk without exchange** (macOS, NFS, ...): ``OUT -> OUT.old-<tag>`` then
  ``staging -> OUT``. Between the two renames (microseconds) ``OUT`` does not exist, so a reader gets
  "not found", never a partial directory; a crash there is repaired by ``recover`` (``OUT.old`` is put
  back). Same for the first publish of a new ``OUT`` (one rename).
* **Object stores** (gs://, s3://, any Beam filesystem; no directory rename): ``OUT/_SUCCESS`` is
  deleted first, then the files the previous manifest lists that the new run does not write, then
  staged files are copied (data, then the
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

import hashlib
import os
import re
import socket
import sys
import uuid
from collections.abc import Callable

from lidarshard.pipelines.owned import META_MAX_BYTES as META_MAX_BYTES  # re-exported; home: owned
from lidarshard.pipelines.owned import (
    Owned,
    check_replaceable,
    has_success,
    list_remote,
    owned_files,
    remove_owned,
)
from lidarshard.schemas import MANIFEST_FILE, SCAN_FILE, SUCCESS_FILE
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.storage import is_local, join, local_path

__all__ = [
    "new_staging",
    "run_and_publish",
    "commit",
    "discard",
    "recover",
    "leftovers",
    "sibling",
    "NAME_MAX",
    "CRASH_ENV",
    "CRASH_EXIT",
]

CRASH_ENV = "LIDARSHARD_TEST_CRASH_AT"
CRASH_EXIT = 86
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]
_TAG = re.compile(r"(?P<host>[0-9a-f]{6})-(?P<pid>[0-9]{1,10})-[0-9a-f]{8}")
_KINDS = (".staging-", ".old-")
#: Longest name a path component may have (Linux NAME_MAX); sibling names are fitted to it.
NAME_MAX = 255
#: Room a ``.staging-<tag>`` / ``.old-<tag>`` / ``.kept-<tag>`` suffix takes at most (the pid has <= 10 digits).
_TAG_ROOM = len(".staging-") + 6 + 1 + 10 + 1 + 8


def _crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os._exit(CRASH_EXIT)


def _say(line: str) -> None:
    """One line on stderr about what a publish did not do (left a directory behind, and why)."""
    print(f"lidarshard: {line}", file=sys.stderr, flush=True)


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


def _stem(name: str, room: int) -> str:
    """``name`` when ``room`` more bytes still fit in ``NAME_MAX``; else its head and a hash of the
    whole name (deterministic, so later runs find the same siblings)."""
    raw = name.encode()
    if len(raw) + room <= NAME_MAX:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:12]
    head = raw[: NAME_MAX - room - len(digest) - 1].decode(errors="ignore")
    return f"{head}~{digest}"


def sibling(out: str, suffix: str, room: int | None = None) -> str:
    """The path beside ``out`` named ``<name of out><suffix>``, the name shortened to fit ``NAME_MAX``
    (``room``: bytes to leave for the suffix, default its length) -- a legal 250-byte OUT name still
    gets its staging directory and rejects file."""
    out = out.rstrip("/")
    parent, _, name = out.rpartition("/")
    stem = _stem(name, len(suffix.encode()) if room is None else room)
    return f"{parent}/{stem}{suffix}" if parent or out.startswith("/") else f"{stem}{suffix}"


def _tagged(out: str, kind: str, tag: str) -> str:
    """``OUT<kind><tag>`` (kind ``.staging-``, ``.old-`` or ``.kept-``), fitted to ``NAME_MAX``."""
    return sibling(out, f"{kind}{tag}", _TAG_ROOM)


# ----------------------------------------------------------------------------------------- leftovers


def leftovers(out: str) -> dict[str, tuple[str, str]]:
    """{path: (kind, tag)} of the ``OUT.staging-<tag>`` and ``OUT.old-<tag>`` siblings of ``out``;
    kind is ``"staging"`` or ``"old"``."""
    out = out.rstrip("/")
    found: dict[str, tuple[str, str]] = {}
    if is_local(out):
        parent, name = os.path.split(os.path.abspath(local_path(out)))
        stem = _stem(name, _TAG_ROOM)
        for entry in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
            for kind in _KINDS:
                tag = entry[len(stem + kind) :]
                if entry.startswith(stem + kind) and _TAG.fullmatch(tag):
                    found[os.path.join(parent, entry)] = (kind.strip(".-"), tag)
        return found
    head = _tagged(out, "", "")  # OUT's stem
    for kind in _KINDS:
        for path in storage.glob(f"{head}{kind}*/**"):
            top = path[: path.index("/", len(head) + len(kind))]
            if _TAG.fullmatch(top[len(head) + len(kind) :]):
                found[top] = (kind.strip(".-"), top[len(head) + len(kind) :])
    return found


def _remove(out: str, tree: str, owned: Owned | None) -> str | None:
    """``remove_owned``, keeping a tree that holds what lidarshard did not write as ``OUT.kept-<tag>``."""
    return remove_owned(out, tree, owned, _tagged(out, ".kept-", _new_tag()))


def _remove_leftover(out: str, path: str) -> str | None:
    """Delete a dead run's leftover ``path``: a staging directory without ``_SUCCESS`` entirely, a
    complete tree (a previous OUT moved aside, or a finished staging copy) only as far as its own
    metadata lists (``remove_owned``); object stores: the staged copy."""
    if not is_local(path):
        storage.remove_tree(path)
        return None
    owned: Owned | None = None
    if has_success(path):
        try:
            owned = owned_files(path)
        except FileExistsError:
            owned = Owned(frozenset())  # a complete tree that does not say what it holds: keep it all
    return _remove(out, local_path(path), owned)


# ------------------------------------------------------------------------------------------ recovery


def recover(out: str, keep: str = "") -> list[str]:
    """Repair what a crashed run left next to ``out``; returns what was done, one line per action.

    Local: when ``out`` is missing (a crash between the fallback's two renames), the newest complete
    ``OUT.old-*`` of a dead run is put back. Object stores: when ``out`` lacks ``_SUCCESS`` (a crash
    mid-commit), the newest complete ``OUT.staging-*`` of a dead run is published. Then every other
    leftover of a dead run is deleted (``_remove_leftover``: only what lidarshard wrote; what cannot be
    deleted is said on stderr, one line each). Leftovers of live or foreign runs, and ``keep``, are
    never touched.
    """
    out = out.rstrip("/")
    keep = os.path.abspath(local_path(keep)) if keep and is_local(keep) else keep.rstrip("/")
    dead = {p: kind for p, (kind, tag) in leftovers(out).items() if _owner_dead(tag) and p != keep}
    done: list[str] = []
    if is_local(out) and not os.path.lexists(local_path(out)):
        olds = [p for p, kind in dead.items() if kind == "old" and has_success(p)]
        if olds:
            best = max(olds, key=os.path.getmtime)
            os.rename(best, local_path(out))
            done.append(f"restored {out} from {best} (a commit was interrupted)")
            del dead[best]
    elif not is_local(out) and not has_success(out):
        staged = {p: list_remote(p) for p, kind in dead.items() if kind == "staging"}
        complete = {p: files for p, files in staged.items() if SUCCESS_FILE in files}
        if complete:
            best = max(complete, key=lambda p: complete[p][SUCCESS_FILE])
            try:  # the previous manifest, while OUT still holds it, says what the commit may delete
                owned = owned_files(out)
            except FileExistsError:
                owned = Owned(frozenset())
            _commit_remote(best, out, owned)
            done.append(f"published {best} as {out} (finishing an interrupted commit)")
            del dead[best]
    for path in sorted(dead):
        problem = _remove_leftover(out, path)
        if problem:
            _say(problem)
        done.append(problem or f"deleted {path} (left by a dead run)")
    return done


def new_staging(out: str) -> str:
    """Recover ``out`` from earlier crashes, check it may be replaced, and name a fresh staging dir
    (``OUT.staging-<tag>``, fitted to ``NAME_MAX``).

    Raises:
        FileExistsError: see ``check_replaceable`` (raised before any work is done).
    """
    out = out.rstrip("/")
    recover(out)
    check_replaceable(out)
    return _tagged(out, ".staging-", _new_tag())


# ------------------------------------------------------------------------------------------- publish


def _commit_local(staging: str, out: str, owned: Owned | None) -> None:
    staging, out = local_path(staging), local_path(out)
    owned = owned if owned is not None else Owned(frozenset())  # an OUT that appeared since: keep it whole
    if not os.path.lexists(out):
        os.rename(staging, out)
        return
    if not os.path.islink(out) and storage.exchange(staging, out):
        _crash_point("after_exchange")
        problem = _remove(out, staging, owned)  # the previous OUT now lives here
    else:
        old = _tagged(out, ".old-", _new_tag())
        os.rename(out, old)
        _crash_point("after_move_aside")
        os.rename(staging, out)
        problem = _remove(out, old, owned)
    if problem:
        _say(problem)


def _commit_remote(staging: str, out: str, owned: Owned | None) -> None:
    staging = staging.rstrip("/")
    new = set(list_remote(staging))
    prev = set(list_remote(out))
    if SUCCESS_FILE in prev:
        storage.delete([join(out, SUCCESS_FILE)])
    _crash_point("remote_unpublished")
    stale = sorted(f for f in prev - new - {SUCCESS_FILE} if owned is not None and f in owned)
    if stale:  # only what the previous manifest lists: an object lidarshard did not write stays
        storage.delete([join(out, f) for f in stale])
    meta = {MANIFEST_FILE, SCAN_FILE, SUCCESS_FILE}
    for group in (sorted(new - meta), sorted(new & {MANIFEST_FILE, SCAN_FILE})):
        if group:
            storage.copy([join(staging, f) for f in group], [join(out, f) for f in group])
    _crash_point("remote_before_success")
    storage.copy([join(staging, SUCCESS_FILE)], [join(out, SUCCESS_FILE)])
    storage.remove_tree(staging)


def commit(staging: str, out: str) -> None:
    """Publish ``staging`` (which must hold ``_SUCCESS``) as ``out``, replacing a previous ``out``:
    of the previous one only what lidarshard wrote is deleted (``check_replaceable``, right before).

    Raises:
        FileNotFoundError: ``staging`` has no ``_SUCCESS`` (nothing half-written is ever published).
        FileExistsError: ``out`` exists but is not a committed output, or holds what lidarshard did not
            write (see ``check_replaceable``).
    """
    out = out.rstrip("/")
    if not has_success(staging):
        raise FileNotFoundError(f"refusing to publish {staging}: it has no {SUCCESS_FILE}")
    recover(out, keep=staging)
    owned = check_replaceable(out)
    _crash_point("commit_start")
    if is_local(out):
        _commit_local(staging, out, owned)
    else:
        _commit_remote(staging, out, owned)


def discard(staging: str) -> None:
    """Remove an unpublished staging directory."""
    storage.remove_tree(staging)


def _check_staged(staging: str) -> None:
    """Refuse to publish what ``lidarshard validate`` would reject: the same checks, on the staged copy.

    Raises:
        RuntimeError: one line naming the first problem and how many more there are.
    """
    from lidarshard.tools.validate import validate

    problems, _ = validate(staging)  # its scratch failing raises ScratchError: no verdict on the output
    if problems:
        more = f" (and {problems.total - 1} more)" if problems.total > 1 else ""
        raise RuntimeError(f"the output fails validation, nothing was published: {problems[0]}{more}")


def run_and_publish(run: Callable[[], None], staging: str, out: str) -> None:
    """Run ``run`` (which writes into ``staging``) with Ctrl-C and SIGTERM stopping it cleanly, then
    ``publish``; when ``run`` fails or is interrupted the staging directory goes and ``out`` is unchanged."""
    from lidarshard.pipelines._lifeline import interruptible

    try:
        with interruptible(lambda: discard(staging), f"nothing was published ({out} is unchanged)"):
            run()
            storage.write_bytes(join(staging, SUCCESS_FILE), b"")
            _check_staged(staging)
    except BaseException:
        discard(staging)
        raise
    try:
        commit(staging, out)
    except FileExistsError as e:  # OUT changed during the run (a file was added): nothing is published
        discard(staging)
        raise FileExistsError(f"{e}; nothing was published") from None

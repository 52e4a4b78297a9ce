"""The one publish: every run (``scan``, ``build``, ``lidarshard.build``, ``lidarshard.write_manifest``)
writes into a staging directory; ``run_and_publish`` runs it with Ctrl-C and SIGTERM handled, writes
``_SUCCESS``, validates the staged copy and only then commits it as OUT. Nothing reaches OUT that
``lidarshard validate`` rejects.

Every run writes into a sibling staging directory ``OUT.staging-<tag>`` (``<tag>`` = host hash, launcher
pid, random suffix; the name of OUT is shortened with a hash of it when the result would exceed
``NAME_MAX``), with ``_SUCCESS`` written last; ``commit`` refuses a staging directory without it
and then publishes it as ``OUT``, replacing a previous ``OUT`` wholesale (never merging: an old
``epoch=E/rank=R`` file cannot survive into a new run with another world size or schema version).

**Publish touches only what lidarshard wrote.** A previous ``OUT`` may be replaced only when every
entry in it is listed by its ``_manifest.json`` 'files' (a scan directory: its samples parts and
``rejects.parquet``), is that metadata or ``_SUCCESS``, or lies in ``report/`` (``check_replaceable``,
before Beam starts and again right before the commit; the metadata is read bounded, and a listed path
outside OUT makes it untrustworthy). Anything else -- a user's ``raw/``, a stray file -- refuses the
run in one line naming it. The previous tree is then deleted entry by entry, only what it lists (a
tree that gained a foreign entry meanwhile is kept whole as ``OUT.kept-<tag>``; one that cannot be
deleted, e.g. read-only for this user, is named on stderr, never left silently).

All I/O goes through ``lidarshard.transforms.storage``. Guarantees, by filesystem:

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

import functools
import hashlib
import os
import re
import socket
import stat
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from lidarshard.schemas import MANIFEST_FILE, REJECTS_FILE, SAMPLES_DIR, SCAN_FILE, SUCCESS_FILE, part_index
from lidarshard.schemas.manifest import relpath_problem
from lidarshard.transforms import storage
from lidarshard.transforms.storage import FileTooLargeError, is_local, join, local_path

__all__ = [
    "new_staging",
    "run_and_publish",
    "commit",
    "discard",
    "recover",
    "leftovers",
    "check_replaceable",
    "owned_files",
    "Owned",
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
#: What ``lidarshard report`` and ``calibrate`` write into OUT (outside the manifest contract).
REPORT_DIR = "report"
#: Cap on the old ``_manifest.json`` / ``_scan.json`` read to learn what may be deleted (bytes).
META_MAX_BYTES = storage.METADATA_MAX_BYTES
_META = (SUCCESS_FILE, MANIFEST_FILE, SCAN_FILE)


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


# ------------------------------------------------------------------------------------ listing, deleting


def _list_remote(root: str) -> dict[str, float]:
    """{path relative to ``root``: last-updated seconds} of every file under ``root``."""
    return {rel: info.mtime for rel, info in storage.list_files(root.rstrip("/")).items()}


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


def _has_success(path: str) -> bool:
    return storage.exists(join(path, SUCCESS_FILE))


# ------------------------------------------------------------------------------ what lidarshard wrote


@dataclass(frozen=True)
class Owned:
    """What lidarshard wrote into a committed output, relative to it: the files its ``_manifest.json``
    lists (a scan directory: its samples parts and ``rejects.parquet``), the metadata files, and
    ``report/``. Only these are ever deleted when the output is replaced."""

    files: frozenset[str]
    scan_parts: bool = False  # a scan directory: any samples/part-NNNNN.parquet is its own

    def __contains__(self, rel: object) -> bool:
        if not isinstance(rel, str):
            return False
        if rel in self.files or rel in _META or rel.startswith(REPORT_DIR + "/"):
            return True
        head, _, name = rel.partition("/")
        return self.scan_parts and head == SAMPLES_DIR and "/" not in name and part_index(name) is not None

    @functools.cached_property
    def dirs(self) -> frozenset[str]:
        """Every ancestor directory of a listed file (``plan``, ``plan/epoch=0``, ...)."""
        return frozenset(f.rsplit("/", k)[0] for f in self.files for k in range(1, f.count("/") + 1))

    def holds_dir(self, rel: str) -> bool:
        """True for a directory lidarshard made: an ancestor of a listed file, or ``report/`` and below."""
        if rel == REPORT_DIR or rel.startswith(REPORT_DIR + "/") or (self.scan_parts and rel == SAMPLES_DIR):
            return True
        return rel in self.dirs


def _refuse(out: str, why: str) -> FileExistsError:
    return FileExistsError(f"refusing to replace {out}: {why}")


def owned_files(out: str) -> Owned:
    """What lidarshard wrote into the committed output ``out``, read from its ``_manifest.json`` (or a
    scan's ``_scan.json``): at most ``META_MAX_BYTES`` read, every listed path a plain path inside OUT.

    Raises:
        FileExistsError: no such metadata, or it is too large, malformed, or lists a path outside OUT
            (one line: what lists the files cannot be trusted, so nothing is replaced).
    """
    for name in (MANIFEST_FILE, SCAN_FILE):
        path = join(out, name)
        if not storage.exists(path):
            continue
        try:
            meta = storage.read_json(path, META_MAX_BYTES, what=name)
        except FileTooLargeError:
            raise _refuse(out, f"its {name} is larger than {META_MAX_BYTES} bytes") from None
        except (ValueError, OSError) as e:
            raise _refuse(
                out, f"its {name} cannot be read ({str(e).splitlines()[0] if str(e) else e!r})"
            ) from None
        if not isinstance(meta, dict):
            raise _refuse(out, f"its {name} is not a JSON object")
        if name == SCAN_FILE:
            return Owned(frozenset({REJECTS_FILE}), scan_parts=True)
        files = meta.get("files", {})  # none listed: only the metadata itself may go
        if not isinstance(files, dict):
            raise _refuse(out, f"its {name} 'files' is not an object listing what lidarshard wrote")
        for rel in files:
            bad = relpath_problem(rel)
            if bad:
                raise _refuse(out, f"its {name} lists {rel[:200]!r}, which {bad}")
        return Owned(frozenset(files))
    raise _refuse(
        out, f"it has {SUCCESS_FILE} but no {MANIFEST_FILE} or {SCAN_FILE} saying what lidarshard wrote"
    )


def _first_unowned(out: str, owned: Owned) -> str | None:
    """The first entry under ``out`` (sorted, top down) that lidarshard did not write, or None. A
    directory it did not make is named itself, not its contents; links are entries, never followed."""
    if not is_local(out):
        return next((join(out, rel) for rel in sorted(_list_remote(out)) if rel not in owned), None)
    root = local_path(out)
    for rel, is_dir in _walk(root, owned.holds_dir):
        if (is_dir and not owned.holds_dir(rel)) or (not is_dir and rel not in owned):
            return os.path.join(root, rel)
    return None


def _walk(root: str, descend: Callable[[str], bool] = lambda rel: True) -> list[tuple[str, bool]]:
    """[(path relative to ``root``, is a real directory)] of every entry below ``root``, top down and
    sorted; directories for which ``descend(rel)`` is False are listed but not entered. Symlinks are
    entries (``is_dir`` False), never followed. A directory that cannot be listed is made readable
    when this user owns it (a read-only tree), else raises."""
    found: list[tuple[str, bool]] = []
    stack = [""]
    while stack:
        rel = stack.pop()
        path = os.path.join(root, rel) if rel else root
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except PermissionError:
            _grant(path)
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        below = []
        for entry in entries:
            sub = f"{rel}/{entry.name}" if rel else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            found.append((sub, is_dir))
            if is_dir and descend(sub):
                below.append(sub)
        stack.extend(reversed(below))
    return found


def check_replaceable(out: str) -> Owned | None:
    """Refuse to publish over an ``out`` holding anything lidarshard did not write (it could be anyone's
    data); returns what may be deleted when ``out`` is replaced (None: nothing is there).

    ``out`` may be absent, empty, or a committed output whose every file is listed in its metadata
    (``owned_files``) or sits in ``report/``.

    Raises:
        FileExistsError: one line: ``out`` is a file; a non-empty directory without ``_SUCCESS``; its
            metadata is missing, malformed or lists a path outside it; or it holds an entry its
            metadata does not list (named: the first, top down).
    """
    if is_local(out):
        p = local_path(out)
        if not os.path.lexists(p):
            return None
        if not os.path.isdir(p):
            raise _refuse(out, "it exists and is not a directory")
        empty = not os.listdir(p)
    else:
        empty = not _list_remote(out)
    if empty:
        return Owned(frozenset())
    if not _has_success(out):
        raise _refuse(
            out,
            f"it is not empty and has no {SUCCESS_FILE}, so it is not a committed lidarshard output (or "
            "another host's commit was interrupted); move or delete it",
        )
    owned = owned_files(out)
    first = _first_unowned(out, owned)
    if first is not None:
        raise _refuse(
            out,
            f"it holds {_shown(first)}, which lidarshard did not write (its metadata does not list it); "
            "move it out of OUT, or choose another OUT",
        )
    return owned


def _shown(path: str) -> str:
    """``path`` for a one-line message: escaped when it holds a newline or another unprintable character."""
    return path if path.isprintable() else repr(path)[1:-1]


def _grant(path: str) -> None:
    """Give this user write and search permission on ``path`` when this user owns it (a read-only tree
    lidarshard is deleting); nothing otherwise."""
    try:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            os.chmod(path, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
    except OSError:
        pass


def _unlink(path: str, is_dir: bool, root: str) -> None:
    """Remove one entry; on a permission error its parent (inside ``root``) is made writable, once."""
    remove = os.rmdir if is_dir else os.unlink
    try:
        remove(path)
    except PermissionError:
        parent = os.path.dirname(path)
        if not (parent + "/").startswith(root.rstrip("/") + "/"):
            raise
        _grant(parent)
        remove(path)


def _remove_owned(out: str, tree: str, owned: Owned | None) -> str | None:
    """Delete the local directory ``tree`` (a previous OUT moved aside, or a dead run's staging dir),
    removing only what ``owned`` says lidarshard wrote (None: all of it, a staging directory). Returns
    a one-line problem when something stays, else None.

    A tree holding anything unowned (added between the check and the swap) is kept whole, renamed to
    ``OUT.kept-<tag>`` (which no later run deletes); one that cannot be deleted (read-only for another
    user, immutable) stays where it is and the line says so (a later run tries again, and says so again).
    """
    if os.path.islink(tree) or not os.path.isdir(tree):
        if os.path.lexists(tree):
            os.unlink(tree)
        return None
    try:
        entries = _walk(tree)
        if owned is not None and (first := _first_unowned(tree, owned)) is not None:
            kept = _tagged(out, ".kept-", _new_tag())
            os.rename(tree, kept)
            return (
                f"kept the previous {out} as {kept}: it holds {_shown(first[len(tree) + 1 :])}, which lidarshard "
                "did not write; move what you need out of it and delete it"
            )
        last = {rel for rel, _ in entries if rel in _META}  # metadata last: the tree stays self-describing
        order = [e for e in reversed(entries) if e[0] not in last] + [e for e in entries if e[0] in last]
        for rel, is_dir in order:
            _unlink(os.path.join(tree, rel), is_dir, tree)
        os.rmdir(tree)
    except OSError as e:
        where = e.filename or tree
        return (
            f"could not delete {tree} (what {out} held before; {e.strerror or e}: {where}); delete it by hand"
        )
    return None


def _remove_leftover(out: str, path: str) -> str | None:
    """Delete a dead run's leftover ``path``: a staging directory without ``_SUCCESS`` entirely, a
    complete tree (a previous OUT moved aside, or a finished staging copy) only as far as its own
    metadata lists (``_remove_owned``); object stores: the staged copy."""
    if not is_local(path):
        storage.remove_tree(path)
        return None
    owned: Owned | None = None
    if _has_success(path):
        try:
            owned = owned_files(path)
        except FileExistsError:
            owned = Owned(frozenset())  # a complete tree that does not say what it holds: keep it all
    return _remove_owned(out, local_path(path), owned)


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
        olds = [p for p, kind in dead.items() if kind == "old" and _has_success(p)]
        if olds:
            best = max(olds, key=os.path.getmtime)
            os.rename(best, local_path(out))
            done.append(f"restored {out} from {best} (a commit was interrupted)")
            del dead[best]
    elif not is_local(out) and not _has_success(out):
        staged = {p: _list_remote(p) for p, kind in dead.items() if kind == "staging"}
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
        problem = _remove_owned(out, staging, owned)  # the previous OUT now lives here
    else:
        old = _tagged(out, ".old-", _new_tag())
        os.rename(out, old)
        _crash_point("after_move_aside")
        os.rename(staging, out)
        problem = _remove_owned(out, old, owned)
    if problem:
        _say(problem)


def _commit_remote(staging: str, out: str, owned: Owned | None) -> None:
    staging = staging.rstrip("/")
    new = set(_list_remote(staging))
    prev = set(_list_remote(out))
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
    if not _has_success(staging):
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
    from lidarshard.pipelines.tools.validate import validate

    problems, _ = validate(staging)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
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

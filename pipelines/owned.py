"""What lidarshard wrote into an OUT: the only entries a publish may replace or delete.

A previous ``OUT`` may be replaced only when every entry in it is listed by its ``_manifest.json``
'files' (a scan directory: its samples parts and ``rejects.parquet``), is that metadata or ``_SUCCESS``,
or lies in ``report/`` (``check_replaceable``, before Beam starts and again right before the commit;
the metadata is read bounded, and a listed path outside OUT makes it untrustworthy). Anything else --
a user's ``raw/``, a stray file -- refuses the run in one line naming it. The previous tree is then
deleted entry by entry, only what it lists (``remove_owned``: a tree that gained a foreign entry
meanwhile is kept whole as ``OUT.kept-<tag>``; one that cannot be deleted, e.g. read-only for this
user, is named in one line, never left silently).

The one publish, ``lidarshard.pipelines.publish``, decides when; nothing here stages or commits.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from lidarshard.schemas import (
    MANIFEST_FILE,
    META_FILES,
    REJECTS_FILE,
    REPORT_DIR,
    SAMPLES_DIR,
    SCAN_FILE,
    SUCCESS_FILE,
    part_index,
)
from lidarshard.schemas.manifest import relpath_problem
from lidarshard.transforms.io import metadata, storage
from lidarshard.transforms.io.storage import FileTooLargeError, is_local, join, local_path

__all__ = [
    "Owned",
    "owned_files",
    "check_replaceable",
    "remove_owned",
    "has_success",
    "list_remote",
    "REPORT_DIR",
    "META_MAX_BYTES",
]

#: Cap on the old ``_manifest.json`` / ``_scan.json`` read to learn what may be deleted (bytes).
META_MAX_BYTES = storage.METADATA_MAX_BYTES


def list_remote(root: str) -> dict[str, float]:
    """{path relative to ``root``: last-updated seconds} of every file under ``root``."""
    return {rel: info.mtime for rel, info in storage.list_files(root.rstrip("/")).items()}


def has_success(path: str) -> bool:
    """True when the directory ``path`` holds ``_SUCCESS`` (a complete, committed or staged, tree)."""
    return storage.exists(join(path, SUCCESS_FILE))


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
        if rel in self.files or rel in META_FILES or rel.startswith(REPORT_DIR + "/"):
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
            meta = metadata.read_object(path, name, META_MAX_BYTES)
        except FileTooLargeError:
            raise _refuse(out, f"its {name} is larger than {META_MAX_BYTES} bytes") from None
        except (ValueError, OSError) as e:
            raise _refuse(
                out, f"its {name} cannot be read ({str(e).splitlines()[0] if str(e) else e!r})"
            ) from None
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
        return next((join(out, rel) for rel in sorted(list_remote(out)) if rel not in owned), None)
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
        empty = not list_remote(out)
    if empty:
        return Owned(frozenset())
    if not has_success(out):
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


def remove_owned(out: str, tree: str, owned: Owned | None, kept: str) -> str | None:
    """Delete the local directory ``tree`` (a previous OUT moved aside, or a dead run's staging dir),
    removing only what ``owned`` says lidarshard wrote (None: all of it, a staging directory). Returns
    a one-line problem when something stays, else None.

    A tree holding anything unowned (added between the check and the swap) is kept whole, renamed to
    ``kept`` (``OUT.kept-<tag>``, which no later run deletes); one that cannot be deleted (read-only for
    another user, immutable) stays where it is and the line says so (a later run tries again, and says
    so again).
    """
    if os.path.islink(tree) or not os.path.isdir(tree):
        if os.path.lexists(tree):
            os.unlink(tree)
        return None
    try:
        entries = _walk(tree)
        if owned is not None and (first := _first_unowned(tree, owned)) is not None:
            os.rename(tree, kept)
            return (
                f"kept the previous {out} as {kept}: it holds {_shown(first[len(tree) + 1 :])}, which lidarshard "
                "did not write; move what you need out of it and delete it"
            )
        last = {
            rel for rel, _ in entries if rel in META_FILES
        }  # metadata last: the tree stays self-describing
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

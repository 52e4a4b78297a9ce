"""Listing a local input directory without losing anything: broken links become rejects. Pure.

Beam's local ``MatchFiles`` drops entries whose size cannot be read (symlink loops, dangling
links) without a trace; this walk reports them so that scanned = accepted + rejected holds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

__all__ = ["walk_local"]


def walk_local(root: str) -> Iterator[tuple[str, str | None]]:
    """Every file under ``root`` as ``(path, None)``, every unreadable entry as ``(path, why)``.

    Symlinks to files and directories are followed; a directory already visited (a directory
    symlink loop or a second link to it) is skipped, since it holds no new input. Entries come in
    sorted order, depth first.

    Raises:
        FileNotFoundError: ``root`` itself cannot be listed (gone or replaced since INPUT was checked):
            a whole INPUT is no one sample's reject.
    """
    stack, seen = [root], set()
    while stack:
        folder = stack.pop()
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            entries = sorted(os.scandir(folder), key=lambda e: e.name, reverse=True)
        except OSError as e:
            if folder == root:
                raise FileNotFoundError(
                    f"INPUT {root} cannot be listed at the scan: {e.strerror or e} (it was a directory at the check)"
                ) from None
            yield folder, f"cannot list directory: {e.strerror or e}"
            continue
        for entry in entries:
            try:
                is_dir, is_file = entry.is_dir(), entry.is_file()  # both follow symlinks
            except OSError:  # ELOOP is raised, not reported as False
                is_dir = is_file = False
            if is_dir:
                stack.append(entry.path)
            elif is_file:
                yield entry.path, None
            else:
                yield entry.path, _why(entry.path)


def _why(path: str) -> str:
    try:
        os.stat(path)
    except OSError as e:  # ELOOP, ENOENT (dangling link), EACCES
        return f"{e.strerror or e}" + (f" (symlink to {os.readlink(path)!r})" if os.path.islink(path) else "")
    return "not a regular file (fifo, socket or device)"

"""Where a tool may write: never inside a published manifest or scan, except its ``report/`` folder.

``calibrate -o`` and ``report --output-dir`` take any path; one under a directory that lidarshard
published (it holds ``_manifest.json`` or ``_scan.json``) must lie in that directory's ``report/``
(``schemas.REPORT_DIR``, outside the contract), or a later ``validate`` would reject the manifest the
tool was pointed at. No Beam.
"""

from __future__ import annotations

import posixpath

from lidarshard import schemas
from lidarshard.transforms.io import storage

__all__ = ["published_root", "check_output_path"]


def published_root(path: str) -> str | None:
    """The nearest directory above ``path`` (or ``path`` itself) that lidarshard published, else None."""
    here = path.rstrip("/")
    while here and here not in ("/", "."):
        if any(storage.exists(storage.join(here, f)) for f in (schemas.MANIFEST_FILE, schemas.SCAN_FILE)):
            return here
        parent = posixpath.dirname(here)
        if parent == here or parent.endswith(":/"):
            break
        here = parent
    return None


def check_output_path(path: str, flag: str, is_dir: bool = False) -> None:
    """Raise ValueError (one line naming ``flag``) when writing ``path`` (a file, or a directory with
    ``is_dir``) would change a published manifest or scan; its ``report/`` folder is fine."""
    target = path.rstrip("/")
    if not storage.is_local(target) or posixpath.isabs(target):
        full = target
    else:
        full = posixpath.abspath(target)
    root = published_root(full if is_dir else posixpath.dirname(full) or ".")
    if root is None:
        return
    rel = full[len(root) :].lstrip("/")
    if rel == schemas.REPORT_DIR or rel.startswith(schemas.REPORT_DIR + "/"):
        return
    raise ValueError(
        f"{flag} {path} is inside the published manifest {root} ({rel or '.'}): it would change what "
        f"validate checks; write outside it or under {root}/{schemas.REPORT_DIR}/"
    )

"""Output directories on any Beam filesystem: staging, atomic-as-possible commit, small files.

A run writes everything (``_SUCCESS`` last) into a hidden staging sibling ``OUT.staging-<id>`` and
then publishes it: on local disks the previous ``OUT`` is moved aside and the staging directory is
renamed into place (two renames, microseconds apart; ``recover`` repairs the gap after a crash);
a reader never sees a directory without ``_SUCCESS``.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import uuid

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

__all__ = ["join", "write_bytes", "write_json", "read_json", "new_staging", "commit", "recover", "is_local"]


def join(root: str, *parts: str) -> str:
    """Join path parts with '/', for local paths and URIs alike."""
    return posixpath.join(root.rstrip("/"), *parts) if "://" in root else os.path.join(root, *parts)


def is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def write_bytes(path: str, data: bytes) -> None:
    """Create/overwrite ``path`` with ``data`` (parent directories are created as needed)."""
    if is_local(path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(data)


def write_json(path: str, obj: object) -> None:
    """Pretty, key-sorted JSON (stable bytes for equal objects)."""
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def read_json(path: str) -> dict:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return json.loads(f.read())


def new_staging(out: str) -> str:
    """A fresh staging directory path next to ``out``."""
    return f"{out.rstrip('/')}.staging-{uuid.uuid4().hex[:12]}"


def _delete(path: str) -> None:
    if is_local(path):
        shutil.rmtree(path, ignore_errors=True)
    elif FileSystems.exists(path):
        FileSystems.delete([path.rstrip("/") + "/"])


def recover(out: str) -> None:
    """Repair what a crash between the two publishing renames leaves: restore ``OUT.old-*``."""
    if not is_local(out):
        return
    out = out.rstrip("/")
    parent, name = os.path.split(os.path.abspath(out))
    olds = sorted(n for n in os.listdir(parent or ".") if n.startswith(name + ".old-"))
    if olds and not os.path.exists(out):
        os.rename(os.path.join(parent, olds[-1]), out)
        olds = olds[:-1]
    for n in olds:
        shutil.rmtree(os.path.join(parent, n), ignore_errors=True)


def commit(staging: str, out: str) -> None:
    """Publish ``staging`` as ``out``, replacing a previous ``out``."""
    out = out.rstrip("/")
    if is_local(out):
        recover(out)
        old = f"{out}.old-{uuid.uuid4().hex[:12]}"
        if os.path.exists(out):
            os.rename(out, old)
        os.rename(staging, out)
        shutil.rmtree(old, ignore_errors=True)
        return
    if FileSystems.exists(out + "/"):
        _delete(out)
    FileSystems.rename([staging.rstrip("/") + "/"], [out + "/"])


def discard(staging: str) -> None:
    """Remove an unpublished staging directory."""
    _delete(staging)

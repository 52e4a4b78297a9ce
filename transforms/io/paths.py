"""Movable datasets: sample paths stored relative to a recorded root, resolved wherever the data lives.

``lidarshard build --relative-to ROOT`` stores ``path``, ``sweep_paths`` and ``label_path`` relative to
ROOT (``samples/LIDAR_TOP/x.bin``) and records ROOT as ``path_root`` in ``_manifest.json``; a reader
joins them to the recorded root, or to the ``root=`` it is given when the data moved (a local path or
a gs:// / s3:// URI). Absolute manifests move with ``path_map={"/old/prefix": "/new/prefix"}``.
Pure pyarrow; no Beam, no torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lidarshard.transforms.io.storage import join

__all__ = [
    "PATH_COLUMNS",
    "PathResolver",
    "absolute",
    "bad_path",
    "is_relative",
    "path_problem",
    "relative_to",
    "resolved",
]

#: Columns of the samples and of the plan that hold paths (string or list<string>).
PATH_COLUMNS = ("path", "sweep_paths", "label_path")


def bad_path(path: str) -> str | None:
    """What no path (a user's, or a sample's as stored) may be: empty, or holding a NUL byte; None if fine."""
    if not path:
        return "'' is not a path: give a file or directory (. for this one)"
    return f"{path!r} holds a NUL byte, which no path may" if "\0" in path else None


def is_relative(path: str) -> bool:
    """True for a stored relative path (no leading '/', no scheme, no drive)."""
    return not (path.startswith("/") or "://" in path or os.path.isabs(path))


def _prefix(root: str) -> str:
    """What the vectorized joins put before a relative path: ``root`` with one trailing ``/`` (the
    same as ``join(root, rel)`` for a root without trailing slashes, on URIs and POSIX paths)."""
    return root.rstrip("/") + "/"


def _map_strings(arr: pa.Array, fn: Callable[[pa.Array], pa.Array]) -> pa.Array:
    """Apply ``fn`` to the strings of a string or list<string> array, keeping nulls and offsets."""
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        offsets = pc.subtract(arr.offsets, arr.offsets[0])  # a sliced array's offsets need not start at 0
        return type(arr).from_arrays(offsets, fn(arr.flatten()), mask=arr.is_null())
    return fn(arr)


def _rewrite(table: pa.Table, fn: Callable[[pa.Array], pa.Array]) -> pa.Table:
    for name in PATH_COLUMNS:
        if name in table.column_names:
            i = table.column_names.index(name)
            col = table.column(name).combine_chunks()
            table = table.set_column(i, table.field(name), _map_strings(col, fn).cast(col.type))
    return table


def relative_to(table: pa.Table, root: str | None) -> pa.Table:
    """``table`` with every path made relative to ``root`` (None: unchanged).

    Raises:
        ValueError: a path is not inside ``root`` (naming it), or is already relative.
    """
    if root is None:
        return table
    prefix = _prefix(root)

    def strip(values: pa.Array) -> pa.Array:
        outside = pc.invert(pc.fill_null(pc.starts_with(values, prefix), True))
        if pc.any(outside).as_py():
            bad = values.filter(outside)[0].as_py()
            raise ValueError(
                f"{bad} is not inside --relative-to {root}: pass a ROOT that holds every input "
                "(or --relative-to none for full paths)"
            )
        return pc.utf8_slice_codeunits(values, len(prefix))

    return _rewrite(table, strip)


def absolute(table: pa.Table, root: str | None) -> pa.Table:
    """``table`` with relative paths joined to ``root`` (None: the paths must already be absolute)."""
    if root is None:
        return table
    prefix = _prefix(root)

    def under(values: pa.Array) -> pa.Array:
        rel = pc.invert(
            pc.fill_null(pc.or_(pc.starts_with(values, "/"), pc.match_substring(values, "://")), True)
        )
        return pc.if_else(rel, pc.binary_join_element_wise(prefix, values, ""), values)

    return _rewrite(table, under)


def path_problem(table: pa.Table, root: object) -> str | None:
    """What is wrong with ``table``'s stored paths for a manifest whose ``path_root`` is ``root``:
    with a root every path must be relative and stay inside it (no ``..``); without, all are full.
    The strings are judged one by one only where a search of their bytes back to back may find a fault
    (Arrow's string kernels cost ~100 ns a string here; that search ~0.3 ns a byte)."""
    if root is not None and not isinstance(root, str):
        return f"path_root must be a string or null, got {root!r}"
    for name in PATH_COLUMNS:
        if name not in table.column_names:
            continue
        col = table.column(name)
        chunks = [(c.flatten() if pa.types.is_list(c.type) else c).drop_null() for c in col.chunks]
        if any(len(v) and _may_hold(v, b"\0", empty=True) for v in chunks):
            values = pa.chunked_array(chunks, chunks[0].type).combine_chunks()
            odd = pc.or_(pc.equal(values, ""), pc.match_substring(values, "\0"))
            if pc.any(odd).as_py():
                return f"{name} {bad_path(values.filter(odd)[0].as_py())}"
        if not any(len(v) and _may_be_bad(v, root) for v in chunks):
            continue
        values = pa.chunked_array(chunks, chunks[0].type).combine_chunks()
        full = pc.or_(pc.starts_with(values, "/"), pc.match_substring(values, "://"))
        bad = _dot_dot(values)
        bad = pc.or_(bad, full if root is not None else pc.invert(full))
        if pc.any(bad).as_py():
            want = f"relative to path_root {root} and inside it" if root else "a full path (no path_root)"
            return f"{name} {values.filter(bad)[0].as_py()!r} is not {want}"
    return None


def _may_be_bad(values: pa.Array, root: object) -> bool:
    """Whether one of ``values`` (strings, no nulls) may hold ``..`` or be full (a root) or not (none)."""
    if _may_hold(values, b".."):
        return True
    starts = pc.starts_with(values, "/")
    if root is None:
        return not pc.all(starts).as_py()
    return bool(pc.any(starts).as_py()) or _may_hold(values, b"://")


def _may_hold(values: pa.Array, needle: bytes, empty: bool = False) -> bool:
    """Whether one of ``values`` (strings, no nulls) may hold ``needle`` (or, with ``empty``, be ""): their
    bytes back to back do (a match across two values is a false alarm the caller's exact check clears)."""
    if values.type != pa.string():
        return True  # judged one by one
    first, data = values.offset, values.buffers()[2]
    offsets = np.frombuffer(values.buffers()[1], np.int32, count=first + len(values) + 1)[first:]
    if empty and bool((offsets[1:] == offsets[:-1]).any()):
        return True
    text = memoryview(data or b"")[offsets[0] : offsets[-1]]
    return re.search(re.escape(needle), text) is not None


def _dot_dot(values: pa.Array) -> pa.Array:
    """(n,) bool: which of ``values`` hold a ``..`` component (the regex runs only on those holding ``..``)."""
    maybe = np.flatnonzero(pc.match_substring(values, "..").to_numpy(zero_copy_only=False))
    out = np.zeros(len(values), dtype=bool)
    if maybe.size:
        found = pc.match_substring_regex(values.take(pa.array(maybe)), r"(^|/)\.\.(/|$)")
        out[maybe] = found.to_numpy(zero_copy_only=False)
    return pa.array(out)


class PathResolver:
    """Stored path -> path to open; a plain object, so DataLoader workers can pickle it (spawn).

    Args:
        manifest_root: the manifest's recorded ``path_root`` (None: it stores full paths).
        root: where the data lives now (local path or URI); overrides ``manifest_root``.
        path_map: ``{old prefix: new prefix}`` applied to full paths (and to joined ones), longest
            prefix first, whole path components only.

    Raises:
        ValueError: ``root`` for a manifest of full paths, which it would not change (one line naming
            ``path_map=``).
    """

    def __init__(
        self, manifest_root: str | None, root: str | None = None, path_map: Mapping[str, str] | None = None
    ) -> None:
        if root is not None and manifest_root is None:
            raise ValueError(
                f"root={root!r} moves a manifest of relative paths, but this manifest stores full paths (no "
                "path_root): pass path_map={'/old/prefix': '/new/prefix'} instead"
            )
        self.base = root if root is not None else manifest_root
        pairs = ((k.rstrip("/"), v.rstrip("/")) for k, v in (path_map or {}).items())
        self.pairs = sorted(pairs, key=lambda kv: -len(kv[0]))

    def __call__(self, path: str) -> str:
        """Raises ValueError for a relative path when there is no root to join it to."""
        if is_relative(path):
            if self.base is None:
                raise ValueError(
                    f"{path} is stored relative but the manifest records no path_root: pass root="
                )
            path = join(self.base, path)
        for old, new in self.pairs:
            if path == old or path.startswith(old + "/"):
                return new + path[len(old) :]
        return path


def resolved(stored: Iterable[str | None], root: str | None) -> list[str | None]:
    """Stored paths (None kept) as paths to open: relative ones joined to ``root`` (``PathResolver``);
    without a root they stay as stored."""
    resolve = PathResolver(root) if root else None
    return [p if p is None or resolve is None else resolve(p) for p in stored]

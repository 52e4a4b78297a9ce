"""Every check of a path the user gave, made before Beam starts: INPUT, OUT, the nuScenes version and
``--from-samples``. Each raises :class:`~lidarshard.pipelines.flags.UsageError` with one line naming
the path and what is wrong.
"""

from __future__ import annotations

import os
import posixpath
import tempfile

from lidarshard.pipelines.flags import UsageError
from lidarshard.pipelines.publish import check_replaceable
from lidarshard.transforms import paths, storage
from lidarshard.transforms.features import recorded

__all__ = [
    "check_input",
    "check_output",
    "check_output_parent",
    "check_nuscenes",
    "check_from_samples",
]


def _exists(path: str) -> bool:
    from apache_beam.io.filesystems import FileSystems

    if storage.is_local(path):
        return os.path.lexists(path.removeprefix("file://"))
    try:
        return bool(FileSystems.match([path])[0].metadata_list) or FileSystems.exists(path)
    except Exception:  # noqa: BLE001 - a store that cannot be listed counts as "not found"
        return False


def _is_pattern(path: str) -> bool:
    """A glob: wildcard characters, unless a local file or directory has that very name."""
    return any(c in path for c in "*?[") and not (storage.is_local(path) and _exists(path))


def _root_of(path: str) -> str:
    """The directory INPUT names (the fixed part of a glob)."""
    cut = min((path.find(c) for c in "*?[" if c in path), default=-1) if _is_pattern(path) else -1
    return path[:cut].rsplit("/", 1)[0] if cut >= 0 else path.rstrip("/")


def check_input(path: str) -> None:
    """INPUT must exist: a file, a directory, or a glob matching something (local or remote)."""
    from apache_beam.io.filesystems import FileSystems

    if _is_pattern(path):
        if not FileSystems.match([path])[0].metadata_list:
            raise UsageError(f"INPUT {path}: the pattern matches no file")
        return
    if not _exists(path) and not (not storage.is_local(path) and _exists(path.rstrip("/") + "/**")):
        raise UsageError(f"INPUT {path} does not exist")


def _resolved(path: str) -> str:
    """A local path with its links resolved (remote paths as given), no trailing slash."""
    if storage.is_local(path):
        return os.path.realpath(storage.local_path(path)).rstrip("/") or "/"
    return path.rstrip("/")


def _contains(outer: str, inner: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def check_output(out: str, inputs: list[str], publish: bool = True) -> None:
    """OUT must be replaceable: not a file, neither INPUT nor inside it nor holding it (after resolving
    links: publishing replaces OUT wholesale), its parent writable (``publish=False``, a dry run: only
    the first checks)."""
    for inp in inputs:
        root = _root_of(inp)
        outer, inner = _resolved(root), _resolved(out)
        if outer == inner:
            raise UsageError(f"OUT {out} is INPUT: write the manifest to another directory")
        if _contains(outer, inner):
            raise UsageError(
                f"OUT {out} is inside INPUT {root}: a later scan would read it; choose another OUT"
            )
        if _contains(inner, outer):
            raise UsageError(
                f"INPUT {root} is inside OUT {out}: publishing replaces OUT and would delete the input; "
                "choose another OUT"
            )
    if not publish:
        return
    try:
        check_replaceable(out)
    except FileExistsError as e:
        raise UsageError(f"OUT {e}".replace("OUT refusing to replace", "OUT")) from None
    check_output_parent(out)


def check_output_parent(out: str) -> None:
    """OUT must not be a file and (local) its nearest existing parent must be writable."""
    if not storage.is_local(out):
        return
    path = os.path.abspath(out.rstrip("/").removeprefix("file://"))
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UsageError(f"OUT {out}: it exists and is not a directory")
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    try:  # a real probe: access() says yes to root on a read-only or special filesystem
        os.rmdir(tempfile.mkdtemp(prefix=".lidarshard-probe-", dir=parent))
    except OSError as e:
        raise UsageError(f"OUT {out}: cannot write into {parent} ({e.strerror or e})") from None


def _versions(dataroot: str) -> list[str]:
    """The ``v1.0-*`` table folders under ``dataroot`` that hold ``sample_data.json``."""
    from apache_beam.io.filesystems import FileSystems

    if storage.is_local(dataroot):
        root = dataroot.removeprefix("file://")
        names = sorted(os.listdir(root)) if os.path.isdir(root) else []
        return [
            n
            for n in names
            if n.startswith("v1.0-") and os.path.isfile(os.path.join(root, n, "sample_data.json"))
        ]
    found = FileSystems.match([posixpath.join(dataroot.rstrip("/"), "v1.0-*", "sample_data.json")])[0]
    return sorted({m.path.rstrip("/").split("/")[-2] for m in found.metadata_list})


def check_nuscenes(input: str, version: str | None) -> None:
    """A dataroot needs ``--nuscenes-version``; a version must be one of the folders present."""
    if _is_pattern(input):
        if version:
            raise UsageError(
                f"--nuscenes-version {version}: INPUT must be the dataroot directory, not a pattern"
            )
        return
    present = _versions(input)
    if version is None:
        if present:
            raise UsageError(
                f"INPUT {input} is a nuScenes dataroot (found {', '.join(present)}): add "
                f"--nuscenes-version {present[0]} to read its tables"
            )
        return
    if version not in present:
        have = ", ".join(present) if present else "none"
        raise UsageError(
            f"--nuscenes-version {version}: no {version}/sample_data.json under {input}; present: {have}"
        )


def check_from_samples(path: str) -> tuple[int, float | None]:
    """``--from-samples`` must be samples of ours, a samples directory or a 2.x samples.parquet
    (``previous_rows``). Returns
    (rows, the reject fraction its run recorded, or None)."""
    if not (_exists(path) or storage.is_dir(path)):  # a samples directory is a prefix on object stores
        raise UsageError(f"--from-samples {path} does not exist")
    try:
        rows, first = recorded.previous_rows(path)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    if first is not None and paths.is_relative(first) and not recorded.previous_root(path):
        raise UsageError(
            f"--from-samples {path} stores relative paths ({first!r}) but no _manifest.json or _scan.json "
            "beside it records their root: pass the samples where their run wrote them (OUT/samples)"
        )
    return rows, recorded.recorded_fraction(path)

"""Every check of a path the user gave, before Beam starts: INPUT, OUT, the nuScenes version, ``--from-samples``
and Beam's temp/staging locations; each a UsageError naming the path. Where any run may publish is one rule
(``check_output_parent``, with ``tools.outputs``).
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from lidarshard.pipelines.owned import check_replaceable
from lidarshard.pipelines.publish import NAME_MAX
from lidarshard.schemas import SUCCESS_FILE
from lidarshard.tools.outputs import check_output_path
from lidarshard.transforms.core import earlier_run
from lidarshard.transforms.io import paths, storage
from lidarshard.transforms.layouts import STORAGE_IO, nuscenes
from lidarshard.transforms.value_checks import UsageError

__all__ = [
    "REMOTE_TIMEOUT_S",
    "check_input",
    "check_output",
    "check_output_parent",
    "check_nuscenes",
    "check_from_samples",
    "check_locations",
    "is_pattern",
    "real",
    "under",
]

#: Seconds a remote store has to answer the first look at a path (its clients retry for minutes otherwise).
REMOTE_TIMEOUT_S = 10.0

_T = TypeVar("_T")


def _reason(e: BaseException) -> str:
    """One line for a store's error: the innermost of Beam's wrapped ones, first line, bounded."""
    while isinstance(getattr(e, "exception_details", None), dict) and e.exception_details:  # type: ignore[attr-defined]
        e = next(iter(e.exception_details.values()))  # type: ignore[attr-defined]
    text = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {text[:200]}" if text else type(e).__name__


def _answer(what: str, path: str, probe: Callable[[], _T]) -> _T:
    """``probe()`` of ``path``, given ``REMOTE_TIMEOUT_S`` when remote; UsageError naming ``what`` and ``path``:
    no filesystem for its scheme, no answer in time, or the store's error."""
    if storage.is_local(path):
        return probe()
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = probe()
        except BaseException as e:  # noqa: BLE001 - handed to the launcher's thread below
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name="lidarshard-probe", daemon=True).start()
    if not done.wait(REMOTE_TIMEOUT_S):
        raise UsageError(
            f"{what} {path}: its store did not answer within {REMOTE_TIMEOUT_S:g} s (check the network, "
            "the endpoint and the credentials)"
        )
    error = box.get("error")
    if isinstance(error, UsageError):
        raise error
    if isinstance(error, ValueError) and str(error).startswith("no filesystem for"):
        raise UsageError(f"{what} {path}: no filesystem serves {path.split('://', 1)[0]}:// here") from None
    if error is not None:
        raise UsageError(f"{what} {path}: cannot be reached ({_reason(error)})") from None
    return box["value"]


def _kind(path: str) -> str | None:
    """``"file"``, ``"dir"`` (a local directory, or a remote prefix holding a file) or None."""
    if storage.is_local(path):
        p = storage.local_path(path)
        return "file" if os.path.isfile(p) else "dir" if os.path.isdir(p) else None
    if storage.exists(path):
        return "file"
    return "dir" if storage.is_dir(path) else None


def is_pattern(path: str) -> bool:
    """A glob: wildcard characters, unless a local directory has that very name (as the scan reads it)."""
    return any(c in path for c in "*?[") and not (storage.is_local(path) and _kind(path) == "dir")


def _root_of(path: str) -> str:
    """The directory INPUT names (the fixed part of a glob)."""
    cut = min((path.find(c) for c in "*?[" if c in path), default=-1) if is_pattern(path) else -1
    return path[:cut].rsplit("/", 1)[0] if cut >= 0 else path.rstrip("/")


def check_input(path: str) -> None:
    """INPUT is a directory (remote: a prefix holding files) or a glob matching something, never a file."""
    if is_pattern(path):
        if not _answer("INPUT", path, lambda: bool(storage.glob(path))):
            raise UsageError(f"INPUT {path}: the pattern matches no file")
        return
    kind = _answer("INPUT", path, lambda: _kind(path))
    if kind == "file":
        raise UsageError(
            f"INPUT {path} is a file: INPUT is a directory (every point cloud below it is scanned), a glob "
            "such as DIR/*.bin, or a nuScenes dataroot; pass the directory that holds it"
        )
    if kind is None:
        raise UsageError(f"INPUT {path} does not exist")


def check_locations(beam_argv: Sequence[str]) -> None:
    """Beam's remote ``--temp_location`` / ``--staging_location`` answer in time (they need not exist yet)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions(list(beam_argv)).get_all_options(drop_default=True)
    for flag in ("temp_location", "staging_location"):
        where = options.get(flag)
        if isinstance(where, str) and where and not storage.is_local(where):
            _answer(f"--{flag}", where, lambda: storage.is_dir(where))  # noqa: B023 - called at once


def real(path: str) -> str:
    """A local path with its links resolved (remote paths as given), no trailing slash."""
    if storage.is_local(path):
        return os.path.realpath(storage.local_path(path)).rstrip("/") or "/"
    return path.rstrip("/")


def under(path: str, root: str) -> bool:
    """``path`` lies strictly inside ``root`` (both as ``real`` gives them)."""
    return path.startswith(root.rstrip("/") + "/")


def check_output(out: str, inputs: list[str], publish: bool = True) -> None:
    """OUT is replaceable: apart from every INPUT (links resolved), holding nothing lidarshard did not write,
    reachable, its parent writable (``publish=False``, a dry run: the first check only)."""
    for inp in inputs:
        root = _root_of(inp)
        outer, inner = real(root), real(out)
        if outer == inner:
            raise UsageError(f"OUT {out} is INPUT: write the manifest to another directory")
        if under(inner, outer):
            raise UsageError(
                f"OUT {out} is inside INPUT {root}: a later scan would read it; choose another OUT"
            )
        if under(outer, inner):
            raise UsageError(
                f"INPUT {root} is inside OUT {out}: publishing replaces OUT and would delete the input; "
                "choose another OUT"
            )
    if not publish:
        return
    _answer("OUT", out, lambda: storage.exists(storage.join(out, SUCCESS_FILE)))  # reachable at all?
    try:
        check_replaceable(out)
    except FileExistsError as e:
        raise UsageError(f"OUT {e}".replace("OUT refusing to replace", "OUT")) from None
    check_output_parent(out)


def check_output_parent(out: str) -> None:
    """OUT is not inside another published output (``tools.outputs``) nor a file; a local one's parent writable."""
    try:
        _answer("OUT", out, lambda: check_output_path(out, "OUT"))
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not storage.is_local(out):
        return
    path = os.path.abspath(out.rstrip("/").removeprefix("file://"))
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UsageError(f"OUT {out}: it exists and is not a directory")
    name = len(os.path.basename(path).encode())
    if name > NAME_MAX:
        raise UsageError(
            f"OUT {out}: its name is {name} bytes, more than the {NAME_MAX} a file name may have"
        )
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    try:  # a real probe: access() says yes to root on a read-only or special filesystem
        os.rmdir(tempfile.mkdtemp(prefix=".lidarshard-probe-", dir=parent))
    except OSError as e:
        raise UsageError(f"OUT {out}: cannot write into {parent} ({e.strerror or e})") from None


def check_nuscenes(input: str, version: str | None) -> None:
    """A dataroot needs ``--nuscenes-version``; a version must be one of the folders present."""
    if is_pattern(input):
        if version:
            raise UsageError(
                f"--nuscenes-version {version}: INPUT must be the dataroot directory, not a pattern"
            )
        return
    present = _answer("INPUT", input, lambda: nuscenes.versions(input, STORAGE_IO))
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
    """``--from-samples`` is samples of ours (``previous_rows``); returns (rows, the recorded reject fraction)."""

    def there() -> bool:  # a local broken link counts; remote: a prefix holding files
        return (
            os.path.lexists(storage.local_path(path)) if storage.is_local(path) else _kind(path) is not None
        )

    if not _answer("--from-samples", path, there):
        raise UsageError(f"--from-samples {path} does not exist")
    try:
        rows, first = earlier_run.previous_rows(path)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    if first is not None and paths.is_relative(first) and not earlier_run.previous_root(path):
        raise UsageError(
            f"--from-samples {path} stores relative paths ({first!r}) but no _manifest.json or _scan.json "
            "beside it records their root: pass the samples where their run wrote them (OUT/samples)"
        )
    return rows, earlier_run.recorded_fraction(path)

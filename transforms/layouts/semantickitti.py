"""The SemanticKITTI / KITTI odometry layout: one sample per velodyne scan (pure; never imports ``apache_beam``).

Files (``NN`` a sequence, ``NNNNNN`` a scan number, numbered from 0 in time order)::

    <root>/semantic-kitti.yaml                   label config (optional): its learning_map -> Found.label_map
    <root>/sequences/NN/velodyne/NNNNNN.bin      float32 x, y, z, remission (m, velodyne frame; ``kitti_bin``)
    <root>/sequences/NN/labels/NNNNNN.label      uint32 a point (optional; ``formats.labels``)
    <root>/sequences/NN/poses.txt                row i: scan i's pose, 12 floats (3x4 row-major, camera-0 frame)
    <root>/sequences/NN/calib.txt                ``Tr:`` 12 floats: velodyne -> camera 0 (3x4 row-major)
    <root>/sequences/NN/times.txt                row i: scan i's time, seconds (optional)

ROOT may be the dataset root (holding ``sequences/``), ``sequences/`` itself or one sequence folder.
The label config is looked for at ROOT, its parent, and (ROOT inside a dataset root) that root and its
parent, nearest first. Labelled scans with no config there get the standard learning_map
(``formats.labels.SEMANTICKITTI_LEARNING_MAP``): labels are never served as raw ids.

Tasks: ``sample_id = "NN/NNNNNN"``; ``label_path`` the matching ``.label`` or None. ``opts.sweeps = N`` adds
scans k-1 .. k-N of the same sequence (newest first, fewer near scan 0), each moved into scan k's velodyne
frame by ``inv(Tr) @ inv(P_k) @ P_j @ Tr`` (the transform semantic-kitti-api's ``generate_sequential``
applies); ``time_lag_s = t_k - t_j`` from ``times.txt``, else 0.1 s a scan (10 Hz). Poses and calib are read
only when sweeps are asked for.

Rejects (every file under ``velodyne/`` is accepted or rejected): a name that is not ``<digits>.bin`` ->
``unsupported_format``; two files with one scan number -> ``duplicate_id``; a previous scan file that is
absent -> ``missing_sweep``; with sweeps, a missing/unreadable/malformed ``poses.txt`` or ``calib.txt``
rejects the sequence's samples ``bad_table``, and a malformed pose or time row rejects the samples that
need it. A label config that exists but cannot be read or parsed is fatal (``ValueError``): every label
would be misread.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.formats.labels import SEMANTICKITTI_LEARNING_MAP, parse_learning_map
from lidarshard.transforms.io.storage import FileTooLargeError
from lidarshard.transforms.layouts.task import Found, LayoutIO, LayoutOptions, Reject, ScanTask, SweepRef

__all__ = [
    "NAME",
    "LABEL_CONFIG",
    "MAX_TEXT_BYTES",
    "SCAN_PERIOD_S",
    "describe",
    "load_tasks",
    "find_label_map",
]

NAME = "semantickitti"
#: File name of the label config (semantic-kitti-api ``config/semantic-kitti.yaml``).
LABEL_CONFIG = "semantic-kitti.yaml"
#: Largest text file read (poses.txt, calib.txt, times.txt, the label config), bytes.
MAX_TEXT_BYTES = 64 << 20
#: Time between scans when a sequence has no times.txt (the HDL-64E spins at 10 Hz), seconds.
SCAN_PERIOD_S = 0.1
_SCAN_NAME = re.compile(r"[0-9]+\.bin")
_RIGID_TOL = 1e-3


@dataclass(frozen=True)
class _Where:
    """Where the sequences of ROOT lie: ``base/<seq>/velodyne`` (``nested``) or ``base/velodyne`` (one
    sequence named ``name``); ``named``: the folder names say SemanticKITTI (detection trusts only those)."""

    base: str
    nested: bool
    name: str
    named: bool
    dataset_root: str | None


def _parent(path: str) -> str | None:
    """The folder holding ``path``; None at a filesystem or bucket root and for a bare relative name."""
    scheme, sep, rest = path.partition("://") if "://" in path else ("", "", path)
    rest = rest.rstrip("/")
    if "/" not in rest:
        return None
    head = posixpath.dirname(rest) or "/"
    return f"{scheme}{sep}{head}"


def _forms(root: str) -> tuple[_Where, ...]:
    """The three places ROOT's sequences may lie, in the order they are tried."""
    name = posixpath.basename(root)
    parent = _parent(root)
    above = _parent(parent) if parent is not None and posixpath.basename(parent) == "sequences" else None
    in_sequences = above is not None
    return (
        _Where(f"{root}/sequences", True, "", True, root),  # the dataset root
        _Where(root, False, name, in_sequences or name.isdigit(), above),  # one sequence
        _Where(root, True, "", name == "sequences", parent if name == "sequences" else None),  # sequences/
    )


#: A file under a ``velodyne/`` folder: (full path, sequence, name below ``velodyne/``).
_Hit = tuple[str, str, str]


def _scan_hits(root: str, io: LayoutIO) -> tuple[_Where, list[_Hit]] | None:
    """The first form with files under a ``velodyne/`` folder, and those files (sorted by path)."""
    for where in _forms(root):
        pattern = f"{where.base}/*/velodyne/**" if where.nested else f"{where.base}/velodyne/**"
        hits = []
        for path in io.glob(pattern):
            found = _split(path, where)
            if found is not None and found[1][0] == "velodyne":
                hits.append((path, found[0], "/".join(found[1][1:])))
        if not hits:
            continue
        if where.nested and not where.named:  # sequences/ under another name: NN folders still say it
            named = all(seq.isdigit() for _, seq, _ in hits)
            where = _Where(where.base, True, "", named, where.dataset_root)
        return where, sorted(hits)
    return None


def _split(path: str, where: _Where) -> tuple[str, list[str]] | None:
    """(sequence, path parts below the sequence folder) of a file under ``where``, or None."""
    if not path.startswith(where.base + "/"):
        return None
    parts = path[len(where.base) + 1 :].split("/")
    seq = parts.pop(0) if where.nested else where.name
    if not seq or len(parts) < 2 or parts[0] not in ("velodyne", "labels"):
        return None
    return seq, parts


def _seq_dir(where: _Where, seq: str) -> str:
    return f"{where.base}/{seq}" if where.nested else where.base


def _labels_pattern(where: _Where) -> str:
    return f"{where.base}/*/labels/*.label" if where.nested else f"{where.base}/labels/*.label"


def _label_path(where: _Where, seq: str, scan_name: str) -> str:
    """Where the label file of scan ``scan_name`` (``NNNNNN.bin``) of ``seq`` lies."""
    return f"{_seq_dir(where, seq)}/labels/{scan_name[: -len('.bin')]}.label"


def describe(root: str, io: LayoutIO) -> str | None:
    """``"SemanticKITTI sequences (1 sequence, 1 scan, 1 labelled)"`` when ``root`` is this layout, else None.

    Trusts folder names only: ``sequences/NN/velodyne``, ``sequences/`` or ``NN`` (a KITTI object
    ``training/velodyne`` folder is not a sequence). A few globs; no file is read.
    """
    found = _scan_hits(_clean(root), io)
    if found is None or not found[0].named:
        return None
    where, hits = found
    scans = [(seq, name) for _, seq, name in hits if _SCAN_NAME.fullmatch(name)]
    if not scans:
        return None
    labels = set(io.glob(_labels_pattern(where)))
    n_seq = len({seq for seq, _ in scans})
    n_lab = sum(_label_path(where, seq, name) in labels for seq, name in scans)
    return (
        f"SemanticKITTI sequences ({n_seq} sequence{'s' * (n_seq != 1)}, "
        f"{len(scans)} scan{'s' * (len(scans) != 1)}, {n_lab} labelled)"
    )


def _clean(root: str) -> str:
    stripped = root.rstrip("/")
    return stripped if stripped and not stripped.endswith(":") else root


def load_tasks(root: str, opts: LayoutOptions, io: LayoutIO) -> Found:
    """One task per velodyne scan under ``root`` (any of the three forms), sorted by sample_id.

    Raises:
        ValueError: bad ``opts.sweeps``, no scan under ``root``, or a label config that exists but cannot
            be read or parsed (one line naming the file).
    """
    sweeps = opts.sweeps
    if isinstance(sweeps, bool) or not isinstance(sweeps, int) or sweeps < 0:
        raise ValueError(f"sweeps must be an int >= 0, got {sweeps!r}")
    root = _clean(root)
    found = _scan_hits(root, io)
    if found is None:
        raise ValueError(
            f"{root} holds no SemanticKITTI scans (looked for sequences/NN/velodyne/, NN/velodyne/, velodyne/)"
        )
    where, hits = found
    rejects: list[Reject] = []
    scans: dict[str, dict[int, str]] = {}  # seq -> {scan number: path}
    for path, seq, name in hits:
        if not _SCAN_NAME.fullmatch(name):
            rejects.append((path, "unsupported_format", f"velodyne/ holds <digits>.bin scans, not {name}"))
            continue
        by_number = scans.setdefault(seq, {})
        number = int(name[: -len(".bin")])
        if number in by_number:
            rejects.append(
                (path, "duplicate_id", f"scan {number} of sequence {seq} is also {by_number[number]}")
            )
            continue
        by_number[number] = path
    labels = set(io.glob(_labels_pattern(where)))
    tasks: list[ScanTask] = []
    for seq in sorted(scans):
        chain = _Chain(_seq_dir(where, seq), io) if sweeps else None
        for number, path in sorted(scans[seq].items()):
            name = posixpath.basename(path)
            try:
                refs = chain.sweeps(number, sweeps, scans[seq]) if chain else ()
            except RejectError as err:
                rejects.append((path, err.reason, err.detail))
                continue
            label = _label_path(where, seq, name)
            sample_id = f"{seq}/{name[: -len('.bin')]}"
            tasks.append(ScanTask(sample_id, path, refs, label if label in labels else None))
    label_map = _label_map(root, where, io, labelled=bool(labels))
    return Found(sorted(tasks, key=lambda t: t.sample_id), sorted(rejects), label_map)


def find_label_map(root: str, io: LayoutIO) -> dict[int, int] | None:
    """The learning_map of ROOT's label config (``LABEL_CONFIG`` at ROOT, its parent or the dataset
    root), else the standard one when ROOT holds label files, else None; read before the scan so a bad
    config stops the run in one line.

    Raises:
        ValueError: a config that cannot be read or parsed (naming it).
    """
    root = _clean(root)
    found = _scan_hits(root, io)
    where = found[0] if found else _forms(root)[0]
    return _label_map(root, where, io, labelled=bool(found and io.glob(_labels_pattern(where))))


def _label_map(root: str, where: _Where, io: LayoutIO, labelled: bool) -> dict[int, int] | None:
    """The learning_map of the nearest label config; without one the standard map when ``labelled``
    (SemanticKITTI's downloads ship no config), else None."""
    places: list[str] = []
    for folder in (root, _parent(root), where.dataset_root, _parent(where.dataset_root or "")):
        if folder and folder not in places:
            places.append(folder)
    for folder in places:
        path = f"{folder.rstrip('/')}/{LABEL_CONFIG}"
        try:
            text = io.read_bytes(path, MAX_TEXT_BYTES)
        except FileNotFoundError:
            continue
        except FileTooLargeError:
            raise ValueError(f"label config {path} is larger than {MAX_TEXT_BYTES} bytes") from None
        except OSError as err:
            raise ValueError(f"label config {path} could not be read: {err}") from None
        try:
            return parse_learning_map(text)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
    return dict(SEMANTICKITTI_LEARNING_MAP) if labelled else None


class _Chain:
    """A sequence's poses, calibration and times, read once; ``sweeps`` resolves one scan's sweeps.

    A problem of the whole sequence (a missing, unreadable or oversized file, no valid ``Tr:``) is kept
    and raised for each of its samples as ``bad_table``; a malformed row fails only the samples needing it.
    """

    def __init__(self, seq_dir: str, io: LayoutIO) -> None:
        self.seq_dir = seq_dir
        self.problem: str | None = None
        self.poses: list[str] = []
        self.times: list[str] | None = None
        self.tr = np.eye(4)
        self._poses: dict[int, NDArray[np.float64]] = {}  # parsed rows (a row serves N + 1 samples)
        texts: dict[str, bytes] = {}
        missing: list[str] = []
        try:
            for name in ("poses.txt", "calib.txt", "times.txt"):
                text = self._read(name, io)
                if text is None and name != "times.txt":
                    missing.append(name)
                elif text is not None:
                    texts[name] = text
            if missing:
                self.problem = (
                    f"{seq_dir}: sweeps need poses.txt and calib.txt; missing {' and '.join(missing)}"
                )
                return
            self.poses = _lines(texts["poses.txt"])
            self.tr = _calib_tr(texts["calib.txt"], f"{seq_dir}/calib.txt")
            self.times = _lines(texts["times.txt"]) if "times.txt" in texts else None
        except RejectError as err:
            self.problem = err.detail
        self.tr_inv = np.linalg.inv(self.tr)

    def _read(self, name: str, io: LayoutIO) -> bytes | None:
        """The file ``name`` of the sequence folder, None when absent; ``bad_table`` when unreadable."""
        path = f"{self.seq_dir}/{name}"
        try:
            return io.read_bytes(path, MAX_TEXT_BYTES)
        except FileNotFoundError:
            return None
        except FileTooLargeError:
            raise RejectError("bad_table", f"{path} is larger than {MAX_TEXT_BYTES} bytes") from None
        except OSError as err:
            raise RejectError("bad_table", f"{path} could not be read: {err}") from None

    def sweeps(self, number: int, count: int, files: dict[int, str]) -> tuple[SweepRef, ...]:
        """Scans ``number - 1 .. number - count`` (none below 0), newest first, as SweepRefs into ``number``.

        Raises:
            RejectError: ``bad_table`` (the sequence's problem, a malformed pose/time row, a time lag
                <= 0), ``missing_sweep`` (a previous scan file absent from ``velodyne/``).
        """
        if self.problem is not None:
            raise RejectError("bad_table", self.problem)
        chain = range(number - 1, max(number - count, 0) - 1, -1)
        missing = [j for j in chain if j not in files]
        if missing:
            raise RejectError(
                "missing_sweep", f"scan {number} needs previous scan {missing[0]}, absent from velodyne/"
            )
        if not chain:
            return ()
        ref_inv = np.linalg.inv(self._pose(number))
        refs = []
        for j in chain:
            moved = self.tr_inv @ ref_inv @ self._pose(j) @ self.tr
            lag = self._lag(number, j)
            if not np.isfinite(moved).all():
                raise RejectError(
                    "bad_table", f"{self.seq_dir}: scan {j} -> scan {number} transform is not finite"
                )
            refs.append(SweepRef(files[j], tuple(float(v) for v in moved.ravel()), lag))
        return tuple(refs)

    def _pose(self, row: int) -> NDArray[np.float64]:
        """Scan ``row``'s 4x4 camera-0 pose; ``bad_table`` when its row is absent or malformed."""
        if row not in self._poses:
            what = f"{self.seq_dir}/poses.txt"
            self._poses[row] = _rigid(_row(self.poses, row, 12, what), f"{what} row {row}")
        return self._poses[row]

    def _lag(self, ref: int, sweep: int) -> float:
        """t_ref - t_sweep, seconds: times.txt when present, else ``SCAN_PERIOD_S`` a scan."""
        if self.times is None:
            return (ref - sweep) * SCAN_PERIOD_S
        what = f"{self.seq_dir}/times.txt"
        lag = float(_row(self.times, ref, 1, what)[0] - _row(self.times, sweep, 1, what)[0])
        if not lag > 0:
            raise RejectError(
                "bad_table", f"{what}: scan {sweep} is not earlier than scan {ref} ({lag:+g} s)"
            )
        return lag


def _lines(data: bytes) -> list[str]:
    """The lines of a text file (row i = line i), trailing blank lines dropped."""
    text = data.decode("utf-8", errors="replace")
    return text.rstrip().splitlines() if text.strip() else []


def _row(lines: list[str], row: int, width: int, what: str) -> NDArray[np.float64]:
    """Row ``row`` of the float table ``what`` (its lines): ``width`` finite floats, else ``bad_table``."""
    if row >= len(lines):
        raise RejectError("bad_table", f"{what} has {len(lines)} rows; scan {row} needs row {row}")
    return _floats(lines[row], width, f"{what} row {row}")


def _floats(text: str, width: int, what: str) -> NDArray[np.float64]:
    """``width`` whitespace-separated finite floats, else ``bad_table`` naming ``what``."""
    try:
        values = np.array([float(v) for v in text.split()], np.float64)
    except ValueError:
        values = np.empty(0)
    if len(values) != width or not np.isfinite(values).all():
        raise RejectError("bad_table", f"{what} is not {width} finite numbers: {text.strip()[:80]!r}")
    return values


def _calib_tr(data: bytes, what: str) -> NDArray[np.float64]:
    """calib.txt's ``Tr:`` line (velodyne -> camera 0) as a 4x4; ``bad_table`` when absent or malformed."""
    for line in _lines(data):
        key, sep, rest = line.partition(":")
        if sep and key.strip() == "Tr":
            return _rigid(_floats(rest, 12, f"{what} Tr:"), f"{what} Tr:")
    raise RejectError("bad_table", f"{what} has no 'Tr:' line (velodyne -> camera 0)")


def _rigid(values: NDArray[np.float64], what: str) -> NDArray[np.float64]:
    """12 floats (3x4 row-major) -> 4x4; ``bad_table`` unless the rotation part is orthonormal."""
    out = np.eye(4)
    out[:3] = values.reshape(3, 4)
    rot = out[:3, :3]
    if not np.allclose(rot.T @ rot, np.eye(3), atol=_RIGID_TOL) or np.linalg.det(rot) <= 0:
        raise RejectError("bad_table", f"{what} is not a rigid transform (its 3x3 is not a rotation)")
    return out

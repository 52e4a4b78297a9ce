"""nuScenes tables -> one scan task per LIDAR_TOP keyframe (pure; never imports ``apache_beam``).

``load_tasks`` reads ``<dataroot>/<version>/{sample_data,calibrated_sensor,sensor,ego_pose}.json`` (plus
``lidarseg.json`` when present) through an injected ``read_bytes``, so local paths and ``gs://`` URIs
work alike. It joins the tables the way nuscenes-devkit does:

* channel: ``sample_data.calibrated_sensor_token -> calibrated_sensor.sensor_token -> sensor.channel``;
  only ``LIDAR_TOP`` records with ``is_key_frame`` true become tasks; other channels are ignored.
* sweeps: ``--sweeps N`` follows ``prev`` for up to N **previous** sweeps (newest first), in addition to
  the keyframe. The devkit's ``from_file_multisweep(nsweeps=K)`` counts the keyframe as the first of its
  K frames, so ``--sweeps N`` equals devkit ``nsweeps=N + 1``. Like the devkit, the chain runs through
  earlier keyframes too, and stops early at the scene start (``prev == ""``).
* scenes: sweeps stay in the keyframe's scene. The schema defines ``prev`` as the record of the same
  sensor before this one, ``""`` at the start of the scene, and the devkit follows it unchecked; so a
  ``prev`` naming a record of another scene (``sample_data.sample_token -> sample.scene_token``) is
  where the scene starts: the chain ends there (it never re-enters), and the sample is served with
  the sweeps before the cut, as at a scene's first keyframes (the build summary counts the samples with
  fewer sweeps than asked). ``sample.json`` is read, and required, when sweeps are asked for.
* transforms: ``geometry.sweep_transform`` composes ``ref_from_car @ car_from_global @ global_from_car
  @ car_from_current`` exactly as the devkit does; quaternions are (w, x, y, z) and normalized.

Paths: table filenames are normalized with ``posixpath`` and joined to ``dataroot`` with ``/``; one that
is absolute, a URI or escapes the root is ``outside_root``: no returned path lies outside ``dataroot``.

Errors: a missing or corrupt required table is fatal (``ValueError``). A bad record rejects the sample
it would have produced: ``bad_table`` (missing/mistyped keys, unknown or duplicated tokens, a prev chain
that cannot be followed as the schema defines it: a ``prev`` that names no record, a record of another
channel, one of an unknown sample or scene, one not strictly earlier than the record before it (so a
loop), a file named twice in one sample; a malformed pose, an overlong string), ``outside_root``,
``duplicate_id``. A reject not tied to a keyframe path is named
``<dataroot>/<version>/<table>.json#<token or [row]>``.

Limits (untrusted tables size nothing): a table file larger than ``MAX_TABLE_BYTES`` (4 GiB: room for
real table sets, whose parse costs several times their size in memory) is refused before it is read, in
one line naming the file and the limit. A token or filename longer than ``MAX_FIELD_CHARS`` (4096, the
Linux ``PATH_MAX``) rejects its sample as ``bad_table`` with the length, never the text: it is not copied
into paths, tasks or reject details, so a 100 MB filename costs its table's parse and nothing more, and
the other keyframes are scanned as usual.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from lidarshard.schemas.jsonsafe import loads, short
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.io.storage import FileTooLargeError
from lidarshard.transforms.layouts.geometry import pose_matrix
from lidarshard.transforms.layouts.multisweep import check_labels
from lidarshard.transforms.layouts.nuscenes_records import (
    MAX_FIELD_CHARS,
    by_token,
    check_sd,
    join_under_root,
    name_of,
    root_of,
    str_or_empty,
    timestamp_of,
    too_long,
)
from lidarshard.transforms.layouts.task import Reject, ScanTask, SweepRef

__all__ = [
    "LIDAR_CHANNEL",
    "LIDAR_FORMAT",
    "MAX_TABLE_BYTES",
    "MAX_FIELD_CHARS",
    "load_tasks",
    "join_under_root",
    "check_labels",
]

LIDAR_CHANNEL = "LIDAR_TOP"
#: The reader of every LIDAR_TOP ``*.bin`` the tables name, ``*.pcd.bin`` (nuScenes) or ``*.bin`` (Lyft) alike:
#: float32 x 5 records, as the devkit's (and Lyft SDK's) ``LidarPointCloud.from_file`` reads them, never
#: KITTI's x 4. Files of other extensions (a custom dataset's ``.pcd``, ``.npy``) are read by extension.
LIDAR_FORMAT = "nuscenes_bin"
#: Largest table file read (bytes); a larger one is refused before reading, naming file and limit.
MAX_TABLE_BYTES = 4 << 30
ReadBytes = Callable[[str, int | None], bytes]  # (path, limit): at most limit + 1 bytes
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class _Tables:
    """The joined tables of one dataroot; ``task`` resolves one keyframe or raises ``RejectError``."""

    def __init__(self, dataroot: str, version: str, tables: dict[str, list[Any]]) -> None:
        self.root, self.ref = dataroot, f"{root_of(dataroot)}/{version}"
        self.sd, self.sd_dups = by_token(tables["sample_data"])
        self.index = {name: by_token(tables[name]) for name in ("calibrated_sensor", "ego_pose", "sample")}
        channels = {token: sensor.get("channel") for token, sensor in by_token(tables["sensor"])[0].items()}
        self.channel = {  # calibrated_sensor token -> sensor channel (None when unknown)
            token: channels.get(str_or_empty(cs.get("sensor_token")))
            for token, cs in self.index["calibrated_sensor"][0].items()
        }
        self.labels: dict[str, object] = {}  # sample_data token -> lidarseg filename
        self.label_dups: set[str] = set()
        self.label_rejects: list[Reject] = []
        for i, row in enumerate(tables["lidarseg"]):
            sd_token = row.get("sample_data_token") if isinstance(row, dict) else None
            if not isinstance(sd_token, str):
                detail = "lidarseg record lacks a sample_data_token"
                self.label_rejects.append((f"{self.ref}/lidarseg.json#[{i}]", "bad_table", detail))
            elif sd_token in self.labels:
                self.label_dups.add(sd_token)
            else:
                self.labels[sd_token] = row.get("filename")
        self.cs_cache: dict[tuple[str, bool], NDArray[np.float64]] = {}

    def channel_of(self, record: dict[str, Any]) -> object:
        return self.channel.get(str_or_empty(record.get("calibrated_sensor_token")))

    def _lookup(self, table: str, token: str, owner: str) -> dict[str, Any]:
        index, dups = self.index[table]
        if token in dups:
            raise RejectError("bad_table", f"{owner}: {table} token {token} appears more than once")
        if token not in index:
            raise RejectError("bad_table", f"{owner}: unknown {table} token {token!r}")
        return index[token]

    def _cs_matrix(self, token: str, owner: str, inverse: bool) -> NDArray[np.float64]:
        key = (token, inverse)
        if key not in self.cs_cache:
            self.cs_cache[key] = pose_matrix(self._lookup("calibrated_sensor", token, owner), inverse)
        return self.cs_cache[key]

    def _pose(self, record: dict[str, Any], owner: str, inverse: bool) -> NDArray[np.float64]:
        return pose_matrix(self._lookup("ego_pose", record["ego_pose_token"], owner), inverse)

    def _scene(self, record: dict[str, Any], owner: str) -> str:
        """The scene of sample_data ``record``: ``sample_token -> sample.scene_token``."""
        sample = self._lookup("sample", record["sample_token"], owner)
        scene = sample.get("scene_token")
        if not isinstance(scene, str) or not scene or too_long(scene):
            raise RejectError("bad_table", f"{owner}: sample {record['sample_token']} has no scene_token")
        return scene

    def task(self, record: dict[str, Any], path: str, sweeps: int) -> ScanTask:
        """Resolve keyframe ``record`` (already validated, ``path`` joined) into a task."""
        token = record["token"]
        owner = f"keyframe sample_data {token}"
        if not record["sample_token"]:
            raise RejectError("bad_table", f"{owner} has an empty sample_token")
        t_ref = timestamp_of(record)
        ref_from_car = self._cs_matrix(record["calibrated_sensor_token"], owner, True)
        ref_from_global = ref_from_car @ self._pose(record, owner, True)  # @ car_from_global
        refs: list[SweepRef] = []
        cur, t_cur = record, t_ref
        scene, served = None, {path}
        for _ in range(sweeps):
            prev = cur["prev"]
            if prev == "":
                break
            try:
                scene = scene or self._scene(record, owner)
                found = self._sweep_record(prev, cur["token"], t_cur, scene)
                if found is None:  # another scene's record: the keyframe's scene starts after it
                    break
                rec, t_prev = found
                sweep_path = join_under_root(self.root, rec["filename"])
                if sweep_path in served:
                    raise RejectError("bad_table", f"sample_data {prev} names {rec['filename']!r} again")
                served.add(sweep_path)
                tf = (
                    ref_from_global
                    @ self._pose(rec, f"sample_data {prev}", False)
                    @ self._cs_matrix(rec["calibrated_sensor_token"], f"sample_data {prev}", False)
                )
            except RejectError as err:
                raise RejectError(err.reason, f"sweep chain of {token}: {err.detail}") from None
            lag = 1e-6 * t_ref - 1e-6 * t_prev  # the devkit's from_file_multisweep arithmetic, to the bit
            refs.append(SweepRef(sweep_path, tuple(tf.ravel().tolist()), lag))
            cur, t_cur = rec, t_prev
        label = self._label_path(token)
        fmt = LIDAR_FORMAT if path.lower().endswith(".bin") else None
        return ScanTask(record["sample_token"], path, tuple(refs), label, format=fmt)

    def _sweep_record(
        self, prev: str, child: str, t_child: float, scene: str
    ) -> tuple[dict[str, Any], float] | None:
        """The record ``prev`` of ``child`` and its timestamp; None when it lies in another scene than
        ``scene`` (checked before its time: a record outside the scene is never followed)."""
        if prev in self.sd_dups:
            raise RejectError("bad_table", f"prev {prev!r} of {child}: sample_data token appears twice")
        if prev not in self.sd:
            raise RejectError("bad_table", f"prev {prev!r} of {child} is not a known sample_data token")
        rec = check_sd(self.sd[prev], f"sample_data {prev}")
        if self.channel_of(rec) != LIDAR_CHANNEL:
            raise RejectError("bad_table", f"prev {prev!r} of {child} is not a {LIDAR_CHANNEL} record")
        if self._scene(rec, f"sample_data {prev}") != scene:
            return None
        t_prev = timestamp_of(rec)
        if not t_prev < t_child:
            detail = f"prev {prev!r} of {child} is not earlier ({t_prev} >= {t_child}): broken/cyclic chain"
            raise RejectError("bad_table", detail)
        return rec, t_prev

    def _label_path(self, token: str) -> str | None:
        if token in self.label_dups:
            raise RejectError("bad_table", f"lidarseg.json lists sample_data {token} more than once")
        if token not in self.labels:
            return None
        try:
            return join_under_root(self.root, self.labels[token])
        except RejectError as err:
            raise RejectError(err.reason, f"lidarseg of {token}: {err.detail}") from None


def _read_table(
    dataroot: str, version: str, name: str, read_bytes: ReadBytes, optional: bool = False
) -> list[Any]:
    """The records of table ``name``; an ``optional`` table that is absent has none."""
    path = f"{root_of(dataroot)}/{version}/{name}.json"
    limit = f"{MAX_TABLE_BYTES >> 30} GiB" if MAX_TABLE_BYTES % (1 << 30) == 0 else f"{MAX_TABLE_BYTES} bytes"
    too_large = f"nuScenes table {path} is larger than {limit}, the limit for a table (MAX_TABLE_BYTES)"
    try:
        raw = read_bytes(path, MAX_TABLE_BYTES)
    except FileNotFoundError:
        if optional:
            return []
        why = " (is --nuscenes-version right?)"
        if name == "sample":  # read for the sweeps alone
            why = ": sweeps stay in their keyframe's scene, which it names (is --nuscenes-version right?)"
        raise ValueError(f"nuScenes table {path} not found{why}") from None
    except FileTooLargeError:
        raise ValueError(too_large) from None
    except OSError as err:
        raise ValueError(f"nuScenes table {path} could not be read: {err}") from err
    if len(raw) > MAX_TABLE_BYTES:  # a reader that ignored the limit
        raise ValueError(too_large)
    try:
        rows = loads(raw, f"nuScenes table {path}")
    except MemoryError:
        raise ValueError(
            f"nuScenes table {path} ({len(raw)} bytes) does not fit in memory once parsed"
        ) from None
    if not isinstance(rows, list):
        raise ValueError(f"nuScenes table {path} is not a JSON list of records")
    if _SURROGATE_ESCAPE.search(raw):  # a lone "\udcff" escape decodes to text no UTF-8 writer can hold
        try:
            json.dumps(rows, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(f"nuScenes table {path} holds a lone UTF-16 surrogate escape: {err}") from None
    return rows


def load_tasks(
    dataroot: str, version: str, sweeps: int, read_bytes: ReadBytes
) -> tuple[list[ScanTask], list[Reject]]:
    """One scan task per LIDAR_TOP keyframe of a nuScenes-style dataroot.

    O(records): every lookup is a dict; the prev walk is bounded by ``sweeps``.

    Args:
        dataroot: local path or URI of the dataset root (holds ``samples/``, ``sweeps/``, ``<version>/``).
        version: table folder name, e.g. ``v1.0-mini``; one path segment.
        sweeps: N >= 0 previous sweeps per keyframe, in addition to the keyframe (devkit nsweeps = N + 1).
        read_bytes: ``(path, limit)`` reads one whole file by full path/URI, never more than ``limit``
            bytes (``storage.read_bytes``); must raise ``FileNotFoundError`` for a missing file
            (``lidarseg.json`` is optional), ``FileTooLargeError`` for one over the limit, any other
            ``OSError`` for other read failures.

    Returns:
        (tasks sorted by sample_id, rejects as (path_or_record, reason, detail) sorted).

    Raises:
        ValueError: bad arguments, or a required table that is missing, unreadable, larger than
            ``MAX_TABLE_BYTES``, too large to parse in memory, or not a JSON list (one line naming it).
    """
    if isinstance(sweeps, bool) or not isinstance(sweeps, int) or sweeps < 0:
        raise ValueError(f"sweeps must be an int >= 0, got {sweeps!r}")
    if not version or "/" in version or version in (".", ".."):
        raise ValueError(f"nuScenes version {version!r} must be one folder name, e.g. v1.0-mini")
    names = ("sample_data", "calibrated_sensor", "sensor", "ego_pose", *(("sample",) if sweeps else ()))
    tables = {name: _read_table(dataroot, version, name, read_bytes) for name in names}
    tables.setdefault("sample", [])  # only sweeps need the scenes
    tables["lidarseg"] = _read_table(dataroot, version, "lidarseg", read_bytes, optional=True)
    db = _Tables(dataroot, version, tables)
    rejects: list[Reject] = list(db.label_rejects)
    by_sample: dict[str, ScanTask] = {}
    for i, row in enumerate(tables["sample_data"]):
        token = row.get("token") if isinstance(row, dict) else None
        name = name_of(token, i)
        ref = f"{db.ref}/sample_data.json#{name}"
        if isinstance(row, dict):
            if row.get("is_key_frame") is False:
                continue  # a sweep: reached only through a keyframe's prev chain
            channel = db.channel_of(row)
            if not isinstance(channel, str):  # a malformed sensor row must not hide its samples
                what = (
                    "unknown sensor channel"
                    if channel is None
                    else f"channel {short(channel)} is not a string"
                )
                rejects.append((ref, "bad_table", f"sample_data {name}: {what}"))
                continue
            if channel != LIDAR_CHANNEL:
                continue  # another sensor
        try:
            record = check_sd(row, f"sample_data {name}")
            path = join_under_root(dataroot, record["filename"])
        except RejectError as err:
            rejects.append((ref, err.reason, err.detail))
            continue
        if token in db.sd_dups and db.sd[token] is not row:
            rejects.append((path, "duplicate_id", f"sample_data token {token} appears more than once"))
            continue
        try:
            task = db.task(record, path, sweeps)
        except RejectError as err:
            rejects.append((path, err.reason, err.detail))
            continue
        except (
            TypeError,
            ValueError,
            OverflowError,
            KeyError,
            AttributeError,
        ) as err:  # any other malformed value
            rejects.append(
                (path, "bad_table", f"sample_data {token}: {type(err).__name__}: {str(err)[:200]}")
            )
            continue
        if task.sample_id in by_sample:
            first = by_sample[task.sample_id].path
            rejects.append((path, "duplicate_id", f"sample {task.sample_id} already has keyframe {first}"))
            continue
        by_sample[task.sample_id] = task
    return sorted(by_sample.values(), key=lambda t: t.sample_id), sorted(rejects)

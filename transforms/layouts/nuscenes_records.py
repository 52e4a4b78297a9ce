"""One nuScenes ``sample_data`` record checked, and a table filename joined under the dataroot (pure).

What ``lidarshard.transforms.layouts.nuscenes_tasks`` builds on: a record that is no JSON object, lacks or
mistypes a key, holds a non-finite timestamp or a token/filename longer than ``MAX_FIELD_CHARS`` is
``bad_table`` (an overlong value is named by its length, never copied); a filename outside the dataroot is
``outside_root``.
"""

from __future__ import annotations

import math
import posixpath
from typing import Any

from lidarshard.schemas.jsonsafe import short
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.io import storage

__all__ = [
    "MAX_FIELD_CHARS",
    "join_under_root",
    "root_of",
    "timestamp_of",
    "check_sd",
    "too_long",
    "name_of",
    "str_or_empty",
    "by_token",
]

#: Longest token or filename (characters) a sample_data/lidarseg row may hold; longer rejects the sample.
MAX_FIELD_CHARS = 4096
_SD_KEYS = (
    "token", "sample_token", "ego_pose_token", "calibrated_sensor_token",
    "filename", "timestamp", "is_key_frame", "prev",
)  # fmt: skip
_STR_KEYS = ("token", "sample_token", "ego_pose_token", "calibrated_sensor_token", "prev")
_BOUNDED_KEYS = (*_STR_KEYS, "filename")


def root_of(dataroot: str) -> str:
    """``dataroot`` without trailing slashes ("/" becomes "", so joins give "/name")."""
    if not dataroot:
        raise ValueError("dataroot must not be empty")
    return dataroot.rstrip("/")


def join_under_root(dataroot: str, filename: object) -> str:
    """Join a table ``filename`` under ``dataroot`` with ``/``, refusing anything outside it.

    Args:
        dataroot: local path or URI (``gs://bucket/root``); trailing slashes are ignored.
        filename: the table's relative filename, e.g. ``samples/LIDAR_TOP/x.pcd.bin``.

    Returns:
        ``<dataroot>/<normalized filename>``.

    Raises:
        RejectError: ``outside_root`` (absolute path, URI, or ``..`` escaping the root) or
            ``bad_table`` (not a non-empty string, longer than ``MAX_FIELD_CHARS``, NUL byte, names
            the root itself).
    """
    if not isinstance(filename, str) or not filename:
        raise RejectError("bad_table", f"filename {short(filename)} is not a non-empty string")
    if len(filename) > MAX_FIELD_CHARS:
        raise RejectError("bad_table", f"filename of {len(filename)} characters (limit {MAX_FIELD_CHARS})")
    if "\x00" in filename:
        raise RejectError("bad_table", f"filename {filename!r} holds a NUL byte")
    if filename.startswith("/") or storage.has_scheme(filename):
        raise RejectError("outside_root", f"filename {filename!r} is absolute, not relative to the dataroot")
    norm = posixpath.normpath(filename)
    if norm == ".." or norm.startswith("../"):
        raise RejectError("outside_root", f"filename {filename!r} normalizes outside the dataroot")
    if norm == ".":
        raise RejectError("bad_table", f"filename {filename!r} names the dataroot itself")
    return f"{root_of(dataroot)}/{norm}"


def timestamp_of(record: dict[str, Any]) -> float:
    """The ``timestamp`` of a checked record (µs); ``bad_table`` when it is no finite number."""
    ts = record["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        raise RejectError(
            "bad_table", f"sample_data {record['token']}: timestamp {short(ts)} is not a finite number"
        )
    return ts


def check_sd(record: object, what: str) -> dict[str, Any]:
    """Validate the keys and types of one sample_data record (``what`` names it in details)."""
    if not isinstance(record, dict):
        raise RejectError("bad_table", f"{what} is not a JSON object")
    missing = [k for k in _SD_KEYS if k not in record]
    if missing:
        raise RejectError("bad_table", f"{what} lacks keys {missing}")
    bad = [k for k in _STR_KEYS if not isinstance(record[k], str)]
    if bad or not isinstance(record["is_key_frame"], bool):
        raise RejectError("bad_table", f"{what} has mistyped keys {bad or ['is_key_frame']}")
    long = [f"{k} of {len(record[k])}" for k in _BOUNDED_KEYS if too_long(record[k])]
    if long:
        raise RejectError("bad_table", f"{what} holds {', '.join(long)} characters (limit {MAX_FIELD_CHARS})")
    return record


def too_long(value: object) -> bool:
    """``value`` is a string longer than ``MAX_FIELD_CHARS``."""
    return isinstance(value, str) and len(value) > MAX_FIELD_CHARS


def name_of(token: object, i: int) -> str:
    """How a row is named in paths and details: its token, or ``[i]`` when that is no usable string."""
    return token if isinstance(token, str) and not too_long(token) else f"[{i}]"


def str_or_empty(value: object) -> str:
    """``value`` if it is a string, else "" (a safe dict key for JSON values of any type)."""
    return value if isinstance(value, str) else ""


def by_token(rows: list[Any]) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """token -> first record with it, and the set of tokens that occur more than once."""
    index: dict[str, dict[str, Any]] = {}
    dups: set[str] = set()
    for row in rows:
        token = row.get("token") if isinstance(row, dict) else None
        if isinstance(token, str):
            if token in index:
                dups.add(token)
            else:
                index[token] = row
    return index, dups

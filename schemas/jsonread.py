"""Typed reads of parsed JSON: ``Reader``'s getters turn each malformed value into one ValueError line
naming the file and key; ``relpath_problem`` keeps a listed path inside its directory. Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from lidarshard.schemas.jsonsafe import short

__all__ = ["Reader", "number_ok", "relpath_problem"]


def number_ok(v: object) -> bool:
    """A finite JSON number (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class Reader:
    """Typed getters over one JSON object; every failure is one ValueError line naming ``where.key``."""

    def __init__(self, obj: Mapping[str, Any], where: str) -> None:
        self.obj, self.where = obj, where

    def fail(self, key: str, what: str, value: object) -> ValueError:
        return ValueError(f"{self.where}: {key} must be {what}, got {short(value)}")

    def int_(self, key: str, lo: int = 0, hi: int | None = None, value: object = None) -> int:
        v = self.obj.get(key) if value is None else value
        if type(v) is not int or v < lo or (hi is not None and v > hi):
            raise self.fail(key, f"an int >= {lo}" + (f" and <= {hi}" if hi is not None else ""), v)
        return v

    def ints(self, key: str, n: int | None, value: object = None) -> tuple[int, ...]:
        v = self.obj.get(key) if value is None else value
        if (
            not isinstance(v, list)
            or (n is not None and len(v) != n)
            or any(type(x) is not int or x < 0 for x in v)
        ):
            raise self.fail(key, f"a list of {'' if n is None else n} ints >= 0".replace("of  ", "of "), v)
        return tuple(v)

    def floats(self, key: str, value: object) -> tuple[float, ...]:
        if not (isinstance(value, list) and all(number_ok(x) for x in value)):
            raise self.fail(key, "a list of finite numbers", value)
        return tuple(float(x) for x in value)

    def number(self, key: str, optional: bool = False) -> float | None:
        v = self.obj.get(key)
        if v is None and optional:
            return None
        if not number_ok(v):
            raise self.fail(key, "a finite number" + (" or null" if optional else ""), v)
        assert isinstance(v, (int, float))
        return float(v)

    def str_(self, key: str, optional: bool = False) -> str | None:
        v = self.obj.get(key)
        if not (isinstance(v, str) or (optional and v is None)):
            raise self.fail(key, "a string" + (" or null" if optional else ""), v)
        return v

    def obj_(self, key: str, optional: bool = False) -> dict | None:
        v = self.obj.get(key)
        if not (isinstance(v, dict) or (optional and v is None)):
            raise self.fail(key, "a JSON object" + (" or null" if optional else ""), v)
        return v

    def sub(self, key: str) -> Reader:
        """A reader of the object at ``key`` (which must be one)."""
        obj = self.obj_(key)
        assert obj is not None
        return Reader(obj, f"{self.where}: {key}")


def relpath_problem(rel: object) -> str | None:
    """Why ``rel`` is not a plain path inside the manifest directory, or None.

    A listed file must stay inside OUT whatever joins it to OUT: a non-empty ``/``-separated relative
    path with no empty, ``.`` or ``..`` segment, no leading ``/``, no scheme or drive, no backslash
    and no NUL (lidarshard writes none of these; a forged ``files`` key must not point a reader or a
    publish at ``../../home``).
    """
    if not isinstance(rel, str) or not rel:
        return "is not a non-empty string"
    if rel.startswith("/") or "://" in rel or (len(rel) > 1 and rel[1] == ":" and rel[0].isalpha()):
        return "is absolute, not relative to the manifest directory"
    if "\\" in rel or "\0" in rel:
        return "holds a backslash or NUL"
    if any(seg in ("", ".", "..") for seg in rel.split("/")):
        return "has an empty, '.' or '..' segment (it must stay inside the manifest directory)"
    return None

"""Parse untrusted JSON (nuScenes tables, ``_manifest.json``, cost-model files) with bounded results. Pure.

``json.loads`` alone turns ``10**400`` into a 400-digit int (``float()`` of it raises OverflowError far
from the parser) and 100,000 nested ``[`` into a RecursionError traceback. ``loads`` parses integers
longer than ``MAX_INT_DIGITS`` digits as floats (``inf`` when out of range, which every numeric check
refuses as not finite) and turns too-deep nesting into one ``ValueError`` line. ``short`` is a repr for
error messages that is bounded in length and depth whatever the value holds.
"""

from __future__ import annotations

import json
import reprlib
from typing import Any

__all__ = ["MAX_INT_DIGITS", "loads", "short"]

#: Longer integer literals become floats: int64 holds 19 digits (up to 9223372036854775807).
MAX_INT_DIGITS = 19

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxstring, _repr.maxother, _repr.maxlist, _repr.maxdict = 3, 60, 60, 6, 6


def _int(text: str) -> int | float:
    return int(text) if len(text.lstrip("-")) <= MAX_INT_DIGITS else float(text)


def loads(raw: bytes | str, what: str) -> Any:
    """The JSON value in ``raw``; ``what`` names the source in the error.

    Raises:
        ValueError: not JSON, not UTF-8, or nested too deeply for the parser (one line, naming ``what``).
    """
    try:
        return json.loads(raw, parse_int=_int)
    except RecursionError:
        raise ValueError(f"{what} is not usable JSON: nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, int/str digit limits
        raise ValueError(f"{what} is not valid JSON: {str(err)[:200]}") from None


def short(value: object) -> str:
    """``repr(value)`` cut to a few levels and ~60 characters per item (safe for any parsed JSON)."""
    try:
        return _repr.repr(value)
    except RecursionError:
        return f"<{type(value).__name__} nested too deeply>"

"""The checks of a value a user gives, one rule per kind: ``check(text)`` reads a flag's text, ``check.value(v)``
the same value from Python (numpy numbers, 1-d arrays, ``os.PathLike``), with the same one line. Pure.
"""

from __future__ import annotations

import argparse
import math
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from lidarshard.transforms.io.paths import bad_path

__all__ = ["UsageError", "Check", "int_in", "float_in", "float_list", "choice", "path", "parsed_by", "per_name",
           "is_bool", "shown"]  # fmt: skip

_Bad = argparse.ArgumentTypeError


class UsageError(ValueError):
    """A flag, value or path the user gave is wrong; the message is one line naming it."""


def is_bool(value: Any) -> bool:  # numpy's too
    return isinstance(value, (bool, np.bool_))


def shown(value: Any) -> str:
    """``value`` as a message names it: one bounded line (an array by its shape)."""
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape}"
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= 80 and "\n" not in text else f"a {type(value).__name__}"


def _items(value: Any) -> list | None:
    """The items of a list, tuple or 1-d array (None for anything else)."""
    if isinstance(value, np.ndarray):
        return value.tolist() if value.ndim == 1 else None
    return list(value) if isinstance(value, (list, tuple)) else None


class Check:
    """How an option's value is read (text or Python; a str or path-like as text); ArgumentTypeError, one line."""

    __name__ = "value"

    def __call__(self, text: str) -> Any:
        raise NotImplementedError

    def value(self, value: Any) -> Any:
        value = os.fspath(value) if isinstance(value, os.PathLike) else value
        return self(value) if isinstance(value, str) else self.typed(value)

    def typed(self, value: Any) -> Any:
        raise _Bad(f"{shown(value)} is not a valid value")


class int_in(Check):  # noqa: N801 - reads as a function: check=int_in(1, 64)
    """An integer in ``[lo, hi]`` (``hi`` None: no bound); numpy integers too, never a bool."""

    __name__ = "int"

    def __init__(self, lo: int, hi: int | None = None) -> None:
        self.lo, self.hi = lo, hi
        self.allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"

    def __call__(self, text: str) -> int:
        try:
            return self.typed(int(text))
        except ValueError:
            raise _Bad(f"{text!r} is not {self.allowed}") from None

    def typed(self, value: Any) -> int:
        if is_bool(value) or not isinstance(value, numbers.Integral):
            raise _Bad(f"{str(value)!r} is not {self.allowed}")
        if not self.lo <= int(value) <= (int(value) if self.hi is None else self.hi):
            raise _Bad(f"{value} is out of range: must be {self.allowed}")
        return int(value)


def _finite(value: Any, allowed: str) -> float:
    """``value`` (text or a real number, numpy's too) as a finite float."""
    try:
        if is_bool(value) or not isinstance(value, (str, numbers.Real)):
            raise ValueError
        out = float(value)
    except ValueError:
        raise _Bad(f"{str(value)!r} is not a number: must be {allowed}") from None
    if not math.isfinite(out):
        raise _Bad(f"{value} is not finite: must be {allowed}")
    return out


class float_in(Check):  # noqa: N801
    """A finite float in ``[lo, hi]`` (``(lo, ...`` with ``above``; ``hi`` None: no bound)."""

    __name__ = "float"

    def __init__(self, lo: float, hi: float | None = None, *, above: bool = False) -> None:
        self.lo, self.hi, self.above = lo, hi, above
        low = f"> {lo:g}" if above else f">= {lo:g}"
        self.allowed = f"a finite number {low}" if hi is None else f"a finite number in [{lo:g}, {hi:g}]"

    def __call__(self, text: str) -> float:
        return self.typed(text)

    def typed(self, value: Any) -> float:
        out = _finite(value, self.allowed)
        if out < self.lo or (self.above and out == self.lo) or (self.hi is not None and out > self.hi):
            raise _Bad(f"{value} is out of range: must be {self.allowed}")
        return out


class float_list(Check):  # noqa: N801
    """Comma-separated finite floats (``count`` of them, each >= ``lo``); from Python a sequence."""

    __name__ = "list"

    def __init__(self, count: int | None = None, lo: float | None = None) -> None:
        self.count, self.lo = count, lo
        allowed = "comma-separated finite numbers" + (f" >= {lo:g}" if lo is not None else "")
        self.allowed = f"{count} {allowed}" if count else allowed

    def __call__(self, text: str) -> tuple[float, ...]:
        return self._checked(text.split(","), text)

    def typed(self, value: Any) -> tuple[float, ...]:
        items = _items(value)
        if items is None:
            raise _Bad(f"{shown(value)} is not a sequence of numbers: must be {self.allowed}")
        return self._checked(items, ",".join(map(str, items)))

    def _checked(self, items: list, shown: str) -> tuple[float, ...]:
        values = tuple(_finite(v, self.allowed) for v in items)
        if self.count and len(values) != self.count:
            raise _Bad(f"{shown!r} has {len(values)} values: must be {self.allowed}")
        if self.lo is not None and (not values or min(values) < self.lo):
            raise _Bad(f"{shown!r} is out of range: must be {self.allowed}")
        return values


class choice(Check):  # noqa: N801
    """One of ``choices`` (``--help`` lists them)."""

    def __init__(self, *choices: str) -> None:
        self.choices, self.__name__ = choices, "{" + ",".join(choices) + "}"

    def __call__(self, text: str) -> str:
        if text not in self.choices:
            raise _Bad(f"invalid choice: {text!r} is not one of {', '.join(self.choices)}")
        return text


class path(Check):  # noqa: N801
    """A path or URI (not empty, no NUL byte); ``many``: one or a list of them, as a tuple."""

    __name__ = "path"

    def __init__(self, many: bool = False) -> None:
        self.many = many

    def __call__(self, text: str) -> Any:
        problem = bad_path(text)
        if problem:
            raise _Bad(problem)
        return (text,) if self.many else text

    def typed(self, value: Any) -> Any:
        items = _items(value) if self.many else None
        if items is not None:
            return tuple(path().value(v) for v in items)
        raise _Bad(
            f"{shown(value)} is not a path: give a str or os.PathLike" + (" or a list of them" * self.many)
        )


class parsed_by(Check):  # noqa: N801
    """A value ``parse(text)`` reads; from Python ``typed(value)`` (both raising ValueError)."""

    def __init__(self, parse: Callable[[str], Any], typed: Callable[[Any], Any]) -> None:
        self._parse, self._typed, self.__name__ = parse, typed, parse.__name__

    def __call__(self, text: str) -> Any:
        try:
            return self._parse(text)
        except ValueError as e:
            raise _Bad(str(e)) from None

    def typed(self, value: Any) -> Any:
        try:
            return self._typed(value)
        except (TypeError, ValueError) as e:
            raise _Bad(str(e)) from None


class per_name(Check):  # noqa: N801
    """One value for every INPUT or sorted (NAME, value) pairs (``--sweeps 9``, ``nusc=9,kitti=0``, a dict)."""

    def __init__(self, each: Check, pairs: bool = False) -> None:
        self.each, self.pairs, self.__name__ = each, pairs, each.__name__

    def __call__(self, text: str) -> Any:
        if "=" not in text and not self.pairs:
            return self.each(text)
        items = [item.partition("=") for item in text.split(",")]
        bad = next((name + eq + value for name, eq, value in items if not (name and eq and value)), None)
        if bad is not None:
            raise _Bad(f"{text!r}: expected NAME=VALUE pairs separated by commas, got {bad!r}")
        if len({name for name, _, _ in items}) != len(items):
            raise _Bad(f"{text!r}: a NAME is given twice")
        return self.typed({name: value for name, _, value in items})

    def typed(self, value: Any) -> Any:
        if not isinstance(value, Mapping):
            if self.pairs:
                raise _Bad(f"{shown(value)} is not NAME=VALUE pairs (a dict from Python)")
            return self.each.value(value)
        out = []
        for name, one in value.items():
            if not isinstance(name, str) or not name:
                raise _Bad(f"{shown(name)} is not a NAME")
            try:
                out.append((name, self.each.value(one)))
            except _Bad as e:
                raise _Bad(f"{name}: {e}") from None
        return tuple(sorted(out))

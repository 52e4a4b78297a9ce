"""Configuration declared once: a frozen dataclass's :func:`option` fields carry their flag, keyword and check.

:class:`Parser` makes a command's flags and ``--help`` of them, :func:`from_flags` / :func:`from_keywords` the
dataclass (keywords checked as typed values, never as text); a ``__post_init__`` ValueError is a UsageError.
Parsers are strict: no abbreviations, an unknown flag refused with a "did you mean", one line, exit 2. Pure.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import re
import sys
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field
from typing import Any, NoReturn, TypeVar

from lidarshard import DEBUG_ENV
from lidarshard.transforms.value_checks import Check, UsageError, choice, is_bool, path, shown

__all__ = ["DEBUG_ENV", "Switch", "option", "switch", "nested", "options_of", "from_flags", "from_keywords",
           "keyword", "Parser", "add_flag"]  # fmt: skip

_T = TypeVar("_T")
_Bad = argparse.ArgumentTypeError


@dataclass(frozen=True)
class Switch:
    """A flag without a value setting its field to ``const`` (``--pad``: ``policy="pad"``; "": the field's flag)."""

    name: str
    const: Any
    help: str
    shown: str


@dataclass(frozen=True)
class _Spec:
    """How one field reads as a flag and a keyword (``flag`` None: ``--`` + the field name in kebab case)."""

    help: str
    check: Check | None = None
    flag: str | None = None
    group: str | None = None  # None: the group of the nested field holding it
    shown: str = ""  # how the default reads in --help
    metavar: str | None = None
    short: str | None = None
    positional: bool | str = False  # a positional argument: True one, "*" or "+" several
    exclusive: str | None = None  # a set of options of which at most one may be given
    switches: tuple[Switch, ...] = ()
    alone: str = ""  # an option of an optional nested dataclass given without the others: what it needs


def option(help: str, default: Any = MISSING, **kw: Any) -> Any:
    """A dataclass field that is an option (no ``default``: a required one)."""
    return field(default=default, metadata={"option": _Spec(help, **kw)})


def switch(help: str, **kw: Any) -> Any:
    """A bool field that is a flag without a value (``--data``): off unless given."""
    return option(help, False, switches=(Switch("", True, help, "off"),), **kw)


def nested(default: Any = MISSING, group: str | None = None) -> Any:
    """A field holding another option dataclass (default None: built when one of its options is given, then all)."""
    return field(default=default, metadata={"nested": group})


@dataclass(frozen=True)
class _Leaf:
    """An option as the parser and the keywords see it: keyword, field path (``route``), spec."""

    key: str
    route: tuple[str, ...]
    spec: _Spec
    default: Any
    group: str
    required: bool  # no default, in no optional nested dataclass

    @property
    def flag(self) -> str:
        return self.spec.flag or "--" + self.key.replace("_", "-")

    @property
    def name(self) -> str:  # how messages name it
        return self.key if self.spec.positional else self.flag


def options_of(cls: Any, group: str = "options", route: tuple[str, ...] = ()) -> tuple[_Leaf, ...]:
    """Every option of ``cls``, nested ones in place, in field order (``route``: the path of ``cls``)."""
    return _options_of(cls, group, route, False)


@functools.cache
def _options_of(cls: Any, group: str, route: tuple[str, ...], optional: bool) -> tuple[_Leaf, ...]:
    out: list[_Leaf] = []
    for f in dataclasses.fields(cls):
        here = (*route, f.name)
        if "nested" in f.metadata:
            inner = type_of(cls, f.name)
            out += _options_of(inner, f.metadata["nested"] or group, here, optional or f.default is None)
        elif "option" in f.metadata:
            spec = f.metadata["option"]
            key = (spec.flag or f.name).lstrip("-").replace("-", "_")
            named = tuple(
                dataclasses.replace(s, name=s.name or "--" + key.replace("_", "-")) for s in spec.switches
            )
            default = None if f.default is MISSING else f.default
            required = f.default is MISSING and not optional
            out.append(_Leaf(key, here, dataclasses.replace(spec, switches=named), default, spec.group or group,
                             required))  # fmt: skip
    return tuple(out)


def _checked(leaf: _Leaf, value: Any) -> Any:
    """One keyword argument's value, checked as the flag's text is."""
    try:
        if is_bool(value):
            raise _Bad(f"{shown(value)} is not a valid value")
        if leaf.spec.check is not None:
            return leaf.spec.check.value(value)
        if not isinstance(value, str):
            raise _Bad(f"{shown(value)} is not a valid value (a string)")
        return value
    except _Bad as e:
        said = str(e) if str(e).startswith(leaf.name + " ") else f"argument {leaf.name}: {e}"
        raise UsageError(said) from None


def keyword(cls: type, key: str, value: Any) -> Any:
    """``value`` of option ``key`` of ``cls`` checked as a keyword argument (UsageError naming it)."""
    return _checked(next(leaf for leaf in options_of(cls) if leaf.key == key), value)


def from_keywords(cls: type[_T], values: Mapping[str, Any]) -> _T:
    """``cls`` of the Python API's keywords (``bucket_weights=(1, 2)``, switches by name: ``pad=True``); None
    (False for a switch) leaves the default. UsageError: the command line's message for the same mistake."""
    leaves = {leaf.key: leaf for leaf in options_of(cls) if not leaf.spec.switches}
    switches = {
        s.name[2:].replace("-", "_"): (leaf, s) for leaf in options_of(cls) for s in leaf.spec.switches
    }
    given: dict[tuple[str, ...], Any] = {}
    named: list[str] = []
    for key, value in values.items():
        if key not in leaves and key not in switches:
            close = difflib.get_close_matches(key, [*leaves, *switches], n=1, cutoff=0.6)
            raise UsageError(f"unknown argument {key}" + (f"; did you mean {close[0]}?" if close else ""))
        if value is None or (key in switches and is_bool(value) and not value):
            continue
        if key in switches:
            leaf, s = switches[key]
            if not (is_bool(value) and value):
                raise UsageError(f"{s.name} is a switch: pass True, got {shown(value)}")
            given[leaf.route], name = s.const, s.name
        else:
            leaf = leaves[key]
            given[leaf.route], name = _checked(leaf, value), leaf.name
        named.append(name)
    sets: dict[str, list[str]] = {}  # flags of which at most one may be given
    for leaf in options_of(cls):
        if leaf.spec.switches or leaf.spec.exclusive:
            names = [s.name for s in leaf.spec.switches] or [leaf.flag]
            sets.setdefault(leaf.spec.exclusive or leaf.key, []).extend(names)
    for members in sets.values():
        both = [m for m in members if m in named]
        if len(both) > 1:
            raise UsageError(f"argument {both[1]}: not allowed with argument {both[0]}")
    return _build(cls, given)


def from_flags(cls: type[_T], ns: argparse.Namespace) -> _T:
    """``cls`` of parsed flags (each value was checked by the parser)."""
    given = {}
    for leaf in options_of(cls):
        value = getattr(ns, leaf.key)
        if value is not None and value != leaf.default:
            given[leaf.route] = tuple(value) if isinstance(value, list) else value
    return _build(cls, given)


def _build(cls: Any, given: Mapping[tuple[str, ...], Any], route: tuple[str, ...] = ()) -> Any:
    """``cls`` of the values ``given`` by field path (nested classes first)."""
    missing = [leaf.name for leaf in options_of(cls) if leaf.required and leaf.route not in given]
    if missing and not route:
        raise UsageError(f"the following arguments are required: {', '.join(missing)}")
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        here = (*route, f.name)
        if "nested" in f.metadata:
            inner = [leaf for leaf in options_of(cls, route=route) if leaf.route[: len(here)] == here]
            if f.default is not None or any(leaf.route in given for leaf in inner):
                first = next((leaf for leaf in inner if leaf.route in given), None)
                if f.default is None and first and not all(leaf.route in given for leaf in inner):
                    raise UsageError(f"{first.flag} {first.spec.alone}")
                kw[f.name] = _build(type_of(cls, f.name), given, here)
        elif here in given:
            kw[f.name] = given[here]
    try:
        return cls(**kw)
    except UsageError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from None


def type_of(cls: Any, name: str) -> Any:
    """The dataclass that nested field ``name`` of ``cls`` holds (``X | None``: X)."""
    hint = typing.get_type_hints(cls)[name]
    return next(
        a for a in (*typing.get_args(hint), hint) if isinstance(a, type) and dataclasses.is_dataclass(a)
    )


def add_flag(where: Any, names: Sequence[str], help: str, shown: str, **kw: Any) -> None:
    """One flag whose help ends with its default (``shown``), recorded for ``flag_table``."""
    if kw.get("required"):
        full, shown = f"{help} (required)", "required"
    else:
        full = help if kw.get("action") in ("store_true", "store_const") else f"{help} (default: {shown})"
    action = where.add_argument(*names, help=full, **kw)
    action.table_row = (help, shown)  # what flag_table prints


class _Formatter(argparse.RawDescriptionHelpFormatter):  # wraps help, keeping its line breaks
    def _split_lines(self, text: str, width: int) -> list[str]:
        split = super()._split_lines
        return [w for line in text.splitlines() for w in (split(line, width) or [""])]


class Parser(argparse.ArgumentParser):
    """A command's parser: ``--debug`` and the options of dataclass ``options`` in their groups; a bad flag exits
    2 with the usage and one line (``raise_errors``: raises UsageError, for the docs' test)."""

    DEBUG_MORE = ""  # what --debug also does

    def __init__(self, prog: str, description: str, options: type | None = None, **kw: Any) -> None:
        super().__init__(
            prog=prog, description=description, allow_abbrev=False, formatter_class=_Formatter, **kw
        )
        self.options, self.raise_errors = options, False
        self.elsewhere: dict[str, str] = {}  # flags of another command: {flag: what to say}
        # "-50,-50,-5,50,50,3" and "-1e-3" are values, not flags (argparse only knows "-5" and "-.5")
        self._negative_number_matcher = re.compile(r"^-\.?\d[\d.,eE+-]*$")
        add_flag(self, ["--debug"], f"show the full traceback of a failure (or set {DEBUG_ENV}=1){self.DEBUG_MORE}",
                 "off", action="store_true", default=False)  # fmt: skip
        self._add_common()
        groups: dict[str, Any] = {"options": self}
        exclusive: dict[str, Any] = {}
        for leaf in options_of(options) if options else ():
            self._declare(leaf, groups, exclusive)

    def _add_common(self) -> None:
        """Flags every command of this kind has, before its options (``BeamParser``: -v, --progress)."""

    def _declare(self, leaf: _Leaf, groups: dict[str, Any], exclusive: dict[str, Any]) -> None:
        spec, default = leaf.spec, leaf.default
        metavar = spec.metavar or (spec.check.__name__ if isinstance(spec.check, choice) else None)
        kw: dict[str, Any] = {"metavar": metavar, "type": spec.check} if spec.check else {"metavar": metavar}
        if spec.positional:  # several: each token one path (a keyword takes a list)
            many = spec.positional in ("*", "+")
            nargs, kw["type"] = (spec.positional, path()) if many else (None, spec.check or path())
            self.add_argument(leaf.key, nargs=nargs, help=spec.help, default=default, **kw)
            return
        group = groups.get(leaf.group) or groups.setdefault(leaf.group, self.add_argument_group(leaf.group))
        if spec.exclusive:  # argparse refuses two of a set (the keywords: from_keywords)
            group = exclusive.get(spec.exclusive) or exclusive.setdefault(
                spec.exclusive, group.add_mutually_exclusive_group()
            )
        elif len(spec.switches) > 1:
            group = group.add_mutually_exclusive_group()
        for s in spec.switches:
            add_flag(group, [s.name], s.help, s.shown, dest=leaf.key, action="store_const", const=s.const,
                     default=default)  # fmt: skip
        if not spec.switches:
            names = [spec.short, leaf.flag] if spec.short else [leaf.flag]
            shown = spec.shown or ("none" if default is None else str(default))
            add_flag(
                group, names, spec.help, shown, dest=leaf.key, default=default, required=leaf.required, **kw
            )

    def flag_table(self) -> str:
        """Markdown table of the flags (the README's, diffed by a test)."""
        rows = ["| flag | default | meaning |", "|---|---|---|"]
        for a in self._actions:
            if hasattr(a, "table_row") and a.option_strings:
                meaning, default = (t.replace("\n", "<br>").replace("|", "\\|") for t in a.table_row)
                rows.append(f"| {', '.join(f'`{s}`' for s in a.option_strings)} | {default} | {meaning} |")
        return "\n".join(rows)

    def known_flags(self) -> list[str]:
        return sorted(s for s in self._option_string_actions if s.startswith("--"))

    def parse(self, argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
        """(the flags, the tokens passed through: Beam's options in ``BeamParser``, none here)."""
        self._argv = sys.argv[1:] if argv is None else list(argv)
        args, extra = self.parse_known_args(self._argv)
        passed = list(vars(args).pop("_beam", None) or [])
        if extra:
            self.error(self._unknown(extra))
        return args, passed

    def read(self, argv: Sequence[str] | None) -> tuple[Any, list[str]]:
        """(the options dataclass of ``argv``, the tokens passed through); exits 2 on a broken rule."""
        args, passed = self.parse(argv)
        try:
            return from_flags(self.options, args), passed  # type: ignore[arg-type]
        except UsageError as e:
            self.error(str(e))

    def _unknown(self, extra: list[str]) -> str:
        flags = [e for e in extra if e.startswith("-")]
        if not flags:
            return f"unexpected argument {extra[0]!r}"
        name = flags[0].split("=", 1)[0]
        if name in self.elsewhere:
            return f"{name} {self.elsewhere[name]}"
        passed = {s for a in self._actions if a.dest == "_beam" for s in a.option_strings}
        ours = [f for f in self.known_flags() if f not in passed]  # a near miss of ours first
        close = (
            [f for f in ours if f.endswith("-" + name.lstrip("-"))][:1]  # --version: --nuscenes-version
            or difflib.get_close_matches(name, ours, n=1, cutoff=0.6)
            or difflib.get_close_matches(name, sorted(passed), n=1, cutoff=0.6)
        )
        return (
            f"unknown flag {name}"
            + (f"; did you mean {close[0]}?" if close else "")
            + f" (see {self.prog} --help)"
        )

    def error(self, message: str) -> NoReturn:
        """Usage + one line + exit 2; a required flag missing beside an unknown one names that (``--batch-sise``)."""
        if message.startswith("the following arguments are required"):
            unknown = [a for a in getattr(self, "_argv", []) if a.startswith("--")
                       and a.split("=", 1)[0] not in self._option_string_actions]  # fmt: skip
            message = self._unknown(unknown) if unknown else message
        message = re.sub(r"^argument (\S+): (?=\1 )", "", message)  # "--cost-model @x: ..." names it once
        if self.raise_errors:
            raise UsageError(message)
        super().error(message)

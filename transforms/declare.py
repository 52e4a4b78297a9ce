"""Configuration declared once: the fields of the frozen configs carry their flags, keywords and checks.

A field made with :func:`option` is an option of a command: its metadata says how it reads as a flag
(``--`` + its keyword in kebab case, help, metavar, group, how its default reads) and how a value is checked
(a ``value_checks.Check``). A field made with :func:`nested` composes another option dataclass
(``PlanConfig`` in the build's options, ``Caps`` in ``PlanConfig``), whose options are its own. From that one
declaration :class:`Parser` adds every flag to a command's parser (``--help``, the docs' tables),
:func:`from_flags` builds the dataclass from parsed flags and :func:`from_keywords` from the Python API's
keywords, checked as typed values, never as text. A rule a dataclass states in ``__post_init__`` (a
ValueError) is a ``UsageError`` when the values came from the user. Parsers are strict: no abbreviations,
an unknown flag refused with a "did you mean", one line and exit 2. Pure: no Beam.
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

from lidarshard.transforms.value_checks import Check, UsageError, choice, is_bool, path, shown

__all__ = ["DEBUG_ENV", "Switch", "option", "switch", "nested", "options_of", "from_flags", "from_keywords",
           "keyword", "Parser", "add_flag"]  # fmt: skip

#: Set to 1 to get the full traceback of a failed run (same as ``--debug``).
DEBUG_ENV = "LIDARSHARD_DEBUG"
_T = TypeVar("_T")
_Bad = argparse.ArgumentTypeError


@dataclass(frozen=True)
class Switch:
    """A flag without a value that sets its field to ``const`` (``--pad``: ``policy="pad"``; name "": the
    field's own flag)."""

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
    """A field holding another option dataclass, whose options are this class's too. Default None: optional,
    built when one of its options is given, and then each of them is needed."""
    return field(default=default, metadata={"nested": group})


@dataclass(frozen=True)
class _Leaf:
    """An option as a parser and the keywords see it: its keyword, its field path (``route``), its spec."""

    key: str
    route: tuple[str, ...]
    spec: _Spec
    default: Any
    group: str
    required: bool  # no default, in no optional nested dataclass
    optional: tuple[str, ...] | None  # the route of the optional nested dataclass holding it

    @property
    def flag(self) -> str:
        return self.spec.flag or "--" + self.key.replace("_", "-")

    @property
    def name(self) -> str:
        """How messages name it: the flag, or a positional's keyword."""
        return self.key if self.spec.positional else self.flag


def options_of(cls: Any, group: str = "options", route: tuple[str, ...] = ()) -> tuple[_Leaf, ...]:
    """Every option of ``cls``, nested ones in place, in field order (``route``: the path of ``cls``)."""
    return _options_of(cls, group, route, None)


@functools.cache
def _options_of(cls: Any, group: str, route: tuple[str, ...], optional: Any) -> tuple[_Leaf, ...]:
    out: list[_Leaf] = []
    for f in dataclasses.fields(cls):
        here = (*route, f.name)
        if "nested" in f.metadata:
            inner = type_of(cls, f.name)
            out += _options_of(
                inner, f.metadata["nested"] or group, here, optional or (here if f.default is None else None)
            )
        elif "option" in f.metadata:
            spec = f.metadata["option"]
            key = (spec.flag or f.name).lstrip("-").replace("-", "_")
            named = tuple(
                dataclasses.replace(s, name=s.name or "--" + key.replace("_", "-")) for s in spec.switches
            )
            default = None if f.default is MISSING else f.default
            required = f.default is MISSING and optional is None
            out.append(_Leaf(key, here, dataclasses.replace(spec, switches=named), default, spec.group or group,
                             required, optional))  # fmt: skip
    return tuple(out)


def _said(name: str, message: str) -> str:
    """``argument --flag: message``, the flag named once (a message may already start with it)."""
    return message if message.startswith(name + " ") else f"argument {name}: {message}"


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
        raise UsageError(_said(leaf.name, str(e))) from None


def keyword(cls: type, key: str, value: Any) -> Any:
    """``value`` of option ``key`` of ``cls`` checked as a keyword argument (UsageError naming it)."""
    return _checked(next(leaf for leaf in options_of(cls) if leaf.key == key), value)


def from_keywords(cls: type[_T], values: Mapping[str, Any]) -> _T:
    """``cls`` of the Python API's keyword arguments: option keywords (``bucket_weights=(1, 2)``) or switch
    names (``pad=True``); None (False for a switch) leaves the default.

    Raises:
        UsageError: an unknown name (with a "did you mean"), a value its check refuses, two options of one
            exclusive set, a required one missing, or a rule of the class (the command line's messages).
    """
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
    for members in _exclusive_sets(cls):
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
    """``cls`` with the values ``given`` by field path (nested classes first); a ValueError of a rule of a
    class is a UsageError."""
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


def _exclusive_sets(cls: type) -> list[list[str]]:
    """Flags of which at most one may be given: a field's switches, options sharing ``exclusive``."""
    sets: dict[str, list[str]] = {}
    for leaf in options_of(cls):
        if leaf.spec.switches:
            sets[leaf.key] = [s.name for s in leaf.spec.switches]
        elif leaf.spec.exclusive:
            sets.setdefault(leaf.spec.exclusive, []).append(leaf.flag)
    return list(sets.values())


# ------------------------------------------------------------------------------------------ the parser


def add_flag(where: Any, names: Sequence[str], help: str, shown: str, **kw: Any) -> None:
    """One flag whose help ends with its default (``shown``: how it reads), recorded for ``flag_table``."""
    if kw.get("required"):
        full, shown = f"{help} (required)", "required"
    else:
        full = help if kw.get("action") in ("store_true", "store_const") else f"{help} (default: {shown})"
    action = where.add_argument(*names, help=full, **kw)
    action.table_row = (help, shown)  # what flag_table prints


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Wraps help text but keeps its explicit line breaks (``--strategy`` lists one per line)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        split = super()._split_lines
        return [w for line in text.splitlines() for w in (split(line, width) or [""])]


class Parser(argparse.ArgumentParser):
    """A command's parser: ``--debug`` and the options of the dataclass ``options``, in field order and their
    groups. Strict: no abbreviations, an unknown flag or a bad value exits 2 with the usage and one line
    (``raise_errors``: raises UsageError instead, for the docs' test)."""

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
        """Add ``leaf``'s positional or flag(s)."""
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
        """(the options dataclass of ``argv``, the tokens passed through); a rule of the options broken exits 2
        as a bad flag does."""
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

    def fail(self, message: str) -> NoReturn:
        """A usage error found after parsing (paths, rules between options): usage + one line, exit 2."""
        self.error(message)

    def error(self, message: str) -> NoReturn:
        """argparse's usage + one line + exit 2 (UsageError with ``raise_errors``). A required flag reported
        missing while an unknown flag was given names the unknown one (a typo: ``--batch-sise``)."""
        if message.startswith("the following arguments are required"):
            unknown = [a for a in getattr(self, "_argv", []) if a.startswith("--")
                       and a.split("=", 1)[0] not in self._option_string_actions]  # fmt: skip
            message = self._unknown(unknown) if unknown else message
        message = re.sub(r"^argument (\S+): (?=\1 )", "", message)  # "--cost-model @x: ..." names it once
        if self.raise_errors:
            raise UsageError(message)
        super().error(message)

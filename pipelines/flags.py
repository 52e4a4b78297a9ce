"""The command lines of ``scan``, ``build`` and ``synth``: flags declared once, strict, with Beam's options
passed through; the same validators check the Python API's keyword arguments.

Flags are declared once, as fields of the options dataclasses (``lidarshard.pipelines.options``),
which :func:`flag` adds to a parser (name, validator, default, help): the help text always shows the
default, and a bad value stops the command before Beam starts with one line that names the flag, the
value and the allowed range. :class:`CommandParser` accepts our flags and the real Beam pipeline
options (``--runner``, ``--temp_location``, ...), passed through untouched; anything else — a typo
such as ``--sweps`` or ``--temp_locaton`` — exits 2 with the usage line and a "did you mean"
suggestion. Abbreviations are never matched. The validators (:class:`int_in`, ...) also check a typed
value, so the Python API's keyword arguments get the command line's checks and messages without
being turned into text.

Our flags are parsed with plain argparse rather than a ``PipelineOptions`` subclass on purpose:
Beam registers every ``PipelineOptions`` subclass in one global parser, so two subcommands that
both define ``--seed`` (or a positional INPUT) would collide inside runners.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib
import math
import numbers
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lidarshard.pipelines import DEBUG_ENV

__all__ = [
    "DEBUG_ENV",
    "UsageError",
    "CommandParser",
    "flag",
    "Check",
    "int_in",
    "float_in",
    "float_list",
    "parsed_by",
    "per_name",
]


_BEAM_EPILOG = (
    "Beam pipeline options pass through to the runner (e.g. --runner=FnApiRunner, --direct_num_workers=2, "
    "Dataflow's --project/--region/--temp_location), listed in apache_beam.options.pipeline_options and at "
    "https://beam.apache.org/documentation/runners/. Unknown flags are refused, never dropped."
)


class UsageError(ValueError):
    """A flag, value or path the user gave is wrong; the message is one line naming it."""


# ---------------------------------------------------------------------------------------- flag values


class Check:
    """An argparse ``type=`` that also checks a typed value: ``check(text)`` parses a flag's text,
    ``check.value(v)`` takes the same value from the Python API (no text in between). Both raise
    ``argparse.ArgumentTypeError`` with the same one line for the same value."""

    __name__ = "value"

    def __call__(self, text: str) -> Any:
        raise NotImplementedError

    def value(self, value: Any) -> Any:
        """``value`` given as Python data (a string is parsed as the command line's text)."""
        return self(value) if isinstance(value, str) else self.typed(value)

    def typed(self, value: Any) -> Any:
        raise argparse.ArgumentTypeError(f"{value!r} is not a valid value")


class int_in(Check):  # noqa: N801 - reads as the function it replaced: type=int_in(1, 64)
    """An integer in ``[lo, hi]`` (no upper bound when ``hi`` is None)."""

    __name__ = "int"

    def __init__(self, lo: int, hi: int | None = None) -> None:
        self.lo, self.hi = lo, hi
        self.allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {self.allowed}") from None
        return self._within(value, text)

    def typed(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise argparse.ArgumentTypeError(f"{str(value)!r} is not {self.allowed}")
        return self._within(int(value), str(value))

    def _within(self, value: int, shown: str) -> int:
        if value < self.lo or (self.hi is not None and value > self.hi):
            raise argparse.ArgumentTypeError(f"{shown} is out of range: must be {self.allowed}")
        return value


def _finite(value: Any, shown: str, allowed: str) -> float:
    """``value`` (text or a number) as a finite float; raises naming ``shown``."""
    try:
        if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
            raise ValueError
        out = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown!r} is not a number: must be {allowed}") from None
    if not math.isfinite(out):
        raise argparse.ArgumentTypeError(f"{shown} is not finite: must be {allowed}")
    return out


class float_in(Check):  # noqa: N801
    """A finite float in ``[lo, hi]`` (``(lo, ...`` with ``above``; no upper bound when ``hi`` is None)."""

    __name__ = "float"

    def __init__(self, lo: float, hi: float | None = None, *, above: bool = False) -> None:
        self.lo, self.hi, self.above = lo, hi, above
        low = f"> {lo:g}" if above else f">= {lo:g}"
        self.allowed = f"a finite number {low}" if hi is None else f"a finite number in [{lo:g}, {hi:g}]"

    def __call__(self, text: str) -> float:
        return self._within(_finite(text, text, self.allowed), text)

    def typed(self, value: Any) -> float:
        return self._within(_finite(value, str(value), self.allowed), str(value))

    def _within(self, value: float, shown: str) -> float:
        lo, hi = self.lo, self.hi
        if value < lo or (self.above and value == lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{shown} is out of range: must be {self.allowed}")
        return value


class float_list(Check):  # noqa: N801
    """Comma-separated finite floats (exactly ``count`` of them, each >= ``lo``); a sequence of
    numbers from the Python API."""

    __name__ = "list"

    def __init__(self, count: int | None = None, lo: float | None = None) -> None:
        self.count, self.lo = count, lo
        allowed = "comma-separated finite numbers" + (f" >= {lo:g}" if lo is not None else "")
        self.allowed = f"{count} {allowed}" if count else allowed

    def __call__(self, text: str) -> tuple[float, ...]:
        return self._checked(text.split(","), text)

    def typed(self, value: Any) -> tuple[float, ...]:
        if not isinstance(value, Sequence):
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a sequence of numbers: must be {self.allowed}"
            )
        return self._checked(list(value), ",".join(map(str, value)))

    def _checked(self, items: list, shown: str) -> tuple[float, ...]:
        values = tuple(_finite(v, str(v), self.allowed) for v in items)
        if self.count and len(values) != self.count:
            raise argparse.ArgumentTypeError(f"{shown!r} has {len(values)} values: must be {self.allowed}")
        if self.lo is not None and (not values or min(values) < self.lo):
            raise argparse.ArgumentTypeError(f"{shown!r} is out of range: must be {self.allowed}")
        return values


class parsed_by(Check):  # noqa: N801
    """A value ``parse(text)`` reads (raising ValueError); the Python API may give the parsed value
    itself, checked by ``typed(value)``."""

    def __init__(self, parse: Callable[[str], Any], typed: Callable[[Any], Any]) -> None:
        self._parse, self._typed = parse, typed
        self.__name__ = parse.__name__

    def __call__(self, text: str) -> Any:
        try:
            return self._parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    def typed(self, value: Any) -> Any:
        try:
            return self._typed(value)
        except (TypeError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None


class per_name(Check):  # noqa: N801
    """One value for everything, or ``NAME=V,...`` one per name (``--sweeps 9`` or ``nusc=9,kitti=0``): the
    value as ``each`` checks it, or sorted (name, value) pairs; the Python API may give a mapping."""

    def __init__(self, each: Check) -> None:
        self.each, self.__name__ = each, each.__name__

    def __call__(self, text: str) -> Any:
        if "=" not in text:
            return self.each(text)
        pairs = [item.partition("=") for item in text.split(",")]
        if not all(name and eq and value for name, eq, value in pairs):
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected a value, or NAME=VALUE pairs separated by commas"
            )
        names = [name for name, _, _ in pairs]
        if len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"{text!r}: a NAME is given twice")
        return self.typed({name: value for name, _, value in pairs})

    def typed(self, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return self.each.value(value)
        out = []
        for name, one in value.items():
            if not isinstance(name, str) or not name:
                raise argparse.ArgumentTypeError(f"{name!r} is not a NAME")
            try:
                out.append((name, self.each.value(one)))
            except argparse.ArgumentTypeError as e:
                raise argparse.ArgumentTypeError(f"{name}: {e}") from None
        return tuple(sorted(out))


def flag(
    group: argparse._ActionsContainer,
    name: str,
    help: str,
    *,
    default: Any = None,
    shown: str = "",
    short: str | None = None,
    **kw: Any,
) -> argparse.Action:
    """Declare one flag (``short``: its one-letter alias, ``-v``): its help always ends with its default
    (``shown`` overrides how it reads)."""
    text = shown or ("none" if default is None else str(default))
    full = help
    if kw.get("required"):
        full, text = f"{help} (required)", "required"
    elif kw.get("action") not in ("store_true", "store_const"):
        full = f"{help} (default: {text})"
    names = (short, name) if short else (name,)
    action = group.add_argument(*names, default=default, help=full, **kw)
    setattr(action, "table_row", (help, text))  # noqa: B010 - what flag_table prints
    return action


# ---------------------------------------------------------------------------------- Beam pass-through


class _BeamFlag(argparse.Action):
    """A Beam pipeline option: records the tokens as given (Beam parses and checks them itself)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        tokens = list(getattr(namespace, "_beam", None) or [])
        if self.nargs == 0 or values is None:
            tokens.append(option_string)
        elif isinstance(values, str):
            tokens.append(f"{option_string}={values}")
        else:
            tokens += [option_string, *values]
        namespace._beam = tokens


#: Beam modules that define ``PipelineOptions`` of a runner outside ``pipeline_options``.
_RUNNER_OPTION_MODULES = ("apache_beam.runners.dask.dask_runner",)


@functools.lru_cache(maxsize=1)
def _beam_option_actions() -> tuple[tuple[tuple[str, ...], int | str | None], ...]:
    """(option strings, nargs) of every Beam pipeline option (Beam's own classes, not ours)."""
    from apache_beam.options import pipeline_options as po

    for module in _RUNNER_OPTION_MODULES:  # options classes Beam defines beside their runners
        try:
            importlib.import_module(module)
        except ImportError:  # that runner's extra is not installed: its flags are unknown here too
            pass

    parser = po._BeamArgumentParser(allow_abbrev=False, add_help=False)
    seen: dict[str, type] = {}
    for cls in po.PipelineOptions.__subclasses__():
        if cls.__module__.startswith("apache_beam."):
            seen.setdefault(f"{cls.__module__}.{cls.__qualname__}", cls)
    for cls in seen.values():
        cls._add_argparse_args(parser)
    return tuple((tuple(a.option_strings), a.nargs) for a in parser._actions if a.option_strings)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Wraps help text but keeps its explicit line breaks (``--strategy`` lists one per line)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        split = super()._split_lines
        return [w for line in text.splitlines() for w in (split(line, width) or [""])]


class CommandParser(argparse.ArgumentParser):
    """argparse for one command: our flags, Beam's options passed through, nothing else."""

    def __init__(self, prog: str, description: str, *, beam: bool = True, **kw: Any) -> None:
        kw.setdefault("formatter_class", _Formatter)
        super().__init__(
            prog=prog,
            description=description,
            allow_abbrev=False,
            epilog=_BEAM_EPILOG if beam else None,
            **kw,
        )
        self._beam = beam
        self.raise_errors = False  # the Python API sets it: UsageError instead of exit 2
        # "-50,-50,-5,50,50,3" and "-1e-3" are values, not flags (argparse only knows "-5" and "-.5")
        self._negative_number_matcher = re.compile(r"^-\.?\d[\d.,eE+-]*$")
        flag(self, "--debug", f"show the full traceback of a failure (or set {DEBUG_ENV}=1); implies --verbose",
             action="store_true", default=False, shown="off")  # fmt: skip
        if beam:  # what the run shows (read before Beam is imported: lidarshard.pipelines.cli.main)
            flag(self, "--verbose", "show Beam's, Dask's and the workers' log lines, hidden by default",
                 short="-v", action="store_true", default=False, shown="off")  # fmt: skip
            flag(self, "--progress", "draw the progress line (work done of total, rate, ETA) also when "
                 "stderr is not a terminal: a line every 10 s and the last one", action="store_true",
                 default=False, shown="on a terminal")  # fmt: skip

    def _add_beam_options(self) -> None:
        mine = set(self._option_string_actions)
        for strings, nargs in _beam_option_actions():
            if not mine.intersection(strings):  # ours win (synth's --labels is not Dataflow's)
                self.add_argument(
                    *strings, action=_BeamFlag, nargs=nargs, dest="_beam", help=argparse.SUPPRESS
                )

    def flag_table(self) -> str:
        """Markdown table of the flags declared with :func:`flag` (docs/CLI.md's, diffed by a test)."""
        rows = ["| flag | default | meaning |", "|---|---|---|"]
        for a in self._actions:
            if hasattr(a, "table_row"):
                meaning, default = (t.replace("\n", "<br>").replace("|", "\\|") for t in a.table_row)
                names = ", ".join(f"`{s}`" for s in a.option_strings)
                rows.append(f"| {names} | {default} | {meaning} |")
        return "\n".join(rows)

    def known_flags(self) -> list[str]:
        return sorted(s for s in self._option_string_actions if s.startswith("--"))

    def parse(self, argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
        """(our args, Beam argv). Exits 2 with usage + one line on an unknown flag or a bad value."""
        if self._beam and "--runner" not in self._option_string_actions:
            self._add_beam_options()
        self._argv = sys.argv[1:] if argv is None else list(argv)
        args, extra = self.parse_known_args(self._argv)
        beam_argv = list(getattr(args, "_beam", None) or [])
        if hasattr(args, "_beam"):
            delattr(args, "_beam")
        if extra:
            self.error(self._unknown(extra))
        return args, beam_argv

    def _unknown(self, extra: list[str]) -> str:
        flags = [e for e in extra if e.startswith("-")]
        if not flags:
            return f"unexpected argument {extra[0]!r}"
        name = flags[0].split("=", 1)[0]
        beam = self._beam_strings()
        ours = [f for f in self.known_flags() if f not in beam]  # a near miss of ours first
        ending = [f for f in ours if f.endswith("-" + name.lstrip("-"))]  # --version: --nuscenes-version
        close = (
            ending[:1]
            or difflib.get_close_matches(name, ours, n=1, cutoff=0.6)
            or difflib.get_close_matches(name, sorted(beam), n=1, cutoff=0.6)
        )
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"unknown flag {name}{hint} (see {self.prog} --help)"

    def _beam_strings(self) -> set[str]:
        return {s for a in self._actions if a.dest == "_beam" for s in a.option_strings}

    def fail(self, message: str) -> None:
        """Usage error found after parsing (paths, cross-flag checks): usage + one line, exit 2."""
        self.error(message)

    def error(self, message: str):
        """argparse's usage + one line + exit 2; raises UsageError instead for the Python API. A
        required flag reported missing while an unknown flag was given names the unknown one (a typo
        of the required flag: ``--batch-sise``)."""
        if message.startswith("the following arguments are required"):
            argv = getattr(self, "_argv", [])
            unknown = [
                a
                for a in argv
                if a.startswith("--") and a.split("=", 1)[0] not in self._option_string_actions
            ]
            message = self._unknown(unknown) if unknown else message
        if self.raise_errors:
            raise UsageError(message)
        super().error(message)

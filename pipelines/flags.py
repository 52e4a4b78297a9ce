"""The command lines of ``scan``, ``build`` and ``synth``: flags declared once, strict, with Beam's options
passed through; the same declarations check the Python API's keyword arguments.

Flags are declared once with :func:`flag` (name, parser/validator, default, help): the help text
always shows the default, and a bad value stops the command before Beam starts with one line that
names the flag, the value and the allowed range. :class:`CommandParser` accepts our flags and the
real Beam pipeline options (``--runner``, ``--temp_location``, ...), passed through untouched;
anything else — a typo such as ``--sweps`` or ``--temp_locaton`` — exits 2 with the usage line and a
"did you mean" suggestion. Abbreviations are never matched. :meth:`CommandParser.namespace` takes
keyword arguments (``bucket_weights=(1, 2)``, ``pad=True``) through the same declarations and
validators, for ``lidarshard.build`` and ``lidarshard.write_manifest``.

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
    "int_in",
    "float_in",
    "float_list",
]


_BEAM_EPILOG = (
    "Beam pipeline options pass through to the runner (e.g. --runner=FnApiRunner, --direct_num_workers=2, "
    "Dataflow's --project/--region/--temp_location), listed in apache_beam.options.pipeline_options and at "
    "https://beam.apache.org/documentation/runners/. Unknown flags are refused, never dropped."
)


class UsageError(ValueError):
    """A flag, value or path the user gave is wrong; the message is one line naming it."""


# ---------------------------------------------------------------------------------------- flag values


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """argparse ``type=``: an integer in ``[lo, hi]`` (no upper bound when ``hi`` is None)."""
    allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {allowed}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{text} is out of range: must be {allowed}")
        return value

    parse.__name__ = "int"
    return parse


def _finite(text: str, allowed: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: must be {allowed}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not finite: must be {allowed}")
    return value


def float_in(lo: float, hi: float | None = None, *, above: bool = False) -> Callable[[str], float]:
    """argparse ``type=``: a finite float in ``[lo, hi]`` (``(lo, ...`` with ``above``; no upper
    bound when ``hi`` is None)."""
    low = f"> {lo:g}" if above else f">= {lo:g}"
    allowed = f"a finite number {low}" if hi is None else f"a finite number in [{lo:g}, {hi:g}]"

    def parse(text: str) -> float:
        value = _finite(text, allowed)
        if value < lo or (above and value == lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{text} is out of range: must be {allowed}")
        return value

    parse.__name__ = "float"
    return parse


def float_list(count: int | None = None, lo: float | None = None) -> Callable[[str], tuple[float, ...]]:
    """argparse ``type=``: comma-separated finite floats (exactly ``count`` of them, each >= ``lo``)."""
    allowed = "comma-separated finite numbers" + (f" >= {lo:g}" if lo is not None else "")
    allowed = f"{count} {allowed}" if count else allowed

    def parse(text: str) -> tuple[float, ...]:
        values = tuple(_finite(v, allowed) for v in text.split(","))
        if count and len(values) != count:
            raise argparse.ArgumentTypeError(f"{text!r} has {len(values)} values: must be {allowed}")
        if lo is not None and min(values) < lo:
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: must be {allowed}")
        return values

    parse.__name__ = "list"
    return parse


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
        """Markdown table of the flags declared with :func:`flag` (the README's, diffed by a test)."""
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

    def namespace(self, positional: Mapping[str, Any], values: Mapping[str, Any]) -> argparse.Namespace:
        """The Namespace the command line would give, from keyword arguments: ``values`` are flags in
        snake case (``bucket_weights=(1, 2)``, ``pad=True``), each checked by its declared validator;
        ``positional`` sets the positional destinations as they are.

        Raises:
            UsageError: an unknown name (with a "did you mean"), a value the flag refuses, or two
                flags of one mutually exclusive group (the CLI's messages).
        """
        ns = argparse.Namespace(
            **{a.dest: a.default for a in self._actions if a.dest not in ("help", "_beam")}
        )
        for dest, value in positional.items():
            setattr(ns, dest, value)
        given: list[argparse.Action] = []
        for key, value in values.items():
            name = "--" + key.replace("_", "-")
            action = self._option_string_actions.get(name)
            if action is None or action.dest in ("_beam", "help"):
                raise UsageError(self._unknown_key(key))
            if value is None or value is False:
                continue
            given.append(action)
            setattr(ns, action.dest, _value(action, name, value))
        for group in self._mutually_exclusive_groups:
            both = [a for a in group._group_actions if a in given]
            if len(both) > 1:
                raise UsageError(
                    f"argument {both[1].option_strings[0]}: not allowed with argument {both[0].option_strings[0]}"
                )
        return ns

    def _unknown_key(self, key: str) -> str:
        ours = [s[2:].replace("-", "_") for s in self.known_flags() if s not in self._beam_strings()]
        close = difflib.get_close_matches(key, ours, n=1, cutoff=0.6)
        return f"unknown argument {key}" + (f"; did you mean {close[0]}?" if close else "")

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


def _value(action: argparse.Action, name: str, value: Any) -> Any:
    """A keyword argument's value for ``action``, checked the way the command line checks its text."""
    if action.nargs == 0:  # store_true / store_const
        if value is not True:
            raise UsageError(f"{name} is a switch: pass True, got {value!r}")
        return action.const
    if isinstance(value, bool):
        raise UsageError(f"argument {name}: {value!r} is not a valid value")
    text = (
        ",".join(repr(v) if isinstance(v, float) else str(v) for v in value)
        if isinstance(value, (list, tuple))
        else str(value)
    )
    if isinstance(value, float):
        text = repr(value)
    try:
        converted = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, ValueError) as e:
        raise UsageError(f"argument {name}: {e}") from None
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(map(repr, action.choices))
        raise UsageError(f"argument {name}: invalid choice: {converted!r} (choose from {choices})")
    return converted

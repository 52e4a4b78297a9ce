"""The one launcher of the Beam commands (``scan``, ``build``, ``synth``): strict flags, Beam
options, staging, run and publish.

Flags are declared once with :func:`flag` (name, parser/validator, default, help): the help text
always shows the default, and a bad value stops the command before Beam starts with one line that
names the flag, the value and the allowed range. :class:`CommandParser` accepts our flags and the
real Beam pipeline options (``--runner``, ``--temp_location``, ...), passed through untouched;
anything else — a typo such as ``--sweps`` or ``--temp_locaton`` — exits 2 with the usage line and a
"did you mean" suggestion. Abbreviations are never matched.

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
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from lidarshard import __version__
from lidarshard.pipelines.cli import DEBUG_ENV
from lidarshard.transforms import storage

__all__ = [
    "VERSION",
    "DRY_RUN_NOTE",
    "DEBUG_ENV",
    "UsageError",
    "CommandParser",
    "flag",
    "int_in",
    "float_in",
    "float_list",
    "beam_options",
    "dry_run_requested",
    "rejects_path",
    "new_staging",
    "run_pipeline",
    "settle_or_stop",
    "counts_or_stop",
]

VERSION = __version__
DRY_RUN_NOTE = "dry run: the runner built the job graph; nothing ran and nothing was written"
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
    **kw: Any,
) -> argparse.Action:
    """Declare one flag: its help always ends with its default (``shown`` overrides how it reads)."""
    text = shown or ("none" if default is None else str(default))
    full = help
    if kw.get("required"):
        full, text = f"{help} (required)", "required"
    elif kw.get("action") not in ("store_true", "store_const"):
        full = f"{help} (default: {text})"
    action = group.add_argument(name, default=default, help=full, **kw)
    action.table_row = (help, text)  # what flag_table prints
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
        flag(self, "--debug", f"show the full traceback of a failure (or set {DEBUG_ENV}=1)", action="store_true",
             default=False, shown="off")  # fmt: skip

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
                rows.append(f"| `{a.option_strings[0]}` | {default} | {meaning} |")
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
        beam = {s for a in self._actions if a.dest == "_beam" for s in a.option_strings}
        ours = [f for f in self.known_flags() if f not in beam]  # a near miss of ours first
        close = difflib.get_close_matches(name, ours, n=1, cutoff=0.6) or difflib.get_close_matches(
            name, sorted(beam), n=1, cutoff=0.6
        )
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"unknown flag {name}{hint} (see {self.prog} --help)"

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


# ------------------------------------------------------------------------------------ options and run


def beam_options(beam_args: Sequence[str], default_runner: Sequence[str] | None = None):
    """Beam options; without ``--runner`` the local DirectRunner on all cores (multi_processing),
    or ``default_runner`` when given; runner aliases (``--runner=dask``) resolved (``pipelines.runners``)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from lidarshard.pipelines.runners import resolve_runner

    args = resolve_runner(beam_args)  # --runner=dask is Beam's DaskRunner
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args += list(default_runner) if default_runner is not None else [
            "--runner=DirectRunner",
            "--direct_running_mode=multi_processing",
            f"--direct_num_workers={os.cpu_count() or 1}",
        ]  # fmt: skip
    return PipelineOptions(args)


def _dry_run(options) -> bool:
    from apache_beam.options.pipeline_options import TestOptions

    return bool(options.view_as(TestOptions).dry_run)


def dry_run_requested(beam_argv: Sequence[str]) -> bool:
    """True when the Beam flags ask for ``--dry_run``: the job graph only, no data touched."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return _dry_run(PipelineOptions(list(beam_argv)))


#: Scratch directory inside a staging directory (scan shards, plan pieces); removed before publishing.
WORK_DIR = "_work"


def rejects_path(out: str) -> str:
    """Where a run stopped by ``--max-reject-fraction`` leaves its rejects (beside OUT, not in it)."""
    return out.rstrip("/") + ".rejects.parquet"


def new_staging(options, out: str) -> str:
    """``_output.new_staging(out)`` after removing a stale ``rejects_path(out)`` of an earlier failed
    run; under ``--dry_run`` only a name, touching nothing (a dry run works offline, publishes nothing)."""
    from lidarshard.pipelines import _output

    if _dry_run(options):
        return f"{out.rstrip('/')}.staging-dryrun"
    storage.delete([rejects_path(out)]) if storage.exists(rejects_path(out)) else None
    return _output.new_staging(out)


def _check_staged(staging: str) -> None:
    """Refuse to publish what ``lidarshard validate`` would reject: the same checks, on the staged copy.

    Raises:
        RuntimeError: one line naming the first problem and how many more there are.
    """
    from lidarshard.pipelines.tools.validate import validate

    problems, _ = validate(staging)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise RuntimeError(f"the output fails validation, nothing was published: {problems[0]}{more}")


def run_pipeline(pipeline, staging: str, out: str) -> bool:
    """Run ``pipeline`` (which writes into ``staging``), then publish it as ``out`` or discard it.

    Returns False for ``--dry_run``: the runner built the job, nothing ran, nothing is published
    (publishing would replace ``out`` with an empty directory).
    """
    from apache_beam.runners.runner import PipelineState

    from lidarshard import schemas
    from lidarshard.pipelines import _output
    from lidarshard.pipelines._lifeline import interruptible

    if _dry_run(pipeline.options):
        try:
            pipeline.run().wait_until_finish()  # only DataflowRunner honours --dry_run; others run
        finally:
            if storage.is_local(staging):
                _output.discard(staging)
        return False
    try:
        with interruptible(lambda: _output.discard(staging), f"nothing was published ({out} is unchanged)"):
            result = pipeline.run()
            result.wait_until_finish()
            if result.state != PipelineState.DONE:
                raise RuntimeError(f"the pipeline ended in state {result.state}; nothing was published")
            storage.write_bytes(storage.join(staging, schemas.SUCCESS_FILE), b"")
            _check_staged(staging)
    except BaseException:
        _output.discard(staging)
        raise
    _output.commit(staging, out)
    return True


def settle_or_stop(
    scanned: int, samples, rejects, max_reject: float, rejects_out: str, screen: Callable | None = None
) -> tuple:
    """``settle`` (then ``screen(samples, rejects) -> (samples, rejects)``, e.g. the over-cap
    rejects, and the counts again); when too many inputs were rejected, write them all to
    ``rejects_out`` (beside OUT, never published) and fail with a message that names it."""
    from lidarshard.transforms.features.accounting import counts_of, settle

    def settled() -> tuple:
        if screen is None:
            return settle(scanned, samples, rejects, max_reject)
        kept, out, _ = settle(scanned, samples, rejects, 1.0)
        kept, out = screen(kept, out)
        return kept, out, counts_of(scanned, kept.num_rows, out, max_reject)

    return _or_stop(settled, rejects_out)


def counts_or_stop(scanned: int, accepted: int, rejects, max_reject: float, rejects_out: str) -> dict:
    """``counts_of`` for ``accepted`` samples that are not in one table; stops as ``settle_or_stop``."""
    from lidarshard.transforms.features.accounting import counts_of

    return _or_stop(lambda: counts_of(scanned, accepted, rejects, max_reject), rejects_out)


def _or_stop(settled: Callable, rejects_out: str):
    from lidarshard.transforms.arrow import parquet_bytes
    from lidarshard.transforms.features.accounting import TooManyRejects

    try:
        return settled()
    except TooManyRejects as e:
        storage.write_bytes(rejects_out, parquet_bytes(e.rejects))
        raise TooManyRejects(
            f"{e}. Nothing was published; every reject with its reason is in {rejects_out}", e.rejects
        ) from None

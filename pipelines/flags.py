"""The parser of the Beam commands (``scan``, ``build``, ``synth``): their options, Beam's passed through.

The options are declared once, on frozen dataclasses (``lidarshard.transforms.declare``: the flags,
``--help`` and the Python API's keywords all come from them). :class:`BeamParser` adds what a pipeline
run shows (``-v``, ``--progress``) and accepts the real Beam pipeline options (``--runner``,
``--temp_location``, ...), passed through to the runner untouched; anything else (a typo such as
``--sweps`` or ``--temp_locaton``) exits 2 with the usage line and a "did you mean" suggestion.

Our flags are parsed with plain argparse rather than a ``PipelineOptions`` subclass on purpose: Beam
registers every ``PipelineOptions`` subclass in one global parser, so two subcommands that both define
``--seed`` (or a positional INPUT) would collide inside runners.
"""

from __future__ import annotations

import argparse
import functools
import importlib
from collections.abc import Sequence
from typing import Any

from lidarshard.transforms.declare import Parser, add_flag

__all__ = ["BeamParser"]

_BEAM_EPILOG = (
    "Beam pipeline options pass through to the runner (e.g. --runner=FnApiRunner, --direct_num_workers=2, "
    "Dataflow's --project/--region/--temp_location), listed in apache_beam.options.pipeline_options and at "
    "https://beam.apache.org/documentation/runners/. Unknown flags are refused, never dropped."
)
#: Beam modules that define ``PipelineOptions`` of a runner outside ``pipeline_options``.
_RUNNER_OPTION_MODULES = ("apache_beam.runners.dask.dask_runner",)


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


class BeamParser(Parser):
    """A Beam command's parser: ``--debug``, ``-v``, ``--progress``, its options, Beam's options passed
    through (``parse`` returns them as the second value), nothing else."""

    DEBUG_MORE = "; implies --verbose"

    def __init__(self, prog: str, description: str, options: type | None = None, **kw: Any) -> None:
        super().__init__(prog, description, options, epilog=_BEAM_EPILOG, **kw)

    def _add_common(self) -> None:  # read before Beam is imported: lidarshard.pipelines.cli.main
        add_flag(self, ["-v", "--verbose"], "show Beam's, Dask's and the workers' log lines, hidden by default",
             "off", action="store_true", default=False)  # fmt: skip
        add_flag(self, ["--progress"], "draw the progress line (work done of total, rate, ETA) also when stderr "
             "is not a terminal: a line every 10 s and the last one", "on a terminal", action="store_true",
             default=False)  # fmt: skip

    def _add_beam_options(self) -> None:
        mine = set(self._option_string_actions)
        for strings, nargs in _beam_option_actions():
            if not mine.intersection(strings):  # ours win (synth's --labels is not Dataflow's)
                self.add_argument(
                    *strings, action=_BeamFlag, nargs=nargs, dest="_beam", help=argparse.SUPPRESS
                )

    def parse(self, argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
        """(our args, Beam argv). Exits 2 with usage + one line on an unknown flag or a bad value."""
        if "--runner" not in self._option_string_actions:
            self._add_beam_options()
        return super().parse(argv)

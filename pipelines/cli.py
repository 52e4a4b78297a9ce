"""The ``lidarshard`` command: ``lidarshard <subcommand> ...``; each subcommand is a module's ``run``."""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import re
import sys
import traceback

from lidarshard import __version__
from lidarshard.pipelines import DEBUG_ENV

__all__ = ["main", "one_line", "DEBUG_ENV", "SUBCOMMANDS", "BEAM_COMMANDS"]

_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Rejects|Failed)): (.+)$", re.MULTILINE)


def one_line(exc: BaseException) -> str:
    """The one line a person needs from a failed run: the innermost error message, without the
    tracebacks Beam's runners wrap around it (``[while running 'Step']`` dropped)."""
    text = str(exc)
    found = _ERROR_LINE.findall(text)
    line = found[-1][1] if found else (text.strip().splitlines() or [type(exc).__name__])[0]
    return re.sub(r" \[while running '[^']*'\]", "", line).strip()


#: subcommand -> (module with ``run(argv) -> int``, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "synth": ("lidarshard.pipelines.synth", "write a nuScenes-style synthetic dataroot"),
    "scan": ("lidarshard.pipelines.scan", "size features of every point cloud; bad input to rejects.parquet"),
    "build": (
        "lidarshard.pipelines.build",
        "scan + cost + buckets + balanced rank-sharded Parquet manifests",
    ),
    "validate": ("lidarshard.pipelines.tools.validate", "check a manifest directory against the contract"),
    "report": ("lidarshard.pipelines.tools.report", "plots and a summary of a manifest directory"),
    "calibrate": (
        "lidarshard.pipelines.tools.calibrate",
        "fit the linear cost model to measured step timings",
    ),
}


#: The subcommands that run a Beam pipeline (their parsers take --debug and Beam options).
BEAM_COMMANDS = ("synth", "scan", "build")


def _usage() -> str:
    lines = ["usage: lidarshard [--version] <command> [args] [beam pipeline options]", "", "commands:"]
    lines += [f"  {name:<10} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += [
        "",
        "lidarshard <command> --help lists its flags with their defaults. Exit status: 0 done, 1 the run",
        f"failed (one line on stderr; --debug or {DEBUG_ENV}=1 for the traceback), 2 a usage error.",
    ]
    return "\n".join(lines)


class _BeamRootRecords(logging.Filter):
    """Hold records that Beam's modules log through the *root* logger to the level set for Beam.

    ``apache_beam.io.gcp...bigquery`` calls ``logging.warning("apitools not found ...")`` when it is
    imported without the gcp extra; that line would precede every one-line error.
    """

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level
        self.beam_dir = os.sep + "apache_beam" + os.sep

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != "root" or self.beam_dir not in record.pathname or record.levelno >= self.level


def main(argv: list[str] | None = None) -> int:
    """``lidarshard ...``: returns the exit status (0 done, 1 failed run, 2 usage error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"lidarshard {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        close = difflib.get_close_matches(name, list(SUBCOMMANDS), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        print(f"{_usage()}\nlidarshard: error: unknown command {name!r}{hint}", file=sys.stderr)
        return 2
    debug = "--debug" in rest or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    if name not in BEAM_COMMANDS:
        rest = [a for a in rest if a != "--debug"]
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # Beam relays every worker's start-up warnings and, on a failure, whole tracebacks at ERROR.
    level = os.environ.get("LIDARSHARD_BEAM_LOG_LEVEL", "WARNING" if debug else "CRITICAL")
    logging.getLogger("apache_beam").setLevel(level)
    for handler in logging.getLogger().handlers:  # Beam also logs through the root logger at import
        handler.addFilter(_BeamRootRecords(logging.getLogger("apache_beam").level))
    logging.getLogger("distributed").setLevel(logging.WARNING)  # --runner=dask: a line per connection
    try:
        module = importlib.import_module(SUBCOMMANDS[name][0])
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "apache_beam":
            raise
        print(f'lidarshard {name}: needs Apache Beam: pip install "lidarshard[pipeline]"', file=sys.stderr)
        return 2
    try:
        return int(module.run(rest) or 0)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else 2
    except KeyboardInterrupt:
        print(f"lidarshard {name}: interrupted; nothing was published", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the CLI's job: one line, not a traceback
        if debug:
            traceback.print_exc()
        print(f"lidarshard {name}: error: {one_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

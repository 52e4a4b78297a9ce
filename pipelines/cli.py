"""The ``lidarshard`` command: ``lidarshard <subcommand> ...``, each subcommand a module's ``run``.

What the command shows is decided here, once per process (:func:`configure`): its own lines, a progress line
(:func:`running`), and no Beam, Dask or worker output unless asked for (``-v``, ``--debug``). Beam's SDK workers
inherit stderr, log at INFO before reading any option and ``print`` a failed bundle's traceback (Beam 2.77: 42
lines a demo build, 205 before a failed build's one line), so a quiet run points fd 2 at ``/dev/null`` while the
pipeline runs, which every worker process started meanwhile inherits; Dask follows
``DASK_LOGGING__DISTRIBUTED``. Our own lines are written once stderr is back.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import platform
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import FrameType

from lidarshard import DEBUG_ENV, __version__
from lidarshard.transforms import progress

__all__ = [
    "main",
    "one_line",
    "DEBUG_ENV",
    "SUBCOMMANDS",
    "BEAM_COMMANDS",
    "Console",
    "configure",
    "running",
    "BeamRootRecords",
    "PROGRESS_EVERY_S",
    "arrow_allocator",
]

_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Rejects|Failed)): (.+)$", re.MULTILINE)


def one_line(exc: BaseException) -> str:
    """The innermost error message of a failed run, without Beam's wrapping (``[while running 'Step']``, the
    `` with exceptions None`` each re-raise of a ``BeamIOError`` appends)."""
    text = str(exc)
    found = _ERROR_LINE.findall(text)
    line = found[-1][1] if found else (text.strip().splitlines() or [type(exc).__name__])[0]
    while (inner := _ERROR_LINE.match(line)) is not None:  # Beam re-raises as "RuntimeError: pkg.Name: ..."
        line = inner[2]
    line = re.sub(r" \[while running '[^']*'\]", "", line).strip()
    return re.sub(r"(?: with exceptions None)+$", "", line)


#: subcommand -> (module with ``run(argv) -> int``, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "synth": ("lidarshard.pipelines.synth", "write a nuScenes-style synthetic dataroot"),
    "scan": ("lidarshard.pipelines.scan", "size features of every point cloud; bad input to rejects.parquet"),
    "build": (
        "lidarshard.pipelines.build",
        "scan + cost + buckets + balanced rank-sharded Parquet manifests",
    ),
    "validate": ("lidarshard.tools.validate", "check a manifest directory against the contract"),
    "report": ("lidarshard.tools.report", "plots and a summary of a manifest directory"),
    "calibrate": ("lidarshard.tools.calibrate", "fit the linear cost model to measured step timings"),
}

#: The subcommands that run a Beam pipeline (their parsers take --debug, -v, --progress and Beam options).
BEAM_COMMANDS = ("synth", "scan", "build")
#: Seconds between two redraws of the progress line.
PROGRESS_EVERY_S = 1.0


def _usage() -> str:
    lines = ["usage: lidarshard [--version] <command> [args] [beam pipeline options]", "", "commands:"]
    lines += [f"  {name:<10} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += [
        "",
        "lidarshard <command> --help lists its flags with their defaults. Exit status: 0 done, 1 the run",
        f"failed (one line on stderr; --debug or {DEBUG_ENV}=1 for the traceback), 2 a usage error.",
        "synth, scan and build show no Beam, Dask or worker output (-v/--verbose shows it) and, on a",
        "terminal, a progress line (--progress: also when stderr is not a terminal).",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Console:
    """What a run shows: ``label`` in the progress line; ``quiet``: no Beam, Dask or worker output; ``progress``."""

    label: str = "lidarshard"
    quiet: bool = False
    progress: bool = False


_state = Console()  # the Python API's: nothing hidden, no progress line


class BeamRootRecords(logging.Filter):
    """Records Beam's modules log through the root logger held to Beam's level (``apitools not found``)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level
        self.beam_dir = os.sep + "apache_beam" + os.sep

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != "root" or self.beam_dir not in record.pathname or record.levelno >= self.level


def configure(label: str, *, verbose: bool, progress: bool) -> None:
    """Set this process's output once, before Beam is imported: log levels (``verbose``: ours, Beam's and Dask's
    at INFO; else our warnings), Dask's in its workers, what :func:`running` does."""
    global _state
    _state = Console(label, quiet=not verbose, progress=progress)
    root = logging.getLogger()
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    beam = logging.INFO if verbose else logging.CRITICAL
    logging.getLogger("apache_beam").setLevel(beam)
    for handler in root.handlers:  # Beam also logs through the root logger at import
        for old in [f for f in handler.filters if isinstance(f, BeamRootRecords)]:
            handler.removeFilter(old)
        handler.addFilter(BeamRootRecords(beam))
    if not verbose:  # read when dask is imported, here and in the worker processes it starts
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "critical")


@contextmanager
def running() -> Iterator[None]:
    """Around one pipeline run: the progress line, and when quiet fd 2 on ``/dev/null``; SIGINT/SIGTERM put the
    terminal back first, then run the handler in force."""
    with ExitStack() as undo:  # undone last to first, each once
        if _state.progress:
            undo.callback(_show_progress(_state.label))
        if _state.quiet:  # worker processes started from now on inherit fd 2
            sys.stderr.flush()
            saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)
            undo.callback(_restore_stderr, saved)
        if (_state.progress or _state.quiet) and threading.current_thread() is threading.main_thread():
            _undo_on_signal(undo)
        yield


def _restore_stderr(saved: int) -> None:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)


def _show_progress(label: str) -> Callable[[], None]:
    """Start the progress line (workers' tallies in ``$LIDARSHARD_PROGRESS_DIR``, redrawn every
    ``PROGRESS_EVERY_S`` s on a copy of stderr); returns its stop."""
    directory = tempfile.mkdtemp(prefix="lidarshard-progress-")
    before = os.environ.get(progress.ENV)
    os.environ[progress.ENV] = directory
    fd = os.dup(2)
    line = progress.Line(fd)
    started = time.monotonic()
    stopped = threading.Event()

    def text() -> str:
        return progress.describe(label, progress.read(directory), time.monotonic() - started)

    def loop() -> None:
        while not stopped.wait(PROGRESS_EVERY_S):
            line.show(text())

    thread = threading.Thread(target=loop, name="lidarshard-progress", daemon=True)
    thread.start()

    def stop() -> None:
        stopped.set()
        thread.join()
        line.close(text())
        os.close(fd)
        if before is None:
            os.environ.pop(progress.ENV, None)
        else:
            os.environ[progress.ENV] = before
        shutil.rmtree(directory, ignore_errors=True)

    return stop


def _undo_on_signal(undo: ExitStack) -> None:
    """SIGINT/SIGTERM handlers that close ``undo`` (the terminal back), then call the handlers in force."""
    sigs = (signal.SIGINT, signal.SIGTERM)
    before = {s: signal.getsignal(s) for s in sigs}
    inner = undo.pop_all()  # what the handler undoes; the handlers are removed after it

    def handler(signum: int, frame: FrameType | None) -> None:
        inner.close()
        previous = before[signal.Signals(signum)]
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for s in sigs:
        signal.signal(s, handler)
    undo.push(inner)
    undo.callback(lambda: [signal.signal(s, h) for s, h in before.items()])


def _switch(argv: list[str], *names: str) -> bool:
    given = argv[: argv.index("--")] if "--" in argv else argv
    return any(a in names for a in given)


def arrow_allocator() -> None:
    """Arrow's jemalloc pool with one arena for this process and the workers it starts, unless the environment
    chooses (``ARROW_DEFAULT_MEMORY_POOL``, ``JE_ARROW_MALLOC_CONF``): both are read when pyarrow loads, so only
    before it is imported, and only on x86-64 Linux, whose pyarrow wheels have jemalloc (ARM ones have none since
    pyarrow 18: there the variable would only print a warning). At 1M samples (9 sweeps, W=64)
    ``build --from-samples`` took 24.7 s with a 1.09 GiB process tree against 26.6 s and 1.25 GiB on pyarrow's
    default mimalloc, and ``validate`` 5.8-6.2 s against 8.9-9.6 s at the same peak (docs/RUNNERS.md, Scale)."""
    if sys.platform != "linux" or platform.machine() != "x86_64" or "pyarrow" in sys.modules:
        return
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    if os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "jemalloc":
        os.environ.setdefault("JE_ARROW_MALLOC_CONF", "narenas:1")


def main(argv: list[str] | None = None) -> int:
    """``lidarshard ...``: returns the exit status (0 done, 1 failed run, 2 usage error)."""
    arrow_allocator()
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
    debug = _switch(rest, "--debug") or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    beam = name in BEAM_COMMANDS
    # -v and --progress (options.BeamParser) act here, before Beam is imported
    verbose = debug or (beam and _switch(rest, "-v", "--verbose"))
    shown = beam and (_switch(rest, "--progress") or (sys.stderr.isatty() and not verbose))
    configure(f"lidarshard {name}", verbose=verbose, progress=shown)
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


if __name__ == "__main__":  # python -m lidarshard.pipelines.cli: run the module launch and synth import
    from lidarshard.pipelines import cli  # (their running() reads its state, not this __main__ copy's)

    sys.exit(cli.main())

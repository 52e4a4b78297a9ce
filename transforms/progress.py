"""Progress of a long job, shown as one line on a terminal: one mechanism for every local runner.

Workers keep a :class:`Tally` of the slow work they do (the scan's reads, synth's scenes) and write it,
at most every ``WRITE_EVERY_S`` seconds and at the end of each bundle, to their own small JSON file in
the directory ``$LIDARSHARD_PROGRESS_DIR`` names. The launcher sets that variable for the run
(``lidarshard.pipelines.console``), so the DirectRunner's worker processes, the in-process runners and
a local Dask cluster all inherit it; it reads the files back (:func:`read`) and draws :func:`describe`
with a :class:`Line`. Where the variable is unset or names no directory on the worker's machine
(Dataflow, a remote Dask cluster, the Python API) a tally writes nothing: those runners show Beam's
counters (namespace ``lidarshard``) instead. A process that counts its own work (the training
example's steps) draws the same line with a :class:`Ticker`.

Pure Python: no Beam, no numpy.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ENV", "WRITE_EVERY_S", "Progress", "Tally", "read", "describe", "duration", "Line", "Ticker"]

#: The variable that names the directory the workers' tallies go to.
ENV = "LIDARSHARD_PROGRESS_DIR"
#: Seconds between two writes of one worker's tally file.
WRITE_EVERY_S = 0.5
_SUFFIX = ".progress.json"


@dataclass(frozen=True)
class Progress:
    """Counts summed over every worker: ``done`` units of ``what`` (``"inputs read"``), ``rejected`` of
    them bad, of ``total`` (None: not known yet); ``started`` is the wall time (``time.time()``) of the
    first count, ``finished`` that of the last (None while it goes on)."""

    what: str
    done: int
    rejected: int = 0
    total: int | None = None
    started: float | None = None
    finished: float | None = None


class Tally:
    """One worker's counts of ``what``, written to its own file under ``$LIDARSHARD_PROGRESS_DIR``.

    Create it where the work runs (a DoFn's ``setup``), not where the pipeline is built: the variable
    is read in the worker's own environment.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.done = self.rejected = 0
        self.total: int | None = None
        self._started: float | None = None
        self._last = 0.0
        self._written = 0.0
        directory = os.environ.get(ENV, "")
        self._path = (
            os.path.join(directory, f"{os.getpid()}-{uuid.uuid4().hex}{_SUFFIX}")
            if directory and os.path.isdir(directory)
            else None
        )

    def add(self, done: int = 1, rejected: int = 0, total: int | None = None) -> None:
        """Count ``done`` units (``rejected`` of them bad) of ``total`` in all; written every
        ``WRITE_EVERY_S`` seconds."""
        self._last = time.time()
        if self._started is None:
            self._started = self._last
        self.done += done
        self.rejected += rejected
        self.total = total if total is not None else self.total
        if self._path is not None and time.monotonic() - self._written >= WRITE_EVERY_S:
            self.flush()

    def flush(self) -> None:
        """Write the counts now (a bundle ended); a directory that went away stops the reports."""
        if self._path is None or self._started is None:
            return
        self._written = time.monotonic()
        record = {"what": self.what, "done": self.done, "rejected": self.rejected, "total": self.total}
        record |= {"started": self._started, "last": self._last}
        tmp = f"{self._path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(tmp, self._path)  # a reader never sees half a record
        except OSError:
            self._path = None


def read(directory: str) -> Progress | None:
    """The tallies under ``directory`` summed (None when no worker has counted yet)."""
    try:
        names = [n for n in os.listdir(directory) if n.endswith(_SUFFIX)]
    except OSError:
        return None
    records = []
    for name in names:
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                records.append(json.load(f))
        except (OSError, ValueError):  # replaced while read: the next read gets it
            continue
    return _sum(records)


def _sum(records: Iterable[dict]) -> Progress | None:
    records = [r for r in records if isinstance(r, dict) and isinstance(r.get("done"), int)]
    if not records:
        return None
    totals = [r["total"] for r in records if isinstance(r.get("total"), int)]
    done = sum(r["done"] for r in records)
    total = max(totals) if totals else None
    finished = total is not None and done >= total
    return Progress(
        what=str(records[0].get("what", "done")),
        done=done,
        rejected=sum(int(r.get("rejected", 0)) for r in records),
        total=total,
        started=min(float(r.get("started", time.time())) for r in records),
        finished=max(float(r.get("last", 0.0)) for r in records) if finished else None,
    )


def duration(seconds: float) -> str:
    """``"42 s"``, ``"3 min 05 s"``, ``"2 h 07 min"``."""
    s = max(int(round(seconds)), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def describe(label: str, progress: Progress | None, elapsed: float, now: float | None = None) -> str:
    """The progress line: ``"lidarshard build: 37 of 60 inputs read (1 rejected), 12.3/s, ETA 2 s"``.

    Args:
        label: what runs (``"lidarshard build"``).
        progress: the summed counts; None before the first one (``"running, 3 s"``: the workers are
            starting, or they run where they cannot report).
        elapsed: seconds since the run started.
        now: wall time for the rate (``time.time()`` when None).
    """
    if progress is None or progress.done == 0:
        return f"{label}: running, {duration(elapsed)}"
    p, now = progress, time.time() if now is None else now
    rejected = f" ({p.rejected:,} rejected)" if p.rejected else ""
    if p.finished is not None and p.total is not None and p.started is not None:
        took = duration(p.finished - p.started)
        return f"{label}: all {p.total:,} {p.what}{rejected} in {took}; finishing, {duration(elapsed)}"
    span = max(now - (p.started if p.started is not None else now), 1e-3)
    rate = p.done / span
    counted = f"{p.done:,} of {p.total:,}" if p.total is not None else f"{p.done:,}"
    line = f"{label}: {counted} {p.what}{rejected}, {rate:,.1f}/s"
    if p.total is not None and rate > 0:
        line += f", ETA {duration(max(p.total - p.done, 0) / rate)}"
    return line


class Line:
    """One line on a terminal, redrawn in place (``\\r`` + erase); elsewhere (a log file) a new line at
    most every ``every_s`` seconds, and the last one when done.

    Args:
        fd: the file descriptor to write to (stderr's, or a saved copy of it).
        tty: redraw in place; None asks ``os.isatty(fd)``.
        every_s: seconds between two lines when not a terminal.
    """

    def __init__(self, fd: int, tty: bool | None = None, every_s: float = 10.0) -> None:
        self._fd, self._every = fd, every_s
        self.tty = os.isatty(fd) if tty is None else tty
        self._last_at = -float("inf")
        self._last = ""

    def _write(self, text: str) -> None:
        try:
            os.write(self._fd, text.encode("utf-8", "replace"))
        except OSError:  # the terminal went away: progress is not worth a failure
            pass

    def _width(self) -> int:
        try:
            columns = os.get_terminal_size(self._fd).columns
        except OSError:
            columns = 0
        return max(columns - 1, 20) if columns else 119  # a pseudo-terminal may report 0

    def show(self, text: str) -> None:
        """Draw ``text`` now (terminal) or when ``every_s`` has passed since the last line."""
        self._last = text
        if self.tty:
            self._write("\r" + text[: self._width()] + "\x1b[K")
        elif time.monotonic() - self._last_at >= self._every:
            self._last_at = time.monotonic()
            self._write(text + "\n")

    def close(self, final: str | None = None) -> None:
        """Erase the line (terminal), or write ``final`` (else the last text) as the closing line."""
        if self.tty:
            self._write("\r\x1b[K")
        elif final is not None or self._last:
            self._write((final if final is not None else self._last) + "\n")


class Ticker:
    """The progress line of work this process counts itself (the training example's steps): ``start``
    a stretch of ``total`` units, ``update`` as it goes (redrawn at most every ``every_s`` seconds),
    ``end`` it. Does nothing unless ``shown``.

    Args:
        what: the unit as the line says it (``"steps"``).
        shown: draw at all (e.g. only on rank 0, only on a terminal unless asked).
        fd: where to draw (stderr).
    """

    def __init__(self, what: str, shown: bool = True, fd: int = 2, every_s: float = 1.0) -> None:
        self.what, self._every = what, every_s
        self._line = Line(fd) if shown else None
        self._label = ""
        self._total: int | None = None
        self._started, self._t0, self._drawn = 0.0, 0.0, -float("inf")

    def start(self, label: str, total: int | None) -> None:
        self._label, self._total = label, total
        self._started, self._t0 = time.time(), time.monotonic()

    def update(self, done: int) -> None:
        if self._line is None or time.monotonic() - self._drawn < self._every:
            return
        self._drawn = time.monotonic()
        counts = Progress(self.what, done, total=self._total, started=self._started)
        self._line.show(describe(self._label, counts, self._drawn - self._t0))

    def end(self, done: int) -> None:
        """Erase the line (terminal) or write ``"<label>: <done> <what> in <time>"``."""
        if self._line is not None:
            took = duration(time.monotonic() - self._t0)
            self._line.close(f"{self._label}: {done:,} {self.what} in {took}")
            self._drawn = -float("inf")

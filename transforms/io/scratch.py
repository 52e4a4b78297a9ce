"""Numeric columns parked in a build's scratch directory, so a shuffle carries a file name, not rows.

A Beam runner keeps what passes through a ``GroupByKey`` or ``Reshuffle`` somewhere: the DirectRunner
and the Dask runner in one process (the launcher, a scheduler-side worker), where O(N) plan rows would
add up. The build's steps instead write each task's columns (a shard's plan entries, a group's dealt
members: (n,) numpy arrays, no nulls) to one small Parquet file under ``OUT/_work`` and pass its name;
the consumer reads it back. Names are fixed by the task (epoch, group, shard start), so a retried task
rewrites the same file with the same bytes; this module is the one place that names them.
``lidarshard validate`` keeps its tables in a temporary directory of its own (``temporary_dir``), which
goes when it returns, on the signals that end a process (``signals_exit``), and first when a signal
handler ends the process with ``os._exit`` (``remove_temporary``).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator, Mapping

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import parquet_bytes

__all__ = [
    "write_columns",
    "read_columns",
    "scores_path",
    "members_path",
    "group_entries_path",
    "entries_path",
    "temporary_dir",
    "remove_temporary",
    "EXIT_SIGNALS",
    "signals_exit",
]

#: The ``temporary_dir``s of this process still open.
_OPEN: set[str] = set()


def scores_path(work: str, part: int) -> str:
    """Prefix of the scratch files of samples part ``part``'s scores (``previous.park_keep``, ``park_scores``)."""
    return storage.join(work, "scores", f"part-{part:05d}")


def members_path(work: str, epoch: int, group: int, start: int) -> str:
    """The members of step group ``group`` of ``epoch`` dealt from the shard at ``start``."""
    return storage.join(work, "deal", f"epoch-{epoch}", f"group-{group}", f"{start:012d}.parquet")


def group_entries_path(work: str, epoch: int, start: int, group: int) -> str:
    """Step group ``group``'s plan entries of ``epoch`` in the shard at ``start``."""
    return storage.join(work, "entries", f"epoch-{epoch}", f"{start:012d}", f"group-{group}.parquet")


def entries_path(work: str, epoch: int, start: int) -> str:
    """The shard at ``start``'s plan entries of ``epoch`` (``plan_writer.slice_rows`` columns, every
    group's merged), which WritePieces reads: a shard task carries this name, not the rows."""
    return storage.join(work, "entries", f"epoch-{epoch}", f"{start:012d}.parquet")


def write_columns(path: str, columns: Mapping[str, NDArray]) -> str:
    """Write ``columns`` ({name: (n,) numeric array}, every one the same length) to ``path``; ``path``."""
    storage.write_bytes(path, parquet_bytes(pa.table({k: np.asarray(v) for k, v in columns.items()})))
    return path


def read_columns(path: str) -> dict[str, NDArray]:
    """The ``{name: (n,) array}`` ``write_columns`` wrote to ``path``, in its column order and dtypes."""
    table = storage.read_parquet(path)
    return {name: table.column(name).to_numpy() for name in table.column_names}


@contextlib.contextmanager
def temporary_dir(prefix: str) -> Iterator[str]:
    """A local temporary directory of this process (the system's temp, never inside an output), removed
    on leaving, or by ``remove_temporary`` when a signal handler ends the process first."""
    path = tempfile.mkdtemp(prefix=prefix)
    _OPEN.add(path)
    try:
        yield path
    finally:
        _OPEN.discard(path)
        shutil.rmtree(path, ignore_errors=True)


def remove_temporary() -> None:
    """Remove every ``temporary_dir`` still open: what a handler that ends the process with ``os._exit``
    calls first (``pipelines._lifeline.interruptible``, ``lidarshard validate``'s SIGTERM)."""
    for path in sorted(_OPEN):
        shutil.rmtree(path, ignore_errors=True)
    _OPEN.clear()


#: The signals whose default action ends the process without cleanup: ``signals_exit`` makes them exit
#: through Python (SIGINT already raises KeyboardInterrupt).
EXIT_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, name)
)


@contextlib.contextmanager
def signals_exit() -> Iterator[None]:
    """``EXIT_SIGNALS`` raise SystemExit(128 + signal) in the body, so its ``temporary_dir``s go (as on
    Ctrl-C); the previous handlers after it. Outside the main thread: nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, stop) for s in EXIT_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)

"""``lidarshard validate``'s query engine: one DuckDB database per run, in validate's own scratch directory.

The samples and plan rows validate reads (through ``lidarshard.transforms.io.storage``, so local paths and
every URI alike) are handed to DuckDB as Arrow tables; the joins, group-bys and partitions by step group
are queries on its tables. It runs with ``MEMORY_LIMIT`` and every core, and spills to the scratch
directory it is given (``scratch.temporary_dir``, removed when validate returns or is stopped by a signal).
No extension is installed or loaded at run time.

A failure of that scratch space (full, read-only, removed) is an I/O failure, never a verdict on the data:
:class:`ScratchError`, one line naming the directory and the errno.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import duckdb
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.transforms.io.arrow import release_memory

__all__ = ["MEMORY_LIMIT", "ROW_KEY", "Engine", "ScratchError", "scratch_error", "ahead", "in_order"]

#: DuckDB's memory limit: beyond it, its tables and joins spill to the scratch directory (results are read
#: ``BATCH_ROWS`` at a time; a join is never sorted by it: that would pin it whole).
MEMORY_LIMIT = "64MB"
#: DuckDB's memory limit while no query runs and the build's planner re-plans a group (``Engine.lean``).
LEAN_LIMIT = "4MB"
#: Rows a query's result is read back at a time (``Engine.batches``).
BATCH_ROWS = 1 << 16
#: A row's 64-bit key of (path, sweep_paths): equal values, equal keys (DuckDB's hash of the values, their
#: nulls and list positions included; a check of what lidarshard wrote against itself, not a signature).
ROW_KEY = "hash(path, sweep_paths, sweep_paths IS NULL)"  # a null list hashes as an empty one
#: What DuckDB raises when its files in the scratch directory cannot be written or read back.
_SCRATCH_FAILED = (
    duckdb.IOException,
    duckdb.OutOfMemoryException,
    duckdb.TransactionException,  # a commit whose write-ahead log could not be written
    duckdb.FatalException,  # the database invalidated by such a failure
)
_ERRNOS = (
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EFBIG,
    errno.EROFS,
    errno.EACCES,
    errno.ENOENT,
    errno.EIO,
    errno.EMFILE,
)


class ScratchError(OSError):
    """validate's own scratch space failed: the data was not judged."""


def scratch_error(where: str, err: BaseException) -> ScratchError:
    """The one line of a failed write (or read back) in validate's scratch directory ``where``."""
    text = (str(err).splitlines() or [type(err).__name__])[0]
    code = getattr(err, "errno", None) or next((c for c in _ERRNOS if os.strerror(c) in text), 0)
    name = errno.errorcode.get(code, "errno unknown")
    if isinstance(err, duckdb.OutOfMemoryException) and not code:
        return ScratchError(
            errno.ENOMEM,
            f"validate's database in {where} needed more than its {MEMORY_LIMIT} memory limit and could not "
            f"spill it there ({text[:200]}); the data was not checked: report this with the manifest's size",
        )
    return ScratchError(
        code,
        f"validate's scratch directory {where} failed ({name}: {text[:200]}); the data was not checked: free "
        "space there or point TMPDIR at a writable local directory, then run validate again",
    )


class Engine:
    """A DuckDB database in the directory ``scratch`` (which the caller removes), closed by ``close``."""

    def __init__(self, scratch: str) -> None:
        self.dir = scratch
        config: dict[str, str | bool | int | float | list[str]] = {
            "memory_limit": MEMORY_LIMIT,
            "temp_directory": os.path.join(scratch, "spill"),
            "threads": os.cpu_count() or 1,
            "preserve_insertion_order": False,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        }
        try:
            self.con = duckdb.connect(os.path.join(scratch, "validate.duckdb"), config=config)
        except (*_SCRATCH_FAILED, OSError) as e:
            raise scratch_error(scratch, e) from None
        self.con.execute("SET enable_progress_bar = false")  # a progress bar on stdout, else

    def run(self, query: str, params: Any = None, **tables: pa.Table) -> Any:
        """Execute ``query`` with ``params``, the Arrow ``tables`` visible by their names."""
        return self._do(lambda: self.con.execute(query, params), tables)

    def _do(self, call: Any, tables: dict[str, pa.Table]) -> Any:
        try:
            for name, table in tables.items():
                self.con.register(name, table)
            try:
                return call()
            finally:
                for name in tables:
                    self.con.unregister(name)
        except (*_SCRATCH_FAILED, OSError) as e:
            raise scratch_error(self.dir, e) from None

    def table(self, query: str, params: Any = None, **tables: pa.Table) -> pa.Table:
        """The result of ``query`` as an Arrow table, read ``BATCH_ROWS`` rows at a time (DuckDB never
        holds it whole)."""

        def read() -> pa.Table:
            reader = _reader(self.con.sql(query, params=params), BATCH_ROWS)
            return pa.Table.from_batches(list(reader), schema=reader.schema).combine_chunks()

        return self._do(read, tables)

    def arrays(self, query: str, params: Any = None, **tables: pa.Table) -> dict[str, NDArray]:
        """The result of ``query`` as {column: (n,) numpy array} (no nulls expected)."""
        t = self.table(query, params, **tables)
        return {n: t.column(n).to_numpy() for n in t.column_names}

    def rows(self, query: str, params: Any = None, **tables: pa.Table) -> list[tuple]:
        """The result of ``query`` as Python tuples (a few rows)."""
        return self._do(lambda: self.con.execute(query, params).fetchall(), tables)

    def batches(self, query: str, params: Any = None) -> Iterator[pa.Table]:
        """The result of ``query``, ``BATCH_ROWS`` rows at a time (read on a cursor of its own)."""
        rows, cursor = BATCH_ROWS, self.con.cursor()  # the module's, read now (tests set it)
        try:
            for batch in _reader(cursor.sql(query, params=params), rows):
                yield pa.Table.from_batches([batch])
        except _SCRATCH_FAILED as e:
            raise scratch_error(self.dir, e) from None
        finally:
            cursor.close()

    @contextlib.contextmanager
    def lean(self) -> Iterator[None]:
        """No query runs within: DuckDB's memory limit ``LEAN_LIMIT`` meanwhile, so that it evicts the pages it
        caches (its tables stay in the database file), then ``MEMORY_LIMIT`` again."""
        self.run(f"SET memory_limit = '{LEAN_LIMIT}'")
        release_memory()
        try:
            yield
        finally:
            self.run(f"SET memory_limit = '{MEMORY_LIMIT}'")

    def close(self) -> None:
        self.con.close()


def _reader(relation: Any, rows: int) -> pa.RecordBatchReader:
    """``relation``'s result, ``rows`` at a time."""
    fetch = getattr(relation, "to_arrow_reader", None) or relation.fetch_arrow_reader  # DuckDB 1.x
    return fetch(rows)


_T = TypeVar("_T")
_R = TypeVar("_R")


def in_order(work: Callable[[_T], _R], items: Iterable[_T]) -> Iterator[_R]:
    """``work(item)`` of each of ``items`` on every core (pyarrow's kernels release the GIL), in order, at most
    one more in flight than there are cores; an exception is raised here, in order."""
    cores = os.cpu_count() or 1
    window: collections.deque[Future] = collections.deque()
    with ThreadPoolExecutor(cores, thread_name_prefix="lidarshard-validate-check") as pool:
        for item in items:
            window.append(pool.submit(work, item))
            if len(window) > cores:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


def ahead(items: Iterable[_T], depth: int = 2) -> Iterator[_T]:
    """``items`` made on a thread of their own, at most ``depth`` ahead of the caller: a file read, hashed and
    decoded there (pyarrow and hashlib release the GIL) while the caller's query runs. An exception there
    is raised here, in order."""
    done = object()
    box: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def make() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                box.put((item, None))
        except BaseException as e:  # noqa: BLE001 (raised again in the caller's thread)
            box.put((None, e))
        box.put((done, None))

    worker = threading.Thread(target=make, name="lidarshard-validate-read", daemon=True)
    worker.start()
    try:
        while True:
            item, err = box.get()
            if err is not None:
                raise err
            if item is done:
                return
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # let it finish its item and see the stop
            try:
                box.get(timeout=0.1)
            except queue.Empty:
                pass

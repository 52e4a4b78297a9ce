"""``lidarshard validate``'s query engine: one DuckDB database per run in validate's own scratch directory
(``scratch.temporary_dir``), with ``MEMORY_LIMIT``, every core and a spill directory there; the tables it
reads (through ``storage``: local paths and URIs alike) are handed to it as Arrow. No extension is loaded.
A failure of that scratch space (full, read-only) is :class:`ScratchError`, never a verdict on the data.
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

from lidarshard.transforms.io.arrow import release_memory

__all__ = [
    "MEMORY_LIMIT",
    "ID_KEY",
    "ROW_KEY",
    "Engine",
    "ScratchError",
    "scratch_error",
    "ahead",
    "in_order",
]

#: DuckDB's memory limit (beyond it, tables and joins spill); ``LEAN_LIMIT`` while the planner runs.
MEMORY_LIMIT, LEAN_LIMIT = "64MB", "4MB"
#: Rows a query's result is read back at a time (a result is never sorted whole by DuckDB).
BATCH_ROWS = 1 << 16
#: A row's 64-bit key of (path, sweep_paths): equal values, equal keys (DuckDB's hash, nulls and list
#: positions included; a check of what lidarshard wrote against itself, not a signature).
ROW_KEY = "hash(path, sweep_paths, sweep_paths IS NULL)"  # a null list hashes as an empty one
#: A sample_id's 128-bit key (MD5), by which plan rows find their samples: a fixed-width join key spills
#: within ``MEMORY_LIMIT`` (joined on the strings, 10M plan rows needed more than 64 MB pinned).
ID_KEY = "md5_number(sample_id)"
#: What DuckDB raises when its files in the scratch directory cannot be written or read back.
_FAILED = (
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
    if isinstance(err, duckdb.OutOfMemoryException) and not code:
        # DuckDB 1.5.0 and 1.5.6 ran out of it at 10M samples (W=64, B=2), 1.1.0-1.4.1 at 4M; 2.0 spills there
        old = int(duckdb.__version__.split(".")[0]) < 2
        then = f"DuckDB {duckdb.__version__} is installed; 2.0 or later (Python >= 3.11) validates this within it"
        return ScratchError(
            errno.ENOMEM,
            f"validate's database in {where} needed more than its {MEMORY_LIMIT} "
            f"memory limit and could not spill it there ({text[:200]}); the data was not checked: "
            + (then if old else "report this with the manifest's size"),
        )
    return ScratchError(
        code,
        f"validate's scratch directory {where} failed ({errno.errorcode.get(code, 'errno unknown')}: "
        f"{text[:200]}); the data was not checked: free space there or point TMPDIR at a writable "
        "local directory, then run validate again",
    )


class Engine:
    """A DuckDB database in the directory ``scratch`` (which the caller removes), closed by ``close``."""

    def __init__(self, scratch: str) -> None:
        self.dir = scratch
        config: dict[str, Any] = {
            "memory_limit": MEMORY_LIMIT,
            "temp_directory": os.path.join(scratch, "spill"),
            "threads": os.cpu_count() or 1,
            "preserve_insertion_order": False,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        }
        try:
            self.con = duckdb.connect(os.path.join(scratch, "validate.duckdb"), config=config)
        except (*_FAILED, OSError) as e:
            raise scratch_error(scratch, e) from None
        self.con.execute("SET enable_progress_bar = false")  # a progress bar on stdout, else

    def _do(self, call: Callable[[], Any], tables: dict[str, pa.Table | pa.RecordBatchReader]) -> Any:
        try:
            for name, table in tables.items():
                self.con.register(name, table)
            try:
                return call()
            finally:
                for name in tables:
                    self.con.unregister(name)
        except (*_FAILED, OSError) as e:
            raise scratch_error(self.dir, e) from None

    def run(self, query: str, params: Any = None, **tables: pa.Table | pa.RecordBatchReader) -> None:
        """Execute ``query`` with ``params``, the Arrow ``tables`` visible by their names."""
        self._do(lambda: self.con.execute(query, params), tables)

    def insert(self, query: str, schema: pa.Schema, tables: Iterable[pa.Table]) -> None:
        """``query`` (which reads ``t``) run once over ``tables`` as one Arrow stream of ``schema``: DuckDB
        pulls them (the generator runs on its thread) instead of one statement per batch. An exception
        raised making ``tables`` ends the stream and is raised here, after the statement."""
        failed: list[BaseException] = []

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                for t in tables:
                    yield from t.select(schema.names).cast(schema).to_batches()
            except BaseException as e:  # noqa: BLE001 (raised again below, in the caller's thread)
                failed.append(e)

        self.run(query, t=pa.RecordBatchReader.from_batches(schema, batches()))
        if failed:
            raise failed[0]

    def rows(self, query: str, params: Any = None, **tables: pa.Table) -> list[tuple]:
        """The result of ``query`` as Python tuples (a few rows)."""
        return self._do(lambda: self.con.execute(query, params).fetchall(), tables)

    def table(self, query: str) -> pa.Table:
        """The result of ``query`` as one Arrow table, read ``BATCH_ROWS`` rows at a time."""
        return self._do(lambda: _reader(self.con, query).read_all().combine_chunks(), {})

    def batches(self, query: str) -> Iterator[pa.Table]:
        """The result of ``query``, ``BATCH_ROWS`` rows at a time (read on a cursor of its own: no statement
        that writes may run while it is open; ``pages`` for that)."""
        cursor = self.con.cursor()
        try:
            yield from (pa.Table.from_batches([b]) for b in _reader(cursor, query))
        except _FAILED as e:
            raise scratch_error(self.dir, e) from None
        finally:
            cursor.close()

    def pages(self, query: str, rows: int) -> Iterator[tuple[int, pa.Table]]:
        """(first rid, page) of ``query``, whose ``{lo}`` and ``{hi}`` bound ``rid`` to [first, first +
        ``BATCH_ROWS``), for rids 0 .. ``rows`` - 1. Each page is read whole before it is yielded, so no cursor is
        open while the caller writes: a commit may start a checkpoint, which DuckDB 1.1 waited on forever beside
        an open one."""
        for first in range(0, rows, BATCH_ROWS):
            yield first, self.table(query.format(lo=first, hi=first + BATCH_ROWS))

    @contextlib.contextmanager
    def lean(self) -> Iterator[None]:
        """No query runs within: ``LEAN_LIMIT`` meanwhile, so DuckDB evicts its cached pages."""
        self.run(f"SET memory_limit = '{LEAN_LIMIT}'")
        release_memory()
        try:
            yield
        finally:
            self.run(f"SET memory_limit = '{MEMORY_LIMIT}'")

    def close(self) -> None:
        self.con.close()


def _reader(con: Any, query: str) -> pa.RecordBatchReader:
    """``query``'s result as a relation's reader. No parameters: DuckDB 1.1 read a relation with parameters out
    of order, or from freed memory once the relation was gone (the process crashed)."""
    relation = con.sql(query)
    return (getattr(relation, "to_arrow_reader", None) or relation.fetch_arrow_reader)(BATCH_ROWS)


_T = TypeVar("_T")
_R = TypeVar("_R")


def in_order(work: Callable[[_T], _R], items: Iterable[_T], threads: int = 0, ahead: int = 1) -> Iterator[_R]:
    """``work(item)`` of each of ``items`` on ``threads`` threads (0: every core; pyarrow, hashlib and zlib
    release the GIL), results in order, at most ``threads * ahead`` + 1 in flight; an exception raised here."""
    threads = threads or os.cpu_count() or 1
    window: collections.deque[Future] = collections.deque()
    with ThreadPoolExecutor(threads, thread_name_prefix="lidarshard-validate") as pool:
        for item in items:
            window.append(pool.submit(work, item))
            if len(window) > threads * ahead:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


def ahead(items: Iterable[_T], depth: int = 2) -> Iterator[_T]:
    """``items`` made on a thread of their own, at most ``depth`` ahead of the caller (a file read and
    decoded there while the caller's query runs); an exception there is raised here, in order."""
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
        while (got := box.get())[0] is not done:
            if got[1] is not None:
                raise got[1]
            yield got[0]
    finally:
        stop.set()
        while worker.is_alive():  # let it finish its item and see the stop
            with contextlib.suppress(queue.Empty):
                box.get(timeout=0.1)

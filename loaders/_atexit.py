"""Let Arrow's thread pools finish before the interpreter finalizes: :func:`drain_arrow_at_exit`.

Why (issue #25, measured): ``pq.read_table(pa.BufferReader(data))`` reads its row groups on a worker of
Arrow's I/O thread pool even with ``use_threads=False``, and the task's closure holds the Parquet reader,
which holds the Python ``bytes``. The worker drops that closure only after it has marked the read done, so
under load the main thread can return from ``read_table``, drop its own references and start finalizing
first. The worker then drops the last reference: ``PyBuffer``'s destructor asks for the GIL, CPython before
3.14 ends any thread that asks for it during finalization with ``pthread_exit``, the unwind crosses a
``noexcept`` C++ destructor, and libstdc++ calls ``std::terminate``: "terminate called without an active
exception", SIGABRT, exit status 134 (python/cpython#87135, apache/arrow#34314). ``import torch`` makes
finalization long, hence the window wide; jemalloc's background thread plays no part.

``drain_arrow_pools`` runs at ``atexit``, before finalization begins, and waits (at most
``DRAIN_TIMEOUT_S``) until Arrow's CPU and I/O pools have no task queued or running: no worker can then
still hold a Python object. pyarrow has no public call that waits for its pools, so it reaches them
through three exported C++ functions of ``libarrow`` (``GetCpuThreadPool``, ``io::internal::GetIOThreadPool``,
``ThreadPool::GetNumTasks``) with ctypes, which releases the GIL during each call; where the library or a
symbol is not found (another platform or build), it does nothing.

Explicit, never at import: importing ``lidarshard.loaders`` registers nothing and touches no library
symbol. :func:`drain_arrow_at_exit` registers the drain (once per process); the lidarshard samplers call
it when made (``PlanReplay``), and a trainer that reads Parquet without one may call it itself
(docs/FRAMEWORKS.md, "exit status 134"). Imports neither torch nor Beam.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import glob
import os
import re
import sys
import time
from collections.abc import Callable, Iterator

__all__ = ["DRAIN_TIMEOUT_S", "drain_arrow_at_exit", "drain_arrow_pools"]

#: Longest wait at exit for Arrow's pools (s): a read stuck on a remote store must not hang the exit.
DRAIN_TIMEOUT_S = 10.0

_LIBARROW = re.compile(r"libarrow\.(?:so\.\d+|\d+\.dylib)")
_POOL_GETTERS = ("_ZN5arrow8internal16GetCpuThreadPoolEv", "_ZN5arrow2io8internal15GetIOThreadPoolEv")
_NUM_TASKS = "_ZN5arrow8internal10ThreadPool11GetNumTasksEv"  # queued + running tasks of one pool


def _libarrow_paths() -> Iterator[str]:
    """Candidate ``libarrow`` files: beside pyarrow first (wheels), then ``get_library_dirs()`` (15 ms)."""
    import pyarrow

    here = os.path.dirname(pyarrow.__file__)
    yield from _libarrow_in(here)
    for folder in pyarrow.get_library_dirs():  # only reached when nothing was found beside pyarrow
        if folder != here:
            yield from _libarrow_in(folder)


def _libarrow_in(folder: str) -> Iterator[str]:
    for path in sorted(glob.glob(os.path.join(folder, "libarrow*"))):
        if _LIBARROW.fullmatch(os.path.basename(path)):
            yield path


def _pool_counters() -> list[Callable[[], int]] | None:
    """One callable per Arrow pool giving its queued + running tasks; None when they cannot be reached."""
    path = next(_libarrow_paths(), None)
    if path is None:
        return None
    try:  # the library pyarrow already loaded: dlopen returns the same handle
        lib = ctypes.CDLL(path)
        getters = [getattr(lib, name) for name in _POOL_GETTERS]
        num_tasks = getattr(lib, _NUM_TASKS)
    except (OSError, AttributeError):
        return None
    for get in getters:
        get.restype, get.argtypes = ctypes.c_void_p, []
    num_tasks.restype, num_tasks.argtypes = ctypes.c_int, [ctypes.c_void_p]
    pools = [pool for pool in (get() for get in getters) if pool]
    return [functools.partial(num_tasks, pool) for pool in pools]


def drain_arrow_pools(timeout: float = DRAIN_TIMEOUT_S) -> bool:
    """Wait until Arrow's CPU and I/O thread pools run no task, polling every millisecond.

    Returns:
        True once both pools are idle (at once when pyarrow was never imported); False when ``timeout``
        seconds passed first or the pools cannot be reached.
    """
    if "pyarrow.lib" not in sys.modules:
        return True
    counters = _pool_counters()
    if counters is None:
        return False
    deadline = time.monotonic() + timeout
    while any(count() for count in counters):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


_registered: list[bool] = []  # [True] once drain_arrow_at_exit registered the drain in this process


def drain_arrow_at_exit() -> None:
    """Run :func:`drain_arrow_pools` at interpreter exit (``atexit``), registered once per process.

    Only registers: no library symbol is looked up or called before exit. Idempotent.
    """
    if not _registered:
        atexit.register(drain_arrow_pools)
        _registered.append(True)

"""Reading a sample's files ahead of time: plan-aware prefetch and an optional local cache.

A rank knows its whole future: the plan says which samples it trains at every step. A lidarshard batch
sampler driven by ``PlanLoader`` hands every DataLoader worker, with each batch, the indices of the
next batches *that worker* will be given (``loaders.position.PlannedBatch.ahead``). The dataset turns
them into files and a :class:`Fetcher` reads those on a small thread pool while the current step
trains, so an object store's per-request latency overlaps with compute instead of adding to it.

- :class:`Fetcher`: one per process (a DataLoader worker builds its own on first use: thread pools do
  not survive ``fork``). ``prepare(now, ahead)`` starts the reads of a batch and of the batches ahead
  (those bounded by ``max_bytes`` held or in flight); ``read(path, recorded)`` returns a prepared
  read's bytes (waiting if needed) or reads now. Every
  byte is checked against what the scan recorded (``points.read_recorded``), prefetched or not.
- :class:`FileCache`: a size-bounded local directory (least recently used entries go first) that
  several workers and ranks on one host share safely: entries are written to a temporary name and
  renamed, eviction holds an ``flock``, and an entry is used only when its size (and CRC-32 where the
  scan recorded one) match; anything else is a miss and is fetched again.

Pure Python + numpy-free; imports neither Beam nor torch.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from lidarshard import schemas
from lidarshard.loaders.points import Recorded, difference, read_recorded
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.local import write_local

__all__ = ["Fetcher", "FileCache", "File", "DEFAULT_MAX_BYTES", "DEFAULT_THREADS"]

#: One file to read: its path or URI and what the scan recorded of it (None: read unchecked).
File = tuple[str, Recorded | None]
#: Bytes one process may hold in prefetched or in-flight reads.
DEFAULT_MAX_BYTES = 256 << 20
#: Concurrent reads per process (object stores reward parallel requests; local disks do not need them).
DEFAULT_THREADS = 64
_ENTRY_SUFFIX = ".lsc"  # only files named <64 hex><suffix> are cache entries: nothing else is deleted
_CACHE_DIR = "lidarshard-cache-v1"
_STALE_TMP_S = 3600.0  # an entry's temporary file this old belongs to a writer that died


class FileCache:
    """A local directory of fetched files, at most ``max_bytes`` (least recently used go first).

    Entries live in ``<directory>/lidarshard-cache-v1/``, named by the sha256 of the URI; only files
    of that shape there are ever deleted. Safe for several processes: writes go to a temporary name
    and are renamed into place; eviction holds an exclusive ``flock`` on the directory's lock file.

    Args:
        directory: a local directory (created if missing).
        max_bytes: the cache's size bound, bytes (> 0).
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes <= 0:
            raise ValueError(f"FileCache max_bytes must be a positive int, got {max_bytes!r}")
        self.root = os.path.join(os.fspath(directory), _CACHE_DIR)
        os.makedirs(self.root, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock_path = os.path.join(self.root, ".lock")
        self._added = 0  # bytes this process added since its last eviction pass

    def _entry(self, uri: str) -> str:
        return os.path.join(self.root, hashlib.sha256(uri.encode()).hexdigest() + _ENTRY_SUFFIX)

    def get(self, uri: str, recorded: Recorded | None) -> bytes | None:
        """The cached bytes of ``uri`` when they match ``recorded``'s size (and CRC-32 when
        recorded); None on a miss (nothing cached, another size or content: that entry is dropped).
        Without a recorded size nothing is trusted: always a miss."""
        if recorded is None or recorded.size is None:
            return None
        path = self._entry(uri)
        try:
            with open(path, "rb") as f:
                data = f.read(recorded.size + 1)
        except OSError:
            return None
        crc = schemas.content_hash(data) if recorded.crc32 is not None else None
        if difference(recorded, len(data), crc) is not None:
            self._drop(path)
            return None
        try:
            os.utime(path)  # most recently used
        except OSError:
            pass  # evicted meanwhile: the bytes read are still good
        return data

    def put(self, uri: str, data: bytes) -> None:
        """Store ``data`` (already checked against the record) for ``uri``; then evict over the bound."""
        if len(data) > self.max_bytes:
            return
        try:
            write_local(self._entry(uri), data)  # a temporary sibling renamed: never half an entry
        except OSError:
            return  # a full or read-only disk: the cache is an optimisation, never a failure
        self._added += len(data)
        if self._added >= self.max_bytes // 8:  # a directory scan every eighth of the bound added
            self.evict()

    def evict(self) -> int:
        """Delete least recently used entries until the cache holds at most ``max_bytes``; returns the
        bytes it now holds."""
        self._added = 0
        with open(self._lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = []
            with os.scandir(self.root) as it:
                for e in it:
                    name, entry = e.name, e.name[: 64 + len(_ENTRY_SUFFIX)]
                    if not (len(entry) == 64 + len(_ENTRY_SUFFIX) and entry.endswith(_ENTRY_SUFFIX)):
                        continue  # not ours: never touched
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if name == entry:
                        entries.append((st.st_mtime, st.st_size, e.path))
                    elif name.startswith(entry + ".tmp-") and st.st_mtime < time.time() - _STALE_TMP_S:
                        self._drop(e.path)  # a writer that died mid-write left it
            held = sum(size for _, size, _ in entries)
            for _, size, path in sorted(entries):
                if held <= self.max_bytes:
                    break
                self._drop(path)
                held -= size
        return held

    @staticmethod
    def _drop(path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass


class Fetcher:
    """Reads files for one process: scheduled ones on a thread pool, ahead of need, bounded.

    Args:
        threads: concurrent reads (>= 1).
        max_bytes: bytes held by prefetched or in-flight reads (recorded sizes; a file of unknown size
            counts as 0 but at most ``threads`` of those are in flight).
        cache: an optional :class:`FileCache` consulted before, and filled after, a remote read.
        read: the checked read (``points.read_recorded``; tests pass a counting one).
    """

    def __init__(
        self,
        threads: int = DEFAULT_THREADS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        cache: FileCache | None = None,
        read: Callable[[str, Recorded | None], bytes] = read_recorded,
    ) -> None:
        if threads < 1 or max_bytes < 1:
            raise ValueError(f"Fetcher needs threads >= 1 and max_bytes >= 1, got {threads}, {max_bytes}")
        self.threads, self.max_bytes, self.cache, self._read = threads, max_bytes, cache, read
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1
        self._pending: OrderedDict[str, tuple[Future[bytes], int]] = OrderedDict()
        self._held = 0
        self.stats = {"scheduled": 0, "hits": 0, "waited": 0, "direct": 0, "skipped": 0}

    def __getstate__(self) -> dict:
        """Pickled for a spawned worker: the settings only, no pool and no pending reads."""
        state = self.__dict__.copy()
        state.update(_pool=None, _pid=-1, _pending=OrderedDict(), _held=0)
        return state

    def _executor(self) -> ThreadPoolExecutor:
        if self._pid != os.getpid():  # first use in this process (a forked worker inherits no threads)
            self._pool, self._pid = ThreadPoolExecutor(self.threads, "lidarshard-fetch"), os.getpid()
            self._pending, self._held = OrderedDict(), 0
        assert self._pool is not None
        return self._pool

    def fetch(self, path: str, recorded: Recorded | None) -> bytes:
        """``path``'s bytes, checked: from the cache when it holds them, else read (and cached)."""
        if self.cache is not None and not storage.is_local(path):
            data = self.cache.get(path, recorded)
            if data is not None:
                return data
            data = self._read(path, recorded)
            self.cache.put(path, data)
            return data
        return self._read(path, recorded)

    def prepare(self, now: Sequence[File], ahead: Sequence[File] = ()) -> None:
        """Start reading the files needed ``now`` (all of them, concurrently) and then those of the
        batches ``ahead`` (in order, while ``max_bytes`` allows); pending reads of any other file are
        dropped: the plan has moved past them."""
        self._executor()  # first use in this process: no pending reads inherited
        keep = {p for p, _ in now} | {p for p, _ in ahead}
        for path in [p for p in self._pending if p not in keep]:
            self._take(path).cancel()
        for path, recorded in now:
            if path not in self._pending:
                self._submit(path, recorded)
        unknown = sum(1 for _, n in self._pending.values() if n == 0)
        for path, recorded in ahead:
            if path in self._pending:
                continue
            size = _size(recorded)
            if self._held + size > self.max_bytes or (size == 0 and unknown >= self.threads):
                self.stats["skipped"] += 1
                return  # later files are further ahead: the next batch schedules them
            self._submit(path, recorded)
            unknown += size == 0

    def _submit(self, path: str, recorded: Recorded | None) -> None:
        size = _size(recorded)
        self._pending[path] = (self._executor().submit(self.fetch, path, recorded), size)
        self._held += size
        self.stats["scheduled"] += 1

    def _take(self, path: str) -> Future[bytes]:
        """The pending read of ``path``, no longer pending (its bytes no longer held)."""
        future, size = self._pending.pop(path)
        self._held -= size
        return future

    def read(self, path: str, recorded: Recorded | None) -> bytes:
        """``path``'s checked bytes: a prepared read's result (waiting for it) or a read now."""
        if self._pid == os.getpid() and path in self._pending:
            future = self._take(path)
            self.stats["hits" if future.done() else "waited"] += 1
            return future.result()  # re-raises the read's error (not found, changed file) here
        self.stats["direct"] += 1
        return self.fetch(path, recorded)


def _size(recorded: Recorded | None) -> int:
    return recorded.size if recorded is not None and recorded.size is not None else 0

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
  several workers and ranks of one user on one host share safely: entries are written to a temporary
  name and renamed, eviction holds an ``flock``, links, FIFOs and other users' files are never opened
  as entries, and an entry is used only when it verifies (its own CRC-32, the recorded size, and the
  recorded CRC-32 where the scan recorded one); anything else is a miss and is fetched again.

Pure Python + numpy-free; imports neither Beam nor torch.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from lidarshard import schemas
from lidarshard.loaders.points import Recorded, difference, read_recorded
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.safeio import open_own, own_directory

__all__ = ["Fetcher", "FileCache", "File", "DEFAULT_MAX_BYTES", "DEFAULT_THREADS"]

#: One file to read: its path or URI and what the scan recorded of it (None: read unchecked).
File = tuple[str, Recorded | None]
#: Bytes one process may hold in prefetched or in-flight reads.
DEFAULT_MAX_BYTES = 256 << 20
#: Concurrent reads per process (object stores reward parallel requests; local disks do not need them).
DEFAULT_THREADS = 64
_ENTRY_SUFFIX = ".lsc"  # only files named <64 hex><suffix> are cache entries: nothing else is deleted
_CACHE_DIR = "lidarshard-cache-v2"  # v2: entries carry a header (magic, CRC-32 of the bytes)
_MAGIC = b"LSC2"
_HEADER = struct.Struct(">4sI")  # magic, CRC-32 of the body
_STALE_TMP_S = 3600.0  # an entry's temporary file this old belongs to a writer that died


class FileCache:
    """A local directory of fetched files, at most ``max_bytes`` (least recently used go first).

    Entries live in ``<directory>/lidarshard-cache-v2/``, named by the sha256 of the URI; only files
    of that shape there are ever deleted. Safe for several processes of one user: writes go to a
    temporary name and are renamed into place; eviction holds an exclusive ``flock`` on the
    directory's lock file. The directory is checked as ssh checks its own (``safeio.own_directory``:
    this user's, mode 0700, not a link, in a place others cannot rename it out of); entries and the
    lock are opened without following links and without blocking, and must be this user's regular
    files. An entry is served only when it verifies: its header's CRC-32 matches its bytes, its size
    the scan's record, and its CRC-32 the scan's when one was recorded.

    Args:
        directory: a local directory (created if missing).
        max_bytes: the cache's size bound, bytes (> 0).

    Raises:
        ValueError: ``max_bytes`` is not a positive int.
        OSError: the directory is a link, another user's or writable by others (one line saying what).
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes <= 0:
            raise ValueError(f"FileCache max_bytes must be a positive int, got {max_bytes!r}")
        os.makedirs(os.fspath(directory), exist_ok=True)
        self.root = own_directory(os.path.join(os.fspath(directory), _CACHE_DIR))
        self.max_bytes = max_bytes
        self._lock_path = os.path.join(self.root, ".lock")
        self._added = 0  # bytes this process added since its last eviction pass

    def _entry(self, uri: str) -> str:
        return os.path.join(self.root, hashlib.sha256(uri.encode()).hexdigest() + _ENTRY_SUFFIX)

    def get(self, uri: str, recorded: Recorded | None) -> bytes | None:
        """The cached bytes of ``uri`` when the entry verifies against ``recorded`` (its size, and its
        CRC-32 when recorded) and its own header; None on a miss (nothing cached, not a regular file
        of this user's, another size or content: a bad entry is dropped). Without a recorded size
        nothing is trusted: always a miss. Never reads more than the entry's size on disk."""
        if recorded is None or recorded.size is None:
            return None
        path = self._entry(uri)
        try:
            fd = open_own(path)
        except OSError:
            return None  # missing, a link, a FIFO, another user's: a miss, never a hang
        try:
            with os.fdopen(fd, "rb") as f:
                if os.fstat(f.fileno()).st_size != _HEADER.size + recorded.size:
                    data = None  # sized by the file on disk, never by the record
                else:
                    data = f.read(_HEADER.size + recorded.size + 1)
        except OSError:
            return None
        body = _verified(data, recorded)
        if body is None:
            self._drop(path)
            return None
        try:
            os.utime(path, follow_symlinks=False)  # most recently used
        except OSError:
            pass  # evicted meanwhile: the bytes read are still good
        return body

    def put(self, uri: str, data: bytes) -> None:
        """Store ``data`` (already checked against the record) for ``uri``; then evict over the bound."""
        entry = _HEADER.pack(_MAGIC, schemas.content_hash(data)) + data
        if len(entry) > self.max_bytes:
            return
        try:
            storage.write_bytes(self._entry(uri), entry)  # a temporary sibling renamed: never half an entry
        except OSError:
            return  # a full or read-only disk: the cache is an optimisation, never a failure
        self._added += len(entry)
        if self._added >= self.max_bytes // 8:  # a directory scan every eighth of the bound added
            self.evict()

    def evict(self) -> int:
        """Delete least recently used entries until the cache holds at most ``max_bytes``; returns the
        bytes it now holds.

        Raises:
            OSError: the lock file is a link, a FIFO or another user's (one line naming it).
        """
        self._added = 0
        fd = open_own(self._lock_path, os.O_RDWR | os.O_CREAT)
        with os.fdopen(fd, "r+b") as lock:
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


def _verified(entry: bytes | None, recorded: Recorded) -> bytes | None:
    """The body of a cache ``entry`` (header + bytes) when its header's CRC-32 matches the body and the
    body matches ``recorded`` (size; CRC-32 when recorded); None otherwise."""
    if entry is None or len(entry) < _HEADER.size:
        return None
    magic, crc = _HEADER.unpack_from(entry)
    body = entry[_HEADER.size :]
    actual = schemas.content_hash(body)
    if magic != _MAGIC or crc != actual or difference(recorded, len(body), actual) is not None:
        return None
    return body


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

"""The ``memobj://`` object-store double: an in-memory ``FileSystem`` registered with Beam when this module is
imported (``conftest.py`` imports it for every test session that has Beam; the trainer's Beam-free install,
``make test-torch-min``, has none)."""

from __future__ import annotations

import io
import threading
import time

from apache_beam.io.filesystem import BeamIOError, CompressionTypes, FileMetadata, FileSystem

#: Scheme of ``MemoryObjectStore``.
SCHEME = "memobj"


class NotFound(Exception):
    """What google-cloud-storage raises on opening a missing object: not an ``OSError``."""


class MemoryObjectStore(FileSystem):
    """A process-wide in-memory object store: ``memobj://bucket/key``."""

    objects: dict[str, tuple[bytes, float]] = {}  # path -> (data, mtime)
    lock = threading.Lock()

    @classmethod
    def scheme(cls) -> str:
        return SCHEME

    def join(self, basepath: str, *paths: str) -> str:
        return "/".join([basepath.rstrip("/"), *(p.strip("/") for p in paths)])

    def split(self, path: str) -> tuple[str, str]:
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def mkdirs(self, path: str) -> None:  # no directories in an object store
        pass

    def has_dirs(self) -> bool:
        return False

    def _list(self, dir_or_prefix: str):
        with self.lock:
            items = sorted(self.objects.items())
        for path, (data, mtime) in items:
            if path.startswith(dir_or_prefix):
                yield FileMetadata(path, len(data), mtime)

    def create(self, path: str, mime_type: str = "", compression_type: str = CompressionTypes.AUTO):
        assert compression_type == CompressionTypes.UNCOMPRESSED, "lidarshard never compresses"
        store = self

        class _Writer(io.BytesIO):
            def close(self) -> None:
                if not self.closed:
                    with store.lock:
                        store.objects[path] = (self.getvalue(), time.time())
                super().close()

        return _Writer()

    def open(self, path: str, mime_type: str = "", compression_type: str = CompressionTypes.AUTO):
        with self.lock:
            if path not in self.objects:
                raise NotFound(path)
            return io.BytesIO(self.objects[path][0])

    def _move(self, sources: list[str], destinations: list[str], keep: bool) -> None:
        errors = {}
        with self.lock:
            for src, dst in zip(sources, destinations, strict=True):
                if src not in self.objects:  # a "directory" is not an object
                    errors[(src, dst)] = FileNotFoundError(src)
                    continue
                self.objects[dst] = self.objects[src] if keep else self.objects.pop(src)
        if errors:
            raise BeamIOError("Copy/rename failed", errors)

    def copy(self, source_file_names: list[str], destination_file_names: list[str]) -> None:
        self._move(source_file_names, destination_file_names, keep=True)

    def rename(self, source_file_names: list[str], destination_file_names: list[str]) -> None:
        self._move(source_file_names, destination_file_names, keep=False)

    def exists(self, path: str) -> bool:
        with self.lock:
            return path in self.objects

    def size(self, path: str) -> int:
        return self.metadata(path).size_in_bytes

    def last_updated(self, path: str) -> float:
        return self.metadata(path).last_updated_in_seconds

    def checksum(self, path: str) -> str:
        return str(self.size(path))

    def metadata(self, path: str) -> FileMetadata:
        with self.lock:
            if path not in self.objects:
                raise BeamIOError("Metadata failed", {path: FileNotFoundError(path)})
            data, mtime = self.objects[path]
        return FileMetadata(path, len(data), mtime)

    def delete(self, paths: list[str]) -> None:
        errors = {}
        with self.lock:
            for path in paths:
                if path.endswith("/"):  # like GCS: a trailing slash deletes the prefix
                    for key in [k for k in self.objects if k.startswith(path)]:
                        del self.objects[key]
                elif self.objects.pop(path, None) is None:
                    errors[path] = FileNotFoundError(path)
        if errors:
            raise BeamIOError("Delete failed", errors)

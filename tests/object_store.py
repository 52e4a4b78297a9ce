"""Object-store doubles for ``lidarshard.transforms.io.storage`` (``pyarrow.fs``): ``Handler``, a
``pyarrow.fs.FileSystemHandler`` whose every call raises NotImplementedError until a double defines it,
and ``memobj://``, an in-memory object store served for every test session (``conftest.py`` imports this
module).

``MemoryObjectStore`` behaves like gs:// and s3:// where local disks differ: a flat key space with no
directories (a "directory" is no file, ``move`` and ``copy_file`` move single objects, a prefix is listed
by its keys), so code that only works on local paths fails here as it would on GCS.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.fs as pafs

from lidarshard.transforms.io import storage

#: Scheme of ``MemoryObjectStore``.
SCHEME = "memobj"


class Handler(pafs.FileSystemHandler):
    """A filesystem double: override what it serves; the rest raises NotImplementedError."""

    def get_type_name(self) -> str:
        return type(self).__name__

    def normalize_path(self, path: str) -> str:
        return path

    def _missing(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError(type(self).__name__)

    get_file_info = get_file_info_selector = create_dir = delete_dir = delete_dir_contents = _missing
    delete_root_dir_contents = delete_file = move = copy_file = open_input_stream = _missing
    open_input_file = open_output_stream = open_append_stream = _missing

    @classmethod
    def every_call(cls, fn: Callable[..., object]) -> type[Handler]:
        """A subclass whose every filesystem call is ``fn(*args)`` (a store that stalls or refuses)."""
        names = ("get_file_info", "get_file_info_selector", "create_dir", "delete_dir", "delete_dir_contents",
                 "delete_file", "move", "copy_file", "open_input_stream", "open_input_file", "open_output_stream")  # fmt: skip
        return type(
            f"{cls.__name__}Of{fn.__name__}", (cls,), {n: lambda self, *a, **k: fn(*a) for n in names}
        )


class MemoryObjectStore(Handler):
    """A process-wide in-memory object store: ``memobj://bucket/key``, kept in ``objects`` by URI."""

    objects: dict[str, tuple[bytes, float]] = {}  # URI -> (data, mtime)
    lock = threading.Lock()

    @staticmethod
    def _uri(path: str) -> str:
        return f"{SCHEME}://{path}"

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        with self.lock:
            found = [self.objects.get(self._uri(p)) for p in paths]
        return [
            pafs.FileInfo(p, pafs.FileType.NotFound)
            if f is None
            else pafs.FileInfo(p, pafs.FileType.File, size=len(f[0]), mtime=f[1])
            for p, f in zip(paths, found, strict=True)
        ]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        base = selector.base_dir.rstrip("/") + "/"
        with self.lock:
            items = sorted((k, v) for k, v in self.objects.items() if k.startswith(self._uri(base)))
        out, folders = [], set()
        for key, (data, mtime) in items:
            rel = key[len(self._uri(base)) :]
            if selector.recursive or "/" not in rel:
                out.append(pafs.FileInfo(base + rel, pafs.FileType.File, size=len(data), mtime=mtime))
            else:
                folders.add(base + rel.split("/", 1)[0])
        return out + [pafs.FileInfo(f, pafs.FileType.Directory) for f in sorted(folders)]

    def create_dir(self, path: str, recursive: bool) -> None:  # no directories in an object store
        pass

    def delete_file(self, path: str) -> None:
        with self.lock:
            if self.objects.pop(self._uri(path), None) is None:
                raise FileNotFoundError(path)

    def _move(self, src: str, dest: str, keep: bool) -> None:
        with self.lock:
            if self._uri(src) not in self.objects:  # a "directory" is not an object
                raise FileNotFoundError(src)
            data = self.objects[self._uri(src)] if keep else self.objects.pop(self._uri(src))
            self.objects[self._uri(dest)] = data

    def move(self, src: str, dest: str) -> None:
        self._move(src, dest, keep=False)

    def copy_file(self, src: str, dest: str) -> None:
        self._move(src, dest, keep=True)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        with self.lock:
            if self._uri(path) not in self.objects:
                raise FileNotFoundError(path)
            return pa.BufferReader(self.objects[self._uri(path)][0])

    open_input_file = open_input_stream

    def open_output_stream(self, path: str, metadata: object) -> pa.NativeFile:
        store, uri = self, self._uri(path)

        class _Writer(io.BytesIO):
            def close(self) -> None:
                if not self.closed:
                    with store.lock:
                        store.objects[uri] = (self.getvalue(), time.time())
                super().close()

        return pa.PythonFile(_Writer(), mode="w")


storage.register_filesystem(SCHEME, pafs.PyFileSystem(MemoryObjectStore()))

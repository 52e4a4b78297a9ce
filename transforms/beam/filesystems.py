"""Beam's ``FileSystems`` as a backend of ``lidarshard.transforms.io.storage``.

Registered when the Beam layer is imported (``lidarshard.transforms.beam``), so in a pipeline every
URI scheme Beam knows (gs:// with ``[gcp]``, s3:// with ``[aws]``, hdfs://, test stores) is served
by Beam with the pipeline's own options, in the launcher and on every worker; other schemes fall
back to pyarrow.fs. Nothing here is called directly: use ``storage``.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import BinaryIO

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrowfs import ArrowBackend
from lidarshard.transforms.io.storage import FileInfo

__all__ = ["BeamBackend"]

_RAW = CompressionTypes.UNCOMPRESSED  # never decompress by extension


@functools.lru_cache(maxsize=32)
def _beam_knows(scheme: str) -> bool:
    try:
        FileSystems.get_filesystem(f"{scheme}://x/y")
    except ValueError:
        return False
    return True


def _not_found(uri: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, "no such file", uri)


class BeamBackend:
    """``storage.Backend`` over Beam ``FileSystems``; foreign exceptions become ``OSError`` s."""

    def handles(self, uri: str) -> bool:
        scheme = uri.split("://", 1)[0]
        return scheme != "file" and _beam_knows(scheme)

    def stat(self, uri: str) -> FileInfo:
        try:
            m = FileSystems.get_filesystem(uri).metadata(uri)
        except Exception as e:  # BeamIOError, or a client's own NotFound
            if not FileSystems.exists(uri):
                raise _not_found(uri) from e
            raise OSError(f"{uri}: {type(e).__name__}: {e}") from e
        return FileInfo(int(m.size_in_bytes), float(m.last_updated_in_seconds or 0.0))

    def read(self, uri: str, nbytes: int | None) -> bytes:
        try:
            with FileSystems.open(uri, compression_type=_RAW) as f:
                return f.read() if nbytes is None else f.read(nbytes)
        except OSError:
            raise
        except Exception as e:  # e.g. google.api_core NotFound is not an OSError
            if not FileSystems.exists(uri):
                raise _not_found(uri) from e
            raise OSError(f"{uri}: {type(e).__name__}: {e}") from e

    def write(self, uri: str, data: bytes) -> None:
        if not data and uri.startswith("s3://"):  # Beam's S3 writes no empty object (apache/beam#21369)
            ArrowBackend().write(uri, data)
            return
        with FileSystems.create(uri, compression_type=_RAW) as f:
            f.write(data)

    def open_read(self, uri: str) -> BinaryIO:
        return FileSystems.open(uri, compression_type=_RAW)

    def open_write(self, uri: str) -> AbstractContextManager[BinaryIO]:
        return FileSystems.create(uri, compression_type=_RAW)

    def list_files(self, root: str) -> dict[str, FileInfo]:
        found = FileSystems.match([root + "/**"])[0].metadata_list
        return {
            m.path[len(root) + 1 :]: FileInfo(int(m.size_in_bytes), float(m.last_updated_in_seconds or 0.0))
            for m in found
        }

    def glob(self, pattern: str) -> list[str]:
        # An object store's "folder/" marker (written by consoles and some uploaders) is no file.
        return sorted(
            m.path for m in FileSystems.match([pattern])[0].metadata_list if not m.path.endswith("/")
        )

    def delete(self, uris: Sequence[str]) -> None:
        FileSystems.delete(list(uris))

    def copy(self, sources: Sequence[str], destinations: Sequence[str]) -> None:
        FileSystems.copy(list(sources), list(destinations))


def _default_options() -> None:
    """Beam builds s3:// clients from the options a ``Pipeline`` hands ``FileSystems``: before any
    pipeline (the launcher's checks of INPUT and OUT, ``validate``) every s3:// call would fail ("Must
    provide one of client or options"). Until a pipeline sets its own: default options, with which the
    client reads its environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``~/.aws``); a run's
    ``--s3_*`` flags apply from its pipeline on."""
    if FileSystems._pipeline_options is None:
        FileSystems.set_options(PipelineOptions([]))


_default_options()
storage.register_backend(BeamBackend())

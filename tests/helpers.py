"""Helpers shared by the tests: the one module test modules import from each other
(fixtures live in ``conftest.py``)."""

from __future__ import annotations

import io
import math
import posixpath
import time
from pathlib import Path

import numpy as np
from apache_beam.io.filesystem import FileMetadata, FileSystem

REPO = Path(__file__).resolve().parents[1]
#: The repository folders that install as the one ``lidarshard`` package.
PACKAGES = ("lidarshard", "pipelines", "transforms", "schemas", "loaders")

#: Beam flags every test pipeline passes: an explicit runner, never the Prism download.
BEAM_TEST_FLAGS = ["--runner=FnApiRunner"]

IDENTITY_Q = [1.0, 0.0, 0.0, 0.0]


def yaw_q(theta: float) -> list[float]:
    return [math.cos(theta / 2), 0.0, 0.0, math.sin(theta / 2)]


def yaw_tf(theta: float, t: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> np.ndarray:
    """Independent 4x4 (cos/sin, no quaternion) for a yaw about z then a translation."""
    c, s = math.cos(theta), math.sin(theta)
    tf = np.eye(4)
    tf[:2, :2] = [[c, -s], [s, c]]
    tf[:3, 3] = t
    return tf


def build_bins_manifest(tmp: Path, n: int, world_size: int, batch_size: int, epochs: int = 2) -> Path:
    """``lidarshard build`` of ``make_bins(tmp / "in", n)`` (one bad file) into ``tmp / "out"``."""
    from lidarshard.pipelines.cli import main

    out = tmp / "out"
    args = [str(make_bins(tmp / "in", n=n)), str(out), "--world-size", str(world_size)]
    args += ["--batch-size", str(batch_size), "--epochs", str(epochs), "--max-reject-fraction", "0.1"]
    assert main(["build", *args, *BEAM_TEST_FLAGS]) == 0
    return out


def make_bins(root: Path, n: int = 61, seed: int = 0) -> Path:
    """``n`` KITTI-style .bin clouds with lognormal point counts (one of them bad)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i, count in enumerate(np.exp(rng.normal(7.0, 0.6, size=n)).astype(int) + 10):
        rng.normal(scale=20.0, size=(count, 4)).astype(np.float32).tofile(root / f"{i:04d}.bin")
    (root / "bad.bin").write_bytes(b"\0" * 7)
    return root


# ------------------------------------------------------------------------------ object-store double


class MemFileSystem(FileSystem):
    """A dict-backed Beam filesystem without directories or rename, like an object store."""

    files: dict[str, tuple[bytes, float]] = {}

    @classmethod
    def scheme(cls) -> str:
        return "memtest"

    def join(self, base: str, *paths: str) -> str:
        return posixpath.join(base, *paths)

    def split(self, path: str) -> tuple[str, str]:
        return posixpath.split(path)

    def mkdirs(self, path: str) -> None:
        pass

    def has_dirs(self) -> bool:
        return False

    def _list(self, prefix: str):
        for path, (data, t) in sorted(self.files.items()):
            if path.startswith(prefix):
                yield FileMetadata(path, len(data), t)

    def create(self, path: str, mime_type=None, compression_type=None):
        files = self.files

        class _Writer(io.BytesIO):
            def close(self) -> None:
                files[path] = (self.getvalue(), time.monotonic())
                super().close()

        return _Writer()

    def open(self, path: str, mime_type=None, compression_type=None):
        return io.BytesIO(self.files[path][0])

    def copy(self, sources: list[str], destinations: list[str]) -> None:
        for s, d in zip(sources, destinations, strict=True):
            self.files[d] = (self.files[s][0], time.monotonic())

    def rename(self, sources: list[str], destinations: list[str]) -> None:
        self.copy(sources, destinations)
        self.delete(sources)

    def exists(self, path: str) -> bool:
        return path in self.files

    def size(self, path: str) -> int:
        return len(self.files[path][0])

    def last_updated(self, path: str) -> float:
        return self.files[path][1]

    def checksum(self, path: str) -> str:
        return str(hash(self.files[path][0]))

    def metadata(self, path: str) -> FileMetadata:
        return FileMetadata(path, self.size(path), self.last_updated(path))

    def delete(self, paths: list[str]) -> None:
        for p in paths:
            del self.files[p]

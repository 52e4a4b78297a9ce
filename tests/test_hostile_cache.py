"""Hostile cases of the shared cache (``loaders.fetch.FileCache``) and of the records it trusts.

Each case plants what a careless neighbour or a corrupt manifest could leave, and asserts the promise:
the cache never hangs, never follows a link, never serves what it cannot verify, never writes outside
its directory, and never sizes an allocation by a recorded number.
"""

from __future__ import annotations

import os
import stat
import tracemalloc
import zlib
from pathlib import Path

import pytest

from lidarshard.loaders.fetch import Fetcher, FileCache
from lidarshard.loaders.points import MAX_RECORDED_BYTES, Recorded

pytestmark = pytest.mark.hostile("cache")

URI = "s3://bucket/scan.bin"
DATA = bytes(range(256)) * 4


def _cache(tmp_path: Path) -> FileCache:
    cache = FileCache(tmp_path / "c", max_bytes=1 << 20)
    cache.put(URI, DATA)
    assert cache.get(URI, Recorded(len(DATA), zlib.crc32(DATA))) == DATA
    return cache


def _plant(cache: FileCache, make) -> str:
    """Replace the entry of URI with what ``make(path)`` creates; returns the entry's path."""
    path = cache._entry(URI)
    os.unlink(path)
    make(path)
    return path


def _fifo(path: str) -> None:
    os.mkfifo(path)


def _link_to_fifo(path: str) -> None:
    os.mkfifo(path + ".fifo-target")
    os.symlink(path + ".fifo-target", path)


def _link_to_copy(path: str) -> None:
    """A link to a file that holds a valid entry: still never followed."""
    real = os.path.join(os.path.dirname(os.path.dirname(path)), "elsewhere.lsc")
    with open(real, "wb") as f:
        f.write(b"LSC2" + zlib.crc32(DATA).to_bytes(4, "big") + DATA)
    os.symlink(real, path)


def _directory(path: str) -> None:
    os.mkdir(path)


def _raw_same_size(path: str) -> None:
    """Bytes of the recorded size but no header: what a planted or old-format file looks like."""
    with open(path, "wb") as f:
        f.write(b"\0" * len(DATA))


def _header_lies(path: str) -> None:
    """A header whose CRC-32 does not match the bytes (a torn or edited entry)."""
    with open(path, "wb") as f:
        f.write(b"LSC2" + (zlib.crc32(DATA) ^ 1).to_bytes(4, "big") + DATA)


def _other_owner(path: str) -> None:
    with open(path, "wb") as f:
        f.write(b"LSC2" + zlib.crc32(DATA).to_bytes(4, "big") + DATA)
    os.chown(path, 65534, 65534)


PLANTED = {
    "fifo": _fifo,
    "link to a fifo": _link_to_fifo,
    "link to a valid entry": _link_to_copy,
    "directory": _directory,
    "raw bytes of the recorded size": _raw_same_size,
    "header that lies": _header_lies,
    "another user's file": _other_owner,
}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("verify_crc", [True, False], ids=["crc recorded", "size only (--features stat)"])
@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_a_planted_entry_is_a_miss_never_a_hang(tmp_path: Path, kind: str, verify_crc: bool) -> None:
    if kind == "another user's file" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    cache = _cache(tmp_path)
    _plant(cache, PLANTED[kind])
    recorded = Recorded(len(DATA), zlib.crc32(DATA) if verify_crc else None)
    assert cache.get(URI, recorded) is None
    cache.put(URI, DATA)  # fetched again: the cache heals where it can
    if kind not in ("directory",):
        assert cache.get(URI, recorded) == DATA


def test_a_huge_recorded_size_allocates_nothing(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    tracemalloc.start()
    try:
        assert cache.get(URI, Recorded(10**12)) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    assert cache.get(URI, Recorded(len(DATA), zlib.crc32(DATA))) is None  # the entry was dropped


@pytest.mark.parametrize(
    "size, crc",
    [(-1, None), (MAX_RECORDED_BYTES + 1, None), (10**13, None), (1.5, None), (True, None), ("10", None),
     (10, -1), (10, 1 << 32), (10, 2.0)],
)  # fmt: skip
def test_a_recorded_number_out_of_range_is_refused_where_it_is_made(size, crc) -> None:
    with pytest.raises(ValueError, match="a recorded file"):
        Recorded(size, crc)


def test_the_prefetch_bound_cannot_be_undercut(tmp_path: Path) -> None:
    """Sizes count against ``max_bytes`` as recorded, and a record cannot be negative."""
    files = []
    for k in range(4):
        p = tmp_path / f"{k}.bin"
        p.write_bytes(bytes(100))
        files.append((str(p), Recorded(100, zlib.crc32(bytes(100)))))
    fetcher = Fetcher(threads=2, max_bytes=250)
    fetcher.prepare(files[:1], files[1:])
    assert fetcher.stats["scheduled"] == 2 and fetcher.stats["skipped"] == 1
    assert [fetcher.read(p, r) for p, r in files] == [bytes(100)] * 4


@pytest.mark.timeout(20)
def test_a_planted_lock_link_is_refused_and_its_target_never_created(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    target = tmp_path / "outside" / "created-by-eviction"
    target.parent.mkdir()
    os.unlink(cache._lock_path) if os.path.lexists(cache._lock_path) else None
    os.symlink(target, cache._lock_path)
    with pytest.raises(OSError, match="link"):
        cache.evict()
    assert not target.exists()


@pytest.mark.timeout(20)
def test_a_planted_fifo_lock_is_refused_without_hanging(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    if os.path.lexists(cache._lock_path):
        os.unlink(cache._lock_path)
    os.mkfifo(cache._lock_path)
    with pytest.raises(OSError, match="FIFO"):
        cache.evict()


def test_a_planted_link_at_the_cache_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "d").mkdir()
    os.symlink(elsewhere, tmp_path / "d" / "lidarshard-cache-v2")
    with pytest.raises(OSError, match="symbolic link"):
        FileCache(tmp_path / "d", 1 << 20)
    assert list(elsewhere.iterdir()) == []


def test_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # world-writable, no sticky bit: anyone could swap our directory
    with pytest.raises(OSError, match="written by others"):
        FileCache(shared, 1 << 20)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o777 | stat.S_ISVTX)  # like /tmp: others cannot rename our entry
    cache = FileCache(sticky, 1 << 20)
    assert stat.S_IMODE(os.stat(cache.root).st_mode) == 0o700
    os.chmod(cache.root, 0o777)
    with pytest.raises(OSError, match="chmod go-w"):
        FileCache(sticky, 1 << 20)


def test_a_cache_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    (tmp_path / "d" / "lidarshard-cache-v2").mkdir(parents=True, mode=0o700)
    os.chown(tmp_path / "d" / "lidarshard-cache-v2", 65534, 65534)
    with pytest.raises(OSError, match="belongs to uid 65534"):
        FileCache(tmp_path / "d", 1 << 20)

"""transforms/io/storage.py: bounded reads, regular files only, atomic writes, listing, and the
pyarrow.fs filesystems (``mock://``, in memory) with the per-process filesystem cache."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import parquet_bytes


def test_paths() -> None:
    assert storage.is_local("/a/b") and storage.is_local("rel/x") and storage.is_local("file:///a")
    assert not storage.is_local("gs://b/x") and storage.has_scheme("file:///a")
    assert storage.join("gs://b/root/", "x", "y.json") == "gs://b/root/x/y.json"
    assert storage.join("/r", "x") == os.path.join("/r", "x")
    assert storage.absolute("gs://b/x") == "gs://b/x" and storage.absolute(None) is None
    assert storage.absolute("rel") == os.path.abspath("rel")
    assert storage.local_path("file:///tmp/x") == "/tmp/x"


def test_read_is_bounded_and_exact(tmp_path: Path) -> None:
    p = tmp_path / "f.bin"
    p.write_bytes(b"x" * 100)
    assert storage.read_bytes(str(p)) == b"x" * 100
    assert storage.read_bytes(f"file://{p}", 100) == b"x" * 100
    with pytest.raises(storage.FileTooLargeError) as err:
        storage.read_bytes(str(p), 99)
    assert (err.value.size, err.value.limit) == (100, 99) and str(p) in str(err.value)
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(str(tmp_path / "absent"))
    with pytest.raises(storage.NotRegularFileError, match="a directory"):
        storage.read_bytes(str(tmp_path))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.bin"
    os.mkfifo(fifo)
    done: list[BaseException] = []

    def read() -> None:
        try:
            storage.read_bytes(str(fifo), 10)
        except BaseException as e:  # handed to the main thread
            done.append(e)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout=20)
    assert not t.is_alive(), "reading a FIFO blocked"
    assert isinstance(done[0], storage.NotRegularFileError) and "FIFO" in str(done[0])


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_device_behind_a_symlink_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "cloud.bin"
    link.symlink_to("/dev/zero")
    with pytest.raises(storage.NotRegularFileError, match="character device"):
        storage.read_bytes(str(link))  # no cap: must still not read forever


def test_local_write_is_atomic_and_lists(tmp_path: Path) -> None:
    root = str(tmp_path / "out")
    storage.write_bytes(storage.join(root, "a", "b.bin"), b"12345")
    storage.write_json(storage.join(root, "m.json"), {"b": 1, "a": [1, 2]})
    assert storage.read_json(storage.join(root, "m.json")) == {"a": [1, 2], "b": 1}
    files = storage.list_files(root)
    assert sorted(files) == ["a/b.bin", "m.json"] and files["a/b.bin"].size == 5
    assert storage.size(storage.join(root, "a/b.bin")) == 5
    assert storage.exists(storage.join(root, "m.json")) and not storage.exists(root)
    assert storage.glob(f"{root}/**/*.bin") == [storage.join(root, "a", "b.bin")]
    storage.copy([storage.join(root, "m.json")], [storage.join(root, "c", "m.json")])
    storage.delete([storage.join(root, "m.json")])
    assert sorted(storage.list_files(root)) == ["a/b.bin", "c/m.json"]
    storage.remove_tree(root)
    assert storage.list_files(root) == {}


def test_failed_local_write_leaves_the_old_file(tmp_path: Path, monkeypatch) -> None:
    p = str(tmp_path / "m.json")
    storage.write_bytes(p, b"old")

    def boom(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(storage, "_commit", boom)  # the rename into place fails
    with pytest.raises(OSError, match="disk full"):
        storage.write_bytes(p, b"new")
    assert storage.read_bytes(p) == b"old" and os.listdir(tmp_path) == ["m.json"]


def test_arrow_backend_round_trip_and_filesystem_cache() -> None:
    storage._arrow_fs.cache_clear()  # mock:// keeps its files in the (cached) filesystem object
    root = "mock://bucket/run"
    table = pa.table({"x": [1, 2, 3]})
    storage.write_bytes(f"{root}/t.parquet", parquet_bytes(table))
    storage.write_bytes(f"{root}/sub/a.bin", b"abc")
    assert storage.read_parquet(f"{root}/t.parquet", ["x"]).equals(table)
    assert storage.read_bytes(f"{root}/sub/a.bin", 3) == b"abc"
    with pytest.raises(storage.FileTooLargeError):
        storage.read_bytes(f"{root}/sub/a.bin", 2)
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(f"{root}/absent", 10)
    assert sorted(storage.list_files(root)) == ["sub/a.bin", "t.parquet"]
    assert storage.size(f"{root}/sub/a.bin") == 3 and not storage.exists(f"{root}/sub")
    assert storage.glob(f"{root}/s*/**") == [f"{root}/sub/a.bin"]
    storage.copy([f"{root}/sub/a.bin"], [f"{root}/b.bin"])
    storage.remove_tree(f"{root}/sub")
    assert sorted(storage.list_files(root)) == ["b.bin", "t.parquet"]
    info = storage._arrow_fs.cache_info()
    assert info.misses == 1 and info.hits > 5  # one filesystem object for every call on the bucket


def test_streams_local_and_arrow(tmp_path: Path) -> None:
    """open_write: the file appears when the block ends, never on an error; open_read seeks."""
    storage._arrow_fs.cache_clear()
    for root in (str(tmp_path / "run"), "mock://bucket/streams"):
        path = storage.join(root, "d", "t.parquet")
        with storage.open_write(path) as f:
            pq.write_table(pa.table({"x": [1, 2, 3]}), f)
        with storage.open_read(path) as f:
            assert pq.ParquetFile(f).read().column("x").to_pylist() == [1, 2, 3]
    half = str(tmp_path / "run" / "half.bin")
    with pytest.raises(RuntimeError), storage.open_write(half) as f:
        f.write(b"partial")
        raise RuntimeError("worker died")
    assert sorted(os.listdir(tmp_path / "run")) == ["d"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_open_read_refuses_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "samples"
    os.mkfifo(fifo)
    with pytest.raises(storage.NotRegularFileError):
        storage.open_read(str(fifo))


def test_a_remote_glob_matches_within_and_across_folders() -> None:
    """``*``, ``?`` and ``[..]`` stay within a folder, ``**`` spans folders and ``**/`` may span none: the
    same pattern language on an object store as on a local disk."""
    storage._arrow_fs.cache_clear()
    root = "mock://bucket/glob"
    for rel in ("a.bin", "b.txt", "s/c.bin", "s/t/d.bin", "x1.bin", "x2.bin"):
        storage.write_bytes(f"{root}/{rel}", b"1")
    found = {p: [x.removeprefix(root + "/") for x in storage.glob(f"{root}/{p}")] for p in (
        "*.bin", "**/*.bin", "s/**", "x?.bin", "x[!1].bin", "*/c.bin")}  # fmt: skip
    assert found == {
        "*.bin": ["a.bin", "x1.bin", "x2.bin"],
        "**/*.bin": ["a.bin", "s/c.bin", "s/t/d.bin", "x1.bin", "x2.bin"],
        "s/**": ["s/c.bin", "s/t/d.bin"],
        "x?.bin": ["x1.bin", "x2.bin"],
        "x[!1].bin": ["x2.bin"],
        "*/c.bin": ["s/c.bin"],
    }
    storage.remove_tree(root)

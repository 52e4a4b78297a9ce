"""Plan-aware prefetch and the local cache (``lidarshard.loaders.fetch``): every batch carries the next
ones its DataLoader worker gets (exact under resume and elastic restarts), a worker reads them ahead
on a bounded pool, and every byte, prefetched or cached, is checked against the scan's record."""

from __future__ import annotations

import multiprocessing
import os
import threading
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from torch.utils.data import Dataset  # noqa: E402

from lidarshard.loaders.elastic import ElasticBatchSampler  # noqa: E402
from lidarshard.loaders.fetch import Fetcher, FileCache  # noqa: E402
from lidarshard.loaders.points import FileChangedError, Recorded  # noqa: E402
from lidarshard.loaders.position import PlannedBatch  # noqa: E402
from lidarshard.loaders.torch import BalancedBatchSampler, PlanLoader, PointCloudDataset  # noqa: E402
from lidarshard.transforms.io import storage  # noqa: E402
from tests.elastic_fixture import plan_manifest  # noqa: E402
from tests.helpers import build_bins_manifest  # noqa: E402
from tests.manifest_fixture import make_fixture  # noqa: E402
from tests.object_store import Handler  # noqa: E402

SIZES = [50 + 13 * i for i in range(26)]


# ------------------------------------------------------------------------------------ a slow store
class SlowStore(Handler):
    """``slow://NAME/...`` served from a local directory with a per-request delay, counting requests
    (a stand-in for an object store that lives in every forked worker too)."""

    roots: dict[str, Path] = {}
    delay = threading.Event()  # set: each request waits ``DELAY_S`` (a real wait on a socket would)
    requests: dict[str, int] = defaultdict(int)
    log: Path | None = None  # every request appended here too, from any process (forked workers)

    def _local(self, uri: str) -> Path:
        name, _, rest = uri.removeprefix("slow://").partition("/")
        return self.roots[name] / rest

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        out = []
        for path in paths:
            p = self._local(path)
            kind = pafs.FileType.File if p.is_file() else pafs.FileType.NotFound
            out.append(pafs.FileInfo(path, kind, size=p.stat().st_size if p.is_file() else None))
        return out

    def open_input_stream(self, path: str) -> pa.NativeFile:
        uri = f"slow://{path}"
        self.requests[uri] += 1
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(uri + "\n")
        self.delay.wait(0.02) if self.delay.is_set() else None
        p = self._local(path)
        if not p.is_file():
            raise FileNotFoundError(2, "no such file", uri)
        return pa.BufferReader(p.read_bytes())


storage.register_filesystem("slow", pafs.PyFileSystem(SlowStore()))


@pytest.fixture
def remote(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A manifest of 26 samples (2 sweeps each) whose data is read from ``slow://<name>/``."""
    out = make_fixture(tmp_path, SIZES, world_size=2, batch_size=3, epochs=2, sweeps=2, sweep_size=7)
    SlowStore.roots[tmp_path.name] = tmp_path / "data"
    SlowStore.requests.clear()
    SlowStore.log = tmp_path / "requests.log"
    return out, {str(tmp_path / "data"): f"slow://{tmp_path.name}"}


# ---------------------------------------------------------------------------------------- lookahead
def _ahead_is_the_plan(batches: list[PlannedBatch], k: int, stride: int) -> None:
    for n, b in enumerate(batches):
        want = [
            tuple(batches[m]) for m in range(n + stride, min(n + stride * k, len(batches) - 1) + 1, stride)
        ]
        assert list(b.ahead) == want[:k], (n, k, stride)


@settings(max_examples=20, deadline=None)
@given(k=st.integers(0, 3), stride=st.integers(1, 4), resume=st.integers(0, 4))
def test_each_batch_carries_the_next_ones_of_its_consumer(tmp_path_factory, k, stride, resume) -> None:
    tmp = tmp_path_factory.mktemp("ahead")
    out = make_fixture(tmp, SIZES, world_size=2, batch_size=3, epochs=2)
    sampler = BalancedBatchSampler(out, 1, 2)
    sampler.lookahead(k, stride)
    sampler.load_state_dict({**sampler.state_dict(), "step": resume})
    batches = list(sampler)
    assert [b.step for b in batches] == list(range(resume, resume + len(batches)))
    _ahead_is_the_plan(batches, k, stride)
    assert sampler.state_dict()["step"] == resume + len(batches)  # peeking ahead counts nothing


def test_lookahead_is_exact_across_an_elastic_restart(tmp_path: Path) -> None:
    costs = np.random.default_rng(4).uniform(1, 10, 80)
    out = plan_manifest(tmp_path / "out", costs, world_size=4, batch_size=2, epochs=1)
    saved = BalancedBatchSampler(out, 0, 4)
    for _ in zip(range(3), saved, strict=False):
        pass
    resumed = ElasticBatchSampler(out, 1, 2)
    resumed.load_state_dict(saved.state_dict())
    resumed.lookahead(2, 3)
    batches = list(resumed)
    assert batches and all(isinstance(b, PlannedBatch) for b in batches)
    _ahead_is_the_plan(batches, 2, 3)


class _Recording(Dataset):
    """Returns, per index, the worker that served it and the ``ahead`` its batch carried."""

    prefetch = 2

    def __len__(self) -> int:
        return 10**6

    def __getitems__(self, indices: list[int]) -> list[dict]:
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        return [{"i": i, "worker": worker, "ahead": getattr(indices, "ahead", ())} for i in indices]


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_plan_loader_hands_each_worker_its_own_next_batches(tmp_path: Path, workers: int) -> None:
    """The DataLoader gives batch n to worker n mod num_workers: what each batch says comes next for
    its worker is what that worker is then given."""
    out = make_fixture(tmp_path, SIZES, world_size=2, batch_size=3, epochs=2)
    sampler = BalancedBatchSampler(out, 0, 2)
    loader = PlanLoader(_Recording(), sampler, num_workers=workers, collate_fn=lambda items: items)
    got = list(loader)
    assert len(got) == len(sampler) == 4
    served: dict[int, list[tuple[int, ...]]] = defaultdict(list)
    for items in got:
        served[items[0]["worker"]].append(tuple(it["i"] for it in items))
    assert len(served) == max(1, min(workers, len(got)))
    for items in got:
        mine = served[items[0]["worker"]]
        n = mine.index(tuple(it["i"] for it in items))
        assert list(items[0]["ahead"]) == mine[n + 1 : n + 3]


# ------------------------------------------------------------------------------------------ Fetcher
def _files(tmp_path: Path, n: int, size: int = 1000) -> list[tuple[str, Recorded]]:
    files = []
    for k in range(n):
        data = os.urandom(size)
        p = tmp_path / f"f{k}.bin"
        p.write_bytes(data)
        files.append((str(p), Recorded(size, zlib.crc32(data))))
    return files


def test_fetcher_reads_ahead_within_its_bound_and_checks_every_byte(tmp_path: Path) -> None:
    files = _files(tmp_path, 12)
    fetcher = Fetcher(threads=4, max_bytes=5000)
    fetcher.prepare(files[:2], files[2:])  # the 2 needed now, then 3 ahead fit the 5000 bytes
    assert fetcher._held == 5000 and len(fetcher._pending) == 5 and fetcher.stats["skipped"] == 1
    for path, rec in files[:7]:
        assert fetcher.read(path, rec) == Path(path).read_bytes()
    assert fetcher.stats["hits"] + fetcher.stats["waited"] == 5 and fetcher.stats["direct"] == 2
    assert fetcher._held == 0
    path, rec = files[8]
    Path(path).write_bytes(b"x" * 1000)  # same size, other bytes: refused as any read would be
    fetcher.prepare([files[8]])
    with pytest.raises(FileChangedError, match=f"{path} is not the file the manifest was built from"):
        fetcher.read(path, rec)
    fetcher.prepare([], [files[9]])  # the plan moved on: nothing else stays pending
    assert list(fetcher._pending) == [files[9][0]]


def test_fetcher_starts_afresh_in_a_forked_worker(tmp_path: Path) -> None:
    files = _files(tmp_path, 3)
    fetcher = Fetcher(threads=2)
    fetcher.prepare(files)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply(_read_all, (fetcher, files))
    assert got == [Path(p).read_bytes() for p, _ in files]


def _read_all(fetcher: Fetcher, files: list) -> list[bytes]:
    fetcher.prepare(files)
    return [fetcher.read(p, r) for p, r in files]


# ---------------------------------------------------------------------------------------- FileCache
def test_cache_serves_only_what_matches_the_record_and_stays_bounded(tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "cache", max_bytes=4000)
    mine = tmp_path / "cache" / "notes.txt"
    mine.write_text("the user's")
    data = [os.urandom(1000) for _ in range(6)]
    recs = [Recorded(1000, zlib.crc32(d)) for d in data]
    for k, d in enumerate(data):
        cache.put(f"s3://b/{k}", d)
        assert cache.get(f"s3://b/{k}", recs[k]) == d
    assert cache.evict() <= 4000
    assert cache.get("s3://b/0", recs[0]) is None and cache.get("s3://b/5", recs[5]) == data[5]  # LRU
    assert cache.get("s3://b/5", Recorded(1000, recs[5].crc32 ^ 1)) is None  # other contents: a miss...
    assert cache.get("s3://b/5", recs[5]) is None  # ... and the entry is gone
    assert cache.get("s3://b/4", Recorded(None)) is None  # nothing recorded: never trusted
    assert mine.read_text() == "the user's"  # only its own entries are ever deleted
    stale, fresh = (Path(cache.root) / f"{'a' * 64}.lsc.tmp-{k}" for k in ("dead", "live"))
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(stale, (0, 0))  # a writer that died long ago; the other is writing now
    cache.evict()
    assert not stale.exists() and fresh.exists() and mine.exists()


def _hammer(root: str, seed: int) -> int:
    cache, rng, bad = FileCache(root, max_bytes=20_000), np.random.default_rng(seed), 0
    for _ in range(300):
        k = int(rng.integers(0, 40))
        data = np.random.default_rng(k).bytes(900 + k)
        got = cache.get(f"s3://b/{k}", Recorded(len(data), zlib.crc32(data)))
        if got is None:
            cache.put(f"s3://b/{k}", data)
        bad += got is not None and got != data
    return bad


def test_cache_is_safe_for_several_processes(tmp_path: Path) -> None:
    with multiprocessing.get_context("fork").Pool(4) as pool:
        assert pool.starmap(_hammer, [(str(tmp_path), s) for s in range(4)]) == [0, 0, 0, 0]
    assert FileCache(tmp_path, max_bytes=20_000).evict() <= 20_000


# ------------------------------------------------------------------------------- dataset and loader
def test_remote_dataset_prefetches_by_default_and_reads_the_same_points(remote) -> None:
    out, path_map = remote
    local = PointCloudDataset(out)
    far = PointCloudDataset(out, path_map=path_map)
    assert (local.prefetch, far.prefetch) == (0, 4)
    sampler = BalancedBatchSampler(out, 0, 2)
    loader = PlanLoader(far, sampler, num_workers=0, collate_fn=lambda items: items)
    SlowStore.delay.set()
    try:
        got = [it for batch in loader for it in batch]
    finally:
        SlowStore.delay.clear()
    for it in got:
        assert torch.equal(it["points"], local[it["index"]]["points"])
    files = {p for it in got for p, _ in far.files(it["index"])}
    assert sum(SlowStore.requests.values()) == len(files)  # one request a file: no stat, no re-read
    stats = far._fetcher.stats  # every file was asked for ahead of (or with) its batch, once
    assert stats["direct"] == 0 and stats["scheduled"] == stats["hits"] + stats["waited"] == len(files)


def test_remote_dataset_with_workers_and_a_cache(tmp_path: Path) -> None:
    """A built manifest (sizes and CRC-32s recorded): the first pass reads each file once over two
    workers, the second is served from the cache without a request."""
    out = build_bins_manifest(tmp_path, 24, 2, 2)
    SlowStore.roots["built"], SlowStore.log = tmp_path / "in", tmp_path / "requests.log"
    cache = FileCache(tmp_path / "cache", max_bytes=1 << 20)
    ds = PointCloudDataset(out, path_map={str(tmp_path / "in"): "slow://built"}, cache=cache, prefetch=2)
    want = [[int(i) for i in b] for b in BalancedBatchSampler(out, 1, 2)]
    files = {p for b in want for i in b for p, _ in ds.files(i)}
    for epoch in range(2):  # epoch 0's plan again: the second pass is served from the cache
        SlowStore.log.write_text("")
        sampler = BalancedBatchSampler(out, 1, 2)
        loader = PlanLoader(ds, sampler, num_workers=2, collate_fn=lambda items: items)
        got = [[it["index"] for it in batch] for batch in loader]
        assert got == want
        requested = SlowStore.log.read_text().split()
        assert sorted(requested) == (sorted(files) if epoch == 0 else []), epoch


def test_a_changed_remote_file_is_refused_through_the_prefetcher(tmp_path: Path) -> None:
    out = build_bins_manifest(tmp_path, 24, 2, 2)
    SlowStore.roots["changed"] = tmp_path / "in"
    ds = PointCloudDataset(out, path_map={str(tmp_path / "in"): "slow://changed"})
    first = list(BalancedBatchSampler(out, 0, 2))[0]
    path = ds.files(first[1])[0][0]
    local = SlowStore()._local(path)
    local.write_bytes(local.read_bytes()[:-16])
    loader = PlanLoader(ds, BalancedBatchSampler(out, 0, 2), collate_fn=lambda items: items)
    with pytest.raises(FileChangedError, match=f"{path} is not the file the manifest was built from"):
        next(iter(loader))

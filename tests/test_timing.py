"""lidarshard.loaders.step_timer: the step recorder's files (atomic, schema, restart), its clocks (host, and
accelerator events through a fake), PlanLoader steps, and a real 2-rank gloo DDP run."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from lidarshard.loaders.step_timer import TIMING_SCHEMA, StepTimer, read_timing_files
from lidarshard.transforms.io import storage


def _files(d: Path) -> list[str]:
    """The files a timer wrote, less its per-rank lock files (``.timings-rank-RRRRR.lock``)."""
    return sorted(p.name for p in d.iterdir() if not p.name.startswith(".timings-rank-"))


def test_cpu_steps_are_written_per_rank_with_the_schema_and_sample_ids(tmp_path: Path) -> None:
    with StepTimer(str(tmp_path), rank=3, world_size=4, flush_every=100, device="cpu") as timer:
        for step in range(5):
            with timer.step(0, step, [f"s{step}a", f"s{step}b"]):
                pass
        timer.start(0, 5, ["x"])
        timer.mark_compute_done()
        timer.stop()
        assert _files(tmp_path) == []  # nothing flushed before flush_every / close
    assert _files(tmp_path) == ["timings-rank-00003-part-00000.parquet"]
    table = pq.read_table(tmp_path / "timings-rank-00003-part-00000.parquet")
    assert table.schema.equals(TIMING_SCHEMA, check_metadata=False)
    rows = table.to_pylist()
    assert [r["step"] for r in rows] == list(range(6))
    assert rows[2]["sample_ids"] == ["s2a", "s2b"] and rows[5]["sample_ids"] == ["x"]
    assert {(r["rank"], r["world_size"], r["epoch"], r["device"]) for r in rows} == {(3, 4, 0, "cpu")}
    assert [r["method"] for r in rows] == ["step"] * 5 + ["mark"]
    assert all(0 <= r["compute_s"] <= r["wall_s"] for r in rows)
    assert all(r["compute_s"] == r["wall_s"] for r in rows[:5])  # no mark: the whole step


def test_flush_every_and_each_new_epoch_write_a_part(tmp_path: Path) -> None:
    timer = StepTimer(str(tmp_path), rank=0, world_size=1, flush_every=3, device="cpu")
    for epoch, steps in ((0, 4), (1, 2)):
        for step in range(steps):
            with timer.step(epoch, step):
                pass
    # epoch 0: 3 rows at flush_every, 1 row when epoch 1 starts; epoch 1's 2 rows still buffered
    assert [pq.read_table(tmp_path / f).num_rows for f in _files(tmp_path)] == [3, 1]
    timer.close()
    assert len(_files(tmp_path)) == 3 and read_timing_files(str(tmp_path)).num_rows == 6


def test_a_restarted_run_appends_and_a_replayed_step_keeps_the_latest(tmp_path: Path) -> None:
    with StepTimer(str(tmp_path), rank=1, world_size=2, device="cpu") as first:
        for step in range(5):
            with first.step(0, step, [f"first{step}"]):
                pass
    with StepTimer(str(tmp_path), rank=1, world_size=2, device="cpu") as again:  # resumed at step 3
        for step in range(3, 7):
            with again.step(0, step, [f"again{step}"]):
                pass
    assert _files(tmp_path) == [
        "timings-rank-00001-part-00000.parquet",
        "timings-rank-00001-part-00001.parquet",
    ]
    rows = read_timing_files(str(tmp_path)).to_pylist()
    assert [r["step"] for r in rows] == list(range(7))
    assert [r["sample_ids"][0] for r in rows] == [
        "first0",
        "first1",
        "first2",
        *(f"again{s}" for s in range(3, 7)),
    ]
    one = read_timing_files(str(tmp_path / "timings-rank-00001-part-00000.parquet"))
    assert one.num_rows == 5


def test_a_failed_write_leaves_no_file_and_keeps_the_rows(tmp_path: Path, monkeypatch) -> None:
    timer = StepTimer(str(tmp_path), rank=0, world_size=1, device="cpu")
    for step in range(3):
        with timer.step(0, step):
            pass
    real = storage._commit

    def broken(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(storage, "_commit", broken)  # the rename into place fails
    with pytest.raises(OSError, match="disk full"):
        timer.flush()
    assert _files(tmp_path) == []  # neither the part nor a temp file
    monkeypatch.setattr(storage, "_commit", real)
    assert timer.flush() is not None
    assert read_timing_files(str(tmp_path)).column("step").to_pylist() == [0, 1, 2]


def test_misuse_and_foreign_files_are_refused(tmp_path: Path) -> None:
    timer = StepTimer(str(tmp_path), rank=0, world_size=1, device="cpu")
    with pytest.raises(RuntimeError, match="without start"):
        timer.stop()
    timer.start(0, 0)
    with pytest.raises(RuntimeError, match="still open"):
        timer.start(0, 1)
    with pytest.raises(ValueError, match="rank"):
        StepTimer(str(tmp_path), rank=2, world_size=2)
    with pytest.raises(ValueError, match="no timings"):
        read_timing_files(str(tmp_path))
    pq.write_table(
        TIMING_SCHEMA.empty_table().drop_columns(["compute_s"]),
        tmp_path / "timings-rank-00000-part-00000.parquet",
    )
    with pytest.raises(ValueError, match="not a lidarshard timings file .*compute_s"):
        read_timing_files(str(tmp_path))


def test_an_exception_in_the_step_is_not_recorded(tmp_path: Path) -> None:
    timer = StepTimer(str(tmp_path), rank=0, world_size=1, device="cpu")
    with pytest.raises(KeyError), timer.step(0, 0):
        raise KeyError("boom")
    with timer.step(0, 1):
        pass
    timer.close()
    assert read_timing_files(str(tmp_path)).column("step").to_pylist() == [1]


class _FakeEvent:
    """A stand-in for ``torch.Event``: records the fake device time; complete once ``done`` is set."""

    now = 0.0
    done = False
    made: list[_FakeEvent] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t: float | None = None
        _FakeEvent.made.append(self)

    def record(self) -> None:
        self.t = _FakeEvent.now

    def query(self) -> bool:
        return _FakeEvent.done

    def synchronize(self) -> None:
        _FakeEvent.done = True

    def elapsed_time(self, end: _FakeEvent) -> float:
        assert _FakeEvent.done and self.t is not None and end.t is not None
        return (end.t - self.t) * 1000.0  # ms, like torch


def test_accelerator_events_time_steps_without_waiting_on_the_host(tmp_path: Path, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    accelerator = SimpleNamespace(  # torch_npu's; torch.accelerator is absent before torch 2.6
        current_accelerator=lambda *a, **k: SimpleNamespace(type="npu"),
        current_device_index=lambda: 1,
        is_available=lambda: True,
    )
    monkeypatch.setattr(torch, "accelerator", accelerator, raising=False)
    monkeypatch.setattr(torch, "Event", _FakeEvent, raising=False)  # torch.Event: torch >= 2.3
    monkeypatch.setattr(_FakeEvent, "made", [])
    timer = StepTimer(str(tmp_path), rank=0, world_size=2, flush_every=10)
    assert timer.device == "npu:1"
    for step, (compute, wall) in enumerate([(0.25, 0.5), (0.125, 0.75)]):
        base = _FakeEvent.now
        timer.start(0, step, [str(step)])
        _FakeEvent.now = base + compute
        timer.mark_compute_done()
        _FakeEvent.now = base + wall
        timer.stop()
    assert len(timer._pending) == 2  # the device has not reached them: no row, no host wait
    timer.flush()  # synchronizes
    rows = read_timing_files(str(tmp_path)).to_pylist()
    assert [(r["compute_s"], r["wall_s"]) for r in rows] == [(0.25, 0.5), (0.125, 0.75)]
    assert {(r["device"], r["method"]) for r in rows} == {("npu:1", "mark")}
    assert len(_FakeEvent.made) == 6
    timer.close()  # one process records a rank: the next timer of rank 0 may start now
    with pytest.raises(ValueError, match="current accelerator is 'npu'"):
        StepTimer(str(tmp_path), rank=0, world_size=1, device="cuda")
    assert StepTimer(str(tmp_path), rank=0, world_size=1, device="cpu").device == "cpu"


def test_steps_over_a_plan_loader_take_epoch_step_and_sample_ids(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from lidarshard.loaders.torch import BalancedBatchSampler, PlanLoader, PointCloudDataset, collate
    from tests.manifest_fixture import make_fixture

    out = make_fixture(tmp_path, [50 + 13 * i for i in range(12)], world_size=2, batch_size=2, epochs=2)
    sampler = BalancedBatchSampler(out, 1, 2)
    loader = PlanLoader(PointCloudDataset(out), sampler, collate_fn=collate)
    timer = StepTimer(str(tmp_path / "t"), device="cpu", rank=1, world_size=2)
    seen = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for batch in timer.steps(loader):
            seen.append((epoch, list(batch["sample_id"])))
    timer.close()
    rows = read_timing_files(str(tmp_path / "t")).to_pylist()
    assert [(r["epoch"], r["sample_ids"]) for r in rows] == seen
    assert [r["step"] for r in rows] == [s for e in range(2) for s in range(len(seen) // 2)]
    with pytest.raises(TypeError, match="epoch="):
        next(timer.steps([1, 2]))
    assert [b for b in timer.steps([{"sample_id": ["q"]}], epoch=4, start=7)] == [{"sample_id": ["q"]}]
    timer.close()
    last = read_timing_files(str(tmp_path / "t")).to_pylist()[-1]
    assert (last["epoch"], last["step"], last["sample_ids"]) == (4, 7, ["q"])


# ------------------------------------------------------------------------------ real DDP, 2 gloo ranks

SLOW_S = 0.2  # rank 1's extra forward time per step


def _ddp_worker(rank: int, rendezvous: str, directory: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if rank == 1:
                time.sleep(SLOW_S)  # more work on rank 1
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    model = DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    timer = StepTimer(directory, device="cpu")
    timer.attach_ddp(model)
    x = torch.randn(8, 16)
    for step in range(4):
        with timer.step(0, step, [f"r{rank}s{step}"]):
            model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    timer.close()
    del model, opt, timer  # DDP's reducer must go before its process group, else gloo can abort at exit
    gc.collect()
    dist.destroy_process_group()


@pytest.mark.slow  # 2 spawned torch processes under DDP
def test_ddp_hook_shows_the_slow_rank_that_wall_time_hides(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import torch.multiprocessing as mp

    if not torch.distributed.is_available():
        pytest.skip("torch.distributed unavailable")
    mp.spawn(_ddp_worker, args=(str(tmp_path / "rdv"), str(tmp_path / "t")), nprocs=2, join=True)
    rows = read_timing_files(str(tmp_path / "t")).to_pylist()
    assert [(r["rank"], r["step"]) for r in rows] == [(r, s) for s in range(4) for r in range(2)]
    assert {(r["method"], r["world_size"]) for r in rows} == {("ddp_first_bucket", 2)}
    assert rows[1]["sample_ids"] == ["r1s0"]
    for step in range(1, 4):  # step 0 includes DDP's first-iteration setup
        fast, slow = rows[2 * step], rows[2 * step + 1]
        assert slow["compute_s"] >= SLOW_S  # rank 1's own compute holds the sleep
        assert fast["compute_s"] < SLOW_S / 2  # rank 0's does not ...
        assert fast["wall_s"] >= SLOW_S * 0.75 > fast["compute_s"]  # ... but its wall time waits for rank 1

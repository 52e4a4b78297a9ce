"""The recorder's per-step peak device memory (``peak_bytes``): read from the device module's
``max_memory_allocated`` after ``reset_peak_memory_stats`` (CUDA, torch_npu; faked here), null on CPU, and
files written before the column existed still read."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard.loaders.timing import TIMING_SCHEMA, StepTimer, read_timing_files


class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _Event) -> float:
        return 5.0


class _Allocator:
    """A device module's memory counters: ``allocate`` raises the peak; ``reset`` starts it again at the
    bytes held now (as ``torch.cuda.reset_peak_memory_stats`` does)."""

    def __init__(self, index: int) -> None:
        self.index, self.held, self.peak, self.resets = index, 1000, 1000, 0

    def allocate(self, n: int) -> None:
        self.held += n
        self.peak = max(self.peak, self.held)

    def free(self, n: int) -> None:
        self.held -= n

    def reset_peak_memory_stats(self, device: int) -> None:
        assert device == self.index
        self.peak, self.resets = self.held, self.resets + 1

    def max_memory_allocated(self, device: int) -> int:
        assert device == self.index
        return self.peak


def _device(kind: str, index: int, accelerator_api: bool) -> tuple[SimpleNamespace, _Allocator]:
    """A fake torch whose ``kind`` module (cuda / npu) is usable at ``index`` and reports memory; with
    ``accelerator_api`` it also has torch 2.6's ``torch.accelerator``."""
    mem = _Allocator(index)
    module = SimpleNamespace(
        is_available=lambda: True,
        current_device=lambda: index,
        Event=_Event,
        reset_peak_memory_stats=mem.reset_peak_memory_stats,
        max_memory_allocated=mem.max_memory_allocated,
    )
    torch = SimpleNamespace(**{kind: module})
    if accelerator_api:
        torch.accelerator = SimpleNamespace(
            is_available=lambda: True,
            current_accelerator=lambda *a, **k: SimpleNamespace(type=kind),
            current_device_index=lambda: index,
        )
    return torch, mem


@pytest.mark.parametrize(
    ("kind", "index", "accelerator_api"), [("cuda", 0, False), ("npu", 2, False), ("npu", 1, True)]
)
def test_each_step_records_its_own_peak(tmp_path: Path, monkeypatch, kind, index, accelerator_api) -> None:
    torch, mem = _device(kind, index, accelerator_api)
    monkeypatch.setitem(sys.modules, "torch", torch)
    timer = StepTimer(str(tmp_path), rank=0, world_size=1)
    assert timer.device == f"{kind}:{index}"
    for step, (first, second) in enumerate([(500, 200), (100, 50)]):
        with timer.step(0, step, [str(step)]):
            mem.allocate(first)  # activations
            mem.free(first)
            mem.allocate(second)  # kept past the step (e.g. optimizer state)
    timer.close()
    rows = read_timing_files(str(tmp_path)).to_pylist()
    # step 0 starts at 1000 held: peak 1500; step 1 starts at 1200 held: peak 1300 (the reset worked)
    assert [r["peak_bytes"] for r in rows] == [1500, 1300]
    assert mem.resets == 2


def test_cpu_steps_record_no_peak_and_given_steps_may(tmp_path: Path) -> None:
    with StepTimer(str(tmp_path), rank=0, world_size=1, device="cpu") as timer:
        with timer.step(0, 0, ["a"]):
            pass
        timer.record(0, 1, ["b"], 0.5, peak_bytes=7 << 30)
        timer.record(0, 2, ["c"], 0.5)
    table = read_timing_files(str(tmp_path))
    assert table.schema.equals(TIMING_SCHEMA, check_metadata=False)
    assert table.column("peak_bytes").to_pylist() == [None, 7 << 30, None]  # never a made-up number


def test_a_file_without_the_column_reads_as_no_peak(tmp_path: Path) -> None:
    with StepTimer(str(tmp_path), rank=0, world_size=1, device="cpu") as timer:
        timer.record(0, 0, ["a"], 0.25, peak_bytes=99)
    (path,) = tmp_path.glob("timings-rank-*.parquet")
    old = pq.read_table(path).drop_columns(["peak_bytes"])  # as timings 1 wrote it
    pq.write_table(old, path)
    (row,) = read_timing_files(str(tmp_path)).to_pylist()
    assert row["peak_bytes"] is None and row["compute_s"] == 0.25


def test_a_negative_peak_is_refused_when_given_and_when_read(tmp_path: Path) -> None:
    timer = StepTimer(str(tmp_path), rank=0, world_size=1, device="cpu")
    with pytest.raises(ValueError, match="peak_bytes"):
        timer.record(0, 0, ["a"], 0.1, peak_bytes=-1)
    timer.record(0, 0, ["a"], 0.1, peak_bytes=5)
    timer.close()
    (path,) = tmp_path.glob("timings-rank-*.parquet")
    table = pq.read_table(path)
    forged = table.set_column(
        table.schema.get_field_index("peak_bytes"), "peak_bytes", pa.array([-3], pa.int64())
    )
    pq.write_table(forged, path)
    with pytest.raises(ValueError, match="row 0 records peak_bytes -3"):
        read_timing_files(str(tmp_path))


def test_a_device_module_without_memory_stats_records_null(tmp_path: Path, monkeypatch) -> None:
    module = SimpleNamespace(is_available=lambda: True, current_device=lambda: 0, Event=_Event)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=module))
    with StepTimer(str(tmp_path), rank=0, world_size=1) as timer:
        assert timer.device == "cuda:0"
        with timer.step(0, 0):
            pass
    (row,) = read_timing_files(str(tmp_path)).to_pylist()
    assert row["peak_bytes"] is None and row["wall_s"] == 0.005

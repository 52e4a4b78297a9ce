"""The step-time recorder (``loaders.timing.StepTimer``) against careless use and every torch build.

Promises: one process records one rank of a directory (a second is refused in one line, not half the
rows lost later); a directory that cannot hold files is refused when the timer is made, not at the
first flush hours in; a key out of the files' range is refused at that step and the timer goes on; on
each torch build (CPU wheel, CUDA wheel without a GPU, torch 2.1-2.5 with CUDA or torch_npu) the clock
is what is really there, and an accelerator step is never timed by the host clock without saying so;
where the device module reports memory (CUDA, torch_npu) each step's peak is recorded (``peak_bytes``,
null on CPU, and files written before the column read as null).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard.loaders.timing import TIMING_SCHEMA, StepTimer, read_timing_files

pytestmark = pytest.mark.hostile("recorder")


def test_two_processes_cannot_record_one_rank_into_one_directory(tmp_path: Path) -> None:
    first = StepTimer(str(tmp_path), rank=0, world_size=2, device="cpu")
    with pytest.raises(ValueError, match="another process records rank 0 into .*rank=") as err:
        StepTimer(str(tmp_path), rank=0, world_size=2, device="cpu")  # e.g. made before init_process_group
    assert "\n" not in str(err.value)
    other = StepTimer(str(tmp_path), rank=1, world_size=2, device="cpu")  # another rank: its own lock
    for timer in (first, other):
        with timer.step(0, 0, [f"r{timer.rank}"]):
            pass
        timer.close()
    again = StepTimer(str(tmp_path), rank=0, world_size=2, device="cpu")  # closed: free again
    again.close()
    assert read_timing_files(str(tmp_path)).column("rank").to_pylist() == [0, 1]


def test_the_rank_comes_from_torchrun_before_init_process_group(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    timer = StepTimer(str(tmp_path), device="cpu")
    assert (timer.rank, timer.world_size) == (3, 4)
    timer.close()


@pytest.mark.parametrize("where", ["under a file", "a file"])
def test_a_directory_that_cannot_hold_files_is_refused_when_made(tmp_path: Path, where: str) -> None:
    (tmp_path / "f").write_text("x")
    path = tmp_path / "f" / "timings" if where == "under a file" else tmp_path / "f"
    with pytest.raises(ValueError, match=f"timings directory {path}") as err:
        StepTimer(str(path), rank=0, world_size=1, device="cpu")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad", [2**31, 2**40, -1])
@pytest.mark.parametrize("key", ["epoch", "step"])
def test_a_key_out_of_range_is_refused_and_the_timer_goes_on(tmp_path: Path, key: str, bad: int) -> None:
    timer = StepTimer(str(tmp_path), rank=0, world_size=1, device="cpu")
    with timer.step(0, 0):
        pass
    args = {"epoch": 0, "step": 1} | {key: bad}
    with pytest.raises(ValueError, match=key):
        timer.start(args["epoch"], args["step"])
    with pytest.raises(ValueError, match=key):
        timer.record(args["epoch"], args["step"], ["x"], 0.1)
    with timer.step(0, 2):
        pass
    timer.record(0, 3, ["y"], 0.1)
    timer.close()
    assert read_timing_files(str(tmp_path)).column("step").to_pylist() == [0, 2, 3]


# ------------------------------------------------------------------------------ torch builds, faked
class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t = 0.0

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _Event) -> float:
        return 5.0


def _module(available: bool, device: int = 0, event: type | None = _Event) -> SimpleNamespace:
    mod = SimpleNamespace(is_available=lambda: available, current_device=lambda: device)
    if event is not None:
        mod.Event = event
    return mod


def _accelerator(kind: str | None, available: bool, index: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        is_available=lambda: available,
        current_accelerator=lambda *a, **k: None if kind is None else SimpleNamespace(type=kind),
        current_device_index=lambda: index,
    )


BUILDS = {
    # name: (fake torch, the device "auto" picks)
    "cpu wheel, torch 2.13": (
        SimpleNamespace(accelerator=_accelerator(None, False), cuda=_module(False)),
        "cpu",
    ),
    "cuda wheel on a cpu node, torch 2.13": (
        SimpleNamespace(accelerator=_accelerator("cuda", False), cuda=_module(False), Event=_Event),
        "cpu",
    ),
    "cuda wheel with a gpu, torch 2.13": (
        SimpleNamespace(accelerator=_accelerator("cuda", True, 1), cuda=_module(True, 1)),
        "cuda:1",
    ),
    "cpu wheel, torch 2.1": (SimpleNamespace(cuda=_module(False)), "cpu"),
    "cuda wheel on a cpu node, torch 2.1": (SimpleNamespace(cuda=_module(False)), "cpu"),
    "cuda with a gpu, torch 2.1": (SimpleNamespace(cuda=_module(True, 2)), "cuda:2"),
    "torch_npu on torch 2.1": (SimpleNamespace(cuda=_module(False), npu=_module(True, 3)), "npu:3"),
    "torch_npu on torch 2.6 (accelerator API)": (
        SimpleNamespace(accelerator=_accelerator("npu", True, 0), npu=_module(True, 0)),
        "npu:0",
    ),
}


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_auto_picks_what_each_torch_build_really_has(tmp_path: Path, monkeypatch, build: str) -> None:
    fake, expected = BUILDS[build]
    monkeypatch.setitem(sys.modules, "torch", fake)
    timer = StepTimer(str(tmp_path), rank=0, world_size=1)
    assert timer.device == expected
    with timer.step(0, 0):
        pass
    timer.close()
    (row,) = read_timing_files(str(tmp_path)).to_pylist()
    assert row["device"] == expected
    if expected != "cpu":
        assert row["wall_s"] == 0.005  # the device's events, not the host clock
    if expected == "cpu":  # insisting on an accelerator that is not usable here is one line
        with pytest.raises(ValueError, match="no usable accelerator here: pass device='cpu'"):
            StepTimer(str(tmp_path), rank=0, world_size=1, device="cuda")


def test_an_accelerator_without_timing_events_is_refused_not_host_timed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=_module(True, 0, event=None)))
    with pytest.raises(ValueError, match="no timing events .*device='cpu'"):
        StepTimer(str(tmp_path), rank=0, world_size=1)
    assert StepTimer(str(tmp_path), rank=0, world_size=1, device="cpu").device == "cpu"


# ------------------------------------------------------------------------------ peak device memory
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

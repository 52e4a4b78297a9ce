"""Per-rank step timings from normal training: each rank's own compute time and sample ids, to Parquet.

A :class:`StepTimer` records per step of this rank its own compute time (``compute_s``), the whole step
(``wall_s``, collectives included), the samples and, where the device reports memory, the peak allocated
bytes (``peak_bytes``, null on CPU), as ``DIR/timings-rank-RRRRR-part-PPPPP.parquet`` (``TIMING_SCHEMA``;
a restarted run adds parts). ``lidarshard calibrate OUT --timings DIR`` fits the cost model to them.

Under DDP the step time includes waiting for the slowest rank at the all-reduce, which hides the very
imbalance to measure, so ``compute_s`` ends before any communication: :meth:`StepTimer.attach_ddp` marks
the first ready gradient bucket, a loop with its own collective calls :meth:`StepTimer.mark_compute_done`,
a plain loop times the whole step. Accelerators time with their events, never a host wait; CPU with
``time.perf_counter`` (``lidarshard.loaders.clocks``). One process records one rank of a directory (a lock
file per rank). Usage: docs/GUIDE.md ("Timing from training itself"). torch is optional here.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from lidarshard.loaders.clocks import clock_for
from lidarshard.loaders.reader import check_int
from lidarshard.loaders.timing_files import (
    MAX_PEAK_BYTES,
    MAX_STEP_S,
    METHODS,
    PART_PATTERN,
    TIMING_FIELDS,
    TIMING_SCHEMA,
    read_timing_files,
    timing_file,
)
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.safeio import open_own

__all__ = [
    "TIMING_FIELDS",
    "TIMING_SCHEMA",
    "METHODS",
    "StepTimer",
    "ddp_timing_hook",
    "timing_file",
    "read_timing_files",
]

T = TypeVar("T")
_INT32_MAX = 2**31 - 1


def _lock_rank(directory: str, rank: int) -> int | None:
    """Make a local timings ``directory`` and hold ``DIR/.timings-rank-RRRRR.lock`` (an exclusive
    ``flock``, released by ``close()`` or the process's end): two processes recording one rank into one
    directory would overwrite each other's part files. None for a URI (no lock there).

    Raises:
        ValueError: the directory cannot be made (e.g. under a regular file), or another process
            holds the rank (one line saying what to pass).
    """
    if not storage.is_local(directory):
        return None
    local = storage.local_path(directory)
    try:
        os.makedirs(local, exist_ok=True)
        fd = open_own(os.path.join(local, f".timings-rank-{rank:05d}.lock"), os.O_RDWR | os.O_CREAT)
    except OSError as e:
        raise ValueError(f"timings directory {directory}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ValueError(
            f"another process records rank {rank} into {directory}: give each process its rank "
            "(StepTimer(rank=...), or make the timer after torch.distributed.init_process_group)"
        ) from None
    return fd


def _dist_rank() -> tuple[int, int]:
    """(rank, world size) from ``torch.distributed`` when initialized, else from torchrun's ``RANK`` and
    ``WORLD_SIZE`` (a timer made before ``init_process_group``), else (0, 1)."""
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None  # type: ignore[assignment]
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None and rank.isdigit() and world.isdigit():
        return int(rank), int(world)
    return 0, 1


@dataclass
class _Open:
    """A step being timed: its keys and marks (floats or events)."""

    epoch: int
    step: int
    ids: list[str]
    start: Any
    mark: Any = None
    method: str = "step"
    peak: int | None = None  # the device's peak allocated bytes over the step, where it reports one


class StepTimer:
    """Records this rank's own compute time and sample ids per step into ``directory``.

    Args:
        directory: where the ``timings-rank-RRRRR-part-PPPPP.parquet`` files go (e.g. the checkpoints'
            folder; local or any ``lidarshard.transforms.io.storage`` URL).
        rank, world_size: default from ``torch.distributed`` when initialized, else 0 and 1.
        flush_every: write the buffered rows after this many steps (also at a new epoch and at close).
        device: "auto" (the current accelerator's events, else the host clock), "cpu" (host clock) or
            the accelerator type ("cuda", "npu", ...) to insist on events.
    """

    def __init__(
        self,
        directory: str,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        flush_every: int = 1000,
        device: str = "auto",
    ) -> None:
        found_rank, found_world = _dist_rank()
        self.world_size = check_int("world_size", found_world if world_size is None else world_size, 1)
        self.rank = check_int("rank", found_rank if rank is None else rank, 0, self.world_size - 1)
        self.flush_every = check_int("flush_every", flush_every, 1)
        self.directory = str(directory)
        self._clock = clock_for(device)
        self._lock = _lock_rank(self.directory, self.rank)  # last: nothing after it can fail
        self.device = self._clock.device
        self._open: _Open | None = None
        self._pending: list[tuple[_Open, Any]] = []  # (step, end mark) not yet resolved
        self._rows: dict[str, list[Any]] = {name: [] for name in TIMING_SCHEMA.names}
        self._part: int | None = None  # next part number, found at the first flush
        self._epoch: int | None = None

    # ------------------------------------------------------------------ the per-step API
    @property
    def in_step(self) -> bool:
        """A step is open: started and not yet stopped."""
        return self._open is not None

    def start(self, epoch: int, step: int, sample_ids: Sequence[str] = ()) -> None:
        """Begin timing step ``step`` of ``epoch`` on this rank's ``sample_ids``."""
        if self._open is not None:
            raise RuntimeError(
                f"step {self._open.step} of epoch {self._open.epoch} is still open: stop() it first"
            )
        self._begin(epoch, step)
        if self._clock.peak is not None:
            self._clock.peak.reset()
        self._open = _Open(epoch, step, [str(s) for s in sample_ids], self._clock.now())

    def mark_compute_done(self) -> None:
        """This rank's own compute of the open step ends now (call it before your own collective)."""
        self._mark("mark")

    def stop(self) -> None:
        """End the open step; its row is written at the next flush (events: once the device reached it)."""
        if self._open is None:
            raise RuntimeError("stop() without start()")
        if self._clock.peak is not None:
            self._open.peak = self._clock.peak.read()
        self._pending.append((self._open, self._clock.now()))
        self._open = None
        self._resolve(wait=False)
        self._flush_if_full()

    def record(
        self,
        epoch: int,
        step: int,
        sample_ids: Sequence[str],
        compute_s: float,
        wall_s: float | None = None,
        peak_bytes: int | None = None,
    ) -> None:
        """Add a step timed elsewhere (a profiler, a simulation): ``compute_s`` and ``wall_s`` in seconds
        (``wall_s`` defaults to ``compute_s``), ``peak_bytes`` its peak device memory (None: not known);
        written like timed steps, ``method`` "given"."""
        wall = compute_s if wall_s is None else wall_s
        if not 0 <= compute_s <= wall <= MAX_STEP_S:  # what read_timing_files takes back
            raise ValueError(f"need 0 <= compute_s <= wall_s <= {MAX_STEP_S:g}, got {compute_s} and {wall}")
        if peak_bytes is not None:
            check_int("peak_bytes", peak_bytes, 0, MAX_PEAK_BYTES)  # what read_timing_files takes back
        given = _Open(epoch, step, [str(s) for s in sample_ids], None, None, "given", peak_bytes)
        self._begin(epoch, step)
        self._append(given, compute_s, wall)
        self._flush_if_full()

    @contextmanager
    def step(self, epoch: int, step: int, sample_ids: Sequence[str] = ()) -> Iterator[None]:
        """``with timer.step(epoch, step, ids): ...`` times the block as one step (not on an exception)."""
        self.start(epoch, step, sample_ids)
        try:
            yield
        except BaseException:
            self._open = None
            raise
        self.stop()

    def steps(self, batches: Iterable[T], epoch: int | None = None, start: int = 0) -> Iterator[T]:
        """Yield ``batches``, timing each loop body (from receiving a batch to asking for the next) as a step.

        Args:
            batches: a ``PlanLoader`` (epoch and step come from its ``state_dict()``) or any iterable.
            epoch: the epoch of a plain iterable (required then); ``start``: its first step number.

        Sample ids come from a batch's ``"sample_id"`` entry (``loaders.dataset.collate`` puts them
        there), else none are recorded. Leaving the loop (``break``) records the step it was in.
        """
        state = getattr(batches, "state_dict", None)
        if epoch is None and state is None:
            raise TypeError("steps(): pass epoch= for an iterable without state_dict() (not a PlanLoader)")
        step = start
        for batch in batches:
            if epoch is None:
                st = state()  # type: ignore[misc]
                if not isinstance(st, dict) or not {"epoch", "step"} <= st.keys():
                    raise TypeError("steps(): pass epoch= unless the loader is a PlanLoader")
                this_epoch, step = int(st["epoch"]), int(st["step"]) - 1  # delivered: step + 1
            else:
                this_epoch = epoch
            ids = batch.get("sample_id", ()) if isinstance(batch, dict) else ()
            self.start(this_epoch, step, ids)
            try:
                yield batch
            finally:
                if self._open is not None:
                    self.stop()
            step += 1

    def attach_ddp(self, model: Any, process_group: Any = None) -> None:
        """Register :func:`ddp_timing_hook` on a ``DistributedDataParallel`` model (before its first step).

        The hook marks the first gradient bucket of each timed step ready, then all-reduces as DDP's
        default does (``process_group`` None: the default group).
        """
        model.register_comm_hook(_HookState(self, process_group), ddp_timing_hook)

    # ------------------------------------------------------------------ files
    def flush(self) -> str | None:
        """Write the finished steps' rows as the next part file (atomic); returns its path, or None."""
        self._resolve(wait=True)
        if not self._rows["step"]:
            return None
        if self._part is None:
            mine = storage.join(self.directory, f"timings-rank-{self.rank:05d}-part-*.parquet")
            parts = [PART_PATTERN.search(p) for p in storage.glob(mine)]
            self._part = 1 + max((int(m.group(2)) for m in parts if m), default=-1)
        table = pa.table(self._rows, schema=TIMING_SCHEMA)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        path = timing_file(self.directory, self.rank, self._part)
        storage.write_bytes(path, sink.getvalue().to_pybytes())  # local: temp name + os.replace
        self._part += 1
        self._rows = {name: [] for name in self._rows}
        return path

    def close(self) -> None:
        """Flush what is left (an open step is dropped) and let another timer record this rank."""
        self._open = None
        try:
            self.flush()
        finally:
            if self._lock is not None:
                os.close(self._lock)
                self._lock = None

    def __enter__(self) -> StepTimer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _begin(self, epoch: int, step: int) -> None:
        """Check a new step's keys; flush the rows of the previous epoch when ``epoch`` is another."""
        check_int("epoch", epoch, 0, _INT32_MAX)  # the files' int32 columns: checked here, not at a flush
        check_int("step", step, 0, _INT32_MAX)
        if self._epoch is not None and epoch != self._epoch:
            self.flush()  # each finished epoch is on disk before the next one trains
        self._epoch = epoch

    def _flush_if_full(self) -> None:
        if len(self._rows["step"]) >= self.flush_every:
            self.flush()

    def _append(self, opened: _Open, own: float, wall: float) -> None:
        """One finished step into the row buffers."""
        values = (opened.epoch, opened.step, self.rank, self.world_size, own, wall, opened.ids, self.device)
        for name, value in zip(self._rows, (*values, opened.method, opened.peak), strict=True):
            self._rows[name].append(value)

    def _mark(self, method: str) -> None:
        """Mark the end of the open step's own compute (the first mark wins)."""
        opened = self._open
        if opened is not None and opened.mark is None:
            opened.mark, opened.method = self._clock.now(), method

    def _resolve(self, wait: bool) -> None:
        """Move finished steps to the row buffers, oldest first; ``wait``: block until all are."""
        done = 0
        for opened, end in self._pending:
            if not (wait or self._clock.ready(end)):
                break
            wall = self._clock.seconds(opened.start, end)
            own = wall if opened.mark is None else self._clock.seconds(opened.start, opened.mark)
            self._append(opened, own, wall)
            done += 1
        del self._pending[:done]


@dataclass
class _HookState:
    """The DDP comm hook's state: the timer to mark and the group to all-reduce over."""

    timer: StepTimer
    process_group: Any = None


def ddp_timing_hook(state, bucket):  # untyped: DDP refuses the string annotations of this module
    """DDP comm hook: mark the open step's compute done at its first ready bucket, then all-reduce.

    Args:
        state: a ``_HookState`` (:meth:`StepTimer.attach_ddp` makes it); bucket: ``dist.GradBucket``.

    Returns:
        the ``torch.futures.Future[torch.Tensor]`` of DDP's default
        ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook``, so gradients are
        exactly the default ones.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    state.timer._mark("ddp_first_bucket")
    return allreduce_hook(state.process_group, bucket)

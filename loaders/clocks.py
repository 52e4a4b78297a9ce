"""The clocks a step timer reads: the host's ``time.perf_counter``, or the events of the accelerator
torch can really use (the device module's ``Event``: ``torch.cuda.Event``, ``torch.npu.Event`` with
torch_npu; torch 2.1 on). Resolved lazily so the host never waits for the device. Imports torch only
when asked for an accelerator clock.
"""

from __future__ import annotations

import time
from typing import Any

from lidarshard.loaders.reader import needs_torch

__all__ = ["HostClock", "EventClock", "DevicePeak", "accelerator", "clock_for", "DEVICE_MODULES"]


class HostClock:
    """``time.perf_counter`` marks (seconds). The host reports no per-step peak memory (``peak`` None)."""

    device = "cpu"
    peak: DevicePeak | None = None

    def now(self) -> float:
        return time.perf_counter()

    def ready(self, mark: Any) -> bool:
        return True

    def seconds(self, a: Any, b: Any) -> float:
        return float(b - a)


class DevicePeak:
    """One accelerator's peak allocated memory per step (bytes), through its device module
    (``torch.cuda``, ``torch.npu``): ``reset_peak_memory_stats`` at a step's start,
    ``max_memory_allocated`` at its end. Both read the caching allocator's host-side counters, which
    allocations update when they are issued, so neither waits for the device."""

    def __init__(self, module: Any, index: int) -> None:
        self._module, self._index = module, index

    @classmethod
    def of(cls, module: Any, index: int) -> DevicePeak | None:
        """The probe of ``module``, or None when it does not report peaks (no such functions)."""
        names = ("reset_peak_memory_stats", "max_memory_allocated")
        return cls(module, index) if all(callable(getattr(module, n, None)) for n in names) else None

    def reset(self) -> None:
        """Start a new peak at the memory allocated now."""
        self._module.reset_peak_memory_stats(self._index)

    def read(self) -> int:
        """The peak allocated bytes since the last ``reset``."""
        return int(self._module.max_memory_allocated(self._index))


class EventClock:
    """Timing events on the current stream of the current accelerator (the device module's ``Event``);
    ``peak``: its per-step peak memory, None when the device module reports none."""

    def __init__(self, event_type: Any, device: str, peak: DevicePeak | None = None) -> None:
        self._event, self.device, self.peak = event_type, device, peak

    def now(self) -> Any:
        event = self._event(enable_timing=True)
        event.record()
        return event

    def ready(self, mark: Any) -> bool:
        return bool(mark.query())

    def seconds(self, a: Any, b: Any) -> float:
        b.synchronize()
        return float(a.elapsed_time(b)) / 1000.0  # elapsed_time is in ms


def accelerator(torch: Any) -> tuple[str, int] | None:
    """(type, index) of the accelerator torch can really use now ("cuda", "npu", ...), else None.

    ``torch.accelerator`` (torch >= 2.6) names the build's accelerator even where none is usable (the
    CUDA wheel on a CPU node), so its ``is_available()`` decides; an older torch (2.1-2.5) is asked
    through its device modules (``torch.cuda``, and ``torch.npu`` once torch_npu is imported)."""
    accel = getattr(torch, "accelerator", None)
    if accel is not None and callable(getattr(accel, "is_available", None)):
        found = accel.current_accelerator() if accel.is_available() else None
        return None if found is None else (str(found.type), int(accel.current_device_index()))
    for name in DEVICE_MODULES:
        module = getattr(torch, name, None)
        if module is not None and callable(getattr(module, "is_available", None)) and module.is_available():
            return name, int(module.current_device())
    return None


#: Device modules an older torch exposes its accelerators through (torch_npu adds ``torch.npu``).
DEVICE_MODULES = ("cuda", "npu", "xpu", "mlu")


def clock_for(device: str) -> HostClock | EventClock:
    """The clock for ``device``: "auto" = the usable accelerator's events if any, else the host.

    Events come from the device module (``torch.cuda.Event``, ``torch.npu.Event``: every torch >= 2.1),
    else ``torch.Event``; peak memory from the same module (``DevicePeak``). An accelerator step is never
    timed by the host clock without an error saying so (on an asynchronous device a host clock measures
    kernel launches, not compute).
    """
    if device == "cpu":
        return HostClock()
    try:
        import torch
    except ImportError as e:
        if device == "auto":
            return HostClock()
        raise needs_torch(__name__) from e
    found = accelerator(torch)
    if found is None:
        if device == "auto":
            return HostClock()
        raise ValueError(f"device={device!r}, but torch finds no usable accelerator here: pass device='cpu'")
    kind, index = found
    if device not in ("auto", "accelerator", kind):
        raise ValueError(f"device={device!r}, but the current accelerator is {kind!r}")
    module = getattr(torch, kind, None)
    event = getattr(module, "Event", None) or getattr(torch, "Event", None)
    if event is None:
        raise ValueError(f"{kind}: this torch has no timing events (torch.{kind}.Event); pass device='cpu'")
    return EventClock(event, f"{kind}:{index}", DevicePeak.of(module, index))

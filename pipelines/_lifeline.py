"""Stopping a run from its launcher: SIGINT/SIGTERM stop the workers too; no worker outlives the launcher.

Beam's local runners start each SDK worker as ``sh -c "python -m ...sdk_worker_main"`` under the
launcher. A signal to the launcher alone left them running (and, with the default handler, left the
launcher itself waiting inside Beam). ``interruptible`` installs handlers that stop every process
below the launcher, run the caller's cleanup, print one line and exit 130 (SIGINT) or 143 (SIGTERM).

SIGKILL leaves the launcher no chance, and a worker cannot watch it reliably (a worker still starting
up blocks in gRPC before it runs any of our code). So ``interruptible`` also starts a small reaper
process (``python -m lidarshard.pipelines._lifeline PID``) that records the launcher's
descendants every ``POLL_S`` seconds and, once the launcher is gone, stops the ones it last saw
(checked by start time, so a reused pid is never hit). Linux (reads ``/proc``); elsewhere a no-op.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["POLL_S", "interruptible", "stop_descendants"]

POLL_S = 0.5
_GRACE_S = 3.0
_HAS_PROC = os.path.isdir("/proc/self")


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time in clock ticks) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int, started: int | None = None) -> bool:
    st = _stat(pid)
    return st is not None and st[0] != "Z" and (started is None or st[2] == started)


def _descendants(pid: int) -> dict[int, int]:
    """{pid: start time} of every process below ``pid``."""
    tree: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc") if _HAS_PROC else []:
        if name.isdigit() and (st := _stat(int(name))) is not None:
            tree.setdefault(st[1], []).append((int(name), st[2]))
    out: dict[int, int] = {}
    stack = [pid]
    while stack:
        for child, started in tree.get(stack.pop(), []):
            out[child] = started
            stack.append(child)
    return out


def _stop(procs: dict[int, int], grace_s: float) -> None:
    """SIGTERM ``procs`` ({pid: start time}), SIGKILL those still alive after ``grace_s`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        procs = {p: t for p, t in procs.items() if _alive(p, t)}
        for pid in procs:
            try:
                os.kill(pid, sig)
            except OSError:  # gone meanwhile
                pass
        deadline = time.monotonic() + grace_s
        while sig == signal.SIGTERM and procs and time.monotonic() < deadline:
            time.sleep(0.05)
            procs = {p: t for p, t in procs.items() if _alive(p, t)}


def stop_descendants(grace_s: float = _GRACE_S) -> None:
    """Stop every process below this one (SIGTERM, then SIGKILL after ``grace_s`` seconds)."""
    _stop(_descendants(os.getpid()), grace_s)


def _reap_after(launcher: int) -> None:
    """The reaper's loop: follow ``launcher``'s descendants; when it dies, stop the last ones seen."""
    me, started = os.getpid(), (_stat(launcher) or ("", 0, 0))[2]
    seen: dict[int, int] = {}
    while _alive(launcher, started):
        seen = {p: t for p, t in _descendants(launcher).items() if p != me}
        time.sleep(POLL_S)
    _stop(seen, _GRACE_S)


def _start_reaper() -> subprocess.Popen | None:
    if not _HAS_PROC:
        return None
    cmd = [sys.executable, "-m", "lidarshard.pipelines._lifeline", str(os.getpid())]
    null = subprocess.DEVNULL
    return subprocess.Popen(cmd, stdin=null, stdout=null, stderr=null, start_new_session=True)


@contextmanager
def interruptible(cleanup: Callable[[], None], what: str) -> Iterator[None]:
    """Run the body with the reaper watching and SIGINT/SIGTERM (SIGHUP, SIGQUIT) handlers that stop the workers, call
    ``cleanup``, print one line saying ``what`` and exit 128 + the signal number. Outside the main
    thread (no handlers possible) only the reaper watches."""
    reaper = _start_reaper()

    def handler(signum: int, _frame: object) -> None:
        stop_descendants()  # the reaper too
        try:
            cleanup()
        finally:
            from lidarshard.transforms.io import scratch  # here: the reaper runs this module without numpy

            scratch.remove_temporary()  # e.g. the pre-publish validate's
            name = signal.Signals(signum).name
            print(f"lidarshard: stopped by {name}; workers stopped, {what}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(128 + signum)

    main = threading.current_thread() is threading.main_thread()
    stops = (
        signal.SIGINT,
        signal.SIGTERM,
        *(getattr(signal, n) for n in ("SIGHUP", "SIGQUIT") if hasattr(signal, n)),
    )
    previous = {s: signal.signal(s, handler) for s in stops} if main else {}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if reaper is not None:
            reaper.terminate()
            reaper.wait()


if __name__ == "__main__":
    _reap_after(int(sys.argv[1]))

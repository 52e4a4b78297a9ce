"""Signals to the launcher of a multi-process run (issue #15): SIGINT/SIGTERM stop it and its workers and
leave OUT as it was (exit 130/143); after SIGKILL the workers exit on their own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lidarshard import schemas
from lidarshard.pipelines._lifeline import POLL_S, _descendants

pytestmark = [
    pytest.mark.slow,  # signals to launched builds and their worker processes
    pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc"),
]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _wait(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


@pytest.fixture(scope="module")
def inp(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lifeline") / "in"
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(400):
        rng.uniform(-40, 40, (20_000, 4)).astype(np.float32).tofile(root / f"c{i:04d}.bin")
    return root


def _start(inp: Path, out: Path) -> tuple[subprocess.Popen, list[int]]:
    """A launcher with 2 worker processes, held mid-run; (process, worker pids).

    The workers are frozen with SIGSTOP as soon as they exist, so the run cannot finish before the test
    signals the launcher however fast the machine is (a fixed sleep let a fast CI machine publish first).
    A frozen worker ignores SIGTERM until continued, so stopping it exercises the SIGKILL escalation."""
    cmd = [
        sys.executable,
        "-m",
        "lidarshard.pipelines.cli",
        "scan",
        str(inp),
        str(out),
        "--direct_num_workers=2",
    ]
    log = open(out.parent / "launcher.log", "w")  # a file: workers share the launcher's stderr
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    log.close()

    def workers() -> list[int]:
        found = []
        for pid in _descendants(proc.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = [a for a in f.read().split(b"\0") if a]
            except OSError:
                continue
            if argv and not argv[0].endswith(b"sh") and any(b"sdk_worker_main" in a for a in argv):
                found.append(pid)
        return found

    assert _wait(lambda: len(workers()) >= 2, 120), "workers never started"
    found = workers()
    for pid in found:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(3 * POLL_S)  # the reaper has recorded them
    assert proc.poll() is None, "the run finished before it could be interrupted"
    return proc, found


def _previous(out: Path) -> None:
    out.mkdir()
    (out / schemas.SCAN_FILE).write_text('{"previous": true}')
    (out / schemas.SUCCESS_FILE).write_bytes(b"")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "sig, code",  # the same path for both signals: SIGINT's launcher subprocess runs in the slow lane
    [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
)
def test_a_signal_stops_the_run_and_its_workers_and_keeps_out(
    inp: Path, tmp_path: Path, sig, code: int
) -> None:
    out = tmp_path / "out"
    _previous(out)
    proc, workers = _start(inp, out)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    err = (tmp_path / "launcher.log").read_text()
    assert proc.returncode == code, err[-2000:]
    assert f"stopped by {signal.Signals(sig).name}" in err and "nothing was published" in err
    assert _wait(lambda: not any(map(_alive, workers)), 10), "workers outlived the launcher"
    assert (out / schemas.SCAN_FILE).read_text() == '{"previous": true}'
    assert sorted(os.listdir(tmp_path)) == ["launcher.log", "out"]  # no staging directory left behind


@pytest.mark.timeout(300)
def test_workers_exit_on_their_own_after_the_launcher_is_killed(inp: Path, tmp_path: Path) -> None:
    proc, workers = _start(inp, tmp_path / "out")
    proc.kill()
    proc.wait(timeout=60)
    assert _wait(lambda: not any(map(_alive, workers)), 30), "workers outlived a killed launcher"

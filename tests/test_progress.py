"""The progress mechanism (``lidarshard.transforms.progress``: tallies, the summed line, the terminal line)
and what the command shows while a pipeline runs (``lidarshard.pipelines.cli.running``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lidarshard.pipelines import cli
from lidarshard.transforms import progress


def test_tallies_of_every_worker_are_summed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(progress.ENV, str(tmp_path))
    assert progress.read(str(tmp_path)) is None  # nobody counted yet
    a, b = progress.Tally("inputs read"), progress.Tally("inputs read")
    for _ in range(3):
        a.add(total=10)
    b.add(rejected=1, total=10)
    a.flush()
    b.flush()
    got = progress.read(str(tmp_path))
    assert got is not None and (got.what, got.done, got.rejected, got.total) == ("inputs read", 4, 1, 10)
    assert got.finished is None and got.started is not None
    for _ in range(6):
        b.add(total=10)
    b.flush()
    done = progress.read(str(tmp_path))
    assert done is not None and done.done == 10 and done.finished is not None
    (tmp_path / "torn.progress.json").write_text('{"done": ')  # a file being replaced: skipped
    assert progress.read(str(tmp_path)) == done


def test_a_tally_without_a_directory_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(progress.ENV, raising=False)
    t = progress.Tally("scenes written")
    t.add(total=2)
    t.flush()
    monkeypatch.setenv(progress.ENV, str(tmp_path / "elsewhere"))  # e.g. on another machine
    t = progress.Tally("scenes written")
    t.add(total=2)
    t.flush()
    assert not (tmp_path / "elsewhere").exists() and t.done == 1


def test_the_line_says_read_of_total_rate_and_eta() -> None:
    label = "lidarshard build"
    assert progress.describe(label, None, 3.2) == "lidarshard build: running, 3 s"
    p = progress.Progress("inputs read", done=30, rejected=2, total=90, started=100.0)
    assert progress.describe(label, p, 20.0, now=110.0) == (
        "lidarshard build: 30 of 90 inputs read (2 rejected), 3.0/s, ETA 20 s"
    )
    done = progress.Progress("inputs read", 90, 0, 90, started=100.0, finished=130.0)
    assert (
        progress.describe(label, done, 45.0)
        == "lidarshard build: all 90 inputs read in 30 s; finishing, 45 s"
    )
    assert (
        progress.describe("x", progress.Progress("rows", 5, started=0.0), 1.0, now=10.0) == "x: 5 rows, 0.5/s"
    )
    assert [progress.duration(s) for s in (4.4, 65, 7260)] == ["4 s", "1 min 05 s", "2 h 01 min"]


def test_a_terminal_line_is_redrawn_in_place_a_log_gets_whole_lines() -> None:
    read_end, write_end = os.pipe()
    tty = progress.Line(write_end, tty=True)
    tty.show("a: 1 of 2")
    tty.show("a: 2 of 2")
    tty.close("a: done")
    log = progress.Line(write_end, tty=False, every_s=3600)
    log.show("b: 1 of 2")
    log.show("b: 2 of 2")  # within every_s: not written
    log.close("b: done")
    os.close(write_end)
    text = os.read(read_end, 10_000).decode()
    os.close(read_end)
    assert text == "\ra: 1 of 2\x1b[K\ra: 2 of 2\x1b[K\r\x1b[Kb: 1 of 2\nb: done\n"


NOISE = [sys.executable, "-c", "import sys; sys.stderr.write('worker noise\\n')"]


def test_a_quiet_run_hides_what_its_processes_write(monkeypatch, capfd) -> None:
    monkeypatch.setattr(cli, "_state", cli.Console("lidarshard test", quiet=True))
    with cli.running():
        subprocess.run(NOISE, check=True)  # a worker process started by the run inherits fd 2
        os.write(2, b"in-process noise\n")
    os.write(2, b"ours\n")
    assert capfd.readouterr().err == "ours\n"
    monkeypatch.setattr(cli, "_state", cli.Console("lidarshard test", quiet=False))  # -v: all of it
    with cli.running():
        subprocess.run(NOISE, check=True)
    assert capfd.readouterr().err == "worker noise\n"


def test_ctrl_c_gives_the_terminal_back_before_the_handler_runs(monkeypatch, capfd) -> None:
    monkeypatch.setattr(cli, "_state", cli.Console("lidarshard test", quiet=True))
    said = []

    def launcher_handler(signum, frame) -> None:  # publish's: one line, then exit
        os.write(2, b"stopped; nothing was published\n")
        said.append(signum)

    previous = signal.signal(signal.SIGTERM, launcher_handler)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever an earlier test left
    try:
        with cli.running():
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 30
            while not said and time.monotonic() < deadline:  # poll: the handler runs between bytecodes
                time.sleep(0.01)
            with pytest.raises(KeyboardInterrupt):  # the default SIGINT handler still raises
                os.kill(os.getpid(), signal.SIGINT)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # poll: raised between bytecodes, not after a sleep
                    time.sleep(0.01)
        assert said == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is launcher_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    assert capfd.readouterr().err == "stopped; nothing was published\n"


@pytest.mark.slow  # the default runner's worker processes
def test_the_progress_line_sums_the_workers_and_cleans_up(monkeypatch, capfd) -> None:
    monkeypatch.setattr(cli, "_state", cli.Console("lidarshard test", quiet=True, progress=True))
    monkeypatch.setattr(cli, "PROGRESS_EVERY_S", 0.05)
    with cli.running():
        directory = os.environ[progress.ENV]
        code = "from lidarshard.transforms import progress\nt = progress.Tally('inputs read')\n"
        code += "[t.add(total=4) for _ in range(4)]\nt.flush()"
        subprocess.run([sys.executable, "-c", code], check=True)  # a worker of the run
        seen, deadline = "", time.monotonic() + 60  # poll until the drawing thread shows the sum
        while "all 4 inputs read" not in seen and time.monotonic() < deadline:
            seen += capfd.readouterr().err
            time.sleep(0.01)
    assert progress.ENV not in os.environ and not os.path.exists(directory)
    err = (seen + capfd.readouterr().err).splitlines()  # stderr is no terminal here: whole lines
    assert err[0].startswith("lidarshard test: ")
    assert err[-1].startswith("lidarshard test: all 4 inputs read in ") and "finishing" in err[-1]


def test_a_ticker_draws_what_its_own_process_counts() -> None:
    read_end, write_end = os.pipe()
    ticker = progress.Ticker("steps", fd=write_end, every_s=0.0)
    ticker.start("train epoch 1 of 1", 8)
    ticker.update(2)
    ticker.end(8)
    progress.Ticker("steps", shown=False, fd=write_end).update(1)  # not shown: nothing written
    os.close(write_end)
    lines = os.read(read_end, 10_000).decode().splitlines()
    os.close(read_end)
    assert lines[0].startswith("train epoch 1 of 1: 2 of 8 steps, ") and ", ETA " in lines[0]
    assert re.fullmatch(r"train epoch 1 of 1: 8 steps in \d+ s", lines[1])

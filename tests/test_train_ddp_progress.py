"""examples/train_ddp.py's progress line: rank 0 alone draws it (``transforms.progress.Ticker``), on a
terminal or with ``--progress``; without either (a log, CI) it writes nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.helpers import REPO  # noqa: E402
from tests.manifest_fixture import make_fixture  # noqa: E402


def _train(out: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        str(REPO / "examples/train_ddp.py"),
        "--manifest",
        str(out),
        "--width",
        "8",
        *flags,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=110, env=env)


@pytest.mark.slow  # starts examples/train_ddp.py twice: 2 gloo ranks, torch imported per process
@pytest.mark.timeout(240)
def test_rank_0_draws_the_progress_line_when_asked(tmp_path: Path) -> None:
    out = make_fixture(
        tmp_path, [120 + 40 * (i % 5) for i in range(16)], world_size=2, batch_size=2, epochs=2
    )
    asked = _train(out, "--progress")
    assert asked.returncode == 0, asked.stderr[-3000:]
    ends = re.findall(r"^train_ddp epoch (\d) of 2: 4 steps in \d+ s$", asked.stderr, re.M)
    assert ends == ["1", "2"], asked.stderr[-3000:]  # one line per epoch, from rank 0 only
    quiet = _train(out)
    assert quiet.returncode == 0 and "train_ddp epoch" not in quiet.stderr  # stderr is no terminal

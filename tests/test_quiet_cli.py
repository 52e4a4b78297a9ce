"""A default run of ``lidarshard synth``/``build`` prints no Beam, Dask or worker line: on success only its
summary, on failure one line on stderr; ``-v`` brings the workers' lines back. Measured on the default
runners (synth: FnApiRunner in process; build: DirectRunner ``multi_processing``, 2 worker processes) and
on ``--runner=dask`` (a local cluster), each in a child process as a user runs it.

The ``make demo`` install has no ``[gcp]`` extra: Beam then warns "apitools not found" when each worker
process imports it, and that warning installs a stderr log handler in the worker (42 worker lines on a
successful build before, 74-206 on a failed one). ``NO_GCP`` stands in for that install here.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

FAIL = "lidarshard build: error: epoch 0: 4 samples do not fill one step of W*B = 32"


@pytest.fixture(scope="module")
def no_gcp(tmp_path_factory) -> Path:
    """A folder whose ``apitools`` fails to import, as without the ``[gcp]`` extra."""
    root = tmp_path_factory.mktemp("no_gcp")
    (root / "apitools").mkdir()
    (root / "apitools" / "__init__.py").write_text(
        "raise ImportError('no apitools: the gcp extra is absent')\n"
    )
    return root


def _lidarshard(args: list[str], cwd: Path, no_gcp: Path) -> subprocess.CompletedProcess:
    """``python -m lidarshard.pipelines.cli ARGS`` as its own process group; killed after 240 s."""
    path = os.pathsep.join(filter(None, [str(no_gcp), os.environ.get("PYTHONPATH")]))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIDARSHARD_", "DASK_"))}
    cmd = [sys.executable, "-m", "lidarshard.pipelines.cli", *args]
    bin_dir = str(Path(sys.executable).parent)
    env |= {"PYTHONPATH": path, "PATH": bin_dir + os.pathsep + env.get("PATH", "")}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{args[:2]} ran past 240 s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(scope="module")
def dataroot(tmp_path_factory, no_gcp: Path) -> Path:
    work = tmp_path_factory.mktemp("quiet")
    args = ["synth", "dataroot", "--scenes", "1", "--keyframes-per-scene", "4", "--sweeps-per-keyframe", "1"]
    r = _lidarshard(args, work, no_gcp)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.splitlines() == [
        f"wrote {work / 'dataroot'}: 1 scenes, 4 keyframes, 7 lidar files (v1.0-synth tables)"
    ]
    return work / "dataroot"


def _build(dataroot: Path, out: str, no_gcp: Path, *flags: str) -> subprocess.CompletedProcess:
    args = ["build", str(dataroot), out, "--nuscenes-version", "v1.0-synth", *flags]
    return _lidarshard(args, dataroot.parent, no_gcp)


def test_a_default_build_prints_its_summary_and_nothing_else(dataroot: Path, no_gcp: Path) -> None:
    r = _build(dataroot, "ok", no_gcp, "--world-size", "2", "--batch-size", "2")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no worker, Beam or progress line (stderr is not a terminal)
    lines = r.stdout.splitlines()
    assert (
        lines[0]
        == f"INPUT dataroot: nuScenes dataroot, tables v1.0-synth, no sweeps ({dataroot}): 4 samples accepted"
    )
    assert lines[1] == "scanned 4: accepted 4, rejected 0"
    assert "a random plan's" in lines[-2] and lines[-1] == f"wrote {dataroot.parent / 'ok'}"


def test_a_failed_build_prints_one_line_and_v_brings_the_workers_back(dataroot: Path, no_gcp: Path) -> None:
    r = _build(dataroot, "bad", no_gcp, "--world-size", "8", "--batch-size", "4")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [FAIL + "; use --pad or a smaller --world-size/--batch-size"]
    loud = _build(dataroot, "bad", no_gcp, "--world-size", "8", "--batch-size", "4", "-v")
    lines = loud.stderr.splitlines()
    assert loud.returncode == 1 and lines[-1].startswith(FAIL)
    assert any("apitools not found" in x for x in lines) and any("sdk_worker" in x for x in lines), lines[:20]
    assert "Traceback" in loud.stderr  # the workers' own report of the failed bundle


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="the dask extra is not installed")
def test_a_dask_build_is_quiet_too(dataroot: Path, no_gcp: Path) -> None:
    r = _build(dataroot, "dask", no_gcp, "--world-size", "1", "--batch-size", "1", "--runner=dask")
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and r.stdout.splitlines()[-1] == f"wrote {dataroot.parent / 'dask'}"
    bad = _build(dataroot, "dask_bad", no_gcp, "--world-size", "8", "--batch-size", "4", "--runner=dask")
    assert bad.returncode == 1 and len(bad.stderr.splitlines()) == 1 and bad.stderr.startswith(FAIL)

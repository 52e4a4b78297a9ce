"""The synthetic dataroot loads in the real nuscenes-devkit (1.2.0), which runs in its own venv.

nuscenes-devkit pins numpy 1.26, so it cannot share the project's environment. The test uses
``$LIDARSHARD_DEVKIT_PYTHON`` if set, else ``<repo>/.venv-devkit`` (created on first use with
``python -m venv`` + ``pip install nuscenes-devkit==1.2.0``, about a minute) and runs
``tests/devkit_check.py`` there. It skips only when that environment cannot be created.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lidarshard.transforms.synth import dataroot as synth
from tests.helpers import BEAM_TEST_FLAGS, REPO

DEVKIT = "nuscenes-devkit==1.2.0"
VENV = REPO / ".venv-devkit"
_READY = ".lidarshard-devkit-ok"  # written once the devkit imports, so half-built venvs are redone


def _installer(python: Path) -> list[str]:
    """The command that installs the devkit into ``python``'s venv: uv beside ours (``make test`` puts it
    there; seconds, its bytecode compiled as pip would), else that venv's pip."""
    uv = Path(sys.executable).with_name("uv")
    if uv.exists():
        return [str(uv), "pip", "install", "-q", "--compile-bytecode", "--python", str(python), DEVKIT]
    return [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", DEVKIT]


def _devkit_python() -> Path:
    """Python of a venv with the devkit, creating ``.venv-devkit`` if needed; skips on failure."""
    if os.environ.get("LIDARSHARD_DEVKIT_PYTHON"):
        return Path(os.environ["LIDARSHARD_DEVKIT_PYTHON"])
    python = VENV / "bin" / "python"
    if (VENV / _READY).exists():
        return python
    tmp = VENV.with_name(f"{VENV.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    steps = [
        [sys.executable, "-m", "venv", str(tmp)],
        _installer(tmp / "bin" / "python"),
        [str(tmp / "bin" / "python"), "-c", "import nuscenes.nuscenes, nuscenes.utils.data_classes"],
    ]
    for cmd in steps:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            shutil.rmtree(tmp, ignore_errors=True)
            pytest.skip(f"cannot set up {DEVKIT}: {e}")
        if done.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            pytest.skip(f"cannot set up {DEVKIT}: {' '.join(cmd[-2:])}: {done.stderr.strip()[-500:]}")
    (tmp / _READY).write_text(DEVKIT + "\n")
    shutil.rmtree(VENV, ignore_errors=True)  # a half-built one from an interrupted run
    try:
        tmp.rename(VENV)  # the venv's python resolves its home from pyvenv.cfg, so a move is safe
    except OSError:  # another session finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return python


def _ours(root: Path, version: str) -> dict[str, tuple[int, np.ndarray]]:
    """Per sample token: (points, xyz sum) of our own numpy multisweep over the written tables."""
    load = lambda t: json.loads((root / version / f"{t}.json").read_text())  # noqa: E731
    sd = {r["token"]: r for r in load("sample_data")}
    pose = {r["token"]: (r["translation"], r["rotation"]) for r in load("ego_pose")}
    cs = {r["token"]: (r["translation"], r["rotation"]) for r in load("calibrated_sensor")}
    out = {}
    for key in (r for r in sd.values() if r["is_key_frame"]):
        chain, rec = [], key
        while rec is not None and len(chain) < 10:
            chain.append(rec)
            rec = sd.get(rec["prev"])
        clouds = [np.fromfile(root / r["filename"], dtype="<f4").reshape(-1, 5) for r in chain]
        agg = synth.multisweep(
            clouds, [pose[r["ego_pose_token"]] for r in chain], cs[key["calibrated_sensor_token"]]
        )
        out[key["sample_token"]] = (len(agg), agg.astype(np.float64).sum(axis=0))
    return out


@pytest.mark.timeout(1200)
def test_dataroot_loads_in_nuscenes_devkit(tmp_path):
    python = _devkit_python()
    from lidarshard.pipelines.synth import run

    root = tmp_path / "nuscenes"
    args = [
        "--scenes",
        "2",
        "--keyframes-per-scene",
        "3",
        "--seed",
        "2",
        "--labels",
        "--nuscenes-version",
        "v1.0-mini",
    ]
    assert run([str(root), *args, *BEAM_TEST_FLAGS]) == 0
    done = subprocess.run([str(python), str(REPO / "tests" / "devkit_check.py"), str(root), "v1.0-mini", "10"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["channels"] == ["LIDAR_TOP"]
    assert seen["tables"]["scene"] == 2 and seen["tables"]["sample"] == 6 and seen["tables"]["lidarseg"] == 6
    assert seen["tables"]["sample_data"] == seen["tables"]["ego_pose"] == 2 * 21
    ours = _ours(root, "v1.0-mini")
    assert sorted(s["num_sweeps"] for s in seen["samples"]) == [1, 1, 10, 10, 10, 10]
    for s in seen["samples"]:
        points, xyz_sum = ours[s["token"]]
        assert s["num_points"] == points  # same remove_close and chain as from_file_multisweep
        assert np.allclose(s["xyz_sum"], xyz_sum, rtol=1e-4, atol=1.0)  # same transforms
        assert s["num_sweeps"] == 1 or abs(s["max_time_lag"] - 0.45) < 0.002
        assert (
            s["labels_match"]
            and "vehicle.ego" in s["label_names"]
            and "flat.driveable_surface" in s["label_names"]
        )

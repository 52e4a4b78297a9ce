"""Points, time lags and counts against the real nuscenes-devkit 1.2.0 on the real LIDAR_TOP scan (issue 39).

A dataroot of the devkit's 13 tables (``transforms.synth.nuscenes_tables``) around the real files of
../shared/realdata/nuscenes: the real keyframe (34,688 points) with three real sweeps 0.5, 0.55 and
0.6 s before it. ``--sweeps 3 --close-points devkit`` must give, bit for bit, what
``LidarPointCloud.from_file_multisweep(nsweeps=4, min_distance=1.0)`` gives, and the scan's
``num_points`` its count. The devkit runs in its own venv (``test_synth_devkit._devkit_python``:
``$LIDARSHARD_DEVKIT_PYTHON`` or ``.venv-devkit``); the test skips where it cannot be set up.
"""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lidarshard  # noqa: E402
from lidarshard.loaders import read_samples  # noqa: E402
from lidarshard.loaders.torch import PointCloudDataset  # noqa: E402
from lidarshard.transforms.synth import nuscenes_tables as tb  # noqa: E402
from lidarshard.transforms.synth import scene as sc  # noqa: E402
from tests.test_synth_devkit import _devkit_python  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VERSION = "v1.0-mini"
KEY = "nuscenes/samples/LIDAR_TOP/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin"
OTHER = "nuscenes/samples/LIDAR_TOP/n015-2018-08-02-17-16-37+0800__LIDAR_TOP__1533201470948018.pcd.bin"
SWEEP_A = "nuscenes/sweeps/LIDAR_TOP/n008-2018-09-18-12-07-26-0400__LIDAR_TOP__1537287083900561.pcd.bin"
SWEEP_B = "nuscenes/sweeps/LIDAR_TOP/n015-2018-08-02-17-16-37+0800__LIDAR_TOP__1533201470898274.pcd.bin"
T = 1532402927647951  # the real keyframe's timestamp, microseconds
#: Frames 0..4: a keyframe, three sweeps, the real keyframe (keyframes every 4 frames).
STAMPS = (T - 1_000_000, T - 600_000, T - 550_000, T - 500_000, T)
FILES = (OTHER, SWEEP_A, SWEEP_B, OTHER, KEY)


def _dataroot(root: Path, realdata: Path) -> Path:
    """The devkit's tables around real files (one scene of 5 LIDAR_TOP frames, 2 samples)."""
    yaws = (0.0, 0.01, 0.02, 0.03, 0.05)
    info = tb.SceneInfo(
        seed=0, index=0, kind="urban", speed=5.0, timestamps=STAMPS,
        translations=tuple((1.5 * i, 0.2 * i, 0.01 * i) for i in range(5)),
        rotations=tuple((math.cos(a / 2), 0.0, 0.0, math.sin(a / 2)) for a in yaws),
        keyframe_every=4, lidar_translation=sc.LIDAR_TRANSLATION, lidar_rotation=sc.LIDAR_ROTATION,
    )  # fmt: skip
    tables: dict[str, list] = {name: [] for name in tb.TABLES}
    tables.update(tb.static_records(False))
    for name, records in tb.scene_records(info, VERSION, False).items():
        tables[name] += records
    tables["map"] = tb.merge_map_records(tables["map"])
    (root / VERSION).mkdir(parents=True)
    for name, records in tables.items():
        (root / VERSION / f"{name}.json").write_bytes(tb.table_json(records))
    for rec in tables["map"]:
        (root / rec["filename"]).parent.mkdir(parents=True, exist_ok=True)
        (root / rec["filename"]).write_bytes(tb.blank_png())
    for frame, rel in enumerate(FILES):
        (root / info.filename(frame)).parent.mkdir(parents=True, exist_ok=True)
        (root / info.filename(frame)).write_bytes((realdata / rel).read_bytes())
    return root


def _build(root: Path, out: Path, rule: str) -> Path:
    lidarshard.build(str(root), str(out), world_size=1, batch_size=1, runner="FnApiRunner",
                     nuscenes_version=VERSION, sweeps=3, close_points=rule)  # fmt: skip
    return out


@pytest.mark.timeout(900)
def test_devkit_rule_gives_the_devkits_points_lags_and_counts(tmp_path: Path, realdata: Path) -> None:
    python = _devkit_python()
    root = _dataroot(tmp_path / "nuscenes", realdata)
    npz = tmp_path / "devkit.npz"
    done = subprocess.run([str(python), str(REPO / "tests" / "devkit_points.py"), str(root), VERSION, "4", str(npz)],
                          capture_output=True, text=True, timeout=600, env=os.environ | {"PYTHONDONTWRITEBYTECODE": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    devkit = np.load(npz)
    out = _build(root, tmp_path / "out", "devkit")
    dataset = PointCloudDataset(out, time_lag=True)
    recorded = dict(zip(*read_samples(out, ["sample_id", "num_points"]).to_pydict().values(), strict=True))
    assert len(dataset) == 2 == len(devkit.files) // 2
    lags = {}
    for i, token in enumerate(dataset.sample_ids):
        ours = dataset[i]["points"].numpy()  # x, y, z, intensity, ring, time lag
        points, times = devkit[f"{token}/points"], devkit[f"{token}/times"]
        assert len(ours) == points.shape[1] == recorded[token]
        assert ours[:, :4].tobytes() == np.ascontiguousarray(points.T).tobytes()  # bit for bit
        np.testing.assert_array_equal(ours[:, -1], times[0].astype(np.float32))
        lags[len(ours)] = sorted({float(v) for v in np.unique(times)})
    big = max(lags)
    assert lags[big] == pytest.approx([0.0, 0.5, 0.55, 0.6], abs=1e-6)  # the devkit holds them in float32
    # The default rule keeps the real keyframe's own close points (ego-vehicle returns), which the devkit drops.
    default = PointCloudDataset(_build(root, tmp_path / "default", "sweeps"))
    assert max(len(default[i]["points"]) for i in range(2)) - big == 8_274

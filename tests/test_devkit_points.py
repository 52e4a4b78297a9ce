"""Points, time lags, counts and lidarseg labels against the real nuscenes-devkit 1.2.0 on real files
(issue 39; lidarseg and Lyft: issue 48).

A dataroot of the devkit's 13 tables (``transforms.synth.nuscenes_tables``) around the real files of
../shared/realdata/nuscenes: the real keyframe (34,688 points) with three real sweeps 0.5, 0.55 and
0.6 s before it. ``--sweeps 3 --close-points devkit`` must give, bit for bit, what
``LidarPointCloud.from_file_multisweep(nsweeps=4, min_distance=1.0)`` gives, and the scan's
``num_points`` its count. The same tables around the real nuScenes-lidarseg pair (40 points, 40 labels)
give the devkit's ``load_bin_file`` labels; the real Lyft tables around the real Lyft lidar files give
``LidarPointCloud.from_file``'s points (Lyft's SDK is the devkit's code: float32 x 5 records named
``*.bin``). The devkit runs in its own venv (``test_synth_devkit._devkit_python``:
``$LIDARSHARD_DEVKIT_PYTHON`` or ``.venv-devkit``); the tests skip where it cannot be set up. The files
are written into each test's tmp_path (realdata is read-only), never into the repository.
"""

from __future__ import annotations

import json
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
from lidarshard.transforms.synth import dataroot as synth  # noqa: E402
from lidarshard.transforms.synth import nuscenes_tables as tb  # noqa: E402
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


LIDARSEG_KEY = "nuscenes_lidarseg_pr2859/samples/LIDAR_TOP/n015-2018-08-02-17-16-37+0800__LIDAR_TOP__1533201470948018.pcd.bin"
LIDARSEG_LABELS = (
    "nuscenes_lidarseg_pr2859/lidarseg/v1.0-trainval/5f6c1e0a0c3b444b97e78d2aa3fa34d2_lidarseg.bin"
)
LYFT = "lyft/v1.01-train"


def _devkit(python: Path, root: Path, version: str, nsweeps: int, npz: Path) -> dict[str, np.ndarray]:
    """What tests/devkit_points.py writes for the dataroot ``root``: {"<sample token>/<what>": array}."""
    done = subprocess.run([str(python), str(REPO / "tests" / "devkit_points.py"), str(root), version, str(nsweeps), str(npz)],
                          capture_output=True, text=True, timeout=600, env=os.environ | {"PYTHONDONTWRITEBYTECODE": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(np.load(npz))


def _dataroot(root: Path, realdata: Path, files: tuple[str, ...] = FILES, labels: str | None = None) -> Path:
    """The devkit's tables around real files (one scene of 5 LIDAR_TOP frames, 2 samples); with
    ``labels``, that real lidarseg file for each keyframe."""
    yaws = (0.0, 0.01, 0.02, 0.03, 0.05)
    info = tb.SceneInfo(
        seed=0, index=0, kind="urban", speed=5.0, timestamps=STAMPS,
        translations=tuple((1.5 * i, 0.2 * i, 0.01 * i) for i in range(5)),
        rotations=tuple((math.cos(a / 2), 0.0, 0.0, math.sin(a / 2)) for a in yaws),
        keyframe_every=4, lidar_translation=synth.LIDAR_TRANSLATION, lidar_rotation=synth.LIDAR_ROTATION,
    )  # fmt: skip
    tables: dict[str, list] = {name: [] for name in tb.TABLES}
    tables.update(tb.static_records(labels is not None))
    for name, records in tb.scene_records(info, VERSION, labels is not None).items():
        tables.setdefault(name, []).extend(records)  # lidarseg: only with labels
    tables["map"] = tb.merge_map_records(tables["map"])
    (root / VERSION).mkdir(parents=True)
    for name, records in tables.items():
        (root / VERSION / f"{name}.json").write_bytes(tb.table_json(records))
    for rec in tables["map"]:
        (root / rec["filename"]).parent.mkdir(parents=True, exist_ok=True)
        (root / rec["filename"]).write_bytes(tb.blank_png())
    for frame, rel in enumerate(files):
        (root / info.filename(frame)).parent.mkdir(parents=True, exist_ok=True)
        (root / info.filename(frame)).write_bytes((realdata / rel).read_bytes())
    for rec in tables.get("lidarseg", []):
        (root / rec["filename"]).parent.mkdir(parents=True, exist_ok=True)
        (root / rec["filename"]).write_bytes((realdata / str(labels)).read_bytes())
    return root


def _build(root: Path, out: Path, rule: str) -> Path:
    lidarshard.build(str(root), str(out), world_size=1, batch_size=1, runner="FnApiRunner",
                     nuscenes_version=VERSION, sweeps=3, close_points=rule)  # fmt: skip
    return out


@pytest.mark.timeout(900)
def test_devkit_rule_gives_the_devkits_points_lags_and_counts(tmp_path: Path, realdata: Path) -> None:
    python = _devkit_python()
    root = _dataroot(tmp_path / "nuscenes", realdata)
    devkit = _devkit(python, root, VERSION, 4, tmp_path / "devkit.npz")
    out = _build(root, tmp_path / "out", "devkit")
    dataset = PointCloudDataset(out, time_lag=True)
    recorded = dict(zip(*read_samples(out, ["sample_id", "num_points"]).to_pydict().values(), strict=True))
    assert len(dataset) == 2 == len(devkit) // 3
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


@pytest.mark.timeout(900)
def test_lidarseg_labels_are_the_devkits(tmp_path: Path, realdata: Path) -> None:
    """The real 40-point keyframe and its real lidarseg file: the dataset's points are the devkit's
    ``from_file`` bit for bit (default rule: the keyframe whole) and its labels ``load_bin_file``'s."""
    python = _devkit_python()
    root = _dataroot(tmp_path / "nuscenes", realdata, (LIDARSEG_KEY,) * 5, LIDARSEG_LABELS)
    devkit = _devkit(python, root, VERSION, 0, tmp_path / "devkit.npz")
    out = tmp_path / "out"
    lidarshard.build(
        str(root), str(out), world_size=1, batch_size=1, runner="FnApiRunner", nuscenes_version=VERSION
    )
    dataset = PointCloudDataset(out, labels=True)
    recorded = dict(zip(*read_samples(out, ["sample_id", "num_points"]).to_pydict().values(), strict=True))
    assert len(dataset) == 2 and sorted(devkit) == sorted(
        f"{t}/{k}" for t in dataset.sample_ids for k in ("keyframe", "lidarseg")
    )
    for i, token in enumerate(dataset.sample_ids):
        item, labels = dataset[i], devkit[f"{token}/lidarseg"]
        assert len(labels) == len(item["points"]) == recorded[token] == 40
        assert (
            item["points"].numpy()[:, :4].tobytes()
            == np.ascontiguousarray(devkit[f"{token}/keyframe"].T).tobytes()
        )
        np.testing.assert_array_equal(item["labels"].numpy(), labels.astype(np.int64))
    assert sorted(np.unique(labels).tolist()) == [17, 24, 27, 28, 30, 31]  # PROVENANCE.md


@pytest.mark.timeout(900)
def test_lyft_points_are_the_devkits(tmp_path: Path, realdata: Path) -> None:
    """The real Lyft tables (nuScenes schema) around the real Lyft lidar files, placed at the names the
    tables give: LIDAR_TOP's ``*.bin`` is read as float32 x 5 (it was read as KITTI's x 4: 100 bytes,
    'truncated'), bit for bit ``LidarPointCloud.from_file``'s."""
    python = _devkit_python()
    from lidarshard.transforms.synth.nuscenes_tables import blank_png

    tables, root = realdata / LYFT / "v1.01-train", tmp_path / "lyft"
    (root / "v1.01-train").mkdir(parents=True)
    for table in tables.glob("*.json"):
        (root / "v1.01-train" / table.name).write_bytes(table.read_bytes())
    records = json.loads((tables / "sample_data.json").read_text())
    lidars = sorted(r["filename"] for r in records if r["fileformat"] == "bin")
    real = sorted((realdata / "lyft" / "lidar").glob("*.bin"))
    assert len(lidars) == len(real) == 3
    for name, path in zip(lidars, real, strict=True):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(path.read_bytes())
    for rec in json.loads((tables / "map.json").read_text()):
        (root / rec["filename"]).parent.mkdir(parents=True, exist_ok=True)
        (root / rec["filename"]).write_bytes(blank_png())
    devkit = _devkit(python, root, "v1.01-train", 0, tmp_path / "devkit.npz")
    out = tmp_path / "out"
    lidarshard.build(
        str(root), str(out), world_size=1, batch_size=1, runner="FnApiRunner", nuscenes_version="v1.01-train"
    )
    samples = read_samples(out, ["sample_id", "format", "num_points"]).to_pylist()
    assert [(s["format"], s["num_points"]) for s in samples] == [("nuscenes_bin", 5)]
    (key,) = [k for k in devkit if k.endswith("/keyframe")]
    assert samples[0]["sample_id"] == key.split("/")[0]
    ours = PointCloudDataset(out)[0]["points"].numpy()  # x, y, z, intensity, ring
    assert ours[:, :4].tobytes() == np.ascontiguousarray(devkit[key].T).tobytes()

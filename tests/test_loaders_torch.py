"""lidarshard.loaders.torch: BalancedBatchSampler (epochs, resume, DataLoader), PointCloudDataset, collate, and one
real 2-rank gloo run of examples/train_ddp.py."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import warnings
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from manifest_fixture import make_fixture, write_clouds, write_manifest  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from lidarshard.loaders import ManifestReader, read_samples  # noqa: E402
from lidarshard.loaders.torch import BalancedBatchSampler, PointCloudDataset, collate  # noqa: E402
from lidarshard.transforms.formats.readers import read_points  # noqa: E402
from lidarshard.transforms.nuscenes.multisweep import aggregate  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SIZES = [50 + 13 * i for i in range(26)]  # W*B = 6 -> 4 steps, 2 dropped


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return make_fixture(tmp_path, SIZES, world_size=2, batch_size=3, epochs=2, sweeps=2, sweep_size=7)


def _planned(out: Path, rank: int, epoch: int) -> list[list[int]]:
    row = {s: i for i, s in enumerate(read_samples(out, ["sample_id"])["sample_id"].to_pylist())}
    return [[row[s] for s in b.sample_ids] for b in ManifestReader(out, rank, 2, epoch)]


def test_sampler_yields_planned_indices_per_epoch(out: Path) -> None:
    sampler = BalancedBatchSampler(out, rank=1, world_size=2)
    assert len(sampler) == 4
    assert list(sampler) == list(sampler) == _planned(out, 1, 0)
    sampler.set_epoch(1)
    assert list(sampler) == _planned(out, 1, 1) != _planned(out, 1, 0)
    sampler.set_epoch(2)
    with pytest.raises(ValueError, match="not planned"):
        list(sampler)
    cyc = BalancedBatchSampler(out, rank=1, world_size=2, cycle=True)
    cyc.set_epoch(2)
    with pytest.warns(UserWarning, match="reuses the plan of epoch 0"):
        assert len(cyc) == 4 and list(cyc) == _planned(out, 1, 0)


def test_sampler_state_dict_resumes_exactly_the_remaining(out: Path) -> None:
    sampler = BalancedBatchSampler(out, rank=0, world_size=2)
    sampler.set_epoch(1)
    first = list(islice(iter(sampler), 3))
    state = sampler.state_dict()
    assert state == {"epoch": 1, "step": 3}
    fresh = BalancedBatchSampler(out, rank=0, world_size=2)
    fresh.load_state_dict(state)
    fresh.set_epoch(1)  # the usual loop calls set_epoch again: the position is kept
    rest = list(fresh)
    assert first + rest == _planned(out, 0, 1) and len(rest) == 1
    assert fresh.state_dict() == {"epoch": 1, "step": 4}
    assert list(fresh) == _planned(out, 0, 1)  # the next pass is a whole epoch again
    fresh.load_state_dict({"epoch": 0, "step": 4})
    assert list(fresh) == []  # resumed at the end of the epoch
    fresh.load_state_dict({"epoch": 0, "step": 2})
    fresh.set_epoch(1)  # another epoch: start from step 0
    assert list(fresh) == _planned(out, 0, 1)


def test_sampler_index_of_mapping_or_callable(out: Path) -> None:
    ids = read_samples(out, ["sample_id"])["sample_id"].to_pylist()
    reverse = {s: len(ids) - 1 - i for i, s in enumerate(ids)}
    expect = [[len(ids) - 1 - i for i in b] for b in _planned(out, 0, 0)]
    assert list(BalancedBatchSampler(out, 0, 2, index_of=reverse)) == expect
    assert list(BalancedBatchSampler(out, 0, 2, index_of=reverse.__getitem__)) == expect
    with pytest.raises(KeyError, match="not in index_of"):
        list(BalancedBatchSampler(out, 0, 2, index_of={}))


def test_sampler_rank_and_world_from_torch_distributed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="initialize torch.distributed"):
        BalancedBatchSampler(tmp_path)
    one = write_manifest(
        tmp_path / "w1", write_clouds(tmp_path / "d", [10] * 6), world_size=1, batch_size=2, epochs=1
    )
    dist.init_process_group("gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1)
    try:
        sampler = BalancedBatchSampler(one)
        assert (sampler.rank, sampler.world_size, len(sampler)) == (0, 1, 3)
        with pytest.raises(ValueError, match=r"world_size=2 .*world_size=1"):
            BalancedBatchSampler(one, world_size=2)
    finally:
        dist.destroy_process_group()


def test_dataloader_with_workers_yields_planned_batches_in_order(out: Path) -> None:
    dataset = PointCloudDataset(out)
    sampler = BalancedBatchSampler(out, rank=0, world_size=2)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2, pin_memory=True, collate_fn=collate)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin_memory.*")  # no accelerator on CI
        for epoch in range(2):
            sampler.set_epoch(epoch)
            got = [b["index"].tolist() for b in loader]
            assert got == _planned(out, 0, epoch)
            assert len(loader) == 4


def test_dataset_loads_keyframe_and_aggregated_sweeps(out: Path) -> None:
    dataset = PointCloudDataset(out)
    assert len(dataset) == len(SIZES)
    row = read_samples(out).slice(5, 1).to_pylist()[0]
    item = dataset[5]
    assert item["sample_id"] == row["sample_id"] and item["index"] == 5
    pts = item["points"]
    assert pts.dtype == torch.float32 and tuple(pts.shape) == (SIZES[5] + 2 * 7, 5) == (row["num_points"], 5)
    key = np.fromfile(row["path"], np.float32).reshape(-1, 5)
    np.testing.assert_array_equal(pts[: SIZES[5]].numpy(), key)
    sweeps = [np.fromfile(p, np.float32).reshape(-1, 5) for p in row["sweep_paths"]]
    mats = list(np.asarray(row["sweep_transforms"]).reshape(-1, 4, 4))
    np.testing.assert_array_equal(pts.numpy(), aggregate(key, sweeps, mats))
    assert tuple(PointCloudDataset(out, sweeps=False)[5]["points"].shape) == (SIZES[5], 5)


def test_collate_concatenates_with_batch_index(out: Path) -> None:
    dataset = PointCloudDataset(out, sweeps=False)
    batch = collate([dataset[i] for i in (3, 0, 7)])
    n = [SIZES[i] for i in (3, 0, 7)]
    assert batch["sample_id"] == [dataset.sample_ids[i] for i in (3, 0, 7)]
    assert batch["index"].tolist() == [3, 0, 7] and batch["num_points"].tolist() == n
    assert tuple(batch["points"].shape) == (sum(n), 5)
    assert batch["batch"].tolist() == [0] * n[0] + [1] * n[1] + [2] * n[2]
    torch.testing.assert_close(batch["points"][n[0] : n[0] + n[1]], dataset[0]["points"])


def test_dataset_on_real_nuscenes_sweeps(tmp_path: Path, realdata: Path) -> None:
    key = realdata / "nuscenes/samples/LIDAR_TOP"
    key = key / "n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin"
    sweeps = sorted(str(p) for p in (realdata / "nuscenes/sweeps/LIDAR_TOP").glob("*.pcd.bin"))
    mats = [np.eye(4), np.eye(4)]
    mats[1][:3, 3] = [1.0, -2.0, 0.5]
    cols = {
        "sample_id": ["real"],
        "path": [str(key)],
        "sweep_paths": [sweeps],
        "sweep_transforms": [np.concatenate([m.ravel() for m in mats]).tolist()],
    }
    out = write_manifest(tmp_path / "out", cols, world_size=1, batch_size=1, epochs=1)
    pts = PointCloudDataset(out)[0]["points"].numpy()
    frames = [read_points(Path(p).read_bytes(), "nuscenes_bin") for p in [str(key), *sweeps]]
    assert len(frames[0]) == 34688
    np.testing.assert_array_equal(pts, aggregate(frames[0], frames[1:], mats))
    assert len(pts) > 34688


@pytest.mark.timeout(120)
def test_train_ddp_two_gloo_ranks(tmp_path: Path) -> None:
    """A real 2-process gloo run of the example on a tiny fixture, with per-sample timings."""
    sizes = [200 + 150 * (i % 7) for i in range(16)]
    out = make_fixture(tmp_path, sizes, world_size=2, batch_size=2, epochs=1, sweeps=1, sweep_size=50)
    timings, summary = tmp_path / "t.csv", tmp_path / "r.json"
    cmd = [sys.executable, str(REPO / "examples/train_ddp.py"), "--manifest", str(out), "--width", "16",
           "--emit-timings", str(timings), "--json-out", str(summary)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=110, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(summary.read_text())
    assert result["sampler"] == "lidarshard" and result["world_size"] == 2
    assert result["epochs"][0]["steps"] == 4 and 0 < result["linearity"] <= 1
    assert "linearity=" in proc.stdout
    rows = list(csv.DictReader(timings.open()))
    assert len(rows) == 4 * 2 * 2 and set(rows[0]) == {"sample_id", "step", "rank", "ms", "num_points"}
    planned = {(s, b.step, r) for r in range(2) for b in ManifestReader(out, r, 2, 0) for s in b.sample_ids}
    assert {(r["sample_id"], int(r["step"]), int(r["rank"])) for r in rows} == planned
    assert all(float(r["ms"]) > 0 for r in rows)

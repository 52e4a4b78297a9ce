"""lidarshard.loaders.torch: BalancedBatchSampler (epochs, resume, DataLoader), PointCloudDataset, collate, and one
real 2-rank gloo run of examples/train_ddp.py."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from collections import Counter
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from lidarshard.loaders import ManifestReader, read_samples  # noqa: E402
from lidarshard.loaders.torch import (  # noqa: E402
    IGNORE_LABEL,
    BalancedBatchSampler,
    PlanLoader,
    PlanSampler,
    PointCloudDataset,
    collate,
)
from lidarshard.transforms.formats.readers import read_points  # noqa: E402
from lidarshard.transforms.layouts.multisweep import aggregate  # noqa: E402
from tests.helpers import slow_after  # noqa: E402
from tests.manifest_fixture import make_fixture, write_clouds, write_manifest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SIZES = [50 + 13 * i for i in range(26)]  # W*B = 6 -> 4 steps, 2 dropped


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return make_fixture(tmp_path, SIZES, world_size=2, batch_size=3, epochs=2, sweeps=2, sweep_size=7)


def _pos(state: dict) -> dict:
    """The position of a resume state (it also carries the plan's world size, batch size and fingerprint)."""
    return {"epoch": state["epoch"], "step": state["step"]}


def _planned(out: Path, rank: int, epoch: int) -> list[list[int]]:
    row = {s: i for i, s in enumerate(read_samples(out, ["sample_id"])["sample_id"].to_pylist())}
    return [[row[s] for s in b.sample_ids] for b in ManifestReader(out, rank, 2, epoch)]


def test_sampler_yields_planned_indices_per_epoch(out: Path) -> None:
    sampler = BalancedBatchSampler(out, rank=1, world_size=2)
    assert len(sampler) == 4
    assert list(sampler) == _planned(out, 1, 0)
    with pytest.warns(UserWarning, match="epoch 0 is being iterated again .* call sampler.set_epoch"):
        assert list(sampler) == _planned(out, 1, 0)
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
    assert _pos(state) == {"epoch": 1, "step": 3}
    assert (state["world_size"], state["batch_size"], state["seed"]) == (2, 3, 0)
    fresh = BalancedBatchSampler(out, rank=0, world_size=2)
    fresh.load_state_dict(state)
    fresh.set_epoch(1)  # the usual loop calls set_epoch again: the position is kept
    rest = list(fresh)
    assert first + rest == _planned(out, 0, 1) and len(rest) == 1
    assert _pos(fresh.state_dict()) == {"epoch": 1, "step": 4}
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


def _labelled(tmp_path: Path, sizes: list[int], name: str, **plan: int) -> Path:
    """A manifest of clouds with 2 sweeps whose keyframe point k of sample i is labelled (k + i) % 32."""
    cols = write_clouds(tmp_path / f"{name}_data", sizes, sweeps=2, sweep_size=7, seed=0)
    cols["label_path"] = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"{name}_labels{i}.bin"
        path.write_bytes(((np.arange(size) + i) % 32).astype(np.uint8).tobytes())
        cols["label_path"].append(str(path))
    return write_manifest(tmp_path / name, cols, **({"world_size": 1, "batch_size": 1, "epochs": 1} | plan))


def test_dataset_labels_keyframe_rows_and_ignores_sweeps(tmp_path: Path) -> None:
    out = _labelled(tmp_path, [40, 30], "out")
    dataset = PointCloudDataset(out, labels=True)
    item = dataset[1]
    n = item["points"].shape[0]
    assert item["labels"].dtype == torch.int64 and tuple(item["labels"].shape) == (n,) and n > 30
    assert item["labels"][:30].tolist() == [(k + 1) % 32 for k in range(30)]
    assert (item["labels"][30:] == IGNORE_LABEL).all()
    batch = collate([dataset[0], dataset[1]])
    assert batch["labels"].shape == batch["batch"].shape
    assert "labels" not in PointCloudDataset(out)[0] and "labels" not in collate([PointCloudDataset(out)[0]])
    unlabelled = write_manifest(tmp_path / "bare", write_clouds(tmp_path / "d2", [5]), world_size=1,
                                batch_size=1, epochs=1)  # fmt: skip
    with pytest.raises(ValueError, match="1 samples have no per-point labels"):
        PointCloudDataset(unlabelled, labels=True)


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


@pytest.mark.slow  # starts examples/train_ddp.py: 2 gloo ranks, torch imported per process
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


class _Indices(torch.utils.data.Dataset):
    """A dataset that does no I/O: item i is i."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class _Crash(Exception):
    pass


def _train(
    out: Path, rank: int, loader_kw: dict, *, crash_after: int | None = None, state: dict | None = None
) -> tuple[list[tuple[int, list[int]]], dict | None, list[int]]:
    """The README loop over 2 planned epochs: (trained (epoch, indices) in order, last checkpoint,
    len(loader) seen at the start of each epoch). ``crash_after`` k: the process dies while training
    the (k+1)-th batch, after checkpointing k."""
    sampler = BalancedBatchSampler(out, rank, 2)
    loader = PlanLoader(_Indices(len(SIZES)), sampler, **loader_kw)
    if state is not None:
        sampler.load_state_dict(json.loads(json.dumps(state)))  # as through a checkpoint file
    trained: list[tuple[int, list[int]]] = []
    lengths, checkpoint = [], state
    try:
        for epoch in range(sampler.epoch, 2):
            sampler.set_epoch(epoch)
            lengths.append(len(loader))
            for batch in loader:
                if crash_after is not None and len(trained) == crash_after:
                    raise _Crash
                trained.append((epoch, batch.tolist()))
                checkpoint = loader.state_dict()
    except _Crash:
        pass
    return trained, checkpoint, lengths


LOADERS = [{"num_workers": 0}] + [
    {"num_workers": w, "prefetch_factor": p, "persistent_workers": keep}
    for w in (2, 4)
    for p in (2, 4)
    for keep in (False, True)
]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 4 workers on a 2-core runner
@pytest.mark.parametrize(
    "loader_kw", slow_after(2, LOADERS), ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items())
)
def test_resume_after_a_crash_trains_exactly_the_uninterrupted_batches(out: Path, loader_kw: dict) -> None:
    """Crash after step k (mid epoch 0 and mid epoch 1 on rank 0, at the epoch boundary on rank 1),
    resume from the last checkpoint: trained + resumed == the plan, whatever the workers prefetched."""
    steps = 4
    for rank, crashes in ((0, (1, steps + 3)), (1, (steps,))):
        full = [(e, b) for e in range(2) for b in _planned(out, rank, e)]
        assert len(full) == 2 * steps
        for k in crashes:
            before, state, _ = _train(out, rank, loader_kw, crash_after=k)
            assert len(before) == k and _pos(state) == {
                "epoch": (k - 1) // steps,
                "step": (k - 1) % steps + 1,
            }
            after, _, lengths = _train(out, rank, loader_kw, state=state)
            assert before + after == full, (rank, k)
            assert lengths[0] == steps - state["step"]  # len() = the batches that will come


def test_a_sampler_reads_the_manifest_once_and_each_epochs_plan_once(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lidarshard.loaders import reader
    from lidarshard.transforms.io import storage

    reads: Counter[str] = Counter()
    real_json, real_plan = storage.read_json, reader.read_rank_plan

    def read_json(path: str, *args: object, **kwargs: object) -> object:
        reads[os.path.basename(path)] += 1
        return real_json(path, *args, **kwargs)

    def read_rank_plan(*args: object, **kwargs: object) -> object:
        reads["plan"] += 1
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(storage, "read_json", read_json)
    monkeypatch.setattr(reader, "read_rank_plan", read_rank_plan)
    sampler = BalancedBatchSampler(out, 0, 2)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        assert len(list(sampler)) == len(sampler.scales())
        sampler.state_dict()
    # _manifest.json: read to open, and once more after the sample ids are read (a read of some columns is
    # checked by size alone, so OUT must still record the samples opened: loaders.held); each epoch's plan
    # file once, every byte checked against the manifest opened, which is not read again for it
    assert (reads["_manifest.json"], reads["plan"]) == (2, 2)


def test_a_second_pass_over_an_epoch_warns_once_naming_set_epoch(out: Path, tmp_path: Path) -> None:
    sampler = BalancedBatchSampler(out, 0, 2)
    list(sampler)
    with pytest.warns(UserWarning, match=r"call sampler\.set_epoch\(epoch\) before each epoch") as seen:
        list(sampler)
        list(sampler)
    assert len(seen) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh = BalancedBatchSampler(out, 0, 2)
        for epoch in range(2):  # the right loop never warns, nor does the last planned epoch again
            fresh.set_epoch(epoch)
            list(fresh)
        list(fresh)
        one = write_manifest(
            tmp_path / "e1", write_clouds(tmp_path / "d", [10] * 6), world_size=1, batch_size=2, epochs=1
        )
        single = BalancedBatchSampler(one, 0, 1)
        assert list(single) == list(single)  # one planned epoch: replaying it is the only choice


def test_batch_sampler_given_as_sampler_names_batch_sampler(out: Path) -> None:
    sampler = BalancedBatchSampler(out, 0, 2)
    for kwargs in ({"batch_size": 3}, {"batch_size": None}):
        loader = DataLoader(_Indices(len(SIZES)), sampler=sampler, **kwargs)
        with pytest.raises(
            TypeError, match=r"pass it as DataLoader\(dataset, batch_sampler=sampler\), not sampler="
        ):
            sampler.check_loader(loader)
    sampler.check_loader(DataLoader(_Indices(len(SIZES)), batch_sampler=sampler))  # the right way passes
    with pytest.raises(TypeError, match=r"\['sampler'\] come from the manifest's plan"):
        PlanLoader(_Indices(len(SIZES)), sampler, sampler=sampler)


def test_plan_sampler_refuses_a_dataloader_batch_size_other_than_the_manifests(out: Path) -> None:
    sampler = PlanSampler(out, 0, 2)
    with pytest.raises(ValueError, match=r"batch_size=2 but the manifest was planned with --batch-size 3"):
        sampler.check_loader(DataLoader(_Indices(len(SIZES)), sampler=sampler, batch_size=2))
    right = DataLoader(_Indices(len(SIZES)), sampler=sampler, batch_size=3)
    sampler.check_loader(right)
    got = [b.tolist() for b in right]
    assert got == _planned(out, 0, 0)


def test_state_of_a_plain_prefetching_dataloader_is_refused_not_wrong(out: Path) -> None:
    sampler = BalancedBatchSampler(out, 0, 2)
    it = iter(DataLoader(_Indices(len(SIZES)), batch_sampler=sampler, num_workers=2))
    next(it)
    with pytest.raises(
        RuntimeError, match=r"num_workers > 0\) prefetches batches ahead of training.*PlanLoader"
    ):
        sampler.state_dict()
    del it


@pytest.mark.parametrize("bad", [0.5, True, "0", None])
def test_sampler_rank_epoch_and_state_must_be_ints(out: Path, bad: object) -> None:
    if bad is not None:
        with pytest.raises(TypeError, match="rank must be an int"):
            BalancedBatchSampler(out, bad, 2)
    sampler = BalancedBatchSampler(out, 0, 2)
    with pytest.raises(TypeError, match="epoch must be an int"):
        sampler.set_epoch(bad)
    with pytest.raises(TypeError, match="step must be an int"):
        sampler.load_state_dict({"epoch": 0, "step": bad})
    with pytest.raises(ValueError, match="step 5 is outside 0..4"):
        sampler.load_state_dict({"epoch": 0, "step": 5})
    with pytest.raises(TypeError, match="PlanLoader: .*'batch_size'"):
        PlanLoader(_Indices(3), sampler, batch_size=3)


@pytest.mark.slow  # starts examples/train_ddp.py: 2 gloo ranks, torch imported per process
@pytest.mark.timeout(120)
def test_train_ddp_lidarseg_with_validation(tmp_path: Path) -> None:
    """The example on lidarseg labels: validation before and after every epoch, counted per class."""
    train = _labelled(
        tmp_path, [60 + 10 * i for i in range(8)], "train", world_size=2, batch_size=2, epochs=2
    )
    val = _labelled(tmp_path, [50, 70, 90], "val")
    summary = tmp_path / "r.json"
    cmd = [sys.executable, str(REPO / "examples/train_ddp.py"), "--manifest", str(train), "--val-manifest",
           str(val), "--targets", "lidarseg", "--optimizer", "adam", "--epochs", "2", "--width", "8",
           "--json-out", str(summary)]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=110, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(summary.read_text())
    evals = [result["val_initial"], *result["epochs"]]
    for e in evals:
        assert sum(e["val_class_points"].values()) == 50 + 70 + 90  # keyframe rows only, every one
        assert 0.0 <= e["val_miou"] <= 1.0 and e["val_loss"] > 0
        assert set(e["val_iou"]) == set(e["val_class_points"]) == {str(k) for k in range(32)}
    assert all(e["train_loss"] > 0 for e in result["epochs"])


def test_example_miou_by_hand() -> None:
    spec = importlib.util.spec_from_file_location("train_ddp", REPO / "examples/train_ddp.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    conf = torch.tensor([[3, 1, 0], [0, 2, 0], [0, 0, 0]])  # [truth, prediction]; class 2 absent
    value, ious = example.miou(conf)
    assert ious == pytest.approx({0: 3 / 4, 1: 2 / 3}) and value == pytest.approx((3 / 4 + 2 / 3) / 2)
    assert example.miou(torch.zeros(2, 2)) == (0.0, {})


class _Scales:
    """A sampler's ``loss_scale``: ``W / N`` of a step whose ranks hold ``counts``."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts

    def loss_scale(self, step: int) -> float:
        return len(self.counts) / sum(self.counts)


@pytest.mark.parametrize("counts", [[49] * 7, [2] * 64, [3, 1, 2, 2], [5, 1], [1, 1, 1, 9]])
def test_example_weights_each_ranks_mean_loss_by_its_share_of_the_step(counts: list[int]) -> None:
    """train_ddp's ``_rank_weight``: W n_r / N, so averaging the W weighted rank means weights each
    rank by n_r / N; exactly 1 with equal counts (the example's usual loss, unchanged)."""
    spec = importlib.util.spec_from_file_location("train_ddp", REPO / "examples/train_ddp.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    w, total = len(counts), sum(counts)
    weights = [example._rank_weight(_Scales(counts), 0, n, w) for n in counts]
    means = [float(r + 1) for r in range(w)]  # any per-rank mean losses
    ddp = sum(wt * m for wt, m in zip(weights, means, strict=True)) / w
    assert ddp == pytest.approx(sum(n * m for n, m in zip(counts, means, strict=True)) / total)
    if len(set(counts)) == 1:
        assert weights == [1.0] * w
    assert example._rank_weight(object(), 0, 3, w) == 1.0  # torch's DistributedSampler


def _ddp_average_of_scaled_sums(x: torch.Tensor, y: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Simulated DDP: rank r holds ``counts[r]`` consecutive samples, computes
    ``loss = scale * sum(per-sample losses)`` with the reader's ``scale = W / N``, and the W
    gradients are averaged (what DDP's all-reduce does)."""
    w, n = len(counts), sum(counts)
    grads, start = [], 0
    for c in counts:
        model = torch.nn.Linear(3, 1, dtype=torch.float64)
        torch.nn.init.constant_(model.weight, 0.5)
        torch.nn.init.constant_(model.bias, -0.25)
        per_sample = (model(x[start : start + c]).squeeze(1) - y[start : start + c]) ** 2
        (per_sample.sum() * (w / n)).backward()
        grads.append(torch.cat([model.weight.grad.ravel(), model.bias.grad]))
        start += c
    return torch.stack(grads).mean(0)


def _global_mean_gradient(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    model = torch.nn.Linear(3, 1, dtype=torch.float64)
    torch.nn.init.constant_(model.weight, 0.5)
    torch.nn.init.constant_(model.bias, -0.25)
    ((model(x).squeeze(1) - y) ** 2).mean().backward()
    return torch.cat([model.weight.grad.ravel(), model.bias.grad])


def test_loss_scale_two_ranks_1_and_3_equal_one_process_on_4() -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = (
        torch.randn(4, 3, generator=gen, dtype=torch.float64),
        torch.randn(4, generator=gen, dtype=torch.float64),
    )
    averaged = _ddp_average_of_scaled_sums(x, y, [1, 3])
    torch.testing.assert_close(averaged, _global_mean_gradient(x, y))
    # the per-rank mean (scale 1/n_r) would weight the lone sample 3x: a different gradient
    per_rank_mean = 0.5 * (
        _ddp_average_of_scaled_sums(x[:1], y[:1], [1]) + _ddp_average_of_scaled_sums(x[1:], y[1:], [3])
    )
    assert not torch.allclose(per_rank_mean, averaged)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(counts=st.lists(st.integers(1, 5), min_size=1, max_size=6), seed=st.integers(0, 2**31 - 1))
def test_loss_scale_gives_the_global_mean_gradient_for_any_counts(counts: list[int], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    n = sum(counts)
    x, y = (
        torch.randn(n, 3, generator=gen, dtype=torch.float64),
        torch.randn(n, generator=gen, dtype=torch.float64),
    )
    torch.testing.assert_close(_ddp_average_of_scaled_sums(x, y, counts), _global_mean_gradient(x, y))


def test_budget_manifest_yields_variable_batches_with_loss_scales(tmp_path: Path) -> None:
    from lidarshard.loaders.torch import PlanBatchSampler, PlanSampler

    sizes = [int(v) for v in np.random.default_rng(4).lognormal(5.0, 1.0, 40).astype(int) + 5]
    out = make_fixture(tmp_path, sizes, world_size=2, batch_size=2, epochs=2, budget=True)
    steps = json.loads((out / "_manifest.json").read_text())["steps_per_epoch"]
    seen = []
    batches = [BalancedBatchSampler(out, rank, 2) for rank in range(2)]
    for b in batches:
        b.set_epoch(1)
    per_rank = [list(b) for b in batches]
    assert [len(p) for p in per_rank] == [steps[1]] * 2  # same number of steps on every rank
    assert len({len(batch) for p in per_rank for batch in p}) > 1  # variable counts
    for s in range(steps[1]):
        n = len(per_rank[0][s]) + len(per_rank[1][s])
        assert batches[0].loss_scale(s) == batches[1].loss_scale(s) == pytest.approx(2 / n)
        seen += per_rank[0][s] + per_rank[1][s]
    assert sorted(seen) == list(range(len(sizes)))  # every sample exactly once
    plan = PlanSampler(out, 0, 2)
    plan.set_epoch(1)
    with pytest.raises(TypeError, match="PlanBatchSampler"):
        list(plan)
    loader = DataLoader(PointCloudDataset(out), batch_sampler=PlanBatchSampler(plan), collate_fn=collate)
    assert len(loader) == steps[1]
    assert [b["index"].tolist() for b in loader] == per_rank[0]

"""lidarshard.loaders.pointcept: the trainer mixin inside a stand-in for Pointcept's Trainer (same loop, same
loader calls), Pointcept's offset batch layout, and the per-sample PlanSampler."""

from __future__ import annotations

import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, Dataset  # noqa: E402

from lidarshard.loaders import ManifestReader, read_samples  # noqa: E402
from lidarshard.loaders.pointcept import (  # noqa: E402
    LidarshardTrainerMixin,
    PlanSampler,
    build_train_loader,
    offset_collate,
)
from lidarshard.loaders.torch import PointCloudDataset  # noqa: E402
from tests.manifest_fixture import make_fixture  # noqa: E402

SIZES = [40 + 11 * i for i in range(14)]  # world size 1, batch 3 -> 4 steps, 2 dropped


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    return make_fixture(tmp_path_factory.mktemp("pc"), SIZES, world_size=1, batch_size=3, epochs=3)


def _planned_ids(out: Path, epoch: int) -> list[list[str]]:
    return [b.sample_ids for b in ManifestReader(out, 0, 1, epoch)]


class InfoDataset(Dataset):
    """Pointcept's ``DefaultDataset`` shape: ``data_list`` of info dicts (here in reverse sample order),
    items with ``coord`` and a per-sample ``offset``, which the collate turns cumulative."""

    def __init__(self, out: Path, loop: int = 1) -> None:
        table = read_samples(out, ["sample_id", "path"]).to_pylist()[::-1]
        self.data_list = [{"token": r["sample_id"], "lidar_path": r["path"]} for r in table]
        self.loop = loop  # Pointcept: the data list is repeated `loop` times per trainer epoch

    def __len__(self) -> int:
        return len(self.data_list) * self.loop

    def __getitem__(self, idx: int) -> dict[str, Any]:
        info = self.data_list[idx % len(self.data_list)]

        pts = np.fromfile(info["lidar_path"], np.float32).reshape(-1, 5)
        coord = torch.from_numpy(pts[:, :3].copy())
        strength = torch.from_numpy(pts[:, 3:4] / 255)
        return {
            "coord": coord,
            "strength": strength,
            "offset": torch.tensor([len(pts)]),
            "name": info["token"],
        }


def pointcept_collate(batch: list[Mapping[str, Any]], mix_prob: float = 0.0) -> dict[str, Any]:
    """Pointcept's ``collate_fn`` for dict items: concatenate tensors, list strings, cumulative ``offset``."""
    out = {
        k: [d[k] for d in batch] if isinstance(batch[0][k], str) else torch.cat([d[k] for d in batch])
        for k in batch[0]
    }
    return {k: torch.cumsum(v, dim=0) if "offset" in k else v for k, v in out.items()}


#: The step timer's host clock in the timing tests (``fake_clock``): ``run_step`` advances it 1 us per point.
CLOCK = {"t": 0.0}


class FakeTrainer:
    """Pointcept's ``Trainer`` as far as the train loader goes: ``__init__`` builds it with
    ``build_train_loader``; ``train`` is Pointcept's loop (``set_epoch`` only with world size > 1) with its
    step hooks around ``run_step``."""

    def __init__(self, cfg: Any, world_size: int = 1, model: Any = None) -> None:
        self.cfg, self.world_size, self.model = cfg, world_size, model
        self.epoch, self.start_epoch, self.max_epoch = 0, 0, cfg.eval_epoch
        self.comm_info: dict[str, Any] = {}
        self.seen: list[tuple[int, list[str], list[int]]] = []
        self.train_loader = self.build_train_loader()

    def build_train_loader(self) -> DataLoader:  # Pointcept's: DistributedSampler / shuffle
        raise NotImplementedError

    def before_train(self) -> None:
        self.start_epoch = getattr(self.cfg, "resume_epoch", 0)  # Pointcept's CheckpointLoader hook

    def after_epoch(self) -> None:
        pass

    def before_step(self) -> None:
        pass

    def run_step(self) -> None:  # would move the batch to the GPU, forward, backward, step
        d = self.comm_info["input_dict"]
        self.seen.append((self.epoch, d["name"], d["offset"].tolist()))
        CLOCK["t"] += 1e-6 * len(d["coord"])

    def after_step(self) -> None:
        pass

    def after_train(self) -> None:
        pass

    def train(self) -> None:
        self.before_train()
        for self.epoch in range(self.start_epoch, self.max_epoch):  # noqa: B020 - Pointcept's loop
            if self.world_size > 1:
                self.train_loader.sampler.set_epoch(self.epoch)
            self.data_iterator = enumerate(self.train_loader)
            for self.comm_info["iter"], self.comm_info["input_dict"] in self.data_iterator:  # noqa: B020
                self.before_step()
                self.run_step()
                self.after_step()
            self.after_epoch()
        self.after_train()


class LidarshardTrainer(LidarshardTrainerMixin, FakeTrainer):
    pass


def _cfg(out: Path, **kw: Any) -> types.SimpleNamespace:
    base = dict(
        eval_epoch=3,
        batch_size_per_gpu=3,
        num_worker_per_gpu=0,
        mix_prob=0.0,
        seed=7,
        lidarshard={"manifest": str(out), "id_key": "token"},
        data=types.SimpleNamespace(train=types.SimpleNamespace(path=str(out), loop=1)),
    )
    return types.SimpleNamespace(**{**base, **kw})


@pytest.fixture(autouse=True)
def _pointcept_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand in for ``pointcept.datasets``: ``build_dataset`` and ``point_collate_fn``."""
    fake = types.ModuleType("pointcept.datasets")
    fake.build_dataset = lambda cfg: InfoDataset(Path(cfg.path), cfg.loop)
    fake.point_collate_fn = pointcept_collate
    monkeypatch.setitem(__import__("sys").modules, "pointcept", types.ModuleType("pointcept"))
    monkeypatch.setitem(__import__("sys").modules, "pointcept.datasets", fake)


@pytest.mark.parametrize("pointcept_world_size", [1, 2])  # 2: Pointcept's loop calls set_epoch too
def test_mixin_replays_the_planned_epochs(out: Path, pointcept_world_size: int) -> None:
    trainer = LidarshardTrainer(_cfg(out), pointcept_world_size)
    assert isinstance(trainer.train_loader.sampler, PlanSampler) and len(trainer.train_loader) == 4
    trainer.train()
    for epoch in range(3):
        got = [toks for e, toks, _ in trainer.seen if e == epoch]
        assert got == _planned_ids(out, epoch)
    offsets = trainer.seen[0][2]
    sizes = {
        sid: n
        for sid, n in zip(read_samples(out, ["sample_id"])["sample_id"].to_pylist(), SIZES, strict=True)
    }
    assert offsets == np.cumsum([sizes[s] for s in trainer.seen[0][1]]).tolist()  # Pointcept's offset


def test_mixin_resumes_at_the_checkpoint_epoch_with_workers(out: Path) -> None:
    cfg = _cfg(out, resume_epoch=1, num_worker_per_gpu=1)
    trainer = LidarshardTrainer(cfg)
    trainer.train()
    assert [toks for _, toks, _ in trainer.seen] == _planned_ids(out, 1) + _planned_ids(out, 2)


def test_dataset_loop_trains_that_many_planned_epochs_per_trainer_epoch(out: Path) -> None:
    # Pointcept sets data.train.loop = epoch // eval_epoch: 3 planned epochs, eval_epoch 1 -> loop 3
    train = types.SimpleNamespace(path=str(out), loop=3)
    trainer = LidarshardTrainer(_cfg(out, eval_epoch=1, data=types.SimpleNamespace(train=train)))
    assert len(trainer.train_loader) == 3 * 4
    trainer.train()
    assert [toks for _, toks, _ in trainer.seen] == _planned_ids(out, 0) + _planned_ids(
        out, 1
    ) + _planned_ids(out, 2)


def test_batch_size_per_gpu_must_match_the_manifest(out: Path) -> None:
    with pytest.raises(ValueError, match="batch_size_per_gpu=2 .*--batch-size 3"):
        LidarshardTrainer(_cfg(out, batch_size_per_gpu=2))


def test_offset_collate_with_point_cloud_dataset(out: Path) -> None:
    dataset = PointCloudDataset(out)
    loader = build_train_loader(_cfg(out), out, dataset, collate_fn=offset_collate)
    first = next(iter(loader))
    planned = _planned_ids(out, 0)[0]
    assert first["sample_id"] == planned
    n = [dataset[i]["points"].shape[0] for i in first["index"].tolist()]
    assert first["offset"].tolist() == np.cumsum(n).tolist() and first["offset"].dtype == torch.int64
    assert tuple(first["coord"].shape) == (sum(n), 3) and tuple(first["feat"].shape) == (sum(n), 5)
    torch.testing.assert_close(first["coord"], first["feat"][:, :3])


def test_plan_sampler_is_the_flattened_batch_sampler(out: Path) -> None:
    s = PlanSampler(out, 0, 1)
    rows = {sid: i for i, sid in enumerate(read_samples(out, ["sample_id"])["sample_id"].to_pylist())}
    s.set_epoch(2)
    assert (len(s), s.batch_size, s.epoch) == (12, 3, 2)
    assert list(s) == [rows[x] for b in _planned_ids(out, 2) for x in b]
    state = s.state_dict()
    assert (state["epoch"], state["step"], state["world_size"], state["batch_size"]) == (2, 4, 1, 3)


def test_without_pointcept_dataset_and_collate_are_required(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "pointcept.datasets", None)
    with pytest.raises(ImportError, match="pass dataset= and collate_fn="):
        build_train_loader(_cfg(out), out)


def test_budget_manifest_trains_variable_batches_through_offset_collate(tmp_path: Path) -> None:
    sizes = [int(v) for v in np.random.default_rng(5).lognormal(4.0, 1.0, 30).astype(int) + 10]
    out = make_fixture(tmp_path, sizes, world_size=1, batch_size=3, epochs=1, budget=True)
    dataset = PointCloudDataset(out)
    loader = build_train_loader(_cfg(out), out, dataset, collate_fn=offset_collate)
    batches = list(loader)
    planned = _planned_ids(out, 0)
    assert [b["sample_id"] for b in batches] == planned and len(batches) == len(loader)
    assert sum(len(p) for p in planned) == len(sizes)  # nothing dropped
    for b in batches:
        n = [dataset[i]["points"].shape[0] for i in b["index"].tolist()]
        assert b["offset"].tolist() == np.cumsum(n).tolist()


def test_a_plan_sampler_checkpoint_resumes_on_two_ranks_with_the_elastic_sampler(tmp_path: Path) -> None:
    """Pointcept's sampler, mid-epoch after 2 batches of a worker-less loader: the rest of the epoch on 2
    ranks (a re-plan: 3 samples per step do not split over 2) trains every planned sample once."""
    from collections import Counter

    from lidarshard.loaders.elastic import ElasticBatchSampler, load_epoch_plan
    from tests.elastic_fixture import plan_manifest

    costs = np.array(SIZES, dtype=np.float64)
    out = plan_manifest(tmp_path / "out", costs, world_size=1, batch_size=3, epochs=2, strategy="balanced")
    loader = build_train_loader(_cfg(out), out, list(range(len(SIZES))), collate_fn=list)
    loader.sampler.set_epoch(1)
    trained = Counter(i for _, b in zip(range(2), loader, strict=False) for i in b)
    state = loader.sampler.state_dict()
    assert (state["epoch"], state["step"], state["batch_size"]) == (1, 2, 3)
    for r in range(2):
        sampler = ElasticBatchSampler(out, r, 2, batch_size=1)
        sampler.load_state_dict(state)
        trained.update(i for b in sampler for i in b)
    full = load_epoch_plan(out, 1).rows
    assert trained == Counter(full.ravel().tolist())


# ------------------------------------------------------------------------------ step timings (timings=True)


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """``StepTimer``'s ``time.perf_counter`` reads ``CLOCK``: step times are exactly 1e-6 s x the batch's points."""
    import lidarshard.loaders.clocks as clocks

    monkeypatch.setattr(clocks, "time", types.SimpleNamespace(perf_counter=lambda: CLOCK["t"]))


def _recorded(directory: Path) -> list[tuple[int, int, list[str]]]:
    from lidarshard.loaders.step_timer import read_timing_files

    return [(r["epoch"], r["step"], r["sample_ids"]) for r in read_timing_files(str(directory)).to_pylist()]


def _plan_rows(out: Path, epochs: range) -> list[tuple[int, int, list[str]]]:
    return [(e, b.step, b.sample_ids) for e in epochs for b in ManifestReader(out, 0, 1, e)]


def test_timings_beside_the_checkpoints_are_the_plan_and_calibrate_fits_them(
    out: Path, tmp_path: Path, fake_clock: None
) -> None:
    """``timings=True``: one row per step in ``save_path/model`` (where Pointcept's CheckpointSaver writes)
    with the plan's epoch, step and the sample ids the step trained on, one part per epoch; ``lidarshard
    calibrate --timings`` fits them and recovers the trainer's cost, 1e-3 ms per point."""
    import json

    from lidarshard.pipelines.cli import main as cli_main

    opts = {"manifest": str(out), "id_key": "token", "timings": True}
    trainer = LidarshardTrainer(_cfg(out, save_path=str(tmp_path / "exp"), lidarshard=opts))
    trainer.train()
    folder = tmp_path / "exp" / "model"
    assert _recorded(folder) == _plan_rows(out, range(3))
    assert [ids for _, _, ids in _recorded(folder)] == [toks for _, toks, _ in trainer.seen]
    assert len(list(folder.glob("timings-rank-00000-part-*.parquet"))) == 3  # flushed after every epoch
    fit = tmp_path / "fit.json"
    assert cli_main(["calibrate", str(out), "--timings", str(folder), "-o", str(fit)]) == 0
    body = json.loads(fit.read_text())
    assert body["source"]["timed"] == "recorded rank-step" and body["source"]["matched"] == 12
    m = body["cost_model"]
    assert (m["a"] + m["b"]) == pytest.approx(1e-3, rel=0.01) and body["r2"] > 0.999


def test_timings_follow_the_planned_epochs_of_a_loop_and_a_resume(out: Path, tmp_path: Path) -> None:
    """``loop = 3``: one trainer epoch records planned epochs 0, 1, 2, each from step 0; a run resumed at
    trainer epoch 1 (a worker prefetching) records its epochs into another folder named by ``timings``."""
    loop = types.SimpleNamespace(path=str(out), loop=3)
    opts = {"manifest": str(out), "id_key": "token", "timings": str(tmp_path / "a")}
    LidarshardTrainer(
        _cfg(out, eval_epoch=1, data=types.SimpleNamespace(train=loop), lidarshard=opts)
    ).train()
    assert _recorded(tmp_path / "a") == _plan_rows(out, range(3))
    opts = {**opts, "timings": str(tmp_path / "b")}
    LidarshardTrainer(_cfg(out, resume_epoch=1, num_worker_per_gpu=1, lidarshard=opts)).train()
    assert _recorded(tmp_path / "b") == _plan_rows(out, range(1, 3))
    LidarshardTrainer(_cfg(out, save_path=str(tmp_path / "c"))).train()  # no timings key: nothing written
    assert not (tmp_path / "c").exists()


def test_a_ddp_model_gets_the_timers_comm_hook(out: Path, tmp_path: Path) -> None:
    """Pointcept wraps the model in DistributedDataParallel with more than one GPU: the mixin registers the
    timer's comm hook on it before the first step, so compute_s ends at the first gradient bucket."""
    from torch.nn.parallel import DistributedDataParallel

    from lidarshard.loaders.step_timer import ddp_timing_hook

    class Wrapped(DistributedDataParallel):  # stands in for a wrapped model without a process group
        def __init__(self) -> None:
            self.hooks: list[tuple[Any, Any]] = []

        def register_comm_hook(self, state: Any, hook: Any) -> None:
            self.hooks.append((state, hook))

    model = Wrapped()
    opts = {"manifest": str(out), "id_key": "token", "timings": str(tmp_path / "t")}
    trainer = LidarshardTrainer(_cfg(out, eval_epoch=1, lidarshard=opts), model=model)
    trainer.train()
    [(state, hook)] = model.hooks
    assert hook is ddp_timing_hook and state.timer is trainer._lidarshard_timer.timer
    assert {r[0] for r in _recorded(tmp_path / "t")} == {0}

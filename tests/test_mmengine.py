"""lidarshard.loaders.mmengine: a real mmengine ``Runner`` trains on a built manifest, epoch- and iter-based, with
resume; the registered sampler's batch-size check and sample_id mapping. Skipped without mmengine."""

from __future__ import annotations

import logging
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mmengine = pytest.importorskip("mmengine")

from mmengine.model import BaseModel  # noqa: E402
from mmengine.registry import DATA_SAMPLERS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

import lidarshard.loaders.mmengine  # noqa: E402, F401  (registers the samplers)
from lidarshard.loaders import ManifestReader, read_samples  # noqa: E402
from lidarshard.loaders.torch import PointCloudDataset, collate  # noqa: E402
from lidarshard.pipelines import build as build_cli  # noqa: E402
from tests.helpers import BEAM_TEST_FLAGS, make_bins  # noqa: E402
from tests.manifest_fixture import make_fixture  # noqa: E402

BATCH, STEPS = 3, 4  # 13 clouds, world size 1 -> 4 steps of 3 (1 dropped) per epoch


@pytest.fixture(autouse=True)
def _mmengine_resume_on_new_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """mmengine <= 0.10.7 resumes with a bare ``torch.load``, which torch >= 2.6 restricts to weights
    (open-mmlab/mmengine#1655); its checkpoints are our own files, so allow full unpickling."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("mm")
    inp = make_bins(tmp / "in", n=13)
    flags = ["--world-size", "1", "--batch-size", str(BATCH), "--epochs", "3", "--cost-model", "points"]
    assert (
        build_cli.run([str(inp), str(tmp / "out"), *flags, "--max-reject-fraction", "0.2", *BEAM_TEST_FLAGS])
        == 0
    )
    return tmp / "out"


def _planned(out: Path, epoch: int) -> list[list[int]]:
    row = {s: i for i, s in enumerate(read_samples(out, ["sample_id"])["sample_id"].to_pylist())}
    return [[row[s] for s in b.sample_ids] for b in ManifestReader(out, 0, 1, epoch)]


class PointCountModel(BaseModel):
    """Fits one scale to the mean |xyz| of each batch; records the dataset indices it trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def forward(self, points, index, mode="tensor", **_):  # noqa: ANN001, ANN201 - mmengine's signature
        self.seen.append(index.tolist())
        return {"loss": (self.scale - points[:, :3].abs().mean()) ** 2}


def _runner(
    out: Path,
    work_dir: Path,
    train_cfg: dict,
    *,
    resume: bool = False,
    batch_sampler: bool = False,
    num_workers: int = 0,
):
    loader = dict(
        dataset=PointCloudDataset(out, point_dims=4),
        batch_size=BATCH,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        sampler=dict(type="LidarshardSampler", manifest=str(out)),
        collate_fn=collate,
    )
    if batch_sampler:
        loader["batch_sampler"] = dict(type="LidarshardBatchSampler")
    by_epoch = train_cfg.get("by_epoch", True)
    return Runner(
        model=PointCountModel(),
        work_dir=str(work_dir),
        train_dataloader=loader,
        train_cfg=train_cfg,
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        default_hooks=dict(
            checkpoint=dict(type="CheckpointHook", interval=1 if by_epoch else 3, by_epoch=by_epoch)
        ),
        randomness=dict(seed=123),
        resume=resume,
        log_level=logging.WARNING,
        experiment_name=f"exp_{work_dir.name}_{int(resume)}",
    )


def test_runner_trains_epochs_on_the_plan_and_resumes(manifest: Path, tmp_path: Path) -> None:
    runner = _runner(manifest, tmp_path, dict(by_epoch=True, max_epochs=2))
    sampler = runner.train_dataloader.sampler
    assert (type(sampler).__name__, sampler.seed, len(runner.train_dataloader)) == (
        "LidarshardSampler",
        123,
        STEPS,
    )
    runner.train()
    model = runner.model
    assert model.seen == _planned(manifest, 0) + _planned(manifest, 1)
    assert model.scale.item() > 0  # the optimizer stepped
    # resume from the epoch-2 checkpoint and train one more epoch: mmengine's DistSamplerSeedHook
    # selects epoch 2 through the batch sampler's sampler
    again = _runner(manifest, tmp_path, dict(by_epoch=True, max_epochs=3), resume=True, batch_sampler=True)
    again.train()
    assert again.model.seen == _planned(manifest, 2)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iter_based_loop_crosses_epochs_and_resumes_mid_epoch(
    manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, num_workers: int
) -> None:
    """mmengine's own resume counts trained iterations and replays the deterministic order up to
    them, so prefetching workers (persistent) change nothing: trained + resumed == the plan."""
    import mmengine.runner.loops as loops

    monkeypatch.setattr(loops, "time", types.SimpleNamespace(sleep=lambda s: None))  # 2 s per epoch restart
    flat = _planned(manifest, 0) + _planned(manifest, 1)
    runner = _runner(manifest, tmp_path, dict(by_epoch=False, max_iters=STEPS + 2), num_workers=num_workers)
    runner.train()
    assert runner.model.seen == flat[: STEPS + 2]  # epoch 0, then set_epoch(1) by the loop's iterator
    again = _runner(
        manifest, tmp_path, dict(by_epoch=False, max_iters=STEPS + 3), resume=True, num_workers=num_workers
    )
    again.train()  # resumes at iter 6: mmengine draws (and discards) 6 batches of the same order first
    assert again.model.seen == flat[STEPS + 2 : STEPS + 3]


def test_batch_sampler_refuses_another_batch_size(manifest: Path) -> None:
    cfg = dict(
        dataset=PointCloudDataset(manifest, point_dims=4),
        batch_size=BATCH + 1,
        sampler=dict(type="LidarshardSampler", manifest=str(manifest)),
        batch_sampler=dict(type="LidarshardBatchSampler"),
    )
    with pytest.raises(ValueError, match=f"batch_size={BATCH + 1} .*--batch-size {BATCH}"):
        Runner.build_dataloader(cfg)
    ok = Runner.build_dataloader({**cfg, "batch_size": BATCH})
    assert [len(b) for b in ok.batch_sampler] == [BATCH] * STEPS


def test_id_key_maps_dataset_infos_to_sample_ids(manifest: Path) -> None:
    ids = read_samples(manifest, ["sample_id"])["sample_id"].to_pylist()

    class Infos:  # mmengine BaseDataset's interface, in reverse samples.parquet order
        def __len__(self) -> int:
            return len(ids)

        def get_data_info(self, i: int) -> dict:
            return {"token": ids[len(ids) - 1 - i]}

    sampler = DATA_SAMPLERS.build(
        dict(type="LidarshardSampler", manifest=str(manifest), id_key="token", dataset=Infos())
    )
    assert list(sampler) == [len(ids) - 1 - i for b in _planned(manifest, 0) for i in b]
    with pytest.raises(KeyError, match="not in index_of"):
        list(
            DATA_SAMPLERS.build(
                dict(type="LidarshardSampler", manifest=str(manifest), id_key=lambda i: "x", dataset=[])
            )
        )


def test_without_mmengine_the_error_names_the_extra() -> None:
    code = "import sys; sys.modules['mmengine'] = None; import lidarshard.loaders.mmengine"
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and 'pip install "lidarshard[mmengine]"' in proc.stderr


def test_eval_sampler_shards_the_val_set_once_across_ranks(
    manifest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``val_dataloader.sampler=dict(type="LidarshardEvalSampler")`` built by mmengine on 2 ranks: every
    sample exactly once, counts within one, no padding repeat (DefaultSampler's round_up)."""
    import lidarshard.loaders.mmengine as adapter

    dataset = PointCloudDataset(manifest, point_dims=4)
    cfg = dict(
        dataset=dataset,
        batch_size=2,
        sampler=dict(type="LidarshardEvalSampler", manifest=str(manifest)),
        collate_fn=collate,
    )
    shards = []
    for rank in range(2):
        monkeypatch.setattr(adapter, "get_dist_info", lambda r=rank: (r, 2))
        loader = Runner.build_dataloader(cfg)
        assert type(loader.sampler).__name__ == "LidarshardEvalSampler"
        shards.append([i for b in loader for i in b["index"].tolist()])
    assert sorted(shards[0] + shards[1]) == list(range(len(dataset)))
    assert sorted(len(s) for s in shards) == [len(dataset) // 2, len(dataset) - len(dataset) // 2]


def test_batch_sampler_yields_variable_steps_of_a_budget_manifest(tmp_path: Path) -> None:
    sizes = [int(v) for v in np.random.default_rng(5).lognormal(4.0, 1.0, 30).astype(int) + 10]
    out = make_fixture(tmp_path, sizes, world_size=1, batch_size=3, epochs=1, budget=True)
    loader = Runner.build_dataloader(
        dict(
            dataset=PointCloudDataset(out),
            batch_size=3,
            sampler=dict(type="LidarshardSampler", manifest=str(out)),
            batch_sampler=dict(type="LidarshardBatchSampler"),
        )
    )
    lengths = [len(b) for b in loader.batch_sampler]
    assert sum(lengths) == len(sizes) and len(lengths) == len(loader.batch_sampler)
    assert lengths == [len(b.sample_ids) for b in ManifestReader(out, 0, 1, 0)]


@pytest.mark.parametrize("new_world", [2, 3])
def test_a_lidarshard_sampler_checkpoint_resumes_exactly_on_another_world_size(
    manifest: Path, new_world: int
) -> None:
    """The position of the mmengine sampler (built by ``Runner.build_dataloader`` on 1 rank), taken after 2
    trained steps, restarts on 2 or 3 ranks with ``ElasticBatchSampler``: the epoch is trained exactly once;
    a state of another plan is refused."""
    from collections import Counter

    from lidarshard.loaders.elastic import ElasticBatchSampler, load_epoch_plan

    loader = Runner.build_dataloader(
        dict(
            dataset=PointCloudDataset(manifest, point_dims=4),
            batch_size=BATCH,
            sampler=dict(type="LidarshardSampler", manifest=str(manifest)),
            batch_sampler=dict(type="LidarshardBatchSampler"),
        )
    )
    it = iter(loader.batch_sampler)
    trained = Counter(i for _, b in zip(range(2), it, strict=False) for i in b)
    state = loader.batch_sampler.sampler.state_dict()
    assert (state["step"], state["world_size"], state["batch_size"]) == (2, 1, BATCH)
    for r in range(new_world):
        sampler = ElasticBatchSampler(manifest, r, new_world, batch_size=2)
        sampler.load_state_dict(state)
        trained.update(i for b in sampler for i in b)
    full = load_epoch_plan(manifest, 0).rows
    assert trained == Counter(full[full >= 0].tolist())
    with pytest.raises(ValueError, match="belongs to another plan"):
        loader.batch_sampler.sampler.load_state_dict({**state, "plan_fingerprint": "0" * 16})

"""lidarshard.loaders.mmengine: a real mmengine ``Runner`` trains on a built manifest, epoch- and iter-based, with
resume; the registered sampler's batch-size check and sample_id mapping. Skipped without mmengine."""

from __future__ import annotations

import gc
import importlib.util
import logging
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("mmengine") is None:  # imported by tests.mmengine_parts, when a test needs it
    pytest.skip("mmengine is not installed", allow_module_level=True)
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


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """``StepTimer``'s ``time.perf_counter`` reads ``CLOCK``: step times are exactly 1e-6 s x the batch's points."""
    import lidarshard.loaders.clocks as clocks
    from tests.mmengine_parts import CLOCK

    monkeypatch.setattr(clocks, "time", types.SimpleNamespace(perf_counter=lambda: CLOCK["t"]))


#: The runners a test made whose DataLoaders have worker processes (``_stop_loader_workers``).
_WITH_WORKERS: list = []


@pytest.fixture(autouse=True)
def _stop_loader_workers():
    """Stops the persistent DataLoader workers of the test's runners when it ends. Left to Python's cyclic
    GC (mmengine's runner and its loop refer to each other), torch's shutdown of a worker can run after
    the worker's index queue was finalized: the stop message is never sent and the join waits its 5 s
    timeout per worker, inside whichever later test the collection happens to fall."""
    yield
    while _WITH_WORKERS:
        loader = getattr(_WITH_WORKERS.pop().train_loop, "dataloader", None)  # None: never trained
        iterator = getattr(loader, "_iterator", None)  # the persistent workers' iterator, kept by the loader
        if iterator is not None:
            iterator._shutdown_workers()  # what its __del__ calls, while the queues are still alive
            loader._iterator = None


def _runner(
    out: Path,
    work_dir: Path,
    train_cfg: dict,
    *,
    resume: bool = False,
    batch_sampler: bool = False,
    num_workers: int = 0,
):
    from tests.mmengine_parts import PointCountModel, Runner

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
    runner = Runner(
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
    if num_workers:
        _WITH_WORKERS.append(runner)
    return runner


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
    from tests.mmengine_parts import Runner

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
    from tests.mmengine_parts import DATA_SAMPLERS

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
    from tests.mmengine_parts import Runner

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
    from tests.mmengine_parts import Runner

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
    from tests.mmengine_parts import Runner

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


# ------------------------------------------------------------------------------ step timings (LidarshardTimingHook)


def _timed_runner(out: Path, work_dir: Path, train_cfg: dict, **kw):
    runner = _runner(out, work_dir, train_cfg, **kw)
    runner.register_hook(dict(type="LidarshardTimingHook", device="cpu"), priority="VERY_HIGH")
    return runner


def _recorded(directory: Path) -> list[tuple[int, int, list[str]]]:
    from lidarshard.loaders.step_timer import read_timing_files

    rows = read_timing_files(str(directory)).to_pylist()
    return [(r["epoch"], r["step"], r["sample_ids"]) for r in rows]


def _plan_rows(out: Path, epochs: range) -> list[tuple[int, int, list[str]]]:
    return [(e, b.step, b.sample_ids) for e in epochs for b in ManifestReader(out, 0, 1, e)]


@pytest.mark.slow  # trains two epochs through mmengine's Runner, checkpoints, then calibrates
def test_timing_hook_records_the_planned_steps_beside_the_checkpoints_and_calibrate_fits_them(
    manifest: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_clock: None
) -> None:
    """Epoch-based, 2 epochs: one row per trained step with the plan's epoch, step and sample ids (the ids
    the model trained on), in the checkpoints' folder; ``lidarshard calibrate --timings`` fits those files
    and recovers the model's cost, 1e-3 ms per point."""
    import json

    from lidarshard.pipelines.cli import main as cli_main

    runner = _timed_runner(manifest, tmp_path, dict(by_epoch=True, max_epochs=2))
    runner.train()
    assert _recorded(tmp_path) == _plan_rows(manifest, range(2))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "epoch_2.pth" in names and "timings-rank-00000-part-00000.parquet" in names
    ids = read_samples(manifest, ["sample_id"])["sample_id"].to_pylist()
    assert [[ids[i] for i in b] for b in runner.model.seen] == [r[2] for r in _recorded(tmp_path)]
    fit = tmp_path / "fit.json"
    assert cli_main(["calibrate", str(manifest), "--timings", str(tmp_path), "-o", str(fit)]) == 0
    body = json.loads(fit.read_text())
    assert body["source"]["timed"] == "recorded rank-step"
    assert body["source"]["rows"] == body["source"]["matched"] == 2 * STEPS
    assert [(r["epoch"], r["steps"], r["world_size"]) for r in body["linearity"]] == [
        (0, STEPS, 1),
        (1, STEPS, 1),
    ]
    assert "wrote" in capsys.readouterr().out


def test_timing_hook_counts_iter_based_steps_across_epochs_and_a_resume(
    manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Iter-based: the global iteration runs on into epoch 1; flushed at each checkpoint (every 3 iters);
    the resumed run (mmengine skips 6 batches) records step 2 of epoch 1 into a new part."""
    import mmengine.runner.loops as loops

    monkeypatch.setattr(loops, "time", types.SimpleNamespace(sleep=lambda s: None))
    runner = _timed_runner(manifest, tmp_path, dict(by_epoch=False, max_iters=STEPS + 2), num_workers=2)
    runner.train()
    plan = _plan_rows(manifest, range(2))
    assert _recorded(tmp_path) == plan[: STEPS + 2]
    first = sorted(tmp_path.glob("timings-rank-*.parquet"))
    assert len(first) >= 2  # a checkpoint at iteration 3 flushed before the run ended
    again = _timed_runner(manifest, tmp_path, dict(by_epoch=False, max_iters=STEPS + 3), resume=True)
    again.train()
    assert _recorded(tmp_path) == plan[: STEPS + 3]
    assert len(sorted(tmp_path.glob("timings-rank-*.parquet"))) == len(first) + 1


def test_timing_hook_refuses_a_loader_without_a_plan(tmp_path: Path) -> None:
    from tests.mmengine_parts import PointCountModel, Runner

    runner = Runner(
        model=PointCountModel(),
        work_dir=str(tmp_path),
        train_dataloader=dict(
            dataset=list(range(6)), batch_size=2, sampler=dict(type="DefaultSampler", shuffle=False)
        ),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        custom_hooks=[dict(type="LidarshardTimingHook")],
        log_level=logging.WARNING,
        experiment_name=f"exp_{tmp_path.name}_plain",
    )
    with pytest.raises(TypeError, match="replays no lidarshard manifest .*DefaultSampler"):
        runner.train()


def _ddp_worker(rank: int, rendezvous: str, out: str, work_dir: str) -> None:
    """One rank of a 2-rank gloo job: mmengine wraps the model in MMDistributedDataParallel (CPU)."""
    import os

    import torch.distributed as dist

    from tests.mmengine_parts import PointCountModel, Runner

    torch.set_num_threads(1)
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    runner = Runner(
        model=PointCountModel(),
        work_dir=work_dir,
        train_dataloader=dict(
            dataset=PointCloudDataset(out),
            batch_size=2,
            sampler=dict(type="LidarshardSampler", manifest=out),
            collate_fn=collate,
        ),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        custom_hooks=[dict(type="LidarshardTimingHook", device="cpu")],
        launcher="pytorch",
        cfg=dict(model_wrapper_cfg=dict(type="MMDistributedDataParallel", device_ids=None)),  # CPU
        log_level=logging.WARNING,
        experiment_name="exp_ddp",
    )
    runner.train()
    del runner  # the DDP model's reducer must go before its process group, else gloo can abort at exit
    gc.collect()
    dist.destroy_process_group()


@pytest.mark.slow  # 2 spawned torch processes training through mmengine
def test_timing_hook_under_ddp_ends_compute_at_the_first_gradient_bucket(tmp_path: Path) -> None:
    """2 gloo ranks through a real Runner: every rank-step is timed by the DDP comm hook
    (``method`` "ddp_first_bucket") and holds that rank's planned samples."""
    import torch.multiprocessing as mp

    if not torch.distributed.is_available():
        pytest.skip("torch.distributed unavailable")
    out = make_fixture(tmp_path / "m", [40 + 9 * i for i in range(12)], world_size=2, batch_size=2, epochs=1)
    mp.spawn(_ddp_worker, args=(str(tmp_path / "rdv"), str(out), str(tmp_path / "w")), nprocs=2, join=True)
    from lidarshard.loaders.step_timer import read_timing_files

    rows = read_timing_files(str(tmp_path / "w")).to_pylist()
    planned = {(r, b.step): b.sample_ids for r in range(2) for b in ManifestReader(out, r, 2, 0)}
    assert {(r["rank"], r["step"]): r["sample_ids"] for r in rows} == planned and len(rows) == len(planned)
    assert {(r["method"], r["world_size"], r["epoch"]) for r in rows} == {("ddp_first_bucket", 2, 0)}
    assert all(0 <= r["compute_s"] <= r["wall_s"] for r in rows)

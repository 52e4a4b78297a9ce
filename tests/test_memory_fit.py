"""Memory in bytes from recorded files: the recorder's ``peak_bytes`` -> ``lidarshard calibrate`` fits the
memory model (``tools.memory_fit``) -> ``build --max-step-memory SIZE --memory-model FILE`` plans within it
for every strategy (or refuses in one line) -> ``validate`` re-checks it and catches a tampered manifest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.loaders.step_timer import StepTimer, read_timing_files
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.transforms.plan import STRATEGIES
from tests.helpers import BEAM_TEST_FLAGS, REPO, build_bins_manifest, make_bins, slow_after

BASE, PER_POINT = 2.0e9, 40_000.0  # the "device": 2 GB per step plus 40 kB a point


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build_bins_manifest(tmp_path_factory.mktemp("mem"), 48, world_size=2, batch_size=2)


def _record(out: Path, directory: Path, peaks: bool = True, noise: float = 0.002) -> None:
    """Both ranks' steps of epochs 0-1 through ``StepTimer.record``, peak = BASE + PER_POINT * points."""
    s = pq.read_table(out / schemas.SAMPLES_DIR).to_pydict()
    points = dict(zip(s["sample_id"], s["num_in_range"], strict=True))
    rng = np.random.default_rng(1)
    for rank in range(2):
        with StepTimer(str(directory), rank=rank, world_size=2, device="cpu") as timer:
            for epoch in range(2):
                t = pq.read_table(out / schemas.plan_file(epoch, rank)).to_pydict()
                for step in sorted(set(t["step"])):
                    ids = [i for i, st in zip(t["sample_id"], t["step"], strict=True) if st == step]
                    n = sum(points[i] for i in ids)
                    peak = int((BASE + PER_POINT * n) * (1 + noise * rng.normal())) if peaks else None
                    timer.record(epoch, step, ids, 1e-6 * n, 1e-6 * n + 0.01, peak_bytes=peak)


def _calibrate(out: Path, tmp: Path, peaks: bool = True) -> dict:
    _record(out, tmp / "t", peaks)
    assert cli_main(["calibrate", str(out), "--timings", str(tmp / "t"), "-o", str(tmp / "fit.json")]) == 0
    return json.loads((tmp / "fit.json").read_text())


def test_calibrate_fits_bytes_against_points(built: Path, tmp_path: Path, capsys) -> None:
    body = _calibrate(built, tmp_path)
    m = body["memory_model"]
    assert m["base_bytes"] == pytest.approx(BASE, rel=0.05)
    assert m["bytes_per_point"] + m["bytes_per_voxel"] == pytest.approx(
        PER_POINT, rel=0.1
    )  # voxels == points
    assert m["r2"] > 0.9 and m["n"] > 30 and m["devices"] == ["cpu"]
    assert "memory: peak bytes = " in capsys.readouterr().out


def test_calibrate_says_so_when_no_memory_was_recorded(built: Path, tmp_path: Path, capsys) -> None:
    body = _calibrate(built, tmp_path, peaks=False)
    assert body["memory_model"] is None and "no recorded step has peak_bytes" in body["memory_note"]
    assert "memory: no model" in capsys.readouterr().out
    code = cli_main(["build", str(make_bins(tmp_path / "in", n=24)), str(tmp_path / "o"), "--world-size", "2",
                     "--batch-size", "2", "--max-step-memory", "20GiB", "--memory-model", str(tmp_path / "fit.json"),
                     *BEAM_TEST_FLAGS])  # fmt: skip
    assert code == 2 and "memory_model is null" in capsys.readouterr().err


def _build(tmp: Path, fit: Path, strategy: str, cap: str, *extra: str) -> tuple[int, Path]:
    out = tmp / f"out-{strategy}"
    args = [str(tmp / "in"), str(out), "--world-size", "2", "--batch-size", "2", "--epochs", "2"]
    args += ["--strategy", strategy, "--max-step-memory", cap, "--memory-model", str(fit)]
    args += ["--max-reject-fraction", "0.5", *extra, *BEAM_TEST_FLAGS]
    return cli_main(["build", *args]), out


def _peaks(out: Path) -> list[float]:
    """Every rank-step's predicted peak of every epoch, from the written plan and the manifest's model."""
    m = json.loads((out / "_manifest.json").read_text())["memory_cap"]["model"]
    s = pq.read_table(out / schemas.SAMPLES_DIR).to_pydict()
    per = {i: m["bytes_per_point"] * p + m["bytes_per_voxel"] * v
           for i, p, v in zip(s["sample_id"], s["num_in_range"], s["occupied_voxels"], strict=True)}  # fmt: skip
    plan = pq.read_table(out / "plan").to_pydict()
    sums: dict[tuple, float] = {}
    for e, r, st, i in zip(plan["epoch"], plan["rank"], plan["step"], plan["sample_id"], strict=True):
        sums[(e, r, st)] = sums.get((e, r, st), 0.0) + per[i]
    return [m["base_bytes"] + v for v in sums.values()]


@pytest.mark.parametrize("tight", slow_after(1, [False, True]), ids=["any-batch-fits", "tight"])
@pytest.mark.parametrize("strategy", slow_after(1, sorted(STRATEGIES, key=lambda s: s != "budget")))
def test_every_strategy_plans_within_the_cap_or_refuses(
    built: Path, tmp_path: Path, strategy: str, tight: bool, capsys
) -> None:
    body = _calibrate(built, tmp_path)
    make_bins(tmp_path / "in", n=48)
    fit = tmp_path / "fit.json"
    model = body["memory_model"]
    s = np.sort(pq.read_table(built / schemas.SAMPLES_DIR).column("num_in_range").to_numpy()).astype(float)
    per = model["bytes_per_point"] + model["bytes_per_voxel"]
    # tight: the largest sample alone is over (rejected as over_cap) and many batches of 2 are too;
    # else any batch of the two largest samples fits
    cap = int(model["base_bytes"] + per * (s[-2] * 1.2 if tight else (s[-1] + s[-2]) * 1.01))
    code, out = _build(tmp_path, fit, strategy, f"{cap}B", "--heaviest-first", "memory")
    said = capsys.readouterr()
    err = said.err
    if code != 0:  # a strategy that does not plan for the cap refuses in one line, never publishes
        assert tight and strategy != "budget", err
        assert "--max-step-memory" in err and "use --strategy budget or raise the cap" in err
        assert not (out / "_manifest.json").exists()
        return
    peaks = _peaks(out)
    assert max(peaks) <= cap
    assert "memory cap " in said.out and "per rank-step: predicted peak = " in said.out  # the summary says so
    rejects = pq.read_table(out / schemas.REJECTS_FILE).to_pydict()
    over = [d for r, d in zip(rejects["reason"], rejects["detail"], strict=True) if r == "over_cap"]
    assert bool(over) == tight and all("> --max-step-memory" in d for d in over)
    assert cli_main(["validate", str(out)]) == 0
    # heaviest first by memory: step 0 of each epoch holds its heaviest rank-step
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["caps"]["heaviest_first"] == "memory" and manifest["memory_cap"]["max_step_bytes"] == cap
    # a tampered manifest (a lower cap than the plan honours) is caught by validate through the caps check
    manifest["memory_cap"]["max_step_bytes"] = int(max(peaks)) - 1
    (out / "_manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert cli_main(["validate", str(out)]) != 0
    err = capsys.readouterr().err
    assert "> --max-step-memory" in err, err


def test_the_device_check_stops_on_cpu_saying_so(built: Path, tmp_path: Path, capsys) -> None:
    """``examples/memory_cap.py`` (the GPU check of docs/GUIDE.md) records every rank's epoch 0 here on the host
    clock: no peak, so it stops after the fit with exit 2 and the reason, never a made-up model."""
    pytest.importorskip("torch")
    import importlib.util

    spec = importlib.util.spec_from_file_location("memory_cap", REPO / "examples" / "memory_cap.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--manifest", str(built), "--work", str(tmp_path / "w"), "--width", "8"]) == 2
    assert "recorded on cpu: no recorded step has peak_bytes" in capsys.readouterr().err
    rows = read_timing_files(str(tmp_path / "w" / "timings")).to_pylist()
    assert {r["rank"] for r in rows} == {0, 1} and all(r["peak_bytes"] is None for r in rows)
    assert json.loads((tmp_path / "w" / "fit.json").read_text())["memory_model"] is None


def test_an_elastic_restart_keeps_the_memory_cap(built: Path, tmp_path: Path) -> None:
    """A budget plan under the cap, continued on 3 ranks after 2 steps (``replan_remaining``): the manifest's
    memory cap and model are read back, every re-planned rank-step is under the cap, the heaviest first."""
    from lidarshard.loaders.elastic import replan_remaining
    from lidarshard.transforms.plan.caps import cap_breaches
    from lidarshard.transforms.plan.order import step_peaks

    body = _calibrate(built, tmp_path)
    make_bins(tmp_path / "in", n=48)
    model = body["memory_model"]
    s = np.sort(pq.read_table(built / schemas.SAMPLES_DIR).column("num_in_range").to_numpy()).astype(float)
    cap = int(
        model["base_bytes"] + (model["bytes_per_point"] + model["bytes_per_voxel"]) * (s[-1] + s[-2]) * 1.01
    )
    code, out = _build(tmp_path, tmp_path / "fit.json", "budget", f"{cap}B", "--heaviest-first", "memory")
    assert code == 0
    plan = replan_remaining(out, 0, 2, 3)
    assert plan.limits is not None and plan.limits.caps.memory is not None
    assert plan.limits.caps.memory.max_bytes == cap and plan.limits.memory is not None
    assert plan.rows.shape[1] == 3
    assert cap_breaches(plan.rows, plan.limits.caps, plan.costs, None, plan.limits.memory) == []
    peaks = step_peaks(plan.rows, plan.limits.memory)
    assert peaks[0] == peaks.max()

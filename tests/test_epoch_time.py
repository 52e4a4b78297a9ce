"""An epoch's time before it runs (``transforms.plan.epoch_time``): the build's summary and ``report
--timings`` predict each epoch's seconds from a calibrated ms cost model, and say why not for another."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.schemas.records import CostModel
from lidarshard.transforms.plan.epoch_time import epoch_ms, time_factors, untimed
from tests.helpers import BEAM_TEST_FLAGS, build_bins_manifest, record_plan_timings


def test_a_step_lasts_as_long_as_its_slowest_rank_plus_the_overhead() -> None:
    loads = np.array([[10.0, 20.0], [30.0, 5.0]])
    assert epoch_ms(loads, time_factors(None, 2), 2.5) == 20 + 30 + 2 * 2.5
    factors = time_factors([1.0, 0.5], 2)  # 1/speed scaled to mean 1: (2/3, 4/3)
    assert factors == pytest.approx([2 / 3, 4 / 3])
    assert epoch_ms(loads, factors, 0.0) == pytest.approx(20 * 4 / 3 + 30 * 2 / 3)
    assert epoch_ms(np.zeros((0, 2)), factors, 7.0) == 0.0
    with pytest.raises(ValueError, match=r"need loads \(S, 2\)"):
        epoch_ms(np.ones((3, 4)), factors, 0.0)
    with pytest.raises(ValueError, match="need 2 rank speeds > 0"):
        time_factors([1.0, 0.0], 2)


def test_only_a_calibrated_ms_model_predicts_time() -> None:
    assert untimed(CostModel("linear", 1.0, 0.0, 2.0, units="ms", step_ms=3.0)) is None
    why = untimed(CostModel("voxels", b=1.0))
    assert why is not None and why.startswith("cost model voxels is not in ms") and "@fit.json" in why


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build_bins_manifest(tmp_path_factory.mktemp("epoch_time"), 48, world_size=2, batch_size=2)


def _rank_steps(out: Path, epoch: int, rank: int) -> dict[int, list[str]]:
    t = pq.read_table(out / schemas.plan_file(epoch, rank)).to_pydict()
    steps: dict[int, list[str]] = {}
    for sid, st in zip(t["sample_id"], t["step"], strict=True):
        steps.setdefault(st, []).append(sid)
    return steps


def _record(out: Path, directory: Path, overhead_s: float) -> None:
    """Every epoch's rank-steps: 1 us a point (+3% noise) of compute, ``overhead_s`` more of wall."""
    record_plan_timings(out, directory, 2, (1.0, 1.0), overhead_s)


def _hand_predicted(out: Path, epoch: int, step_ms: float) -> float:
    """sum over steps of the slowest rank's summed sample cost, plus step_ms a step (seconds)."""
    s = pq.read_table(out / schemas.SAMPLES_DIR).to_pydict()
    cost = dict(zip(s["sample_id"], s["cost"], strict=True))
    ranks = [_rank_steps(out, epoch, r) for r in range(2)]
    total = sum(max(sum(cost[i] for i in r[st]) for r in ranks) + step_ms for st in ranks[0])
    return total / 1000.0


def test_build_and_report_predict_each_epoch_from_the_calibrated_model(
    built: Path, tmp_path: Path, capsys
) -> None:
    _record(built, tmp_path / "t", overhead_s=0.005)
    fit = tmp_path / "fit.json"
    assert cli_main(["calibrate", str(built), "--timings", str(tmp_path / "t"), "-o", str(fit)]) == 0
    assert json.loads(fit.read_text())["cost_model"]["step_ms"] == pytest.approx(5.0)
    # the voxels model of the first build predicts no time, and says why
    assert (
        cli_main(
            ["report", str(built), "--timings", str(tmp_path / "t"), "--output-dir", str(tmp_path / "r0")]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "epoch 0: no predicted time: cost model voxels is not in ms" in printed
    re_out = tmp_path / "re"
    flags = ["--world-size", "2", "--batch-size", "2", "--epochs", "2", "--max-reject-fraction", "0.1"]
    samples = str(built / schemas.SAMPLES_DIR)
    assert (
        cli_main(
            [
                "build",
                str(re_out),
                "--from-samples",
                samples,
                "--cost-model",
                f"@{fit}",
                *flags,
                *BEAM_TEST_FLAGS,
            ]
        )
        == 0
    )
    summary = capsys.readouterr().out
    for e in range(2):
        hand = _hand_predicted(re_out, e, 5.0)
        got = re.search(rf"^epoch {e}: predicted ([0-9.e+-]+) s for 12 steps", summary, re.M)
        assert got is not None and float(got.group(1)) == pytest.approx(hand, rel=1e-4)
    # train the calibrated plan: measured beside predicted, the error in %
    _record(re_out, tmp_path / "t2", overhead_s=0.005)
    assert (
        cli_main(
            ["report", str(re_out), "--timings", str(tmp_path / "t2"), "--output-dir", str(tmp_path / "r1")]
        )
        == 0
    )
    printed = capsys.readouterr().out
    for e in range(2):
        got = re.search(
            rf"  epoch {e}: predicted ([0-9.e+-]+) s for 12 steps, measured ([0-9.e+-]+) s \(([-+][0-9.]+)%\)",
            printed,
        )
        assert got is not None, printed
        pred, measured, error = (float(g) for g in got.groups())
        assert pred == pytest.approx(_hand_predicted(re_out, e, 5.0), rel=1e-4)
        assert error == pytest.approx(100 * (pred - measured) / measured, abs=0.2)
        assert abs(error) < 10  # the same 1 us a point that was fitted, +3% noise


def test_a_partly_recorded_epoch_is_predicted_over_the_steps_recorded(built: Path, tmp_path: Path) -> None:
    """Timings of the first 5 steps (a --max-steps run): predicted and measured over those 5 alone."""
    from lidarshard.loaders import load_manifest, read_samples
    from lidarshard.loaders.epoch_plan import read_epoch_plan
    from lidarshard.loaders.step_timer import read_timing_files
    from lidarshard.tools.epoch_seconds import epoch_lines
    from lidarshard.transforms.plan.metrics import rank_costs

    _record(built, tmp_path / "t", overhead_s=0.002)
    rows = read_timing_files(str(tmp_path / "t"))
    rows = rows.filter(pc.less(rows.column("step"), 5))
    m = load_manifest(str(built))
    timed = CostModel("linear", 0.0, 1e-3, 0.0, units="ms", step_ms=2.0)
    m = dataclasses.replace(m, cost_model=timed)
    samples = read_samples(str(built))
    points = samples.column("num_in_range").to_numpy().astype(np.float64)
    ids = samples.column("sample_id")
    loads = [rank_costs(read_epoch_plan(str(built), m, e, ids).plan, 1e-3 * points) for e in range(2)]
    line = epoch_lines(m, loads, rows)[0]
    wall = rows.filter(pc.equal(rows.column("epoch"), 0)).group_by("step").aggregate([("wall_s", "max")])
    measured = float(np.sum(wall.column("wall_s_max").to_numpy()))
    predicted = (loads[0][:5].max(axis=1).sum() + 5 * 2.0) / 1000
    assert f"predicted {loads[0].max(axis=1).sum() / 1000 + 12 * 0.002:.5g} s for 12 steps" in line
    assert f"over the 5 steps recorded predicted {predicted:.5g} s, measured {measured:.5g} s" in line

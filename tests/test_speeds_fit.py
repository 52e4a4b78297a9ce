"""Rank speeds learned from the recorder's files (``tools.speeds_fit``), written by calibrate for
``--rank-speed @fit.json``; the timings that cannot tell the ranks apart say so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from lidarshard import schemas
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.tools.speeds_fit import MIN_STEPS, learn_speeds
from lidarshard.transforms.plan.speeds import parse_rank_speed
from tests.helpers import BEAM_TEST_FLAGS, build_bins_manifest, record_plan_timings


def _obs(speeds: list[float], steps: int, noise: float, seed: int = 0) -> tuple[pa.Table, np.ndarray]:
    """Rank-steps of predicted 20..60 ms whose measured ms is predicted / speed, +``noise`` relative."""
    rng = np.random.default_rng(seed)
    w = len(speeds)
    predicted = rng.uniform(20, 60, size=(steps, w))
    ms = predicted / np.asarray(speeds) * (1 + noise * rng.normal(size=(steps, w)))
    table = pa.table(
        {
            "rank": np.tile(np.arange(w), steps),
            "world_size": np.full(steps * w, w),
            "ms": ms.ravel(),
        }
    )
    return table, predicted.ravel()


def test_a_slower_rank_is_found_within_the_stated_interval() -> None:
    learned = learn_speeds(*_obs([1.0, 0.6], steps=60, noise=0.05))
    assert learned["distinguished"] and learned["world_size"] == 2 and learned["steps"] == [60, 60]
    assert learned["speed"][0] == 1.0
    assert learned["speed_low"][1] <= 0.6 <= learned["speed_high"][1]
    assert learned["speed"][1] == pytest.approx(0.6, abs=0.03)
    assert learned["speed_high"][1] < 1.0 and learned["factor"][1] > 1.0 > learned["factor"][0]
    assert learned == learn_speeds(*_obs([1.0, 0.6], steps=60, noise=0.05))  # a fixed bootstrap seed


def test_four_ranks_two_slow() -> None:
    learned = learn_speeds(*_obs([1.0, 1.0, 0.5, 0.5], steps=40, noise=0.03, seed=1))
    assert learned["distinguished"]
    assert learned["speed"] == pytest.approx([1.0, 1.0, 0.5, 0.5], abs=0.03)


@pytest.mark.parametrize(
    ("speeds", "steps", "noise", "why"),
    [
        ([1.0, 1.0], 60, 0.05, "interval includes the mean"),
        ([1.0, 0.995], 400, 0.001, "less than 2%"),
        ([1.0, 0.5], MIN_STEPS - 1, 0.01, f"fewer than {MIN_STEPS}"),
        ([1.0], 60, 0.01, "one rank"),
    ],
    ids=["equal", "within-2pct", "few-steps", "one-rank"],
)
def test_timings_that_cannot_tell_say_so(speeds: list[float], steps: int, noise: float, why: str) -> None:
    learned = learn_speeds(*_obs(speeds, steps, noise))
    assert not learned["distinguished"]
    assert learned["note"].startswith("cannot tell the ranks' speeds apart") and why in learned["note"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build_bins_manifest(tmp_path_factory.mktemp("speeds"), 48, world_size=2, batch_size=2, epochs=3)


def _record(out: Path, directory: Path, speeds: tuple[float, float]) -> None:
    """Every epoch's rank-steps: 1 us a point / the rank's speed, +3% noise, 4 ms of wall beyond."""
    record_plan_timings(out, directory, 3, speeds, overhead_s=0.004)


def _calibrate(out: Path, timings: Path, fit: Path, capsys) -> tuple[dict, str]:
    assert cli_main(["calibrate", str(out), "--timings", str(timings), "-o", str(fit)]) == 0
    return json.loads(fit.read_text()), capsys.readouterr().out


def test_calibrate_learns_a_slower_rank_and_the_build_plans_for_it(
    built: Path, tmp_path: Path, capsys
) -> None:
    _record(built, tmp_path / "t", (1.0, 0.6))
    body, printed = _calibrate(built, tmp_path / "t", tmp_path / "fit.json", capsys)
    learned = body["rank_speeds"]
    assert learned["distinguished"] and body["rank_speed"] == learned["speed"]
    assert learned["speed_low"][1] <= 0.6 <= learned["speed_high"][1] and learned["speed"][0] == 1.0
    assert "rank 1: speed 0.5" in printed or "rank 1: speed 0.6" in printed
    assert "--rank-speed @FILE" in printed
    assert body["cost_model"]["units"] == "ms" and body["cost_model"]["step_ms"] == pytest.approx(4.0)
    re, fit = tmp_path / "re", f"@{tmp_path / 'fit.json'}"
    flags = ["--world-size", "2", "--batch-size", "2", "--epochs", "3", "--strategy", "budget"]
    flags += ["--max-reject-fraction", "0.1", *BEAM_TEST_FLAGS]
    samples = str(built / schemas.SAMPLES_DIR)
    assert (
        cli_main(
            ["build", str(re), "--from-samples", samples, "--cost-model", fit, "--rank-speed", fit, *flags]
        )
        == 0
    )
    m = json.loads((re / schemas.MANIFEST_FILE).read_text())
    assert m["rank_speed"] == pytest.approx(learned["speed"])
    assert m["cost_model"]["units"] == "ms" and m["cost_model"]["step_ms"] == pytest.approx(4.0)
    # trained on that plan (rank 1 gets less work, so raw times barely grow with the plan's costs): the fit
    # is of the mean rank's times, the speeds are learned again from the raw ones
    _record(re, tmp_path / "t2", (1.0, 0.6))
    again, _ = _calibrate(re, tmp_path / "t2", tmp_path / "fit2.json", capsys)
    model = again["cost_model"]
    assert model["a"] + model["b"] == pytest.approx(1e-3 * np.mean([1, 1 / 0.6]), rel=0.15)  # ms a point
    assert again["rank_speeds"]["speed"][1] == pytest.approx(0.6, abs=0.05)
    assert (
        cli_main(["report", str(re), "--timings", str(tmp_path / "t2"), "--output-dir", str(tmp_path / "r")])
        == 0
    )
    assert "epoch 0: predicted" in capsys.readouterr().out


def test_equal_ranks_write_no_speeds_and_the_build_says_why(built: Path, tmp_path: Path, capsys) -> None:
    _record(built, tmp_path / "t", (1.0, 1.0))
    body, printed = _calibrate(built, tmp_path / "t", tmp_path / "fit.json", capsys)
    assert "rank_speed" not in body and not body["rank_speeds"]["distinguished"]
    assert "cannot tell the ranks' speeds apart" in printed
    with pytest.raises(
        ValueError, match=r"gives no rank speeds: cannot tell the ranks' speeds apart.*; plan without"
    ):
        parse_rank_speed(f"@{tmp_path / 'fit.json'}")


@pytest.mark.hostile("rank speeds")
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"rank_speed": [1.0, 0.5], "rank_speeds": {"world_size": 3}},
            "holds 2 speeds but its timings had 3 ranks",
        ),
        ({"rank_speed": [1.0, 1e7], "rank_speeds": {"world_size": 2}}, "in 1e-06..1e\\+06"),
        ({"rank_speed": [1.0, 0.0], "rank_speeds": {"world_size": 2}}, "finite numbers > 0"),
        ({"rank_speed": None, "rank_speeds": {"note": "x" * 5000}}, "gives no rank speeds: x+; plan without"),
        ({"rank_speed": None, "rank_speeds": {"note": 3}}, "gives no rank speeds: it holds no rank_speed"),
        ({"rank_speed": "1,0.5", "rank_speeds": {}}, "must hold a list of speeds"),
        ({"rank_speed": [True, 1.0], "rank_speeds": {}}, "finite numbers > 0"),
    ],
)
def test_a_hostile_speeds_file_is_refused_in_one_line(tmp_path: Path, body: dict, message: str) -> None:
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(body))
    with pytest.raises(ValueError, match=message) as info:
        parse_rank_speed(f"@{path}")
    assert "\n" not in str(info.value) and len(str(info.value)) < 400

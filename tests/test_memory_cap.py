"""The memory cap's pure core (``transforms.plan.memory`` and ``caps``): sizes parsed strictly, hostile
models refused in one line, every registered strategy planned against hand-made models (within the cap
or refused), over-cap samples named, the manifest record, the flags' checks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from lidarshard.pipelines.options import BuildOptions
from lidarshard.schemas.jsonread import Reader
from lidarshard.schemas.memory_cap import MemoryCapRecord
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.declare import from_keywords
from lidarshard.transforms.plan import STRATEGIES, plan_epoch
from lidarshard.transforms.plan.caps import Caps, PoolLimits, cap_breaches, over_cap
from lidarshard.transforms.plan.memory import MemoryCap, MemoryModel, format_bytes, parse_bytes
from lidarshard.transforms.plan.order import heaviest_first, step_peaks
from lidarshard.transforms.value_checks import UsageError

GIB = 1 << 30


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("20GiB", 20 * GIB),
        ("1.5 TiB", int(1.5 * (1 << 40))),
        ("512MiB", 512 << 20),
        ("4096B", 4096),
        ("3KiB", 3072),
    ],
)
def test_sizes_parse_with_binary_units(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["20", "20GB", "20gib", "-1GiB", "0GiB", "nanGiB", "inf GiB", "GiB", "1e3MiB",
                                  "2000000TiB", ""])  # fmt: skip
def test_a_size_without_a_binary_unit_or_out_of_range_is_one_line(text: str) -> None:
    with pytest.raises(ValueError, match="--max-step-memory") as e:
        parse_bytes(text)
    assert "\n" not in str(e.value)


@pytest.mark.hostile("memory caps")
@pytest.mark.parametrize(
    "coefs", [(-1.0, 1.0, 0.0), (0.0, math.nan, 1.0), (0.0, 1.0, math.inf), (1e9, 0.0, 0.0), (0.0, -2.0, 3.0)]
)
def test_a_hostile_memory_model_is_refused(coefs: tuple[float, float, float]) -> None:
    with pytest.raises(ValueError, match="memory model"):
        MemoryModel(*coefs)


def test_a_cap_below_the_base_leaves_no_room() -> None:
    with pytest.raises(ValueError, match="leaves no room"):
        MemoryCap(GIB, MemoryModel(2.0 * GIB, 1.0, 0.0))
    assert format_bytes(21.5 * GIB) == "21.5 GiB" and format_bytes(12) == "12 B"


def _pool(n: int = 96, seed: int = 0) -> tuple[np.ndarray, np.ndarray, pa.Table]:
    """(costs, points, samples table) of a lognormal pool; voxels = points / 3."""
    rng = np.random.default_rng(seed)
    points = np.exp(rng.normal(9.0, 0.6, n)).astype(np.int64) + 100
    samples = pa.table({"num_points": points, "num_in_range": points, "occupied_voxels": points // 3})
    return points.astype(np.float64), points, samples


MODEL = MemoryModel(base=1.0 * GIB, per_point=30_000.0, per_voxel=60_000.0)


@pytest.mark.parametrize("tight", [False, True])
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_is_within_the_cap_or_refuses(strategy: str, tight: bool) -> None:
    costs, points, samples = _pool()
    memory = MODEL.sample_bytes(samples)
    top = np.sort(memory)
    room = top[-1] * 1.05 if tight else (top[-1] + top[-2]) * 1.01  # tight: most pairs do not fit
    cap = MemoryCap(int(MODEL.base + room), MODEL)
    limits = PoolLimits(Caps(memory=cap), points, memory)
    try:
        plan = plan_epoch(strategy, costs, 4, 2, seed=3, epoch=1, limits=limits)
    except ValueError as e:
        assert tight and strategy != "budget", e  # budget plans within it; a loose cap fits any batch
        assert "> --max-step-memory" in str(e) and "\n" not in str(e)
        return
    assert cap_breaches(plan, limits.caps, costs, points, memory) == []
    peaks = cap.peaks(np.append(memory, 0.0)[plan].sum(axis=-1))
    assert peaks.max() <= cap.max_bytes
    # heaviest first by memory: step 0 holds the epoch's heaviest rank-step by predicted bytes
    first = heaviest_first(plan, memory)
    assert step_peaks(first, memory)[0] == step_peaks(plan, memory).max()


def test_a_breach_names_its_rank_step_in_bytes() -> None:
    memory = np.array([1.0, 2.0, 3.0, 4.0]) * GIB
    plan = np.array([[[0, 1], [2, 3]]])  # 1 step, 2 ranks: 3 GiB and 7 GiB over a 1 GiB base
    caps = Caps(memory=MemoryCap(6 * GIB, MemoryModel(GIB, 1.0, 0.0)))
    (b,) = cap_breaches(plan, caps, np.ones(4), None, memory)
    assert (b.name, b.step, b.rank, b.count) == ("memory", 0, 1, 1)
    assert b.detail() == "predicted peak 8 GiB > --max-step-memory 6 GiB"
    assert over_cap(np.ones(4), None, caps, memory) == [""] * 4  # each sample alone fits under 6 GiB
    details = over_cap(np.ones(4), None, Caps(memory=MemoryCap(4 * GIB, MemoryModel(GIB, 1.0, 0.0))), memory)
    assert details == ["", "", "", "predicted peak 5 GiB > --max-step-memory 4 GiB"]


def test_budget_cannot_plan_a_memory_and_a_points_cap_at_once() -> None:
    costs, points, samples = _pool()
    memory = MODEL.sample_bytes(samples)
    caps = Caps(max_points=10**9, memory=MemoryCap(100 * GIB, MODEL))
    with pytest.raises(ValueError, match="not both"):
        plan_epoch("budget", costs, 4, 2, seed=0, epoch=0, limits=PoolLimits(caps, points, memory))


def test_a_voxel_term_needs_voxels() -> None:
    samples = pa.table({"num_points": [5, 6], "num_in_range": [5, 6], "occupied_voxels": pa.array([1, None])})
    with pytest.raises(ValueError, match="occupied_voxels"):
        MODEL.sample_bytes(samples)
    assert MemoryModel(0.0, 2.0, 0.0).sample_bytes(samples).tolist() == [10.0, 12.0]


def test_the_manifest_record_round_trips_and_refuses_hostile_values() -> None:
    rec = Caps(memory=MemoryCap(20 * GIB, MODEL)).to_record()[1]
    assert rec is not None and Caps.from_record(None, rec).memory == MemoryCap(20 * GIB, MODEL)
    obj = {"memory_cap": rec.to_json()}
    assert MemoryCapRecord.parse(Reader(json.loads(json.dumps(obj)), "m")) == rec
    assert MemoryCapRecord.parse(Reader({}, "m")) is None
    for bad in ({"max_step_bytes": -1, "model": rec.model.to_json()},
                {"max_step_bytes": 5, "model": {"base_bytes": "x", "bytes_per_point": 1, "bytes_per_voxel": 0}},
                {"max_step_bytes": 5, "model": rec.model.to_json(), "extra": 1},
                {"max_step_bytes": 5.5, "model": rec.model.to_json()}):  # fmt: skip
        with pytest.raises(ValueError, match="memory_cap"):
            MemoryCapRecord.parse(Reader({"memory_cap": bad}, "m"))
    nan = {
        "max_step_bytes": 5,
        "model": {"base_bytes": float("nan"), "bytes_per_point": 1, "bytes_per_voxel": 0},
    }
    with pytest.raises(ValueError, match="finite"):
        MemoryCapRecord.parse(Reader({"memory_cap": nan}, "m"))


def _options(tmp_path: Path, **kw) -> PlanConfig:
    return from_keywords(BuildOptions, {"out": tmp_path / "o", "world_size": 2, "batch_size": 2} | kw).plan


def test_the_flags_need_each_other_and_a_usable_model(tmp_path: Path) -> None:
    good = tmp_path / "fit.json"
    model = {"base_bytes": MODEL.base, "bytes_per_point": MODEL.per_point, "bytes_per_voxel": MODEL.per_voxel}
    good.write_text(json.dumps({"memory_model": model | {"r2": 0.99}}))
    cfg = _options(tmp_path, max_step_memory="20GiB", memory_model=str(good), heaviest_first="memory")
    assert cfg.caps.memory == MemoryCap(20 * GIB, MODEL)
    assert cfg.to_json()["memory_cap"]["max_step_bytes"] == 20 * GIB
    with pytest.raises(UsageError, match="needs --memory-model FILE"):
        _options(tmp_path, max_step_memory="20GiB")
    with pytest.raises(UsageError, match="give the cap too"):
        _options(tmp_path, memory_model=str(good))
    with pytest.raises(UsageError, match="leaves no room"):
        _options(tmp_path, max_step_memory="512MiB", memory_model=str(good))
    with pytest.raises(ValueError, match="heaviest-first memory needs"):
        _options(tmp_path, heaviest_first="memory")
    for name, body in (("none.json", {"memory_model": None}), ("nan.json", '{"memory_model": {"base_bytes": NaN}}'),
                       ("neg.json", {"base_bytes": 0, "bytes_per_point": -1, "bytes_per_voxel": 0})):  # fmt: skip
        (tmp_path / name).write_text(body if isinstance(body, str) else json.dumps(body))
        with pytest.raises((UsageError, ValueError)) as e:
            _options(tmp_path, max_step_memory="20GiB", memory_model=str(tmp_path / name))
        assert "\n" not in str(e.value)
    with pytest.raises((UsageError, ValueError), match="no such file"):
        _options(tmp_path, max_step_memory="20GiB", memory_model=str(tmp_path / "missing.json"))
    with pytest.raises((UsageError, ValueError), match="max_step_memory"):
        _options(tmp_path, max_step_memory=-5, memory_model=str(good))

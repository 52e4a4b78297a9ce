"""``--heaviest-first``: each epoch's step 0 holds its heaviest rank-step (by points or cost), for every
strategy, with nothing else changed; the manifest records it, validate re-checks it, the CLI refuses a bad value."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lidarshard
from lidarshard import schemas
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.schemas.manifest import Manifest
from lidarshard.tools.validate import validate
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.planner import bucket_costs, plan_samples
from lidarshard.transforms.io.arrow import parquet_bytes, sha256_hex
from lidarshard.transforms.plan import STRATEGIES
from lidarshard.transforms.plan.caps import Caps
from lidarshard.transforms.plan.memory import MemoryCap, MemoryModel
from lidarshard.transforms.plan.order import HEAVIEST_FIRST, heaviest_first, heaviest_step, step_peaks
from lidarshard.transforms.value_checks import UsageError
from tests.helpers import BEAM_TEST_FLAGS, balance_entry, make_bins, scored_pool

FLAGS = ["--world-size", "4", "--batch-size", "2", "--epochs", "2", "--max-reject-fraction", "0.1"]
COLUMN = {"points": "num_points", "cost": "cost"}


def _steps(plan: np.ndarray) -> list[bytes]:
    """The plan's steps as sorted byte strings: equal lists <=> the same steps, the same rank batches."""
    return sorted(np.ascontiguousarray(step).tobytes() for step in plan)


def test_order_helpers_swap_only_step_zero_and_the_heaviest() -> None:
    values = np.array([1.0, 1.0, 5.0, 0.0, 2.0, 2.0])
    plan = np.array([[[0], [1]], [[2], [3]], [[4], [5]]])  # step peaks 1, 5, 2
    np.testing.assert_array_equal(step_peaks(plan, values), [1.0, 5.0, 2.0])
    assert heaviest_step(plan, values) == 1
    np.testing.assert_array_equal(heaviest_first(plan, values), plan[[1, 0, 2]])
    tied = np.array([[[0], [1]], [[4], [3]], [[5], [3]]])  # peaks 1, 2, 2: the lowest index wins
    assert heaviest_step(tied, values) == 1
    variable = np.array([[[0, -1], [1, -1]], [[4, 5], [3, -1]]])  # -1 slots count 0
    assert heaviest_step(variable, values) == 1
    one = plan[:1]
    assert heaviest_first(one, values) is one  # already first: nothing copied
    assert heaviest_step(np.empty((0, 2, 1), np.int64), values) == 0


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_puts_the_heaviest_rank_step_first(strategy: str) -> None:
    scored = scored_pool(403, seed=7)
    moved = 0
    for epoch in range(3):
        off = plan_samples(scored, epoch, PlanConfig(4, 3, epochs=3, seed=5, strategy=strategy))
        for mode in ("points", "cost"):
            values = scored.column(COLUMN[mode]).to_numpy()
            cfg = PlanConfig(4, 3, epochs=3, seed=5, strategy=strategy, heaviest_first=mode)
            on = plan_samples(scored, epoch, cfg)
            peaks = step_peaks(on.plan, values)
            assert peaks[0] == peaks.max()
            k = heaviest_step(off.plan, values)
            moved += k != 0
            want = off.plan.copy()
            want[[0, k]] = off.plan[[k, 0]]
            np.testing.assert_array_equal(on.plan, want)  # only steps 0 and k trade places
            assert _steps(on.plan) == _steps(off.plan)
            np.testing.assert_array_equal(on.baseline, off.baseline)
            for key in ("linearity", "planned", "dropped", "padded", "steps", "worst_step_linearity"):
                assert on.stats[key] == off.stats[key], key
    assert moved  # the strategy's own order did not already start with the heaviest step


def test_budget_with_caps_stays_within_them() -> None:
    scored = scored_pool(300, seed=3)
    caps = Caps(max_points=2500, max_samples=4)
    off = plan_samples(scored, 0, PlanConfig(4, 2, strategy="budget", caps=caps))
    on = plan_samples(scored, 0, PlanConfig(4, 2, strategy="budget", caps=caps, heaviest_first="points"))
    assert _steps(on.plan) == _steps(off.plan)
    peaks = step_peaks(on.plan, scored.column("num_points").to_numpy())
    assert peaks[0] == peaks.max() <= 2500


def test_points_order_needs_the_points() -> None:
    scored = scored_pool(40, seed=1).drop_columns(["num_points"])
    with pytest.raises(ValueError, match="--heaviest-first points needs the samples' num_points"):
        plan_samples(scored, 0, PlanConfig(2, 2, heaviest_first="points"))
    assert plan_samples(scored, 0, PlanConfig(2, 2, heaviest_first="cost")).plan.shape[1] == 2


def _manifest_of(cfg: PlanConfig) -> Manifest:
    obj = {
        "schema_version": schemas.SCHEMA_VERSION,
        **cfg.to_json(),
        "cost_model": {"name": "given"},
        "buckets": {"edges": [], "weights": [1.0], "counts": [8]},
        "steps_per_epoch": [1],
        "counts": {"scanned": 8, "accepted": 8, "rejected": 0, "planned": [8], "dropped": [0], "padded": [0]},
        "balance": [balance_entry()],
        "inputs_fingerprint": "0" * 64,
        "files": {},
    }
    return Manifest.from_json(json.loads(json.dumps(obj)))


@pytest.mark.parametrize("mode", HEAVIEST_FIRST)
def test_the_setting_round_trips_through_the_manifest(mode: str) -> None:
    memory = MemoryCap(1 << 30, MemoryModel(1e6, 10.0, 0.0)) if mode == "memory" else None  # its model
    cfg = PlanConfig(4, 2, heaviest_first=mode, caps=Caps(max_points=10, memory=memory))
    caps = cfg.to_json()["caps"]
    if mode == "off":  # recorded only when on: manifests without it keep their bytes
        assert caps == Caps(max_points=10).to_record()[0].to_json()
    else:
        assert caps["heaviest_first"] == mode
    back = PlanConfig.from_manifest(_manifest_of(cfg))
    assert (back.heaviest_first, back.caps) == (mode, cfg.caps)


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown --heaviest-first 'largest'"):
        PlanConfig(4, 2, heaviest_first="largest")
    m = _manifest_of(PlanConfig(4, 2, heaviest_first="cost"))
    assert m.caps is not None
    forged = m.to_json() | {"caps": m.caps.to_json() | {"heaviest_first": "largest"}}
    with pytest.raises(ValueError, match="unknown --heaviest-first 'largest'"):
        PlanConfig.from_manifest(Manifest.from_json(forged))
    with pytest.raises(ValueError, match="caps: heaviest_first must be a string"):  # typed at the one read
        Manifest.from_json(m.to_json() | {"caps": m.caps.to_json() | {"heaviest_first": None}})


# ------------------------------------------------------------------------------------------ the CLI


@pytest.fixture(scope="module")
def bins(tmp_path_factory) -> Path:
    return make_bins(tmp_path_factory.mktemp("heaviest") / "in", n=40)


@pytest.fixture(scope="module")
def built(bins: Path) -> Path:
    out = bins.parent / "out"
    assert (
        cli_main(["build", str(bins), str(out), *FLAGS, "--heaviest-first", "points", *BEAM_TEST_FLAGS]) == 0
    )
    return out


def _manifest(out: Path) -> dict:
    return json.loads((out / schemas.MANIFEST_FILE).read_text())


def _epoch_plan(out: Path, epoch: int, world_size: int) -> tuple[np.ndarray, dict[str, int]]:
    """(S, W, B) sample ids of ``epoch`` from the plan files, and the points of every sample id."""
    samples = pq.read_table(out / schemas.SAMPLES_DIR, columns=["sample_id", "num_points"]).to_pydict()
    points = dict(zip(samples["sample_id"], samples["num_points"], strict=True))
    ranks = []
    for r in range(world_size):
        t = pq.read_table(out / schemas.plan_file(epoch, r), columns=["step", "slot", "sample_id"])
        ranks.append(
            np.array(t.sort_by([("step", "ascending"), ("slot", "ascending")])["sample_id"].to_pylist())
        )
    steps = len(ranks[0]) // 2
    return np.stack([r.reshape(steps, 2) for r in ranks], axis=1), points


def _peaks(plan: np.ndarray, points: dict[str, int]) -> np.ndarray:
    return np.vectorize(points.__getitem__)(plan).sum(axis=-1).max(axis=1)


def test_a_cli_build_with_the_flag_records_it_and_validates(built: Path, capsys) -> None:
    m = _manifest(built)
    assert m["caps"]["heaviest_first"] == "points"
    for epoch in range(2):
        plan, points = _epoch_plan(built, epoch, 4)
        peaks = _peaks(plan, points)
        assert plan.shape[0] > 1 and peaks[0] == peaks.max()
    assert cli_main(["validate", str(built)]) == 0
    assert capsys.readouterr().out.startswith("OK ")


@pytest.mark.slow  # a second build; byte-identical rebuilds are checked on every runner in the slow lane too
def test_the_same_build_is_byte_identical(bins: Path, built: Path) -> None:
    again = bins.parent / "again"
    argv = ["build", str(bins), str(again), *FLAGS, "--heaviest-first", "points", *BEAM_TEST_FLAGS]
    assert cli_main(argv) == 0
    files = sorted(p.relative_to(built) for p in built.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for rel in files:
        assert (again / rel).read_bytes() == (built / rel).read_bytes(), rel


def _swap_steps(out: Path, epoch: int, a: int, b: int, world_size: int) -> None:
    """Steps ``a`` and ``b`` of ``epoch`` trade places in every rank's plan file, the files' sizes and
    sha256 recorded again: a consistent plan, only its order changed."""
    m = _manifest(out)
    for r in range(world_size):
        rel = schemas.plan_file(epoch, r)
        t = pq.read_table(out / rel)
        step = t["step"].to_numpy()
        swapped = np.where(step == a, b, np.where(step == b, a, step))
        i = t.schema.get_field_index("step")
        t = t.set_column(i, t.schema.field(i), pa.array(swapped, t.schema.field(i).type))
        t = t.sort_by([("step", "ascending"), ("slot", "ascending")])
        data = parquet_bytes(t.replace_schema_metadata(pq.read_schema(out / rel).metadata))
        (out / rel).write_bytes(data)
        m["files"][rel] = {"bytes": len(data), "sha256": sha256_hex(data)}
    (out / schemas.MANIFEST_FILE).write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")


def test_validate_refuses_a_step_zero_that_is_not_the_heaviest(built: Path, tmp_path: Path) -> None:
    out = Path(shutil.copytree(built, tmp_path / "out"))
    plan, points = _epoch_plan(out, 1, 4)
    peaks = _peaks(plan, points)
    lighter = int(np.flatnonzero(peaks < peaks[0])[0])
    _swap_steps(out, 1, 0, lighter, 4)
    problems, _ = validate(str(out))
    order = [p for p in problems if "step 0 must hold the epoch's heaviest rank-step" in p]
    assert len(order) == 1 and f"epoch 1 step {lighter} rank " in order[0], problems
    assert "records heaviest_first points" in order[0]


def test_validate_refuses_an_unknown_recorded_setting(built: Path, tmp_path: Path) -> None:
    out = Path(shutil.copytree(built, tmp_path / "out"))
    m = _manifest(out)
    m["caps"]["heaviest_first"] = "largest"
    (out / schemas.MANIFEST_FILE).write_text(json.dumps(m))
    problems, _ = validate(str(out))
    assert any("unknown --heaviest-first 'largest'" in p and "not re-derived" in p for p in problems), (
        problems
    )


def _scored(cost: np.ndarray) -> pa.Table:
    """``cost`` as write_manifest scores it: default buckets, weights 1."""
    ids, _ = bucket_costs(cost, PlanConfig(4, 2))
    return pa.table({"cost": cost, "bucket_id": ids, "weight": np.ones(cost.size)})


def test_validate_refuses_a_plan_built_without_it_that_claims_it(tmp_path: Path) -> None:
    costs = [float(1 + (i * 37) % 11) for i in range(50)]
    table = pa.table({"sample_id": [f"s{i:03d}" for i in range(50)], "path": [f"/d/{i}.bin" for i in range(50)],
                      "cost": costs})  # fmt: skip
    cost = np.asarray(costs)
    seed = next(  # a plan whose step 0 is not already the heaviest (it would pass by chance)
        s
        for s in range(3, 100)
        if heaviest_step(plan_samples(_scored(cost), 0, PlanConfig(4, 2, seed=s), baseline=False).plan, cost)
    )
    lidarshard.write_manifest(table, str(tmp_path / "m"), 4, 2, epochs=1, seed=seed)
    m = _manifest(tmp_path / "m")
    m["caps"]["heaviest_first"] = "cost"
    (tmp_path / "m" / schemas.MANIFEST_FILE).write_text(json.dumps(m))
    problems, _ = validate(str(tmp_path / "m"))
    assert any("step 0 must hold the epoch's heaviest rank-step" in p for p in problems), problems


def test_an_unknown_value_is_a_one_line_usage_error(bins: Path, capsys) -> None:
    out = bins.parent / "out_bad"
    capsys.readouterr()
    argv = ["build", str(bins), str(out), *FLAGS, "--heaviest-first", "largest", *BEAM_TEST_FLAGS]
    assert cli_main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "--heaviest-first" in errors[0] and "invalid choice: 'largest'" in errors[0]
    assert not out.exists()


def test_elastic_loaders_read_the_ordered_plan(built: Path) -> None:
    from lidarshard.loaders.elastic import load_epoch_plan

    plan = load_epoch_plan(built, 0)
    points = pq.read_table(built / schemas.SAMPLES_DIR, columns=["num_points"])["num_points"].to_numpy()
    peaks = step_peaks(plan.rows, points)
    assert peaks[0] == peaks.max()
    for world in (2, 3):  # merged ranks, then a re-plan: the rest of the epoch, its heaviest step first
        rest = plan.switch(1, world, 2)
        assert sorted(np.concatenate([rest.consumed, rest.rows[rest.rows >= 0]])) == sorted(plan.rows.ravel())
        peaks = step_peaks(rest.rows, points)
        assert rest.world_size == world and peaks[0] == peaks.max()


def test_the_python_api_takes_it_as_a_keyword(tmp_path: Path) -> None:
    costs = [float(1 + (i * 37) % 11) for i in range(50)]
    table = pa.table({"sample_id": [f"s{i:03d}" for i in range(50)], "path": [f"/d/{i}.bin" for i in range(50)],
                      "cost": costs})  # fmt: skip
    lidarshard.write_manifest(
        table, str(tmp_path / "m"), 4, 2, epochs=2, strategy="budget", heaviest_first="cost"
    )
    assert _manifest(tmp_path / "m")["caps"]["heaviest_first"] == "cost"
    assert validate(str(tmp_path / "m"))[0] == []
    with pytest.raises(UsageError, match="invalid choice: 'largest'"):
        lidarshard.write_manifest(table, str(tmp_path / "x"), 4, 2, heaviest_first="largest")

"""Issue 50 items 2, 12, 13 and 19 and their variants: timings that are not this plan's, given to
``lidarshard calibrate`` (family "rank speeds": the speeds, step overhead and models it learns from them) and
to ``lidarshard report --timings`` (family "epoch-time reports": the idle and epoch seconds it prints), and
recorded peaks no memory model can come from (family "memory caps").

The promise of each refused case: exit 1, one line naming the timings and what to give instead, no file
written (calibrate's ``-o``, report's directory), in bounded time and memory (a recorded world size of
2**31 - 1 is refused before anything is sized by it). Each valid case works. The rule is one
(``tools.timings.check_this_plan``); one test id per (timings, command).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.loaders.step_timer import TIMING_SCHEMA, StepTimer, read_timing_files
from lidarshard.pipelines.cli import main as cli_main
from tests.elastic_fixture import plan_manifest
from tests.helpers import record_plan_timings

COSTS = np.random.default_rng(0).uniform(100, 1000, 64).round()
PLAN = {"world_size": 2, "batch_size": 2, "epochs": 2, "seed": 0, "strategy": "mixed"}
FAMILY = {"calibrate": "rank speeds", "report": "epoch-time reports"}


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """The manifest (``out``) and the recorder's files of its two epochs (``own``), and of other plans' runs."""
    base = tmp_path_factory.mktemp("timed")
    got = {"out": plan_manifest(base / "out", COSTS, **PLAN)}
    record_plan_timings(got["out"], base / "own", 2, (1.0, 1.0))
    got["own"] = base / "own"
    others = {
        "seed": ({"seed": 7}, COSTS),
        "world4": ({"world_size": 4}, COSTS),
        "model": ({}, COSTS[::-1].copy()),  # another cost model: the same samples, costed otherwise
        "strategy": ({"strategy": "random"}, COSTS),
        "bigger": ({}, np.r_[COSTS, COSTS[:16]]),  # another manifest at the same W: 80 samples
    }
    for name, (changes, costs) in others.items():
        out = plan_manifest(base / f"m-{name}", costs, **(PLAN | changes))
        record_plan_timings(out, base / f"t-{name}", 2, (1.0,) * (PLAN | changes)["world_size"])
        got[name] = base / f"t-{name}"
    return got


def _forged(made: dict[str, Path], tmp: Path, edit: Callable[[dict], None]) -> Path:
    """The run's own rows, ``edit``-ed as a column dict, in one recorder file."""
    cols = read_timing_files(str(made["own"])).to_pydict()
    edit(cols)
    tmp.mkdir(exist_ok=True)
    pq.write_table(pa.table(cols, schema=TIMING_SCHEMA), tmp / "timings-rank-00000-part-00000.parquet")
    return tmp


def _set(column: str, value) -> Callable[[dict], None]:
    def edit(cols: dict) -> None:
        cols[column][0] = value

    return edit


def _shift(cols: dict) -> None:
    cols["step"] = [s + 1 for s in cols["step"]]
    keep = [i for i, s in enumerate(cols["step"]) if s < 16]  # still inside the epoch
    for k in cols:
        cols[k] = [cols[k][i] for i in keep]


def _twice(cols: dict) -> None:
    for k in cols:
        cols[k].append(cols[k][0])


def _empty(cols: dict) -> None:
    for k in cols:
        cols[k].clear()


RECORDED: dict[str, Callable[[dict[str, Path], Path], Path]] = {
    "world_size 2**31-1": lambda m, t: _forged(
        m, t, lambda c: c.update(world_size=[2**31 - 1] * len(c["step"]))
    ),
    "world_size 10**6": lambda m, t: _forged(m, t, lambda c: c.update(world_size=[10**6] * len(c["step"]))),
    "world_size 3 claimed": lambda m, t: _forged(m, t, lambda c: c.update(world_size=[3] * len(c["step"]))),
    "one row at world_size 1": lambda m, t: _forged(m, t, _set("world_size", 1)),
    "rank 2 of 2": lambda m, t: _forged(m, t, _set("rank", 2)),
    "rank -1": lambda m, t: _forged(m, t, _set("rank", -1)),
    "negative step": lambda m, t: _forged(m, t, _set("step", -1)),
    "step past the epoch": lambda m, t: _forged(m, t, _set("step", 16)),
    "negative epoch": lambda m, t: _forged(m, t, _set("epoch", -1)),
    "steps shifted by one": lambda m, t: _forged(m, t, _shift),
    "a sample swapped": lambda m, t: _forged(m, t, _set("sample_ids", ["s00063", "s00062"])),
    "a sample missing": lambda m, t: _forged(m, t, lambda c: c["sample_ids"][0].pop()),
    "a rank-step recorded twice in one file": lambda m, t: _forged(m, t, _twice),
    "another seed's run": lambda m, t: m["seed"],
    "a run at world size 4": lambda m, t: m["world4"],
    "another cost model's plan": lambda m, t: m["model"],
    "another strategy's plan": lambda m, t: m["strategy"],
    "another manifest's run at the same W": lambda m, t: m["bigger"],
    "an empty timings file": lambda m, t: _forged(m, t, _empty),
}


def _csv(tmp: Path, header: str, rows: list[str]) -> Path:
    tmp.mkdir(exist_ok=True)
    (tmp / "t.csv").write_text("\n".join([header, *rows]) + "\n")
    return tmp / "t.csv"


def _own_rows(made: dict[str, Path]) -> list[dict]:
    return read_timing_files(str(made["own"])).to_pylist()


def _seed_rows(made: dict[str, Path]) -> list[dict]:
    return read_timing_files(str(made["seed"])).to_pylist()


CSV: dict[str, Callable[[dict[str, Path], Path], Path]] = {
    "csv rank 2 of 2": lambda m, t: _csv(t, "epoch,step,rank,ms", ["0,0,0,3", "0,0,2,3"]),
    "csv negative step": lambda m, t: _csv(t, "epoch,step,rank,ms", ["0,-1,0,3", "0,0,0,3", "0,0,1,4"]),
    "csv step past the epoch": lambda m, t: _csv(t, "epoch,step,rank,ms", ["0,0,0,3", "0,0,1,4", "0,99,0,3"]),
    "csv negative epoch": lambda m, t: _csv(t, "epoch,step,rank,ms", ["-1,0,0,3", "0,0,1,4", "0,1,0,3"]),
    "csv epoch not planned": lambda m, t: _csv(t, "epoch,step,rank,ms", ["0,0,0,3", "0,0,1,4", "2,1,0,3"]),
    "csv rank-step timed twice": lambda m, t: _csv(t, "step,rank,ms", ["0,0,3", "0,1,4", "0,0,5", "1,0,3"]),
    "csv per-sample rows of another seed's plan": lambda m, t: _csv(
        t,
        "sample_id,step,rank,ms",
        [
            f"{i},{r['step']},{r['rank']},1.5"
            for r in _seed_rows(m)
            if r["epoch"] == 0
            for i in r["sample_ids"]
        ],
    ),
}


def _text(tmp: Path, name: str, data: bytes) -> Path:
    tmp.mkdir(exist_ok=True)
    (tmp / name).write_bytes(data)
    return tmp / name


def _zero(cols: dict) -> None:
    cols["compute_s"] = cols["wall_s"] = [0.0] * len(cols["step"])


FILES: dict[str, Callable[[dict[str, Path], Path], Path]] = {
    "a parquet file of junk": lambda m, t: _text(t, "timings-rank-00000-part-00000.parquet", b"junk"),
    "a csv of binary": lambda m, t: _text(t, "t.csv", b"\x00\x01\x02garbage"),
    "a csv of its header only": lambda m, t: _text(t, "t.csv", b"sample_id,ms\n"),
    "a csv of words for ms": lambda m, t: _text(t, "t.csv", b"sample_id,ms\ns00001,abc\n"),
    "a csv of words for steps": lambda m, t: _text(t, "t.csv", b"step,rank,ms\nx,0,3\n"),
    "a csv step past int64": lambda m, t: _text(t, "t.csv", b"step,rank,ms\n99999999999999999999,0,3\n"),
    "no such file": lambda m, t: t / "nothing.csv",
    "an empty directory": lambda m, t: (t.mkdir(), t)[1],
    "a clock that never moved": lambda m, t: _forged(m, t, _zero),
}

VALID: dict[str, Callable[[dict[str, Path], Path], Path]] = {
    "a cycled run's epochs": lambda m, t: _forged(
        m, t, lambda c: c.update(epoch=[e + 2 for e in c["epoch"]])
    ),
    "a csv with a byte-order mark": lambda m, t: _text(
        t,
        "t.csv",
        ("\ufeffsample_id,ms\n" + "".join(f"s{i:05d},{COSTS[i] / 100:.4f}\n" for i in range(40))).encode(),
    ),
    "the run's own files": lambda m, t: m["own"],
    "one rank's files": lambda m, t: next(m["own"].glob("timings-rank-00000-*")),
    "a restarted run's parts": lambda m, t: _restarted(m, t),
    "rows of a plain loop without ids": lambda m, t: _forged(
        m, t, lambda c: c.update(sample_ids=[[] if i % 7 == 0 else v for i, v in enumerate(c["sample_ids"])])
    ),
    "csv of the plan's rank-steps": lambda m, t: _csv(
        t,
        "epoch,step,rank,ms",
        [f"{r['epoch']},{r['step']},{r['rank']},{1e3 * r['compute_s']}" for r in _own_rows(m)],
    ),
    "csv per-sample rows of both epochs, no epoch column": lambda m, t: _csv(
        t,
        "sample_id,step,rank,ms",
        [
            f"{i},{r['step']},{r['rank']},{1e3 * r['compute_s'] / 2}"
            for r in _own_rows(m)
            for i in r["sample_ids"]
        ],
    ),
}


def _restarted(made: dict[str, Path], tmp: Path) -> Path:
    """The run's files, and a second part of rank 0 that times its first steps again (a resumed run)."""
    import shutil

    shutil.copytree(made["own"], tmp)
    again = [r for r in _own_rows(made) if r["rank"] == 0 and r["epoch"] == 0 and r["step"] < 4]
    pq.write_table(
        pa.Table.from_pylist(again, schema=TIMING_SCHEMA), tmp / "timings-rank-00000-part-00009.parquet"
    )
    return tmp


def _run(command: str, out: Path, timings: Path, dest: Path) -> int:
    where = ["-o", str(dest / "fit.json")] if command == "calibrate" else ["--output-dir", str(dest)]
    return cli_main([command, str(out), "--timings", str(timings), *where])


def _cases(table: dict) -> list:
    return [
        pytest.param(c, k, marks=pytest.mark.hostile(FAMILY[c]), id=f"{c}-{k}") for k in table for c in FAMILY
    ]


@pytest.mark.parametrize(("command", "case"), _cases(RECORDED) + _cases(CSV) + _cases(FILES))
def test_timings_of_another_plan_are_refused_in_one_line(
    made: dict[str, Path], tmp_path: Path, capsys, command: str, case: str
) -> None:
    timings = (RECORDED | CSV | FILES)[case](made, tmp_path / "timings")
    dest = tmp_path / "written"
    assert _run(command, made["out"], timings, dest) == (
        2 if case == "no such file" else 1
    )  # 2: a usage error
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"lidarshard {command}: ") and str(timings) in err, err
    assert not dest.exists()


@pytest.mark.parametrize(("command", "case"), _cases(VALID))
def test_this_plans_timings_are_taken(
    made: dict[str, Path], tmp_path: Path, capsys, command: str, case: str
) -> None:
    timings = VALID[case](made, tmp_path / "timings")
    dest = tmp_path / "written"
    assert _run(command, made["out"], timings, dest) == 0, capsys.readouterr().err
    assert (dest / ("fit.json" if command == "calibrate" else "report.html")).is_file()


# ------------------------------------------------------------------------------------ memory caps


def _peaks(made: dict[str, Path], tmp: Path, peak: Callable[[int, np.random.Generator], int]) -> Path:
    """The run's own steps recorded again with ``peak(points of the rank-step, rng)`` as their peak bytes."""
    s = pq.read_table(made["out"] / schemas.SAMPLES_DIR).to_pydict()
    points = dict(zip(s["sample_id"], s["num_in_range"], strict=True))
    rng = np.random.default_rng(3)
    for rank in range(2):
        with StepTimer(str(tmp), rank=rank, world_size=2, device="cpu") as timer:
            for r in _own_rows(made):
                if r["rank"] == rank:
                    n = sum(points[i] for i in r["sample_ids"])
                    timer.record(
                        r["epoch"], r["step"], r["sample_ids"], r["compute_s"], peak_bytes=peak(n, rng)
                    )
    return tmp


PEAKS_REFUSED = {  # a recorder file no device writes: refused naming it
    "peaks near 2**62": lambda n, rng: 2**62 - int(rng.integers(0, 2**20)),
    "peaks at 2**63-1": lambda n, rng: 2**63 - 1,
}
PEAKS_NO_MODEL = {  # real-looking peaks no model explains: calibrate writes no memory model, saying why
    "peaks falling with size": lambda n, rng: int(2**34 - 2**20 * n // 1000),
    "peaks of pure noise": lambda n, rng: int(2**33 + rng.integers(0, 2**32)),
}


@pytest.mark.hostile("memory caps")
@pytest.mark.parametrize("case", sorted(PEAKS_REFUSED))
def test_peaks_no_device_records_are_refused(
    made: dict[str, Path], tmp_path: Path, capsys, case: str
) -> None:
    path = tmp_path / "t"
    try:
        _peaks(made, path, PEAKS_REFUSED[case])
    except ValueError as e:  # the recorder refuses them when given: nothing to calibrate
        assert "peak_bytes" in str(e)
        return
    assert _run("calibrate", made["out"], path, tmp_path / "w") == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "peak_bytes" in err and not (tmp_path / "w").exists()


@pytest.mark.hostile("memory caps")
@pytest.mark.parametrize("case", sorted(PEAKS_NO_MODEL))
def test_peaks_no_model_explains_give_no_memory_model_and_build_says_why(
    made: dict[str, Path], tmp_path: Path, capsys, case: str
) -> None:
    from lidarshard.transforms.plan.memory import load_memory_model

    path = _peaks(made, tmp_path / "t", PEAKS_NO_MODEL[case])
    assert _run("calibrate", made["out"], path, tmp_path / "w") == 0
    body = json.loads((tmp_path / "w" / "fit.json").read_text())
    note = body["memory_note"]
    assert body["memory_model"] is None and "do not grow with points or voxels" in note, note
    assert f"memory: no model ({note})" in capsys.readouterr().out
    with pytest.raises(ValueError) as info:  # --memory-model fit.json repeats the note
        load_memory_model(str(tmp_path / "w" / "fit.json"))
    assert note in str(info.value) and "\n" not in str(info.value)


@pytest.mark.hostile("memory caps")
def test_peaks_that_grow_with_points_give_a_model(made: dict[str, Path], tmp_path: Path) -> None:
    path = _peaks(made, tmp_path / "t", lambda n, rng: int(2**30 + 4096 * n * (1 + 0.01 * rng.normal())))
    assert _run("calibrate", made["out"], path, tmp_path / "w") == 0
    model = json.loads((tmp_path / "w" / "fit.json").read_text())["memory_model"]
    assert model["r2"] > 0.9 and model["base_bytes"] == pytest.approx(2**30, rel=0.05)


@pytest.mark.hostile("rank speeds")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2**31 - 1, 10**6])
def test_learning_speeds_never_sizes_by_a_recorded_world_size(world: int) -> None:
    """The learner itself (the one calibrate calls after its check), given rows that claim a huge world."""
    from lidarshard.tools.speeds_fit import learn_speeds

    obs = pa.table({"rank": [0, 1, 0, 1], "world_size": [world] * 4, "ms": [1.0, 2.0, 1.5, 2.5]})
    got = learn_speeds(obs, np.ones(4))
    assert got["distinguished"] is False and "rank 2 recorded 0 steps" in got["note"] and got["steps"] == []

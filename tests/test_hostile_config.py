"""Issue 50's hostile configuration cases (items 6, 7, 8, 18, 20, 21, 22), each fixed at its one rule:

* **python api** (items 18, 20, 21): a value is taken as Python users pass it (``os.PathLike``, numpy scalars,
  1-d arrays) by every keyword alike, because every keyword is checked by the one declaration its flag is
  generated from (``transforms.declare``): the options equal those of the plain values. Anything else is one
  ``UsageError`` line naming the keyword, before Beam. ``write_manifest``'s rows are cast and checked where
  they enter (``pipelines.samples_input``): a path no manifest can store (a NUL byte, empty) and a count given
  as booleans or text are refused naming the row. ``replan`` without a cost model is refused.
* **sweep fidelity** (item 6): ``sweep_time_lags`` given to ``write_manifest`` are one finite number of
  seconds >= 0 per sweep path, or the row is named.
* **publishing** (items 7, 8): no writer publishes into an empty OUT (the current directory) or inside another
  published manifest or scan (``checks.check_output_parent`` with ``tools.outputs``: the rule of
  ``calibrate -o`` and ``report --output-dir`` too).
* **memory caps** (item 22): ``--heaviest-first memory`` without a memory cap is a usage error (exit 2) before
  Beam, as every rule of ``PlanConfig`` is when the values came from the user.
"""

from __future__ import annotations

import importlib
import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import lidarshard
from lidarshard.pipelines.cli import main
from lidarshard.pipelines.options import BuildOptions
from lidarshard.transforms.declare import from_keywords
from lidarshard.transforms.value_checks import UsageError
from tests.helpers import BEAM_TEST_FLAGS, make_bins
from tests.test_hostile_api import _one_line, no_beam  # noqa: F401  the fixture: refused before Beam

W, B = 2, 2
PLAIN = {"out": "o", "world_size": 2, "batch_size": 2}


def _rows(n: int = 16) -> list[dict]:
    return [
        {
            "sample_id": f"{i:04d}",
            "path": f"/data/{i:04d}.bin",
            "num_points": 100 + i,
            "occupied_voxels": 10 + i % 5,
        }
        for i in range(n)
    ]


# ------------------------------------------------------------------------------ python api: values taken

#: case -> (keywords as Python users pass them, the same keywords as plain values)
TAKEN: dict[str, tuple[dict, dict]] = {
    "out_pathlike": ({"out": Path("o")}, {"out": "o"}),
    "input_pathlike": ({"input": Path("in")}, {"input": "in"}),
    "input_list_of_pathlike": ({"input": [Path("a"), Path("b")]}, {"input": ["a", "b"]}),
    "input_tuple": ({"input": ("a", Path("b"))}, {"input": ["a", "b"]}),
    "from_samples_pathlike": ({"from_samples": Path("p/samples")}, {"from_samples": "p/samples"}),
    "relative_to_pathlike": ({"relative_to": Path("/data")}, {"relative_to": "/data"}),
    "world_size_int64": ({"world_size": np.int64(2)}, {"world_size": 2}),
    "batch_size_int32": ({"batch_size": np.int32(2)}, {"batch_size": 2}),
    "epochs_uint8": ({"epochs": np.uint8(3)}, {"epochs": 3}),
    "seed_uint64": ({"seed": np.uint64(2**63 - 1)}, {"seed": 2**63 - 1}),
    "buckets_int16": ({"buckets": np.int16(4)}, {"buckets": 4}),
    "bucket_weights_array": ({"bucket_weights": np.array([1.0, 2.0])}, {"bucket_weights": (1, 2)}),
    "bucket_weights_float32_items": ({"bucket_weights": [np.float32(1), np.float32(0.5)]}, {"bucket_weights": (1, 0.5)}),
    "rank_speed_array": ({"rank_speed": np.array([1.0, 0.5])}, {"rank_speed": (1, 0.5)}),
    "point_cloud_range_array": (
        {"point_cloud_range": np.array([-1, -1, -1, 1, 1, 1])},
        {"point_cloud_range": (-1, -1, -1, 1, 1, 1)},
    ),
    "voxel_size_float32": ({"voxel_size": np.float32(0.25)}, {"voxel_size": 0.25}),
    "max_plan_factor_float64": ({"max_plan_factor": np.float64(50)}, {"max_plan_factor": 50.0}),
    "max_reject_fraction_float32": ({"max_reject_fraction": np.float32(0.5)}, {"max_reject_fraction": 0.5}),
    "part_rows_int64": ({"part_rows": np.int64(100)}, {"part_rows": 100}),
    "max_points_per_rank_step_int64": ({"max_points_per_rank_step": np.int64(900)}, {"max_points_per_rank_step": 900}),
    "max_cost_per_rank_step_float32": ({"max_cost_per_rank_step": np.float32(2.5)}, {"max_cost_per_rank_step": 2.5}),
    "max_samples_per_rank_step_int8": ({"max_samples_per_rank_step": np.int8(3)}, {"max_samples_per_rank_step": 3}),
    "plan_groups_int64": ({"plan_groups": np.int64(2)}, {"plan_groups": 2}),
    "repeat_factors_float32": ({"repeat_factors": np.float32(0.5)}, {"repeat_factors": 0.5}),
    "sweeps_int64": ({"sweeps": np.int64(2)}, {"sweeps": 2}),
    "sweeps_per_input_int64": ({"sweeps": {"a": np.int64(1)}}, {"sweeps": "a=1"}),
    "dataset_weights_mapping": ({"dataset_weights": {"a": np.float32(2)}}, {"dataset_weights": "a=2"}),
    "pad_numpy_true": ({"pad": np.True_}, {"pad": True}),
    "drop_last_numpy_false": ({"drop_last": np.False_}, {}),
}  # fmt: skip


@pytest.mark.hostile("python api")
@pytest.mark.parametrize("case", sorted(TAKEN))
def test_python_values_give_the_options_of_plain_values(case: str) -> None:
    python, plain = TAKEN[case]
    assert from_keywords(BuildOptions, PLAIN | python) == from_keywords(BuildOptions, PLAIN | plain)


@pytest.mark.hostile("python api")
def test_a_memory_model_given_as_a_path_is_read(tmp_path: Path) -> None:
    fit = tmp_path / "fit.json"
    fit.write_text('{"memory_model": {"base_bytes": 1000.0, "bytes_per_point": 1.0, "bytes_per_voxel": 0.0}}')
    cap = {"max_step_memory": np.int64(1 << 20)}
    opts = from_keywords(BuildOptions, PLAIN | cap | {"memory_model": fit})
    assert opts == from_keywords(BuildOptions, PLAIN | cap | {"memory_model": str(fit)})
    assert opts.plan.caps.memory is not None and opts.plan.caps.memory.max_bytes == 1 << 20


@pytest.mark.hostile("python api")
def test_numpy_and_path_values_build_the_bytes_of_plain_ones(tmp_path: Path) -> None:
    """The control: a whole ``write_manifest`` of numpy numbers, an array and a Path publishes the bytes of one
    with plain values."""
    plain = lidarshard.write_manifest(_rows(), str(tmp_path / "a"), 2, 2, epochs=2, bucket_weights=(1, 2))
    python = lidarshard.write_manifest(
        _rows(),
        tmp_path / "b",
        np.int64(2),
        np.int32(2),
        epochs=np.uint8(2),
        bucket_weights=np.array([1.0, 2.0]),
    )
    assert python["balance"] == plain["balance"]
    for rel in ("plan/epoch-0/rank-0/part-00000.parquet", "plan/epoch-1/rank-1/part-00000.parquet"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


# ----------------------------------------------------------------------------- python api: values refused

#: case -> (keywords, what the one line says: it names the keyword)
REFUSED: dict[str, tuple[dict, str]] = {
    "out_bytes": ({"out": b"o"}, "argument out: b'o' is not a path"),
    "out_int": ({"out": 5}, "argument out: 5 is not a path"),
    "out_none": ({"out": None}, "the following arguments are required: out"),
    "out_nul": ({"out": "o\0ut"}, "argument out: 'o\\x00ut' holds a NUL byte"),
    "input_int": ({"input": 5}, "argument input: 5 is not a path"),
    "input_bytes": ({"input": [b"in"]}, "argument input: b'in' is not a path"),
    "input_nested_list": ({"input": [["a"]]}, "argument input: ['a'] is not a path"),
    "from_samples_empty": ({"from_samples": ""}, "argument --from-samples: '' is not a path"),
    "relative_to_nul": ({"relative_to": "/d\0"}, "argument --relative-to: '/d\\x00' holds a NUL byte"),
    "world_size_numpy_bool": ({"world_size": np.True_}, "argument --world-size: True is not a valid value"),
    "world_size_float64": ({"world_size": np.float64(2)}, "argument --world-size: '2.0' is not an integer"),
    "epochs_zero_int64": ({"epochs": np.int64(0)}, "argument --epochs: 0 is out of range"),
    "seed_negative_int32": ({"seed": np.int32(-1)}, "argument --seed: -1 is out of range"),
    "bucket_weights_2d_array": (
        {"bucket_weights": np.ones((2, 2))},
        "argument --bucket-weights: an array of shape (2, 2) is not a sequence of numbers",
    ),
    "bucket_weights_nan": ({"bucket_weights": np.array([1.0, np.nan])}, "argument --bucket-weights: nan is not finite"),
    "bucket_weights_bool_item": ({"bucket_weights": [1.0, np.True_]}, "argument --bucket-weights: 'True' is not a number"),
    "voxel_size_bool": ({"voxel_size": np.False_}, "argument --voxel-size: False is not a valid value"),
    "voxel_size_inf_float32": ({"voxel_size": np.float32("inf")}, "argument --voxel-size: inf is not finite"),
    "rank_speed_mapping": ({"rank_speed": {"a": 1}}, "argument --rank-speed: rank speeds must be numbers"),
    "max_step_memory_float": ({"max_step_memory": 2.5, "memory_model": "m.json"},
                              "argument --max-step-memory: max_step_memory 2.5: give bytes"),
    "memory_model_bytes": ({"max_step_memory": "1GiB", "memory_model": b"m.json"}, "argument --memory-model: "),
    "plan_groups_numpy_bool": ({"plan_groups": np.True_}, "argument --plan-groups: True is not a valid value"),
    "repeat_factors_out_of_range": ({"repeat_factors": np.float32(2)}, "argument --repeat-factors: expected lidarseg:t=T"),
    "sweeps_float": ({"sweeps": 1.5}, "argument --sweeps: '1.5' is not an integer"),
    "dataset_weights_one_number": ({"dataset_weights": 2.0}, "argument --dataset-weights: 2.0 is not NAME=VALUE pairs"),
    "strategy_int": ({"strategy": 3}, "argument --strategy: 3 is not a valid value"),
    "pad_int": ({"pad": 1}, "--pad is a switch: pass True, got 1"),
    "pad_numpy_int": ({"pad": np.int64(1)}, "--pad is a switch: pass True, got 1"),
}  # fmt: skip


@pytest.mark.hostile("python api")
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_value_python_cannot_mean_is_one_line_naming_the_keyword(case: str) -> None:
    given, says = REFUSED[case]
    with pytest.raises(UsageError) as e:
        from_keywords(BuildOptions, PLAIN | given)
    assert says in _one_line(str(e.value))


#: case -> (how the API is called, what the one line says)
CALLS = {
    "build_runner_int": (lambda t: lidarshard.build(str(t), str(t / "o"), world_size=1, batch_size=1, runner=5),
                         "runner 5 is not a runner's name"),
    "build_pipeline_args_str": (lambda t: lidarshard.build(str(t), str(t / "o"), world_size=1, batch_size=1,
                                                           pipeline_args="--direct_num_workers=2"),
                                "pipeline_args '--direct_num_workers=2': give a list of Beam flags"),
    "build_input_none_without_samples": (lambda t: lidarshard.build(None, str(t / "o"), world_size=1, batch_size=1),
                                         "expected INPUT OUT"),
    "write_manifest_rejects_int": (lambda t: lidarshard.write_manifest(_rows(), str(t / "o"), 2, 2, rejects=5),
                                   "rejects: not the rejects schema"),
    "write_manifest_world_size_bytes": (lambda t: lidarshard.write_manifest(_rows(), str(t / "o"), b"2", 2),
                                        'argument --world-size: "b\'2\'" is not an integer'),
    "write_manifest_samples_ndarray": (lambda t: lidarshard.write_manifest(np.zeros(3), str(t / "o"), 2, 2),
                                       "samples must be a pyarrow Table, a pandas DataFrame or a list of dicts"),
    "write_manifest_cost_model_int": (lambda t: lidarshard.write_manifest(_rows(), str(t / "o"), 2, 2, cost_model=3),
                                      "argument --cost-model: 3 is not a valid value"),
}  # fmt: skip


@pytest.mark.hostile("python api")
@pytest.mark.parametrize("case", sorted(CALLS))
@pytest.mark.usefixtures("no_beam")
def test_an_argument_of_another_type_is_one_line_before_beam(tmp_path: Path, capfd, case: str) -> None:
    call, says = CALLS[case]
    with pytest.raises(UsageError) as e:
        call(tmp_path)
    assert says in _one_line(str(e.value))
    assert capfd.readouterr().err == "" and not (tmp_path / "o").exists()


# ---------------------------------------------------------------- write_manifest's rows: python api, sweeps


def _set(i: int, **values):
    def edit(rows: list[dict]) -> list[dict]:
        rows[i].update(values)
        return rows

    return edit


def _sweeps(i: int, paths: list[str], lags: list[float] | None):
    """Rows where row ``i`` has sweeps ``paths`` with ``lags`` (every other row: none)."""

    def edit(rows: list[dict]) -> list[dict]:
        for k, row in enumerate(rows):
            row["sweep_paths"] = paths if k == i else []
            row["sweep_time_lags"] = lags if k == i else []
        return rows

    return edit


#: case -> (family, edit of the rows, what the one line says)
ROWS = {
    "path_nul": ("python api", _set(3, path="/data/a\0b.bin"), "row 3 (sample_id '0003'): path '/data/a\\x00b.bin' holds a NUL byte"),
    "path_empty": ("python api", _set(4, path=""), "row 4 (sample_id '0004'): path '' is not a path"),
    "sweep_path_nul": ("python api", _sweeps(2, ["/d/s\0.bin"], [0.05]), "sweep_paths '/d/s\\x00.bin' holds a NUL byte"),
    "label_path_nul": ("python api", _set(1, label_path="/l\0.label"), "label_path '/l\\x00.label' holds a NUL byte"),
    "num_points_bool": ("python api", lambda rows: [r | {"num_points": True} for r in rows],
                        "column num_points holds bool values, not int64"),
    "occupied_voxels_text": ("python api", lambda rows: [r | {"occupied_voxels": "10"} for r in rows],
                             "column occupied_voxels holds string values, not int64"),
    "file_bytes_bool": ("python api", lambda rows: [r | {"file_bytes": False} for r in rows],
                        "column file_bytes holds bool values, not int64"),
    "cost_text": ("python api", lambda rows: [{"sample_id": r["sample_id"], "path": r["path"], "cost": "1.5"} for r in rows],
                  "column cost holds string values, not double"),
    "lag_nan": ("sweep fidelity", _sweeps(5, ["/d/s.bin"], [math.nan]), "row 5 (sample_id '0005') has sweep_time_lags [nan]"),
    "lag_negative": ("sweep fidelity", _sweeps(6, ["/d/s.bin", "/d/t.bin"], [0.05, -0.1]), "row 6 (sample_id '0006') has sweep_time_lags [0.05, -0.1]"),
    "lag_inf": ("sweep fidelity", _sweeps(7, ["/d/s.bin"], [math.inf]), "row 7 (sample_id '0007') has sweep_time_lags [inf]"),
    "lags_more_than_sweeps": ("sweep fidelity", _sweeps(8, ["/d/s.bin"], [0.05, 0.1]), "row 8 (sample_id '0008') has sweep_time_lags [0.05, 0.1]"),
    "lags_without_sweeps": ("sweep fidelity", _sweeps(9, [], [0.05]), "row 9 (sample_id '0009') has sweep_time_lags [0.05]"),
}  # fmt: skip


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.hostile(ROWS[c][0])) for c in sorted(ROWS)]
)
@pytest.mark.usefixtures("no_beam")
def test_a_row_no_manifest_can_hold_is_named_before_beam(tmp_path: Path, capfd, case: str) -> None:
    _, edit, says = ROWS[case]
    with pytest.raises(UsageError) as e:
        rows = edit(_rows())
        lidarshard.write_manifest(
            rows, str(tmp_path / "o"), W, B, cost_model=None if "cost" in rows[0] else "voxels"
        )
    assert says in _one_line(str(e.value))
    assert capfd.readouterr().err == "" and not (tmp_path / "o").exists()


@pytest.mark.hostile("sweep fidelity")
def test_rows_with_good_sweep_lags_are_planned(tmp_path: Path) -> None:
    """The control: a lag of 0 s and lags aligned with their sweeps publish, and are served as given."""
    rows = _sweeps(2, ["/d/s.bin", "/d/t.bin"], [0.0, 0.05])(_rows())
    assert lidarshard.write_manifest(rows, str(tmp_path / "o"), W, B)["counts"]["accepted"] == 16
    lags = pa.Table.from_batches(lidarshard.read_samples(str(tmp_path / "o")).to_batches())
    assert lags.column("sweep_time_lags").to_pylist()[2] == [0.0, 0.05]


@pytest.mark.hostile("python api")
def test_replan_without_a_cost_model_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    lidarshard.write_manifest(_rows(32), str(out), W, B, epochs=3, cost_model="voxels")
    with pytest.raises(UsageError) as e:
        lidarshard.replan(out, tmp_path / "new", 1, None)
    assert "replan: cost_model plans the epochs from from_epoch on: give one" in _one_line(str(e.value))
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------------------------------- publishing


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    """A manifest of 32 rows, 3 epochs: what a writer must not publish into."""
    out = tmp_path_factory.mktemp("published") / "out"
    lidarshard.write_manifest(_rows(32), str(out), W, B, epochs=3, cost_model="voxels")
    return out


def _inside(published: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(published, tmp_path / "prev"))


#: case -> (run: (published manifest, a folder of bins, tmp) -> exit status or a raised UsageError, OUT it aimed at)
PUBLISH = {
    "build_cli_empty_out": lambda m, bins, t: (main(["build", str(bins), "", "--world-size", "1", "--batch-size", "1", *BEAM_TEST_FLAGS]), None),
    "scan_cli_empty_out": lambda m, bins, t: (main(["scan", str(bins), "", *BEAM_TEST_FLAGS]), None),
    "synth_cli_empty_out": lambda m, bins, t: (main(["synth", "", *BEAM_TEST_FLAGS]), None),
    "write_manifest_empty_out": lambda m, bins, t: (lidarshard.write_manifest(_rows(), "", W, B), None),
    "build_api_empty_out": lambda m, bins, t: (lidarshard.build(str(bins), "", world_size=1, batch_size=1), None),
    "replan_empty_new_out": lambda m, bins, t: (lidarshard.replan(m, "", 1, "points"), None),
    "replan_into_its_own_out": lambda m, bins, t: (lidarshard.replan(m, m / "new", 1, "points"), m / "new"),
    "replan_into_another_manifest": lambda m, bins, t: (lidarshard.replan(m, _inside(m, t) / "x" / "new", 1, "points"), t / "prev" / "x"),
    "build_cli_into_a_manifest": lambda m, bins, t: (main(["build", str(bins), str(m / "plan" / "o"), "--world-size", "1", "--batch-size", "1", *BEAM_TEST_FLAGS]), m / "plan" / "o"),
    "build_api_into_a_manifest": lambda m, bins, t: (lidarshard.build(str(bins), m / "o", world_size=1, batch_size=1), m / "o"),
    "scan_cli_into_a_manifest": lambda m, bins, t: (main(["scan", str(bins), str(m / "samples" / "s"), *BEAM_TEST_FLAGS]), m / "samples" / "s"),
    "write_manifest_into_a_manifest": lambda m, bins, t: (lidarshard.write_manifest(_rows(), m / "t", W, B), m / "t"),
    "synth_cli_into_a_manifest": lambda m, bins, t: (main(["synth", str(m / "data"), *BEAM_TEST_FLAGS]), m / "data"),
}  # fmt: skip


@pytest.mark.hostile("publishing")
@pytest.mark.parametrize("case", sorted(PUBLISH))
def test_no_writer_publishes_into_the_cwd_or_another_manifest(
    published: Path, tmp_path: Path, monkeypatch, capsys, case: str
) -> None:
    bins = make_bins(tmp_path / "bins", n=4)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    before = sorted(p.relative_to(published) for p in published.rglob("*"))
    try:
        rc, aimed = PUBLISH[case](published, bins, tmp_path)
    except UsageError as e:
        rc, aimed, err = 2, None, _one_line(str(e))
    else:
        err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line][-1]
    assert rc == 2, err
    assert "'' is not a path" in err or "is inside the published manifest" in err, err
    assert sorted(p.relative_to(published) for p in published.rglob("*")) == before
    assert list(work.iterdir()) == [] and (aimed is None or not aimed.exists())


@pytest.mark.hostile("memory caps")
@pytest.mark.usefixtures("no_beam")
def test_heaviest_first_memory_without_a_memory_cap_is_a_usage_error(tmp_path: Path, capsys) -> None:
    bins = make_bins(tmp_path / "bins", n=4)
    argv = ["build", str(bins), str(tmp_path / "o"), "--world-size", "1", "--batch-size", "1"]
    assert main([*argv, "--heaviest-first", "memory", *BEAM_TEST_FLAGS]) == 2
    (line,) = [e for e in capsys.readouterr().err.splitlines() if "error:" in e]
    assert "--heaviest-first memory needs the memory model of --max-step-memory" in line
    with pytest.raises(UsageError, match="heaviest-first memory needs"):
        lidarshard.build(str(bins), str(tmp_path / "o"), world_size=1, batch_size=1, heaviest_first="memory")
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------- files and cli: the tools' flags


#: case -> (argv after ``lidarshard``, what the one error line says): the tools' flags are generated from
#: their options dataclasses by the parser of every command (strict, one line, exit 2, before any work)
TOOL_FLAGS = {
    "validate_typo": (["validate", "{out}", "--dat"], "unknown flag --dat; did you mean --data?"),
    "validate_empty_out": (["validate", ""], "argument OUT: '' is not a path"),
    "validate_root_without_data": (["validate", "{out}", "--root", "/x"], "--root needs --data"),
    "validate_workers_zero": (["validate", "{out}", "--data", "--workers", "0"], "--workers: 0 is out of range"),
    "report_negative_epoch": (["report", "{out}", "--epoch", "-1"], "argument --epoch: -1 is out of range"),
    "report_empty_output_dir": (["report", "{out}", "--output-dir", ""], "argument --output-dir: '' is not a path"),
    "report_abbreviated_flag": (["report", "{out}", "--time", "t.csv"], "unknown flag --time; did you mean --timings?"),
    "calibrate_no_timings": (["calibrate", "{out}"], "the following arguments are required: --timings"),
    "calibrate_empty_output": (["calibrate", "{out}", "--timings", "t.csv", "-o", ""], "argument -o/--output: '' is not a path"),
    "calibrate_epoch_text": (["calibrate", "{out}", "--timings", "t.csv", "--epoch", "one"], "--epoch: 'one' is not an integer"),
}  # fmt: skip


@pytest.mark.hostile("files and cli")
@pytest.mark.parametrize("case", sorted(TOOL_FLAGS))
def test_the_tools_flags_are_strict_and_one_line(published: Path, capsys, case: str) -> None:
    argv, says = TOOL_FLAGS[case]
    before = sorted(p.relative_to(published) for p in published.rglob("*"))
    assert main([a.format(out=published) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"lidarshard {argv[0]}: error: ") and says in err[-1], err
    assert sorted(p.relative_to(published) for p in published.rglob("*")) == before


@pytest.mark.hostile("files and cli")
def test_the_tools_take_debug_and_their_help_shows_every_default(published: Path, capsys) -> None:
    """The control: ``--debug`` is every command's flag; ``--help`` is generated from the options."""
    assert main(["validate", str(published), "--debug"]) == 0
    for tool in ("validate", "report", "calibrate"):
        with pytest.raises(SystemExit) as e:
            importlib.import_module(f"lidarshard.tools.{tool}").parser().parse(["--help"])
        assert e.value.code == 0 and "(default: " in capsys.readouterr().out

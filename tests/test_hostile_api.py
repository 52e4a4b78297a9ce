"""Issue 36's hostile Python API calls and multi-dataset INPUTs, generated here.

The promise of each case: one line (a ``UsageError`` before Beam starts, or the run's innermost error),
nothing of Beam's on stderr, nothing published. Families (``ROWS``, ``RUNS``, ``INPUTS`` count the cases):
rows of ``lidarshard.write_manifest`` (named by row index and sample_id), runs of the API that fail inside
Beam (a tampered manifest given to ``lidarshard.replan``, an INPUT that vanishes after the check), and
several INPUTs of one build, through ``lidarshard.pipelines.cli.main`` and ``lidarshard.build``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import lidarshard
from lidarshard.pipelines import build as build_cmd
from lidarshard.pipelines.api import BEAM_LOGGER
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.transforms.formats.discover import walk_local
from lidarshard.transforms.value_checks import UsageError
from tests.helpers import BEAM_TEST_FLAGS, make_bins, slow_after

pytestmark = pytest.mark.hostile("python api")

W, B = 2, 2


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


def _set(i: int, **values) -> Callable[[list[dict]], list[dict]]:
    def edit(rows: list[dict]) -> list[dict]:
        rows[i].update(values)
        return rows

    return edit


def _costs(edit: Callable[[list[dict]], list[dict]]) -> Callable[[list[dict]], list[dict]]:
    """Rows with a given cost column (1.0 each), then ``edit``."""
    return lambda rows: edit([{"sample_id": r["sample_id"], "path": r["path"], "cost": 1.0} for r in rows])


def _drop(column: str) -> Callable[[list[dict]], list[dict]]:
    return lambda rows: [{k: v for k, v in r.items() if k != column} for r in rows]


#: case -> (edit of the rows, cost_model, what the one line says)
ROWS: dict[str, tuple[Callable[[list[dict]], list[dict]], str | None, str]] = {
    "nan_cost": (_costs(_set(3, cost=math.nan)), None, "row 3 (sample_id '0003'): cost nan"),
    "inf_cost": (_costs(_set(4, cost=math.inf)), None, "row 4 (sample_id '0004'): cost inf"),
    "neg_inf_cost": (_costs(_set(4, cost=-math.inf)), None, "row 4 (sample_id '0004'): cost -inf"),
    "negative_cost": (_costs(_set(5, cost=-1.0)), None, "row 5 (sample_id '0005'): cost -1.0"),
    "missing_cost": (_costs(_set(6, cost=None)), None, "row 6 (sample_id '0006') has no cost (null)"),
    "text_cost": (_costs(_set(6, cost="1")), None, "key 'cost' holds values of mixed types"),
    "empty_list": (lambda rows: [], "voxels", "no rows"),
    "empty_table": (lambda rows: [], None, "no rows"),
    "no_points": (_drop("num_points"), "points", "reads num_points, but row 0 (sample_id '0000') has none"),
    "no_voxels": (_drop("occupied_voxels"), "voxels", "reads occupied_voxels, but row 0"),
    "a_null_size": (
        _set(7, occupied_voxels=None),
        "voxels",
        "reads occupied_voxels, but row 7 (sample_id '0007')",
    ),
    "negative_points": (_set(2, num_points=-5), "points", "row 2 (sample_id '0002') has num_points -5"),
    "negative_voxels": (
        _set(9, occupied_voxels=-1),
        "voxels",
        "row 9 (sample_id '0009') has occupied_voxels -1",
    ),
    "huge_model": (lambda rows: rows, "linear:0,1e300,0", "cost model needs 0 <= c0, a, b <= 1e+12"),
    "null_path": (_set(5, path=None), "voxels", "row 5 (sample_id '0005') has no path (null)"),
    "null_sample_id": (_set(8, sample_id=None), "voxels", "row 8 has no sample_id (null)"),
}


@pytest.fixture
def no_beam(monkeypatch) -> None:
    """The case must be refused before the build launches Beam."""

    def launched(*args, **kwargs):
        raise AssertionError("Beam started")

    monkeypatch.setattr(build_cmd, "launch_build", launched)


def _one_line(text: str) -> str:
    assert text and "\n" not in text and "Traceback" not in text and "[while running" not in text, text
    return text


@pytest.mark.parametrize("case", sorted(ROWS))
def test_bad_rows_are_one_line_naming_the_row_before_beam(tmp_path: Path, capfd, no_beam, case) -> None:
    edit, model, says = ROWS[case]

    rows = edit(_rows())
    samples = rows
    if case == "empty_table":
        import pyarrow as pa

        samples = pa.table({"sample_id": pa.array([], pa.string()), "path": pa.array([], pa.string())})
    with pytest.raises(UsageError) as e:
        lidarshard.write_manifest(samples, str(tmp_path / "out"), W, B, cost_model=model)
    assert says in _one_line(str(e.value))
    assert capfd.readouterr().err == "" and not (tmp_path / "out").exists()


def test_the_rows_above_unspoiled_are_planned(tmp_path: Path) -> None:
    """The control: the rows each case spoils make a manifest, with given costs and with a model."""
    assert lidarshard.write_manifest(_rows(), str(tmp_path / "a"), W, B, cost_model="voxels")["epochs"] == 1
    given = _costs(lambda rows: rows)(_rows())
    assert lidarshard.write_manifest(given, str(tmp_path / "b"), W, B)["counts"]["accepted"] == 16


# ------------------------------------------------------------------- runs that fail inside Beam


@pytest.fixture(scope="module")
def replanned(tmp_path_factory) -> Path:
    """A re-plan (from epoch 1 of 3) of a manifest of ``_rows(32)``."""
    root = tmp_path_factory.mktemp("hostile_api")
    out = root / "out"
    lidarshard.write_manifest(_rows(32), str(out), W, B, epochs=3, cost_model="voxels")
    lidarshard.replan(str(out), str(root / "new"), 1, "points", pipeline_args=BEAM_TEST_FLAGS)
    return root / "new"


def _history_b(m: dict) -> None:
    m["cost_history"][0]["cost_model"]["b"] = 2.0


def _history_until(m: dict) -> None:
    m["cost_history"][0]["until_epoch"] = 2


def _history_nan(m: dict) -> None:
    m["cost_history"][0]["cost_model"]["b"] = math.nan


def _seed(m: dict) -> None:
    m["seed"] = 7


def _edges(m: dict) -> None:
    m["cost_history"][0]["bucket_edges"] = [0.5] * len(m["cost_history"][0]["bucket_edges"])


#: tampering of the manifest given to ``lidarshard.replan`` -> (runner flags, what the one line says)
RUNS: dict[str, tuple[Callable[[dict], None], list[str], str]] = {
    "history_model": (_history_b, BEAM_TEST_FLAGS, "the epochs before --replan-from cannot be kept"),
    "history_model_on_worker_processes": (_history_b, [], "the epochs before --replan-from cannot be kept"),
    "history_until": (_history_until, BEAM_TEST_FLAGS, "the epochs before --replan-from cannot be kept"),
    "history_edges": (_edges, BEAM_TEST_FLAGS, "cost_history must be"),
    "history_nan": (_history_nan, BEAM_TEST_FLAGS, "cost_history must be"),
    "seed": (_seed, BEAM_TEST_FLAGS, "the epochs before --replan-from cannot be kept"),
}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.slow) if c.endswith("worker_processes") else c for c in sorted(RUNS)],
)  # the default runner's worker processes: the slow lane
def test_a_tampered_manifest_given_to_replan_is_one_line_and_nothing_on_stderr(
    replanned: Path, tmp_path: Path, capfd, case
) -> None:
    tamper, flags, says = RUNS[case]
    bad = tmp_path / "bad"
    shutil.copytree(replanned, bad)
    m = json.loads((bad / "_manifest.json").read_text())
    tamper(m)
    (bad / "_manifest.json").write_text(json.dumps(m))
    capfd.readouterr()
    with pytest.raises(Exception) as e:
        lidarshard.replan(str(bad), str(tmp_path / "x"), 2, "linear:0,1,0", pipeline_args=flags)
    assert says in _one_line(str(e.value))
    assert capfd.readouterr().err == "" and not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "flags",
    [BEAM_TEST_FLAGS, pytest.param([], marks=pytest.mark.slow)],
    ids=["in_process", "worker_processes"],
)
def test_what_beam_said_is_kept_at_debug_on_lidarshard_beam(
    replanned: Path, tmp_path: Path, caplog, flags
) -> None:
    """Nothing of Beam's reaches stderr, and nothing is thrown away: its records, the worker processes'
    stderr and the original error are on the ``lidarshard.beam`` logger at DEBUG."""
    bad = tmp_path / "bad"
    shutil.copytree(replanned, bad)
    m = json.loads((bad / "_manifest.json").read_text())
    _history_b(m)
    (bad / "_manifest.json").write_text(json.dumps(m))
    with (
        caplog.at_level(logging.DEBUG, logger=BEAM_LOGGER),
        pytest.raises((ValueError, RuntimeError), match="cannot be kept"),
    ):
        lidarshard.replan(str(bad), str(tmp_path / "x"), 2, "linear:0,1,0", pipeline_args=flags)
    kept = [r for r in caplog.records if r.name == BEAM_LOGGER]
    assert kept and all(r.levelno == logging.DEBUG for r in kept)
    assert any(r.exc_info and "cannot be kept" in str(r.exc_info[1]) for r in kept)


def test_replan_takes_an_untampered_copy(replanned: Path, tmp_path: Path) -> None:
    """The control: the copy each case above tampers with re-plans."""
    shutil.copytree(replanned, tmp_path / "copy")
    flags = BEAM_TEST_FLAGS  # in process; test_build runs a whole build on worker processes
    summary = lidarshard.replan(
        str(tmp_path / "copy"), str(tmp_path / "x"), 2, "linear:0,1,0", pipeline_args=flags
    )
    assert summary["epochs"] == 3


# ------------------------------------------------------------------------ several INPUTs of one build


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    make_bins(root / "a", n=8)
    make_bins(root / "b", n=8, seed=1)
    os.symlink(root / "a", root / "alink")
    return root


#: case -> (INPUT arguments, further flags, what the usage error says)
INPUTS: dict[str, tuple[list[str], list[str], str]] = {
    "duplicate_names": (["x=a", "x=b"], [], "two INPUTs are named 'x'"),
    "a_name_with_a_slash": (["x/y=a", "b"], [], "x/y=a does not exist"),
    "a_name_with_an_equals_sign": (["x=y=a", "b"], [], "y=a does not exist"),
    "an_empty_name": (["=a", "b"], [], "=a does not exist"),
    "weights_for_an_unknown_name": (
        ["x=a", "y=b"],
        ["--dataset-weights", "x=1,z=2"],
        "no INPUT is named 'z'",
    ),
    "the_same_directory_through_a_symlink": (["x=a", "y=alink"], [], "would be scanned twice"),
    "a_pattern_through_a_symlink": (["x=a", "y=alink/*.bin"], [], "would be scanned twice"),
    "the_same_directory_with_a_slash": (["x=a", "y=a/"], [], "would be scanned twice"),
}
PLAN = ["--world-size", "1", "--batch-size", "1", "--max-reject-fraction", "0.5", *BEAM_TEST_FLAGS]


@pytest.mark.parametrize("case", sorted(INPUTS))
def test_bad_inputs_are_one_usage_line_before_beam(inputs: Path, capfd, monkeypatch, no_beam, case) -> None:
    given, flags, says = INPUTS[case]

    monkeypatch.chdir(inputs)
    assert cli_main(["build", *given, "out", *flags, *PLAN]) == 2
    err = capfd.readouterr().err.splitlines()
    assert err[-1].startswith("lidarshard build: error: ") and says in err[-1], err
    with pytest.raises(UsageError, match=says.replace("*", r"\*")) as e:
        weights = {"dataset_weights": flags[1]} if flags else {}
        lidarshard.build(given, "out", world_size=1, batch_size=1, pipeline_args=BEAM_TEST_FLAGS, **weights)
    _one_line(str(e.value))
    assert capfd.readouterr().err == "" and not (inputs / "out").exists()


@pytest.mark.parametrize("second", slow_after(1, ["y=v2", "y=v2/*.bin"]))
def test_an_input_that_vanishes_after_the_check_fails_the_run_in_one_line(
    tmp_path: Path, capfd, monkeypatch, second: str
) -> None:
    make_bins(tmp_path / "v1", n=8)
    launch = build_cmd.launch_build

    def vanish_then_launch(*args, **kwargs):
        shutil.rmtree(tmp_path / "v2")
        return launch(*args, **kwargs)

    monkeypatch.setattr(build_cmd, "launch_build", vanish_then_launch)
    monkeypatch.chdir(tmp_path)
    make_bins(tmp_path / "v2", n=8, seed=1)
    assert cli_main(["build", "x=v1", second, "out", *PLAN]) == 1
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and "v2" in err[0] and "with exceptions" not in err[0], err
    make_bins(tmp_path / "v2", n=8, seed=1)
    with pytest.raises(Exception) as e:
        lidarshard.build(["x=v1", second], "out", world_size=1, batch_size=1, max_reject_fraction=0.5,
                         pipeline_args=BEAM_TEST_FLAGS)  # fmt: skip
    assert "v2" in _one_line(str(e.value)) and "with exceptions" not in str(e.value)
    assert capfd.readouterr().err == "" and not (tmp_path / "out").exists()


def test_a_walked_input_root_that_is_gone_is_an_error_not_a_reject(tmp_path: Path) -> None:
    """A whole INPUT that cannot be listed when the scan walks it is no one sample's reject."""
    with pytest.raises(FileNotFoundError, match="cannot be listed at the scan"):
        list(walk_local(str(tmp_path / "gone")))
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub").chmod(0)
    try:
        found = list(walk_local(str(tmp_path / "d")))
    finally:
        (tmp_path / "d" / "sub").chmod(0o755)
    if os.geteuid() != 0:  # root lists any directory
        assert [why.split(":")[0] for _, why in found] == ["cannot list directory"]

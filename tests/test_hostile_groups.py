"""Issue 50 items 9, 10 and 11 and their variants: plans of several step groups (``--plan-groups``) under
memory caps, step groups the samples cannot fill, ``budget`` under a samples cap, and rank speeds and caps
at their edges.

Families: "plan groups" (G against the samples and the strategies), "memory caps" (the memory model's
features in every group, caps at one sample's peak) and "rank speeds" (``--rank-speed`` values). The promise
of a refused case: one line naming the input and the fix, nothing published (exit 2 for a usage error, 1 for
what the data decides). A valid case publishes a manifest ``validate`` passes. Builds go through
``lidarshard.write_manifest`` (the grouped Beam build; validate re-derives each group in process) or the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lidarshard
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.tools.validate import validate
from tests.helpers import BEAM_TEST_FLAGS

N = 200
_rng = np.random.default_rng(0)
_POINTS = _rng.integers(1000, 100_000, N)
SAMPLES = pa.table(
    {
        "sample_id": [f"s{i:04d}" for i in range(N)],
        "path": [f"/d/{i}.bin" for i in range(N)],
        "num_points": _POINTS,
        "num_in_range": (_POINTS * 0.9).astype(np.int64),  # the memory model reads these, not num_points
        "occupied_voxels": (_POINTS // 10).astype(np.int64),
    }
)
MODELS = {  # base_bytes, bytes_per_point, bytes_per_voxel
    "voxels": (1e6, 0.0, 1000.0),
    "points in range": (1e6, 100.0, 0.0),
    "both": (1e6, 50.0, 500.0),
}


def _model(tmp: Path, name: str) -> str:
    base, point, voxel = MODELS[name]
    body = {"memory_model": {"base_bytes": base, "bytes_per_point": point, "bytes_per_voxel": voxel}}
    (tmp / "model.json").write_text(json.dumps(body))
    return str(tmp / "model.json")


def _published(out: Path) -> None:
    assert validate(str(out))[0] == []


def _refused(tmp: Path, flags: dict, words: str, **size) -> None:
    """``write_manifest`` refuses in one line holding ``words``; nothing published."""
    out = tmp / "out"
    with pytest.raises(Exception) as info:
        lidarshard.write_manifest(SAMPLES, str(out), size.get("w", 2), size.get("b", 2), **flags)
    message = str(info.value)
    assert "\n" not in message and words in message, message
    assert not out.exists()


# ------------------------------------------------------------------ item 9: the memory model in every group


@pytest.mark.hostile("plan groups")
@pytest.mark.parametrize("strategy", ["budget", "mixed"])
@pytest.mark.parametrize("groups", [2, 3])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_memory_cap_plans_in_step_groups(tmp_path: Path, model: str, groups: int, strategy: str) -> None:
    flags = {"max_step_memory": "1GiB", "memory_model": _model(tmp_path, model), "plan_groups": groups}
    lidarshard.write_manifest(SAMPLES, str(tmp_path / "out"), 2, 2, strategy=strategy, **flags)
    _published(tmp_path / "out")


@pytest.mark.hostile("memory caps")
@pytest.mark.parametrize(
    "flags",
    [
        {"heaviest_first": "memory"},
        {"strategy": "budget", "max_step_memory": "24MiB"},  # a cap that binds: more steps
        {"strategy": "budget", "max_step_memory": "24MiB", "rank_speed": [1.0, 2.0]},
    ],
    ids=["heaviest first by memory", "a cap that binds", "a cap that binds, rank speeds"],
)
def test_memory_caps_of_every_kind_plan_in_three_groups(tmp_path: Path, flags: dict) -> None:
    flags = {"max_step_memory": "1GiB", "memory_model": _model(tmp_path, "both"), "plan_groups": 3} | flags
    lidarshard.write_manifest(SAMPLES, str(tmp_path / "out"), 2, 2, **flags)
    _published(tmp_path / "out")


def _peak(i: int) -> int:
    """Sample ``i``'s predicted peak alone under the "both" model (base + its own bytes)."""
    base, point, voxel = MODELS["both"]
    return int(
        base
        + point * int(SAMPLES["num_in_range"][i].as_py())
        + voxel * int(SAMPLES["occupied_voxels"][i].as_py())
    )


@pytest.mark.hostile("memory caps")
@pytest.mark.parametrize("groups", [1, 3])
def test_a_cap_of_the_largest_samples_peak_keeps_it_one_byte_less_rejects_it(
    tmp_path: Path, groups: int
) -> None:
    largest = max(range(N), key=_peak)
    cap = _peak(largest) + 1  # the predicted peak is fractional bytes at most: rounding up keeps it
    flags = {"memory_model": _model(tmp_path, "both"), "plan_groups": groups, "strategy": "budget"}
    lidarshard.write_manifest(SAMPLES, str(tmp_path / "at"), 2, 2, max_step_memory=cap, **flags)
    _published(tmp_path / "at")
    lidarshard.write_manifest(
        SAMPLES, str(tmp_path / "below"), 2, 2, max_step_memory=cap - 2, max_reject_fraction=0.5, **flags
    )
    rejects = pq.read_table(tmp_path / "below" / "rejects.parquet").to_pylist()
    assert [r["path"] for r in rejects if r["reason"] == "over_cap"][:1] == [f"/d/{largest}.bin"]
    _published(tmp_path / "below")


# ------------------------------------------------------------ item 10: groups the samples cannot fill


@pytest.mark.hostile("plan groups")
@pytest.mark.parametrize(
    ("groups", "flags"),
    [(50, {}), (200, {}), (300, {}), (1 << 20, {}), (150, {"strategy": "budget"}), (300, {"pad": True})],
    ids=[
        "50 groups of ~4",
        "G = N",
        "G > N: empty groups",
        "the most groups",
        "budget, groups < W",
        "pad, G > N",
    ],
)
def test_more_groups_than_the_samples_allow_is_one_line(tmp_path: Path, groups: int, flags: dict) -> None:
    _refused(tmp_path, {"plan_groups": groups} | flags, f"lower --plan-groups ({groups})")


@pytest.mark.hostile("plan groups")
def test_an_empty_group_through_the_cli_is_one_line(tmp_path: Path, capsys) -> None:
    lidarshard.write_manifest(SAMPLES, str(tmp_path / "base"), 2, 2)
    out = tmp_path / "out"
    args = ["build", str(out), "--from-samples", str(tmp_path / "base" / "samples"), "--world-size", "2"]
    assert cli_main([*args, "--batch-size", "2", "--plan-groups", "400", *BEAM_TEST_FLAGS]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lower --plan-groups (400)" in err[0] and not out.exists()


@pytest.mark.hostile("plan groups")
@pytest.mark.parametrize(
    "flags",
    [
        {"plan_groups": 1},
        {"plan_groups": 8},
        {"plan_groups": 8, "strategy": "budget"},
        {"plan_groups": 40, "pad": True},
    ],
    ids=["G 1", "G 8", "G 8 budget", "G 40 padded"],
)
def test_groups_the_samples_fill_plan(tmp_path: Path, flags: dict) -> None:
    summary = lidarshard.write_manifest(SAMPLES, str(tmp_path / "out"), 2, 2, **flags)
    _published(tmp_path / "out")
    assert (
        json.loads((tmp_path / "out" / "_manifest.json").read_text()).get("plan_groups", {"groups": 1})[
            "groups"
        ]
        == flags["plan_groups"]
    ), summary


# -------------------------------------------------------------- item 11: budget under a samples cap


@pytest.mark.hostile("plan groups")
@pytest.mark.parametrize("groups", [1, 3])
def test_budget_under_a_cap_of_one_sample_is_refused_alike_at_every_g(tmp_path: Path, groups: int) -> None:
    flags = {"strategy": "budget", "max_samples_per_rank_step": 1, "plan_groups": groups}
    _refused(tmp_path, flags, "--max-samples-per-rank-step 1 with --strategy budget on 2 ranks")


@pytest.mark.hostile("plan groups")
@pytest.mark.parametrize(
    ("cap", "groups"),
    [(2, 1), (2, 3), (3, 3), (1, 1)],
    ids=["2 < B, G 1", "2 < B, G 3", "3 = B, G 3", "1 on one rank"],
)
def test_budget_under_a_cap_below_the_batch_plans_at_every_g(tmp_path: Path, cap: int, groups: int) -> None:
    w = 1 if cap == 1 else 2
    flags = {"strategy": "budget", "max_samples_per_rank_step": cap, "plan_groups": groups}
    lidarshard.write_manifest(SAMPLES, str(tmp_path / "out"), w, 3, **flags)
    _published(tmp_path / "out")


# ------------------------------------------------------------------------------ rank speeds, refused


SPEEDS = {
    "a zero": "1,0",
    "infinite": "1,inf",
    "nan": "1,nan",
    "negative": "1,-1",
    "one for two ranks": "1",
    "three for two ranks": "1,1,1",
    "1e300": "1,1e300",
    "1e-300": "1,1e-300",
    "an empty list": "",
    "a missing file": "@/nonexistent/speeds.json",
}


@pytest.mark.hostile("rank speeds")
@pytest.mark.parametrize("case", sorted(SPEEDS))
def test_rank_speeds_that_cannot_be_are_a_usage_line(tmp_path: Path, capsys, case: str) -> None:
    lidarshard.write_manifest(SAMPLES, str(tmp_path / "base"), 2, 2)
    out = tmp_path / "out"
    args = ["build", str(out), "--from-samples", str(tmp_path / "base" / "samples"), "--world-size", "2"]
    code = cli_main(
        [*args, "--batch-size", "2", "--strategy", "budget", "--rank-speed", SPEEDS[case], *BEAM_TEST_FLAGS]
    )
    err = [
        line for line in capsys.readouterr().err.splitlines() if "error:" in line
    ]  # after argparse's usage
    assert code == 2 and len(err) == 1 and "--rank-speed" in err[0] and not out.exists(), err


@pytest.mark.hostile("rank speeds")
@pytest.mark.parametrize(
    "speeds", [[1, 0], [1, float("inf")], [1, float("nan")], [1], [1, 1, 1], [1, -1], [True, 1]], ids=str
)
def test_rank_speeds_that_cannot_be_are_one_line_from_the_api(tmp_path: Path, speeds: list) -> None:
    _refused(tmp_path, {"rank_speed": speeds, "strategy": "budget"}, "rank-speed")


@pytest.mark.hostile("rank speeds")
@pytest.mark.parametrize(
    "speeds", [np.array([1.0, 2.0]), (1, 2), [1e-6, 1e6]], ids=["a numpy array", "a tuple", "the extremes"]
)
def test_rank_speeds_python_users_pass_plan(tmp_path: Path, speeds) -> None:
    lidarshard.write_manifest(SAMPLES, str(tmp_path / "out"), 2, 2, rank_speed=speeds, strategy="budget")
    _published(tmp_path / "out")


# ------------------------------------------------------------------------------ memory caps, refused


def _memory_flags(tmp: Path) -> dict[str, tuple[list[str], int]]:
    """case -> (flags, exit code): 2 for a usage error, 1 for what the samples decide."""
    model = _model(tmp, "voxels")
    files = {
        "big": {"memory_model": {"base_bytes": 2e9, "bytes_per_point": 1, "bytes_per_voxel": 0}},
        "list": [1, 2, 3],
        "null": {"memory_model": None, "memory_note": "no recorded step has peak_bytes"},
    }
    for name, body in files.items():
        (tmp / f"{name}.json").write_text(json.dumps(body))
    (tmp / "nan.json").write_text(
        '{"memory_model": {"base_bytes": NaN, "bytes_per_point": 1, "bytes_per_voxel": 0}}'
    )
    cap = ["--max-step-memory", "1GiB", "--memory-model"]
    return {
        "a cap below the model's base": ([*cap, str(tmp / "big.json")], 2),
        "a cap without a model": (["--max-step-memory", "1GiB"], 2),
        "a model without a cap": (["--memory-model", model], 2),
        "a cap of 0B": (["--max-step-memory", "0B", "--memory-model", model], 2),
        "a cap in decimal GB": (["--max-step-memory", "20GB", "--memory-model", model], 2),
        "a cap past 1 EiB": (["--max-step-memory", "2048PiB", "--memory-model", model], 2),
        "a model of NaN": ([*cap, str(tmp / "nan.json")], 2),
        "a model that is a list": ([*cap, str(tmp / "list.json")], 2),
        "a model that is a directory": ([*cap, str(tmp)], 2),
        "calibrate's null model": ([*cap, str(tmp / "null.json")], 2),
        "a cap below every sample": (["--max-step-memory", "1MiB", "--memory-model", model], 1),
    }


MEMORY_CASES = [
    "a cap below the model's base", "a cap without a model", "a model without a cap", "a cap of 0B",
    "a cap in decimal GB", "a cap past 1 EiB", "a model of NaN", "a model that is a list",
    "a model that is a directory", "calibrate's null model", "a cap below every sample",
]  # fmt: skip


@pytest.mark.hostile("memory caps")
@pytest.mark.parametrize("case", MEMORY_CASES)
def test_memory_caps_that_cannot_be_are_one_line(tmp_path: Path, capsys, case: str) -> None:
    flags, code = _memory_flags(tmp_path)[case]
    lidarshard.write_manifest(SAMPLES, str(tmp_path / "base"), 2, 2)
    out = tmp_path / "out"
    args = ["build", str(out), "--from-samples", str(tmp_path / "base" / "samples"), "--world-size", "2"]
    assert cli_main([*args, "--batch-size", "2", *flags, *BEAM_TEST_FLAGS]) == code
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(err) == 1 and "memory" in err[0] and not out.exists(), err


@pytest.mark.hostile("memory caps")
def test_budget_under_a_memory_and_a_points_cap_is_refused_before_planning(tmp_path: Path) -> None:
    flags = {"max_step_memory": "1GiB", "memory_model": _model(tmp_path, "voxels"), "strategy": "budget"}
    _refused(tmp_path, flags | {"max_points_per_rank_step": 200_000}, "not both: drop one")

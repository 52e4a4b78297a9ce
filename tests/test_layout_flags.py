"""Flags a layout cannot honour are one-line usage errors before Beam; ``--sweeps`` per INPUT for mixed
builds (issue 39 item 2: ``pipelines/preflight.py``, ``transforms/declare.per_name``)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from lidarshard import schemas
from lidarshard.pipelines.cli import main
from lidarshard.pipelines.options import BuildOptions
from lidarshard.pipelines.preflight import build_settings
from lidarshard.tools.validate import validate
from lidarshard.transforms.declare import from_keywords
from lidarshard.transforms.layouts.task import LayoutOptions
from lidarshard.transforms.value_checks import UsageError, int_in, per_name
from tests.helpers import BEAM_TEST_FLAGS, make_bins

AV2 = "av2/sensor"
KITTI = "semantickitti_full"  # one scan, no poses.txt: sweeps cannot be aggregated there


def _refused(capsys, argv: list[str], *words: str) -> None:
    """``argv`` exits 2 before any Beam work with one error line holding ``words``."""
    assert main(argv) == 2
    (line,) = [e for e in capsys.readouterr().err.splitlines() if "error:" in e]
    assert all(w in line for w in words), line


def _plan(*flags: str) -> list[str]:
    return ["--world-size", "1", "--batch-size", "1", *flags]


def test_per_name_reads_one_value_or_pairs() -> None:
    check = per_name(int_in(0, 1000))
    assert check("9") == 9 and check("nusc=9,kitti=0") == (("kitti", 0), ("nusc", 9))
    assert check.value({"b": 2, "a": "1"}) == (("a", 1), ("b", 2)) and check.value(3) == 3
    for text, said in (("a=1,a=2", "given twice"), ("a=x", "a: 'x' is not"), ("a=", "NAME=VALUE"),
                       ("1001", "[0, 1000]")):  # fmt: skip
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            check(text)


def test_sweeps_of_loose_files_are_refused(tmp_path: Path, realdata: Path, capsys) -> None:
    bins = make_bins(tmp_path / "bins", n=3)
    out = tmp_path / "out"
    _refused(
        capsys, ["build", str(bins), str(out), *_plan("--sweeps", "1")], "--sweeps 1: INPUT bins is loose"
    )
    _refused(capsys, ["scan", str(bins), str(out), "--sweeps", "2"], "no sweeps to aggregate")
    mixed = [str(realdata / AV2), f"loose={bins}", str(out)]
    _refused(capsys, ["build", *mixed, *_plan("--sweeps", "1")], "INPUT loose", "--sweeps NAME=N")
    _refused(capsys, ["build", *mixed, *_plan("--sweeps", "nope=1")], "no INPUT is named 'nope'")
    _refused(capsys, ["build", *mixed, *_plan("--sweeps", "loose=1")], "INPUT loose is loose")
    assert not out.exists()


def test_nuscenes_version_of_another_layout_is_refused(tmp_path: Path, realdata: Path, capsys) -> None:
    out = str(tmp_path / "out")
    av2 = str(realdata / AV2)
    _refused(capsys, ["build", av2, out, *_plan("--nuscenes-version", "v1.0-mini")],
             "--nuscenes-version v1.0-mini: INPUT", "Argoverse 2 sensor logs", "not a nuScenes dataroot")  # fmt: skip
    bins = str(make_bins(tmp_path / "bins", n=2))
    _refused(capsys, ["build", av2, bins, out, *_plan("--nuscenes-version", "v1.0-mini")],
             "no INPUT is a nuScenes dataroot (sensor (Argoverse 2 sensor logs), bins (point-cloud files")  # fmt: skip


def test_sweeps_per_input_reach_each_layout(tmp_path: Path, realdata: Path) -> None:
    inputs = [f"av2={realdata / AV2}", f"kitti={realdata / KITTI}"]
    given = {"input": inputs, "out": tmp_path / "out", "world_size": 1, "batch_size": 1, "sweeps": {"av2": 1}}
    scan = build_settings(from_keywords(BuildOptions, given))
    assert scan.layout_options == {"av2": LayoutOptions(1), "kitti": LayoutOptions(0)}
    assert scan.meta()["sweeps"] == {"av2": 1}
    with pytest.raises(UsageError, match="--from-samples re-plans samples scanned already"):
        opts = from_keywords(
            BuildOptions,
            {"out": tmp_path / "out", "world_size": 1, "batch_size": 1, "sweeps": 2, "from_samples": "S"},
        )
        build_settings(opts)


def test_a_mixed_build_asks_sweeps_of_one_input_only(tmp_path: Path, realdata: Path, capsys) -> None:
    """A pose-less SemanticKITTI INPUT beside Argoverse 2 sweeps: ``--sweeps av2=1`` builds both."""
    data = tmp_path / "data"
    shutil.copytree(realdata / AV2, data / "av2")
    shutil.copytree(realdata / KITTI, data / "kitti")
    out = tmp_path / "out"
    argv = ["build", str(data / "av2"), str(data / "kitti"), str(out), *_plan("--sweeps", "av2=1")]
    assert main([*argv, "--max-reject-fraction", "0.5", *BEAM_TEST_FLAGS]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert validate(str(out))[0] == []
    m = json.loads((out / schemas.MANIFEST_FILE).read_text())
    assert m["sweeps"] == {"av2": 1}
    assert printed[:2] == [
        f"INPUT av2: Argoverse 2 sensor logs, keyframe + 1 previous sweep ({data / 'av2'}): 2 samples accepted, "
        "1 with fewer sweeps: their log starts sooner",  # the log's first sweep has none before it
        f"INPUT kitti: SemanticKITTI sequences, no sweeps, labels mapped by the standard SemanticKITTI "
        f"learning_map (20 classes) ({data / 'kitti'}): 1 sample accepted",
    ]
    import pyarrow.parquet as pq

    rows = pq.read_table(out / schemas.SAMPLES_DIR, columns=["dataset", "num_sweeps"]).to_pylist()
    assert sorted((r["dataset"], r["num_sweeps"]) for r in rows) == [("av2", 0), ("av2", 1), ("kitti", 0)]

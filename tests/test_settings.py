"""``pipelines.preflight`` and ``pipelines.checks``: every value a flag allows
either runs to a valid manifest or is refused before Beam starts, with one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import lidarshard
from lidarshard.pipelines.cli import main
from lidarshard.tools.validate import validate
from tests.helpers import BEAM_TEST_FLAGS, make_bins


@pytest.fixture(scope="module")
def bins(tmp_path_factory) -> Path:
    root = make_bins(tmp_path_factory.mktemp("settings") / "in", n=24)
    (root / "bad.bin").unlink()  # only good clouds
    return root


def test_an_inverted_point_cloud_range_is_a_usage_error(bins: Path, tmp_path: Path, capsys) -> None:
    rc = main(
        ["scan", str(bins), str(tmp_path / "o"), "--point-cloud-range", "5,-5,-3,-5,5,3", *BEAM_TEST_FLAGS]
    )
    assert rc == 2 and "needs x0 < x1" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_the_largest_seed_and_a_large_plan_factor_publish(bins: Path, tmp_path: Path) -> None:
    """A 19-digit seed survives the manifest's JSON; validate re-plans with the recorded --max-plan-factor."""
    out = tmp_path / "o"
    s = lidarshard.build(
        str(bins), str(out), world_size=2, batch_size=2, seed=2**63 - 1, bucket_weights=(150.0, 150.0),
        max_plan_factor=1000, buckets=2, runner="FnApiRunner",
    )  # fmt: skip
    assert s["counts"]["accepted"] == 24 and validate(str(out))[0] == []
    assert lidarshard.load_manifest(str(out)).seed == 2**63 - 1


def test_out_never_holds_input_after_resolving_links(bins: Path, tmp_path: Path, capsys) -> None:
    """Publishing replaces OUT wholesale: an INPUT inside OUT (or OUT inside INPUT through a link) is refused."""
    out = tmp_path / "out"
    assert (
        main(["build", str(bins), str(out), "--world-size", "2", "--batch-size", "2", *BEAM_TEST_FLAGS]) == 0
    )
    raw = out / "raw"
    raw.mkdir()
    (raw / "0.bin").write_bytes((bins / "0000.bin").read_bytes())
    rc = main(["build", str(raw), str(out), "--world-size", "1", "--batch-size", "1", *BEAM_TEST_FLAGS])
    assert rc == 2 and "is inside OUT" in capsys.readouterr().err and (raw / "0.bin").exists()
    alias = tmp_path / "alias"
    os.symlink(bins, alias)
    rc = main(
        ["build", str(bins), str(alias / "out"), "--world-size", "1", "--batch-size", "1", *BEAM_TEST_FLAGS]
    )
    assert rc == 2 and "is inside INPUT" in capsys.readouterr().err and not (bins / "out").exists()

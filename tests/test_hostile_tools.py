"""Hostile inputs of the Beam-free tools (calibrate, report): absurd timings, oversized CSV headers,
forged recorder files, and outputs pointed inside a published manifest. The promise: one line naming
what is wrong, exit 1, and the manifest still passes ``validate``."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.loaders.timing import TIMING_SCHEMA, StepTimer
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.tools.validate import validate
from tests.helpers import build_bins_manifest

pytestmark = pytest.mark.hostile("epoch-time reports")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build_bins_manifest(tmp_path_factory.mktemp("tools"), 24, world_size=2, batch_size=2)


def _ids(out: Path) -> list[str]:
    return pq.read_table(out / schemas.SAMPLES_DIR, columns=["sample_id"]).column(0).to_pylist()


def _csv(out: Path, value: str) -> str:
    ids = _ids(out)
    return "sample_id,ms\n" + "".join(f"{i},{value if k == 3 else 1 + k}\n" for k, i in enumerate(ids))


CSV_CASES = {
    "1e300 ms": (lambda out: _csv(out, "1e300"), "data row 4 holds 1e+300"),
    "negative ms": (lambda out: _csv(out, "-5"), "must be a finite number in 0..1e+09"),
    "nan ms": (lambda out: _csv(out, "nan"), "must be a finite number in 0..1e+09"),
    "a million columns": (lambda out: ",".join(f"c{i}" for i in range(10**6)) + "\n1\n", "more than 1000"),
}


@pytest.mark.parametrize("case", sorted(CSV_CASES))
def test_absurd_timings_are_one_line(built: Path, tmp_path: Path, capsys, case: str) -> None:
    make, words = CSV_CASES[case]
    (tmp_path / "t.csv").write_text(make(built))
    assert (
        cli_main(
            ["calibrate", str(built), "--timings", str(tmp_path / "t.csv"), "-o", str(tmp_path / "f.json")]
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and not (tmp_path / "f.json").exists()


@pytest.mark.hostile("recorder")
@pytest.mark.parametrize("compute, wall", [(1e300, 1e300), (-1.0, 1.0), (2.0, 1.0), (float("nan"), 1.0)])
def test_a_forged_recorder_file_is_refused_naming_it(
    built: Path, tmp_path: Path, capsys, compute, wall
) -> None:
    with StepTimer(str(tmp_path / "t"), rank=0, world_size=2, device="cpu") as timer:
        timer.record(0, 0, _ids(built)[:2], 0.5)
    row = {"epoch": 0, "step": 1, "rank": 0, "world_size": 2, "compute_s": compute, "wall_s": wall,
           "sample_ids": _ids(built)[2:4], "device": "cpu", "method": "given"}  # fmt: skip
    forged = tmp_path / "t" / "timings-rank-00000-part-00001.parquet"
    pq.write_table(pa.Table.from_pylist([row], schema=TIMING_SCHEMA), forged)
    assert (
        cli_main(["calibrate", str(built), "--timings", str(tmp_path / "t"), "-o", str(tmp_path / "f.json")])
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert str(forged) in err and "0 <= compute_s <= wall_s <= 1e+06" in err and "\n" not in err


INSIDE = ["_manifest.json", "samples/part-00000.parquet", "plan/fit.json", "rejects.parquet", "new/fit.json"]


@pytest.mark.hostile("publishing")
@pytest.mark.parametrize("rel", INSIDE)
def test_calibrate_never_writes_into_a_published_manifest(
    built: Path, tmp_path: Path, capsys, rel: str
) -> None:
    (tmp_path / "t.csv").write_text(_csv(built, "7"))
    before = {p: p.read_bytes() for p in built.rglob("*") if p.is_file()}
    assert (
        cli_main(["calibrate", str(built), "--timings", str(tmp_path / "t.csv"), "-o", str(built / rel)]) == 1
    )
    err = capsys.readouterr().err.strip()
    assert f"-o {built / rel} is inside the published manifest {built}" in err and "\n" not in err
    assert {p: p.read_bytes() for p in built.rglob("*") if p.is_file()} == before
    assert validate(str(built))[0] == []
    ok = built / schemas.REPORT_DIR / "mine.json"  # the report folder is outside the contract
    assert cli_main(["calibrate", str(built), "--timings", str(tmp_path / "t.csv"), "-o", str(ok)]) == 0
    assert validate(str(built))[0] == []


@pytest.mark.hostile("publishing")
@pytest.mark.parametrize("rel", ["plan", "samples", ".", "plan/epoch-0"])
def test_report_never_writes_into_a_published_manifest(built: Path, capsys, rel: str) -> None:
    before = {p: p.read_bytes() for p in built.rglob("*") if p.is_file()}
    assert cli_main(["report", str(built), "--output-dir", str(built / rel)]) == 1
    err = capsys.readouterr().err.strip()
    assert "is inside the published manifest" in err and "\n" not in err
    assert {p: p.read_bytes() for p in built.rglob("*") if p.is_file()} == before

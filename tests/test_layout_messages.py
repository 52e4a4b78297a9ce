"""What a user who points at the wrong level of a dataset, or at half of one, is told: the level to point at
instead, or the part that is missing, in one line before Beam starts (before: a folder inside a dataset was
scanned as loose files without a word, and a Waymo v2 split without ``lidar_calibration/`` said "found no
dataset layout"). Also ``calibrate``/``report --timings`` of a path that is not there."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lidarshard.pipelines.cli import main
from lidarshard.transforms.layouts import STORAGE_IO, detect
from lidarshard.transforms.synth.layouts import LAYOUT_WRITERS
from tests.helpers import BEAM_TEST_FLAGS
from tests.manifest_fixture import make_fixture

PLAN = ["--world-size", "1", "--batch-size", "1"]
LOOSE = "or pass --dataset files"


def _write(root: Path, layout: str) -> Path:
    """One unit of one frame of ``layout`` as ``lidarshard synth --layout`` writes it."""
    writer = LAYOUT_WRITERS[layout]
    for rel, data in [*writer.static_files(0), *writer.unit_files(0, 0, 1)]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("levels")
    nusc = base / "nuscenes"
    for rel in ("v1.0-mini/sample_data.json", "samples/LIDAR_TOP/a.pcd.bin", "sweeps/LIDAR_TOP/b.pcd.bin"):
        (nusc / rel).parent.mkdir(parents=True, exist_ok=True)
        (nusc / rel).write_bytes(b"[]" if rel.endswith(".json") else bytes(20 * 5 * 4))
    tables_gone = base / "no_tables"
    shutil.copytree(nusc, tables_gone)
    shutil.rmtree(tables_gone / "v1.0-mini")
    out = {"nuscenes": nusc, "no_tables": tables_gone}
    return out | {layout: _write(base / layout, layout) for layout in ("av2", "semantickitti", "waymo_v2")}


def _one_log(av2: Path) -> Path:
    return next(p for p in (av2 / "train").iterdir() if p.is_dir())


CASES = {  # INPUT below a dataset -> the level to pass instead
    "nuscenes/samples": (lambda r: r["nuscenes"] / "samples", lambda r: r["nuscenes"]),
    "nuscenes/sweeps/LIDAR_TOP": (lambda r: r["nuscenes"] / "sweeps/LIDAR_TOP", lambda r: r["nuscenes"]),
    "nuscenes-without-tables/samples": (lambda r: r["no_tables"] / "samples", lambda r: r["no_tables"]),
    "semantickitti/sequences/00/velodyne": (
        lambda r: r["semantickitti"] / "sequences/00/velodyne",
        lambda r: r["semantickitti"] / "sequences/00",
    ),
    "av2/log/sensors/lidar": (lambda r: _one_log(r["av2"]) / "sensors/lidar", lambda r: _one_log(r["av2"])),
    "waymo_v2/lidar": (lambda r: r["waymo_v2"] / "lidar", lambda r: r["waymo_v2"]),
}


@pytest.mark.hostile("files and cli")
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_dataroot_one_level_too_low_names_the_level_to_pass(roots: dict[str, Path], case: str) -> None:
    given, meant = (f(roots) for f in CASES[case])
    with pytest.raises(ValueError) as err:
        detect(str(given), STORAGE_IO)
    message = str(err.value)
    assert f"{given} is part of the dataset at {meant} (" in message and f"pass {meant} as INPUT" in message
    assert LOOSE in message and "\n" not in message, message


@pytest.mark.hostile("files and cli")
def test_the_cli_line_for_a_folder_inside_a_dataset(
    roots: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples = roots["nuscenes"] / "samples"
    assert main(["build", str(samples), str(tmp_path / "out"), *PLAN, *BEAM_TEST_FLAGS]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (
        f"lidarshard build: error: INPUT {samples}: {samples} is part of the dataset at {roots['nuscenes']} "
        f"(nuScenes tables v1.0-mini): pass {roots['nuscenes']} as INPUT, or pass --dataset files to read every "
        "point-cloud file below it as one sample"
    )
    own = roots["nuscenes"] / "my_bins"  # a folder of the user's own inside a dataroot is theirs to read
    shutil.copytree(roots["nuscenes"] / "samples/LIDAR_TOP", own)
    assert detect(str(own), STORAGE_IO) == "files"


@pytest.mark.hostile("files and cli")
def test_a_waymo_split_without_lidar_calibration_names_it(
    roots: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    split = tmp_path / "split"
    shutil.copytree(roots["waymo_v2"], split)
    shutil.rmtree(split / "lidar_calibration")
    for flags in ([], ["--dataset", "waymo_v2"]):
        assert main(["build", str(split), str(tmp_path / "out"), *PLAN, *flags, *BEAM_TEST_FLAGS]) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert "has Waymo Open v2 lidar/*.parquet but no lidar_calibration/*.parquet" in line, line
        assert "found no dataset layout" not in line
    assert not (tmp_path / "out").exists()


@pytest.mark.hostile("files and cli")
@pytest.mark.parametrize("command", ["calibrate", "report"])
def test_timings_that_are_not_there_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    out = make_fixture(tmp_path, [40, 50, 60, 70], world_size=1, batch_size=2, epochs=1)
    assert main([command, str(out), "--timings", str(tmp_path / "missing_dir")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"lidarshard {command}: --timings {tmp_path / 'missing_dir'}: no such file or directory; give the "
        "directory the training recorder wrote (StepTimer: examples/train_ddp.py --timings DIR) or a CSV of "
        "measured ms"
    ]

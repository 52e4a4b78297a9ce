"""Dataset layouts end to end: detection and ``--dataset`` before Beam, each layout built, validated and
read back through ``PointCloudDataset``, several INPUTs balanced in one plan (``pipelines/inputs.py``,
``transforms/layouts/__init__.py``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.pipelines.cli import main
from lidarshard.pipelines.inputs import LAYOUT_IO, common_root, split_input
from lidarshard.tools.validate import validate
from lidarshard.transforms import layouts
from lidarshard.transforms.layouts.task import LayoutOptions
from tests.helpers import BEAM_TEST_FLAGS, make_bins, slow_after

torch = pytest.importorskip("torch")
from lidarshard.loaders.torch import PointCloudDataset  # noqa: E402

AV2_LOG = "av2/sensor/val/7fab2350-7eaf-3b7e-a39d-6937a4c1bede"


def _build(inputs: list[str], out: Path, *flags: str) -> int:
    return main(
        ["build", *inputs, str(out), "--world-size", "1", "--batch-size", "1", *flags, *BEAM_TEST_FLAGS]
    )


def _samples(out: Path) -> list[dict]:
    return pq.read_table(out / schemas.SAMPLES_DIR).to_pylist()


def test_detection_names_each_layout_and_files(realdata: Path, tmp_path: Path) -> None:
    assert layouts.detect(str(realdata / AV2_LOG), LAYOUT_IO) == "av2"
    assert layouts.detect(str(realdata / "av2/sensor"), LAYOUT_IO) == "av2"
    assert layouts.detect(str(realdata / "semantickitti_full"), LAYOUT_IO) == "semantickitti"
    assert layouts.detect(str(realdata / "semantickitti_full/sequences/00"), LAYOUT_IO) == "semantickitti"
    assert layouts.detect(str(make_bins(tmp_path / "bins", n=3)), LAYOUT_IO) == layouts.FILES
    assert layouts.detect(str(realdata / "kitti/training/velodyne"), LAYOUT_IO) == layouts.FILES
    lyft = str(realdata / "lyft/v1.01-train")  # Lyft Level 5 shares the nuScenes tables, v1.01-*
    assert layouts.describe(lyft, LAYOUT_IO) == {"nuscenes": "nuScenes tables v1.01-train"}
    (task,) = layouts.load("nuscenes", lyft, LayoutOptions(), LAYOUT_IO).tasks
    assert task.path.endswith("/lidar/host-a101_lidar1_1240710385903083166.bin")


def test_the_av2_download_root_is_detected_with_the_same_ids(realdata: Path) -> None:
    """``ROOT/sensor/<split>/<log>``, as the download leaves it, is the dataset root one level up."""
    assert layouts.detect(str(realdata / "av2"), LAYOUT_IO) == "av2"
    top, sensor = (
        layouts.load("av2", str(realdata / p), LayoutOptions(), LAYOUT_IO) for p in ("av2", "av2/sensor")
    )
    assert [t.sample_id for t in top.tasks] == [t.sample_id for t in sensor.tasks]
    assert top.tasks[0].sample_id.startswith("val/7fab2350-") and not top.rejects


def test_a_dataset_one_level_down_or_without_its_tables_is_said(
    realdata: Path, tmp_path: Path, capsys
) -> None:
    """Read as loose files these would give other samples than meant: one line saying so and how to go on."""
    with pytest.raises(ValueError, match="no tables .* pair keyframes with their sweeps.*--dataset files"):
        layouts.detect(str(realdata / "nuscenes"), LAYOUT_IO)
    shutil.copytree(realdata / "semantickitti", tmp_path / "runs" / "log")
    make_bins(tmp_path / "runs" / "loose", n=2)
    with pytest.raises(ValueError) as err:
        layouts.detect(str(tmp_path / "runs"), LAYOUT_IO)
    assert f"{tmp_path / 'runs'} holds no dataset itself, but {tmp_path / 'runs' / 'log'} holds one" in str(
        err.value
    )
    assert _build([str(tmp_path / "runs")], tmp_path / "out") == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "error:" in x]
    assert "pass --dataset files" in line and not (tmp_path / "out").exists()
    assert layouts.detect(str(tmp_path / "runs" / "loose"), LAYOUT_IO) == layouts.FILES


def test_a_dataset_flag_that_does_not_fit_is_one_line_naming_what_is_there(
    realdata: Path, tmp_path: Path, capsys
) -> None:
    assert _build([str(realdata / "semantickitti_full")], tmp_path / "out", "--dataset", "av2") == 2
    (err,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "is not Argoverse 2 sensor logs (--dataset av2): found SemanticKITTI sequences (1 sequence" in err
    assert _build([str(realdata / AV2_LOG)], tmp_path / "out", "--dataset", "nope") == 2
    assert "'nope' is not one of nuscenes, av2, semantickitti, waymo_v2, files" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_input_names_and_common_roots() -> None:
    assert split_input("kitti=/data/kitti") == ("kitti", "/data/kitti")
    assert split_input("/data/epoch=1") == (None, "/data/epoch=1")
    assert split_input("gs://b/x") == (None, "gs://b/x")
    assert common_root(["/data/a/x", "/data/b"]) == "/data"
    assert common_root(["gs://b/a/x", "gs://b/a/y"]) == "gs://b/a"
    assert common_root(["gs://b/a", "s3://b/a"]) is None and common_root(["gs://b1/a", "gs://b2/a"]) is None


def test_inputs_that_hold_one_another_are_refused(realdata: Path, tmp_path: Path, capsys) -> None:
    sensor = realdata / "av2/sensor"
    assert _build([f"a={sensor}", f"b={sensor / 'val'}"], tmp_path / "out") == 2
    assert (
        f"INPUT {sensor} holds INPUT {sensor / 'val'}: its files would be scanned twice"
        in capsys.readouterr().err
    )
    assert _build([f"a={sensor}", f"b={sensor}"], tmp_path / "out") == 2


def test_pattern_inputs_that_share_a_file_are_refused(tmp_path: Path, capsys) -> None:
    """A pattern INPUT is checked by the files it matches (it planned every file twice before)."""
    bins = make_bins(tmp_path / "bins", n=3)
    cases = [
        ([f"a={bins}", f"b={bins}/*.bin"], f"INPUT {bins} holds {bins}/"),
        ([f"a={bins}/*.bin", f"b={bins}/0*"], "both match"),
    ]
    for inputs, words in cases:
        assert _build(inputs, tmp_path / "out") == 2
        (line,) = [x for x in capsys.readouterr().err.splitlines() if "error:" in x]
        assert words in line and "scanned twice" in line and not (tmp_path / "out").exists()
    disjoint = [f"a={bins}/0000.bi?", f"b={bins}/0001*"]  # two patterns, no file in common
    assert _build(disjoint, tmp_path / "out") == 0
    assert len(_samples(tmp_path / "out")) == 2


def test_av2_builds_validates_and_reads_back_with_its_sweep(realdata: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _build([str(realdata / "av2/sensor")], out, "--sweeps", "1") == 0
    assert validate(str(out))[0] == []
    rows = {r["sample_id"]: r for r in _samples(out)}
    first, second = (
        rows[f"val/{AV2_LOG.rsplit('/', 1)[1]}/{t}"] for t in ("315966265259836000", "315966265360032000")
    )
    assert (first["format"], first["dataset"], first["num_sweeps"], second["num_sweeps"]) == (
        "av2_feather",
        "sensor",
        0,
        1,
    )
    assert first["num_points"] == 99_229  # no sweep: every point of the real file
    data = PointCloudDataset(str(out), sweeps=False)
    by_id = {data.sample_ids[i]: data[i]["points"] for i in range(len(data))}
    assert [len(by_id[s]) for s in sorted(by_id)] == [99_229, 99_466]
    assert by_id[second["sample_id"]].dtype == torch.float32


def test_semantickitti_builds_with_mapped_labels_and_repeat_factors(realdata: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _build([str(realdata / "semantickitti_full")], out, "--repeat-factors", "lidarseg:t=0.5") == 0
    assert validate(str(out))[0] == []
    manifest = json.loads((out / schemas.MANIFEST_FILE).read_text())
    (dataset,) = manifest["datasets"]
    assert dataset["layout"] == "semantickitti" and dataset["label_map"]["252"] == 1  # moving-car -> car
    (row,) = _samples(out)
    assert (row["sample_id"], row["num_points"], row["has_labels"]) == ("00/000000", 123_389, True)
    item = PointCloudDataset(str(out), labels=True)[0]
    labels = item["labels"].numpy()
    assert len(labels) == len(item["points"]) == 123_389
    raw = np.fromfile(realdata / "semantickitti_full/sequences/00/labels/000000.label", np.uint32) & 0xFFFF
    want = np.array([dataset["label_map"][str(v)] for v in raw], np.int64)
    assert np.array_equal(labels, want)
    assert set(manifest["repeat"]["expected"]) == {str(c) for c in np.unique(want)}


def test_two_datasets_make_one_plan_with_prefixed_ids_and_weights(realdata: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(realdata / "av2/sensor", data / "av2")
    make_bins(data / "bins", n=6)
    out = tmp_path / "out"
    flags = ("--dataset-weights", "av2=2", "--epochs", "2", "--max-reject-fraction", "0.2")
    assert _build([str(data / "av2"), f"loose={data / 'bins'}"], out, *flags) == 0
    assert validate(str(out))[0] == []
    manifest = json.loads((out / schemas.MANIFEST_FILE).read_text())
    assert manifest["path_root"] == str(data)
    assert [(d["name"], d["layout"], d["weight"]) for d in manifest["datasets"]] == [
        ("av2", "av2", 2.0),
        ("loose", "files", 1.0),
    ]
    rows = _samples(out)
    assert {r["dataset"] for r in rows} == {"av2", "loose"}
    assert all(r["sample_id"].startswith(r["dataset"] + "/") for r in rows)
    assert all(r["weight"] == (2.0 if r["dataset"] == "av2" else 1.0) for r in rows)
    assert all(r["path"].startswith(("av2/", "bins/")) for r in rows)
    plan = pq.read_table(out / schemas.PLAN_DIR).to_pylist()
    ids = {r["sample_id"] for r in plan}
    assert ids == {r["sample_id"] for r in rows}  # every sample of both datasets is planned
    data_set = PointCloudDataset(str(out), sweeps=False)
    assert sorted(len(data_set[i]["points"]) for i in range(len(data_set)))[-2:] == [99_229, 99_466]


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory) -> Path:
    """Every layout ``lidarshard synth`` writes, small: 2 units x 3 frames each (``ROOT/<layout>``)."""
    root = tmp_path_factory.mktemp("synth")
    for layout in ("av2", "semantickitti", "waymo_v2"):
        argv = [
            "synth",
            str(root / layout),
            "--layout",
            layout,
            "--scenes",
            "2",
            "--keyframes-per-scene",
            "3",
        ]
        assert main(argv) == 0
    return root


@pytest.mark.parametrize(
    ("layout", "columns", "labels"),
    slow_after(1, [("semantickitti", 4, True), ("av2", 4, False), ("waymo_v2", 5, False)]),
)
def test_each_synthetic_layout_builds_validates_and_reads_back(
    synth_root: Path, tmp_path: Path, layout: str, columns: int, labels: bool
) -> None:
    out = tmp_path / "out"
    assert main(["build", str(synth_root / layout), str(out), "--world-size", "2", "--batch-size", "1",
                 "--sweeps", "2", *BEAM_TEST_FLAGS]) == 0  # fmt: skip
    assert validate(str(out))[0] == [] and main(["validate", str(out), "--data"]) == 0
    rows = _samples(out)
    assert len(rows) == 6 and {r["dataset"] for r in rows} == {layout}
    assert sorted(r["num_sweeps"] for r in rows) == [0, 0, 1, 1, 2, 2]  # a unit's first frames have fewer
    dataset = PointCloudDataset(str(out), labels=labels)
    for i in range(len(dataset)):
        item = dataset[i]
        row = next(r for r in rows if r["sample_id"] == item["sample_id"])
        assert tuple(item["points"].shape) == (row["num_points"], columns)  # the scan's points, sweeps too
        if labels:
            assert (item["labels"] >= 0).sum() == row["num_points"] - (item["labels"] < 0).sum()
    if layout == "waymo_v2":
        assert all(r["frame"] is not None and len(r["sweep_frames"]) == r["num_sweeps"] for r in rows)
        assert {r["path_crc32"] for r in rows} == {None}  # read by row group: sizes recorded, not hashes


def _linearity(out: Path) -> float:
    return json.loads((out / schemas.MANIFEST_FILE).read_text())["balance"][0]["linearity"]


@pytest.mark.slow  # two builds; two-dataset plans are built in the fast lane by the real-data tests above
def test_a_two_dataset_plan_is_as_balanced_as_one_dataset(synth_root: Path, tmp_path: Path) -> None:
    """nuScenes-size clouds (AV2) and SemanticKITTI scans, ~4x apart in points with sweeps, in one plan:
    as balanced as the plan of either alone, and every sample of both planned as the plan says."""
    flags = ["--world-size", "2", "--batch-size", "1", "--sweeps", "2", "--epochs", "2", *BEAM_TEST_FLAGS]
    one = tmp_path / "one"
    assert main(["build", str(synth_root / "semantickitti"), str(one), *flags]) == 0
    both = tmp_path / "both"
    inputs = [f"a={synth_root / 'av2'}", f"k={synth_root / 'semantickitti'}"]
    assert main(["build", *inputs, str(both), *flags]) == 0
    assert validate(str(both))[0] == []  # every sample appears in every epoch as the plan says
    assert _linearity(both) >= _linearity(one) - 0.005
    ids = {r["sample_id"] for r in pq.read_table(both / schemas.PLAN_DIR).to_pylist()}
    assert {i.split("/", 1)[0] for i in ids} == {"a", "k"} and len(ids) == 12


def test_the_api_takes_several_inputs_like_the_cli(realdata: Path, tmp_path: Path) -> None:
    import lidarshard

    inputs = [f"a={realdata / 'av2/sensor'}", f"k={realdata / 'semantickitti_full'}"]
    summary = lidarshard.build(
        inputs, str(tmp_path / "out"), world_size=1, batch_size=1, runner="FnApiRunner"
    )
    assert summary["counts"]["accepted"] == 3
    assert sorted(r["dataset"] for r in _samples(tmp_path / "out")) == ["a", "a", "k"]


def test_repeat_factors_over_two_labelled_datasets_are_refused(
    synth_root: Path, tmp_path: Path, capsys
) -> None:
    """Two datasets' class ids mean different classes: mixing them in one f_c would be silently wrong."""
    kitti, copy = synth_root / "semantickitti", tmp_path / "copy"
    shutil.copytree(kitti, copy)
    argv = ["build", f"a={kitti}", f"b={copy}", str(tmp_path / "out"), "--world-size", "1", "--batch-size", "1",
            "--repeat-factors", "lidarseg:t=0.5", *BEAM_TEST_FLAGS]  # fmt: skip
    assert main(argv) == 2
    assert "INPUTs a, b all have labels, whose class ids mean different classes" in capsys.readouterr().err


def test_dataset_weights_name_a_dataset_of_the_run(realdata: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    inputs = [f"a={realdata / 'av2/sensor'}", f"k={realdata / 'semantickitti_full'}"]
    assert _build([*inputs], out, "--dataset-weights", "kk=2") == 2
    assert "no INPUT is named 'kk' (INPUTs: a, k)" in capsys.readouterr().err
    assert _build([*inputs], out, "--dataset-weights", "k=2") == 0
    rebuild = ["build", str(tmp_path / "again"), "--from-samples", str(out / schemas.SAMPLES_DIR),
               "--world-size", "1", "--batch-size", "1", *BEAM_TEST_FLAGS]  # fmt: skip
    assert main([*rebuild, "--dataset-weights", "kitti=2"]) == 2
    assert "holds no dataset named 'kitti' (datasets: a, k)" in capsys.readouterr().err
    assert main([*rebuild, "--dataset-weights", "k=3"]) == 0
    weights = {r["sample_id"]: r["weight"] for r in _samples(tmp_path / "again")}
    assert weights["k/00/000000"] == 3.0 and {w for i, w in weights.items() if i.startswith("a/")} == {1.0}
    manifest = json.loads((tmp_path / "again" / schemas.MANIFEST_FILE).read_text())
    assert [(d["name"], d["weight"]) for d in manifest["datasets"]] == [("a", 1.0), ("k", 3.0)]
    assert main(["scan", *inputs, str(tmp_path / "scan"), "--dataset-weights", "k=2", *BEAM_TEST_FLAGS]) == 2
    assert "weights a plan: give it to build" in capsys.readouterr().err

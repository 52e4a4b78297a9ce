"""The contract's typed records (``schemas.records``, ``schemas.scan_record``): each reads what it writes, and a
malformed value is one ValueError line naming the file and key. Pure: no pipeline run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lidarshard.schemas.jsonread import Reader
from lidarshard.schemas.records import (
    CapsRecord,
    CostModel,
    DatasetEntry,
    HistoryEntry,
    RepeatRecord,
    label_maps,
)
from lidarshard.schemas.scan_record import ScanRecord
from lidarshard.transforms.io import metadata

CAPS = {"max_points_per_rank_step": 9000, "max_cost_per_rank_step": None, "max_samples_per_rank_step": 3,
        "heaviest_first": "points"}  # fmt: skip
REPEAT = {"mode": "lidarseg:t=0.5", "expected": {"1": 2.5}, "realized": [{"1": 2.0}, {"1": 3.0}],
          "datasets": {"kitti": 2.0}}  # fmt: skip
DATASET = {
    "name": "k",
    "root": "/d/k",
    "layout": "semantickitti",
    "weight": 2.0,
    "label_map": {"10": 1, "252": 1},
}
HISTORY = [
    {
        "until_epoch": 1,
        "cost_model": {"name": "voxels", "c0": 0.0, "a": 0.0, "b": 1.0},
        "bucket_edges": [1.0, 5.0],
    }
]


def _reader(**obj: object) -> Reader:
    return Reader(obj, "_manifest.json")


def test_each_record_reads_back_what_it_writes() -> None:
    caps = CapsRecord.parse(_reader(caps=CAPS))
    assert caps is not None and caps.heaviest_first == "points" and caps.to_json() == CAPS
    off = {k: v for k, v in CAPS.items() if k != "heaviest_first"}
    assert (
        CapsRecord.parse(_reader(caps=off)) == CapsRecord(9000, None, 3)
        and CapsRecord(9000, None, 3).to_json() == off
    )
    assert CapsRecord.parse(_reader(caps=None)) is None and RepeatRecord.parse(_reader(repeat=None)) is None
    repeat = RepeatRecord.parse(_reader(repeat=REPEAT))
    assert repeat is not None and repeat.realized[1] == {"1": 3.0} and repeat.to_json() == REPEAT
    (entry,) = DatasetEntry.parse_all(_reader(datasets=[DATASET]))
    assert entry.label_map == {10: 1, 252: 1} and entry.to_json() == DATASET
    assert label_maps((entry,)) == {"k": {10: 1, 252: 1}} and DatasetEntry.parse_all(_reader()) == ()
    (h,) = HistoryEntry.parse_all(_reader(cost_history=HISTORY), epochs=3)
    assert (
        h.cost_model == CostModel("voxels", b=1.0)
        and h.bucket_edges == (1.0, 5.0)
        and h.to_json() == HISTORY[0]
    )
    assert CostModel.parse({"name": "linear", "a": 1, "b": 2, "q": 1.5}, "m").to_json() == {
        "name": "linear", "c0": 0.0, "a": 1.0, "b": 2.0, "q": 1.5,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (
            {"caps": CAPS | {"max_points_per_rank_step": 1.5}},
            "caps: max_points_per_rank_step must be an int >= 1",
        ),
        ({"caps": CAPS | {"heaviest_first": None}}, "caps: heaviest_first must be a string"),
        ({"caps": CAPS | {"extra": 1}}, "caps must be an object of"),
        ({"repeat": REPEAT | {"expected": {"1": "x"}}}, "repeat: expected must be an object of numbers"),
        (
            {"repeat": REPEAT | {"realized": {"1": 2.0}}},
            "repeat: realized must be a list of objects of numbers",
        ),
        ({"repeat": REPEAT | {"mode": 3}}, "repeat: mode must be a string or null"),
        ({"datasets": [DATASET | {"label_map": {"x": 1}}]}, "datasets: label_map must be an object mapping"),
        ({"datasets": [DATASET | {"root": None}]}, "datasets: root must be a string"),
        ({"datasets": {"k": DATASET}}, "datasets must be a list of"),
    ],
)
def test_a_malformed_record_is_one_line_naming_the_key(obj: dict, message: str) -> None:
    parse = {
        "caps": CapsRecord.parse,
        "repeat": RepeatRecord.parse,
        "datasets": DatasetEntry.parse_all,
    }[next(iter(obj))]
    with pytest.raises(ValueError, match=message) as info:
        parse(Reader(obj, "_manifest.json"))
    assert str(info.value).startswith("_manifest.json: ") and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "model",
    [
        {"name": "linear", "a": True},
        {"name": "linear", "p": 1.0},
        {"a": 1.0},
        [1],
        {"name": "x", "b": float("nan")},
        {"name": "linear", "b": 1.0, "units": 3},
        {"name": "linear", "b": 1.0, "units": "ms", "step_ms": None},
        {"name": "linear", "b": 1.0, "units": "ms", "step_ms": float("inf")},
        {"name": "linear", "b": 1.0, "units": "ms", "launch_ms": "12"},
    ],
)
def test_a_cost_model_lidarshard_does_not_write_is_refused(model: object) -> None:
    with pytest.raises(
        ValueError, match=r"^m must be \{'name', 'c0', 'a', 'b'\[, 'q', 'units', 'step_ms', 'launch_ms'\]\}"
    ):
        CostModel.parse(model, "m")


def test_a_calibrated_cost_model_keeps_its_units_and_step_overhead() -> None:
    """4.4: ``units`` and ``step_ms`` round-trip; a model without them keeps its 4.3 bytes."""
    timed = {"name": "linear", "c0": 1.0, "a": 0.0, "b": 2.0, "units": "ms", "step_ms": 12.5}
    assert CostModel.parse(timed, "m").to_json() == timed
    assert CostModel.parse(timed, "m").step_ms == 12.5
    assert CostModel("voxels", b=1.0).to_json() == {"name": "voxels", "c0": 0.0, "a": 0.0, "b": 1.0}
    launched = timed | {"launch_ms": 11.5}  # 4.5: a per-rank-step constant round-trips too
    assert (
        CostModel.parse(launched, "m").to_json() == launched
        and CostModel.parse(launched, "m").launch_ms == 11.5
    )


def test_a_cost_history_out_of_order_is_refused() -> None:
    with pytest.raises(ValueError, match="cost_history must be a list of"):
        HistoryEntry.parse_all(_reader(cost_history=HISTORY * 2), epochs=3)  # until_epoch not rising
    with pytest.raises(ValueError, match="cost_history must be a list of"):
        HistoryEntry.parse_all(_reader(cost_history=HISTORY), epochs=1)  # no epoch before 1 of 1


def test_the_scan_record_of_a_scan_or_a_manifest(tmp_path: Path) -> None:
    scan = {"schema_version": "4.2", "counts": {"scanned": 3, "accepted": 2, "rejected": 1,
            "rejected_by_reason": {"empty": 1}}, "inputs_fingerprint": "ab", "datasets": [DATASET],
            "max_reject_fraction": 1, "input": "/d/k"}  # fmt: skip
    (tmp_path / "_scan.json").write_text(json.dumps(scan))
    rec = metadata.load_scan(tmp_path)
    assert rec.counts.rejected_by_reason == {"empty": 1} and rec.max_reject_fraction == 1.0
    assert rec.datasets[0].name == "k" and rec.path_root is None and rec.provenance["input"] == "/d/k"
    assert metadata.previous_record(str(tmp_path)) == rec
    assert metadata.previous_record(str(tmp_path / "nothing")) is None  # samples copied out of their run
    (tmp_path / "_scan.json").write_text(json.dumps(scan | {"counts": {"scanned": 3}}))
    with pytest.raises(ValueError, match=r"_scan.json: counts: accepted must be an int >= 0"):
        metadata.previous_record(str(tmp_path))  # there but malformed: refused, not skipped
    with pytest.raises(ValueError, match=r"_scan.json: not a JSON object"):
        ScanRecord.from_json([], "_scan.json")

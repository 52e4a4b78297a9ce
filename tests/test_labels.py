"""formats.labels: nuScenes-lidarseg and SemanticKITTI label files, real and hand-built."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.formats import readers
from lidarshard.transforms.formats.labels import (
    LABEL_FORMATS,
    decode_labels,
    label_format,
    parse_learning_map,
    read_labels,
)
from lidarshard.transforms.layouts.multisweep import check_labels

#: Semantic ids in realdata/semantickitti_full's scan (computed once with plain numpy: ``label & 0xFFFF``).
FULL_SEMANTIC = [0, 1, 10, 11, 30, 40, 44, 48, 50, 51, 52, 70, 71, 72, 80, 81, 99, 252, 254]
#: Those ids through semantic-kitti.yaml's learning_map.
FULL_CLASSES = [0, 1, 2, 6, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19]
FULL_POINTS = 123_389


def _kitti_labels(semantic: list[int], instance: list[int] | None = None) -> bytes:
    inst = np.zeros(len(semantic), np.uint32) if instance is None else np.array(instance, np.uint32)
    return ((inst << 16) | np.array(semantic, np.uint32)).astype("<u4").tobytes()


@pytest.fixture(scope="module")
def full(semantickitti_full: Path) -> Path:
    return semantickitti_full


def test_label_format_by_name() -> None:
    assert LABEL_FORMATS == ("lidarseg", "semantickitti")
    assert label_format("s3://b/sequences/00/labels/000000.label") == "semantickitti"
    assert label_format("/d/LABELS/000001.LABEL") == "semantickitti"
    assert label_format("lidarseg/v1.0-mini/abc_lidarseg.bin") == "lidarseg"
    assert label_format("labels/000000.label.bin") == "lidarseg"


def test_full_scan_points_and_labels(full: Path) -> None:
    seq = full / "sequences" / "00"
    points = readers.read_points((seq / "velodyne" / "000000.bin").read_bytes(), "kitti_bin")
    assert points.shape == (FULL_POINTS, 4)
    data = (seq / "labels" / "000000.label").read_bytes()
    raw = read_labels(data, "semantickitti", len(points))
    assert raw.shape == (FULL_POINTS,) and raw.dtype == np.uint8
    assert np.unique(raw).tolist() == FULL_SEMANTIC
    assert len(FULL_SEMANTIC) == 19  # PROVENANCE: 19 classes present
    mapping = parse_learning_map((full / "semantic-kitti.yaml").read_bytes())
    classes = read_labels(data, "semantickitti", FULL_POINTS, mapping)
    assert np.unique(classes).tolist() == FULL_CLASSES
    expected = np.array([mapping[int(v)] for v in raw], np.uint8)  # point by point through the dict
    assert np.array_equal(classes, expected)
    assert np.array_equal(decode_labels(data, "semantickitti", mapping), classes)


def test_real_learning_map(full: Path) -> None:
    mapping = parse_learning_map((full / "semantic-kitti.yaml").read_bytes())
    assert len(mapping) == 34 and list(mapping) == sorted(mapping)
    assert (mapping[0], mapping[10], mapping[52], mapping[252], mapping[259]) == (0, 1, 0, 1, 5)
    assert set(mapping.values()) == set(range(20))


def test_small_scan_labels(realdata: Path) -> None:
    seq = realdata / "semantickitti" / "sequences" / "00"
    if not seq.is_dir():
        pytest.skip("no small SemanticKITTI scan")
    points = readers.read_points((seq / "velodyne" / "000000.bin").read_bytes(), "kitti_bin")
    labels = read_labels((seq / "labels" / "000000.label").read_bytes(), "semantickitti", len(points))
    assert len(points) == len(labels) == 50
    assert np.unique(labels).tolist() == [0, 50, 52, 70, 71, 80]


def test_lidarseg_unchanged(realdata: Path) -> None:
    path = realdata / "nuscenes_lidarseg_pr2859" / "lidarseg" / "v1.0-trainval"
    files = sorted(path.glob("*_lidarseg.bin"))
    if not files:
        pytest.skip("no lidarseg label file")
    data = files[0].read_bytes()
    assert label_format(str(files[0])) == "lidarseg"
    labels = read_labels(data, "lidarseg", 40, {31: 0})  # a map never touches lidarseg bytes
    assert np.array_equal(labels, np.frombuffer(data, np.uint8))
    values, counts = np.unique(labels, return_counts=True)
    assert dict(zip(values.tolist(), counts.tolist(), strict=True)) == {
        17: 2,
        24: 15,
        27: 1,
        28: 12,
        30: 1,
        31: 9,
    }
    labels[0] = 0  # writable, a copy of the bytes
    assert data == files[0].read_bytes()


def test_lidarseg_mismatch_matches_check_labels() -> None:
    data = bytes([1, 2, 3])
    with pytest.raises(RejectError) as ours:
        read_labels(data, "lidarseg", 4)
    with pytest.raises(RejectError) as theirs:
        check_labels(data, 4)
    assert ours.value.reason == "label_mismatch" and ours.value.detail == theirs.value.detail
    assert read_labels(b"", "lidarseg", 0).shape == (0,)


def test_instance_bits_dropped() -> None:
    data = _kitti_labels([40, 10, 252], instance=[7, 65535, 0])
    assert read_labels(data, "semantickitti", 3).tolist() == [40, 10, 252]
    assert read_labels(data, "semantickitti", 3, {40: 9, 10: 1, 252: 1}).tolist() == [9, 1, 1]


def test_little_endian() -> None:
    data = bytes([0x20, 0x00, 0x05, 0x00])  # semantic 32, instance 5, stored little-endian
    assert read_labels(data, "semantickitti", 1).tolist() == [32]  # big-endian would read semantic 0x0500


@pytest.mark.parametrize(
    ("data", "num_points", "counts"),
    [
        (_kitti_labels([0, 1, 10]), 4, ("3 uint32 labels", "4 points")),
        (_kitti_labels([0, 1, 10]) + b"\x00\x00", 3, ("14 bytes", "3 points")),
        (b"", 2, ("0 uint32 labels", "2 points")),
    ],
)
def test_semantickitti_count_mismatch(data: bytes, num_points: int, counts: tuple[str, str]) -> None:
    with pytest.raises(RejectError) as err:
        read_labels(data, "semantickitti", num_points, {0: 0, 1: 0, 10: 1})
    assert err.value.reason == "label_mismatch"
    assert all(c in err.value.detail for c in counts), err.value.detail


def test_id_not_in_map() -> None:
    data = _kitti_labels([10, 13, 10, 999])
    with pytest.raises(RejectError) as err:
        read_labels(data, "semantickitti", 4, {10: 1, 0: 0})
    assert err.value.reason == "label_mismatch"
    assert "ids 13, 999" in err.value.detail and "learning_map" in err.value.detail
    with pytest.raises(RejectError, match="id 13 "):
        decode_labels(_kitti_labels([13]), "semantickitti", {10: 1})


def test_raw_id_over_uint8_without_map() -> None:
    with pytest.raises(RejectError) as err:
        read_labels(_kitti_labels([10, 256]), "semantickitti", 2)
    assert err.value.reason == "label_mismatch" and "id 256" in err.value.detail
    assert read_labels(_kitti_labels([10, 256]), "semantickitti", 2, {10: 1, 256: 5}).tolist() == [1, 5]


def test_caller_bugs_are_value_errors() -> None:
    with pytest.raises(ValueError, match="label format 'npy'"):
        read_labels(b"", "npy", 0)
    with pytest.raises(ValueError, match="num_points"):
        read_labels(b"", "lidarseg", -1)
    with pytest.raises(ValueError, match="label format"):
        decode_labels(b"", "kitti")


def test_parse_learning_map_small() -> None:
    text = b"labels:\n  0: unlabeled\nlearning_map:\n  0: 0\n  10: 1\n  252: 1\n"
    assert parse_learning_map(text) == {0: 0, 10: 1, 252: 1}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (b"learning_map: [1, 2\n", "not valid YAML"),
        (b"labels: {0: x}\n", "no learning_map"),
        (b"- 1\n- 2\n", "no learning_map"),
        (b"learning_map: 3\n", "not a non-empty mapping"),
        (b"learning_map: {}\n", "not a non-empty mapping"),
        (b"learning_map: {0: 256}\n", "0: 256"),
        (b"learning_map: {0: -1}\n", "0: -1"),
        (b"learning_map: {65536: 1}\n", "65536: 1"),
        (b"learning_map: {x: 1}\n", "'x': 1"),
        (b"learning_map: {1: true}\n", "1: True"),
        (b"learning_map: {1: 1.5}\n", "1: 1.5"),
    ],
)
def test_parse_learning_map_refuses(text: bytes, words: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_learning_map(text)
    assert words in str(err.value) and "\n" not in str(err.value)

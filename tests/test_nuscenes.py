"""transforms/layouts/nuscenes_tasks.py: nuScenes tables -> LIDAR_TOP keyframe tasks, sweeps, transforms."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from lidarshard.schemas import REJECT_REASONS
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.layouts.geometry import sweep_transform
from lidarshard.transforms.layouts.multisweep import aggregate, check_labels, remove_close
from lidarshard.transforms.layouts.nuscenes_tasks import join_under_root, load_tasks
from lidarshard.transforms.layouts.task import ScanTask, SweepRef
from tests.helpers import IDENTITY_Q, yaw_q, yaw_tf

VERSION = "v1.0-test"
LIDAR_CS = {"token": "cs_lidar", "sensor_token": "sen_lidar", "translation": [0.94, 0.0, 1.84]}


class Dataset:
    """A tiny nuScenes-style table set: two scenes of LIDAR_TOP keyframes and sweeps, plus a camera."""

    def __init__(self) -> None:
        self.t: dict[str, list] = {
            "sensor": [
                {"token": "sen_lidar", "channel": "LIDAR_TOP", "modality": "lidar"},
                {"token": "sen_cam", "channel": "CAM_FRONT", "modality": "camera"},
                {"token": "sen_radar", "channel": "RADAR_FRONT", "modality": "radar"},
            ],
            "calibrated_sensor": [
                LIDAR_CS | {"rotation": yaw_q(-math.pi / 2)},
                {
                    "token": "cs_cam",
                    "sensor_token": "sen_cam",
                    "translation": [1.7, 0.0, 1.5],
                    "rotation": IDENTITY_Q,
                },
                {
                    "token": "cs_radar",
                    "sensor_token": "sen_radar",
                    "translation": [3.4, 0, 0.5],
                    "rotation": IDENTITY_Q,
                },
            ],
            "ego_pose": [],
            "sample": [],
            "sample_data": [],
            "lidarseg": [],
        }
        self.points: dict[str, int] = {}  # filename -> points to write
        self.npoints: dict[str, int] = {}  # sample_data token -> points in its file
        self._add_scene("A", "n015-a", t0=1_000_000, frames="KSSKSSK")
        self._add_scene("B", "n008-b", t0=9_000_000, frames="KSK")
        self.t["lidarseg"].append(
            {"token": "ls_A1", "sample_data_token": "kA1", "filename": f"lidarseg/{VERSION}/kA1_lidarseg.bin"}
        )

    def _add_scene(self, scene: str, log: str, t0: int, frames: str) -> None:
        prev, k, s = "", 0, 0
        for i, kind in enumerate(frames):
            ts = t0 + 50_000 * i
            token = f"k{scene}{k}" if kind == "K" else f"s{scene}{s + 1}"
            sample = f"samp{scene}{k}" if kind == "K" else f"samp{scene}{k}"
            folder = "samples" if kind == "K" else "sweeps"
            self.t["ego_pose"].append(
                {
                    "token": f"ep_{token}",
                    "timestamp": ts,
                    "translation": [2.0 * i, 0.5 * i, 0.0],
                    "rotation": yaw_q(0.05 * i),
                }
            )
            rec = {
                "token": token,
                "sample_token": sample,
                "ego_pose_token": f"ep_{token}",
                "calibrated_sensor_token": "cs_lidar",
                "filename": f"{folder}/LIDAR_TOP/{log}__LIDAR_TOP__{ts}.pcd.bin",
                "fileformat": "pcd",
                "width": 0,
                "height": 0,
                "timestamp": ts,
                "is_key_frame": kind == "K",
                "prev": prev,
                "next": "",
            }
            if prev:
                self.sd(prev)["next"] = token
            self.t["sample_data"].append(rec)
            self.points[rec["filename"]] = self.npoints[token] = 10 + i
            if kind == "K":
                self.t["sample"].append({"token": sample, "timestamp": ts, "scene_token": f"scene{scene}"})
                cam = f"cam{scene}{k}"
                self.t["ego_pose"].append(
                    {"token": f"ep_{cam}", "translation": [0, 0, 0], "rotation": IDENTITY_Q}
                )
                camera = {"token": cam, "ego_pose_token": f"ep_{cam}", "calibrated_sensor_token": "cs_cam"}
                camera["filename"] = f"samples/CAM_FRONT/{log}__CAM_FRONT__{ts}.jpg"
                self.t["sample_data"].append(rec | camera | {"prev": "", "next": ""})
                k += 1
            else:
                s += 1
                radar = {"token": f"radar{scene}{s}", "calibrated_sensor_token": "cs_radar", "prev": ""}
                radar["filename"] = f"sweeps/RADAR_FRONT/{log}__RADAR_FRONT__{ts}.pcd"
                self.t["sample_data"].append(rec | radar | {"ego_pose_token": "nope"})
            prev = token

    def sd(self, token: str) -> dict:
        return next(r for r in self.t["sample_data"] if r.get("token") == token)

    def pose(self, token: str) -> dict:
        return next(r for r in self.t["ego_pose"] if r["token"] == self.sd(token)["ego_pose_token"])

    def write(self, root: Path, lidarseg: bool = True) -> Path:
        (root / VERSION).mkdir(parents=True, exist_ok=True)
        for name, rows in self.t.items():
            if name != "lidarseg" or lidarseg:
                (root / VERSION / f"{name}.json").write_text(json.dumps(rows))
        rng = np.random.default_rng(0)
        for filename, n in self.points.items():
            (root / filename).parent.mkdir(parents=True, exist_ok=True)
            (root / filename).write_bytes(rng.uniform(-30, 30, (n, 5)).astype(np.float32).tobytes())
        for row in self.t["lidarseg"] if lidarseg else []:
            if row.get("sample_data_token") not in self.npoints:
                continue
            (root / row["filename"]).parent.mkdir(parents=True, exist_ok=True)
            (root / row["filename"]).write_bytes(bytes(self.npoints[row["sample_data_token"]]))
        return root

    def memory_reader(self, root: str, files: dict[str, bytes] | None = None):
        """read_bytes over in-memory tables at ``<root>/<VERSION>/``, plus optional extra files."""
        data = {f"{root}/{VERSION}/{name}.json": json.dumps(rows).encode() for name, rows in self.t.items()}
        data |= files or {}

        def read_bytes(path: str, limit: int | None = None) -> bytes:
            if path not in data:
                raise FileNotFoundError(path)
            return data[path]

        return read_bytes


def read_local(path: str, limit: int | None = None) -> bytes:
    return Path(path).read_bytes()


def load(ds: Dataset, tmp_path: Path, sweeps: int = 2) -> tuple[list[ScanTask], list[tuple[str, str, str]]]:
    return load_tasks(str(ds.write(tmp_path)), VERSION, sweeps, read_local)


def by_id(tasks: list[ScanTask]) -> dict[str, ScanTask]:
    return {t.sample_id: t for t in tasks}


def test_two_scenes_tasks_sweeps_and_labels(tmp_path: Path) -> None:
    ds = Dataset()
    tasks, rejects = load(ds, tmp_path, sweeps=2)
    assert rejects == []
    assert [t.sample_id for t in tasks] == ["sampA0", "sampA1", "sampA2", "sampB0", "sampB1"]
    got = by_id(tasks)
    root = str(tmp_path)
    assert got["sampA1"].path == f"{root}/{ds.sd('kA1')['filename']}"
    assert got["sampA0"].sweeps == () and got["sampB0"].sweeps == ()  # first keyframe of a scene
    assert [s.path for s in got["sampA1"].sweeps] == [
        f"{root}/{ds.sd(t)['filename']}" for t in ("sA2", "sA1")
    ]
    assert [s.path for s in got["sampB1"].sweeps] == [
        f"{root}/{ds.sd(t)['filename']}" for t in ("sB1", "kB0")
    ]
    assert [s.time_lag_s for s in got["sampA2"].sweeps] == pytest.approx([0.05, 0.10])
    assert got["sampA1"].label_path == f"{root}/lidarseg/{VERSION}/kA1_lidarseg.bin"
    assert all(t.label_path is None for t in tasks if t.sample_id != "sampA1")
    for task in tasks:
        assert all(len(s.sensor_to_ref) == 16 and isinstance(s, SweepRef) for s in task.sweeps)
        assert all(
            p.startswith(root + "/") and ".." not in p for p in [task.path, *(s.path for s in task.sweeps)]
        )


def test_sweeps_zero_and_more_than_history(tmp_path: Path) -> None:
    ds = Dataset()
    tasks, _ = load(ds, tmp_path, sweeps=0)
    assert len(tasks) == 5 and all(t.sweeps == () for t in tasks)
    tasks, rejects = load_tasks(str(tmp_path), VERSION, 50, read_local)
    assert rejects == []
    chain = by_id(tasks)["sampA2"].sweeps  # the chain runs through earlier keyframes up to the scene start
    assert [Path(s.path).name.split("__")[-1] for s in chain] == [
        f"{1_000_000 + 50_000 * i}.pcd.bin" for i in (5, 4, 3, 2, 1, 0)
    ]
    assert [s.time_lag_s for s in chain] == pytest.approx([0.05 * i for i in range(1, 7)])
    assert len(by_id(tasks)["sampB1"].sweeps) == 2


def test_non_lidar_channels_are_ignored(tmp_path: Path) -> None:
    ds = Dataset()
    tasks, rejects = load(ds, tmp_path)
    assert rejects == [] and all("CAM_FRONT" not in t.path and "RADAR" not in t.path for t in tasks)
    # Without the LIDAR_TOP sensor nothing is a task, and the cameras still are not.
    ds.t["sensor"][0]["channel"] = "LIDAR_FRONT"
    assert load(ds, tmp_path) == ([], [])


def test_transforms_match_devkit_composition(tmp_path: Path) -> None:
    ds = Dataset()
    tasks, _ = load(ds, tmp_path, sweeps=2)
    cs = ds.t["calibrated_sensor"][0]
    for sweep, token in zip(by_id(tasks)["sampA2"].sweeps, ("sA4", "sA3"), strict=True):
        want = sweep_transform(cs, ds.pose("kA2"), cs, ds.pose(token))
        np.testing.assert_array_equal(np.reshape(sweep.sensor_to_ref, (4, 4)), want)
        # Independent check: inverse matrices via np.linalg.inv, rotations via cos/sin.
        ref_pose, sw_pose = ds.pose("kA2"), ds.pose(token)
        cs_m = yaw_tf(-math.pi / 2, tuple(cs["translation"]))
        ref_m = yaw_tf(2 * math.asin(ref_pose["rotation"][3]), tuple(ref_pose["translation"]))
        sw_m = yaw_tf(2 * math.asin(sw_pose["rotation"][3]), tuple(sw_pose["translation"]))
        indep = np.linalg.inv(cs_m) @ np.linalg.inv(ref_m) @ sw_m @ cs_m
        np.testing.assert_allclose(want, indep, atol=1e-12)


@pytest.mark.parametrize(
    ("root", "name", "want"),
    [
        ("/data/nus", "samples/a.bin", "/data/nus/samples/a.bin"),
        ("/data/nus/", "./samples//x/../a.bin", "/data/nus/samples/a.bin"),
        ("gs://bucket/nus", "sweeps/L/a.bin", "gs://bucket/nus/sweeps/L/a.bin"),
        ("gs://bucket/nus/", "a/../b.bin", "gs://bucket/nus/b.bin"),
        ("/", "a.bin", "/a.bin"),
        ("rel/root", "a.bin", "rel/root/a.bin"),
    ],
)
def test_join_under_root(root: str, name: str, want: str) -> None:
    assert join_under_root(root, name) == want


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("../../etc/passwd", "outside_root"),
        ("samples/../../x.bin", "outside_root"),
        ("..", "outside_root"),
        ("/etc/passwd", "outside_root"),
        ("gs://other/x.bin", "outside_root"),
        ("file:///etc/passwd", "outside_root"),
        ("", "bad_table"),
        (".", "bad_table"),
        ("samples/..", "bad_table"),
        ("a\x00b", "bad_table"),
        (None, "bad_table"),
        (3, "bad_table"),
    ],
)
def test_join_under_root_refuses(name: object, reason: str) -> None:
    with pytest.raises(RejectError) as err:
        join_under_root("gs://bucket/nus", name)
    assert err.value.reason == reason


def _reasons(rejects: list[tuple[str, str, str]]) -> list[str]:
    return [r[1] for r in rejects]


@pytest.mark.parametrize("bad", ["../../etc/passwd", "/etc/passwd", "gs://elsewhere/k.pcd.bin"])
def test_keyframe_outside_root(tmp_path: Path, bad: str) -> None:
    ds = Dataset()
    ds.sd("kA1")["filename"] = bad
    tasks, rejects = load(ds, tmp_path)
    assert _reasons(rejects) == ["outside_root"] and "sampA1" not in by_id(tasks)
    path, _, detail = rejects[0]
    assert path == f"{tmp_path}/{VERSION}/sample_data.json#kA1" and repr(bad) in detail


def test_sweep_and_label_outside_root(tmp_path: Path) -> None:
    ds = Dataset()
    ds.sd("sA3")["filename"] = "../../etc/passwd"
    ds.t["lidarseg"][0]["filename"] = "/etc/shadow"
    tasks, rejects = load(ds, tmp_path, sweeps=2)
    assert _reasons(rejects) == ["outside_root", "outside_root"]
    assert {r[0] for r in rejects} == {f"{tmp_path}/{ds.sd(k)['filename']}" for k in ("kA1", "kA2")}
    assert any("sweep chain of kA2" in r[2] for r in rejects) and any(
        "lidarseg of kA1" in r[2] for r in rejects
    )
    assert set(by_id(tasks)) == {"sampA0", "sampB0", "sampB1"}
    tasks, rejects = load(ds, tmp_path, sweeps=1)  # sA3 is beyond kA2's one sweep: no longer read
    assert _reasons(rejects) == ["outside_root"] and "sampA2" in by_id(tasks)


def test_duplicate_sample_data_token(tmp_path: Path) -> None:
    ds = Dataset()
    ds.t["sample_data"].append(dict(ds.sd("kA1"), filename="samples/LIDAR_TOP/copy.pcd.bin"))
    tasks, rejects = load(ds, tmp_path)
    copy = f"{tmp_path}/samples/LIDAR_TOP/copy.pcd.bin"
    assert rejects == [(copy, "duplicate_id", "sample_data token kA1 appears more than once")]
    assert by_id(tasks)["sampA1"].path.endswith(ds.sd("kA1")["filename"])  # the first record wins


def test_two_keyframes_with_one_sample_token(tmp_path: Path) -> None:
    ds = Dataset()
    ds.sd("kB1")["sample_token"] = "sampA1"
    tasks, rejects = load(ds, tmp_path)
    assert _reasons(rejects) == ["duplicate_id"]
    assert rejects[0][0].endswith(ds.sd("kB1")["filename"]) and "sampA1" in rejects[0][2]
    assert by_id(tasks)["sampA1"].path.endswith(ds.sd("kA1")["filename"])  # first in table order wins


def test_sweep_reached_twice_through_a_duplicated_token(tmp_path: Path) -> None:
    ds = Dataset()
    ds.t["sample_data"].append(dict(ds.sd("sA2")))
    tasks, rejects = load(ds, tmp_path)
    assert _reasons(rejects) == ["bad_table"] and "appears twice" in rejects[0][2]
    assert "sampA1" not in by_id(tasks) and "sampA2" in by_id(tasks)


@pytest.mark.parametrize(
    ("token", "change", "needle"),
    [
        ("sA2", {"prev": "no-such-token"}, "not a known sample_data token"),
        ("sA2", {"prev": "camA0"}, "not a LIDAR_TOP record"),
        ("sA1", {"prev": "kA1"}, "not earlier"),  # a cycle kA1 -> sA2 -> sA1 -> kA1
        ("sA1", {"timestamp": 1_150_000}, "not earlier"),
        ("sA2", {"timestamp": "1050000"}, "timestamp"),
        ("sA2", {"ego_pose_token": "ghost"}, "unknown ego_pose token"),
        ("sA2", {"calibrated_sensor_token": "ghost"}, "not a LIDAR_TOP record"),
        ("sA2", {"prev": None}, "mistyped keys ['prev']"),
    ],
)
def test_broken_sweep_chain_rejects_the_sample(tmp_path: Path, token: str, change: dict, needle: str) -> None:
    ds = Dataset()
    ds.sd(token).update(change)
    tasks, rejects = load(ds, tmp_path, sweeps=5)
    assert rejects and {r[1] for r in rejects} == {"bad_table"}
    assert all(needle in r[2] for r in rejects), rejects
    assert {"sampA0", "sampB0", "sampB1"} <= set(by_id(tasks)) and "sampA1" not in by_id(tasks)
    assert len(tasks) + len(rejects) == 5


def test_malformed_sweep_record(tmp_path: Path) -> None:
    ds = Dataset()
    del ds.sd("sA4")["prev"]  # every record read is checked whole, even the last one of the chain
    tasks, rejects = load(ds, tmp_path, sweeps=1)
    assert _reasons(rejects) == ["bad_table"] and "sample_data sA4 lacks keys ['prev']" in rejects[0][2]
    tasks, rejects = load(ds, tmp_path, sweeps=0)
    assert rejects == [] and len(tasks) == 5


def test_sweep_with_unclassifiable_keyframe_flag(tmp_path: Path) -> None:
    ds = Dataset()
    ds.sd("sA2")["is_key_frame"] = 0  # could be a keyframe: rejected itself, and breaks kA1's chain
    tasks, rejects = load(ds, tmp_path, sweeps=1)
    assert rejects == [
        (
            f"{tmp_path}/{ds.sd('kA1')['filename']}",
            "bad_table",
            "sweep chain of kA1: sample_data sA2 has mistyped keys ['is_key_frame']",
        ),
        (
            f"{tmp_path}/{VERSION}/sample_data.json#sA2",
            "bad_table",
            "sample_data sA2 has mistyped keys ['is_key_frame']",
        ),
    ]
    assert len(tasks) == 4


@pytest.mark.parametrize(
    "rotation",
    [[0, 0, 0, 0], [1, 0, 0], [float("nan"), 0, 0, 1], ["1", 0, 0, 0], None, [1, 0, 0, float("inf")]],
)
def test_malformed_pose_quaternion(tmp_path: Path, rotation: object) -> None:
    ds = Dataset()
    ds.pose("sA3")["rotation"] = rotation
    tasks, rejects = load(ds, tmp_path, sweeps=2)
    assert [(r[0], r[1]) for r in rejects] == [(f"{tmp_path}/{ds.sd('kA2')['filename']}", "bad_table")]
    assert "ep_sA3" in rejects[0][2] and "quaternion" in rejects[0][2]
    ds.pose("kB0")["rotation"] = rotation  # a keyframe's own pose is checked even with no sweeps
    tasks, rejects = load(ds, tmp_path, sweeps=0)
    assert _reasons(rejects) == ["bad_table"] and "sampB0" not in by_id(tasks)


def test_malformed_calibration_and_translation(tmp_path: Path) -> None:
    ds = Dataset()
    ds.t["calibrated_sensor"][0]["translation"] = [0.94, 0.0]
    tasks, rejects = load(ds, tmp_path)
    assert tasks == [] and _reasons(rejects) == ["bad_table"] * 5
    assert all("translation" in r[2] for r in rejects)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"timestamp": None}, "timestamp"),
        ({"timestamp": True}, "timestamp"),
        ({"sample_token": ""}, "empty sample_token"),
        ({"sample_token": 5}, "mistyped keys ['sample_token']"),
        ({"is_key_frame": "true"}, "mistyped"),
        ({"ego_pose_token": "ghost"}, "unknown ego_pose token"),
    ],
)
def test_malformed_keyframe_record(tmp_path: Path, change: dict, needle: str) -> None:
    ds = Dataset()
    ds.sd("kA1").update(change)
    tasks, rejects = load(ds, tmp_path)
    assert _reasons(rejects) == ["bad_table"] and needle in rejects[0][2]
    assert len(tasks) == 4


@pytest.mark.parametrize("key", ["token", "sample_token", "ego_pose_token", "filename", "timestamp", "prev"])
def test_keyframe_missing_keys(tmp_path: Path, key: str) -> None:
    ds = Dataset()
    del ds.sd("kA1")[key]
    tasks, rejects = load(ds, tmp_path)
    assert _reasons(rejects) == ["bad_table"] and f"'{key}'" in rejects[0][2]
    assert rejects[0][0].startswith(f"{tmp_path}/{VERSION}/sample_data.json#") and len(tasks) == 4


def test_unclassifiable_records(tmp_path: Path) -> None:
    ds = Dataset()
    ds.sd("kA1")["calibrated_sensor_token"] = "ghost"  # keyframe of an unknown sensor: cannot tell
    ds.sd("sA1")["calibrated_sensor_token"] = "ghost"  # a sweep: only matters through a chain
    ds.t["sample_data"].append(["not", "a", "record"])
    ds.t["sample_data"].append({"token": "kX", "calibrated_sensor_token": "cs_lidar"})
    tasks, rejects = load(ds, tmp_path, sweeps=0)
    n = len(ds.t["sample_data"])
    table = f"{tmp_path}/{VERSION}/sample_data.json"
    missing = ["sample_token", "ego_pose_token", "filename", "timestamp", "is_key_frame", "prev"]
    assert rejects == [
        (f"{table}#[{n - 2}]", "bad_table", f"sample_data [{n - 2}] is not a JSON object"),
        (f"{table}#kA1", "bad_table", "sample_data kA1: unknown sensor channel"),
        (f"{table}#kX", "bad_table", f"sample_data kX lacks keys {missing}"),
    ]
    assert len(tasks) == 4


def test_lidarseg_table_problems(tmp_path: Path) -> None:
    ds = Dataset()
    ds.t["lidarseg"] += [
        {"token": "ls_bad", "filename": "x.bin"},
        dict(ds.t["lidarseg"][0], token="ls_again"),
    ]
    ds.t["lidarseg"].append({"token": "ls_sweep", "sample_data_token": "sA1", "filename": "lidarseg/s.bin"})
    tasks, rejects = load(ds, tmp_path)
    assert sorted(_reasons(rejects)) == ["bad_table", "bad_table"]
    assert {r[0] for r in rejects} == {
        f"{tmp_path}/{VERSION}/lidarseg.json#[1]",
        f"{tmp_path}/{ds.sd('kA1')['filename']}",
    }
    assert "sampA1" not in by_id(tasks) and len(tasks) == 4


def test_every_reason_is_in_the_vocabulary(tmp_path: Path) -> None:
    ds = Dataset()
    ds.sd("kA0")["filename"] = "../../etc/passwd"
    ds.sd("kB1")["sample_token"] = "sampB0"
    ds.pose("sA2")["rotation"] = [0, 0, 0, 0]
    tasks, rejects = load(ds, tmp_path)
    assert sorted(_reasons(rejects)) == ["bad_table", "duplicate_id", "outside_root"]
    assert all(r[1] in REJECT_REASONS and isinstance(r[2], str) and r[2] for r in rejects)
    assert len(tasks) + len(rejects) == 5  # scanned keyframes = accepted + rejected


def test_lidarseg_table_is_optional(tmp_path: Path) -> None:
    ds = Dataset()
    ds.write(tmp_path, lidarseg=False)
    tasks, rejects = load_tasks(str(tmp_path), VERSION, 1, read_local)
    assert rejects == [] and len(tasks) == 5 and all(t.label_path is None for t in tasks)


@pytest.mark.parametrize("table", ["sample_data", "calibrated_sensor", "sensor", "ego_pose"])
def test_missing_or_corrupt_table_is_fatal(tmp_path: Path, table: str) -> None:
    Dataset().write(tmp_path)
    target = tmp_path / VERSION / f"{table}.json"
    target.write_text('{"token": "not a list"}')
    with pytest.raises(ValueError, match="not a JSON list"):
        load_tasks(str(tmp_path), VERSION, 1, read_local)
    target.write_bytes(b'[{"token": ')
    with pytest.raises(ValueError, match="not valid JSON"):
        load_tasks(str(tmp_path), VERSION, 1, read_local)
    target.unlink()
    with pytest.raises(ValueError, match=f"{table}.json not found"):
        load_tasks(str(tmp_path), VERSION, 1, read_local)


def test_corrupt_lidarseg_table_is_fatal(tmp_path: Path) -> None:
    Dataset().write(tmp_path)
    (tmp_path / VERSION / "lidarseg.json").write_bytes(b"\xff\xfe garbage")
    with pytest.raises(ValueError, match="lidarseg.json is not valid JSON"):
        load_tasks(str(tmp_path), VERSION, 1, read_local)


def test_unreadable_table_is_fatal(tmp_path: Path) -> None:
    def read_bytes(path: str, limit: int | None = None) -> bytes:
        raise PermissionError(13, "denied", path)

    with pytest.raises(ValueError, match="could not be read"):
        load_tasks(str(tmp_path), VERSION, 1, read_bytes)


@pytest.mark.parametrize(
    ("version", "sweeps"), [("../v1.0-test", 1), ("", 1), ("..", 1), (VERSION, -1), (VERSION, 1.5)]
)
def test_bad_arguments(tmp_path: Path, version: str, sweeps: object) -> None:
    Dataset().write(tmp_path)
    with pytest.raises(ValueError):
        load_tasks(str(tmp_path), version, sweeps, read_local)  # type: ignore[arg-type]


def test_uri_dataroot_through_injected_reader() -> None:
    ds = Dataset()
    tasks, rejects = load_tasks("gs://bucket/nuscenes/", VERSION, 2, ds.memory_reader("gs://bucket/nuscenes"))
    assert rejects == [] and len(tasks) == 5
    kf = by_id(tasks)["sampA2"]
    assert kf.path == f"gs://bucket/nuscenes/{ds.sd('kA2')['filename']}"
    assert kf.sweeps[0].path == f"gs://bucket/nuscenes/{ds.sd('sA4')['filename']}"
    assert by_id(tasks)["sampA1"].label_path == f"gs://bucket/nuscenes/lidarseg/{VERSION}/kA1_lidarseg.bin"


def test_end_to_end_aggregation_on_written_files(tmp_path: Path) -> None:
    ds = Dataset()
    tasks, _ = load(ds, tmp_path, sweeps=2)
    task = by_id(tasks)["sampA1"]
    key = np.frombuffer(read_local(task.path), np.float32).reshape(-1, 5)
    sweeps = [np.frombuffer(read_local(s.path), np.float32).reshape(-1, 5) for s in task.sweeps]
    tfs = [np.reshape(s.sensor_to_ref, (4, 4)) for s in task.sweeps]
    out = aggregate(key, sweeps, tfs)
    kept = [remove_close(s) for s in sweeps]
    assert out.shape == (len(key) + sum(len(k) for k in kept), 5)
    np.testing.assert_array_equal(out[: len(key)], key)  # the keyframe is never filtered or moved
    row = len(key)
    for k, tf in zip(kept, tfs, strict=True):
        moved = (k[:, :3].astype(np.float64) @ tf[:3, :3].T + tf[:3, 3]).astype(np.float32)
        np.testing.assert_array_equal(out[row : row + len(k), :3], moved)
        np.testing.assert_array_equal(out[row : row + len(k), 3:], k[:, 3:])
        row += len(k)
    check_labels(read_local(task.label_path), len(key))


def test_real_lidarseg_pair_through_the_tables(realdata: Path) -> None:
    """Real keyframe + real label file, with tables served from memory (realdata is read-only)."""
    root = str(realdata / "nuscenes_lidarseg_pr2859")
    keyfile = "samples/LIDAR_TOP/n015-2018-08-02-17-16-37+0800__LIDAR_TOP__1533201470948018.pcd.bin"
    sd_token = "5f6c1e0a0c3b444b97e78d2aa3fa34d2"
    ds = Dataset()
    ds.t["sample_data"] = [
        dict(ds.sd("kA0"), token=sd_token, sample_token="real", filename=keyfile, prev=""),
    ]
    ds.t["lidarseg"] = [
        {
            "token": "ls",
            "sample_data_token": sd_token,
            "filename": f"lidarseg/v1.0-trainval/{sd_token}_lidarseg.bin",
        }
    ]
    tables = ds.memory_reader(root)

    def read_bytes(path: str, limit: int | None = None) -> bytes:
        return tables(path) if f"/{VERSION}/" in path else read_local(path)

    tasks, rejects = load_tasks(root, VERSION, 9, read_bytes)
    assert rejects == [] and [t.sample_id for t in tasks] == ["real"] and tasks[0].sweeps == ()
    points = np.frombuffer(read_bytes(tasks[0].path), np.float32).reshape(-1, 5)
    labels = read_bytes(tasks[0].label_path)
    check_labels(labels, len(points))
    with pytest.raises(RejectError, match="label_mismatch"):
        check_labels(labels[:-3], len(points))


def test_real_lyft_tables_in_nuscenes_schema(realdata: Path) -> None:
    """Real (truncated) Lyft tables: float timestamps, three lidars, prev tokens cut from the subset."""
    root = str(realdata / "lyft" / "v1.01-train")
    tasks, rejects = load_tasks(root, "v1.01-train", 0, read_local)
    assert rejects == [] and len(tasks) == 1  # LIDAR_FRONT_LEFT/RIGHT and the cameras are ignored
    assert tasks[0].path == f"{root}/lidar/host-a101_lidar1_1240710385903083166.bin"
    assert tasks[0].sweeps == () and tasks[0].label_path is None
    assert tasks[0].format == "nuscenes_bin"  # Lyft's *.bin: float32 x 5, not KITTI's x 4
    tasks, rejects = load_tasks(root, "v1.01-train", 1, read_local)
    assert tasks == [] and [(r[0], r[1]) for r in rejects] == [
        (f"{root}/lidar/host-a101_lidar1_1240710385903083166.bin", "bad_table")
    ]
    assert "not a known sample_data token" in rejects[0][2]

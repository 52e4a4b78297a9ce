"""Tests of the synthetic nuScenes generator: scene/lidar model, tables, sizes, and the Beam pipeline."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from lidarshard.transforms.synth import dataroot as synth
from lidarshard.transforms.synth import nuscenes_tables as tb
from lidarshard.transforms.synth import scene as sc
from tests.helpers import BEAM_TEST_FLAGS

# ---------------------------------------------------------------------------------------------- scene


def _frame(kind: str, speed: float, t: float = 0.5, seed: int = 1):
    spec = sc.SceneSpec(seed, 0, kind, speed, 21)
    boxes = sc.scene_layout(spec, np.random.default_rng([seed, 0]))
    points, labels = synth.sweep(spec, boxes, t, np.random.default_rng([seed, 0, 1, 10]))
    return spec, boxes, points, labels


@pytest.fixture(scope="module", params=[("urban", 0.0), ("suburban", 6.0), ("open", 3.0)], ids=str)
def frame(request):
    return _frame(*request.param)


def test_frame_layout_matches_nuscenes(frame):
    _, _, points, labels = frame
    assert points.shape == (synth.POINTS_PER_SWEEP, 5) == (34688, 5) and points.dtype == np.float32
    assert labels.shape == (34688,) and labels.dtype == np.uint8
    assert np.array_equal(points[:, 4], np.tile(np.arange(32, dtype=np.float32), 1084))  # firing order
    intensity = points[:, 3]
    assert np.array_equal(intensity, np.round(intensity)) and intensity.min() >= 0 and intensity.max() <= 255
    assert set(np.unique(labels)) <= set(range(32)) and np.isfinite(points).all()


def test_ring_elevations_and_sensor_height(frame):
    spec, _, points, labels = frame
    if spec.speed == 0:  # moving: motion compensation bends elevations as seen from the end pose
        xyz, ring = points[:, :3].astype(np.float64), points[:, 4].astype(int)
        rng_m = np.linalg.norm(xyz, axis=1)
        far = rng_m > 2.0
        elev = np.degrees(np.arcsin(xyz[far, 2] / rng_m[far]))
        med = np.array([np.median(elev[ring[far] == r]) for r in range(32)])
        assert np.allclose(med, synth.LIDAR_TOP.elevations_deg, atol=0.05)  # -30.67 .. +10.67 deg
    ground = np.isin(labels, [sc.ROAD, sc.TERRAIN])
    assert abs(np.median(points[ground, 2]) + 1.84) < 0.02  # sensor 1.84 m above flat ground


def test_near_points_are_ego_and_concentrate_in_low_rings(frame):
    spec, _, points, labels = frame
    dist = np.linalg.norm(points[:, :3], axis=1)
    near = dist < 1.0
    assert np.all(labels[near] == sc.EGO)  # roof hits and no-returns, as real lidarseg labels them
    assert dist[labels == sc.EGO].max() < 1.0 + spec.speed * sc.SWEEP_PERIOD_S  # + motion compensation
    assert 0.12 < near.mean() < 0.32  # real keyframe: 0.23
    per_ring = near.reshape(1084, 32).mean(axis=0)
    assert per_ring[:5].min() > 0.4 and per_ring[8:20].max() < 0.1


def test_no_returns_trail_behind_a_moving_sensor():
    """Motion compensation puts no-return placeholders at the origin's past positions (-y)."""
    for speed in (0.0, 8.0):
        _, _, points, labels = _frame("open", speed)
        placeholder = (labels == sc.EGO) & (np.abs(points[:, 0]) < 1e-3) & (np.abs(points[:, 2]) < 1e-3)
        y = points[placeholder, 1]
        assert placeholder.sum() > 500
        assert y.max() <= 1e-6 and y.min() >= -speed * sc.SWEEP_PERIOD_S - 1e-3
        if speed > 0:
            assert y.min() < -0.8 * speed * sc.SWEEP_PERIOD_S


def _to_road(spec: sc.SceneSpec, points: np.ndarray, t: float) -> np.ndarray:
    """Sensor-frame points of the sweep at ``t`` -> road frame."""
    x, y, yaw = (float(v[0]) for v in sc.ego_pose(spec, np.array([t])))
    ox, oy = x + synth.LIDAR_TRANSLATION[0] * np.cos(yaw), y + synth.LIDAR_TRANSLATION[0] * np.sin(yaw)
    px, py = points[:, 0].astype(np.float64), points[:, 1].astype(np.float64)
    return np.stack(
        [ox + px * np.sin(yaw) + py * np.cos(yaw), oy - px * np.cos(yaw) + py * np.sin(yaw),
         synth.LIDAR_TRANSLATION[2] + points[:, 2]], axis=1)  # fmt: skip


def _box_distance(p: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """(N,) distance from each point to the nearest of the boxes (0 inside)."""
    d = np.maximum(0, np.maximum(lo[None] - p[:, None], p[:, None] - hi[None]))
    return np.linalg.norm(d, axis=2).min(axis=1)


def test_static_points_lie_on_the_scene_geometry():
    spec, boxes, points, labels = _frame("urban", 7.0, t=0.7)
    road = _to_road(spec, points, 0.7)
    ground = np.isin(labels, [sc.ROAD, sc.TERRAIN])
    assert np.quantile(np.abs(road[ground, 2]), 0.99) < 0.03
    built = labels == sc.MANMADE
    keep = boxes.label == sc.MANMADE
    dist = _box_distance(road[built], boxes.lo[keep], boxes.hi[keep])
    assert np.quantile(dist, 0.99) < 0.06


def test_table_poses_align_sweeps_on_the_static_geometry():
    """multisweep with the written ego poses puts an old sweep's walls back on the same walls."""
    cfg = synth.SynthConfig(seed=2, scenes=2, keyframes_per_scene=2, labels=True)
    scene, files = synth.build_scene(cfg, 1), dict(synth.scene_files(cfg, 1))
    info = scene.info
    assert scene.spec.speed > 1.0
    clouds = []
    for f in (10, 0):  # reference keyframe first, then the one 0.5 s (and metres) earlier
        points = np.frombuffer(files[info.filename(f)], dtype="<f4").reshape(-1, 5)
        labels = np.frombuffer(files[tb.lidarseg_filename(cfg.version, info.sample_data_token(f))], np.uint8)
        clouds.append(points[labels == sc.MANMADE])
    poses = [(info.translations[f], info.rotations[f]) for f in (10, 0)]
    agg = synth.multisweep(clouds, poses, (info.lidar_translation, info.lidar_rotation))
    road = _to_road(scene.spec, agg, float(scene.times[10]))
    keep = scene.boxes.label == sc.MANMADE
    assert np.quantile(_box_distance(road, scene.boxes.lo[keep], scene.boxes.hi[keep]), 0.99) < 0.06


# --------------------------------------------------------------------------------------------- tables


def test_tokens_are_stable_32_hex():
    """blake2b of the joined parts: the same in every process (never Python's salted hash())."""
    assert tb.token(0, "sample", 0, 0) == hashlib.blake2b(b"0/sample/0/0", digest_size=16).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{32}", tb.token("a", 1))
    assert tb.token("a", 1) == tb.token("a", "1") != tb.token("a", 2)


@pytest.fixture(scope="module")
def tiny_cfg() -> synth.SynthConfig:
    return synth.SynthConfig(seed=5, scenes=2, keyframes_per_scene=3, labels=True)


def test_scene_tables_chain_and_timing(tiny_cfg):
    tables = synth.scene_tables(tiny_cfg, 1)
    sd, samples = tables["sample_data"], tables["sample"]
    assert len(sd) == tiny_cfg.frames_per_scene == 21 and len(samples) == 3
    assert [r["prev"] for r in sd[1:]] == [r["token"] for r in sd[:-1]]
    assert [r["next"] for r in sd[:-1]] == [r["token"] for r in sd[1:]] and sd[0]["prev"] == sd[-1][
        "next"
    ] == ""
    stamps = np.array([r["timestamp"] for r in sd])
    assert all(isinstance(r["timestamp"], int) for r in sd)
    assert np.all(np.abs(np.diff(stamps) - 50_000) <= 500)
    keys = [i for i, r in enumerate(sd) if r["is_key_frame"]]
    assert keys == [0, 10, 20]
    for i, r in enumerate(sd):
        assert r["filename"].startswith("samples/LIDAR_TOP/" if i in keys else "sweeps/LIDAR_TOP/")
        assert r["filename"].endswith(f"__LIDAR_TOP__{r['timestamp']}.pcd.bin")
        assert r["sample_token"] == samples[-(-i // 10)]["token"]  # this keyframe or the next
        assert re.fullmatch(r"[0-9a-f]{32}", r["token"]) and r["ego_pose_token"] == r["token"]
    assert [s["timestamp"] for s in samples] == [int(stamps[k]) for k in keys]
    assert tables["scene"][0]["first_sample_token"] == samples[0]["token"] and samples[0]["prev"] == ""
    assert [r["sample_data_token"] for r in tables["lidarseg"]] == [sd[k]["token"] for k in keys]


def test_ego_moves_in_moving_scenes_only(tiny_cfg):
    for index in (0, 1):
        scene = synth.build_scene(tiny_cfg, index)
        trans = np.array(scene.info.translations)
        step = np.linalg.norm(np.diff(trans, axis=0), axis=1) / np.diff(scene.times)
        assert np.allclose(step, scene.spec.speed, rtol=0.02, atol=1e-9)
        assert (scene.spec.speed == 0) == (index % 4 == 0)
        quat = np.array(scene.info.rotations)
        assert np.allclose(np.linalg.norm(quat, axis=1), 1.0)


def test_static_tables_and_json(tiny_cfg):
    tables = synth.static_tables(tiny_cfg)
    assert set(tables) == set(tb.TABLES) | {"lidarseg"}
    assert [c["index"] for c in tables["category"]] == list(range(32))
    assert tables["category"][31]["name"] == "vehicle.ego" and tables["instance"] == []
    assert json.loads(tb.table_json(tables["category"])) == tables["category"]
    assert tb.table_json([]) == b"[]\n"


def test_merge_map_records_and_png():
    a = {"token": "m1", "filename": "maps/m1.png", "category": "semantic_prior", "log_tokens": ["l1"]}
    b = {**a, "log_tokens": ["l2"]}
    c = {**a, "token": "m2", "log_tokens": ["l3"]}
    merged = tb.merge_map_records([a, b, c])
    assert [(m["token"], m["log_tokens"]) for m in merged] == [("m1", ["l1", "l2"]), ("m2", ["l3"])]
    assert a["log_tokens"] == ["l1"]  # inputs untouched
    png = tb.blank_png()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png.endswith(b"IEND\xaeB`\x82")


def test_config_validation():
    for bad in ({"scenes": 0}, {"seed": -1}, {"keyframes_per_scene": 0}, {"sweeps_per_keyframe": -1},
                {"version": "a/b"}, {"version": ""}):  # fmt: skip
        with pytest.raises(ValueError):
            synth.SynthConfig(**bad)
    assert synth.SynthConfig(keyframes_per_scene=4, sweeps_per_keyframe=0).frames_per_scene == 4


# ------------------------------------------------------------------------------------ measurement


@settings(max_examples=30, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 200), st.just(3)), elements=st.floats(-5, 5, width=32)))
def test_count_voxels_matches_unique(xyz):
    ref = len(np.unique(np.floor(xyz.astype(np.float64) / 0.05).astype(np.int64), axis=0))
    assert synth.count_voxels(xyz) == ref


def test_multisweep_moves_points_into_the_reference_frame():
    calib = (synth.LIDAR_TRANSLATION, synth.LIDAR_ROTATION)
    cloud = np.array([[0.0, 5.0, 0.0], [0.5, 0.5, 0.0]], dtype=np.float32)  # second: inside remove_close box
    ref_pose = ((0.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0))
    old_pose = ((-2.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0))  # ego 2 m behind, same heading
    out = synth.multisweep([cloud, cloud], [ref_pose, old_pose], calib)
    assert np.allclose(out, [[0.0, 5.0, 0.0], [0.0, 3.0, 0.0]], atol=1e-6)  # sensor y = ego forward


# ------------------------------------------------------------------------------------------ sizes


@pytest.fixture(scope="module")
def sizes() -> list[dict]:
    """Scenes 0 (urban, stopped), 1 (suburban), 2 (open), 3 (urban): 2 keyframes each."""
    cfg = synth.SynthConfig(seed=0, scenes=4, keyframes_per_scene=2)
    return [row for i in range(4) for row in synth.sample_sizes(cfg, i)]


def test_sizes_match_real_nuscenes(sizes):
    first, full = sizes[0::2], sizes[1::2]
    assert [r["frames"] for r in first] == [1] * 4 and [r["frames"] for r in full] == [10] * 4
    for r in sizes:
        assert 20_000 <= r["keyframe_voxels"] <= 28_500, r
    for r in full:
        assert 240_000 <= r["points"] <= 300_000, r
        ratio = r["voxels"] / r["keyframe_voxels"]
        assert (3.0 <= ratio <= 5.5) if r["speed"] == 0 else (5.5 <= ratio <= 9.0), r
    assert {r["kind"] for r in full} == set(sc.SCENE_KINDS) and min(r["speed"] for r in full) == 0


def test_scene_files_are_deterministic_per_seed():
    cfg = synth.SynthConfig(seed=3, scenes=1, keyframes_per_scene=1, labels=True)
    a, b = list(synth.scene_files(cfg, 0)), list(synth.scene_files(cfg, 0))
    assert a == b and [p for p, _ in a][1].startswith("lidarseg/v1.0-synth/")
    other = list(
        synth.scene_files(synth.SynthConfig(seed=4, scenes=1, keyframes_per_scene=1, labels=True), 0)
    )
    assert a[0][1] != other[0][1]


# --------------------------------------------------------------------------------------- pipeline


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _aggregate_from_tables(root: Path, version: str, nsweeps: int = 10) -> list[tuple[int, int, int]]:
    """(frames, points, voxels) of every sample's multisweep, read back from the written files."""
    tables = {t: json.loads((root / version / f"{t}.json").read_text()) for t in ("sample_data", "ego_pose")}
    sd = {r["token"]: r for r in tables["sample_data"]}
    pose = {r["token"]: (r["translation"], r["rotation"]) for r in tables["ego_pose"]}
    calib = json.loads((root / version / "calibrated_sensor.json").read_text())[0]
    out = []
    for key in (r for r in tables["sample_data"] if r["is_key_frame"]):
        chain, rec = [], key
        while rec is not None and len(chain) < nsweeps:
            chain.append(rec)
            rec = sd.get(rec["prev"])
        clouds = [np.fromfile(root / r["filename"], dtype="<f4").reshape(-1, 5) for r in chain]
        agg = synth.multisweep(clouds, [pose[r["ego_pose_token"]] for r in chain],
                               (calib["translation"], calib["rotation"]))  # fmt: skip
        out.append((len(chain), len(agg), synth.count_voxels(agg)))
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, Path]:
    """The same tiny dataroot written twice: single worker, and two threads."""
    from lidarshard.pipelines.synth import run

    roots = tmp_path_factory.mktemp("a") / "out", tmp_path_factory.mktemp("b") / "out"
    args = ["--scenes", "2", "--keyframes-per-scene", "2", "--seed", "11", "--labels"]
    assert run([str(roots[0]), *args, *BEAM_TEST_FLAGS]) == 0
    extra = ["--direct_num_workers=2", "--direct_running_mode=multi_threading"]
    assert run([str(roots[1]), *args, *BEAM_TEST_FLAGS, *extra]) == 0
    return roots


def test_pipeline_writes_a_nuscenes_dataroot(written):
    root = written[0]
    files = _tree(root)
    lidar = [p for p in files if p.endswith(".pcd.bin")]
    assert len(lidar) == 2 * 11 and sum(p.startswith("samples/LIDAR_TOP/") for p in lidar) == 4
    assert all(len(files[p]) == 34688 * 20 for p in lidar)
    tables = {p.split("/")[1][:-5] for p in files if p.startswith("v1.0-synth/")}
    assert tables == set(tb.TABLES) | {"lidarseg"}
    sd = json.loads(files["v1.0-synth/sample_data.json"])
    assert sorted(r["filename"] for r in sd) == sorted(lidar)
    for rec in json.loads(files["v1.0-synth/lidarseg.json"]):
        assert len(files[rec["filename"]]) == 34688
    maps = json.loads(files["v1.0-synth/map.json"])
    assert sorted(t for m in maps for t in m["log_tokens"]) == sorted(r["token"] for r in json.loads(files[
        "v1.0-synth/log.json"]))  # fmt: skip
    assert all(m["filename"] in files for m in maps)


def test_pipeline_is_byte_identical_across_worker_counts(written):
    a, b = (_tree(r) for r in written)
    assert a.keys() == b.keys() and a == b


def test_pipeline_sizes_read_back_from_files(written):
    rows = _aggregate_from_tables(written[0], "v1.0-synth")
    assert sorted(f for f, _, _ in rows) == [1, 1, 10, 10]
    for frames, points, voxels in rows:
        if frames == 10:
            assert 240_000 <= points <= 300_000 and 80_000 <= voxels <= 230_000


def test_cli_flags_map_to_the_config_and_beam_options():
    from lidarshard.pipelines.synth import SynthOptions, parser
    from lidarshard.transforms.declare import from_flags

    parsed, beam_argv = parser().parse(
        ["out", "--scenes", "3", "--labels", "--seed=9", "--direct_num_workers=2"]
    )
    assert beam_argv == ["--direct_num_workers=2"]
    cfg = from_flags(SynthOptions, parsed).config
    assert (cfg.scenes, cfg.seed, cfg.labels, cfg.keyframes_per_scene, cfg.version) == (
        3,
        9,
        True,
        10,
        "v1.0-synth",
    )
    parsed, _ = parser().parse(["out", "--nuscenes-version", "v1.0-mini"])
    assert from_flags(SynthOptions, parsed).config.version == "v1.0-mini"


def test_cli_rejects_bad_values_and_prints_help(tmp_path, capsys):
    from lidarshard.pipelines.synth import run

    with pytest.raises(SystemExit) as exc:
        run([str(tmp_path / "x"), "--scenes", "0", *BEAM_TEST_FLAGS])
    assert exc.value.code == 2 and "--scenes: 0 is out of range" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit) as exc:
        run(["--help"])
    assert exc.value.code == 0 and "10-sweep" in capsys.readouterr().out

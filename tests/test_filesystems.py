"""INPUT and OUT as object-store URIs go through ``storage`` (``pyarrow.fs``) end to end.

``memobj://`` is ``tests.object_store.MemoryObjectStore``, an in-memory object store served through
``storage``. It behaves like gs:// and s3:// where local disks differ: a flat key space with no
directories (``exists`` of a "directory" is False, ``move`` and ``copy_file`` move single objects), so
code that only works on local paths fails here as it would on GCS. It lives in this process only, so
the pipelines run on the in-process FnApiRunner.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.pipelines import build as build_cli
from lidarshard.pipelines import scan as scan_cli
from lidarshard.transforms.io import storage
from tests.helpers import BEAM_TEST_FLAGS, make_bins
from tests.object_store import SCHEME, MemoryObjectStore

PLAN = ["--world-size", "4", "--batch-size", "2", "--cost-model", "points", "--max-reject-fraction", "0.1"]


def _keys(prefix: str) -> list[str]:
    """Object keys under ``prefix``, relative to it."""
    return sorted(k[len(prefix) :] for k in MemoryObjectStore.objects if k.startswith(prefix))


def _get(path: str) -> bytes:
    return MemoryObjectStore.objects[path][0]


def _upload(local: Path, uri: str) -> None:
    for p in sorted(local.rglob("*")):
        if p.is_file():
            storage.write_bytes(f"{uri}/{p.relative_to(local).as_posix()}", p.read_bytes())


def _plan_ids(read, epochs: int = 1, ranks: int = 4) -> list[list[str]]:
    return [
        pq.read_table(pa.BufferReader(read(schemas.plan_file(e, r)))).column("sample_id").to_pylist()
        for e in range(epochs)
        for r in range(ranks)
    ]


@pytest.fixture()
def bucket(tmp_path: Path):
    """A fresh bucket holding KITTI-style inputs at ``memobj://bucket/in``; emptied afterwards."""
    MemoryObjectStore.objects.clear()
    _upload(make_bins(tmp_path / "in"), f"{SCHEME}://bucket/in")
    yield f"{SCHEME}://bucket"
    MemoryObjectStore.objects.clear()


def test_build_reads_and_writes_object_store_uris(bucket: str, tmp_path: Path) -> None:
    out = f"{bucket}/out"
    assert build_cli.run([f"{bucket}/in", out, *PLAN, "--epochs", "2", *BEAM_TEST_FLAGS]) == 0
    keys = _keys(out + "/")
    assert schemas.SUCCESS_FILE in keys and schemas.MANIFEST_FILE in keys
    m = json.loads(_get(f"{out}/{schemas.MANIFEST_FILE}"))
    assert (m["counts"]["scanned"], m["counts"]["accepted"], m["counts"]["rejected"]) == (62, 61, 1)
    assert sorted(m["files"]) == sorted(k for k in keys if k.endswith(".parquet"))
    samples = pq.read_table(pa.BufferReader(_get(f"{out}/{schemas.samples_part(0)}")))
    assert m["path_root"] == f"{bucket}/in"  # paths stored relative to INPUT, which is recorded
    assert all("://" not in p and p.endswith(".bin") for p in samples.column("path").to_pylist())
    assert not [k for k in MemoryObjectStore.objects if ".staging-" in k or ".old-" in k]

    local = tmp_path / "local"  # the same plan as from local files: only the paths differ
    assert build_cli.run([str(tmp_path / "in"), str(local), *PLAN, "--epochs", "2", *BEAM_TEST_FLAGS]) == 0
    assert _plan_ids(lambda rel: _get(f"{out}/{rel}"), 2) == _plan_ids(
        lambda rel: (local / rel).read_bytes(), 2
    )
    assert json.loads((local / schemas.MANIFEST_FILE).read_text())["balance"] == m["balance"]


@pytest.mark.slow  # two builds; a wholesale replace is built in the fast lane locally (test_commit)
def test_rebuild_replaces_the_whole_output(bucket: str) -> None:
    out = f"{bucket}/out"
    assert build_cli.run([f"{bucket}/in", out, *PLAN, "--epochs", "3", *BEAM_TEST_FLAGS]) == 0
    assert any(k.startswith("plan/epoch-2/") for k in _keys(out + "/"))
    assert build_cli.run([f"{bucket}/in", out, *PLAN, "--epochs", "1", *BEAM_TEST_FLAGS]) == 0
    keys = _keys(out + "/")
    assert not any(k.startswith(("plan/epoch-1/", "plan/epoch-2/")) for k in keys), keys
    assert json.loads(_get(f"{out}/{schemas.MANIFEST_FILE}"))["epochs"] == 1


def test_scan_then_replan_from_samples_and_cost_model_file(bucket: str) -> None:
    scanned = f"{bucket}/scanned"
    assert scan_cli.run([f"{bucket}/in", scanned, "--max-reject-fraction", "0.1", *BEAM_TEST_FLAGS]) == 0
    assert {schemas.samples_part(0), schemas.REJECTS_FILE, schemas.SCAN_FILE} <= set(_keys(scanned + "/"))
    storage.write_bytes(
        f"{bucket}/fit.json", json.dumps({"cost_model": {"c0": 1.0, "a": 0.5, "b": 0.0}}).encode()
    )
    out = f"{bucket}/replan"
    flags = ["--world-size", "2", "--batch-size", "1", "--cost-model", f"@{bucket}/fit.json"]
    argv = [
        out,
        "--from-samples",
        f"{scanned}/{schemas.SAMPLES_DIR}",
        *flags,
        "--max-reject-fraction",
        "0.1",
    ]
    assert build_cli.run([*argv, *BEAM_TEST_FLAGS]) == 0
    m = json.loads(_get(f"{out}/{schemas.MANIFEST_FILE}"))
    assert m["cost_model"]["name"] == "linear" and m["cost_model"]["a"] == 0.5
    assert (m["counts"]["scanned"], m["counts"]["rejected"]) == (62, 1)


def test_synth_dataroot_on_object_store_builds(bucket: str) -> None:
    synth = pytest.importorskip("lidarshard.pipelines.synth")
    root = f"{bucket}/nuscenes"
    argv = [
        root,
        "--scenes",
        "1",
        "--keyframes-per-scene",
        "4",
        "--sweeps-per-keyframe",
        "1",
        *BEAM_TEST_FLAGS,
    ]
    assert synth.run(argv) in (0, None)
    out = f"{bucket}/manifest"
    flags = ["--nuscenes-version", "v1.0-synth", "--sweeps", "1", "--world-size", "2", "--batch-size", "2"]
    assert build_cli.run([root, out, *flags, *BEAM_TEST_FLAGS]) == 0
    m = json.loads(_get(f"{out}/{schemas.MANIFEST_FILE}"))
    assert m["counts"]["accepted"] == 4 and m["counts"]["rejected"] == 0
    rows = [
        r
        for rank in (0, 1)
        for r in pq.read_table(pa.BufferReader(_get(f"{out}/{schemas.plan_file(0, rank)}"))).to_pylist()
    ]
    assert m["path_root"] == root
    assert len(rows) == 4 and all(r["path"].startswith("samples/") for r in rows)
    # every keyframe but the scene's first has one previous sweep
    assert sorted(len(r["sweep_paths"]) for r in rows) == [0, 1, 1, 1]
    assert all(p.startswith("sweeps/") for r in rows for p in r["sweep_paths"])


def test_trainer_reads_manifest_and_points_from_the_object_store(bucket: str) -> None:
    """The trainer side on an object store: ManifestReader and PointCloudDataset read the manifest and
    the point files through the storage layer; the dataroot then moves to another prefix and
    ``root=`` finds it there, byte for byte the same points."""
    synth = pytest.importorskip("lidarshard.pipelines.synth")
    torch = pytest.importorskip("torch")
    from lidarshard.loaders import ManifestReader, load_points
    from lidarshard.loaders.torch import PointCloudDataset

    root = f"{bucket}/nuscenes"
    argv = [root, "--scenes", "1", "--keyframes-per-scene", "4", "--sweeps-per-keyframe", "1"]
    assert synth.run([*argv, *BEAM_TEST_FLAGS]) in (0, None)
    out = f"{bucket}/manifest"
    flags = ["--nuscenes-version", "v1.0-synth", "--sweeps", "1", "--world-size", "2", "--batch-size", "2"]
    assert build_cli.run([root, out, *flags, *BEAM_TEST_FLAGS]) == 0
    reader = ManifestReader(out, 1, 2, 0)
    batch = next(iter(reader))
    assert all(p.startswith(f"{root}/samples/") for p in batch.paths)
    dataset = PointCloudDataset(out)
    before = [dataset[i]["points"] for i in range(len(dataset))]
    assert all(p.shape[0] > 0 for p in before)
    assert load_points(batch.paths[0], None).shape[0] > 0
    moved = f"{bucket}/elsewhere/nuscenes"
    for key in [k for k in MemoryObjectStore.objects if k.startswith(root + "/")]:
        MemoryObjectStore.objects[moved + key[len(root) :]] = MemoryObjectStore.objects.pop(key)
    with pytest.raises(OSError):
        dataset[0]  # noqa: B018 - the recorded root is empty now
    again = PointCloudDataset(out, root=moved)
    assert all(torch.equal(a, again[i]["points"]) for i, a in enumerate(before))
    assert all(
        p.startswith(f"{moved}/samples/") for p in next(iter(ManifestReader(out, 1, 2, 0, root=moved))).paths
    )

"""s3:// end to end on a real S3-compatible server (moto, ``tests/s3_server.py``): a nuScenes-style
dataroot uploaded to the bucket, ``scan`` and ``build`` from s3:// to s3://, ``validate`` of the
output, and the trainer's reads from s3:// (``ManifestReader``, ``BalancedBatchSampler``,
``PointCloudDataset``) point for point against the local copy, also through a proxy that holds each
request 50 ms. Per-sample read times are printed (``-s``), never asserted.

Every process (the pipeline's and a trainer's) reads and writes s3:// through pyarrow's S3 filesystem,
configured by the AWS environment variables ``S3Server.environment()`` sets.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

pytest.register_assert_rewrite("tests.s3_server")  # before the import: also a plugin (its fixture)

from lidarshard.pipelines import cli  # noqa: E402
from lidarshard.transforms.io import storage  # noqa: E402
from tests.helpers import BEAM_TEST_FLAGS  # noqa: E402
from tests.s3_server import LatencyProxy, S3Server, upload  # noqa: E402

pytestmark = pytest.mark.slow  # a moto S3 server and builds through it

pytest_plugins = ["tests.s3_server"]

VERSION = "v1.0-synth"
PLAN = ["--world-size", "2", "--batch-size", "2", "--epochs", "2"]
SOURCE = ["--nuscenes-version", VERSION, "--sweeps", "2"]
#: Request delay of the latency case, seconds.
DELAY_S = 0.05


class Built(NamedTuple):
    dataroot: Path  # the local copy of s3://BUCKET/in
    local_out: Path  # build of the local copy
    s3_out: str  # build of s3://BUCKET/in
    s3_scan: str  # scan of s3://BUCKET/in


@pytest.fixture(scope="module")
def s3(s3_server: S3Server) -> Iterator[S3Server]:
    """The server, with the AWS variables pointing s3:// at it for this module."""
    with s3_server.environment():
        yield s3_server


@pytest.fixture(scope="module")
def built(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """A synth dataroot (1 scene, 4 keyframes, 2 sweeps each), uploaded to s3://BUCKET/in, scanned and
    built there; the same build of the local copy beside it."""
    tmp = tmp_path_factory.mktemp("s3")
    root = tmp / "nuscenes"
    synth = ["--scenes", "1", "--keyframes-per-scene", "4", "--sweeps-per-keyframe", "2"]
    assert cli.main(["synth", str(root), *synth, *BEAM_TEST_FLAGS]) == 0
    assert upload(s3.filesystem(), root, f"{s3.bucket}/in") > 0
    inp, out, scan = s3.uri("in"), s3.uri("out"), s3.uri("scan")
    assert cli.main(["scan", inp, scan, *SOURCE, *BEAM_TEST_FLAGS]) == 0
    assert cli.main(["build", inp, out, *SOURCE, *PLAN, *BEAM_TEST_FLAGS]) == 0
    assert cli.main(["build", str(root), str(tmp / "out"), *SOURCE, *PLAN, *BEAM_TEST_FLAGS]) == 0
    return Built(root, tmp / "out", out, scan)


def test_environment_is_restored_and_no_filesystem_outlives_it(s3: S3Server) -> None:
    before = dict(os.environ)
    with LatencyProxy(s3.port, 0.0) as proxy:
        with s3.environment(proxy.endpoint):
            assert os.environ["AWS_ENDPOINT_URL"] == proxy.endpoint
            fs, path = storage.arrow_filesystem(s3.uri("in", "x.bin"))
            assert path == f"{s3.bucket}/in/x.bin"  # the bucket is part of the path in pyarrow's S3
            storage.write_bytes(s3.uri("proxied", "x.bin"), b"abc")
        assert proxy.requests > 0
    assert dict(os.environ) == before
    assert storage.arrow_filesystem(s3.uri("in", "x.bin"))[0] is not fs  # a new one, on the server
    assert storage.read_bytes(s3.uri("proxied", "x.bin")) == b"abc"


def test_scan_and_build_write_s3(s3: S3Server, built: Built, capsys: pytest.CaptureFixture[str]) -> None:
    from lidarshard.loaders import load_manifest, read_samples

    keys = set(storage.list_files(built.s3_out))  # every object, directory markers included
    assert {"_SUCCESS", "_manifest.json", "rejects.parquet"} <= keys
    assert all(k and not k.endswith("/") for k in keys)
    assert not [k for k in storage.list_files(s3.uri()) if ".staging" in k]  # nothing left beside OUT
    m, local = load_manifest(built.s3_out), load_manifest(built.local_out)
    assert m.path_root == s3.uri("in")
    assert m.counts == local.counts and m.steps_per_epoch == local.steps_per_epoch
    assert storage.read_json(f"{built.s3_scan}/_scan.json")["counts"]["scanned"] == m.counts.scanned == 4
    columns = ["sample_id", "path", "sweep_paths", "cost", "bucket"]
    assert read_samples(built.s3_out, columns).equals(read_samples(built.local_out, columns))
    capsys.readouterr()
    assert cli.main(["validate", built.s3_out]) == 0
    assert capsys.readouterr().out.startswith(f"OK {built.s3_out}")


def test_trainer_reads_plan_from_s3(built: Built) -> None:
    pytest.importorskip("torch")
    from lidarshard.loaders import ManifestReader
    from lidarshard.loaders.torch import BalancedBatchSampler

    for rank in range(2):
        for epoch in range(2):
            remote = [b.sample_ids for b in ManifestReader(built.s3_out, rank, 2, epoch)]
            assert remote == [b.sample_ids for b in ManifestReader(built.local_out, rank, 2, epoch)]
            assert remote and all(len(ids) == 2 for ids in remote)
        far = BalancedBatchSampler(built.s3_out, rank, 2)
        near = BalancedBatchSampler(built.local_out, rank, 2)
        for epoch in range(2):
            far.set_epoch(epoch)
            near.set_epoch(epoch)
            assert list(far) == list(near)


def _read_all(dataset) -> tuple[list[np.ndarray], float]:
    """Every sample's points, and the mean seconds of one ``dataset[i]``."""
    t = time.perf_counter()
    points = [dataset[i]["points"].numpy() for i in range(len(dataset))]
    return points, (time.perf_counter() - t) / len(dataset)


def test_dataset_reads_points_from_s3_also_with_latency(s3: S3Server, built: Built) -> None:
    pytest.importorskip("torch")
    from lidarshard.loaders.dataset import PointCloudDataset

    local, local_s = _read_all(PointCloudDataset(built.s3_out, root=str(built.dataroot)))
    remote, remote_s = _read_all(PointCloudDataset(built.s3_out))
    with LatencyProxy(s3.port, DELAY_S) as proxy, s3.environment(proxy.endpoint):
        dataset = PointCloudDataset(built.s3_out)
        slow, slow_s = _read_all(dataset)
        assert proxy.requests > 0  # the reads went through the proxy
        t = time.perf_counter()
        batch = dataset.__getitems__(list(range(len(dataset))))  # a DataLoader's batch: files read together
        batch_s = (time.perf_counter() - t) / len(batch)
    files = max(len(PointCloudDataset(built.s3_out).files(i)) for i in range(len(local)))
    assert len(local) == 4 and files == 3  # a keyframe and its 2 sweeps (none before a scene's first)
    for want, got, got_slow, item in zip(local, remote, slow, batch, strict=True):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got_slow, want)
        np.testing.assert_array_equal(item["points"].numpy(), want)
    print(
        f"\nPointCloudDataset[i] (up to {files} files a sample, one by one): local {local_s * 1e3:.1f} ms, "
        f"s3 {remote_s * 1e3:.1f} ms, s3 + {DELAY_S * 1e3:.0f} ms a request {slow_s * 1e3:.1f} ms; "
        f"a batch of all {len(batch)} there {batch_s * 1e3:.1f} ms a sample ({proxy.requests} requests delayed)"
    )


@pytest.mark.slow  # per layout: synth, upload, and two builds through the S3 server
@pytest.mark.parametrize("layout", ["av2", "waymo_v2"])
def test_a_layout_is_recognised_built_and_read_on_s3(s3: S3Server, tmp_path: Path, layout: str) -> None:
    """A synthetic AV2 log / Waymo v2 segment on s3://: the layout is recognised through the store's
    listing, built s3:// -> s3://, and its points (Waymo: frames read by row group over ranged GETs)
    equal the local build's."""
    pytest.importorskip("torch")
    from lidarshard.loaders.dataset import PointCloudDataset

    root = tmp_path / layout
    synth = ["--layout", layout, "--scenes", "1", "--keyframes-per-scene", "2"]
    assert cli.main(["synth", str(root), *synth, *BEAM_TEST_FLAGS]) == 0
    assert upload(s3.filesystem(), root, f"{s3.bucket}/{layout}") > 0
    flags = ["--world-size", "1", "--batch-size", "1", "--sweeps", "1", *BEAM_TEST_FLAGS]
    out = s3.uri(f"{layout}-out")
    assert cli.main(["build", s3.uri(layout), out, *flags]) == 0
    assert cli.main(["build", str(root), str(tmp_path / "out"), *flags]) == 0
    assert cli.main(["validate", out, "--data"]) == 0
    remote, local = PointCloudDataset(out), PointCloudDataset(str(tmp_path / "out"))
    assert remote.sample_ids == local.sample_ids and len(remote) == 2
    for i in range(len(remote)):
        np.testing.assert_array_equal(remote[i]["points"].numpy(), local[i]["points"].numpy())

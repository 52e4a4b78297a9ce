"""Schema 4.0 and the previous version: a 3.x output (plan keys in hive directory names only) still
validates, loads, samples, re-plans elastically and rebuilds; 4.0 plan files carry their key."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.loaders import ManifestReader, load_manifest, plan_dataset
from lidarshard.loaders.elastic import load_epoch_plan
from lidarshard.loaders.sampler import BalancedBatchSampler
from lidarshard.pipelines import build as build_cli
from lidarshard.tools import validate as validate_cli
from tests.helpers import BEAM_TEST_FLAGS, build_bins_manifest
from tests.legacy import as_written_by

W, B, E = 2, 2, 2


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build_bins_manifest(tmp_path_factory.mktemp("v4"), 30, W, B, E)


@pytest.fixture(scope="module")
def old(built: Path, tmp_path_factory) -> Path:
    return as_written_by(Path(shutil.copytree(built, tmp_path_factory.mktemp("v31") / "out")), "3.1")


def _plan_table(out: Path) -> pa.Table:
    t = plan_dataset(out).to_table()
    return t.sort_by([(c, "ascending") for c in ("epoch", "rank", "step", "slot")])


def test_the_3_1_copy_is_laid_out_as_3_1_wrote_it(old: Path) -> None:
    assert load_manifest(old).schema_version == "3.1"
    assert (old / "plan/epoch=1/rank=1/part-00000.parquet").is_file()
    assert not list((old / schemas.PLAN_DIR).glob("epoch-*"))
    assert "epoch" not in pq.read_schema(old / schemas.plan_file(0, 0, "3.1")).names


def test_a_3_1_output_validates(old: Path, capsys) -> None:
    assert validate_cli.run([str(old)]) == 0, capsys.readouterr()


def test_a_3_1_plan_reads_as_the_4_0_plan(built: Path, old: Path) -> None:
    for e in range(E):
        for r in range(W):
            new_ids = [b.sample_ids for b in ManifestReader(built, r, W, e)]
            assert [b.sample_ids for b in ManifestReader(old, r, W, e)] == new_ids
    got, want = _plan_table(old), _plan_table(built)
    assert got.schema.field("epoch").type == got.schema.field("rank").type == pa.int32()
    assert got.equals(want)


def test_samplers_and_elastic_read_a_3_1_plan(built: Path, old: Path) -> None:
    for e in range(E):
        np.testing.assert_array_equal(load_epoch_plan(old, e).rows, load_epoch_plan(built, e).rows)
    sampler = BalancedBatchSampler(old, 1, W)
    batches = list(sampler)
    assert batches == list(BalancedBatchSampler(built, 1, W))
    again = BalancedBatchSampler(old, 1, W)
    again.load_state_dict(sampler.state_dict())  # a state of the 3.1 plan loads into it
    with pytest.raises(ValueError, match="plan"):  # ... but not into the 4.0 copy: other files
        BalancedBatchSampler(built, 1, W).load_state_dict(sampler.state_dict())


def test_a_3_1_output_rebuilds_to_the_same_4_0_plan(built: Path, old: Path, tmp_path: Path) -> None:
    new = tmp_path / "new"
    flags = ["--world-size", str(W), "--batch-size", str(B), "--epochs", str(E)]
    assert (
        build_cli.run([str(new), "--from-samples", str(old / schemas.SAMPLES_DIR), *flags, *BEAM_TEST_FLAGS])
        == 0
    )
    assert load_manifest(new).schema_version == schemas.SCHEMA_VERSION
    for e in range(E):
        for r in range(W):
            rel = schemas.plan_file(e, r)
            assert (new / rel).read_bytes() == (built / rel).read_bytes()


def test_a_4_0_plan_file_in_another_ranks_place_is_refused(built: Path, tmp_path: Path) -> None:
    """The manifest lists the moved file (size and sha256 updated): only its rank column tells."""
    import hashlib
    import json

    out = Path(shutil.copytree(built, tmp_path / "out"))
    src, dst = out / schemas.plan_file(0, 0), out / schemas.plan_file(0, 1)
    shutil.copy(src, dst)
    meta = json.loads((out / schemas.MANIFEST_FILE).read_text())
    data = dst.read_bytes()
    meta["files"][schemas.plan_file(0, 1)] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (out / schemas.MANIFEST_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"{dst}: not a readable plan file \(its rank column is not 1"):
        ManifestReader(out, 1, W, 0)
    with pytest.raises(ValueError, match=rf"{dst}: not a readable plan file \(its rank column is not 1"):
        load_epoch_plan(out, 0)
    assert len(ManifestReader(out, 0, W, 0)) == load_manifest(out).steps(0)  # rank 0 still reads

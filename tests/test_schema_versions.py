"""Schema 4.x and the previous version: a 3.x output (plan keys in hive directory names only) is refused
by every reader in one line naming its version and the rebuild command, and that command rebuilds the
same plan from its samples; 4.x plan files carry their key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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


def test_the_3_1_copy_is_laid_out_as_3_1_wrote_it(old: Path) -> None:
    assert json.loads((old / schemas.MANIFEST_FILE).read_text())["schema_version"] == "3.1"
    assert (old / "plan/epoch=1/rank=1/part-00000.parquet").is_file()
    assert not list((old / schemas.PLAN_DIR).glob("epoch-*"))
    assert "epoch" not in pq.read_schema(old / "plan/epoch=0/rank=0/part-00000.parquet").names


def _refusal(old: Path) -> str:
    """The one line every reader of a 3.1 output gives: its version and the command that rebuilds it."""
    return (
        f"{old} was written with manifest schema 3.1; this lidarshard reads 4.x (writes {schemas.SCHEMA_VERSION}): "
        f"rebuild it without rescanning with `lidarshard build NEW_OUT --from-samples {old}/samples "
        f"--world-size {W} --batch-size {B} --epochs {E} --seed 0 --strategy mixed`"
    )


def test_a_3_1_output_is_refused_by_validate_in_one_line(old: Path) -> None:
    assert validate_cli.validate(str(old)) == ([_refusal(old)], "")


@pytest.mark.parametrize(
    "read",
    [
        load_manifest,
        plan_dataset,
        lambda out: ManifestReader(out, 0, W, 0),
        lambda out: load_epoch_plan(out, 0),
        lambda out: BalancedBatchSampler(out, 1, W),
    ],
    ids=["load_manifest", "plan_dataset", "ManifestReader", "load_epoch_plan", "BalancedBatchSampler"],
)
def test_every_reader_refuses_a_3_1_output_in_one_line(old: Path, read) -> None:
    with pytest.raises(ValueError) as info:
        read(old)
    assert str(info.value) == _refusal(old)


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

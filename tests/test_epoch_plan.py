"""lidarshard.loaders.epoch_plan: the one reader of an epoch's whole plan (elastic re-plan, report)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from lidarshard import schemas
from lidarshard.loaders import load_manifest, read_samples
from lidarshard.loaders.epoch_plan import read_epoch_plan
from tests.elastic_fixture import plan_manifest


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    costs = np.exp(np.random.default_rng(5).normal(7.0, 0.6, 48)).round(3)
    return plan_manifest(tmp_path_factory.mktemp("ep") / "out", costs, world_size=3, batch_size=4, epochs=2)


def test_the_dense_plan_is_the_files_rows(out: Path) -> None:
    m, ids = load_manifest(out), read_samples(out, ["sample_id"])["sample_id"]
    got = read_epoch_plan(str(out), m, 1, ids, ["cost"])
    assert got.plan.shape == (m.steps(1), 3, 4) and got.table.num_rows == got.at.size == 48
    assert sorted(got.plan.ravel().tolist()) == sorted(got.at.tolist())
    t = got.table
    for i in (0, 17, 47):  # each row sits where its step, rank and slot say
        step, rank, slot = (int(t[c][i].as_py()) for c in ("step", "rank", "slot"))
        assert got.plan[step, rank, slot] == got.at[i]
        assert ids[int(got.at[i])].as_py() == t["sample_id"][i].as_py()


def test_a_missing_rank_or_a_foreign_sample_is_refused(out: Path, tmp_path: Path) -> None:
    m, ids = load_manifest(out), read_samples(out, ["sample_id"])["sample_id"]
    with pytest.raises(ValueError, match="epoch 2 was not planned"):
        read_epoch_plan(str(out), m, 2, ids)
    with pytest.raises(ValueError, match="2 planned sample_ids are not in the samples"):
        read_epoch_plan(str(out), m, 0, pa.array(ids.to_pylist()[2:]))
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / schemas.plan_file(0, 2).rsplit("/", 1)[0])
    with pytest.raises(ValueError, match="epoch 0: the manifest has no plan for epoch 0 rank 2"):
        read_epoch_plan(str(copy), m, 0, ids)

"""``examples/mmdet3d_infos.py``: an mmdet3d infos file -> ``lidarshard.write_manifest`` -> an mmengine
Runner trains exactly the planned batches, epoch by epoch. Training is skipped without mmengine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from lidarshard.loaders import ManifestReader
from lidarshard.pipelines.tools.validate import validate

REPO = Path(__file__).resolve().parents[1]


def _example():
    spec = importlib.util.spec_from_file_location("mmdet3d_infos", REPO / "examples" / "mmdet3d_infos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_infos_become_a_manifest_the_mmengine_sampler_trains_from(tmp_path: Path, monkeypatch) -> None:
    ex = _example()
    data = tmp_path / "data"
    infos = ex.make_infos(data, 15)
    table = ex.infos_to_samples(infos, data)
    assert table.num_rows == 15 and min(table["num_points"].to_pylist()) >= 16
    out = tmp_path / "manifest"
    import lidarshard

    summary = lidarshard.write_manifest(table, str(out), 1, 2, epochs=2, cost_model="points")
    assert summary["steps_per_epoch"] == [7, 7] and summary["counts"]["dropped"] == [1, 1]
    assert validate(str(out))[0] == []
    pytest.importorskip("mmengine")
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    seen = ex.train(out, infos, data, tmp_path / "work", epochs=2)
    planned = [b.sample_ids for e in range(2) for b in ManifestReader(out, 0, 1, e)]
    assert seen == planned

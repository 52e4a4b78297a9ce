"""``examples/mmdet3d_infos.py``: an mmdet3d infos file -> ``lidarshard.write_manifest`` -> an mmengine
Runner trains exactly the planned batches, epoch by epoch, on 1 rank and on 2 gloo ranks. Training is
skipped without mmengine."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lidarshard.loaders import ManifestReader
from lidarshard.tools.validate import validate

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


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_example_trains_two_ranks_each_on_its_plan(tmp_path: Path) -> None:
    """``python examples/mmdet3d_infos.py WORKDIR --world-size 2`` as a user runs it (a relative
    WORKDIR): the manifest is planned for 2 ranks and each gloo rank trains exactly its planned batches."""
    pytest.importorskip("mmengine")
    cmd = [sys.executable, str(REPO / "examples" / "mmdet3d_infos.py"), "work", "--world-size", "2",
           "--samples", "10", "--epochs", "1"]  # fmt: skip
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=220)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "work" / "manifest"
    for rank in range(2):
        seen = json.loads((tmp_path / "work" / "work_dir" / f"rank{rank}.json").read_text())
        assert seen == [b.sample_ids for b in ManifestReader(out, rank, 2, 0)]
        assert f"rank {rank}: mmengine trained {len(seen)} planned batches" in r.stdout
    assert "start method" not in r.stderr

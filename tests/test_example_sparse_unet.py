"""examples/sparse_unet.py: the voxelization, the spconv UNet (forward + backward on a tiny cloud, when
spconv is installed) and ``train_ddp.py --backbone spconv``: one line when spconv is missing, one
training step of 2 gloo ranks when it is present (slow lane)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")

from tests.manifest_fixture import make_fixture  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_voxelize_batch_shifts_each_sample_and_averages_its_points() -> None:
    vox = _example("sparse_unet").voxelize_batch
    pts = torch.tensor(
        [[0.05, 0.05, 0.05, 1.0], [0.07, 0.01, 0.02, 3.0], [0.25, 0.0, 0.0, 5.0], [10.0, 10.0, 10.0, 7.0]]
    )
    batch = torch.tensor([0, 0, 0, 1])
    coords, feats, inverse = vox(pts, batch, 0.1)
    assert coords.dtype == torch.int32 and coords.tolist() == [[0, 0, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0]]
    assert inverse.tolist() == [0, 0, 1, 2]  # points 0 and 1 share a voxel
    torch.testing.assert_close(feats[0], torch.tensor([0.06, 0.03, 0.035, 2.0]))
    torch.testing.assert_close(feats[2], pts[3])  # sample 1 starts at its own origin


def test_spconv_unet_forward_backward_on_a_tiny_cloud() -> None:
    pytest.importorskip("spconv.pytorch")
    torch.manual_seed(0)
    net = _example("sparse_unet").SparseSegNet(classes=3, voxel_size=0.2)
    points = torch.randn(600, 5) * 2.0
    batch = torch.cat([torch.zeros(250), torch.ones(350)]).long()
    logits = net(points, batch)
    assert logits.shape == (600, 3) and torch.isfinite(logits).all()
    torch.nn.functional.cross_entropy(logits, torch.randint(0, 3, (600,))).backward()
    grads = [p.grad for p in net.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)
    twin = net.eval()(torch.cat([points, points[:1]]), torch.cat([batch, batch[:1]]))
    torch.testing.assert_close(twin[0], twin[-1])  # two points of one voxel get its logits


def test_train_ddp_without_spconv_fails_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "spconv", None)  # import spconv -> ImportError
    monkeypatch.delitem(sys.modules, "sparse_unet", raising=False)
    example = _example("train_ddp")
    with pytest.raises(SystemExit) as e:
        example._parse(["--manifest", str(tmp_path), "--backbone", "spconv"])
    message = str(e.value.code)
    assert "\n" not in message and "pip install spconv" in message and "--backbone mlp" in message
    assert example._parse(["--manifest", str(tmp_path)]).voxel_size == 0.05  # mlp needs no spconv


@pytest.mark.slow  # starts examples/train_ddp.py: 2 gloo ranks, torch and spconv imported per process
@pytest.mark.timeout(180)
def test_train_ddp_one_spconv_step(tmp_path: Path) -> None:
    pytest.importorskip("spconv.pytorch")
    out = make_fixture(tmp_path, [300, 500, 400, 600], world_size=2, batch_size=1, epochs=1, sweeps=1)
    summary = tmp_path / "r.json"
    cmd = [sys.executable, str(REPO / "examples/train_ddp.py"), "--manifest", str(out), "--backbone",
           "spconv", "--max-steps", "1", "--pin-cores", "--json-out", str(summary)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=170, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(summary.read_text())
    assert result["backbone"] == "spconv" and result["world_size"] == 2
    (epoch,) = result["epochs"]
    assert epoch["steps"] == 1 and all(t > 0 for rank in epoch["compute_s"] for t in rank)
    assert epoch["train_loss"] > 0 and len(epoch["samples"]) == 2

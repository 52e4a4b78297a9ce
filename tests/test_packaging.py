"""The trainer install: the wheel holds one top-level name and works without Beam.

One test (it creates a venv and installs numpy, pyarrow and the pinned torch into it): the wheel's
top-level names are ``lidarshard`` and its dist-info only, and it ships ``py.typed``; a fresh venv with
the core install of that wheel plus ``torch==2.13.0`` reads a manifest with ``ManifestReader`` and the
torch sampler from a directory that holds its own ``transforms.py``, ``loaders.py`` and ``schemas.py``;
apache_beam is not installed there, and a Beam command says in one line which extra to install.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import lidarshard
from lidarshard.pipelines import build as build_cli
from tests.helpers import BEAM_TEST_FLAGS, make_bins

_TRAIN = """
import importlib.util, json, sys
assert importlib.util.find_spec("apache_beam") is None, "apache_beam is installed"
import lidarshard
from lidarshard import BalancedBatchSampler, ManifestReader, read_samples
assert lidarshard.__file__.startswith(sys.prefix), lidarshard.__file__
out = sys.argv[1]
ids = read_samples(out, ["sample_id"]).column("sample_id").to_pylist()
index = {sid: i for i, sid in enumerate(ids)}
for rank in range(2):
    planned = [[index[s] for s in b.sample_ids] for b in ManifestReader(out, rank, 2, 0)]
    sampler = BalancedBatchSampler(out, rank=rank, world_size=2)
    assert [list(b) for b in sampler] == planned, rank
print(json.dumps({"steps": len(planned), "beam": "apache_beam" in sys.modules}))
"""


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_core_wheel_installs_alone_and_reads_a_manifest(wheel: Path, tmp_path: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"lidarshard", f"lidarshard-{lidarshard.__version__}.dist-info"}, tops
    assert "lidarshard/py.typed" in names  # PEP 561: type checkers read the installed annotations
    log = (wheel.parent / "build.log").read_text()
    assert "Deprecat" not in log, [line for line in log.splitlines() if "Deprecat" in line][:3]

    out = tmp_path / "manifest"
    flags = [
        "--world-size",
        "2",
        "--batch-size",
        "2",
        "--cost-model",
        "points",
        "--max-reject-fraction",
        "0.2",
    ]
    assert build_cli.run([str(make_bins(tmp_path / "in", n=12)), str(out), *flags, *BEAM_TEST_FLAGS]) == 0

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    r = subprocess.run([*pip, str(wheel), "torch==2.13.0"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    user = tmp_path / "my_training_repo"  # a research repo with generic module names of its own
    user.mkdir()
    for name in ("transforms", "loaders", "schemas"):
        (user / f"{name}.py").write_text(f"raise ImportError('the user repo {name}.py was imported')\n")
    r = subprocess.run(
        [str(python), "-c", _TRAIN, str(out)], cwd=user, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert '"beam": false' in r.stdout and '"steps": 3' in r.stdout  # 12 accepted, 4 per step, r.stdout

    cli = subprocess.run(
        [str(venv / "bin" / "lidarshard"), "build", "in", "out"], cwd=user, capture_output=True, text=True
    )
    assert cli.returncode == 2 and cli.stdout == ""
    assert cli.stderr.strip().splitlines() == [
        'lidarshard build: needs Apache Beam: pip install "lidarshard[pipeline]"'
    ]

"""Shared fixtures. Real point-cloud files are read from ../shared/realdata (never copied here)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import PACKAGES, REPO
from tests.hostile_suite import (  # noqa: F401  the hostile suite's hooks (make hostile)
    pytest_collection_modifyitems,
    pytest_runtest_logreport,
    pytest_terminal_summary,
)

try:  # registers memobj:// with Beam for every test; the trainer's Beam-free install has no Beam
    import tests.object_store  # noqa: F401
except ModuleNotFoundError as e:
    if e.name != "apache_beam" and not (e.name or "").startswith("apache_beam."):
        raise

REALDATA = Path(os.environ.get("LIDARSHARD_REALDATA", REPO.parent / "shared" / "realdata"))


@pytest.fixture(scope="session")
def realdata() -> Path:
    """Root of the real point-cloud fixtures; skips the test when they are absent."""
    if not REALDATA.is_dir():
        pytest.skip(f"real data not found at {REALDATA}")
    return REALDATA


@pytest.fixture(scope="session")
def semantickitti_full(realdata: Path) -> Path:
    """The full real SemanticKITTI scan with its labels and label config (skips when absent)."""
    root = realdata / "semantickitti_full"
    for rel in ("sequences/00/velodyne/000000.bin", "sequences/00/labels/000000.label"):
        if not (root / rel).is_file():
            pytest.skip(f"no full SemanticKITTI scan under {root}")
    return root


@pytest.fixture(scope="session")
def source(tmp_path_factory) -> Path:
    """A copy of the project (building writes ``build/`` and ``*.egg-info`` beside pyproject.toml)."""
    src = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return src


@pytest.fixture(scope="session")
def wheel(source: Path) -> Path:
    """``pip wheel`` of the project, as ``--extra_package`` takes it; the build output is ``build.log``
    beside it."""
    dist = source.parent / (source.name + "-dist")
    cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(dist)]
    r = subprocess.run([*cmd, str(source)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    (dist / "build.log").write_text(r.stdout + r.stderr)  # the packaging test reads it for banners
    (whl,) = dist.glob("lidarshard-*.whl")
    return whl


@pytest.fixture
def dead_owner(monkeypatch) -> None:
    """Staging/old names created from now on belong to a launcher that has exited."""
    from lidarshard.pipelines import publish

    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    pid = proc.pid
    monkeypatch.setattr(publish, "_new_tag", lambda: f"{publish._HOST}-{pid}-{os.urandom(4).hex()}")

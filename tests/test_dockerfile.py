"""The SDK worker container (``Dockerfile``) uses the Beam and Python versions we run and declare.

No Docker engine runs in CI, so the image is not built: a worker whose Beam or Python differs from
the launcher's fails at job start (or, worse, unpickles DoFns differently), and this catches the
drift when pyproject.toml or the venv moves.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import apache_beam
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
#: pyproject.toml as installed in the venv (``make test`` reinstalls when pyproject.toml changes).
META = metadata.metadata("lidarshard")


def _base_image() -> tuple[str, str]:
    """(python X.Y, beam version) of the single ``FROM apache/beam_pythonX.Y_sdk:V`` line."""
    found = re.findall(r"^FROM\s+apache/beam_python(\d+\.\d+)_sdk:(\S+)\s*$", DOCKERFILE, re.M)
    assert len(found) == 1, "expected one FROM apache/beam_pythonX.Y_sdk:VERSION line"
    return found[0]


def test_base_image_python_is_the_venvs() -> None:
    python, _ = _base_image()
    assert python == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert Version(python + ".0") in Requirement(f"x{META['Requires-Python']}").specifier


def test_base_image_beam_is_the_venvs_and_allowed_by_pyproject() -> None:
    _, beam = _base_image()
    assert beam == apache_beam.__version__
    reqs = [Requirement(r) for r in metadata.requires("lidarshard") or []]
    (beam_req,) = [r for r in reqs if r.name == "apache-beam" and r.marker.evaluate({"extra": "pipeline"})]
    assert Version(beam) in beam_req.specifier


def test_image_pins_that_beam_and_installs_the_pipeline_extra() -> None:
    _, beam = _base_image()
    assert f'"apache-beam=={beam}"' in DOCKERFILE
    assert re.search(r"lidarshard-\*\.whl\)\[pipeline\]", DOCKERFILE)
    assert f"apache_beam.__version__ == '{beam}'" in DOCKERFILE

"""The lane check CI runs in each install lane's venv (``tests/lane_check.py``) holds here too."""

from __future__ import annotations

import pytest

from tests import lane_check
from tests.helpers import REPO


def test_product_extras_are_the_packages_a_lane_may_lack() -> None:
    optional = lane_check.optional_packages(REPO / "pyproject.toml")
    assert {"apache_beam", "yaml", "matplotlib", "torch", "mmengine", "open3d", "plyfile"} <= optional
    assert "pandas" not in optional and "pytest" not in optional  # [test] and [dev] are tools, not installs


def test_every_product_module_imports_in_the_test_venv() -> None:
    problems, line = lane_check.import_problems(lane_check.optional_packages(REPO / "pyproject.toml"))
    assert problems == [] and line.endswith("product modules import")


def test_a_module_lacking_an_undeclared_package_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    real = importlib.import_module

    def fake(name: str, *a):
        if name == "lidarshard.tools.validate":
            raise ModuleNotFoundError("No module named 'pandas'", name="pandas")
        return real(name, *a)

    monkeypatch.setattr(lane_check.importlib, "import_module", fake)
    problems, _ = lane_check.import_problems({"apache_beam"})
    assert problems == [
        "lidarshard.tools.validate: ModuleNotFoundError: No module named 'pandas' "
        "(not a package a product extra declares)"
    ]

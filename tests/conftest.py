"""Shared fixtures. Real point-cloud files are read from ../shared/realdata (never copied here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REALDATA = Path(os.environ.get("LIDARSHARD_REALDATA", REPO.parent / "shared" / "realdata"))

#: Beam flags every test pipeline passes: an explicit runner, never the Prism download.
BEAM_TEST_FLAGS = ["--runner=FnApiRunner"]


@pytest.fixture(scope="session")
def realdata() -> Path:
    """Root of the real point-cloud fixtures; skips the test when they are absent."""
    if not REALDATA.is_dir():
        pytest.skip(f"real data not found at {REALDATA}")
    return REALDATA

"""Shared fixtures. Real point-cloud files are read from ../shared/realdata (never copied here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import REPO

REALDATA = Path(os.environ.get("LIDARSHARD_REALDATA", REPO.parent / "shared" / "realdata"))


@pytest.fixture(scope="session")
def realdata() -> Path:
    """Root of the real point-cloud fixtures; skips the test when they are absent."""
    if not REALDATA.is_dir():
        pytest.skip(f"real data not found at {REALDATA}")
    return REALDATA

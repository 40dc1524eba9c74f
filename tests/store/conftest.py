"""Fixtures for store tests: episodes and stores (service-backed stores live in services.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from storekit import make_episode  # noqa: E402


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/traj.db"


@pytest.fixture
def episodes() -> list:
    return [make_episode(i) for i in range(10)]

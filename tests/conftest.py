"""Shared fixtures: the bundled scenario documents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


def load_json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture
def data_dir() -> Path:
    return DATA

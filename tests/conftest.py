from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.seaweed import Seaweed, start_seaweed

SAMPLES = Path(__file__).resolve().parent.parent.parent / "shared" / "claude-samples"
_bucket_ids = itertools.count()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seaweed]:
    sw = start_seaweed(tmp_path_factory.mktemp("seaweed"))
    old = {k: os.environ.get(k) for k in sw.env()}
    os.environ.update(sw.env())
    try:
        yield sw
    finally:
        sw.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def bucket(seaweed: Seaweed) -> str:
    """A fresh, empty bucket for one test."""
    name = f"t{os.getpid()}-{next(_bucket_ids)}"
    seaweed.create_bucket(name)
    return name


@pytest.fixture
def samples() -> Path:
    if not (SAMPLES / "SOURCES.md").exists():
        pytest.skip(f"real transcripts not present at {SAMPLES}")
    return SAMPLES

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.claude_fixtures import Claude, install_claude
from tests.counting import Counts, patch_open_store
from tests.faultkit import FaultProxy
from tests.seaweed import Seaweed, start_seaweed

SAMPLES = Path(__file__).resolve().parent.parent.parent / "shared" / "claude-samples"
_bucket_ids = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "soak: a long test (minutes) of real daemons under faults and kills; "
        "part of the normal suite (-m 'not soak' leaves it out)")


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
def proxy(seaweed: Seaweed) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the session's SeaweedFS."""
    p = FaultProxy(seaweed.endpoint).start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="session")
def claude() -> Claude:
    """The real Claude Code CLI, installed once per cache directory (skips without npm)."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not on PATH: cannot install the real Claude Code CLI "
                    "(npm install @anthropic-ai/claude-code)")
    return Claude(install_claude(npm))


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


@pytest.fixture
def derives(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """The (n, r, p) of every scrypt derivation made while the test runs. Each is made
    cheap (n at most 2^10): a planted key file's tag fails anyway, and the tests' own
    key files are that cheap already."""
    from cryptography.hazmat.primitives.kdf import scrypt

    calls: list[tuple[int, int, int]] = []
    real = scrypt.Scrypt

    def counting(*, salt: bytes, length: int, n: int, r: int, p: int) -> object:
        calls.append((n, r, p))
        return real(salt=salt, length=length, n=min(n, 1 << 10), r=r, p=p)

    monkeypatch.setattr(scrypt, "Scrypt", counting)
    return calls


@pytest.fixture
def store_counts(monkeypatch: pytest.MonkeyPatch) -> Counts:
    """The requests of every store syncd opens while the test runs (``open_store``
    patched, tests/counting.py): by method, and the bytes read."""
    counts = Counts()
    patch_open_store(counts, setattr_=monkeypatch.setattr)
    return counts

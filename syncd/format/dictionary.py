"""A zstd dictionary trained on this machine's own transcripts, for the small frames of
flushes (a few appended lines each, where a plain zstd frame has no history to draw on).

Stored content-addressed (``machines/<id>/dict/<sha256>``, sealed like machine.json in
an encrypted store); a segment names the dictionary its frames used. Adopted only when
it shrinks held-out samples by at least ``MIN_GAIN``.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from pathlib import Path

import zstandard

DICT_SIZE = 64 << 10
MIN_GAIN = 0.10
SAMPLE_BYTES = 8 << 20
MIN_SAMPLES = 500


class Dictionary:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.id = hashlib.sha256(data).hexdigest()
        self.zdict = zstandard.ZstdCompressionDict(data)


def samples(root: Path, skip: Callable[[Path], bool] = lambda p: False) -> list[bytes]:
    """Runs of 1-3 lines, the size of what one flush appends, from the newest transcripts
    (but those ``skip`` names: a forgotten session's)."""
    files = []
    for p in (root / "projects").glob("**/*.jsonl"):
        if skip(p):
            continue
        with contextlib.suppress(OSError):
            files.append((p.stat().st_mtime, p))
    out: list[bytes] = []
    budget = SAMPLE_BYTES
    for _, p in sorted(files, reverse=True):
        if budget <= 0:
            break
        try:
            with open(p, "rb") as f:
                f.seek(max(0, p.stat().st_size - (1 << 20)))
                lines = f.read(min(budget, 1 << 20)).split(b"\n")[1:-1]
        except OSError:
            continue
        for i in range(0, len(lines), 2):
            chunk = b"\n".join(lines[i : i + 1 + i % 3]) + b"\n"
            out.append(chunk)
            budget -= len(chunk)
    return out


def train(root: Path, level: int = 3, skip: Callable[[Path], bool] = lambda p: False
          ) -> tuple[Dictionary | None, float | None]:
    """A dictionary from the tree's transcripts and its gain on held-out samples
    (None when it would not pay; a gain of None: too little to learn from)."""
    got = samples(root, skip)
    if len(got) < MIN_SAMPLES:
        return None, None
    held = got[::5]
    learn: list[bytes | bytearray | memoryview] = [s for i, s in enumerate(got) if i % 5]
    try:
        zd = zstandard.train_dictionary(DICT_SIZE, learn, level=level)
    except zstandard.ZstdError:
        return None, None
    plain = zstandard.ZstdCompressor(level=level)
    with_dict = zstandard.ZstdCompressor(level=level, dict_data=zd)
    before = sum(len(plain.compress(s)) for s in held)
    after = sum(len(with_dict.compress(s)) for s in held)
    gain = 1 - after / before
    return (Dictionary(zd.as_bytes()) if gain >= MIN_GAIN else None), gain


__all__ = ["Dictionary", "train"]

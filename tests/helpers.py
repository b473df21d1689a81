"""Small helpers shared by tests: trees, shippers over a memory store, byte compares."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncd.backup.ship import Provenance, Shipper
from syncd.backup.state import State
from syncd.claude import Selection
from syncd.config import Settings
from syncd.errors import TransientError
from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, RestoreReport, restore
from syncd.service.daemon import Daemon
from syncd.store import MemoryStore, Store
from syncd.store.layout import segment_key
from tests.readers import read_index


def write(root: Path, rel: str | bytes, data: bytes, mode: str = "wb") -> Path:
    path = os.path.join(os.fsencode(root), os.fsencode(rel))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode) as f:
        f.write(data)
    return Path(os.fsdecode(path))


def shipper(root: Path, store: Store, state_path: Path, machine: str = "m1",
            segment_max: int = 64 << 20) -> Shipper:
    return Shipper(root=root, repo=Repository(store, machine), state=State(state_path),
                   selection=Selection(), segment_max=segment_max)


def shipped(s: Settings, rel: str | bytes) -> int:
    """Bytes of ``rel`` the state says are durable (-1: not tracked)."""
    if not s.state_file.exists():
        return -1
    st = State(s.state_file, readonly=True)
    try:
        f = st.get(rel.encode() if isinstance(rel, str) else rel)
        return -1 if f is None else f.offset
    finally:
        st.close()


def tree_bytes(root: Path) -> dict[bytes, bytes]:
    """Every regular file under root (relative path bytes → content), symlinks skipped."""
    out = {}
    base = os.fsencode(root)
    for dirpath, _dirs, files in os.walk(base):
        for name in files:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                continue
            with open(full, "rb") as f:
                out[os.path.relpath(full, base)] = f.read()
    return out


def all_extents(store: Store, machine: str = "m1") -> list:  # type: ignore[type-arg]
    out = []
    seq = 0
    while store.head(segment_key(machine, seq)):
        out.extend(read_index(store, segment_key(machine, seq)).extents)
        seq += 1
    return out


def wait_for(cond: Callable[[], Any], timeout: float = 30.0, what: str = "condition",
             interval: float = 0.05, explain: Callable[[], str] | None = None) -> Any:
    """Poll ``cond`` until it returns something truthy (returned); fail after ``timeout``
    seconds, with ``explain()`` when given. The wait is an Event's, not ``time.sleep``
    (which fault tests may patch)."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            more = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{more}")
        threading.Event().wait(interval)


@dataclass
class DaemonThread:
    """``Daemon.run`` in a thread; whatever it raised lands in ``errors``."""

    daemon: Daemon
    thread: threading.Thread
    errors: list[BaseException] = field(default_factory=list)

    def stop(self, timeout: float = 30.0) -> None:
        self.daemon.request_stop()
        self.thread.join(timeout)


def start_daemon(settings: Settings) -> DaemonThread:
    d = Daemon(settings)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            d.run()
        except BaseException as e:
            errors.append(e)

    dt = DaemonThread(d, threading.Thread(target=run, name="syncd-daemon", daemon=True),
                      errors)
    dt.thread.start()
    return dt


@contextmanager
def running(settings: Settings) -> Iterator[Daemon]:
    """A daemon for the ``with`` block; it must stop cleanly and raise nothing."""
    dt = start_daemon(settings)
    try:
        yield dt.daemon
    finally:
        dt.stop()
    assert not dt.thread.is_alive(), "the daemon did not stop"
    assert not dt.errors, dt.errors


class LosesAnswers(MemoryStore):
    """Stores the object, then reports a transient failure ``lose`` times."""

    lose = 0

    def put(self, key: str, data: bytes, *, if_none_match: bool = True,
            if_match: str | None = None) -> str:
        etag = super().put(key, data, if_none_match=if_none_match, if_match=if_match)
        if self.lose:
            self.lose -= 1
            raise TransientError("answer lost")
        return etag


class Recording(MemoryStore):
    """A MemoryStore that records every GET as (key, start, length)."""

    def __init__(self) -> None:
        super().__init__()
        self.gets: list[tuple[str, int, int | None]] = []

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        self.gets.append((key, start, length))
        return super().get(key, start, length)


def restore_own(repo: Repository, opts: RestoreOptions,
                state_file: Path) -> tuple[RestoreReport, int]:
    """``restore`` of this machine's own backup that records what it writes in the
    state, as ``syncd restore`` does; the report and how many files it recorded."""
    prov = Provenance(state_file)
    recorded: list[bytes] = []

    def record(path: bytes, gen: int, size: int, content: Path | bytes) -> None:
        recorded.append(path)
        prov.record(path, gen, size, content)

    opts.record = record
    try:
        report = restore(repo, opts)
    finally:
        prov.close()
    return report, len(recorded)


def kept_after(call: Callable[[], object]) -> int:
    """The bytes Python still holds once ``call`` returned (its garbage collected): what it
    keeps, not what it used on the way."""
    gc.collect()
    tracemalloc.start()
    try:
        call()
        gc.collect()
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def syncd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``syncd ARGS`` as a whole process with ``env``, its output captured."""
    return subprocess.run([sys.executable, "-m", "syncd", *args], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def one_line(r: subprocess.CompletedProcess[str], code: int) -> str:
    """The single ``syncd: …`` line on stderr of a run that exited with ``code``."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("syncd: "), r.stderr
    return lines[0]

"""Store outages and kill -9 against a real SeaweedFS, through a fault-injecting proxy."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

import syncd.store
from syncd.backup.state import State
from syncd.service.status import status
from syncd.store import S3Store
from syncd.store.layout import segment_key
from tests.faultkit import (
    MACHINE,
    A,
    B,
    C,
    D,
    FaultProxy,
    assert_shipped_once,
    cli,
    kill9_at_put,
    line,
    make_settings,
    restore,
    store_of,
    tree,
    write,
)
from tests.helpers import running, shipped, wait_for
from tests.seaweed import Seaweed

CAUSE = {"503": "ServiceUnavailable", "500": "InternalError", "hang": "timeout",
         "lost-answer": "InternalError"}


@pytest.mark.parametrize("mode", ["503", "500", "hang", "lost-answer"])
def test_store_outage_daemon_catches_up(tmp_path: Path, seaweed: Seaweed, bucket: str,
                                        proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch,
                                        mode: str) -> None:
    # A short client timeout so that a hanging store costs a second, not thirty.
    monkeypatch.setattr(syncd.store, "S3Store", functools.partial(S3Store, timeout=1.0))
    s = make_settings(tmp_path, store=f"s3://{bucket}/backup", endpoint=proxy.url)
    write(s.source, A, line(1))
    write(s.source, B, line(2) * 10)
    with running(s):
        wait_for(lambda: status(s)["bytes_pending"] == 0, 20, "the first backup")
        before = status(s)
        assert before["last_flush_seq"] == 0

        proxy.set_mode(mode)
        faults = proxy.faults
        write(s.source, A, line(3), "ab")
        write(s.source, C, line(4))
        failed = wait_for(lambda: (lambda st: st if st["last_error_time"] != before[
            "last_error_time"] else None)(status(s)), 30, "a failed flush")
        assert proxy.faults > faults
        assert CAUSE[mode].lower() in failed["last_error"].lower(), failed["last_error"]
        # Nothing counts as backed up while the store is down.
        assert failed["bytes_pending"] > 0
        assert shipped(s, C) == -1 and shipped(s, A) == len(line(1))
        assert failed["last_flush_seq"] == 0

        # More data while it is still failing.
        write(s.source, A, line(5), "ab")
        write(s.source, D, line(6))
        write(s.source, B, line(7, 3000), "ab")
        wait_for(lambda: proxy.faults > faults + 2, 20, "more failed requests")
        if mode == "lost-answer":  # a segment reached the store; the daemon was told 500
            assert proxy.lost_puts >= 1
        assert shipped(s, D) == -1

        proxy.set_mode("ok")
        wait_for(lambda: (lambda st: st["bytes_pending"] == 0 and st["files_pending"] == 0)(
            status(s)), 60, "the daemon to catch up")

    want = tree(s.source)
    out = tmp_path / "out"
    report = restore(s, out, endpoint=seaweed.endpoint)
    assert not report.errors
    assert tree(out) == want
    assert_shipped_once(store_of(s, seaweed.endpoint), want)


@pytest.mark.parametrize("stored", [True, False], ids=["after-put", "before-put"])
def test_kill9_in_the_middle_of_a_flush(tmp_path: Path, seaweed: Seaweed, bucket: str,
                                         proxy: FaultProxy, stored: bool) -> None:
    """SIGKILL while the third segment of a multi-segment flush is in flight: either
    stored but not committed (the answer is held back), or never stored."""
    s = make_settings(tmp_path, store=f"s3://{bucket}", endpoint=proxy.url,
                      segment_max_bytes=1 << 20)
    # Six 700 KiB transcripts: one 1 MiB segment each, so the first flush is six PUTs.
    files = [f"projects/-home-u-p{i}/s{i}.jsonl".encode() for i in range(6)]
    for i, rel in enumerate(files):
        write(s.source, rel, b"".join(line(i * 1000 + j, 6000) for j in range(120)))
    direct = store_of(s, seaweed.endpoint)
    kill9_at_put(proxy, s, "run", direct, segment_key(MACHINE, 2), stored,
                 tmp_path / "daemon.log")
    state = State(s.state_file, readonly=True)
    try:
        assert state.next_seq == 2  # killed after PUT of seg 2 began, before its commit
    finally:
        state.close()
    assert (direct.head(segment_key(MACHINE, 2)) is not None) == stored

    # The tree moves on before the restart.
    write(s.source, files[2], line(90), "ab")
    write(s.source, files[0], line(91), "ab")
    write(s.source, D, line(92))

    restart = s.model_copy(update={"s3_endpoint_url": seaweed.endpoint})
    r = cli(restart, "sync")
    assert r.returncode == 0, r.stderr
    assert ("adopted segment" in r.stderr) == stored, r.stderr

    want = tree(s.source)
    out = tmp_path / "out"
    report = restore(restart, out)
    assert not report.errors
    assert tree(out) == want
    assert_shipped_once(direct, want)  # nothing shipped twice, nothing skipped

    r = cli(restart, "status", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["bytes_pending"] == 0 and st["files_pending"] == 0
    assert st["bytes_shipped"] == sum(len(v) for v in want.values())

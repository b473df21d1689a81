"""The daemon's archive jobs (APScheduler): triggers, a scheduled compaction on a live
daemon, failures recorded as errors, and the trained dictionary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from syncd.archive.options import ensure_dictionary
from syncd.backup.state import State
from syncd.config import Settings, load_settings
from syncd.errors import ScheduleError
from syncd.repository import Repository
from syncd.restore.restorer import restore_tree
from syncd.service.schedule import Archiver, trigger
from syncd.service.status import status
from syncd.store import LocalStore, open_store
from tests.helpers import running, tree_bytes, wait_for, write
from tests.readers import read_index


def settings(tmp_path: Path, **kw: object) -> Settings:
    base: dict[str, object] = dict(source=tmp_path / "src", store=(tmp_path / "store").as_uri(),
                                   state_dir=tmp_path / "state", machine_id="m1",
                                   flush_quiet=0.2, flush_max_delay=1.0,
                                   prune_schedule="off", verify_schedule="off")
    base.update(kw)
    return load_settings(config_file=tmp_path / "none.toml", **base)


def keys(s: Settings, kind: str) -> list[str]:
    return [o.key for o in open_store(s.store).list(f"machines/m1/{kind}/")]


def meta(s: Settings, key: str) -> str | None:
    st = State(s.state_file, readonly=True)
    try:
        return st.meta(key)
    finally:
        st.close()


def test_triggers() -> None:
    t = trigger("compact_schedule", "90m")
    assert isinstance(t, IntervalTrigger) and t.interval.total_seconds() == 5400
    assert isinstance(trigger("prune_schedule", "0 3 * * *"), CronTrigger)
    assert trigger("verify_schedule", "off") is None
    with pytest.raises(ScheduleError, match="compact_schedule"):
        trigger("compact_schedule", "hourly-ish")
    with pytest.raises(ScheduleError, match="bad cron line"):
        trigger("prune_schedule", "0 25 * * *")


def test_daemon_compacts_on_schedule(tmp_path: Path) -> None:
    s = settings(tmp_path, compact_schedule="1s")
    src = s.source
    write(src, "projects/-home-a/s1.jsonl", b'{"cwd":"/home/a","n":0}\n')
    write(src, "history.jsonl", b'{"display":"hi","sessionId":"s1"}\n')
    with running(s):
        wait_for(lambda: bool(keys(s, "snap")), what="a scheduled compaction")
        wait_for(lambda: meta(s, "last_compaction_time") is not None, what="recorded")
        write(src, "projects/-home-a/s1.jsonl", b'{"n":1}\n', "ab")
        # The append lands in a segment, then in the next compaction's delta.
        wait_for(lambda: not keys(s, "seg") and bool(keys(s, "delta")),
                 what="the append compacted")
        got = status(s, probe_store=False)
    assert got["last_compaction_time"] is not None
    assert keys(s, "pack"), "compaction wrote no pack"
    out = tmp_path / "out"
    report = restore_tree(Repository(open_store(s.store), "m1"), out)
    assert not report.errors
    assert tree_bytes(out) == tree_bytes(src)


def test_failed_job_is_recorded_as_error(tmp_path: Path) -> None:
    s = settings(tmp_path, verify_schedule="1d")
    write(s.source, "projects/-home-a/s1.jsonl", b'{"n":0}\n')
    store = LocalStore(tmp_path / "store")
    with running(s):
        wait_for(lambda: bool(keys(s, "seg")), what="first flush")
    repo = Repository(store, s.machine_id)
    arch = Archiver(s, lambda: repo, stop=__import__("threading").Event())
    assert arch.run("compaction") is not None
    pack = keys(s, "pack")[0]
    path = tmp_path / "store" / pack
    raw = bytearray(path.read_bytes())
    raw[20] ^= 0xFF  # inside the first frame
    path.write_bytes(bytes(raw))
    assert arch.run("verify") is None
    err = meta(s, "last_error") or ""
    assert "verify" in err and pack in err


def _lines(n: int) -> bytes:
    return b"".join(json.dumps({"type": "assistant", "uuid": f"u{i}", "sessionId": "s1",
                                "message": {"role": "assistant", "content": [
                                    {"type": "text", "text": f"step {i}: checked the build"}]},
                                "cwd": "/home/a/app", "timestamp": f"2026-11-{i % 28 + 1}"}
                               ).encode() + b"\n" for i in range(n))


def test_dictionary_is_trained_used_and_read_back(tmp_path: Path) -> None:
    s = settings(tmp_path)
    write(s.source, "projects/-home-a/s1.jsonl", _lines(3000))
    with running(s):
        wait_for(lambda: bool(keys(s, "seg")), what="seed")
    store = LocalStore(tmp_path / "store")
    note = ensure_dictionary(s, Repository(store, s.machine_id, None))
    assert "adopted" in note, note
    assert len(keys(s, "dict")) == 1
    assert "in use" in ensure_dictionary(s, Repository(store, s.machine_id, None))
    with running(s):
        write(s.source, "projects/-home-a/s1.jsonl", _lines(1), "ab")
        wait_for(lambda: len(keys(s, "seg")) >= 2, what="the append")
    ix = read_index(store, sorted(keys(s, "seg"))[-1])
    assert ix.extra == {} and all(e.dict_id == meta(s, "dict_id") for e in ix.extents)
    out = tmp_path / "out"
    assert not restore_tree(Repository(store, "m1"), out).errors
    assert tree_bytes(out) == tree_bytes(s.source)

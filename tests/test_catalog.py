from __future__ import annotations

import json
from pathlib import Path

from syncd.format.catalog import MetaScanner, Session, session_of


def _scan(data: bytes, chunk: int = 1000, at_line_start: bool = True) -> dict[str, str]:
    s = MetaScanner(at_line_start=at_line_start)
    for i in range(0, len(data), chunk):
        s.feed(data[i : i + chunk])
    return s.finish()


def _j(**kw: object) -> bytes:
    return json.dumps(kw, separators=(",", ":")).encode() + b"\n"


def test_fields_across_chunk_boundaries() -> None:
    data = (_j(type="user", cwd="/w/app", message={"content": "<command-name>/x"},
               timestamp="2026-01-01T00:00:00Z")
            + _j(type="user", cwd="/w/app/sub", message={"content": [
                {"type": "text", "text": "first real prompt"}]}, timestamp="2026-01-01T00:00:01Z")
            + _j(type="assistant", message={"content": "x" * 20000},
                 timestamp="2026-01-01T00:00:02Z", gitBranch="feat")
            + _j(type="summary", summary="A summary")
            + _j(type="custom-title", customTitle="Named")
            + _j(type="last-prompt", lastPrompt="latest"))
    f = _scan(data, chunk=777)
    assert f == {"cwd": "/w/app", "first_prompt": "first real prompt", "summary": "A summary",
                 "custom_title": "Named", "last_prompt": "latest",
                 "last_activity": "2026-01-01T00:00:02Z", "git_branch": "feat"}


def test_torn_and_mid_line_starts_are_ignored() -> None:
    line = _j(type="user", cwd="/a", message={"content": "hi"})
    assert _scan(line[5:] + line, at_line_start=False) == {"cwd": "/a", "first_prompt": "hi"}
    assert _scan(line[:-10]) == {}  # a torn last line is not parsed


def test_title_order() -> None:
    s = Session("sid", "m", b"projects/f/sid.jsonl")
    s.fold(1, {"first_prompt": "fp", "summary": "sum"})
    assert s.title == "sum"
    s.fold(1, {"last_prompt": "lp"})
    assert s.title == "lp"
    s.fold(1, {"custom_title": "ct", "first_prompt": "ignored"})
    assert s.title == "ct" and s.fields["first_prompt"] == "fp"
    s.fold(2, {"first_prompt": "new generation"})
    assert s.title == "new generation"


def test_session_of() -> None:
    sid = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
    assert session_of(f"projects/-a/{sid}.jsonl".encode()) == sid
    # A store names anything: only a UUID is a session id (it reaches shell lines).
    assert session_of(b"projects/-a/123.jsonl") is None
    assert session_of(b"projects/-a/deadbeef;echo INJECTED-$(id -un);#.jsonl") is None
    assert session_of(f"projects/-a/{sid}x.jsonl".encode()) is None
    assert session_of(b"projects/-a/123/subagents/agent-1.jsonl") is None
    assert session_of(b"history.jsonl") is None


def test_real_samples(samples: Path) -> None:
    sung = next(samples.rglob("51bf92be-*.jsonl"))
    f = _scan(sung.read_bytes(), chunk=4 << 20)
    assert f["cwd"] == "/home/ubuntu/sungather-operator"
    assert f["summary"] == "Rock build with uv, k8s snap testing"
    charming = next(samples.rglob("0a0eb7b7-*.jsonl"))
    f = _scan(charming.read_bytes(), chunk=4 << 20)
    entries = [json.loads(x) for x in charming.read_bytes().splitlines()]
    last = [e["lastPrompt"] for e in entries if e.get("type") == "last-prompt"][-1]
    assert f["last_prompt"] == last[:200]
    assert f["first_prompt"].startswith("review the charming-analysis work")


def test_the_last_relocated_cwd_is_the_sessions_and_the_newest_wins_in_the_fold() -> None:
    # A moved session (/cd, a worktree) ends with a relocated record per move.
    sid = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
    first = (_j(type="user", cwd="/w/app", message={"content": "hello"})
             + _j(type="relocated", sessionId=sid, relocatedCwd="/w/app/.claude/worktrees/a")
             + _j(type="relocated", sessionId=sid, relocatedCwd="/w/other"))
    f = _scan(first, chunk=50)
    assert f["relocated_cwd"] == "/w/other" and f["cwd"] == "/w/app"
    later = _scan(_j(type="relocated", sessionId=sid, relocatedCwd="/w/third"))
    assert later == {"relocated_cwd": "/w/third"}
    s = Session(sid, "m", f"projects/-w-app/{sid}.jsonl".encode())
    s.fold(1, f)
    s.fold(1, {"first_prompt": "x"})
    assert s.fields["relocated_cwd"] == "/w/other"
    s.fold(1, later)
    assert s.fields["relocated_cwd"] == "/w/third"

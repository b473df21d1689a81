from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

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
    assert f["first_prompt"].startswith("review the charming-analysis work")
    # Its last last-prompt record is a <task-notification>: the one before is the title.
    assert f["last_prompt"].startswith("yes please. for the cross repo")


# -- what Claude's session list says, computed here by a plain walk of the entries ---------
def _is_prompt(e: dict[str, Any]) -> str | None:
    """A real prompt's text: a user entry that is not meta, a compact summary, a tool
    result, a slash command or text the CLI injected (it opens with a tag)."""
    if e.get("type") != "user" or e.get("isMeta") or e.get("isCompactSummary") or \
            e.get("isSidechain"):
        return None
    content = e.get("message", {}).get("content")
    if isinstance(content, list):
        if any(c.get("type") == "tool_result" for c in content):
            return None
        content = next((c["text"] for c in content if c.get("type") == "text"), None)
    if not isinstance(content, str):
        return None
    text = " ".join(content.split("\n")).strip()
    if not text or "<command-name>" in text or text.startswith("[Request interrupted by user"):
        return None
    if text.startswith("<bash-input>"):
        return "! " + text.split("<bash-input>")[1].split("</bash-input>")[0].strip()
    if text.lstrip().startswith("<") and text.lstrip()[1:2].islower():
        return None
    return text[:200].strip() + "\u2026" if len(text) > 200 else text


def _expected(entries: list[dict[str, Any]]) -> tuple[str, str]:
    last = {}
    for e in entries:
        t = e.get("type")
        if t in ("custom-title", "ai-title", "summary"):
            last[t] = e.get("customTitle") or e.get("aiTitle") or e.get("summary")
        elif t == "last-prompt" and not e["lastPrompt"].startswith("<"):
            last[t] = e["lastPrompt"]
        elif t in ("user", "assistant") and e.get("timestamp"):
            last["activity"] = e["timestamp"]
    first = next((p for p in map(_is_prompt, entries) if p), "")
    title = next((last[k] for k in ("custom-title", "ai-title", "last-prompt", "summary")
                  if last.get(k)), first)
    return title, last["activity"]


def _stretches(data: bytes, n: int) -> list[bytes]:
    """``data`` cut at line ends into ``n`` stretches, as flushes ship a growing file."""
    cuts = [0] + [data.index(b"\n", len(data) * i // n) + 1 for i in range(1, n)] + [len(data)]
    return [data[a:b] for a, b in pairwise(cuts)]


def test_every_sample_has_the_title_and_last_activity_claudes_list_shows(
        samples: Path) -> None:
    transcripts = [p for p in samples.rglob("projects/*/*.jsonl") if session_of(
        b"projects/" + p.parent.name.encode() + b"/" + p.name.encode())]
    assert transcripts
    for path in transcripts:
        data = path.read_bytes()
        title, activity = _expected([json.loads(x) for x in data.splitlines() if x])
        s = Session(path.stem, "m", b"projects/f/" + path.name.encode())
        for stretch in _stretches(data, 5):
            s.fold(1, _scan(stretch, chunk=1 << 20))
        assert (s.title, s.fields["last_activity"]) == (title, activity), path.name
        assert not s.title.startswith(("<", "[Request interrupted")), path.name


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


def _user(content: object, **kw: object) -> bytes:
    return _j(type="user", message={"role": "user", "content": content}, **kw)


def test_prompts_the_cli_injected_are_no_title() -> None:
    injected = [
        _user("<task-notification> <task-id>a1</task-id> <status>completed</status>"),
        _user("<command-name>/model</command-name> <command-message>model</command-message>"),
        _user("<local-command-stdout>Set model</local-command-stdout>"),
        _user("<local-command-caveat>Caveat: the messages below…</local-command-caveat>"),
        _user("  <system-reminder>\nbe brief\n</system-reminder>"),
        _user("<bash-stdout>ok</bash-stdout><bash-stderr></bash-stderr>"),
        _user("[Request interrupted by user for tool use]"),
        _user([{"type": "text", "text": "[Request interrupted by user]"}]),
        _user("a skill's expanded text", isMeta=True),
        _user("This session is being continued from a previous one…", isCompactSummary=True),
        _user([{"type": "tool_result", "tool_use_id": "t", "content": "x"},
               {"type": "text", "text": "not a prompt either"}]),
    ]
    for line in injected:
        assert "first_prompt" not in _scan(line), line
    f = _scan(b"".join(injected) + _user([{"type": "text", "text": "fix\nthe build"}]))
    assert f["first_prompt"] == "fix the build"
    assert _scan(_user("<bash-input>git status</bash-input>"))["first_prompt"] == "! git status"
    pasted = '<pasted_content id="0a1f">\nlog line one\n</pasted_content id="0a1f">\nwhy?'
    # Unwrapped as Claude does: the block's body, the newlines around it dropped.
    assert _scan(_user(pasted))["first_prompt"] == "log line onewhy?"
    # A tag that is not an element's start is text (Claude shows "<3 this" too).
    assert _scan(_user("<3 this"))["first_prompt"] == "<3 this"
    long = _scan(_user("w" * 300))["first_prompt"]
    assert len(long) == 201 and long.endswith("\u2026")


def test_an_injected_last_prompt_keeps_the_last_real_one() -> None:
    f = _scan(_j(type="last-prompt", lastPrompt="deploy it")
              + _j(type="last-prompt", lastPrompt="<task-notification> <task-id>x</task-id>")
              + _j(type="last-prompt", lastPrompt="[Request interrupted by user]"))
    assert f["last_prompt"] == "deploy it"
    s = Session("sid", "m", b"projects/f/sid.jsonl")
    s.fold(1, f)
    s.fold(1, _scan(_j(type="last-prompt", lastPrompt="<command-name>/clear</command-name>")))
    assert s.title == "deploy it"


def test_last_activity_is_the_last_user_or_assistant_entry() -> None:
    # The trailing bookkeeping lines carry stamps of their own, older than the
    # conversation (a file-history snapshot's is its first edit's).
    data = (_user("hello", timestamp="2026-01-04T10:00:00Z", gitBranch="main")
            + _j(type="assistant", message={"content": "hi"}, timestamp="2026-01-09T09:12:09Z",
                 gitBranch="feat")
            + _j(type="file-history-snapshot", snapshot={"timestamp": "2025-12-30T09:23:34Z"},
                 timestamp="2025-12-30T09:23:34Z")
            + _j(type="progress", data={"message": {"type": "user", "content": "x"}},
                 timestamp="2025-12-01T00:00:00Z")
            + _j(type="system", subtype="turn_duration", timestamp="2025-11-01T00:00:00Z")
            + _j(type="last-prompt", lastPrompt="hello"))
    for chunk in (17, 100, 1 << 20):
        f = _scan(data, chunk=chunk)
        assert (f["last_activity"], f["git_branch"]) == ("2026-01-09T09:12:09Z", "feat"), chunk
    # A stretch with no message leaves the last activity as the fold had it.
    s = Session("sid", "m", b"projects/f/sid.jsonl")
    s.fold(1, _scan(data))
    s.fold(1, _scan(_j(type="file-history-snapshot", timestamp="2024-01-01T00:00:00Z")))
    assert s.fields["last_activity"] == "2026-01-09T09:12:09Z"

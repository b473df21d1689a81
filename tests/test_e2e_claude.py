"""Cross-device restore accepted by the real Claude Code CLI (issue 3 acceptance).

Machine "desk" (HOME=A) records sessions with the real CLI against the loopback
stand-in for the Messages API, holds the real transcripts from ../shared/claude-samples
(placed under A), backs them up with ``syncd sync`` and compacts them with
``syncd compact``. Before the backup, every session is resumed once from its original
path (``claude -p --resume SID ok``); the
request the stand-in receives is the baseline. Machine "laptop" (HOME=B) restores
with other project paths; then, per session, ``claude -p --continue ok`` from the new
path must send the same conversation (same number of messages, every thinking block
and signature identical), and ``claude -p --resume SID ok`` must find it.

Skipped only when npm is not on PATH. The CLI is installed once into
~/.cache/syncd-tests/claude-code-<version> (or $SYNCD_TEST_CACHE).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from syncd.claude import project_folder
from tests.claude_fixtures import (
    Claude,
    Run,
    copy_tree,
    files_under,
    first_cwd,
    first_user_text,
    git_repo_with_worktree,
    json_lines,
    last_user_text,
    message_counts,
    pristine,
    recorded_session,
    show,
    strings_outside_thinking,
    syncd,
    syncd_env,
    thinking_blocks,
    tool_script,
)
from tests.conftest import SAMPLES

# The first test pays for the npm install of the CLI (once per cache directory).
pytestmark = pytest.mark.timeout(1200)

PROMPT = "ok"
WIN_HOME = "C:\\Users\\bob"
WIN_PATH = WIN_HOME + "\\proj"
WIN_FOLDER = "C--Users-bob-proj"
LONG_TAIL = "a-very-long-directory-name/" * 9 + "project"

SAMPLE_FILES = {
    "sample-sungather": "tonyandrewmeyer-sungather-k8s-operator/projects/"
                        "-home-ubuntu-sungather-operator/51bf92be-2338-469f-95d8-17b190a2bdca.jsonl",
    "sample-charming": "tonyandrewmeyer-charming-with-claude/projects/"
                       "-home-ubuntu-charming-with-claude-experiments-2026-03-13-code-review-"
                       "skills-our-data/0a0eb7b7-3abb-4e69-aa2b-0ff2d27f24e8.jsonl",
    "sample-marot": "marot-spotter/projects/-home-USER-projects-spotter-worktrees-spotter-dov/"
                    "4d5611e5-241a-462a-8d15-5122611a9569.jsonl",
}
GENERATED = ["long-path", "unicode-path", "tools-subagent", "worktree", "windows"]
CASES = [*SAMPLE_FILES, *GENERATED]


@dataclass
class Case:
    name: str
    sid: str
    src: str                 # the project path the session was recorded in (its first cwd)
    dst: Path                # the project path it is restored to on the laptop
    baseline: Run            # `claude -p --resume SID ok` from src on the desk, before backup
    source: Path             # the backed-up transcript (as it is in the desk's tree)
    prompt: str | None = None
    model: list[str] = field(default_factory=list)  # `--model M` for every run of the case
    subagents: list[str] = field(default_factory=list)
    tool_results: list[str] = field(default_factory=list)


@dataclass
class World:
    tmp: Path
    a: Path
    b: Path
    store: Path
    maps: list[str]
    cases: dict[str, Case]
    backup: Any
    restore: Any
    continued: dict[str, Run] = field(default_factory=dict)  # `--continue` runs, by case

    def laptop_file(self, case: Case) -> Path:
        return self.b / ".claude" / "projects" / project_folder(str(case.dst)) / f"{case.sid}.jsonl"


def _place_sample(a: Path, rel: str) -> tuple[str, str, Path]:
    """Put a real transcript (and its <sid>/ directory) under HOME=a, rewriting only the
    recorded cwd prefix: "cwd":"/home/… becomes "cwd":"<a>/home/…."""
    src = SAMPLES / rel
    old, new = b'"cwd":"/home/', b'"cwd":"' + str(a).encode() + b"/home/"
    cwd = str(a) + first_cwd(src)
    sid = src.stem
    folder = a / ".claude" / "projects" / project_folder(cwd)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / src.name).write_bytes(src.read_bytes().replace(old, new))
    side = src.parent / sid
    if side.is_dir():
        for p in side.rglob("*"):
            if p.is_file():
                out = folder / sid / p.relative_to(side)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(p.read_bytes().replace(old, new))
    Path(cwd).mkdir(parents=True, exist_ok=True)
    return sid, cwd, folder / src.name


def _model_args(transcript: Path) -> list[str]:
    """``--model M`` for the model of the last main-chain assistant entry with a thinking
    block: 2.1.332 sends earlier thinking blocks only to the model that wrote them, so the
    thinking checks need the session's own model (the samples were written by older ones)."""
    model = None
    for doc in json_lines(transcript):
        if isinstance(doc, dict) and doc.get("type") == "assistant" and \
                not doc.get("isSidechain") and _thinking_of(doc):
            m = doc["message"].get("model")
            model = m if isinstance(m, str) else model
    return ["--model", model] if model else []


def _side_files(transcript: Path, kind: str) -> list[str]:
    d = transcript.parent / transcript.stem / kind
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()) if d.is_dir() else []


@pytest.fixture(scope="module")
def world(claude: Claude, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("e2e").resolve()
    a, b, store = tmp / "A", tmp / "B", tmp / "store"
    a.mkdir()
    b.mkdir()
    projects = a / ".claude" / "projects"
    recorded: dict[str, tuple[str, str, Path, str | None]] = {}  # name → sid, cwd, file, prompt

    def record(name: str, cwd: Path, prompt: str, *extra: str, respond: Any = None) -> None:
        cwd.mkdir(parents=True, exist_ok=True)
        run = claude.run(a, cwd, *extra, prompt, respond=respond)
        assert run.returncode == 0 and run.requests, f"recording {name}: {run.describe()}"
        folder = project_folder(str(cwd))
        sid = recorded_session(a, folder)
        recorded[name] = (sid, str(cwd), projects / folder / f"{sid}.jsonl", prompt)

    # Sessions recorded by the real CLI on the desk.
    long_path = a / "work" / "apple-tree" / LONG_TAIL  # also: the rule for <a>/work/app must
    record("long-path", long_path, "hello from a long path")  # not touch <a>/work/apple-tree
    assert len(project_folder(str(long_path))) > 200
    record("unicode-path", a / "My Projects" / "café ☕ 🍰" / "app", "hello from café")
    app = a / "work" / "app"
    app.mkdir(parents=True)
    (app / "notes.txt").write_text("notes of the app\n")
    record("tools-subagent", app, "read the notes and check the dir",
           "--allowedTools=Bash,Read,Agent", respond=tool_script(app))
    wt = git_repo_with_worktree(a / "src" / "repo", "feat")
    assert wt is not None
    record("worktree", wt, "hello from the worktree")
    assert project_folder(str(wt)).endswith("--claude-worktrees-feat")
    record("windows", a / "winsrc", "hello from windows")
    tools = recorded["tools-subagent"][2]
    assert _side_files(tools, "tool-results"), "the big Bash output was not persisted"
    assert _side_files(tools, "subagents"), "the Agent tool wrote no subagent transcript"

    # The real samples, placed under the desk's home.
    if (SAMPLES / "SOURCES.md").exists():
        for name, rel in SAMPLE_FILES.items():
            sid, cwd, path = _place_sample(a, rel)
            recorded[name] = (sid, cwd, path, None)

    # Baselines: resume every session from its original path. The runs append to the
    # transcripts, so the desk's tree is put back as it was before the backup.
    snapshot = tmp / "desk-claude-before-baselines"
    copy_tree(a / ".claude", snapshot)
    baselines: dict[str, Run] = {}
    for name, (sid, cwd, path, _prompt) in recorded.items():
        run = claude.run(a, Path(cwd), *_model_args(path), "--resume", sid, PROMPT)
        assert run.returncode == 0 and run.requests, f"baseline of {name}: {run.describe()}"
        baselines[name] = run
    copy_tree(snapshot, a / ".claude")

    # The Windows-origin session: its cwd becomes C:\Users\bob\proj (JSON-escaped).
    # 2.1.332 also keeps the system prompt, which names the session's memory folder
    # under the CLI's home: on Windows that is C:\Users\bob\.claude\projects\<folder>.
    sid, cwd, path, prompt = recorded["windows"]
    data = path.read_bytes()
    for old, new in ((str(path.parent), WIN_HOME + "\\.claude\\projects\\" + WIN_FOLDER),
                     (cwd, WIN_PATH)):
        data = data.replace(json.dumps(old)[1:-1].encode(), json.dumps(new)[1:-1].encode())
    assert str(a).encode() not in data, "the windows transcript still names the desk's home"
    assert project_folder(WIN_PATH) == WIN_FOLDER
    shutil.rmtree(path.parent)
    win = projects / WIN_FOLDER / f"{sid}.jsonl"
    win.parent.mkdir(parents=True)
    win.write_bytes(data)
    recorded["windows"] = (sid, WIN_PATH, win, prompt)

    # Back up the desk.
    backup = syncd(syncd_env(a, store, "desk"), "sync")
    assert backup.returncode == 0, show(backup)
    # Restores read what a daemon leaves: a snapshot (packs and a manifest), no segments.
    compacted = syncd(syncd_env(a, store, "desk"), "compact")
    assert compacted.returncode == 0 and "snapshot" in compacted.stdout, show(compacted)

    # The laptop: other project paths. The desk's home maps to B by itself.
    sample_root = a / "home"
    rules = [
        (f"{sample_root}/ubuntu", b / "src" / "ubuntu-work"),
        (f"{sample_root}/USER/projects/spotter-worktrees/spotter-dov", b / "code" / "spotter"),
        (str(a / "My Projects" / "café ☕ 🍰" / "app"), b / "Mes Projets" / "thé 🍵" / "app"),
        (str(app), b / "projects" / "app-renamed"),
        (str(a / "src" / "repo"), b / "checkouts" / "repo"),
        (WIN_PATH, b / "proj"),
    ]
    maps = [f"{old}={new}" for old, new in rules]

    def dst_of(src: str) -> Path:
        for old, new in sorted(rules, key=lambda r: len(r[0]), reverse=True):
            if src == old or src.startswith(old + "/"):
                return Path(str(new) + src[len(old):])
        assert src.startswith(str(a) + "/"), src
        return b / src[len(str(a)) + 1:]

    cases = {}
    for name, (sid, cwd, path, prompt) in recorded.items():
        cases[name] = Case(name, sid, cwd, dst_of(cwd), baselines[name], path, prompt,
                           _model_args(path), _side_files(path, "subagents"),
                           _side_files(path, "tool-results"))
    git_repo_with_worktree(b / "checkouts" / "repo", "feat")
    for case in cases.values():
        case.dst.mkdir(parents=True, exist_ok=True)

    restore = syncd(syncd_env(b, store, "laptop"), "restore", "--machine", "desk",
                    *[f"--map={m}" for m in maps])
    yield World(tmp, a, b, store, maps, cases, backup, restore)


def _case(world: World, name: str) -> Case:
    if name not in world.cases:
        pytest.skip(f"real transcripts not present at {SAMPLES}")
    assert world.restore.returncode == 0, show(world.restore)
    return world.cases[name]


ENV_UPDATE = "# Environment update"


def _without_env_update(run: Run) -> Run:
    """``run`` without the system message 2.1.332 appends last when the environment
    changed since the transcript was written (a worktree session continued from the main
    checkout: "The primary working directory is no longer a git worktree"), which it must
    carry."""
    last = run.requests[-1]["messages"] if run.requests else []
    tail = last[-1] if last else {}
    content = tail.get("content")
    text = content if isinstance(content, str) else "".join(
        b.get("text", "") for b in content or [] if isinstance(b, dict))
    assert tail.get("role") == "system" and text.startswith(ENV_UPDATE), (
        f"the last message is not an environment update: {json.dumps(tail)[:300]}")
    requests = [*run.requests[:-1], {**run.requests[-1], "messages": last[:-1]}]
    return Run(run.args, run.cwd, run.returncode, run.stdout, run.stderr, requests)


def _assert_same_conversation(case: Case, run: Run) -> None:
    base = case.baseline
    assert run.returncode == 0 and run.requests, (
        f"{case.name}: {run.describe()}\n  baseline: {base.describe()}")
    assert message_counts(run.requests) == message_counts(base.requests), (
        f"{case.name}: the CLI did not send the restored conversation "
        f"(first user text {first_user_text(run.requests[0])[:300]!r})\n  {run.describe()}\n"
        f"  baseline: {base.describe()}")
    assert [m["role"] for m in run.requests[-1]["messages"]] == [
        m["role"] for m in base.requests[-1]["messages"]]
    assert PROMPT in last_user_text(run.requests[-1])
    assert ENV_UPDATE not in json.dumps(run.requests[-1]["messages"][-1])
    got, want = thinking_blocks(run.requests), thinking_blocks(base.requests)
    if case.source.read_bytes().count(b'"type":"thinking"'):
        assert want, f"{case.name}: the baseline request carries no thinking block"
    assert len(got) == len(want), f"{case.name}: {len(got)} thinking blocks, baseline {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"{case.name}: thinking block {i} differs from the baseline request"


def test_backup_records_the_desk(world: World) -> None:
    doc = json.loads((world.store / "machines" / "desk" / "machine.json").read_text())
    assert doc["home"] == str(world.a) and doc["claude_root"] == str(world.a / ".claude"), doc


def _thinking_of(entry: dict[str, Any]) -> list[Any]:
    msg = entry.get("message")
    content = msg.get("content") if isinstance(msg, dict) else None
    return [b for b in content if isinstance(b, dict) and b.get("type") in (
        "thinking", "redacted_thinking")] if isinstance(content, list) else []


# -- layout ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_restored_transcript_layout(world: World, name: str) -> None:
    """The transcript lands in Claude's folder for the new path, with its subagents and
    tool results, every cwd rewritten and every uuid, sessionId and thinking byte kept."""
    case = _case(world, name)
    dst = world.laptop_file(case)
    folder = dst.parent
    assert dst.is_file(), (f"{name}: no {dst.relative_to(world.b)}; restored: "
                           f"{sorted(files_under(world.b / '.claude' / 'projects'))[:40]}")
    assert dst.stat().st_mode & 0o077 == 0
    src_lines, dst_lines = json_lines(case.source), json_lines(dst)
    assert len(dst_lines) == len(src_lines)
    for i, (s, d) in enumerate(zip(src_lines, dst_lines, strict=True)):
        if not isinstance(s, dict):
            continue
        assert isinstance(d, dict), f"{name}: line {i + 1} no longer parses"
        for key in ("uuid", "parentUuid", "sessionId", "agentId"):
            assert d.get(key) == s.get(key), f"{name}: line {i + 1} {key} changed"
        assert _thinking_of(d) == _thinking_of(s), f"{name}: line {i + 1} thinking changed"
        if isinstance(d.get("cwd"), str):
            cwd = d["cwd"]
            assert cwd == str(case.dst) or cwd.startswith(f"{case.dst}/"), (
                f"{name}: line {i + 1} cwd {cwd!r} is not under {case.dst}")
    raw_src, raw_dst = case.source.read_bytes(), dst.read_bytes()
    sigs = re.findall(rb'"signature":"(?:[^"\\]|\\.)*"', raw_src)
    assert re.findall(rb'"signature":"(?:[^"\\]|\\.)*"', raw_dst) == sigs
    for kind, names in (("subagents", case.subagents), ("tool-results", case.tool_results)):
        side = folder / case.sid / kind
        assert sorted(str(p.relative_to(side)) for p in side.rglob("*") if p.is_file()) == names, (
            f"{name}: {kind} not moved along to {side}")
    for agent in (folder / case.sid / "subagents").glob("*.jsonl"):
        for doc in json_lines(agent):
            if isinstance(doc, dict) and isinstance(doc.get("cwd"), str):
                assert doc["cwd"].startswith(str(case.dst)), f"{agent.name}: {doc['cwd']}"


# -- the real CLI on the laptop ----------------------------------------------------------

def _continue(claude: Claude, world: World, case: Case) -> Run:
    """`claude -p --continue ok` from the new path, once per case (the tree is put back)."""
    if case.name not in world.continued:
        with pristine(world.laptop_file(case).parent):
            world.continued[case.name] = claude.run(world.b, case.dst, *case.model,
                                                    "--continue", PROMPT)
    return world.continued[case.name]


@pytest.mark.parametrize("name", CASES)
def test_continue_sends_the_full_restored_conversation(claude: Claude, world: World,
                                                       name: str) -> None:
    case = _case(world, name)
    _assert_same_conversation(case, _continue(claude, world, case))


@pytest.mark.parametrize("name", CASES)
def test_continue_sends_no_desk_paths(claude: Claude, world: World, name: str) -> None:
    """Paths in the conversation (tool inputs and results, persisted-output stubs) point
    at the laptop; thinking blocks are the exception, they are never rewritten."""
    case = _case(world, name)
    run = _continue(claude, world, case)
    assert run.returncode == 0 and run.requests, run.describe()
    text = strings_outside_thinking(run.requests)
    for old in {str(world.a), case.src}:
        at = text.find(old)
        assert at < 0, (f"{name}: the request still names {old!r}, outside thinking blocks: "
                        f"{text[max(0, at - 120):at + len(old) + 40]!r}")
    # Persisted tool outputs the desk had (the samples also name files of their original
    # machines, which were never published) must be readable on the laptop.
    refs = re.compile(r"/[^\s\"'<>]*/tool-results/[^\s\"'<>]+")
    had = [r for r in refs.findall(strings_outside_thinking(case.baseline.requests))
           if r.startswith(f"{world.a}/")]
    now = [r for r in refs.findall(text) if r.startswith(f"{world.b}/")]
    assert len(now) == len(had), f"{name}: tool-results paths {had} became {now}"
    for ref in now:
        assert Path(ref).is_file(), f"{name}: the request points at {ref}, which is missing"


@pytest.mark.parametrize("name", CASES)
def test_resume_finds_the_restored_session(claude: Claude, world: World, name: str) -> None:
    case = _case(world, name)
    with pristine(world.laptop_file(case).parent):
        run = claude.run(world.b, case.dst, *case.model, "--resume", case.sid, PROMPT)
    _assert_same_conversation(case, run)


def test_worktree_folded_into_the_main_checkout(claude: Claude, world: World) -> None:
    """`--worktrees fold`: the worktree session continues from the main checkout."""
    case = world.cases["worktree"]
    c = world.tmp / "C"
    repo = c / "src" / "repo"
    git_repo_with_worktree(repo, None)
    r = syncd(syncd_env(c, world.store, "laptop2"), "restore", "--machine", "desk",
              "--session", case.sid, "--worktrees", "fold")
    assert r.returncode == 0, show(r)
    folder = c / ".claude" / "projects" / project_folder(str(repo))
    assert (folder / f"{case.sid}.jsonl").is_file(), (
        f"not in the main checkout's folder {folder.name}: "
        f"{sorted(files_under(c / '.claude' / 'projects'))}")
    cwds = {doc["cwd"] for doc in json_lines(folder / f"{case.sid}.jsonl")
            if isinstance(doc, dict) and "cwd" in doc}
    assert cwds == {str(repo)}, f"folded session keeps cwds {cwds}"
    with pristine(folder):
        cont = claude.run(c, repo, "--continue", PROMPT)
    _assert_same_conversation(case, _without_env_update(cont))
    with pristine(folder):
        res = claude.run(c, repo, "--resume", case.sid, PROMPT)
    _assert_same_conversation(case, _without_env_update(res))


def test_resume_command_prints_a_working_line(claude: Claude, world: World) -> None:
    """`syncd resume SID` on a third machine restores the session under that machine's
    home (no rules given) and prints a `cd … && claude --resume SID` line that works in
    a shell, quoting a path with spaces and non-ASCII characters."""
    case = world.cases["unicode-path"]
    d = world.tmp / "D"
    project = d / "My Projects" / "café ☕ 🍰" / "app"
    project.mkdir(parents=True)
    r = syncd(syncd_env(d, world.store, "tablet"), "resume", case.sid)
    assert r.returncode == 0, show(r)
    lines = [ln for ln in r.stdout.splitlines()
             if re.fullmatch(rf"cd .+ && claude --resume {re.escape(case.sid)}", ln.strip())]
    assert lines, f"no `cd … && claude --resume {case.sid}` line: {show(r)}"
    line = lines[-1].strip()
    assert shlex.split(line[3:line.index(" && claude")]) == [str(project)], line
    folder = d / ".claude" / "projects" / project_folder(str(project))
    assert (folder / f"{case.sid}.jsonl").is_file()
    with pristine(folder):
        run = claude.shell(d, line)
    _assert_same_conversation(case, run)


def test_sessions_lists_the_backup(world: World) -> None:
    """`syncd sessions --machine desk --json` on a machine that has none of them."""
    e = world.tmp / "E"
    r = syncd(syncd_env(e, world.store, "other"), "sessions", "--machine", "desk", "--json")
    assert r.returncode == 0, show(r)
    doc = json.loads(r.stdout)
    rows = doc["sessions"] if isinstance(doc, dict) else doc
    by_id = {row["session_id"]: row for row in rows}
    for case in world.cases.values():
        row = by_id.get(case.sid)
        assert row is not None, f"{case.name} ({case.sid}) not listed: {sorted(by_id)}"
        assert {"session_id", "machine", "project", "title", "size", "last_activity",
                "local"} <= set(row), row
        assert row["machine"] == "desk" and row["project"] == case.src, row
        assert row["size"] > 0 and row["local"] is False, row
        if case.prompt is not None:
            assert row["title"] == case.prompt, row


def test_dry_run_writes_nothing(world: World) -> None:
    f = world.tmp / "F"
    r = syncd(syncd_env(f, world.store, "other2"), "restore", "--machine", "desk", "--dry-run",
              "--json", *[f"--map={m}" for m in world.maps])
    assert r.returncode == 0, show(r)
    plan = json.loads(r.stdout)
    text = json.dumps(plan, ensure_ascii=False)
    for case in world.cases.values():
        assert case.sid in text, f"{case.name} missing from the plan"
    assert files_under(f / ".claude") == {}

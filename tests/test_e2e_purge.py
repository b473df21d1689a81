"""``syncd redact`` and ``syncd forget`` leave sessions the real Claude Code CLI still uses
(issue 28).

Redact: the CLI (print mode, against the loopback stand-in) records a session whose prompt
holds a GitHub token; the stand-in's answer thinks about it (a thinking block with a
signature), echoes it with a Bash tool call (its input and its result) and in text. After
``syncd sync`` and ``syncd redact PATTERN`` the token is masked everywhere but inside the
signed thinking block, which is reported and left byte for byte; ``claude --resume`` then
sends the conversation the unredacted session sent, masked where it was redacted, with
the thinking block and its signature as the API signed them; and a restore of the backup
into another machine's home is masked too and resumes there.

Forget: two interactive sessions of one project (the second begun by ``/clear``, so both
have ``history.jsonl`` lines). ``syncd forget --session S --local`` of the newer one turns
its history lines into spaces; then ``claude -p --continue`` picks the other one, the
interactive CLI reads the history without the spaces lines (its Up-arrow navigator), and
its ``/resume`` picker lists the other session and not S. Forgotten without ``--local``
and resumed here, S does not ship again (its history lines ship as spaces).

Skipped when npm (for the CLI) or, for the picker, tmux is not on PATH, as the other
end-to-end tests are.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from syncd.claude import project_folder
from tests.claude_fixtures import (
    PROMPT_LINE,
    Claude,
    Interactive,
    Picker,
    Run,
    answer_to,
    copy_tree,
    files_under,
    first_user_text,
    json_lines,
    last_user_text,
    pristine,
    recorded_session,
    show,
    skip_first_run,
    strings_outside_thinking,
    syncd,
    syncd_env,
    thinking_blocks,
)
from tests.helpers import wait_for
from tests.standin import Block
from tests.terminal import Terminal

pytestmark = pytest.mark.timeout(1200)  # the first test may pay for the npm install

SECRET = "ghp_" + "aB3dE5gH7jK9mN1pQ2sT4vW6yZ8cF0hJ2kL4"  # a GitHub token's shape
PATTERN = "ghp_[A-Za-z0-9]{36}"
MASKED = "[REDACTED" + "*" * (len(SECRET) - 10) + "]"  # the same length as SECRET
THINKING: Block = {"type": "thinking", "signature": "c2lnbmVkLWJ5LXRoZS1zdGFuZC1pbi0wMDE=",
                   "thinking": f"The user pasted {SECRET}; echo it back to check it."}
PROMPT = f"keep my token {SECRET} for the deploy"
ANSWER = f"Your token {SECRET} is kept."
LATER = "go on"


def token_script(body: dict[str, Any]) -> list[Block]:
    """Think about the token and echo it with Bash (an output big enough that the CLI
    keeps it in ``<sid>/tool-results/<id>.txt``, plain text, and sends a preview), then
    say it in text."""
    if any(m.get("role") == "assistant" for m in body.get("messages", [])):
        return [{"type": "text", "text": ANSWER}]
    return [THINKING, {"type": "tool_use", "id": "toolu_echo_token", "name": "Bash",
                       "input": {"command": f"echo {SECRET}; seq 1 8000",
                                 "description": "Echo it, and enough to be persisted"}}]


def quiet(root: Path) -> None:
    """Every file under ``root`` last written a minute ago: as after Claude has ended and
    the session has been quiet (redact and forget change a file here only then). A minute
    is far inside Claude's cleanup period."""
    past = time.time() - 60
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            os.utime(p, (past, past))


def masked(x: Any) -> Any:
    """``x`` (parsed JSON) as redact must leave it: SECRET masked in every string but
    those of thinking blocks."""
    if isinstance(x, str):
        return x.replace(SECRET, MASKED)
    if isinstance(x, list):
        return [masked(y) for y in x]
    if isinstance(x, dict):
        if x.get("type") in ("thinking", "redacted_thinking"):
            return x
        return {k: masked(v) for k, v in x.items()}
    return x


def without_thinking(x: Any) -> str:
    """``x`` (parsed JSON) as text, its thinking blocks left out."""
    def strip(y: Any) -> Any:
        if isinstance(y, list):
            return [strip(z) for z in y if not (isinstance(z, dict) and z.get("type") in (
                "thinking", "redacted_thinking"))]
        if isinstance(y, dict):
            return {k: strip(v) for k, v in y.items()}
        return y
    return json.dumps(strip(x), ensure_ascii=False)


def signed_lines(transcript: Path) -> list[bytes]:
    """The transcript's lines that hold a thinking block, as bytes."""
    return [ln for ln in transcript.read_bytes().splitlines(keepends=True)
            if b'"type":"thinking"' in ln]


def signed_blocks(transcript: Path) -> list[bytes]:
    """The raw bytes of every thinking block of the transcript (its cwd may be another)."""
    return re.findall(rb'\{"type":"thinking","thinking":"(?:[^"\\]|\\.)*",'
                      rb'"signature":"(?:[^"\\]|\\.)*"\}', transcript.read_bytes())


def leaks(root: Path) -> list[str]:
    """Files under ``root`` that hold SECRET anywhere but in a thinking block."""
    out = []
    for rel, data in files_under(root).items():
        if SECRET.encode() not in data:
            continue
        for i, line in enumerate(data.splitlines(), 1):
            if SECRET.encode() not in line:
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                doc = None
            if doc is None or SECRET in without_thinking(doc):
                out.append(f"{rel} line {i}: {line[:200]!r}")
    return out


def moved(x: Any, paths: list[tuple[Path, Path]]) -> Any:
    """``x`` (parsed JSON) with each old path of ``paths`` replaced by its new one."""
    text = json.dumps(x)
    for old, new in paths:
        text = text.replace(json.dumps(str(old))[1:-1], json.dumps(str(new))[1:-1])
    return json.loads(text)


def assert_resumed_masked(run: Run, baseline: Run,
                          paths: list[tuple[Path, Path]] | None = None) -> None:
    """``run`` resumed the redacted session: it sent what ``baseline`` (the same resume
    before redaction) sent, masked (and its ``paths`` moved), with the thinking block as
    the API signed it."""
    assert run.returncode == 0 and run.requests, run.describe()
    assert thinking_blocks(run.requests) == [THINKING], (
        f"thinking blocks sent: {thinking_blocks(run.requests)}\n{run.describe()}")
    text = strings_outside_thinking(run.requests)
    assert SECRET not in text, f"the resumed request carries the token:\n{run.describe()}"
    for where in (f"keep my token {MASKED}", f"echo {MASKED}", f"Your token {MASKED}"):
        assert where in text, f"{where!r} not in the resumed request:\n{run.describe()}"
    got = run.requests[-1]["messages"]
    want = moved(masked(baseline.requests[-1]["messages"]), paths or [])
    assert [m["role"] for m in got] == [m["role"] for m in want], run.describe()
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g["role"] != "system":  # the system message names the machine's paths
            assert g == w, f"message {i} differs from the masked baseline:\n{g}\n{w}"
    assert LATER in last_user_text(run.requests[-1])


def test_the_cli_resumes_a_redacted_session_here_and_restored(claude: Claude,
                                                              tmp_path: Path) -> None:
    tmp = tmp_path.resolve()
    a, b = tmp / "A" / "home" / "alice", tmp / "B" / "users" / "bob"
    here = a / "code" / "vault"
    here.mkdir(parents=True)
    rec = claude.run(a, here, "--allowedTools=Bash", PROMPT, respond=token_script)
    assert rec.returncode == 0 and len(rec.requests) == 2 and ANSWER in rec.stdout, \
        rec.describe()
    tool_result = json.dumps(rec.requests[-1]["messages"][-1])
    assert SECRET in tool_result and "tool_result" in tool_result, "Bash did not echo it"
    sid = recorded_session(a, project_folder(str(here)))
    transcript = a / ".claude" / "projects" / project_folder(str(here)) / f"{sid}.jsonl"
    before = transcript.read_bytes()
    persisted = sorted((transcript.parent / sid / "tool-results").glob("*.txt"))
    assert len(persisted) == 1 and SECRET.encode() in persisted[0].read_bytes(), persisted
    output = persisted[0].read_bytes()
    signed = signed_lines(transcript)
    assert len(signed) == 1 and SECRET.encode() in signed[0], signed
    assert before.count(SECRET.encode()) >= 5, "prompt, thinking, tool input/result, answer"

    # Baseline: the same resume before redaction (the tree is put back afterwards).
    with pristine(a / ".claude"):
        baseline = claude.run(a, here, "--resume", sid, LATER)
    assert baseline.returncode == 0 and thinking_blocks(baseline.requests) == [THINKING], \
        baseline.describe()
    assert SECRET in strings_outside_thinking(baseline.requests)

    desk = syncd_env(a, tmp / "store", "desk")
    quiet(a / ".claude")
    r = syncd(desk, "sync")
    assert r.returncode == 0, show(r)
    r = syncd(desk, "redact", PATTERN)
    assert r.returncode == 0, show(r)
    assert "inside a thinking string" in r.stderr, f"the signed match is not reported: {show(r)}"

    # Here: the same bytes but the token, masked where it may be; the signed line as it was.
    after = transcript.read_bytes()
    assert len(after) == len(before) and after.count(b"\n") == before.count(b"\n")
    assert signed_lines(transcript) == signed
    old_lines, new_lines = json_lines_of(before), json_lines(transcript)
    for i, (old, new) in enumerate(zip(old_lines, new_lines, strict=True), 1):
        assert new == masked(old), f"line {i} is not the masked line:\n{old}\n{new}"
    assert persisted[0].read_bytes() == output.replace(SECRET.encode(), MASKED.encode())
    assert leaks(a / ".claude") == []
    assert MASKED.encode() in after
    r = syncd(desk, "sessions", "--json")
    assert r.returncode == 0 and sid in r.stdout and SECRET not in r.stdout, show(r)
    r = syncd(desk, "sync")  # the tree and the backup agree: nothing ships again
    assert r.returncode == 0 and r.stdout.startswith("synced: 0 files, 0 deletions, 0 bytes"), \
        show(r)

    resumed = claude.run(a, here, "--resume", sid, LATER)
    assert_resumed_masked(resumed, baseline)
    assert transcript.read_bytes().startswith(after), "the CLI did not resume in place"

    # Another machine, another home: the backup restores masked and resumes there.
    there = b / "code" / "vault"
    there.mkdir(parents=True)
    r = syncd(syncd_env(b, tmp / "store", "laptop"), "restore", "--machine", "desk",
              f"--map={a}={b}")
    assert r.returncode == 0, show(r)
    mine = b / ".claude" / "projects" / project_folder(str(there)) / f"{sid}.jsonl"
    assert mine.is_file(), sorted(files_under(b / ".claude"))
    assert leaks(b / ".claude") == []
    assert signed_blocks(mine) == signed_blocks(transcript) != []
    assert mine.read_bytes().count(MASKED.encode()) == after.count(MASKED.encode())
    laptop = claude.run(b, there, "--resume", sid, LATER)
    assert_resumed_masked(laptop, baseline, [(transcript.parent, mine.parent), (a, b)])

    # Here, the resumed turn ships as an append to the masked file, nothing else.
    r = syncd(desk, "sync")
    grown = len(transcript.read_bytes()) - len(after)
    assert r.returncode == 0 and r.stdout.startswith(f"synced: 1 files, 0 deletions, "
                                                     f"{grown} bytes"), show(r)


def json_lines_of(data: bytes) -> list[Any]:
    out = []
    for line in data.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append(None)
    return out


# -- forget: history lines of spaces ------------------------------------------------------

KEPT, GONE = "first plan the shed", "second paint the fence"


def history(home: Path) -> list[bytes]:
    return (home / ".claude" / "history.jsonl").read_bytes().splitlines(keepends=True)


def history_session(line: bytes) -> str | None:
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc.get("sessionId") if isinstance(doc, dict) else None


def pick(claude: Claude, home: Path, project: Path, *args: str) -> Picker:
    """The ``/resume`` picker of the CLI in ``project`` (which leaves a session of its own:
    run it last, or on a copy)."""
    with Interactive(claude.binary, home, project, *args) as cli:
        picker = cli.picker()
        cli.terminal.key("Escape")
        wait_for(lambda: Picker.read(cli.terminal.screen()) is None, 60, "the picker to close",
                 explain=cli.terminal.explain)
        cli.exit()
    return picker


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not on PATH: cannot "
                    "drive the interactive CLI")
def test_forget_leaves_history_spaces_the_cli_reads(claude: Claude, tmp_path: Path) -> None:
    a = tmp_path.resolve() / "A" / "home" / "alice"
    here = a / "code" / "garden"
    here.mkdir(parents=True)
    skip_first_run(a, here)
    with Interactive(claude.binary, a, here) as cli:
        cli.ask(KEPT)
        cli.submit("/clear")  # the next prompt begins another session
        wait_for(lambda: answer_to(KEPT) not in cli.terminal.screen()
                 and empty_input(cli.terminal.screen()), 60,
                 "/clear to clear the screen", explain=cli.terminal.explain)
        cli.ask(GONE)
        cli.exit()
    lines = history(a)
    kept = next(history_session(ln) for ln in lines if KEPT.encode() in ln)
    gone = next(history_session(ln) for ln in lines if GONE.encode() in ln)
    assert kept and gone and kept != gone, lines
    folder = a / ".claude" / "projects" / project_folder(str(here))
    t_kept, t_gone = folder / f"{kept}.jsonl", folder / f"{gone}.jsonl"
    assert t_gone.stat().st_mtime > t_kept.stat().st_mtime  # --continue would pick it
    assert {history_session(ln) for ln in lines} == {kept, gone}, lines
    # Before: the picker lists both (on a copy: a picker run leaves a session file).
    scratch = a.parent / "scratch"
    copy_tree(a / ".claude", scratch / ".claude")
    skip_first_run(scratch, here)
    assert pick(claude, scratch, here).titles == [GONE, KEPT]

    desk = syncd_env(a, tmp_path / "store", "desk")
    quiet(a / ".claude")
    r = syncd(desk, "sync")
    assert r.returncode == 0, show(r)
    kept_bytes = t_kept.read_bytes()
    r = syncd(desk, "forget", "--session", gone, "--local")
    assert r.returncode == 0, show(r)

    assert not t_gone.exists() and not (folder / gone).exists()
    assert t_kept.read_bytes() == kept_bytes
    spaced = history(a)
    assert len(spaced) == len(lines)
    for old, new in zip(lines, spaced, strict=True):
        if history_session(old) == gone:
            assert new == b" " * (len(old) - 1) + b"\n", new
        else:
            assert new == old
    assert sum(1 for ln in spaced if not ln.strip()) == 2  # GONE and /exit

    # Print mode: the CLI works in this tree, and --continue picks the other session.
    with pristine(folder):
        cont = claude.run(a, here, "--continue", "ok")
    assert cont.returncode == 0 and cont.requests, cont.describe()
    sent = json.dumps(cont.requests[-1]["messages"])
    assert KEPT in first_user_text(cont.requests[-1]) and answer_to(KEPT) in sent, \
        cont.describe()
    assert GONE not in sent and gone not in sent
    assert history(a) == spaced, "print mode changed history.jsonl"

    # Interactive, with --debug: the history the input line recalls has the two prompts
    # left of this project ("/clear" and KEPT), not the lines of spaces; the picker lists
    # the other session only.
    with Interactive(claude.binary, a, here, "--debug") as cli:
        for n, entry in ((2, "/clear"), (1, KEPT)):
            cli.terminal.key("Up")
            wait_for(functools.partial(recalled, cli.terminal, n, entry), 60,
                     f"Up to recall history entry {n} ({entry!r})", explain=cli.terminal.explain)
        cli.terminal.key("C-u")
        wait_for(lambda: empty_input(cli.terminal.screen()), 60, "the input line to empty",
                 explain=cli.terminal.explain)
        picker = cli.picker()
        assert picker.titles == [KEPT] and picker.selected == KEPT, picker.screen
        assert GONE not in picker.screen
        cli.terminal.key("Escape")
        wait_for(lambda: Picker.read(cli.terminal.screen()) is None, 60, "the picker to close",
                 explain=cli.terminal.explain)
        cli.exit()
    logs = "".join(p.read_text(errors="replace") for p in (a / ".claude" / "debug").glob("*.txt"))
    assert logs and not re.search(r"history line", logs, re.I), re.findall(
        r".*history line.*", logs, re.I)
    now = history(a)
    assert now[:len(spaced)] == spaced, "the CLI rewrote the lines before its own"

    # The backup, synced again, holds nothing of the forgotten session, and the history
    # as it is here.
    r = syncd(desk, "sync")
    assert r.returncode == 0, show(r)
    c = tmp_path.resolve() / "C" / "home" / "carol"
    r = syncd(syncd_env(c, tmp_path / "store", "laptop"), "restore", "--machine", "desk")
    assert r.returncode == 0, show(r)
    got = files_under(c / ".claude")
    assert [p for p, data in got.items() if gone.encode() in data or GONE.encode() in data
            or gone in p] == []
    assert got["history.jsonl"].replace(str(c).encode(), str(a).encode()) == b"".join(now)


def empty_input(screen: str) -> bool:
    return any(ln.strip() == PROMPT_LINE.strip() for ln in screen.splitlines())


def recalled(term: Terminal, n: int, entry: str) -> bool:
    """The input line shows history entry ``n`` of 2 (the navigator's count) as ``entry``."""
    rows = term.screen().splitlines()
    return any(f"History {n}/2" in r for r in rows) and any(
        r.strip() == PROMPT_LINE + entry for r in rows)


LATER_PROMPT = "one more thing about the fence"


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not on PATH: cannot "
                    "drive the interactive CLI")
def test_a_session_forgotten_but_kept_here_never_ships_again(claude: Claude,
                                                             tmp_path: Path) -> None:
    """``syncd forget --session S`` without ``--local`` keeps S's files here, marked
    forgotten: after the user resumes S in the CLI (its transcript grows, history.jsonl
    gains lines naming it), ``syncd sync`` ships none of it, so a restore of the backup
    holds nothing of S."""
    a = tmp_path.resolve() / "A" / "home" / "alice"
    here = a / "code" / "garden"
    here.mkdir(parents=True)
    skip_first_run(a, here)
    with Interactive(claude.binary, a, here) as cli:
        cli.ask(GONE)
        cli.exit()
    sid = recorded_session(a, project_folder(str(here)))
    desk = syncd_env(a, tmp_path / "store", "desk")
    quiet(a / ".claude")
    r = syncd(desk, "sync")
    assert r.returncode == 0, show(r)
    r = syncd(desk, "forget", "--session", sid)
    assert r.returncode == 0, show(r)
    transcript = a / ".claude" / "projects" / project_folder(str(here)) / f"{sid}.jsonl"
    assert transcript.is_file() and sid.encode() not in b"".join(history(a))
    with Interactive(claude.binary, a, here, "--resume", sid) as cli:
        cli.ask(LATER_PROMPT)
        cli.exit()
    assert LATER_PROMPT.encode() in transcript.read_bytes()
    assert any(history_session(ln) == sid for ln in history(a))

    r = syncd(desk, "sync")
    assert r.returncode == 0, show(r)
    c = tmp_path.resolve() / "C" / "home" / "carol"
    r = syncd(syncd_env(c, tmp_path / "store", "laptop"), "restore", "--machine", "desk")
    assert r.returncode == 0, show(r)
    held = {p: data.count(sid.encode()) for p, data in files_under(c / ".claude").items()
            if sid.encode() in data or sid in p}
    assert held == {}, f"the backup holds the forgotten session again: {held}"

"""A session moved to another machine shows in that machine's ``/resume`` picker (issue 25).

Claude Code's picker lists the sessions of the project it runs in, and hides those
``claude -p`` writes (entrypoint ``sdk-cli``), so these tests run the real CLI as a
person does: interactively, in a terminal (tmux), typing and reading the screen
(tests/terminal.py), against the loopback stand-in for the Messages API.

Machine A (its own HOME) holds a two-prompt conversation typed into the CLI in
``~/code/picker-app``. Machine B (another HOME) keeps that project at another path,
``~/src/app-elsewhere``, and gets the session either by ``syncd restore --map`` from a
backup or by following A (its ``remap`` setting maps the project). Then B's CLI, started
in B's checkout, must list the session in ``/resume`` under the title A's own picker
shows, and choosing it must resume it: the next prompt's request carries the whole
earlier conversation, and B's turn is appended to the restored transcript with B's cwd.

A session the CLI's own ``/cd`` moved to another project on A (DESIGN §4a: the transcript
moves to that project's folder and gains a relocated record) is backed up as a move, and
restored to B in the mapped project it moved to, where the picker lists it and it resumes.

Skipped when tmux or npm is not on PATH (npm installs the CLI, as in
tests/test_e2e_claude.py).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from syncd.claude import project_folder
from syncd.format.segment import SegmentIndex
from syncd.repository import Repository
from syncd.store import open_store
from tests.claude_fixtures import (
    Claude,
    Interactive,
    Picker,
    answer_to,
    json_lines,
    recorded_session,
    show,
    skip_first_run,
    syncd,
    syncd_env,
)
from tests.helpers import wait_for
from tests.readers import read_index
from tests.seaweed import Seaweed
from tests.test_follow_e2e import DEADLINE, Pair, make_pair

pytestmark = [
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not on PATH: cannot "
                       "drive the interactive CLI"),
    pytest.mark.timeout(1200),  # the first test may pay for the npm install of the CLI
]

PROMPTS = ("plan the garden shed", "and now the roof")
LATER = "what about the door"


@dataclass
class Typed:
    """A session typed into the CLI on A, and what A's own picker shows for it."""

    sid: str
    project: Path
    transcript: Path
    title: str


def type_session(claude: Claude, home: Path, project: Path) -> Typed:
    """Type PROMPTS into the CLI in ``project`` under ``home``, exit, and read A's own
    picker for it (on a copy of the tree: a picker run leaves a session file of its own)."""
    project.mkdir(parents=True, exist_ok=True)
    skip_first_run(home, project)
    with Interactive(claude.binary, home, project) as cli:
        for p in PROMPTS:
            cli.ask(p)
        cli.exit()
    sid = recorded_session(home, project_folder(str(project)))
    transcript = home / ".claude" / "projects" / project_folder(str(project)) / f"{sid}.jsonl"
    assert {d.get("entrypoint") for d in json_lines(transcript)
            if isinstance(d, dict) and d.get("type") == "user"} == {"cli"}
    return Typed(sid, project, transcript, own_title(claude, home, project))


def own_title(claude: Claude, home: Path, project: Path) -> str:
    """The title A's own picker in ``project`` shows for its one session (the CLI's
    baseline), read on a copy of the tree: a picker run leaves a session file of its own."""
    scratch = home.parent / "scratch-home"
    shutil.copytree(home / ".claude", scratch / ".claude", symlinks=True)
    skip_first_run(scratch, project)
    with Interactive(claude.binary, scratch, project) as cli:
        own = cli.picker()
    assert own.titles == [PROMPTS[-1]], (
        f"A's own picker (the CLI's baseline) lists {own.titles}\n{own.screen}")
    assert own.selected is not None
    return own.selected


def _texts(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


def conversation(request: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of a request's user and assistant messages (the CLI's own system
    messages left out)."""
    return [(m["role"], _texts(m)) for m in request.get("messages", [])
            if m.get("role") in ("user", "assistant")]


def resume_from_picker(claude: Claude, home: Path, project: Path, typed: Typed,
                       a_home: Path, cwds: set[str] | None = None) -> Picker:
    """B's CLI in ``project``: ``/resume`` lists the session under A's title; Enter
    resumes it and the next prompt sends the whole conversation; B's turn lands in the
    restored transcript, whose cwds are B's (``cwds``, by default just ``project``), and
    no path of A's home is left in it (the system prompt 2.1.332 records names the memory
    folder under projects/). Returns what the picker showed."""
    skip_first_run(home, project)
    mine = home / ".claude" / "projects" / project_folder(str(project)) / f"{typed.sid}.jsonl"
    with Interactive(claude.binary, home, project) as cli:
        picker = cli.picker()
        assert picker.titles == [typed.title] and picker.selected == typed.title, (
            f"B's picker in {project} lists {picker.titles}, A's showed {typed.title!r}"
            f"\n{picker.screen}")
        before = mine.read_bytes()
        cli.terminal.key("Enter")
        cli.terminal.wait_screen(answer_to(PROMPTS[-1]), "the resumed conversation on screen")
        request = cli.ask(LATER)
        cli.exit()
    want = [r for p in PROMPTS for r in (("user", p), ("assistant", answer_to(p)))]
    got = conversation(request)
    assert len(got) == len(want) + 1, f"B sent {got}"
    for (role, text), (want_role, want_text) in zip(got, want, strict=False):
        assert role == want_role and want_text in text, f"B sent {got}, wanted {want}"
    assert got[-1][0] == "user" and LATER in got[-1][1], got[-1]
    # Resumed in place: the same file grew, and no other session was started.
    after = mine.read_bytes()
    assert after.startswith(before) and LATER.encode() in after[len(before):]
    listed = sorted(p.name for p in (home / ".claude" / "projects").glob("*/*.jsonl"))
    assert listed == [mine.name], listed
    got_cwds = {d["cwd"] for d in json_lines(mine) if isinstance(d, dict) and "cwd" in d}
    assert got_cwds == (cwds or {str(project)}), f"cwds in B's transcript: {got_cwds}"
    at = after.find(str(a_home).encode())
    assert at < 0, f"B's transcript names A's home: {after[max(0, at - 200):at + 200]!r}"
    return picker


def test_a_restored_session_is_in_the_picker_and_resumes(claude: Claude,
                                                         tmp_path: Path) -> None:
    a, b = tmp_path.resolve() / "A" / "home" / "alice", tmp_path.resolve() / "B" / "users" / "bob"
    typed = type_session(claude, a, a / "code" / "picker-app")
    store = tmp_path / "store"
    r = syncd(syncd_env(a, store, "desk"), "sync")
    assert r.returncode == 0, show(r)
    there = b / "src" / "app-elsewhere"
    there.mkdir(parents=True)
    r = syncd(syncd_env(b, store, "laptop"), "restore", "--machine", "desk",
              f"--map={typed.project}={there}")
    assert r.returncode == 0, show(r)
    resume_from_picker(claude, b, there, typed, a)


def test_a_followed_session_is_in_the_picker_and_resumes(
        claude: Claude, tmp_path: Path, seaweed: Seaweed, bucket: str) -> None:
    pair: Pair = make_pair(tmp_path.resolve(), seaweed, bucket)
    a, b = pair.both
    try:
        here, there = a.home / "code" / "picker-app", b.home / "src" / "app-elsewhere"
        there.mkdir(parents=True)
        b.env["SYNCD_REMAP"] = json.dumps({str(here): str(there)})
        pair.start()
        typed = type_session(claude, a.home, here)
        theirs = typed.transcript.read_bytes()
        mine = b.folder(there) / f"{typed.sid}.jsonl"

        def arrived() -> bool:
            return mine.is_file() and len(json_lines(mine)) == len(theirs.splitlines())
        wait_for(arrived, DEADLINE, f"b to import a's session into {mine.parent.name}",
                 explain=pair.explain)
        resume_from_picker(claude, b.home, there, typed, a.home)
        pair.finish()
    finally:
        pair.stop()


# -- a session moved by /cd ----------------------------------------------------------------

MOVED = "Moved to"  # what 2.1.332's /cd prints once the session has moved


def relocated_cwds(transcript: Path) -> list[str]:
    """The ``relocatedCwd`` of each relocated record of ``transcript``, in order."""
    return [d["relocatedCwd"] for d in json_lines(transcript)
            if isinstance(d, dict) and d.get("type") == "relocated"]


def store_indexes(store: Path, machine: str) -> list[SegmentIndex]:
    """The machine's segment indexes, in order."""
    s = open_store(store.as_uri(), create=False)
    return [read_index(s, key, size) for key, size in Repository(s, machine).segments()]


def test_a_session_moved_by_cd_is_restored_where_it_moved_and_resumes(
        claude: Claude, tmp_path: Path) -> None:
    """On A a session begun in ``code/shed`` is backed up, moved by the CLI's own
    ``/cd code/shed-roof`` (2.1.332 moves ``<sid>.jsonl`` to that project's folder and
    appends a relocated record) and continued there, and backed up again: the store
    records the move as a copy from the old path. Restored to B with A's home mapped to
    B's, the session is in B's picker in the mapped ``shed-roof`` under A's title and
    resumes with the turns from before and after the move; its ``relocatedCwd`` and cwds
    name B's directories."""
    a, b = tmp_path.resolve() / "A" / "home" / "alice", tmp_path.resolve() / "B" / "users" / "bob"
    p1, p2 = a / "code" / "shed", a / "code" / "shed-roof"
    for p in (p1, p2):
        p.mkdir(parents=True)
    store = tmp_path / "store"
    desk = syncd_env(a, store, "desk")
    skip_first_run(a, p1, p2)
    before = a / ".claude" / "projects" / project_folder(str(p1))
    with Interactive(claude.binary, a, p1) as cli:
        cli.ask(PROMPTS[0])
        sid = recorded_session(a, before.name)
        old = before / f"{sid}.jsonl"
        wait_for(lambda: answer_to(PROMPTS[0]).encode() in old.read_bytes(), DEADLINE,
                 "the first answer in A's transcript", explain=cli.terminal.explain)
        r = syncd(desk, "sync")  # the session is shipped where it began
        assert r.returncode == 0, show(r)
        cli.submit(f"/cd {p2}")
        cli.terminal.wait_screen(f"{MOVED} {p2}", "/cd to move the session")
        cli.ask(PROMPTS[1])
        cli.exit()
    moved = a / ".claude" / "projects" / project_folder(str(p2)) / f"{sid}.jsonl"
    assert moved.is_file() and not old.exists(), sorted(
        str(p.relative_to(a)) for p in (a / ".claude" / "projects").rglob("*.jsonl"))
    assert relocated_cwds(moved) and set(relocated_cwds(moved)) == {str(p2)}, \
        relocated_cwds(moved)
    typed = Typed(sid, p2, moved, own_title(claude, a, p2))

    r = syncd(desk, "sync")
    assert r.returncode == 0, show(r)
    rel = f"projects/{project_folder(str(p2))}/{sid}.jsonl".encode()
    src = f"projects/{before.name}/{sid}.jsonl".encode()
    indexes = store_indexes(store, "desk")
    copies = [c for ix in indexes for c in ix.copies if c.path == rel]
    assert [c.src for c in copies] == [src], f"copies of {rel!r}: {copies}"
    first = moved.read_bytes().find(answer_to(PROMPTS[0]).encode())
    assert copies[0].at == copies[0].start == 0 and copies[0].end > first > 0, copies[0]
    # What was shipped before the move is not shipped again.
    shipped = [(x.start, x.end) for ix in indexes for x in ix.extents
               if x.path == rel and x.gen == copies[0].gen]
    assert shipped and min(start for start, _ in shipped) >= copies[0].end, \
        (shipped, copies[0])

    q1, q2 = b / "code" / "shed", b / "code" / "shed-roof"
    q2.mkdir(parents=True)  # B has checked out only the project the session moved to
    r = syncd(syncd_env(b, store, "laptop"), "restore", "--machine", "desk", f"--map={a}={b}")
    assert r.returncode == 0, show(r)
    mine = b / ".claude" / "projects" / project_folder(str(q2)) / f"{sid}.jsonl"
    assert mine.is_file(), sorted(
        str(p.relative_to(b)) for p in (b / ".claude" / "projects").rglob("*.jsonl"))
    assert set(relocated_cwds(mine)) == {str(q2)}, relocated_cwds(mine)
    resume_from_picker(claude, b, q2, typed, a, cwds={str(q1), str(q2)})
    # After B's turn the session is still placed by B's directory.
    assert relocated_cwds(mine) and set(relocated_cwds(mine)) == {str(q2)}, \
        relocated_cwds(mine)

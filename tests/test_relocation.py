"""One folder per session: a session restored under other rules earlier moves to the
folder the new rules give, keeping what was written to it since; a copy that cannot move
is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from syncd.claude import project_folder
from syncd.repository import Repository
from syncd.restore.remap import Rule
from syncd.restore.restorer import restore
from syncd.store import MemoryStore
from tests.test_restore_remap import SID, _line, _opts, alice  # noqa: F401 (a fixture)


def _sessions_on_disk(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root / "projects"))
                  for p in (root / "projects").glob(f"*/{SID}.jsonl"))


def test_a_later_remap_moves_the_session_with_what_was_written_since(
        alice: tuple[MemoryStore, Path], tmp_path: Path) -> None:  # noqa: F811
    store, _ = alice
    repo = Repository(store, "desk")
    root = tmp_path / "bob" / ".claude"
    # `syncd resume` without --map: the home rule alone.
    restore(repo, _opts(tmp_path, sessions=(SID,)))
    old = root / "projects" / "-home-bob-app"
    here = _line(SID, "L9", "/home/bob/app", "continued here", ts="2027-01-01T00:00:00.000Z")
    with open(old / f"{SID}.jsonl", "ab") as fh:
        fh.write(here)
    # Then a restore that maps the project elsewhere.
    dry = restore(repo, _opts(tmp_path, dry_run=True,
                              maps=(Rule("/home/alice/app", "/home/bob/src/app"),)))
    [planned] = [a for a in dry.actions if a.action == "move"]
    assert planned.source == f"projects/-home-bob-app/{SID}.jsonl"
    assert planned.path == f"projects/{project_folder('/home/bob/src/app')}/{SID}.jsonl"
    assert (old / f"{SID}.jsonl").exists()  # a dry run moves nothing

    r = restore(repo, _opts(tmp_path, maps=(Rule("/home/alice/app", "/home/bob/src/app"),)))
    assert r.errors == [] and r.notes == []
    new = root / "projects" / project_folder("/home/bob/src/app")
    assert _sessions_on_disk(root) == [f"{new.name}/{SID}.jsonl"]
    assert not old.exists()  # nothing else was in it
    lines = [json.loads(x) for x in (new / f"{SID}.jsonl").read_bytes().splitlines()]
    assert lines[-1]["uuid"] == "L9" and lines[-1]["cwd"] == "/home/bob/src/app"
    assert lines[0]["cwd"] == "/home/bob/src/app"
    assert json.loads((new / SID / "subagents" / "agent-x.meta.json").read_bytes()) == {
        "worktreePath": "/home/bob/src/app"}
    moved = {a.source for a in r.actions if a.action == "move"}
    assert moved == {f"projects/-home-bob-app/{SID}.jsonl",
                     f"projects/-home-bob-app/{SID}/subagents/agent-x.jsonl",
                     f"projects/-home-bob-app/{SID}/subagents/agent-x.meta.json"}
    # And back: resume without --map moves it home again.
    restore(repo, _opts(tmp_path, sessions=(SID,)))
    assert _sessions_on_disk(root) == [f"-home-bob-app/{SID}.jsonl"]


def test_a_copy_that_cannot_move_is_named(alice: tuple[MemoryStore, Path],  # noqa: F811
                                          tmp_path: Path) -> None:
    store, _ = alice
    repo = Repository(store, "desk")
    root = tmp_path / "bob" / ".claude"
    rule = Rule("/home/alice/app", "/home/bob/src/app")
    stray = root / "projects" / "-home-bob-app" / f"{SID}.jsonl"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b'{"type":"user","uuid":"x"}\n')  # no cwd: its start is unknown
    r = restore(repo, _opts(tmp_path, maps=(rule,)))
    assert stray.exists()
    assert r.notes == [f"session {SID} is also in projects/-home-bob-app: its start "
                       "directory is unknown: left there"]
    # One whose new folder holds the session too: both stay, and the restore says so.
    stray.write_bytes(_line(SID, "u1", "/home/bob/app", "fix the bug"))
    r = restore(repo, _opts(tmp_path, maps=(rule,)))
    assert stray.exists() and len(_sessions_on_disk(root)) == 2
    assert "holds it too: left in both folders" in r.notes[0]


@pytest.mark.parametrize("name", ["x.jsonl", f"{SID}.jsonl.bak"])
def test_other_files_are_not_sessions(alice: tuple[MemoryStore, Path],  # noqa: F811
                                      tmp_path: Path, name: str) -> None:
    store, _ = alice
    root = tmp_path / "bob" / ".claude"
    other = root / "projects" / "-srv-x" / name
    other.parent.mkdir(parents=True)
    other.write_bytes(b"keep\n")
    r = restore(Repository(store, "desk"), _opts(tmp_path))
    assert other.read_bytes() == b"keep\n" and r.notes == []

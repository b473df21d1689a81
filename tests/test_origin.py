"""A session lives where this machine keeps it (syncd/restore/origin.py): following or
restoring another machine's copy never moves a local session to that machine's paths; a
session restored elsewhere with a map comes back through the inverse of that map; one
whose project is not on this machine is kept under its own folder and listed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from syncd.backup.state import State
from syncd.claude import project_folder
from syncd.cli.main import cli
from syncd.format.catalog import Origin, parse_origin
from syncd.repository import Repository
from syncd.store import LocalStore
from syncd.view import load_backup
from tests.helpers import write
from tests.hostile import line
from tests.test_follow import Machine

S = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
T = "1b1eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


def cli_as(m: Machine, monkeypatch: pytest.MonkeyPatch, *args: str, code: int = 0) -> str:
    """``syncd ARGS`` run as machine ``m`` (its tree, store, state and home)."""
    for k in [k for k in os.environ if k.startswith("SYNCD_")]:
        monkeypatch.delenv(k)
    env = {"SYNCD_SOURCE": str(m.settings.source), "SYNCD_STORE": m.settings.store,
           "SYNCD_STATE_DIR": str(m.settings.state_dir), "SYNCD_MACHINE_ID": m.name,
           "SYNCD_FOLLOW_QUIET": "0", "SYNCD_CONFIG": os.devnull, "HOME": str(m.home)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert r.exit_code == code, r.output
    return r.output


def cwds(path: Path) -> set[str]:
    return {json.loads(x)["cwd"] for x in path.read_bytes().splitlines()}


def folders_of(m: Machine, sid: str) -> list[str]:
    return sorted(p.parent.name for p in (m.settings.source / "projects").glob(f"*/{sid}.jsonl"))


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Machine, Machine]:
    """desk and the laptop: other homes, and the laptop keeps its code in ~/src, the desk
    in ~/code. Each project exists on its own machine."""
    desk = Machine(tmp_path, "desk", "/home/alice", follow=["lap"])
    lap = Machine(tmp_path, "lap", "/Users/bob", follow=["desk"])
    (desk.home / "code" / "y").mkdir(parents=True)
    (lap.home / "src" / "y").mkdir(parents=True)
    return desk, lap


def desk_session(desk: Machine, monkeypatch: pytest.MonkeyPatch, n: int = 3) -> Path:
    cwd = f"{desk.home}/code/y"
    rel = f"projects/{project_folder(cwd)}/{S}.jsonl"
    write(desk.settings.source, rel, b"".join(line(S, cwd, i) for i in range(n)))
    desk.sync(monkeypatch)
    return desk.settings.source / rel


def resumed_on_lap(desk: Machine, lap: Machine, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``syncd resume S --map ~desk/code=~lap/src`` on the laptop, then its backup."""
    out = cli_as(lap, monkeypatch, "resume", S, "--map", f"{desk.home}/code={lap.home}/src")
    assert f"cd {lap.home}/src/y && claude --resume {S}" in out
    mine = lap.settings.source / "projects" / project_folder(f"{lap.home}/src/y") / f"{S}.jsonl"
    assert cwds(mine) == {f"{lap.home}/src/y"}
    lap.sync(monkeypatch)
    return mine


def test_following_a_machine_that_resumed_a_session_with_a_map_never_moves_it(
        pair: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    desk, lap = pair
    ours = desk_session(desk, monkeypatch)
    before = ours.read_bytes()
    mine = resumed_on_lap(desk, lap, monkeypatch)
    desk.poll(monkeypatch)
    # desk's session is where desk keeps it, as it was: nothing moved, nothing rewritten.
    assert folders_of(desk, S) == [ours.parent.name]
    assert ours.read_bytes() == before
    # The laptop continues it: its line arrives at desk in desk's folder, with desk's
    # paths (the inverse of the map the laptop's resume used).
    with open(mine, "ab") as f:
        f.write(line(S, f"{lap.home}/src/y/sub", 3,
                     f"continued on the laptop, see {lap.home}/src/lib/util.py"))
    lap.sync(monkeypatch)
    desk.poll(monkeypatch)
    assert folders_of(desk, S) == [ours.parent.name]
    # (~/src/lib is desk's ~/code/lib: the map, not the homes alone, says so.)
    assert ours.read_bytes() == before + line(
        S, f"{desk.home}/code/y/sub", 3,
        f"continued on the laptop, see {desk.home}/code/lib/util.py")
    # And desk goes on: the laptop's copy stays in ~/src's folder with the laptop's paths.
    desk.sync(monkeypatch)
    with open(ours, "ab") as f:
        f.write(line(S, f"{desk.home}/code/y", 4, "back on desk"))
    desk.sync(monkeypatch)
    lap.poll(monkeypatch)
    assert folders_of(lap, S) == [mine.parent.name]
    assert cwds(mine) == {f"{lap.home}/src/y", f"{lap.home}/src/y/sub"}
    assert mine.read_bytes().endswith(line(S, f"{lap.home}/src/y", 4, "back on desk"))


def test_the_laptops_backup_says_where_the_session_came_from(
        pair: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    desk, lap = pair
    desk_session(desk, monkeypatch)
    resumed_on_lap(desk, lap, monkeypatch)
    backup = load_backup(Repository(LocalStore(lap.store_dir), "lap"))
    s = backup.find_session(S)
    assert s is not None
    origin = parse_origin(s.fields.get("origin"))
    assert origin is not None and origin.machine == "desk"
    assert origin.path == f"projects/{project_folder(f'{desk.home}/code/y')}/{S}.jsonl"
    assert (f"{desk.home}/code", f"{lap.home}/src") in origin.rules
    assert (str(desk.home), str(lap.home)) in origin.rules
    # The laptop's own sessions say nothing of an origin.
    write(lap.settings.source, f"projects/{project_folder(f'{lap.home}/src/y')}/{T}.jsonl",
          line(T, f"{lap.home}/src/y", 0))
    lap.sync(monkeypatch)
    t = load_backup(Repository(LocalStore(lap.store_dir), "lap")).find_session(T)
    assert t is not None and "origin" not in t.fields


def test_a_restore_of_the_other_machine_keeps_this_machines_copy_where_it_is(
        pair: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    desk, lap = pair
    ours = desk_session(desk, monkeypatch)
    before = ours.read_bytes()
    resumed_on_lap(desk, lap, monkeypatch)
    cli_as(desk, monkeypatch, "restore", "--machine", "lap")
    assert folders_of(desk, S) == [ours.parent.name]
    assert ours.read_bytes() == before


def test_a_session_whose_project_is_not_here_is_kept_under_its_own_folder_and_listed(
        pair: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    desk, lap = pair
    cwd = f"{lap.home}/elsewhere/z"  # no such directory on either machine
    write(lap.settings.source, f"projects/{project_folder(cwd)}/{T}.jsonl", line(T, cwd, 0))
    lap.sync(monkeypatch)
    desk.poll(monkeypatch)
    assert folders_of(desk, T) == [project_folder(f"{desk.home}/elsewhere/z")]
    assert desk.cursor("lap")["elsewhere"] == [T]
    # Once the project exists here, it is no longer listed.
    (desk.home / "elsewhere" / "z").mkdir(parents=True)
    write(lap.settings.source, f"projects/{project_folder(cwd)}/{T}.jsonl", line(T, cwd, 1),
          mode="ab")
    lap.sync(monkeypatch)
    desk.poll(monkeypatch)
    assert desk.cursor("lap")["elsewhere"] == []


def test_an_origin_from_a_store_is_bounded_and_checked() -> None:
    rules = tuple((f"/home/a/{'x' * 200}{i}", f"/Users/b/{i}") for i in range(40))
    text = Origin("desk", "projects/-a/s.jsonl", (*rules, ("/home/a", "/Users/b"))).encode()
    assert len(text) <= 4096
    got = parse_origin(text)
    assert got is not None and ("/home/a", "/Users/b") in got.rules  # the broadest stays
    for bad in ["", "[]", "{", json.dumps({"machine": "../x", "path": "p", "rules": []}),
                json.dumps({"machine": "m", "path": "p", "rules": [["a"]]}),
                json.dumps({"machine": "m", "path": "p", "rules": [["a", 3]]}),
                json.dumps({"machine": "m", "path": "p", "rules": [["a\0", "b"]]}),
                json.dumps({"machine": "m", "path": "p", "rules": [["a", "b"]] * 33})]:
        assert parse_origin(bad) is None, bad


def test_origins_are_recorded_once_the_first_stays(tmp_path: Path) -> None:
    from syncd.backup.state import OriginRecord

    state = State(tmp_path / "s.sqlite")
    try:
        state.record_origins([OriginRecord(S, "desk", b"projects/-a/x.jsonl",
                                           (("/a", "/b"),), 1.0)])
        state.record_origins([OriginRecord(S, "evil", b"projects/-e/x.jsonl", (), 2.0)])
        rec = state.origin(S)
        assert rec is not None and rec.machine == "desk" and rec.rules == (("/a", "/b"),)
        assert state.origin(T) is None
    finally:
        state.close()


def test_a_session_follow_brought_and_resume_moved_goes_on_coming_back(
        pair: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    """The laptop's follow brings desk's session to ~/code/y (the homes' rule); the user
    moves it to the laptop's checkout with ``resume --map``; what the laptop adds there
    reaches desk in desk's folder, with desk's paths."""
    desk, lap = pair
    ours = desk_session(desk, monkeypatch)
    before = ours.read_bytes()
    (lap.home / "code" / "y").mkdir(parents=True)
    lap.poll(monkeypatch)
    first = lap.settings.source / "projects" / project_folder(f"{lap.home}/code/y") / \
        f"{S}.jsonl"
    assert cwds(first) == {f"{lap.home}/code/y"}
    lap.sync(monkeypatch)  # the laptop's backup has it there first
    out = cli_as(lap, monkeypatch, "resume", S, "--machine", "desk", "--map",
                 f"{desk.home}/code={lap.home}/src")
    assert f"cd {lap.home}/src/y && claude --resume {S}" in out, out
    mine = lap.settings.source / "projects" / project_folder(f"{lap.home}/src/y") / f"{S}.jsonl"
    assert not first.exists() and cwds(mine) == {f"{lap.home}/src/y"}
    lap.sync(monkeypatch)
    with open(mine, "ab") as f:
        f.write(line(S, f"{lap.home}/src/y", 7, f"on the laptop: {lap.home}/src/lib/u.py"))
    lap.sync(monkeypatch)
    desk.poll(monkeypatch)
    assert folders_of(desk, S) == [ours.parent.name]
    assert ours.read_bytes() == before + line(S, f"{desk.home}/code/y", 7,
                                              f"on the laptop: {desk.home}/code/lib/u.py")

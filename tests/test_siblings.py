"""A session's siblings (syncd/sibling.py): the files Claude Code 2.1.332 keeps beside a
transcript (``<sid>.ccr-tip.json``, ``<sid>.precompact.json``, ``<sid>.desktop-released.json``,
and inside ``<sid>/`` ``ccr-tip.json``, ``precompact.json``, ``custom-title.json`` and
``<stamp>.cast``) come with it on ``restore --session``, ``resume`` and follow: remapped
where they are JSON, into the folder the transcript goes to; another session's do not, and
a store whose sibling names try to escape writes nothing outside the tree."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from syncd.archive.compact import compact
from syncd.cli.main import cli
from syncd.repository import Repository
from syncd.restore.remap import Rule
from syncd.restore.restorer import restore
from syncd.sibling import owner_of, sibling_of, siblings
from syncd.store import LocalStore, MemoryStore
from tests.helpers import tree_bytes, write
from tests.hostile import Piece, line, sid, transcript
from tests.test_follow import S1, S2, Machine
from tests.test_hostile_follow import CWD, DESK, craft
from tests.test_restore_remap import SID, _line, _opts, alice  # noqa: F401 (a fixture)

STAMP = "1764590000000"


def _json(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def family(cwd: str, s: str) -> dict[str, bytes]:
    """A session's siblings as Claude writes them (names relative to its project folder),
    holding paths under ``cwd``."""
    tip = _json({"eventId": f"evt-{s[:8]}", "cwd": cwd})
    pre = _json({"version": 7, "sessionId": s, "summaryText": f"edited {cwd}/main.py",
                 "summaryMessages": [{"type": "user", "cwd": cwd, "message": {
                     "role": "user", "content": f"read {cwd}/main.py"}}]})
    return {
        f"{s}.ccr-tip.json": tip,
        f"{s}.precompact.json": pre,
        f"{s}.desktop-released.json": _json({"reason": "released", "cwd": cwd}),
        f"{s}/ccr-tip.json": tip,
        f"{s}/precompact.json": pre,
        f"{s}/custom-title.json": _json({"customTitle": f"Bug hunt {s[:4]}", "by": "user",
                                         "at": "2026-11-01T10:00:00.000Z"}),
        # A terminal recording: the screen as it was, kept byte for byte.
        f"{s}/{STAMP}.cast": b'{"version":2,"width":80,"height":24}\n'
                             + _json([0.5, "o", f"{cwd} $ ls\r\n"]) + b"\n",
    }


def expected(src: str, dst: str, s: str) -> dict[str, bytes]:
    """``family(src, s)`` as it lands where ``src`` maps to ``dst``."""
    mine, theirs = family(dst, s), family(src, s)
    return {k: theirs[k] if k.endswith(".cast") else mine[k] for k in mine}


def folder_files(folder: Path) -> dict[str, bytes]:
    return {os.fsdecode(k): v for k, v in tree_bytes(folder).items()} if folder.exists() else {}


def write_session(m: Machine, s: str, project: str = "app", n: int = 1) -> None:
    rel = m.transcript(project, s).relative_to(m.settings.source)
    write(m.settings.source, rel, b"".join(line(s, m.cwd(project), i) for i in range(n)))
    for name, data in family(m.cwd(project), s).items():
        write(m.settings.source, rel.parent / name, data)


def cli_env(m: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith("SYNCD_")]:
        monkeypatch.delenv(k)
    env = {"SYNCD_SOURCE": str(m.settings.source), "SYNCD_STORE": m.settings.store,
           "SYNCD_STATE_DIR": str(m.settings.state_dir), "SYNCD_MACHINE_ID": m.name,
           "SYNCD_CONFIG": os.devnull, "SYNCD_FOLLOW_QUIET": "0", "HOME": str(m.home)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Machine, Machine]:
    return (Machine(tmp_path, "desk", "/home/alice"),
            Machine(tmp_path, "laptop", "/users/bob", follow=["desk"]))


# -- which path is whose -----------------------------------------------------------------

@pytest.mark.parametrize(("path", "sid_"), [
    (f"projects/-x/{S1}.ccr-tip.json", S1),
    (f"projects/-x/{S1}.precompact.json", S1),
    (f"projects/-x/{S1}.desktop-released.json", S1),
    (f"projects/-x/{S1}/custom-title.json", S1),
    (f"projects/-x/{S1}/{STAMP}.cast", S1),
    (f"projects/-x/{S1}.jsonl", S1),
    (f"projects/-x/{S1}.ccr-tip.json.tmp.0a1b", None),  # Claude's temp file, in flight
    (f"projects/-x/{S1}.json", None),
    (f"projects/{S1}.ccr-tip.json", None),
    (f"todos/{S1}.ccr-tip.json", None),
    ("projects/-x/not-a-session.precompact.json", None),
])
def test_the_session_a_sibling_belongs_to(path: str, sid_: str | None) -> None:
    assert owner_of(path.encode()) == sid_
    assert (sibling_of(path.encode()) is not None) == (
        sid_ is not None and path.count("/") == 2 and not path.endswith((".jsonl", ".cast")))


def test_siblings_are_named_after_the_transcript_only() -> None:
    assert siblings(f"projects/-x/{S1}.jsonl".encode()) == tuple(
        f"projects/-x/{S1}{s}".encode()
        for s in (".ccr-tip.json", ".precompact.json", ".desktop-released.json"))
    assert siblings(f"projects/-x/{S1}/subagents/agent-1.jsonl".encode()) == ()


# -- restore --session and resume --------------------------------------------------------

@pytest.mark.parametrize("stored", ["segments", "compacted"])
def test_restore_of_one_session_brings_its_siblings_remapped_and_no_other_sessions(
        pair: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch, stored: str) -> None:
    a, b = pair
    write_session(a, S1)
    write_session(a, S2)  # in the same folder, with siblings of its own
    a.sync(monkeypatch)
    if stored == "compacted":  # read through the manifest's groups, not segments
        compact(Repository(LocalStore(a.store_dir), "desk"))
    cli_env(b, monkeypatch)
    r = CliRunner().invoke(cli, ["restore", "--machine", "desk", "--session", S1],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    folder = b.transcript("app", S1).parent
    assert folder_files(folder) == {
        f"{S1}.jsonl": line(S1, b.cwd("app"), 0), **expected(a.cwd("app"), b.cwd("app"), S1)}


def test_resume_brings_its_siblings_remapped(pair: tuple[Machine, Machine],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = pair
    write_session(a, S1)
    write_session(a, S2)
    a.sync(monkeypatch)
    cli_env(b, monkeypatch)
    Path(b.cwd("app")).mkdir(parents=True)
    r = CliRunner().invoke(cli, ["resume", S1[:8]], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().endswith(f"claude --resume {S1}")
    folder = b.transcript("app", S1).parent
    assert folder_files(folder) == {
        f"{S1}.jsonl": line(S1, b.cwd("app"), 0), **expected(a.cwd("app"), b.cwd("app"), S1)}


def test_resume_again_after_the_session_went_on_there_brings_its_newer_siblings(
        pair: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    """Resumed here, continued there (new lines, a new tip, a new title), resumed here
    again: the transcript fast-forwards and its siblings with it, no conflict copy. One
    whose transcript here went on too is kept, desk's saved as a conflict copy."""
    a, b = pair
    write_session(a, S1)
    write_session(a, S2)
    a.sync(monkeypatch)
    cli_env(b, monkeypatch)
    assert CliRunner().invoke(cli, ["resume", S1]).exit_code == 0
    assert CliRunner().invoke(cli, ["resume", S2]).exit_code == 0
    for s in (S1, S2):
        rel = a.transcript("app", s).relative_to(a.settings.source)
        write(a.settings.source, rel, line(s, a.cwd("app"), 1), mode="ab")
        write(a.settings.source, rel.parent / f"{s}.ccr-tip.json",
              _json({"eventId": "evt-2", "cwd": a.cwd("app")}))
        write(a.settings.source, rel.parent / s / "custom-title.json",
              _json({"customTitle": "Later"}))
    a.sync(monkeypatch)
    theirs = b.transcript("app", S2)
    here = line(S2, b.cwd("app"), 1, "typed here").replace(b"-000001", b"-typed1")
    with open(theirs, "ab") as fh:
        fh.write(here)  # S2 went on here too
    cli_env(b, monkeypatch)
    for s in (S1, S2):
        r = CliRunner().invoke(cli, ["resume", s], catch_exceptions=False)
        assert r.exit_code == 0, r.output
    folder = b.transcript("app", S1).parent
    assert json.loads((folder / f"{S1}.ccr-tip.json").read_bytes()) == {
        "eventId": "evt-2", "cwd": b.cwd("app")}
    assert json.loads((folder / S1 / "custom-title.json").read_bytes()) == {
        "customTitle": "Later"}
    assert (folder / f"{S1}.jsonl").read_bytes() == line(S1, b.cwd("app"), 0) + line(
        S1, b.cwd("app"), 1)
    conflicts = [p for p in (b.settings.state_dir / "conflicts").rglob("*") if p.is_file()]
    assert all(S2 in str(p) for p in conflicts) and conflicts
    assert json.loads((folder / f"{S2}.ccr-tip.json").read_bytes())["eventId"] == \
        f"evt-{S2[:8]}"


def test_resume_with_a_map_puts_the_siblings_in_the_mapped_folder(
        pair: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = pair
    write_session(a, S1)
    a.sync(monkeypatch)
    cli_env(b, monkeypatch)
    elsewhere = f"{b.home}/src/app"
    r = CliRunner().invoke(cli, ["resume", S1, "--map", f"{a.cwd('app')}={elsewhere}"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    projects = b.settings.source / "projects"
    [folder] = [p for p in projects.iterdir()]
    assert folder_files(folder) == {
        f"{S1}.jsonl": line(S1, elsewhere, 0), **expected(a.cwd("app"), elsewhere, S1)}


def test_a_moved_session_takes_its_siblings_written_here_along(
        alice: tuple[MemoryStore, Path], tmp_path: Path) -> None:  # noqa: F811
    """Restored with the home rule, then with a map elsewhere: the local copy moves to the
    new folder, and with it the siblings Claude wrote here meanwhile, paths rewritten."""
    store, _ = alice
    repo = Repository(store, "desk")
    root = tmp_path / "bob" / ".claude"
    restore(repo, _opts(tmp_path, sessions=(SID,)))
    old = root / "projects" / "-home-bob-app"
    with open(old / f"{SID}.jsonl", "ab") as fh:
        fh.write(_line(SID, "L9", "/home/bob/app", "here", ts="2027-01-01T00:00:00.000Z"))
    write(old, f"{SID}.desktop-released.json", _json({"reason": "released",
                                                       "cwd": "/home/bob/app"}))
    r = restore(repo, _opts(tmp_path, maps=(Rule("/home/alice/app", "/home/bob/src/app"),)))
    assert r.errors == [], r.errors
    new = root / "projects" / "-home-bob-src-app"
    assert json.loads((new / f"{SID}.desktop-released.json").read_bytes()) == {
        "reason": "released", "cwd": "/home/bob/src/app"}
    assert not old.exists()


# -- follow ------------------------------------------------------------------------------

def test_follow_brings_the_siblings_and_a_sibling_changed_alone(
        pair: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = pair
    write_session(a, S1)
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    folder = b.transcript("app", S1).parent
    assert folder_files(folder) == {
        f"{S1}.jsonl": line(S1, b.cwd("app"), 0), **expected(a.cwd("app"), b.cwd("app"), S1)}
    # Later only a sibling changes there (the session released, a new tip): it comes too.
    rel = a.transcript("app", S1).relative_to(a.settings.source).parent
    write(a.settings.source, rel / f"{S1}.desktop-released.json",
          _json({"reason": "delete", "cwd": a.cwd("app")}))
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    assert json.loads((folder / f"{S1}.desktop-released.json").read_bytes()) == {
        "reason": "delete", "cwd": b.cwd("app")}
    # And again: the copy that replaced it is, in turn, as the last import left it.
    write(a.settings.source, rel / f"{S1}.desktop-released.json", _json({"reason": "kept"}))
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    assert json.loads((folder / f"{S1}.desktop-released.json").read_bytes()) == {
        "reason": "kept"}
    assert b.cursor("desk")["conflicts"] == []
    write(a.settings.source, rel / S1 / "custom-title.json", _json({"customTitle": "Renamed"}))
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    assert json.loads((folder / S1 / "custom-title.json").read_bytes()) == {
        "customTitle": "Renamed"}


def test_a_sibling_rewritten_on_both_machines_keeps_the_local_one(
        pair: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a copy as the last import left it is replaced: one Claude rewrote here too
    stays, and desk's is a conflict copy."""
    a, b = pair
    write_session(a, S1)
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    tip = b.transcript("app", S1).parent / f"{S1}.ccr-tip.json"
    ours = _json({"eventId": "evt-laptop", "cwd": b.cwd("app")})
    tip.write_bytes(ours)
    rel = a.transcript("app", S1).relative_to(a.settings.source)
    write(a.settings.source, rel.parent / f"{S1}.ccr-tip.json",
          _json({"eventId": "evt-desk", "cwd": a.cwd("app")}))
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    assert tip.read_bytes() == ours
    [copy] = b.cursor("desk")["conflicts"]  # type: ignore[misc]
    assert json.loads(Path(copy).read_bytes())["eventId"] == "evt-desk"


def test_a_sibling_waits_with_its_transcript_while_the_session_is_written_here(
        pair: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = pair
    b.settings = b.settings.model_copy(update={"follow_quiet": 60.0})
    write_session(a, S1)
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    mine = b.transcript("app", S1)
    rel = a.transcript("app", S1).relative_to(a.settings.source)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 1), mode="ab")
    write(a.settings.source, rel.parent / f"{S1}.ccr-tip.json",
          _json({"eventId": "evt-next", "cwd": a.cwd("app")}))
    a.sync(monkeypatch)
    typed = line(S1, b.cwd("app"), 0, "typed here").replace(b"-000000", b"-typed0")
    write(b.settings.source, mine.relative_to(b.settings.source), typed, mode="ab")
    b.now = mine.stat().st_mtime + 10  # written here 10 s ago
    b.poll(monkeypatch)
    tip = mine.parent / f"{S1}.ccr-tip.json"
    assert json.loads(tip.read_bytes())["eventId"] == f"evt-{S1[:8]}"  # waits
    assert b.cursor("desk")["waiting"] == [S1]
    b.now += 60
    b.poll(monkeypatch)
    assert json.loads(tip.read_bytes()) == {"eventId": "evt-next", "cwd": b.cwd("app")}
    assert mine.read_bytes().endswith(line(S1, b.cwd("app"), 1))


def test_a_stranger_adds_no_sibling_to_a_session_of_this_machine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The laptop's own session; desk publishes a copy that does not continue it, with
    siblings: none of them is added beside the laptop's transcript."""
    laptop = Machine(tmp_path, "laptop", "/users/bob", follow=[DESK])
    c = craft(laptop)
    s = sid("laptop", 1)
    write(laptop.settings.source, transcript(laptop.cwd("app"), s),
          b"".join(line(s, laptop.cwd("app"), i) for i in range(3)))
    laptop.sync(monkeypatch)
    before = tree_bytes(laptop.settings.source)
    main = transcript(CWD, s)
    folder = main.rsplit("/", 1)[0]
    c.segment(DESK, 0, [Piece(main, line(s, CWD, 0) + b'{"evil":1}\n')] + [
        Piece(f"{folder}/{name}", data) for name, data in family(CWD, s).items()])
    laptop.poll(monkeypatch)
    added = sorted(set(tree_bytes(laptop.settings.source)) - set(before))
    assert added == [], f"desk's files were added to the laptop's session {s}: {added}"


# -- a hostile store ---------------------------------------------------------------------

def test_sibling_names_that_try_to_escape_write_nothing_outside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """desk's session with siblings named to climb out of the tree (``..``, an absolute
    path, a name under ``<sid>/`` that climbs back), and on the laptop a sibling and the
    session's folder that are symlinks out of the tree. Follow and restore --session write
    the transcript and nothing outside the tree, never through a symlink."""
    laptop = Machine(tmp_path, "laptop", "/users/bob", follow=[DESK])
    outside = tmp_path / "outside"
    victim = write(outside, "victim.json", b"mine\n")
    (outside / "side").mkdir()
    c = craft(laptop)
    s = sid(DESK, 7)
    main = transcript(CWD, s)
    folder = main.rsplit("/", 1)[0]
    fam = family(CWD, s)
    hostile = [f"projects/../{s}.ccr-tip.json",
               f"projects/../../outside/{s}.precompact.json",
               f"{folder}/../../../outside/{s}.desktop-released.json",
               f"{folder}/{s}/../../../../outside/{s}.ccr-tip.json",
               f"/{tmp_path.relative_to('/')}/outside/{s}.precompact.json",
               f"{folder}/{s}.ccr-tip.json/../../../../outside/x.json"]
    c.segment(DESK, 0, [Piece(main, line(s, CWD, 0))]
              + [Piece(p, b'{"owned":true}') for p in hostile]
              + [Piece(f"{folder}/{n}", d) for n, d in fam.items()])
    mine = laptop.transcript("app", s)
    mine.parent.mkdir(parents=True)
    os.symlink(victim, mine.parent / f"{s}.precompact.json")
    os.symlink(outside / "side", mine.parent / s)
    around = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()
              and not p.is_symlink() and laptop.settings.source not in p.parents}

    def unchanged() -> None:
        now = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()
               and not p.is_symlink() and laptop.settings.source not in p.parents
               and laptop.settings.state_dir not in p.parents}
        assert {p: d for p, d in now.items() if around.get(p) != d} == {}
        assert victim.read_bytes() == b"mine\n" and list((outside / "side").iterdir()) == []
        assert sorted(outside.iterdir()) == [outside / "side", victim]

    laptop.poll(monkeypatch)
    assert mine.read_bytes() == line(s, laptop.cwd("app"), 0)
    unchanged()
    cli_env(laptop, monkeypatch)
    CliRunner().invoke(cli, ["restore", "--machine", DESK, "--session", s],
                       catch_exceptions=False)
    unchanged()
    assert (mine.parent / f"{s}.precompact.json").is_symlink()
    assert (mine.parent / s).is_symlink()
    # The sibling that had a plain place is there, remapped.
    assert json.loads((mine.parent / f"{s}.ccr-tip.json").read_bytes())["cwd"] == \
        laptop.cwd("app")


# -- real transcripts --------------------------------------------------------------------

def _first_cwd(raw: bytes) -> str:
    for row in raw.splitlines():
        with contextlib.suppress(ValueError):
            cwd = json.loads(row).get("cwd")
            if isinstance(cwd, str) and cwd:
                return cwd
    raise AssertionError("no cwd")


def test_real_sessions_siblings_land_beside_their_transcript(
        samples: Path, pair: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each sample of ../shared/claude-samples, with siblings naming its own cwd, restored
    with its home mapped to the laptop's: wherever its transcript goes (a worktree's
    folder included), its siblings are beside it, their paths the transcript's."""
    a, b = pair
    found = {}
    for t in sorted(samples.glob("*/projects/*/*.jsonl")):
        raw, s = t.read_bytes(), t.stem
        cwd = _first_cwd(raw)
        home = "/".join(cwd.split("/")[:3])  # /home/<user>
        write(a.settings.source, f"projects/{t.parent.name}/{s}.jsonl", raw)
        for name, data in family(cwd, s).items():
            write(a.settings.source, f"projects/{t.parent.name}/{name}", data)
        found[s] = (home, cwd)
    assert len(found) >= 3
    a.sync(monkeypatch)
    cli_env(b, monkeypatch)
    for s, (home, cwd) in found.items():
        r = CliRunner().invoke(cli, ["restore", "--machine", "desk", "--session", s,
                                     "--map", f"{home}={b.home}"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        [mine] = list((b.settings.source / "projects").glob(f"*/{s}.jsonl"))
        local = _first_cwd(mine.read_bytes())
        assert local == str(b.home) + cwd[len(home):]
        got = {k: v for k, v in folder_files(mine.parent).items() if k.startswith(s)
               and k != f"{s}.jsonl" and "/subagents/" not in k}
        assert got == expected(cwd, local, s), s

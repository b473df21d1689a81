"""Following a machine whose objects are hostile (syncd/follow/follower.py): whatever its
segments, head and catalog claim, the follower survives, says one line naming the bad
object, keeps importing the good sessions, costs what an idle machine costs while it
waits, and never writes over a local session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from syncd.backup.state import State
from tests.hostile import Craft, Piece, line, sid, transcript
from tests.test_follow import Machine

DESK = "desk"
CWD = "/home/desk/app"  # under desk's home: lands in the laptop's folder of "app"


@pytest.fixture
def laptop(tmp_path: Path) -> Machine:
    return Machine(tmp_path, "laptop", "/users/bob", follow=[DESK])


def craft(m: Machine) -> Craft:
    """The followed machine, made object by object in the laptop's store."""
    c = Craft(m.store_dir)
    c.machine_json(DESK, "/home/desk")
    return c


def followed(m: Machine, monkeypatch: pytest.MonkeyPatch) -> tuple[Craft, str, str]:
    """desk with two sessions, the first imported by the laptop already (seq 0)."""
    c = craft(m)
    s1, s2 = sid(DESK, 1), sid(DESK, 2)
    c.segment(DESK, 0, [Piece(transcript(CWD, s1), line(s1, CWD, 0))])
    m.poll(monkeypatch)
    assert m.transcript("app", s1).read_bytes() == line(s1, m.cwd("app"), 0)
    return c, s1, s2


@pytest.mark.parametrize("cursor", [
    {"seq": "zero"}, {"seq": 0, "misses": "x"}, {"seq": 0, "waiting": "abc"},
    {"seq": 0, "conflicts": 5}, {"seq": 1.5}, {"seq": 0, "last_check": "yesterday"},
    {"seq": 0, "imported": None}, {"seq": 0, "waiting": [1, 2]}, [1, 2], "desk",
])
def test_a_damaged_cursor_in_the_state_is_started_over(
        laptop: Machine, monkeypatch: pytest.MonkeyPatch, cursor: object) -> None:
    c, _, s2 = followed(laptop, monkeypatch)
    c.segment(DESK, 1, [Piece(transcript(CWD, s2), line(s2, CWD, 0))])
    state = State(laptop.settings.state_file)
    try:
        state.set_meta(follow=json.dumps({DESK: cursor}))
    finally:
        state.close()
    laptop.poll(monkeypatch)
    assert laptop.transcript("app", s2).read_bytes() == line(s2, laptop.cwd("app"), 0)
    assert laptop.cursor(DESK)["seq"] == 1 and laptop.cursor(DESK)["problem"] is None


def test_a_size_past_what_the_state_holds_is_one_line_and_the_rest_imports(
        laptop: Machine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    c, s1, s2 = followed(laptop, monkeypatch)
    # s1's next bytes claim to sit just below 2**63: its size is past SQLite's integers.
    c.segment(DESK, 1, [Piece(transcript(CWD, s2), line(s2, CWD, 0)),
                        Piece(transcript(CWD, s1), line(s1, CWD, 1), start=(1 << 63) - 100)])
    laptop.poll(monkeypatch)
    assert laptop.transcript("app", s2).read_bytes() == line(s2, laptop.cwd("app"), 0)
    assert laptop.transcript("app", s1).read_bytes() == line(s1, laptop.cwd("app"), 0)
    cur = laptop.cursor(DESK)
    assert cur["seq"] == 1 and cur["problem"] is None
    assert [r.message for r in caplog.records if s1 in r.message and "lost" in r.message]
    # What the import wrote is recorded: the laptop never ships it as its own.
    state = State(laptop.settings.state_file, readonly=True)
    try:
        got = {r.src_path.rsplit(b"/", 1)[1]: r for r in state.imports()}
    finally:
        state.close()
    assert set(got) == {f"{s1}.jsonl".encode(), f"{s2}.jsonl".encode()}

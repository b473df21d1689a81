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

"""``follow = "*"`` in a bucket anyone can plant machines in (syncd/follow/choice.py):
the machines backed up last come first, a head from the future counts as now plus a
small skew, one that does not open an encrypted store's key is never followed, and
``syncd status`` shows the cap and who was left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from syncd.backup.engine import sync_once
from syncd.backup.state import State
from syncd.config import Settings, load_settings
from syncd.follow import follower as follower_module
from syncd.follow.choice import SKEW, choose
from syncd.follow.follower import MACHINES_EVERY, Follower
from syncd.format.head import Head
from syncd.repository import Repository
from syncd.security.crypto import Crypto, new_master
from syncd.security.keys import init_encryption, open_crypto
from syncd.service.status import format_status, status
from syncd.store import LocalStore, MemoryStore, Store, layout
from tests.counting import CountingStore, Counts
from tests.helpers import write
from tests.hostile import line

PASSPHRASE = "follow them all 9f"
S1 = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
PLANTED = [f"a{i:02d}" for i in range(64)]


def settings_of(tmp_path: Path, name: str, **kw: object) -> Settings:
    base: dict[str, object] = dict(source=tmp_path / name / "src",
                                   store=(tmp_path / "store").as_uri(),
                                   state_dir=tmp_path / name / "state", machine_id=name)
    base.update(kw)
    return load_settings(config_file=tmp_path / "none.toml", **base)


def backed_up(tmp_path: Path, name: str) -> Settings:
    s = settings_of(tmp_path, name)
    write(s.source, f"projects/-home-u-app/{S1}.jsonl", line(S1, "/home/u/app", 0))
    sync_once(s)
    return s


def plant_machine_json(store: Store, name: str, crypto: Crypto | None = None) -> None:
    key = layout.machine_key(name)
    doc = json.dumps({"machine": name, "hostname": "planted", "format": 1}).encode()
    store.put(key, doc if crypto is None else crypto.seal_box(key, "machine.json", doc))


def follower(s: Settings, store: Store, crypto: Crypto | None = None) -> Follower:
    return Follower(s, Repository(store, s.machine_id, crypto), State(s.state_file))


def test_planted_machines_named_first_do_not_crowd_out_a_real_one(tmp_path: Path) -> None:
    backed_up(tmp_path, "desk")
    store = LocalStore(tmp_path / "store")
    for name in PLANTED:  # a00 … a63 sort before "desk"
        plant_machine_json(store, name)
    me = settings_of(tmp_path, "laptop", follow=["*"])
    f = follower(me, store)
    try:
        chosen = f.machines()
    finally:
        f.state.close()
    assert "desk" in chosen and len(chosen) == 64
    figures = status(me)
    every = figures["follow_all"]
    assert every["cap"] == 64 and every["candidates"] == 65
    assert every["left_out"] == ["a63"] and every["left_out_count"] == 1
    [row] = [ln for ln in format_status(figures).splitlines() if ln.startswith("follow *:")]
    assert "64 of 65 other machines followed" in row and "left out: a63" in row


def test_an_encrypted_store_never_follows_a_machine_that_does_not_open_its_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStore(tmp_path / "store")
    init_encryption(store, PASSPHRASE, n=1 << 12)
    monkeypatch.setenv("SYNCD_PASSPHRASE", PASSPHRASE)
    backed_up(tmp_path, "desk")
    quiet = settings_of(tmp_path, "quiet")  # a real machine with nothing flushed yet
    quiet.source.mkdir(parents=True)
    sync_once(quiet)
    other = Crypto(new_master())
    now = 1e10  # the planted heads claim to be newer than anything
    for i, name in enumerate(PLANTED):
        if i % 3 == 0:
            plant_machine_json(store, name)  # plain in an encrypted store
        elif i % 3 == 1:
            plant_machine_json(store, name, other)  # sealed under another key
        else:
            Repository(store, name, other).write_head(Head(name, now, 5, now))
    crypto = open_crypto(store, None, prompt=False)
    me = settings_of(tmp_path, "laptop", follow=["*"])
    f = follower(me, store, crypto)
    try:
        assert f.machines() == ["desk", "quiet"]
    finally:
        f.state.close()
    every = status(me)["follow_all"]
    assert every["refused_count"] == 64 and len(every["refused"]) == 50
    assert every["left_out_count"] == 0
    row = [ln for ln in format_status(status(me)).splitlines() if ln.startswith("follow *:")]
    assert "refused (do not open this store's key): a00, a01" in row[0]
    assert "and 54 more" in row[0]


def test_machines_rank_by_their_last_backup_a_future_one_counting_as_now_plus_skew(
        ) -> None:
    store = MemoryStore()
    now = 1_800_000_000.0
    times = {"a": now - 100, "b": now + 1e9, "c": None, "d": now - 50, "e": now + SKEW / 2}
    for name, t in times.items():
        if t is not None:
            Repository(store, name).write_head(Head(name, now, 3, t))
    store.put(layout.machine_key("c"), b"{}")  # no head: last
    repo = Repository(store, "me")
    assert choose(repo, sorted(times), 0, 4, now).followed == ["b", "e", "d", "a"]
    got = choose(repo, sorted(times), 2, 4, now)
    assert got.followed == ["b", "e"] and got.left_out == ["d", "a", "c"]


def test_the_machines_are_chosen_again_only_every_so_many_polls(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follower_module, "FOLLOW_ALL_MAX", 2)
    for name in ("m1", "m2", "m3"):
        backed_up(tmp_path, name)
    counts = Counts()
    store = CountingStore(LocalStore(tmp_path / "store"), counts)
    me = settings_of(tmp_path, "laptop", follow=["*"])
    f = follower(me, store)  # type: ignore[arg-type]
    try:
        assert f.machines() == ["m2", "m3"]
        # One delimited LIST of machines/ and one GET of each head.
        assert dict(counts.by_kind()) == {"LIST": 1, "GET": 3}
        counts.calls.clear()
        for poll in range(1, MACHINES_EVERY):
            f._polls = poll
            assert f.machines() == ["m2", "m3"]
        assert counts.total() == 0
    finally:
        f.state.close()

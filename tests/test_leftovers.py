"""What a restore or an import killed with SIGKILL leaves in the Claude tree: its temp
file beside the destination. Never backed up, removed by the next daemon start and by
the next restore that writes beside it, and never while its writer still runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from syncd.backup.engine import sync_once
from syncd.backup.state import State
from syncd.config import Settings, load_settings
from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, restore
from syncd.store import LocalStore
from tests.helpers import all_extents, running, wait_for, write
from tests.hostile import lines, transcript

ROOT = Path(__file__).resolve().parent.parent
S1 = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
S2 = "1b1eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


@dataclass
class Stalled:
    """A ``syncd restore --machine desk --session S1`` stopped with its temp file written
    (``temp``: S1 rewritten to this machine's paths), in the folder it makes S1 in; S1 and
    S2 are desk's sessions, neither is here yet."""

    settings: Settings
    child: subprocess.Popen[str]
    temp: Path
    s1: Path
    s2: Path
    full: dict[Path, bytes]

    def kill(self) -> None:
        self.child.send_signal(signal.SIGKILL)
        self.child.communicate()
        assert self.child.returncode == -signal.SIGKILL

    def restore(self, sid: str) -> None:
        opts = RestoreOptions(target=self.settings.source, sessions=(sid,),
                              local_machine="m1", local_root=str(self.settings.source),
                              local_home=str(self.settings.source.parent))
        report = restore(Repository(LocalStore(Path(self.settings.store[7:])), "desk"), opts)
        assert not report.errors, report.errors


def _shipped_temps(s: Settings) -> list[bytes]:
    """The paths of syncd temp files the state tracks or the store holds."""
    state = State(s.state_file, readonly=True)
    try:
        tracked = [f.path for f in state.files()]
    finally:
        state.close()
    stored = [x.path for x in all_extents(LocalStore(Path(s.store[7:])), "m1")]
    return [p for p in tracked + stored if b".syncd-" in p]


@pytest.fixture
def stalled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stalled]:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    s = load_settings(config_file=tmp_path / "none.toml", source=home / ".claude",
                      store=(tmp_path / "store").as_uri(), state_dir=tmp_path / "state",
                      machine_id="m1", flush_quiet=0.2, flush_max_delay=1.0,
                      catchup_child=False)
    cwd = f"{home}/app"
    desk = s.model_copy(update={"source": tmp_path / "desk" / ".claude",
                                "state_dir": tmp_path / "desk-state", "machine_id": "desk"})
    monkeypatch.setenv("HOME", str(tmp_path / "desk"))
    full = {}
    for sid in (S1, S2):
        # ~440 KB, as the temp a user found; rewritten to this machine's paths here.
        write(desk.source, transcript(f"{tmp_path}/desk/app", sid),
              lines(sid, f"{tmp_path}/desk/app", 0, 2000))
        full[s.source / transcript(cwd, sid)] = lines(sid, cwd, 0, 2000)
    s1, s2 = (s.source / transcript(cwd, sid) for sid in (S1, S2))
    sync_once(desk)
    monkeypatch.setenv("HOME", str(home))
    s.source.mkdir(parents=True)
    sync_once(s)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "CLAUDE_"))}
    # Its own state directory: it shares nothing with the daemons of the tests.
    env.update(HOME=str(home), SYNCD_CONFIG=os.devnull, SYNCD_SOURCE=str(s.source),
               SYNCD_STORE=s.store, SYNCD_STATE_DIR=str(tmp_path / "child-state"),
               SYNCD_MACHINE_ID="m1")
    child = subprocess.Popen([sys.executable, "-m", "tests.stall", "restore", "--machine",
                              "desk", "--session", S1],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        def temps() -> list[Path]:
            assert child.poll() is None, child.communicate()
            return list(s1.parent.glob(".syncd-*.tmp"))

        found = wait_for(temps, timeout=120, what="the restore's temp file")
        assert len(found) == 1
        wait_for(lambda: found[0].stat().st_size == len(full[s1]), what="the temp written")
        yield Stalled(s, child, found[0], s1, s2, full)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()


def test_a_killed_restores_temp_is_never_shipped_and_goes_at_the_next_start(
        stalled: Stalled) -> None:
    s, temp = stalled.settings, stalled.temp
    # Its writer still runs: a daemon starting now ships it not, nor removes it.
    with running(s) as d:
        wait_for(lambda: d._ready, what="daemon start")
        assert temp.exists()
    assert _shipped_temps(s) == []
    stalled.kill()
    assert temp.exists()  # what a crash leaves
    sync_once(s)
    assert _shipped_temps(s) == []
    # The next start's reconcile scan removes it, and only it.
    with running(s) as d:
        wait_for(lambda: d._ready, what="daemon start")
        assert not temp.exists()
    assert list(stalled.s1.parent.iterdir()) == []  # the killed restore made nothing else
    assert _shipped_temps(s) == []


def test_the_next_restore_beside_it_removes_a_killed_restores_temp(stalled: Stalled) -> None:
    # A restore writing into the folder while the stalled one runs leaves its temp alone.
    stalled.restore(S2)
    assert stalled.s2.read_bytes() == stalled.full[stalled.s2]
    assert stalled.temp.exists()
    stalled.kill()
    assert stalled.temp.exists()
    stalled.restore(S1)
    assert not stalled.temp.exists()
    assert stalled.s1.read_bytes() == stalled.full[stalled.s1]
    assert sorted(p.name for p in stalled.s1.parent.iterdir()) == sorted(
        [stalled.s1.name, stalled.s2.name])

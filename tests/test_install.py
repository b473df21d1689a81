"""Restored bytes reach a local file that exists only by being appended to it, in place
(syncd/restore/install.py): a process that holds the file open keeps writing to the very
file, and nothing it writes is lost; the command line leaves a transcript being written
here alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from syncd.backup.state import OriginRecord
from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, restore
from syncd.store import LocalStore
from tests.helpers import shipper, wait_for, write
from tests.hostile import line

SID = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
REL = f"projects/-home-desk-app/{SID}.jsonl"
CWD = "/home/desk/app"


def test_merges_into_a_file_held_open_lose_no_line_written_through_it(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "desk"
    write(src, REL, line(SID, CWD, 0))
    ship = shipper(src, store, tmp_path / "desk.sqlite", machine="desk")
    ship.ship([REL.encode()])
    out = tmp_path / "laptop"
    opts = RestoreOptions(target=out, sessions=(SID,), local_home="/home/desk",
                          local_machine="laptop",
                          origin_of=lambda sid: OriginRecord(sid, "desk", b"", (), 0.0))
    restore(Repository(store, "desk"), opts)
    mine = out / REL
    ino = mine.stat().st_ino
    # A running Claude: ONE descriptor, opened with O_APPEND, kept for the whole session.
    fd = os.open(mine, os.O_WRONLY | os.O_APPEND)
    typed = []
    try:
        for i in range(1, 26):
            typed.append(line(SID, CWD, 100 + i, "typed here").replace(b'"uuid":"',
                                                                        b'"uuid":"h'))
            os.write(fd, typed[-1])
            with open(src / REL, "ab") as f:
                f.write(line(SID, CWD, 200 + i, "desk's"))  # the newer branch
            ship.ship([REL.encode()])
            r = restore(Repository(store, "desk"), opts)
            assert [a.action for a in r.actions if a.path == REL] == ["merge"], r.actions
    finally:
        os.close(fd)
    data = mine.read_bytes()
    assert mine.stat().st_ino == ino  # the file the descriptor holds, all along
    assert [x for x in typed if x not in data] == []  # none lost
    assert data.count(b"\n") == 1 + 25 + 25


def test_the_command_line_leaves_a_transcript_held_open_alone(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")}
    env.update({"SYNCD_CONFIG": os.devnull, "SYNCD_STORE": (tmp_path / "store").as_uri()})

    def syncd(name: str, *args: str) -> subprocess.CompletedProcess[str]:
        home = tmp_path / name
        return subprocess.run(
            [sys.executable, "-m", "syncd", *args], capture_output=True, text=True,
            timeout=120, stdin=subprocess.DEVNULL,
            env={**env, "HOME": str(home), "SYNCD_MACHINE_ID": name,
                 "SYNCD_SOURCE": str(home / ".claude"),
                 "SYNCD_STATE_DIR": str(home / "state"), "SYNCD_FOLLOW_QUIET": "0"})

    desk = tmp_path / "desk" / ".claude"
    write(desk, REL, line(SID, CWD, 0))
    assert syncd("desk", "sync").returncode == 0
    r = syncd("laptop", "resume", SID)
    assert r.returncode == 0, r.stderr
    [mine] = (tmp_path / "laptop" / ".claude" / "projects").glob(f"*/{SID}.jsonl")
    with open(desk / REL, "ab") as f:
        f.write(line(SID, CWD, 1))
    assert syncd("desk", "sync").returncode == 0
    before = mine.read_bytes()
    # A process holds the laptop's copy open (Claude running in it).
    holder = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1],"
                               "'ab'); print('open', flush=True); time.sleep(60)", str(mine)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        r = syncd("laptop", "restore", "--machine", "desk", "--session", SID)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "open in a running process" in r.stdout
        assert "being written here" in r.stderr and "run it again once quiet" in r.stderr
        assert mine.read_bytes() == before
    finally:
        holder.kill()
        holder.wait()
    wait_for(lambda: not Path(f"/proc/{holder.pid}").exists(), what="the holder's exit")
    r = syncd("laptop", "restore", "--machine", "desk", "--session", SID)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert mine.read_bytes().count(b"\n") == 2


@pytest.mark.parametrize("size", [10, 3 << 20])
def test_an_append_is_refused_when_the_file_changed_since_it_was_looked_at(
        tmp_path: Path, size: int) -> None:
    from syncd.restore.install import Changed, Installer

    dest = tmp_path / "t.jsonl"
    dest.write_bytes(b"x" * size)
    st = os.stat(dest)
    with open(dest, "ab") as f:
        f.write(b"more\n")
    inst = Installer()
    try:
        inst.append(b"ours\n", os.fsencode(dest), time.time_ns(), st)
        [(where, err)] = inst.finish()
    finally:
        inst.close()
    assert isinstance(err, Changed) and where == os.fsencode(dest)
    assert dest.read_bytes() == b"x" * size + b"more\n"

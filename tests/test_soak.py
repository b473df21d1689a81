"""Soak: two ``syncd run`` daemons with different homes follow each other for a minute
and more while both write, through a store that fails, resets and stalls, and while
either daemon is killed with SIGKILL every few seconds.

Machine "a" (HOME=<tmp>/a/home/alice) and machine "b" (HOME=<tmp>/b/users/bob) back up
to one bucket of a real SeaweedFS, each through a chaotic proxy of its own
(tests/chaos.py: 5xx answers, connection resets before and after the store acted,
replies held back seconds), and each follows the other (``follow_interval`` 1 s).

The story:
- a has a 30-line session before any daemon starts, b a 10-line one;
- a starts and backs its session up; faults are switched on; b starts, and is killed
  while its first import (in the catch-up child) reads a's backup, then restarted;
- both write for ``WRITE_FOR`` seconds: a few lines a second into sessions of their
  own (one with a subagent transcript each), and both into one session at once;
- one session is handed from a to b and back: a starts it, b continues it once it has
  a's lines, a continues it once it has b's, and so on;
- every 8 to 12 s one of the daemons (in turn) is killed with SIGKILL, its catch-up
  child (if any) with it, and started again at once;
- faults stop after ``FAULTS_FOR`` seconds of writing (every few seconds one proxy
  fails every request for a while, longer than a store call's retries last, so that
  flushes and looks fail outright too), the writers after ``WRITE_FOR``.

Then, once everything is quiet:
- every file under projects/ on one machine is on the other, in the folder that
  machine's Claude uses, with the same bytes up to the home path (both ways); the
  sessions each machine wrote hold exactly what it wrote, the handed-over one exactly
  every step in order, and a's session from before the start is on b;
- the session both wrote at once lost no line: each machine's file holds all its own
  lines, and the other's are in it or in a conflict copy ``status`` lists;
- ``syncd status --json`` on each machine says nothing of the other's head is missing
  or behind here (``missing`` 0) and its last look had no problem;
- each machine's backup alone restores its tree byte for byte (``restore --to``), and
  its prefix holds each byte of its transcripts and history once (nothing shipped
  twice, through kills, adopted segments and imports);
- no temp file of a killed import is left, and both daemons stop cleanly on SIGTERM
  with no traceback in their logs.

``SYNCD_SOAK_SEED`` picks the random choices (fault draws, write order, kill times);
the seed is in every failure's message.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from syncd.backup.state import State
from syncd.claude import project_folder
from syncd.errors import StoreError
from syncd.store import LocalStore, layout, open_store
from tests.chaos import ChaosProxy
from tests.counting import CountingStore
from tests.faultkit import FaultProxy
from tests.helpers import wait_for, write
from tests.hostile import line as hostile_line
from tests.seaweed import Seaweed
from tests.test_follow import Machine as Host
from tests.test_follow_e2e import (
    STORE_PREFIX,
    Machine,
    Pair,
    _append,
    _config_env,
    _moved,
    _read,
    _uuids,
    assert_restores_alone,
    entry,
    history_line,
)

SEED = int(os.environ.get("SYNCD_SOAK_SEED") or 20240611)
FOLLOW_INTERVAL = 1.0
# Longer than the gap between two writes of the session both machines write at once
# (at most WRITE_GAP[1]), so that it is never imported while being written.
FOLLOW_QUIET = 2.0
HEAD_INTERVAL = 5.0  # each head follows the backup closely: `missing` means something
WRITE_FOR = 75.0  # seconds both machines write
# Seconds the proxies fail requests once both write (and before, from b's first start),
# with a storm (every request failing) of STORM seconds every STORM_EVERY on one of them.
FAULTS_FOR = 25.0
STORM, STORM_EVERY = 6.0, (6.0, 9.0)
KILL_EVERY = (8.0, 12.0)
WRITE_GAP = (0.2, 0.5)  # seconds between two of a writer's rounds
RETRY_DEADLINE = 2.0
HANDOFF_LINES = 5
LONG = 180.0  # a deadline for what may take a while on a slow, busy machine
PROJECTS = ("app", "lib")


# -- the machines -------------------------------------------------------------------------


def _group(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(name))
    return out


def _spawned(pids: list[int]) -> list[int]:
    """Those of ``pids`` that are multiprocessing children (the catch-up)."""
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
    return out


@dataclass
class Soaked(Machine):
    """A machine whose daemon runs in a process group of its own, so that a kill takes
    its catch-up child with it."""

    proxy: ChaosProxy | None = None
    kills: list[str] = field(default_factory=list)

    def launch(self) -> None:
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "syncd", "run"],
                                         env=self.env, cwd=self.home, stdout=f,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.returncode = None

    def kill9(self, why: str) -> None:
        """SIGKILL the daemon, then whatever of its process group is left (the catch-up
        child, which would otherwise get SIGTERM from its parent's death and stop
        cleanly); wait until none of them runs."""
        assert self.proc is not None
        pgid = self.proc.pid
        children = _spawned([p for p in _group(pgid) if p != pgid])
        self.proc.kill()
        self.proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        wait_for(lambda: not _group(pgid), 30, f"{self.name}'s processes to die",
                 explain=lambda: f"still running: {_group(pgid)}")
        self.kills.append(f"{why}{' (with its catch-up child)' if children else ''}")
        with open(self.log, "ab") as f:
            f.write(f"--- test: killed with SIGKILL ({why}) ---\n".encode())

    def restart(self, why: str) -> None:
        self.kill9(why)
        self.launch()
        self.wait_up()

    def transcript(self, project: str, sid: str) -> Path:
        return self.folder(self.home / "code" / project) / f"{sid}.jsonl"


def make_soak_pair(tmp: Path, seaweed: Seaweed, bucket: str,
                   proxies: dict[str, ChaosProxy]) -> Pair:
    homes = {"a": tmp / "a" / "home" / "alice", "b": tmp / "b" / "users" / "bob"}
    machines = []
    for name, other in (("a", "b"), ("b", "a")):
        home = homes[name]
        for project in PROJECTS:
            (home / "code" / project).mkdir(parents=True)
        env = _config_env(seaweed, bucket, name, home, tmp / name / "state")
        env |= {"SYNCD_S3_ENDPOINT_URL": proxies[name].url, "SYNCD_FOLLOW": f'["{other}"]',
                "SYNCD_FOLLOW_INTERVAL": str(FOLLOW_INTERVAL),
                "SYNCD_FOLLOW_QUIET": str(FOLLOW_QUIET),
                "SYNCD_HEAD_INTERVAL": str(HEAD_INTERVAL),
                # A storm outlasts a store call's retries: flushes and looks fail.
                "SYNCD_STORE_RETRY_DEADLINE": str(RETRY_DEADLINE)}
        machines.append(Soaked(name, other, home, tmp / name / "state",
                               tmp / name / "syncd.log", env, proxy=proxies[name]))
    # The test's own view of the store, past the proxies.
    store = open_store(f"s3://{bucket}/{STORE_PREFIX}", endpoint_url=seaweed.endpoint,
                       retry_deadline=20.0)
    return Pair(machines[0], machines[1], store)


@pytest.fixture
def soak_pair(tmp_path: Path, seaweed: Seaweed, bucket: str) -> Iterator[Pair]:
    proxies = {name: ChaosProxy(seaweed.endpoint, seed=SEED + i).start()
               for i, name in enumerate("ab")}
    p = make_soak_pair(tmp_path.resolve(), seaweed, bucket, proxies)
    try:
        yield p
    finally:
        for px in proxies.values():
            px.off()
        p.stop()
        for px in proxies.values():
            px.stop()


# -- what is written ------------------------------------------------------------------------


@dataclass
class Track:
    """One transcript a writer appends to, and every line it appended, in order."""

    path: Path
    sid: str
    cwd: Path
    tag: str
    parent: str | None = None
    lines: list[bytes] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)

    def add(self) -> None:
        line, self.parent = entry(self.sid, self.cwd, self.parent, datetime.now(UTC),
                                  len(self.lines), self.tag)
        _append(self.path, line)
        self.lines.append(line)
        self.ids.append(self.parent)

    @property
    def data(self) -> bytes:
        return b"".join(self.lines)


def _subagent(m: Machine, project: str, sid: str, tag: str) -> Track:
    folder = m.folder(m.home / "code" / project)
    agent = uuid.uuid4().hex[:17]
    return Track(folder / sid / "subagents" / f"agent-{agent}.jsonl", sid,
                 m.home / "code" / project, tag)


class Writer(threading.Thread):
    """Like Claude on one machine: every round one line into the session both machines
    write (so it is never quiet while this runs), and one into one of its own sessions
    (or their subagents), chosen at random; a round every ``WRITE_GAP`` seconds."""

    def __init__(self, m: Machine, own: list[Track], shared: Track, seed: int) -> None:
        super().__init__(name=f"writer-{m.name}", daemon=True)
        self.own, self.shared = own, shared
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.shared.add()
                self.rng.choice(self.own).add()
                self.stop.wait(self.rng.uniform(*WRITE_GAP))
        except BaseException as e:
            self.errors.append(e)


class Handoff(threading.Thread):
    """One session handed between the machines: a writes ``HANDOFF_LINES`` lines; once
    b's copy is a's (up to the home path) b continues it; once a's is b's, a does; and so
    on until told to stop, after a's second turn at least. Each step is (machine, its
    bytes as written there)."""

    def __init__(self, pair: Pair, project: str, sid: str, explain: Callable[[], str]) -> None:
        super().__init__(name="handoff", daemon=True)
        self.pair, self.project, self.sid, self.explain = pair, project, sid, explain
        self.stop = threading.Event()
        self.steps: list[tuple[Machine, bytes]] = []
        self.errors: list[BaseException] = []

    def file(self, m: Machine) -> Path:
        assert isinstance(m, Soaked)
        return m.transcript(self.project, self.sid)

    def run(self) -> None:
        try:
            m, other = self.pair.a, self.pair.b
            while True:
                have = _read(self.file(m)) or b""
                ids = _uuids(have)
                t = Track(self.file(m), self.sid, m.home / "code" / self.project,
                          f"handoff-{len(self.steps)}-{m.name}", ids[-1] if ids else None)
                for _ in range(HANDOFF_LINES):
                    t.add()
                    self.stop.wait(0.2)
                self.steps.append((m, t.data))
                if len(self.steps) >= 3 and self.stop.is_set():
                    return
                self.wait_passed(m, other)
                m, other = other, m
        except BaseException as e:
            self.errors.append(e)

    def wait_passed(self, src: Machine, dst: Machine) -> None:
        """Until ``dst``'s copy is ``src``'s, up to the home path."""
        def there() -> bool:
            return _read(self.file(dst)) == _moved(_read(self.file(src)) or b"", src, dst)

        wait_for(there, LONG, f"{dst.name} to have step {len(self.steps)} of the handed "
                 f"session {self.sid}", interval=0.2, explain=self.explain)

    def want(self, m: Machine) -> bytes:
        return b"".join(_moved(data, src, m) for src, data in self.steps)


# -- checks -------------------------------------------------------------------------------


def _sid_of(rel: Path) -> str:
    """The session a path under projects/<folder>/ belongs to."""
    return rel.parts[1].removesuffix(".jsonl") if len(rel.parts) > 1 else ""


def differences(pair: Pair, skip: set[str]) -> list[str]:
    """Each file under projects/ on one machine against its copy on the other (home path
    replaced, folder by the other's rule), both ways; sessions in ``skip`` left out."""
    a, b = pair.both
    folders = {project_folder(str(a.home / "code" / p)): project_folder(str(b.home / "code" / p))
               for p in PROJECTS}
    out = []
    for src, dst, fmap in ((a, b, folders), (b, a, {v: k for k, v in folders.items()})):
        base = src.root / "projects"
        for p in sorted(base.rglob("*")):
            if not p.is_file() or p.name.startswith(".syncd-"):
                continue
            rel = p.relative_to(base)
            if rel.parts[0] not in fmap:
                out.append(f"{src.name} has {rel}: in no folder of the test's projects")
                continue
            if _sid_of(rel) in skip:
                continue
            there = dst.root / "projects" / fmap[rel.parts[0]] / Path(*rel.parts[1:])
            want, got = _moved(p.read_bytes(), src, dst), _read(there)
            if got != want:
                lost = [u for u in _uuids(want) if u not in set(_uuids(got))]
                more = [u for u in _uuids(got) if u not in set(_uuids(want))]
                out.append(f"{src.name}'s {rel} ({len(want)} bytes) is "
                           f"{'missing' if got is None else f'{len(got)} bytes'} on "
                           f"{dst.name}: {len(lost)} of its entries missing there, "
                           f"{len(more)} not in it")
    return out


def held_not_once(pair: Pair, m: Machine) -> list[str]:
    """The files whose bytes ``m``'s prefix holds other than once: the extents of all
    their generations do not add up to their size (shipped twice, or not at all)."""
    ext = pair.extents(m.name)
    out = []
    for p in sorted([*(m.root / "projects").rglob("*.jsonl"), m.root / "history.jsonl"]):
        rel = os.fsencode(p.relative_to(m.root))
        held = sum(e.end - e.start for _seq, e in ext.get(rel, []))
        if held != p.stat().st_size:
            out.append(f"{p.relative_to(m.root / 'projects')}: {held} held for "
                       f"{p.stat().st_size}: " + ", ".join(
                           f"seg {seq} gen {e.gen} [{e.start},{e.end}) {e.reason!r}"
                           for seq, e in ext.get(rel, [])))
    return out


def leftovers(m: Machine) -> list[str]:
    return [str(p.relative_to(m.root)) for p in m.root.rglob(".syncd-*")]


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_two_daemons_soak_under_faults_and_kills(soak_pair: Pair) -> None:
    pair = soak_pair
    a, b = pair.both
    assert isinstance(a, Soaked) and isinstance(b, Soaked)
    assert a.proxy is not None and b.proxy is not None
    both: tuple[Soaked, Soaked] = (a, b)
    proxies = (a.proxy, b.proxy)
    rng = random.Random(SEED)
    errors: list[BaseException] = []

    def explain() -> str:
        kills = "; ".join(f"{m.name}: {m.kills}" for m in both)
        faults = "; ".join(f"{m.name}: {m.proxy.counts if m.proxy else None}" for m in both)
        return f"seed {SEED}; kills {kills}; proxy outcomes {faults}\n{pair.explain()}"

    # Before any daemon runs: a 30-line session on a, a 10-line one on b, and their
    # history lines.
    history = {"a": b"", "b": b""}

    def start_session(m: Soaked, project: str, tag: str) -> Track:
        sid = str(uuid.uuid4())
        line = history_line(m.home / "code" / project, sid, f"{tag} question 0",
                            datetime.now(UTC))
        _append(m.root / "history.jsonl", line)
        history[m.name] += line
        return Track(m.transcript(project, sid), sid, m.home / "code" / project, tag)

    before = {"a": start_session(a, "app", "before-a"), "b": start_session(b, "lib", "before-b")}
    for name, n in (("a", 30), ("b", 10)):
        for _ in range(n):
            before[name].add()

    a.start()
    wait_for(lambda: (lambda s: s["last_flush_seq"] is not None and s["bytes_pending"] == 0)(
        a.status()), LONG, "a to back up its session", explain=explain)

    # Faults on; b starts, and is killed while its first import reads a's backup.
    for px in proxies:
        px.on()
    b.launch()
    a_segments = f"/{STORE_PREFIX}/machines/a/seg/"
    wait_for(lambda: b.proxy is not None and b.proxy.seen(
        lambda method, path: method == "GET" and a_segments in path), LONG,
        "b's first import to read a's segments", interval=0.01, explain=explain)
    b.kill9("during its first import")
    got = _read(b.transcript("app", before["a"].sid))
    first_import = ("not begun" if got is None else "complete"
                    if got == _moved(before["a"].data, a, b) else "part")
    b.launch()
    b.wait_up()

    # Both write: sessions of their own (one with a subagent), one both write at once.
    own: dict[str, list[Track]] = {}
    for m in (a, b):
        sessions = [start_session(m, p, f"own-{m.name}-{p}") for p in PROJECTS]
        own[m.name] = [*sessions, _subagent(m, "app", sessions[0].sid, f"agent-{m.name}")]
    shared_sid = str(uuid.uuid4())
    shared = {m.name: Track(m.transcript("lib", shared_sid), shared_sid,
                            m.home / "code" / "lib", f"both-{m.name}") for m in (a, b)}
    writers = [Writer(m, own[m.name], shared[m.name], SEED + 10 + i)
               for i, m in enumerate(both)]
    handoff = Handoff(pair, "app", str(uuid.uuid4()), explain)
    for w in writers:
        w.start()
    handoff.start()

    # Kill one daemon after the other every 8-12 s while they write.
    writing_until = time.monotonic() + WRITE_FOR
    faults_until = time.monotonic() + FAULTS_FOR
    victim = a
    next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
    next_storm = time.monotonic() + rng.uniform(*STORM_EVERY)
    wake = threading.Event()
    try:
        while time.monotonic() < writing_until:
            if any(w.errors for w in writers) or handoff.errors:
                break
            now = time.monotonic()
            if now >= faults_until:
                for px in proxies:
                    px.off()
            elif now >= next_storm:
                rng.choice(proxies).storm(STORM)
                next_storm = now + rng.uniform(*STORM_EVERY)
            if now >= next_kill:
                victim.restart(f"while writing, {WRITE_FOR - (writing_until - now):.0f}s in")
                victim = b if victim is a else a
                next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
            soonest = min(next_kill, writing_until, *(
                [faults_until, next_storm] if now < faults_until else []))
            wake.wait(max(0.05, soonest - time.monotonic()))
    finally:
        for px in proxies:
            px.off()
        for w in writers:
            w.stop.set()
        handoff.stop.set()
        for w in writers:
            w.join(30)
        handoff.join(LONG + 30)
    for w in writers:
        errors += w.errors
    errors += handoff.errors
    if errors:
        raise errors[0]
    assert not handoff.is_alive(), "the handoff did not end"
    assert len(handoff.steps) >= 3, handoff.steps
    assert len(a.kills) >= 2 and len(b.kills) >= 2, explain()

    # Every session arrives, then nothing moves any more.
    skip = {shared_sid}
    wait_for(lambda: not differences(pair, skip), LONG,
             "every session to be the same on both machines",
             interval=1.0, explain=lambda: "\n".join(differences(pair, skip)) + "\n" + explain())
    everything = [p for m in both for p in (m.root / "projects").rglob("*.jsonl")]
    pair.settle([*everything, a.root / "history.jsonl", b.root / "history.jsonl"])
    assert not differences(pair, skip), "\n".join(differences(pair, skip))

    # What each machine wrote is exactly what it holds.
    for m in both:
        for t in [before[m.name], *own[m.name]]:
            assert _read(t.path) == t.data, f"{m.name}'s {t.path.relative_to(m.root)} changed"
        got = _read(m.transcript("app", handoff.sid))
        assert got == handoff.want(m), (
            f"{m.name}'s handed session {handoff.sid}: {len(got or b'')} bytes, "
            f"{len(handoff.want(m))} expected from its {len(handoff.steps)} steps")
        assert _read(m.root / "history.jsonl") == history[m.name], f"{m.name}'s history.jsonl"
    first = before["a"]
    assert _read(b.transcript("app", first.sid)) == _moved(first.data, a, b), (
        "a's session from before the start is not on b as a has it")

    # The session both wrote at once: no line lost on either machine.
    for m in both:
        local = set(_uuids(_read(m.transcript("lib", shared_sid))))
        mine = set(shared[m.name].ids)
        assert mine <= local, (
            f"{m.name} lost {len(mine - local)} of its own lines of {shared_sid}")
        copies = m.conflict_copies()
        held = local | {u for c in copies for u in _uuids(_read(c))}
        theirs = shared[m.other].ids
        lost = [u for u in theirs if u not in held]
        assert not lost, (f"{m.name} lost {len(lost)} of the other's {len(theirs)} lines of "
                          f"{shared_sid} (conflict copies listed: {copies})\n{explain()}")

    # Status: nothing of the other's head missing or behind here, no problem.
    def caught_up() -> bool:
        rows = [m.following() for m in both]
        return all(r.get("missing") == 0 and not r.get("problem") for r in rows)

    wait_for(caught_up, LONG, "`status` to show nothing missing from the other machine",
             interval=1.0,
             explain=lambda: "\n".join(f"{m.name}: {m.following()}" for m in both))

    for m in both:
        assert_restores_alone(m, m.home.parent / "restored")
    pair.finish()
    # With both stopped (a staging folder is there while an import runs): nothing a
    # killed import or restore left behind is still in either tree.
    for m in both:
        assert not leftovers(m), f"{m.name}: temp files left: {leftovers(m)}"
    # Nothing shipped twice, kills, adopted segments and imports included.
    for m in both:
        twice = held_not_once(pair, m)
        assert not twice, f"{m.name}'s prefix holds bytes other than once:\n" + "\n".join(twice)
    print(f"seed {SEED}: b's first import {first_import} when killed; kills a {a.kills}, "
          f"b {b.kills}; handoff steps {len(handoff.steps)}; proxy outcomes a "
          f"{a.proxy.counts}, b {b.proxy.counts}")


# -- found by the soak ----------------------------------------------------------------------


def test_a_failed_delete_names_the_object_once(seaweed: Seaweed, bucket: str) -> None:
    """A delete the store fails (here: a 500) is one line naming the object, as a failed
    get does: ``s3://bucket/prefix/key``. The soak's logs showed a lease release that
    failed named ``…/team/team/machines/b/lease.json``: the prefix twice."""
    proxy = FaultProxy(seaweed.endpoint).start()
    try:
        store = open_store(f"s3://{bucket}/{STORE_PREFIX}", endpoint_url=proxy.url,
                           retry_deadline=0.5)
        key = "machines/m/lease.json"
        store.put(key, b"{}")
        proxy.set_mode("500")
        want = f"s3://{bucket}/{STORE_PREFIX}/{key}"
        with pytest.raises(StoreError) as got:
            store.get(key)
        assert want in str(got.value), str(got.value)
        with pytest.raises(StoreError) as deleted:
            store.delete_many([key])
        assert want in str(deleted.value), str(deleted.value)
    finally:
        proxy.stop()


def test_a_session_the_other_machine_imported_from_here_is_not_fetched_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """desk writes a session, the laptop imports it (so the laptop's head lists it), and
    desk writes on. The laptop's segments say those bytes are desk's own ("imported
    from desk"), so desk's follower passes them over; its reconciliation with the
    laptop's head must too: desk never fetches its own session from the laptop's backup
    while it grows, nor records it as the laptop's (``status`` would count it among the
    laptop's sessions here)."""
    desk = Host(tmp_path, "desk", "/home/alice", follow=["laptop"], head_interval=0.0)
    laptop = Host(tmp_path, "laptop", "/users/bob", follow=["desk"], head_interval=0.0)
    sid = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
    rel = str(desk.transcript("app", sid).relative_to(desk.settings.source))
    write(desk.settings.source, rel, hostile_line(sid, desk.cwd("app"), 0))
    desk.sync(monkeypatch)
    laptop.poll(monkeypatch)  # its first look: desk's session arrives
    laptop.sync(monkeypatch)  # shipped as imported from desk; the laptop's head lists it
    desk.poll(monkeypatch)  # desk's first look at the laptop
    for i in (1, 2):  # desk writes on; the laptop follows
        write(desk.settings.source, rel, hostile_line(sid, desk.cwd("app"), i), mode="ab")
        desk.sync(monkeypatch)
        laptop.poll(monkeypatch)
        laptop.sync(monkeypatch)
    write(desk.settings.source, rel, hostile_line(sid, desk.cwd("app"), 3), mode="ab")
    desk.sync(monkeypatch)
    mine = desk.transcript("app", sid).read_bytes()

    fetched: list[str] = []

    class Reads(CountingStore):
        def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
            if start >= 0 and layout.segment_seq(key) is not None and \
                    key.startswith(layout.segments_prefix("laptop")):
                fetched.append(key)
            return super().get(key, start, length)

    desk.poll(monkeypatch, Reads(LocalStore(desk.store_dir)))  # a start: reconciled at once
    assert desk.transcript("app", sid).read_bytes() == mine
    state = State(desk.settings.state_file, readonly=True)
    try:
        theirs = [r for r in state.imports() if r.path == os.fsencode(rel)]
    finally:
        state.close()
    assert not fetched, f"desk fetched its own session from the laptop's backup: {fetched}"
    assert not theirs, f"desk records its own session as imported: {theirs}"

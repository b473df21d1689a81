"""Sync between machines (issue 13), end to end: two ``syncd run`` daemons follow each other.

Machine "a" (HOME=<tmp>/a/home/alice, its settings in a config file) and machine "b"
(HOME=<tmp>/b/users/bob, its settings in ``SYNCD_*`` variables) back up to one bucket of
a real SeaweedFS, each with its own state directory, and each follows the other: it
looks for the other's new segments every ``follow_interval`` (1 s here) and imports the
other's sessions into its own tree, remapped as ``syncd restore --machine OTHER`` would
(the other's home becomes this one's, the folder is named by this machine's rule) and
merged by restore's rules. A transcript written here in the last ``follow_quiet`` (1 s
here) or held open by a process is left alone until it is quiet.

What a user must get, and what is checked:
- a session recorded on a with the real Claude CLI arrives on b, in the folder b's CLI
  uses, and ``claude --resume`` / ``--continue`` there send the same conversation;
- b's continuation comes back to a, and no byte is shipped twice: each machine's prefix
  holds every byte of its session files exactly once (the other's bytes once, as
  "imported from <machine>"), however long the two daemons keep following each other;
- both continuing one session at once keeps both branches on both machines, and a
  restore of either machine alone gives its own tree byte for byte;
- a transcript held open or being written here is not written by an import until it
  is quiet, and then no line of either side is lost.

The first two need the real CLI (skipped only when npm is not on PATH, as in
tests/test_e2e_claude.py); the others write transcripts directly and always run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from syncd.claude import project_folder
from syncd.format.segment import Extent
from syncd.repository import Repository
from syncd.store import Store, layout, open_store
from tests.claude_fixtures import (
    Claude,
    Run,
    last_user_text,
    message_counts,
    recorded_session,
    strings_outside_thinking,
    thinking_blocks,
    tool_script,
)
from tests.faultkit import tree
from tests.helpers import wait_for
from tests.seaweed import Seaweed

FOLLOW_INTERVAL = 1.0
FOLLOW_QUIET = 1.0
FLUSH_QUIET = 0.2
FLUSH_MAX_DELAY = 1.0
# A store and trees unchanged this long are at rest: longer than a poll, the quiet
# period and a flush together, so an import (or an echo of one) would have shown.
SETTLE = FOLLOW_INTERVAL + FOLLOW_QUIET + FLUSH_MAX_DELAY + 1.0
DEADLINE = 90.0  # for anything that should take a few seconds
PROMPT = "ok"
STORE_PREFIX = "team"

# -- two machines ----------------------------------------------------------------------


@dataclass
class Machine:
    name: str
    other: str
    home: Path
    state_dir: Path
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    returncode: int | None = None

    @property
    def root(self) -> Path:
        return self.home / ".claude"

    def folder(self, project: Path) -> Path:
        """The projects/ folder this machine's CLI uses for ``project``."""
        return self.root / "projects" / project_folder(str(project))

    def syncd(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "syncd", *args], env=self.env,
                              cwd=self.home, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def status(self) -> dict[str, Any]:
        r = self.syncd("status", "--json")
        assert r.returncode == 0, f"{self.name}: {show(r)}"
        doc: dict[str, Any] = dict(json.loads(r.stdout))
        return doc

    def following(self) -> dict[str, Any]:
        """The row of ``status --json``'s "following" for the other machine."""
        st = self.status()
        rows = [f for f in st.get("following") or [] if f.get("machine") == self.other]
        assert len(rows) == 1, (f"{self.name}: `syncd status --json` has no single "
                                f"'following' row for {self.other}: {st.get('following')!r}")
        row: dict[str, Any] = rows[0]
        return row

    def conflict_copies(self) -> list[Path]:
        """The conflict copies ``status --json`` lists (absolute, or under the state dir)."""
        out = []
        for p in self.following().get("conflicts") or []:
            path = Path(p)
            if not path.is_absolute():
                path = next((base / p for base in (self.state_dir, self.root)
                             if (base / p).exists()), self.state_dir / p)
            out.append(path)
        return out

    def waiting(self) -> list[str]:
        return [str(w) for w in self.following().get("waiting") or []]

    def start(self) -> None:
        self.launch()
        self.wait_up()

    def launch(self) -> None:
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "syncd", "run"],
                                         env=self.env, cwd=self.home, stdout=f,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_up(self) -> None:
        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name}'s daemon exited with {self.proc.returncode}"
                                     f":\n{self.log_tail()}")
            return bool(self.status().get("daemon_pid") == self.proc.pid)

        wait_for(up, DEADLINE, f"{self.name}'s daemon to start", explain=self.log_tail)

    def stop(self) -> None:
        """SIGTERM, then wait (SIGKILL only if it does not stop within a minute)."""
        if self.proc is None or self.returncode is not None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.returncode = self.proc.returncode

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_tail(self) -> str:
        return f"--- {self.name}'s log (tail) ---\n{self.log_text()[-4000:]}"


@dataclass
class Pair:
    a: Machine
    b: Machine
    store: Store

    @property
    def both(self) -> tuple[Machine, Machine]:
        return self.a, self.b

    def start(self) -> None:
        for m in self.both:
            m.launch()
        for m in self.both:
            m.wait_up()

    def stop(self) -> None:
        for m in self.both:
            m.stop()

    def finish(self) -> None:
        """Stop both daemons: each must exit 0 on SIGTERM with no traceback or warning."""
        self.stop()
        for m in self.both:
            assert m.returncode == 0, f"{m.name}'s daemon exited {m.returncode}\n{m.log_tail()}"
            text = m.log_text()
            for bad in ("Traceback", "RuntimeWarning"):
                at = text.find(bad)
                assert at < 0, f"{m.name}'s log has a {bad}:\n{text[max(0, at - 500):at + 2500]}"

    def explain(self) -> str:
        parts = []
        for m in self.both:
            r = m.syncd("status", "--json")
            st = json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr}
            shown = {k: st.get(k) for k in ("following", "bytes_pending", "files_pending",
                                            "last_flush_seq", "last_error", "error")}
            parts.append(f"{m.name} status: {shown!r}\n{m.log_tail()}")
        return "\n".join(parts)

    def segment_keys(self) -> tuple[str, ...]:
        return tuple(o.key for m in self.both
                     for o in self.store.list(layout.segments_prefix(m.name)))

    def settle(self, files: list[Path]) -> None:
        """Wait until both machines' segments and ``files`` stay unchanged for SETTLE
        seconds with nothing pending on either machine: every import (and any echo of
        one) has happened by then."""
        def signature() -> tuple[object, ...]:
            return self.segment_keys(), tuple(_read(f) for f in files)

        state: dict[str, Any] = {"sig": None, "since": 0.0}

        def still() -> bool:
            sig = signature()
            now = time.monotonic()
            if sig != state["sig"]:
                state["sig"], state["since"] = sig, now
                return False
            if now - state["since"] < SETTLE:
                return False
            if any(m.status()["bytes_pending"] for m in self.both):
                state["sig"] = None
                return False
            return signature() == sig

        wait_for(still, DEADLINE, "both machines to settle", interval=0.5, explain=self.explain)

    def extents(self, machine: str) -> dict[bytes, list[tuple[int, Extent]]]:
        """Every data extent in ``machine``'s segments, by path: (seq, extent)."""
        repo = Repository(self.store, machine)
        out: dict[bytes, list[tuple[int, Extent]]] = {}
        for key, size in repo.segments():
            seq = layout.segment_seq(key)
            assert seq is not None
            for e in repo.read_index(key, size).extents:
                out.setdefault(e.path, []).append((seq, e))
        return out


def _config_env(seaweed: Seaweed, bucket: str, name: str, home: Path,
                state_dir: Path) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", **seaweed.env(),
           "SYNCD_CONFIG": os.devnull, "SYNCD_SOURCE": str(home / ".claude"),
           "SYNCD_STORE": f"s3://{bucket}/{STORE_PREFIX}",
           "SYNCD_S3_ENDPOINT_URL": seaweed.endpoint, "SYNCD_STATE_DIR": str(state_dir),
           "SYNCD_MACHINE_ID": name, "SYNCD_FLUSH_QUIET": str(FLUSH_QUIET),
           "SYNCD_FLUSH_MAX_DELAY": str(FLUSH_MAX_DELAY), "SYNCD_STORE_RETRY_DEADLINE": "20",
           # Nothing but flushes writes to the store: the tests count segment bytes.
           "SYNCD_COMPACT_SCHEDULE": "off", "SYNCD_PRUNE_SCHEDULE": "off",
           "SYNCD_VERIFY_SCHEDULE": "off"}
    for var in ("PYTHONPATH", "TMPDIR"):
        if os.environ.get(var):
            env[var] = os.environ[var]
    return env


def make_pair(tmp: Path, seaweed: Seaweed, bucket: str, b_follows: str = '["a"]') -> Pair:
    """Machine a follows b through its config file; b follows ``b_follows`` (the JSON list
    or "*" of ``SYNCD_FOLLOW``) through variables."""
    a_home, b_home = tmp / "a" / "home" / "alice", tmp / "b" / "users" / "bob"
    machines = []
    for name, other, home in (("a", "b", a_home), ("b", "a", b_home)):
        home.mkdir(parents=True)
        state_dir = tmp / name / "state"
        env = _config_env(seaweed, bucket, name, home, state_dir)
        if name == "a":
            config = tmp / "a" / "config.toml"
            config.write_text(f'follow = ["b"]\nfollow_interval = {FOLLOW_INTERVAL}\n'
                              f"follow_quiet = {FOLLOW_QUIET}\n")
            env["SYNCD_CONFIG"] = str(config)
        else:
            env |= {"SYNCD_FOLLOW": b_follows, "SYNCD_FOLLOW_INTERVAL": str(FOLLOW_INTERVAL),
                    "SYNCD_FOLLOW_QUIET": str(FOLLOW_QUIET)}
        machines.append(Machine(name, other, home, state_dir, tmp / name / "syncd.log", env))
    store = open_store(f"s3://{bucket}/{STORE_PREFIX}", endpoint_url=seaweed.endpoint,
                       retry_deadline=20.0)
    return Pair(machines[0], machines[1], store)


@pytest.fixture
def pair(tmp_path: Path, seaweed: Seaweed, bucket: str) -> Iterator[Pair]:
    p = make_pair(tmp_path.resolve(), seaweed, bucket)
    try:
        yield p
    finally:
        p.stop()


# -- files -----------------------------------------------------------------------------


def show(r: subprocess.CompletedProcess[str]) -> str:
    return (f"`syncd {' '.join(r.args[3:])}` exit {r.returncode}\n"
            f"  stdout: {r.stdout.strip()[-1500:]}\n  stderr: {r.stderr.strip()[-1500:]}")


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _append(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(data)


def _uuids(data: bytes | None) -> list[str]:
    out = []
    for line in (data or b"").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("uuid"), str):
            out.append(doc["uuid"])
    return out


def _moved(data: bytes, src: Machine, dst: Machine) -> bytes:
    """Lines written by these tests (plain ASCII paths, no thinking) as they must read on
    ``dst``: ``src``'s home replaced by ``dst``'s, and in paths into ``src``'s projects/
    (a persisted tool output, the memory folder 2.1.332 names in the system prompt it
    records) the folder of a project under that home by the folder ``dst`` has for it."""
    def folders(m: Machine) -> bytes:
        return f"{m.home}/.claude/projects/{project_folder(str(m.home))}".encode()
    return data.replace(folders(src), folders(dst)).replace(str(src.home).encode(),
                                                            str(dst.home).encode())


def session_files(folder: Path, sid: str) -> dict[str, bytes]:
    """The transcript and everything under ``<sid>/`` (subagents, tool results)."""
    out: dict[str, bytes] = {}
    main = folder / f"{sid}.jsonl"
    if main.is_file():
        out[main.name] = main.read_bytes()
    side = folder / sid
    if side.is_dir():
        for p in sorted(side.rglob("*")):
            if p.is_file():
                out[str(p.relative_to(folder))] = p.read_bytes()
    return out


def _ts(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def entry(sid: str, cwd: Path, parent: str | None, at: datetime, i: int,
          tag: str) -> tuple[bytes, str]:
    """One transcript entry as Claude Code writes it (a user or an assistant message, by
    the parity of ``i``), and its uuid."""
    u = str(uuid.uuid4())
    role = "user" if i % 2 == 0 else "assistant"
    content: Any = (f"{tag} question {i}" if role == "user"
                    else [{"type": "text", "text": f"{tag} answer {i}"}])
    doc = {"parentUuid": parent, "isSidechain": False, "userType": "external",
           "cwd": str(cwd), "sessionId": sid, "version": "2.1.197", "gitBranch": "",
           "type": role, "message": {"role": role, "content": content},
           "uuid": u, "timestamp": _ts(at)}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n", u


def chain(sid: str, cwd: Path, parent: str | None, start: datetime, n: int,
          tag: str) -> tuple[bytes, list[str]]:
    """``n`` entries, each the child of the one before, the first a child of
    ``parent``; one second apart from ``start``."""
    lines, ids = [], []
    for i in range(n):
        line, parent = entry(sid, cwd, parent, start + timedelta(seconds=i), i, tag)
        lines.append(line)
        ids.append(parent)
    return b"".join(lines), ids


def history_line(project: Path, sid: str, text: str, at: datetime) -> bytes:
    doc = {"display": text, "pastedContents": {}, "timestamp": int(at.timestamp() * 1000),
           "project": str(project), "sessionId": sid}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


@dataclass
class Session:
    """One session of the tests, known on both machines."""

    sid: str
    a_project: Path
    b_project: Path
    a_file: Path
    b_file: Path
    base_ids: list[str] = field(default_factory=list)


def seeded_session(pair: Pair) -> tuple[Session, bytes]:
    """A session written on a (and its history line); both daemons started; b has
    imported it. Returns the session and a's transcript."""
    a, b = pair.both
    s_a, s_b = a.home / "code" / "app", b.home / "code" / "app"
    s_a.mkdir(parents=True)
    s_b.mkdir(parents=True)
    sid = str(uuid.uuid4())
    t0 = datetime.now(UTC) - timedelta(minutes=10)
    base, ids = chain(sid, s_a, None, t0, 4, "base")
    s = Session(sid, s_a, s_b, a.folder(s_a) / f"{sid}.jsonl", b.folder(s_b) / f"{sid}.jsonl",
                ids)
    pair.start()
    _append(s.a_file, base)
    _append(a.root / "history.jsonl", history_line(s_a, sid, "base question 0", t0))
    want = _moved(base, a, b)
    wait_for(lambda: _read(s.b_file) == want, DEADLINE, f"b to import a's session into {s.b_file}",
             explain=lambda: f"b has {_read(s.b_file)!r}\n{pair.explain()}")
    return s, base


# -- what each machine's prefix holds ----------------------------------------------------


def imported_and_own(pair: Pair, machine: str, rel: bytes) -> tuple[int, int]:
    """Bytes of ``rel`` in ``machine``'s segments that carry "imported from <other>"
    (frames continuing such an extent in the same segment count with it), and the rest."""
    other = "b" if machine == "a" else "a"
    imported = own = 0
    carried: tuple[int, int, int] | None = None  # seq, gen, end of the last imported extent
    for seq, e in sorted(pair.extents(machine).get(rel, []),
                         key=lambda se: (se[0], se[1].gen, se[1].start)):
        n = e.end - e.start
        tagged = (e.reason or "").startswith(f"imported from {other}")
        if tagged or (e.reason is None and carried == (seq, e.gen, e.start)):
            imported += n
            carried = (seq, e.gen, e.end)
        else:
            own += n
            carried = None
    return imported, own


def assert_each_byte_once(pair: Pair, m: Machine, paths: list[Path]) -> None:
    """Every byte of each file is in ``m``'s own prefix exactly once: the extents of
    all its generations add up to its size (an echo, or a file shipped again whole,
    adds more), and a restore of ``m`` alone has it (checked by the callers)."""
    ext = pair.extents(m.name)
    for p in paths:
        rel = os.fsencode(p.relative_to(m.root))
        gens = ext.get(rel, [])
        if p.suffix == ".json":
            # Claude writes these whole again when it likes (a subagent's meta, when the
            # CLI runs again): each write is a generation; the newest holds the file once.
            top = max((e.gen for _seq, e in gens), default=0)
            gens = [(seq, e) for seq, e in gens if e.gen == top]
        held = sum(e.end - e.start for _seq, e in gens)
        size = p.stat().st_size
        assert held == size, (
            f"{m.name}'s prefix holds {held} bytes of {p.relative_to(m.root)} for its "
            f"{size}: " + ", ".join(f"seg {seq} gen {e.gen} [{e.start},{e.end}) {e.reason!r}"
                                    for seq, e in ext.get(rel, [])))


def assert_restores_alone(m: Machine, out: Path) -> None:
    """``syncd restore --machine M --to OUT`` (M's prefix only) is M's tree byte for byte."""
    r = m.syncd("restore", "--machine", m.name, "--to", str(out))
    assert r.returncode == 0, show(r)
    want, got = tree(m.root), tree(out)
    assert sorted(got) == sorted(want), f"{m.name}: restored {sorted(got)}, tree {sorted(want)}"
    for rel, data in want.items():
        assert got[rel] == data, f"{m.name}: restored {rel!r} differs from the tree's"


# -- with the real CLI -------------------------------------------------------------------


@dataclass
class Recorded:
    sid: str
    a_project: Path
    b_project: Path
    a_file: Path
    b_file: Path
    record: Run


def record_and_follow(pair: Pair, claude: Claude) -> Recorded:
    """Both daemons running, a records a session with the real CLI (thinking, a file
    read, a persisted Bash output, a subagent); b has all of it once a is done."""
    a, b = pair.both
    pa, pb = a.home / "work" / "app", b.home / "work" / "app"
    for p in (pa, pb):  # b has its own checkout of the project
        p.mkdir(parents=True)
        (p / "notes.txt").write_text("notes of the app\n")
    pair.start()
    run = claude.run(a.home, pa, "--allowedTools=Bash,Read,Agent",
                     "read the notes and check the dir", respond=tool_script(pa))
    assert run.returncode == 0 and run.requests, run.describe()
    sid = recorded_session(a.home, project_folder(str(pa)))
    rec = Recorded(sid, pa, pb, a.folder(pa) / f"{sid}.jsonl", b.folder(pb) / f"{sid}.jsonl",
                   run)
    have = session_files(a.folder(pa), sid)
    assert any("/subagents/" in k for k in have) and any("/tool-results/" in k for k in have), (
        f"the recording has no subagent or persisted tool output: {sorted(have)}")

    def arrived() -> bool:
        got = session_files(b.folder(pb), sid)
        return sorted(got) == sorted(have) and \
            len(got[f"{sid}.jsonl"].splitlines()) == len(have[f"{sid}.jsonl"].splitlines())

    def settled() -> bool:
        # The files alone say too little: a sidecar a's CLI rewrote whole (a subagent's
        # meta.json) has the same name and b may hold its older copy. So, as well: a's
        # daemon has nothing pending, and b's cursor has read a's last flush with
        # nothing of it held back.
        if not arrived():
            return False
        sa = a.status()
        if sa.get("files_pending") != 0 or sa.get("last_flush_seq") is None:
            return False
        row = b.following()
        return isinstance(row.get("seq"), int) and row["seq"] >= sa["last_flush_seq"] and \
            not row.get("waiting") and not row.get("retry")

    def explain() -> str:
        on_b = sorted(str(p.relative_to(b.root)) for p in b.root.rglob("*"))
        return f"a has {sorted(have)}\nb has {on_b}\n{pair.explain()}"

    wait_for(settled, DEADLINE, f"b to import a's session {sid} into {b.folder(pb)}, "
             "through a's last flush", explain=explain)
    return rec


def baseline(claude: Claude, pair: Pair, rec: Recorded) -> Run:
    """What a's CLI sends for ``--resume SID ok``, run on a copy of a's session under a
    scratch home (a's own tree is left as it is)."""
    scratch = pair.a.home.parent / "scratch"
    folder = scratch / ".claude" / "projects" / project_folder(str(rec.a_project))
    shutil.copytree(pair.a.folder(rec.a_project), folder, symlinks=True)
    run = claude.run(scratch, rec.a_project, "--resume", rec.sid, PROMPT)
    assert run.returncode == 0 and run.requests, f"baseline: {run.describe()}"
    return run


def assert_same_conversation(run: Run, base: Run, what: str, extra: int = 0) -> None:
    """``run`` sent ``base``'s conversation (plus ``extra`` messages: turns added since),
    with every thinking block and signature byte for byte."""
    assert run.returncode == 0 and run.requests, f"{what}: {run.describe()}"
    got, want = message_counts(run.requests)[-1], message_counts(base.requests)[-1] + extra
    assert got == want, (f"{what}: {got} messages sent, {want} expected\n  {run.describe()}\n"
                         f"  baseline: {base.describe()}")
    roles = [m["role"] for m in run.requests[-1]["messages"]]
    base_roles = [m["role"] for m in base.requests[-1]["messages"]]
    assert roles[:len(base_roles)] == base_roles, f"{what}: roles {roles}, base {base_roles}"
    assert PROMPT in last_user_text(run.requests[-1]), what
    got_t, want_t = thinking_blocks(run.requests), thinking_blocks(base.requests)
    assert want_t, f"{what}: the baseline carries no thinking block"
    assert got_t == want_t, f"{what}: thinking blocks differ from the baseline's"


@pytest.mark.timeout(1200)  # the first test pays for the npm install of the CLI
def test_a_session_recorded_on_a_resumes_on_b(pair: Pair, claude: Claude) -> None:
    a, b = pair.both
    rec = record_and_follow(pair, claude)
    # What b holds is what `syncd restore --machine a` would write there: nothing to do.
    r = b.syncd("restore", "--machine", "a", "--dry-run", "--json")
    assert r.returncode == 0, show(r)
    todo = [(x["action"], x["path"], x.get("reason")) for x in json.loads(r.stdout)["actions"]
            if x["action"] != "skip"]
    assert not todo, f"b's imported files differ from what a restore would write: {todo}"
    row = b.following()
    assert isinstance(row["seq"], int) and row["seq"] >= 0, row
    # (A session arriving in several polls may count once per poll: at least one.)
    assert isinstance(row["last_import"], float | int) and row["imported"] >= 1, row
    assert row["waiting"] == [] and row["conflicts"] == [], row
    # The sidecars went along, byte for byte where no path of a's home is in them.
    a_side, b_side = (session_files(m.folder(p), rec.sid)
                      for m, p in ((a, rec.a_project), (b, rec.b_project)))
    for name, data in a_side.items():
        if str(a.home).encode() not in data:
            assert b_side[name] == data, f"{name} differs on b"

    base = baseline(claude, pair, rec)
    resume = claude.run(b.home, rec.b_project, "--resume", rec.sid, PROMPT)
    assert_same_conversation(resume, base, "b: claude --resume")
    text = strings_outside_thinking(resume.requests)
    at = text.find(str(a.home))
    assert at < 0, ("b's resumed conversation names a's home outside thinking blocks: "
                    f"{text[max(0, at - 200):at + 120]!r}")
    # --continue from b's checkout finds it too (the resume above added one turn).
    cont = claude.run(b.home, rec.b_project, "--continue", PROMPT)
    assert_same_conversation(cont, base, "b: claude --continue", extra=2)
    pair.finish()


@pytest.mark.timeout(1200)
def test_b_continues_and_a_gets_it_back_with_nothing_shipped_twice(
        pair: Pair, claude: Claude) -> None:
    a, b = pair.both
    rec = record_and_follow(pair, claude)
    original_a = rec.a_file.read_bytes()
    imported_b = rec.b_file.read_bytes()

    # b continues the session with its CLI.
    resume = claude.run(b.home, rec.b_project, "--resume", rec.sid, PROMPT)
    assert resume.returncode == 0 and resume.requests, resume.describe()
    continued_b = rec.b_file.read_bytes()
    assert continued_b.startswith(imported_b), "the CLI on b rewrote the imported transcript"
    b_turn = continued_b[len(imported_b):]
    assert b_turn and _uuids(b_turn)

    # a imports b's turn: a fast-forward, remapped to a's home.
    want_a = original_a + _moved(b_turn, b, a)
    wait_for(lambda: _read(rec.a_file) == want_a, DEADLINE, "a to import b's continuation",
             explain=lambda: (f"a's transcript: {len(_read(rec.a_file) or b'')} bytes, "
                              f"{len(want_a)} expected; uuids of b's turn missing on a: "
                              f"{set(_uuids(b_turn)) - set(_uuids(_read(rec.a_file)))}"
                              f"\n{pair.explain()}"))
    # ... and continues it there: the conversation b had, plus b's turn.
    cont = claude.run(a.home, rec.a_project, "--continue", PROMPT)
    assert_same_conversation(cont, resume, "a: claude --continue after b's turn", extra=2)
    final_a = rec.a_file.read_bytes()
    a_turn = final_a[len(want_a):]
    assert final_a.startswith(want_a) and a_turn
    want_b = continued_b + _moved(a_turn, a, b)
    wait_for(lambda: _read(rec.b_file) == want_b, DEADLINE, "b to import a's turn",
             explain=pair.explain)

    # Both keep following each other: let every poll, import and flush happen.
    a_files = [rec.a_file, *(a.folder(rec.a_project) / n for n in
                             session_files(a.folder(rec.a_project), rec.sid) if "/" in n)]
    b_files = [rec.b_file, *(b.folder(rec.b_project) / n for n in
                             session_files(b.folder(rec.b_project), rec.sid) if "/" in n)]
    pair.settle(a_files + b_files)
    assert _read(rec.a_file) == final_a and _read(rec.b_file) == want_b

    # No echo: each prefix holds each byte of the session once, and the other's bytes
    # only as imported.
    assert_each_byte_once(pair, a, a_files)
    assert_each_byte_once(pair, b, b_files)
    rel_a = os.fsencode(rec.a_file.relative_to(a.root))
    rel_b = os.fsencode(rec.b_file.relative_to(b.root))
    assert imported_and_own(pair, "a", rel_a) == (len(want_a) - len(original_a),
                                                  len(original_a) + len(a_turn)), (
        "a's prefix: (bytes imported from b, a's own bytes) of the transcript")
    assert imported_and_own(pair, "b", rel_b) == (len(imported_b) + len(want_b) - len(
        continued_b), len(b_turn)), "b's prefix: (bytes imported from a, b's own bytes)"
    # A subagent's files: a's own, imported on b. Claude writes a .meta.json whole, more
    # than once: a flush between two writes keeps both generations (each a point in
    # time), so a prefix may hold more than its size, never a byte under the other label.
    for p in b_files[1:]:
        rel = os.fsencode(p.relative_to(b.root))
        imported, own = imported_and_own(pair, "b", rel)
        assert own == 0 and imported >= p.stat().st_size, (
            f"{rel!r} is a's, imported: b's prefix must say so")
    for p in a_files[1:]:
        rel = os.fsencode(p.relative_to(a.root))
        imported, own = imported_and_own(pair, "a", rel)
        assert imported == 0 and own >= p.stat().st_size, rel
    for m in pair.both:
        assert_restores_alone(m, m.home.parent / "restored")
    pair.finish()


# -- without the CLI ---------------------------------------------------------------------


def test_both_continue_the_same_session_at_once(tmp_path: Path, seaweed: Seaweed,
                                                bucket: str) -> None:
    """a and b each add a branch to one session within the same second. b's branch is
    the newer: a appends it after its own (Claude resumes the newest branch), b keeps its
    own and saves a's as a conflict copy that `status` lists. No line is lost anywhere,
    and each machine's backup alone restores its own tree. b follows "*" here."""
    pair = make_pair(tmp_path.resolve(), seaweed, bucket, b_follows="*")
    try:
        _both_at_once(pair)
    finally:
        pair.stop()


def _both_at_once(pair: Pair) -> None:
    a, b = pair.both
    s, base = seeded_session(pair)
    hist_a = a.root / "history.jsonl"
    history = hist_a.read_bytes()

    later = datetime.now(UTC)
    ta, ids_a = chain(s.sid, s.a_project, s.base_ids[-1], later, 3, "branch-a")
    tb, ids_b = chain(s.sid, s.b_project, s.base_ids[-1], later + timedelta(seconds=30), 3,
                      "branch-b")
    _append(s.a_file, ta)
    _append(s.b_file, tb)

    want_a = base + ta + _moved(tb, b, a)
    want_b = _moved(base, a, b) + tb
    wait_for(lambda: _read(s.a_file) == want_a, DEADLINE,
             "a to append b's newer branch after its own",
             explain=lambda: f"a has {_read(s.a_file)!r}\n{pair.explain()}")

    def copies_hold_a() -> bool:
        found = {u for p in b.conflict_copies() for u in _uuids(_read(p))}
        return set(ids_a) <= found

    wait_for(copies_hold_a, DEADLINE, "a's older branch in a conflict copy b's status lists",
             explain=pair.explain)
    pair.settle([s.a_file, s.b_file, hist_a])

    assert _read(s.a_file) == want_a, "a's transcript changed after the merge"
    assert _read(s.b_file) == want_b, "b's transcript: its own branch, unchanged"
    every = set(s.base_ids) | set(ids_a) | set(ids_b)
    for m, f in ((a, s.a_file), (b, s.b_file)):
        held = set(_uuids(_read(f))) | {u for p in m.conflict_copies() for u in _uuids(_read(p))}
        assert every <= held, f"{m.name} lost entries: {sorted(every - held)}"
    assert a.following()["conflicts"] == [], "a merged b's newer branch: no conflict there"
    for m in pair.both:
        row = m.following()
        assert row["imported"] >= 1 and row["last_import"] is not None, row
        assert isinstance(row["seq"], int), row
    assert _read(hist_a) == history, "a's history.jsonl changed"

    for m in pair.both:
        assert_restores_alone(m, m.home.parent / "restored")
    # Nothing shipped twice: b's branch is appended after a's bytes, which stay shipped.
    assert_each_byte_once(pair, a, [s.a_file, hist_a])
    assert_each_byte_once(pair, b, [s.b_file])
    pair.finish()


def test_history_lines_stay_each_machines_own(pair: Pair) -> None:
    """Claude's prompt history (history.jsonl) is not followed: b imports a's session, not
    a's history line, and neither machine's history.jsonl is written by the other's."""
    a, b = pair.both
    s, _ = seeded_session(pair)
    hist_a, hist_b = a.root / "history.jsonl", b.root / "history.jsonl"
    history = hist_a.read_bytes()
    pair.settle([hist_a, s.b_file])
    assert _read(hist_a) == history, "a's history.jsonl changed"
    assert s.sid.encode() not in (_read(hist_b) or b""), "a's history line reached b"
    pair.finish()


class Writer(threading.Thread):
    """Appends a branch to ``s``'s transcript on b one entry at a time, every ``every``
    seconds until stopped, as Claude does while a turn runs (the entries' times 10 ms
    apart from ``start``)."""

    def __init__(self, s: Session, start: datetime, every: float) -> None:
        super().__init__(name="transcript-writer", daemon=True)
        self.s, self.start_at, self.every = s, start, every
        self.stop = threading.Event()
        self.written: list[bytes] = []
        self.last_write = 0.0

    def run(self) -> None:
        parent: str | None = self.s.base_ids[-1]
        i = 0
        while not self.stop.is_set():
            line, parent = entry(self.s.sid, self.s.b_project, parent,
                                 self.start_at + timedelta(milliseconds=10 * i), i, "from-b")
            _append(self.s.b_file, line)
            self.written.append(line)
            self.last_write = time.time()
            i += 1
            self.stop.wait(self.every)


@pytest.mark.parametrize("busy", ["held-open", "being-written"])
def test_a_session_busy_here_is_written_only_once_quiet(pair: Pair, busy: str) -> None:
    """a continues a session while b's copy is open in a process (no writes: only the
    open file descriptor holds it) or being appended to every 0.2 s: b leaves it alone,
    says so in `status` ("waiting"), and imports a's lines once it is quiet, losing none
    of its own."""
    a, b = pair.both
    s, _base = seeded_session(pair)
    suffix = f"{s.b_file.parent.name}/{s.b_file.name}"
    later = datetime.now(UTC)
    ta, ids_a = chain(s.sid, s.a_project, s.base_ids[-1], later + timedelta(seconds=60), 3,
                      "from-a")
    before = _read(s.b_file)
    assert before is not None

    def waits() -> bool:
        # Paths, as the interface says; a session's id names the same thing.
        return any(w.endswith(suffix) or w == s.sid for w in b.waiting())

    def untouched(ok: Callable[[bytes | None], bool]) -> None:
        got = _read(s.b_file)
        assert ok(got), (f"b wrote its busy transcript: now {len(got or b'')} bytes "
                         f"(was {len(before)}), last entries {_uuids(got)[-4:]}, a's {ids_a}")

    def untouched_for(seconds: float, ok: Callable[[bytes | None], bool]) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            untouched(ok)
            time.sleep(0.1)

    def left_alone(ok: Callable[[bytes | None], bool]) -> bool:
        untouched(ok)
        return waits()

    if busy == "held-open":
        with open(s.b_file, "ab") as fd:
            holder = subprocess.Popen(["sleep", "600"], stdout=fd, stdin=subprocess.DEVNULL)
        try:
            _append(s.a_file, ta)
            wait_for(lambda: left_alone(lambda got: got == before),
                     DEADLINE, f"b's status to list {suffix} as waiting", explain=pair.explain)
            # Long after its last write, and through several polls: still left alone.
            untouched_for(FOLLOW_QUIET + 3 * FOLLOW_INTERVAL, lambda got: got == before)
            assert time.time() - s.b_file.stat().st_mtime > FOLLOW_QUIET
            assert _read(s.b_file) == before
        finally:
            holder.terminate()
            holder.wait()
        want = before + _moved(ta, a, b)
        wait_for(lambda: _read(s.b_file) == want, DEADLINE, "b to import a's lines once closed",
                 explain=pair.explain)
    else:
        writer = Writer(s, later, every=0.2)  # older than a's lines
        writer.start()
        try:
            wait_for(lambda: len(writer.written) >= 2, DEADLINE, "b's writer to start")
            _append(s.a_file, ta)
            wait_for(lambda: left_alone(lambda got: not set(ids_a) & set(_uuids(got))),
                     DEADLINE, f"b's status to list {suffix} as waiting", explain=pair.explain)
            untouched_for(FOLLOW_QUIET + 3 * FOLLOW_INTERVAL,
                          lambda got: not set(ids_a) & set(_uuids(got)))
        finally:
            writer.stop.set()
            writer.join()
        stopped = writer.last_write
        own = b"".join(writer.written)
        assert not set(ids_a) & set(_uuids(_read(s.b_file))), "written while being written"
        seen: dict[str, float] = {}

        def imported() -> bool:
            if set(ids_a) <= set(_uuids(_read(s.b_file))):
                seen["at"] = time.time()
                return True
            return False

        wait_for(imported, DEADLINE, "b to import a's lines once quiet", interval=0.05,
                 explain=pair.explain)
        assert seen["at"] >= stopped + FOLLOW_QUIET - 0.05, (
            f"imported {seen['at'] - stopped:.2f}s after b's last write, within follow_quiet")
        # a's lines are the newer branch: appended after every line b wrote.
        assert _read(s.b_file) == before + own + _moved(ta, a, b)
    pair.settle([s.a_file, s.b_file])
    wait_for(lambda: not waits(), DEADLINE, f"{suffix} no longer waiting", explain=pair.explain)
    assert set(ids_a) <= set(_uuids(_read(s.b_file)))
    pair.finish()


def outside_thinking(transcript: bytes) -> str:
    """Every string of a transcript's entries, thinking blocks (whose bytes the API
    checks, never remapped) left out."""
    docs = []
    for raw in transcript.splitlines():
        try:
            docs.append({"messages": [json.loads(raw)]})
        except ValueError:
            continue
    return strings_outside_thinking(docs)


@pytest.mark.timeout(1200)
def test_a_session_moved_to_another_checkout_goes_back_and_forth_with_the_real_cli(
        pair: Pair, claude: Claude) -> None:
    """a records a session in ~/code/app; b keeps that project in ~/src/app, a path a does
    not have (its home differs too). b's follow brings the session; ``syncd resume SID
    --map`` puts it in b's checkout; b continues it with its CLI, a gets that turn in a's
    own folder with a's paths and continues it; b gets a's turn in ~/src/app's folder.
    Neither machine's copy ever moves to the other machine's paths."""
    a, b = pair.both
    rec = record_and_follow(pair, claude)  # in ~/work/app on both: b's copy is there now
    src = b.home / "src" / "app"
    src.mkdir(parents=True)
    (src / "notes.txt").write_text("notes of the app\n")
    r = b.syncd("resume", rec.sid, "--machine", "a", "--map", f"{a.home}/work={b.home}/src")
    assert r.returncode == 0, show(r)
    assert r.stdout.strip().endswith(f"cd {src} && claude --resume {rec.sid}"), show(r)
    mine = b.folder(src) / f"{rec.sid}.jsonl"
    assert mine.is_file() and not rec.b_file.exists(), show(r)  # moved into b's checkout
    a_before, b_before = rec.a_file.read_bytes(), mine.read_bytes()
    # b continues it where it lives on b.
    cont_b = claude.run(b.home, src, "--continue", PROMPT)
    assert cont_b.returncode == 0 and cont_b.requests, cont_b.describe()
    assert str(a.home) not in strings_outside_thinking(cont_b.requests)
    b_now = mine.read_bytes()
    assert b_now.startswith(b_before)
    turn = b_now[len(b_before):]
    assert _uuids(turn), turn
    wait_for(lambda: len(_uuids(_read(rec.a_file))) == len(_uuids(b_now)), DEADLINE,
             "a to import b's turn", explain=pair.explain)
    # In a's folder (never ~/src's), with a's paths: ~/src/app on b is ~/work/app on a.
    assert sorted(p.parent.name for p in a.root.glob(f"projects/*/{rec.sid}.jsonl")) == [
        rec.a_file.parent.name]
    a_now = rec.a_file.read_bytes()
    assert a_now.startswith(a_before)
    assert str(b.home) not in outside_thinking(a_now)
    assert f"{a.home}/src" not in outside_thinking(a_now)
    assert set(_uuids(turn)) <= set(_uuids(a_now))
    cont_a = claude.run(a.home, rec.a_project, "--continue", PROMPT)
    assert_same_conversation(cont_a, cont_b, "a: claude --continue after b's turn", extra=2)
    a_turn = rec.a_file.read_bytes()[len(a_now):]
    assert a_turn
    wait_for(lambda: set(_uuids(a_turn)) <= set(_uuids(_read(mine))), DEADLINE,
             "b to import a's turn", explain=pair.explain)
    assert sorted(p.parent.name for p in b.root.glob(f"projects/*/{rec.sid}.jsonl")) == [
        mine.parent.name]
    assert str(a.home) not in outside_thinking(mine.read_bytes())
    assert str(b.home) not in outside_thinking(rec.a_file.read_bytes())
    again = claude.run(b.home, src, "--continue", PROMPT)
    assert_same_conversation(again, cont_a, "b: claude --continue after a's turn", extra=2)
    pair.finish()


def _can_bind_read_only(tmp: Path) -> bool:
    probe = tmp / "probe"
    probe.mkdir()
    r = subprocess.run(["unshare", "-m", "sh", "-c",
                        f'mount --bind -o ro "{probe}" "{probe}" && ! touch "{probe}/x"'],
                       capture_output=True, timeout=30)
    return r.returncode == 0


def test_a_read_only_tree_is_unhealthy_and_its_sessions_come_once_it_is_writable(
        pair: Pair, tmp_path: Path) -> None:
    """b's daemon runs as a sandbox without write access to the Claude tree would run it
    (the tree bind-mounted read-only in its own mount namespace): nothing is imported,
    ``status`` is unhealthy and says how many sessions wait; once the tree is writable
    again (remounted read-write), a's sessions arrive without a changing anything."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None or \
            not _can_bind_read_only(tmp_path):
        pytest.skip("needs unshare and nsenter with mount namespaces (root, or user "
                    "namespaces allowed)")
    a, b = pair.both
    b.root.mkdir(parents=True)
    (b.root / "projects").mkdir()
    sids = [str(uuid.uuid4()) for _ in range(2)]
    a.start()
    proj = a.home / "code" / "app"
    for i, sid in enumerate(sids):
        data, _ = chain(sid, proj, None, datetime.now(UTC) - timedelta(minutes=5), 3, f"s{i}")
        _append(a.folder(proj) / f"{sid}.jsonl", data)
    wait_for(lambda: a.status()["files_pending"] == 0 and a.status()["last_flush_seq"]
             is not None, DEADLINE, "a to ship its sessions", explain=pair.explain)
    with open(b.log, "ab") as f:
        b.proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             'mount --bind -o ro "$0" "$0" && exec "$@"', str(b.root),
             sys.executable, "-m", "syncd", "run"],
            env=b.env, cwd=b.home, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    b.wait_up()
    mine = [b.folder(b.home / "code" / "app") / f"{sid}.jsonl" for sid in sids]

    def waiting() -> bool:
        st = b.status()
        row = next(r for r in st["following"] if r["machine"] == "a")
        return bool(row["problem"]) and "not writable" in row["problem"] and \
            "2 sessions waiting" in row["problem"] and \
            any("following a" in h for h in st["health"])

    wait_for(waiting, DEADLINE, "b's status to say its tree is not writable",
             explain=pair.explain)
    assert not any(p.exists() for p in mine)
    r = b.syncd("status")
    assert "health:       ok" not in r.stdout and "not writable" in r.stdout, r.stdout
    # Writable again, in the daemon's namespace (as a drop-in's ReadWritePaths would be).
    assert b.proc is not None
    subprocess.run(["nsenter", "-t", str(b.proc.pid), "-m", "mount", "-o", "remount,bind,rw",
                    str(b.root)], check=True, timeout=30)
    wait_for(lambda: all(p.exists() for p in mine), DEADLINE,
             "a's sessions to arrive once b's tree is writable", explain=pair.explain)
    wait_for(lambda: not b.following()["problem"], DEADLINE, "b's problem to clear",
             explain=pair.explain)
    pair.finish()

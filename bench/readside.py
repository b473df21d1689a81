#!/usr/bin/env python3
"""Read-side figures at team scale: `syncd machines`, `sessions` and `resume` against a
``file://`` store of N machines, each request delayed as a remote store would.

Prints figures; asserts nothing.

    .venv/bin/python bench/readside.py                   # N = 1, 10, 100, 1000, 10000
    .venv/bin/python bench/readside.py --quick           # N = 1, 10, 100
    # also: --machines 1,10,..., --latency-ms MS, --workdir DIR, --rebuild

The store of each N is built once by syncd's own writer (``sync_once``, and ``compact``
for every other machine) in worker processes, and kept under ``--workdir`` (default
``~/.cache/syncd-bench/readside``) keyed by N and a tag of the writer's source: a change
to what the writer stores builds it again. Every command runs in a fresh process
(bench/readrunner.py) that wraps each store syncd opens in tests/counting.py's counting
store, with ``--latency-ms`` of sleep per request.

A store of more than REAL_MAX (1000) machines is the 1000-machine store plus head-only
machines (``build_wide``): each a copy of a real machine's head and machine.json under a
new machine id, which is all these commands read of a machine that has a head.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import REPO, git_describe, iso, log, render_table  # core puts the repo on sys.path

from syncd.archive.compact import compact
from syncd.archive.options import compact_options
from syncd.backup.engine import sync_once
from syncd.claude import project_folder
from syncd.config import Settings, load_settings
from syncd.format import head as headfmt
from syncd.repository import Repository
from syncd.store import layout, open_store

MB = 1_000_000
SESSIONS = 12
PROJECTS = ("api-server", "web-frontend", "infra")
# What the store is built by: a change to any of it (or to the recipe below, RECIPE)
# means a store built before is not the one this code would write.
WRITER = ("syncd/backup", "syncd/format", "syncd/archive", "syncd/security",
          "syncd/repository.py", "syncd/store", "syncd/config.py")
RECIPE = "2"
READER_ID = "reader.bench-00000000"
# Machines built by the writer at most; a larger N adds head-only machines to these.
REAL_MAX = 1000
# The targets at N=1000: (wall s, requests, peak RSS MB); None: no target.
# At N=10,000: requests linear in N (at most 10 times N=1000's) and peak RSS < 200 MB.
# machines: a GET and a HEAD per machine since each head is checked (1100 before).
TARGETS: dict[str, tuple[float | None, int | None, int | None]] = {
    "machines": (5.0, 2100, None),
    "sessions": (10.0, None, 150),
    "resume": (3.0, None, None),
    "resume --machine": (None, None, None),
}
WIDE_RSS = 200


# -- building the store -------------------------------------------------------------------

def machine_name(i: int) -> str:
    """A machine id as syncd makes them (<user>.<host>-<8 hex>); zero-padded, so name
    order is index order."""
    tag = hashlib.sha256(str(i).encode()).hexdigest()[:8]
    return f"u{i:04d}.host{i:04d}-{tag}"


def store_tag() -> str:
    h = hashlib.sha256(RECIPE.encode())
    for entry in WRITER:
        path = REPO / entry
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def _entry(**fields: Any) -> bytes:
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


def _exchange(rng: random.Random, sid: str, cwd: str, t: float, parent: str | None,
              prompt: str) -> tuple[bytes, str]:
    """A prompt, the assistant's thinking and tool call, its result and the answer."""
    base = {"isSidechain": False, "userType": "external", "cwd": cwd, "sessionId": sid,
            "version": "2.1.76", "gitBranch": "main"}
    u1, u2, u3, u4 = (str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(4))
    tool = f"toolu_01{rng.getrandbits(96):024x}"
    out = "\n".join(f"{cwd}/src/mod{k}.py:{rng.randint(1, 400)}: def handler_{k}()"
                    for k in range(rng.randint(3, 12)))
    data = b"".join([
        _entry(parentUuid=parent, **base, type="user", uuid=u1, timestamp=iso(t),
               message={"role": "user", "content": prompt}),
        _entry(parentUuid=u1, **base, type="assistant", uuid=u2, timestamp=iso(t + 4),
               requestId=f"req_{u2[:20]}", message={
                   "model": "claude-opus-4-6", "id": f"msg_{u2[:24]}", "role": "assistant",
                   "content": [{"type": "thinking", "signature": "c2ln" * 40,
                                "thinking": f"Look for where {prompt.lower()} happens."},
                               {"type": "tool_use", "id": tool, "name": "Bash",
                                "input": {"command": f"grep -rn handler {cwd}/src",
                                          "description": "Find the handlers"}}],
                   "usage": {"input_tokens": 4, "output_tokens": rng.randint(50, 900)}}),
        _entry(parentUuid=u2, **base, type="user", uuid=u3, timestamp=iso(t + 6),
               message={"role": "user", "content": [{"tool_use_id": tool,
                        "type": "tool_result", "content": out, "is_error": False}]},
               toolUseResult={"stdout": out, "stderr": "", "interrupted": False}),
        _entry(parentUuid=u3, **base, type="assistant", uuid=u4, timestamp=iso(t + 12),
               message={"model": "claude-opus-4-6", "id": f"msg_{u4[:24]}",
                        "role": "assistant", "content": [{"type": "text", "text":
                        f"The handlers are in {cwd}/src; {prompt.lower()} is done there."}]}),
    ])
    return data, u4


PROMPTS = ("Fix the flaky retry test", "Add pagination to the list endpoint",
           "Why does the build fail on CI", "Rename the config loader", "Speed up the import",
           "Write a migration for the users table", "Review this diff")


def _append(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as f:
        f.write(data)


def build_machine(job: tuple[int, str, str]) -> float:
    """Machine ``i``'s backup: three flushes of 12 sessions; every other machine
    compacted after the second. Returns the seconds it took."""
    i, store_url, work = job
    t0 = time.perf_counter()
    name, rng = machine_name(i), random.Random(i)
    home = f"/home/u{i:04d}"
    os.environ["HOME"] = home  # machine.json's home, which a restore maps from
    root = Path(work) / name
    src = root / "claude"
    # A head with every flush, as a daemon leaves it once it stopped (a lagging head
    # would add a GET and a HEAD per segment after it to each read).
    settings: Settings = load_settings(Path(os.devnull), source=src, store=store_url,
                                       machine_id=name, state_dir=root / "state",
                                       head_interval=0)
    t = 1.78e9 + i * 3600.0
    sessions: list[tuple[Path, str, str, str | None]] = []
    for k in range(SESSIONS):
        sid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        cwd = f"{home}/src/{PROJECTS[k % len(PROJECTS)]}"
        sessions.append((src / "projects" / project_folder(cwd) / f"{sid}.jsonl", sid, cwd,
                         None))

    def turn(k: int) -> None:
        nonlocal t
        path, sid, cwd, parent = sessions[k]
        prompt = rng.choice(PROMPTS)
        data, last = _exchange(rng, sid, cwd, t, parent, prompt)
        _append(path, data)
        _append(src / "history.jsonl", _entry(display=prompt, pastedContents={},
                                              timestamp=int(t * 1000), project=cwd,
                                              sessionId=sid))
        sessions[k] = (path, sid, cwd, last)
        t += 60

    for k in range(SESSIONS):
        turn(k)
    sync_once(settings)
    for k in range(3):
        turn(k)
    sync_once(settings)
    if i % 2 == 0:
        compact(Repository(open_store(store_url), name), compact_options(settings))
    for k in range(3, 5):
        turn(k)
    sync_once(settings)
    return time.perf_counter() - t0


@dataclass
class Built:
    url: str
    machines: list[str]
    build_s: float  # wall time of the build (as recorded when it was built)
    session: str    # a session of the target machine
    target: str = ""    # the machine resumed from: the last real machine by name ("": the last)
    head_only: int = 0  # machines that hold only a head and machine.json (build_wide)

    @property
    def resume_machine(self) -> str:
        return self.target or self.machines[-1]


def _cached(meta: Path, n: int, rebuild: bool) -> Built | None:
    """The store built earlier under ``meta``'s folder (None: none, or ``rebuild``)."""
    if not meta.exists() or rebuild:
        return None
    doc = json.loads(meta.read_text())
    log(f"N={n}: reusing {meta.parent} (built in {doc['build_s']:.1f} s)")
    return Built(**doc)


def build_store(cache: Path, n: int, tag: str, rebuild: bool) -> Built:
    where = cache / f"n{n}-{tag}"
    meta = where / "built.json"
    if (cached := _cached(meta, n, rebuild)) is not None:
        return cached
    shutil.rmtree(where, ignore_errors=True)
    store = where / "store"
    store.mkdir(parents=True)
    url = store.as_uri()
    log(f"N={n}: building {where}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="readside-src-", dir=cache) as work:
        # fork: the workers start with syncd already imported.
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(os.cpu_count() or 2, maxtasksperchild=200) as pool:
            jobs = [(i, url, work) for i in range(n)]
            for done, _ in enumerate(pool.imap_unordered(
                    build_machine, jobs, chunksize=max(1, min(20, n // 20))), 1):
                if done % 100 == 0:
                    log(f"  {done}/{n} machines")
    build_s = time.perf_counter() - t0
    machines = [machine_name(i) for i in range(n)]
    last = Repository(open_store(url), machines[-1])
    from syncd.view import load_backup
    session = min(s.session_id for s in load_backup(last).sessions.values())
    built = Built(url, machines, build_s, session)
    meta.write_text(json.dumps(built.__dict__))
    log(f"N={n}: built in {build_s:.1f} s")
    return built


def build_wide(cache: Path, n: int, tag: str, rebuild: bool, real: Built) -> Built:
    """A store of ``n`` > REAL_MAX machines: ``real`` (the REAL_MAX-machine store) copied,
    plus n - REAL_MAX head-only machines ``machine_name(REAL_MAX ...)``, which sort after
    the real ones. Each holds two objects: the head of real machine ``(i - REAL_MAX) %
    (REAL_MAX - 1)`` (never the last one, the resume target, whose sessions so stay on
    one machine), decoded, its ``machine`` set to the new id, encoded again; and that
    machine's machine.json with its ``machine`` field set likewise. Written straight into
    the ``file://`` store's directory tree."""
    where = cache / f"n{n}-{tag}"
    meta = where / "built.json"
    if (cached := _cached(meta, n, rebuild)) is not None:
        return cached
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    store = where / "store"
    src = Path(real.url.removeprefix("file://"))
    log(f"N={n}: copying the {len(real.machines)}-machine store, adding "
        f"{n - len(real.machines)} head-only machines")
    t0 = time.perf_counter()
    shutil.copytree(src, store)
    sources = real.machines[:-1]
    added = []
    for i in range(len(real.machines), n):
        name, was = machine_name(i), sources[(i - len(real.machines)) % len(sources)]
        h = headfmt.decode((src / layout.head_key(was)).read_bytes(), was, was)
        h.machine = name
        info = json.loads((src / layout.machine_key(was)).read_bytes())
        info["machine"] = name
        (store / layout.machine_prefix(name)).mkdir(mode=0o700)
        (store / layout.head_key(name)).write_bytes(headfmt.encode(h))
        (store / layout.machine_key(name)).write_bytes(json.dumps(info, indent=1).encode())
        added.append(name)
    build_s = time.perf_counter() - t0
    built = Built(store.as_uri(), real.machines + added, build_s, real.session,
                  target=real.resume_machine, head_only=len(added))
    meta.write_text(json.dumps(built.__dict__))
    log(f"N={n}: built in {build_s:.1f} s")
    return built


# -- measuring ----------------------------------------------------------------------------

@dataclass
class Run:
    rc: int
    wall: float
    by_kind: dict[str, int]
    calls: dict[str, int]
    bytes_read: int
    peak_rss: int
    process_wall: float
    out: str
    err: str

    def result(self) -> str:
        """What the command gave: rows of a --json listing, or resume's shell line."""
        lines = self.out.strip().splitlines()
        if lines and lines[-1].startswith("cd "):
            return "cd ... && claude --resume"
        try:
            return f"{len(json.loads(self.out))} rows"
        except ValueError:
            return "?"


def run_command(built: Built, latency: float, args: list[str]) -> Run:
    """``syncd ARGS`` in a fresh process as a new reader: its own HOME, Claude tree and
    state, so a resume restores into an empty tree."""
    with tempfile.TemporaryDirectory(prefix="readside-run-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
        env.update({"HOME": str(home), "SYNCD_CONFIG": os.devnull,
                    "SYNCD_STORE": built.url, "SYNCD_SOURCE": str(home / ".claude"),
                    "SYNCD_STATE_DIR": str(Path(tmp) / "state"),
                    "SYNCD_MACHINE_ID": READER_ID})
        report = Path(tmp) / "report.json"
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, str(REPO / "bench" / "readrunner.py"), str(report),
                            str(latency), "--", *args], env=env, capture_output=True,
                           text=True, stdin=subprocess.DEVNULL, timeout=3600)
        process_wall = time.perf_counter() - t0
        if not report.exists():
            raise SystemExit(f"readside: syncd {' '.join(args)} left no report "
                             f"(exit {r.returncode}):\n{r.stderr[-2000:]}")
        doc = json.loads(report.read_text())
    return Run(doc["rc"], doc["wall"], doc["by_kind"], doc["calls"], doc["bytes_read"],
               doc["peak_rss"], process_wall, r.stdout, r.stderr)


def commands(built: Built) -> list[tuple[str, list[str]]]:
    return [("machines", ["machines", "--json"]),
            ("sessions", ["sessions", "--json"]),
            ("resume", ["resume", built.session]),
            ("resume --machine", ["resume", built.session, "--machine", built.resume_machine])]


def target_cells(n: int, what: str, at_1000: dict[str, int]) -> tuple[str, str, str]:
    """Targets at N=1000 (TARGETS); at N=10,000 requests at most 10 times N=1000's
    (when that was measured) and WIDE_RSS."""
    if n == 10 * REAL_MAX:
        reqs = at_1000.get(what)
        return "", "" if reqs is None else f"<= {10 * reqs}", f"< {WIDE_RSS}"
    if n != 1000:
        return "", "", ""
    wall, reqs, rss = TARGETS[what]
    return ("" if wall is None else f"<= {wall:g}", "" if reqs is None else f"<= {reqs}",
            "" if rss is None else f"<= {rss}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N up to 100")
    ap.add_argument("--machines", default=None,
                    help="comma-separated N (default 1,10,100,1000,10000); an N above "
                    f"{REAL_MAX}: the {REAL_MAX}-machine store plus head-only machines")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="sleep per request")
    ap.add_argument("--workdir", type=Path,
                    default=Path.home() / ".cache" / "syncd-bench" / "readside",
                    help="where built stores are kept between runs")
    ap.add_argument("--rebuild", action="store_true", help="build the stores again")
    args = ap.parse_args()
    sizes = [int(x) for x in args.machines.split(",")] if args.machines else \
        [1, 10, 100] if args.quick else [1, 10, 100, 1000, 10 * REAL_MAX]
    tag = store_tag()
    args.workdir.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    rows: list[tuple[str, ...]] = []
    at_1000: dict[str, int] = {}  # requests per command at N=1000, for N=10,000's targets
    notes = [f"syncd under test: {git_describe()}",
             f"latency injected: {args.latency_ms:g} ms per request (LIST: per page of "
             "1000 keys), slept by the calling thread",
             f"each machine: {SESSIONS} sessions in {len(PROJECTS)} projects, 3 flushes; "
             "every other machine (index 0, 2, ...) compacted after the second flush",
             f"store tag {tag} (writer source and recipe); stores under {args.workdir}"]
    for n in sizes:
        if n <= REAL_MAX:
            built = build_store(args.workdir, n, tag, args.rebuild)
            how = f"store built in {built.build_s:.1f} s ({os.cpu_count()} worker processes)"
        else:
            real = build_store(args.workdir, REAL_MAX, tag, args.rebuild)
            built = build_wide(args.workdir, n, tag, args.rebuild, real)
            how = (f"the N={REAL_MAX} store plus {built.head_only} head-only machines "
                   f"(head and machine.json), added in {built.build_s:.1f} s")
        target = built.resume_machine
        compacted = built.machines.index(target) % 2 == 0
        notes.append(f"N={n}: {how}; resume target {built.session} on {target} "
                     f"({'compacted' if compacted else 'not compacted'})")
        for what, cmd in commands(built):
            log(f"N={n}: syncd {' '.join(cmd)}")
            r = run_command(built, args.latency_ms / 1000, cmd)
            k = r.by_kind
            other = sum(v for key, v in k.items() if key not in ("LIST", "GET", "HEAD", "PUT"))
            t_wall, t_req, t_rss = target_cells(n, what, at_1000)
            if n == REAL_MAX:
                at_1000[what] = sum(k.values())
            rows.append((str(n), what, f"{r.wall:.2f}", t_wall,
                         str(sum(k.values())), t_req,
                         f"{k.get('LIST', 0)} / {k.get('GET', 0)} / {k.get('HEAD', 0)} / "
                         f"{k.get('PUT', 0)}" + (f" (+{other})" if other else ""),
                         f"{r.bytes_read / MB:.2f}", f"{r.peak_rss / MB:.0f}", t_rss,
                         str(r.rc), r.result()))
            if r.rc != 0:
                notes.append(f"N={n} {what}: exit {r.rc}: {r.err.strip()[-300:]}")
            odd = {m: c for m, c in r.calls.items()
                   if m not in ("list", "prefixes", "get", "head", "put", "delete_many")}
            if odd:
                notes.append(f"N={n} {what}: other store methods called: {odd}")
            log(f"  {r.wall:.2f} s, {sum(k.values())} requests, process {r.process_wall:.2f} s")
    notes.append(f"load average (1 min) at start {load0:.2f}, at the end "
                 f"{os.getloadavg()[0]:.2f}")
    print(f"syncd read-side benchmark ({os.cpu_count()} CPUs)")
    print(render_table(("N", "command", "wall s", "target", "requests", "target",
                        "LIST / GET / HEAD / PUT", "MB read", "peak RSS MB", "target", "exit",
                        "output"),
                       rows, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Core figures for syncd, with restic and rclone side by side.

Prints figures; asserts nothing. See bench/README.md for what each figure means.

    .venv/bin/python bench/core.py                # full run (>= 200 MB tree), ~5-10 min
    .venv/bin/python bench/core.py --quick        # smoke run, about a minute
    .venv/bin/python bench/core.py --skip-peers   # syncd only

Progress goes to stderr, the final table to stdout. Everything (trees, SeaweedFS,
restic repo, state) lives in one temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from syncd.config import Settings  # noqa: E402
from syncd.format.segment import TRAILER  # noqa: E402
from syncd.repository import Repository  # noqa: E402
from syncd.security.crypto import SCRYPT_N, SCRYPT_P, SCRYPT_R  # noqa: E402
from syncd.store import layout, open_store  # noqa: E402
from tests.seaweed import Seaweed, start_seaweed  # noqa: E402

SAMPLES = REPO.parent / "shared" / "claude-samples"
BIN = Path(sys.executable).parent
MB = 1_000_000
CLK_TCK = os.sysconf("SC_CLK_TCK")
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def tool(name: str) -> str:
    here = BIN / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise SystemExit(f"bench: {name} not found")
    return found


# ---------------------------------------------------------------------------
# Realistic content: real transcript lines recombined, or synthetic ones.
# ---------------------------------------------------------------------------

UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TS_RE = re.compile(r'"timestamp":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z"')
PROJECT_NAMES = ["api-server", "web-frontend", "infra/terraform", "ml/pipeline", "docs-site",
                 "cli-tool", "mobile-app", "data/etl-jobs", "auth-service", "payments",
                 "notebooks", "dotfiles", "game-engine", "compiler", "search-index"]


def sanitize(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "-", path)


def rand_uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def iso(t: float) -> str:
    d = datetime.fromtimestamp(t, UTC)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


@dataclass
class Corpus:
    """Template lines grouped by source file, and what is known about them."""

    files: list[list[str]]
    roots: list[str]          # source project roots, rewritten to the new cwd
    sids: list[str]           # source session ids, rewritten to the new session id
    prompts: list[str]
    tool_texts: list[str]
    origin: str
    short: list[str] = field(default_factory=list)   # lines under 3 KB
    onek: list[str] = field(default_factory=list)    # lines of 700..1400 bytes

    def __post_init__(self) -> None:
        every = [ln for f in self.files for ln in f]
        self.short = [ln for ln in every if len(ln) < 3000]
        self.onek = [ln for ln in every if 700 <= len(ln) <= 1400] or self.short
        roots = sorted(set(self.roots), key=len, reverse=True)
        self._root_re = re.compile("|".join(re.escape(r) for r in roots)) if roots else None

    def rewrite(self, line: str, mapping: dict[str, str], cwd: str,
                clock: list[float], rng: random.Random) -> str:
        """Fresh uuids (consistent within a file), the new cwd, advancing timestamps."""
        line = UUID_RE.sub(lambda m: mapping.setdefault(m.group(), rand_uuid(rng)), line)
        if self._root_re is not None:
            line = self._root_re.sub(cwd, line)

        def ts(_: re.Match[str]) -> str:
            clock[0] += rng.uniform(0.2, 25.0)
            return f'"timestamp":"{iso(clock[0])}"'

        line = TS_RE.sub(ts, line)
        return line if line.endswith("\n") else line + "\n"

    def _mapping(self, sid: str) -> dict[str, str]:
        return dict.fromkeys(self.sids, sid)

    def session(self, rng: random.Random, sid: str, cwd: str, target: int) -> bytes:
        """A transcript of about ``target`` bytes: runs of consecutive lines from random
        source files at random offsets, so structure is real but no two files match."""
        mapping = self._mapping(sid)
        clock = [time.time() - rng.uniform(1, 25) * 86400]
        out: list[str] = []
        size = 0
        while size < target:
            src = rng.choice(self.files)
            start = rng.randrange(len(src))
            for tmpl in src[start : start + rng.randint(8, 60)]:
                line = self.rewrite(tmpl, mapping, cwd, clock, rng)
                out.append(line)
                size += len(line)
                if size >= target:
                    break
        return "".join(out).encode()

    def small(self, rng: random.Random, sid: str, cwd: str, lines: int) -> bytes:
        mapping = self._mapping(sid)
        clock = [time.time() - rng.uniform(1, 25) * 86400]
        return "".join(self.rewrite(rng.choice(self.short), mapping, cwd, clock, rng)
                       for _ in range(lines)).encode()

    def line(self, rng: random.Random, sid: str, cwd: str) -> bytes:
        """One ~1 KB line as Claude Code appends it."""
        return self.rewrite(rng.choice(self.onek), self._mapping(sid), cwd,
                            [time.time()], rng).encode()

    def tool_result(self, rng: random.Random) -> bytes:
        text = rng.choice(self.tool_texts) if self.tool_texts else "ok\n"
        a = rng.randrange(max(1, len(text) // 2))
        body = text[a:]
        while len(body) < rng.randint(2000, 40000) and self.tool_texts:
            body += "\n" + rng.choice(self.tool_texts)
        return body.encode()


def _content_texts(msg: Any) -> list[str]:
    out: list[str] = []
    content = msg.get("content") if isinstance(msg, dict) else None
    if isinstance(content, list):
        for item in content:
            if isinstance(item, dict) and item.get("type") == "tool_result":
                c = item.get("content")
                if isinstance(c, str):
                    out.append(c)
                elif isinstance(c, list):
                    out.extend(str(x.get("text", "")) for x in c if isinstance(x, dict))
    return [t for t in out if len(t) >= 1000]


def corpus_from_lines(files: list[list[str]], origin: str) -> Corpus:
    roots: list[str] = []
    sids: set[str] = set()
    prompts: list[str] = []
    tool_texts: list[str] = []
    for lines in files:
        first_cwd = None
        for ln in lines:
            try:
                d = json.loads(ln)
            except ValueError:
                continue
            if not isinstance(d, dict):
                continue
            if first_cwd is None and isinstance(d.get("cwd"), str):
                first_cwd = d["cwd"]
            if isinstance(d.get("sessionId"), str):
                sids.add(d["sessionId"])
            msg = d.get("message")
            if d.get("type") == "user" and isinstance(msg, dict):
                c = msg.get("content")
                if isinstance(c, str) and c and not c.startswith("<"):
                    prompts.append(c[:2000])
                tool_texts.extend(_content_texts(msg))
        if first_cwd:
            roots.append(first_cwd)
    return Corpus(files, roots, sorted(sids), prompts or ["fix the failing test"], tool_texts,
                  origin)


def load_samples(path: Path) -> Corpus | None:
    files = []
    for f in sorted(path.rglob("*.jsonl")):
        lines = f.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        if lines:
            files.append(lines)
    if not files:
        return None
    return corpus_from_lines(files, f"real transcripts from {path} ({len(files)} files, "
                                    f"recombined with fresh uuids/timestamps/cwds)")


_WORDS = ("the a to of and in is it for on that with as this be are from by at or not we "
         "you can should will file test function error value return import class self "
         "config path data user request response server client cache build run check "
         "update fix bug issue line output input module package type string list dict "
         "None True False async await yield raise except try finally with open read "
         "write json yaml http status code handler route model schema query index")
WORDS = _WORDS.split()


def _text(rng: random.Random, n: int) -> str:
    words = rng.choices(WORDS, k=n)
    return " ".join(words).capitalize() + "."


def _code(rng: random.Random, n: int) -> str:
    out = []
    for i in range(n):
        ind = "    " * rng.randint(0, 3)
        a, b, c = rng.choices(WORDS, k=3)
        out.append(rng.choice([f"{i + 1:>6}\t{ind}def {a}_{b}(self, {c}):",
                               f"{i + 1:>6}\t{ind}return {a}({b}, {c}={rng.randint(0, 99)})",
                               f"{i + 1:>6}\t{ind}{a} = {b}.{c}()",
                               f"{i + 1:>6}\t{ind}if {a} is not None and {b}:",
                               f"{i + 1:>6}\t{ind}# {_text(rng, rng.randint(4, 12))}"]))
    return "\n".join(out)


def synthetic_corpus(rng: random.Random) -> Corpus:
    """Transcript-shaped lines: prompts, thinking with signatures, tool_use/tool_result."""
    files: list[list[str]] = []
    roots, sids = [], []
    for k in range(3):
        root, sid = f"/home/synth/project{k}", rand_uuid(rng)
        roots.append(root)
        sids.append(sid)
        lines, parent, t = [], None, 1.7e9
        size = 0
        while size < 3_000_000:
            u = rand_uuid(rng)
            t += rng.uniform(1, 30)
            base = {"parentUuid": parent, "isSidechain": False, "userType": "external",
                    "cwd": root, "sessionId": sid, "version": "2.1.76", "gitBranch": "main"}
            kind = rng.choices(["prompt", "think", "tool", "text"], [1, 2, 5, 2])[0]
            if kind == "prompt":
                d = {**base, "type": "user", "message": {
                    "role": "user", "content": _text(rng, rng.randint(8, 80))}}
            elif kind == "think":
                d = {**base, "type": "assistant", "requestId": f"req_{u[:20]}", "message": {
                    "model": "claude-opus-4-6", "id": f"msg_{u[:24]}", "type": "message",
                    "role": "assistant", "content": [{
                        "type": "thinking", "thinking": _text(rng, rng.randint(30, 300)),
                        "signature": base64.b64encode(rng.randbytes(rng.randint(200, 600)))
                        .decode()}],
                    "usage": {"input_tokens": rng.randint(1, 9), "output_tokens":
                              rng.randint(10, 900), "cache_read_input_tokens":
                              rng.randint(1000, 90000)}}}
            elif kind == "tool":
                tid = f"toolu_01{base64.b32encode(rng.randbytes(15)).decode()[:22]}"
                cmd = f"{rng.choice(['pytest -x', 'cat', 'grep -rn', 'ls -la'])} " \
                      f"{root}/{rng.choice(WORDS)}.py"
                lines.append(json.dumps({**base, "type": "assistant", "uuid": u,
                                         "timestamp": iso(t), "message": {
                    "model": "claude-opus-4-6", "id": f"msg_{u[:24]}", "role": "assistant",
                    "content": [{"type": "tool_use", "id": tid, "name": "Bash",
                                 "input": {"command": cmd, "description": _text(rng, 6)}}]}},
                    separators=(",", ":")) + "\n")
                parent, u = u, rand_uuid(rng)
                out = _code(rng, rng.randint(5, 400))
                d = {**base, "parentUuid": parent, "type": "user", "message": {
                    "role": "user", "content": [{"tool_use_id": tid, "type": "tool_result",
                                                 "content": out, "is_error": False}]},
                     "toolUseResult": {"stdout": out, "stderr": "", "interrupted": False}}
            else:
                d = {**base, "type": "assistant", "message": {
                    "model": "claude-opus-4-6", "id": f"msg_{u[:24]}", "role": "assistant",
                    "content": [{"type": "text", "text": _text(rng, rng.randint(10, 200))}]}}
            d["uuid"], d["timestamp"] = u, iso(t)
            s = json.dumps(d, separators=(",", ":")) + "\n"
            lines.append(s)
            size += len(s)
            parent = u
        files.append(lines)
    c = corpus_from_lines(files, "synthetic transcript-shaped lines")
    c.roots, c.sids = roots, sids
    c.__post_init__()
    return c


# ---------------------------------------------------------------------------
# Trees
# ---------------------------------------------------------------------------

@dataclass
class Tree:
    root: Path
    bytes: int = 0
    files: int = 0
    sessions: list[tuple[Path, str, str]] = field(default_factory=list)  # (path, sid, cwd)


def _write(tree: Tree, rel: str, data: bytes) -> Path:
    p = tree.root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    tree.bytes += len(data)
    tree.files += 1
    return p


def build_main_tree(root: Path, corpus: Corpus, rng: random.Random, size: int,
                    home: str = "/home/dev") -> Tree:
    """Sessions of projects under ``home``/src, ``size`` bytes in all."""
    tree = Tree(root)
    cwds = [f"{home}/src/{n}" for n in PROJECT_NAMES]
    history: list[str] = []
    while tree.bytes < size:
        cwd = rng.choice(cwds)
        sid = rand_uuid(rng)
        proj = f"projects/{sanitize(cwd)}"
        target = int(min(6e6, max(2e4, rng.lognormvariate(math.log(6e5), 1.0))))
        p = _write(tree, f"{proj}/{sid}.jsonl", corpus.session(rng, sid, cwd, target))
        tree.sessions.append((p, sid, cwd))
        if rng.random() < 0.35:
            for _ in range(rng.randint(1, 3)):
                agent = f"a{rng.getrandbits(28):07x}"
                t = int(min(8e5, max(5e3, rng.lognormvariate(math.log(8e4), 1.0))))
                _write(tree, f"{proj}/{sid}/subagents/agent-{agent}.jsonl",
                       corpus.session(rng, sid, cwd, t))
        if rng.random() < 0.4:
            for _ in range(rng.randint(1, 4)):
                tid = f"toolu_01{base64.b32encode(rng.randbytes(15)).decode()[:22]}"
                _write(tree, f"{proj}/{sid}/tool-results/{tid}.txt", corpus.tool_result(rng))
        for _ in range(rng.randint(1, 8)):
            history.append(json.dumps({
                "display": rng.choice(corpus.prompts)[:500], "pastedContents": {},
                "timestamp": int((time.time() - rng.uniform(0, 30 * 86400)) * 1000),
                "project": cwd, "sessionId": sid}, separators=(",", ":")) + "\n")
    _write(tree, "history.jsonl", "".join(history).encode())
    return tree


def build_small_tree(root: Path, corpus: Corpus, rng: random.Random, n: int) -> Tree:
    """``n`` small files shaped like a long-lived ~/.claude: many short sessions."""
    tree = Tree(root)
    cwds = [f"/home/dev/src/{name}-{k}" for k in range(4) for name in PROJECT_NAMES]
    while tree.files < n:
        cwd = rng.choice(cwds)
        sid = rand_uuid(rng)
        proj = f"projects/{sanitize(cwd)}"
        _write(tree, f"{proj}/{sid}.jsonl", corpus.small(rng, sid, cwd, rng.randint(1, 4)))
        if rng.random() < 0.25 and tree.files + 3 <= n:
            for _ in range(2):
                _write(tree, f"{proj}/{sid}/subagents/agent-a{rng.getrandbits(28):07x}.jsonl",
                       corpus.small(rng, sid, cwd, rng.randint(1, 3)))
            tid = f"toolu_01{base64.b32encode(rng.randbytes(15)).decode()[:22]}"
            _write(tree, f"{proj}/{sid}/tool-results/{tid}.txt", corpus.tool_result(rng)[:3000])
    return tree


# ---------------------------------------------------------------------------
# Processes and measurements
# ---------------------------------------------------------------------------

class Procs:
    """Every process we start; anything still running at the end is stopped by its pid."""

    def __init__(self) -> None:
        self.live: list[subprocess.Popen[bytes]] = []

    def start(self, cmd: list[str], env: dict[str, str], out: Path,
              err: Path) -> subprocess.Popen[bytes]:
        with open(out, "wb") as o, open(err, "wb") as e:
            p = subprocess.Popen(cmd, env=env, stdout=o, stderr=e, stdin=subprocess.DEVNULL)
        self.live.append(p)
        return p

    def stop_all(self) -> None:
        for p in self.live:
            if p.returncode is None and p.poll() is None:
                stop_process(p, timeout=15)


@dataclass
class Run:
    rc: int
    wall: float
    maxrss: int   # bytes, from wait4
    cpu: float    # user+sys seconds
    out: str
    err: str
    sys: float = 0.0  # of cpu, the kernel's seconds


GNU_TIME = next((t for t in ("/usr/bin/time", shutil.which("time")) if t and os.access(t, os.X_OK)),
                None)


def run_measured(procs: Procs, cmd: list[str], env: dict[str, str], logs: Path,
                 name: str) -> Run:
    """Run to completion: wall time, CPU, and peak RSS taken by GNU time (the ru_maxrss
    that wait4 reports for our child starts at this process's own peak: the kernel
    carries the spawning mm's high-water mark over the exec). -1 without GNU time."""
    out, err = logs / f"{name}.out", logs / f"{name}.err"
    rss_file = logs / f"{name}.maxrss"
    if GNU_TIME is not None:
        cmd = [GNU_TIME, "-q", "-o", str(rss_file), "-f", "%M", *cmd]
    t = time.monotonic()
    p = procs.start(cmd, env, out, err)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    maxrss = int(rss_file.read_text().split()[-1]) * 1024 if GNU_TIME is not None else -1
    r = Run(p.returncode, wall, maxrss, ru.ru_utime + ru.ru_stime,
            out.read_text(errors="replace"), err.read_text(errors="replace"), ru.ru_stime)
    if r.rc != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} exited {r.rc}: {r.err[-2000:]}")
    return r


def stop_process(p: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def proc_cpu(pid: int) -> float:
    """utime+stime of a live process, seconds (all threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_mem(pid: int) -> dict[str, int]:
    out = {}
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith(("VmRSS:", "VmHWM:")):
            k, v = ln.split(":")
            out[k] = int(v.split()[0]) * 1024
    return out


def bucket_stats(sw: Seaweed, bucket: str, prefix: str = "") -> tuple[int, int]:
    """(objects, bytes) under ``prefix``."""
    n = size = 0
    pages = sw.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    for page in pages:
        for o in page.get("Contents", []):
            n += 1
            size += int(o["Size"])
    return n, size


def catchup_peak_rss(daemon_log: str) -> int | None:
    """The start-up catch-up child's peak RSS (bytes) from the daemon's log, if it ran."""
    found = re.findall(r"start-up catch-up: .* \(peak RSS ([\d.]+) MB\)", daemon_log)
    return round(float(found[-1]) * MB) if found else None


def shipped_files(state_dir: Path) -> int:
    """Files the daemon has committed as durable, from its SQLite state (read-only)."""
    for db in state_dir.glob("*.sqlite"):
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
            try:
                row = con.execute("SELECT count(*) FROM files WHERE deleted_at IS NULL"
                                  ).fetchone()
            finally:
                con.close()
        except sqlite3.Error:
            return 0
        return int(row[0])
    return 0


def git_describe() -> str:
    """The commit the syncd under test comes from, and whether syncd/ has local changes."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "syncd"],
                               capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    changed = [ln for ln in dirty if ln.strip()]
    return f"commit {head}" + (f" + {len(changed)} uncommitted files under syncd/"
                               if changed else "")


def wait_ready(proc: subprocess.Popen[bytes], err: Path, sock: socket.socket,
               timeout: float = 120.0) -> str:
    """Until ``syncd run`` has done its first scan and flush: sd_notify READY=1 when it
    sends one, else 5 s after its "syncd running" log line."""
    deadline = time.monotonic() + timeout
    running_at = None
    sock.settimeout(0.1)
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"syncd run did not start: "
                               f"{err.read_text(errors='replace')[-2000:]}")
        try:
            if b"READY=1" in sock.recv(65536):
                return "sd_notify READY=1"
        except TimeoutError:
            pass
        if running_at is None and "syncd running" in err.read_text(errors="replace"):
            running_at = time.monotonic()
        if running_at is not None and time.monotonic() - running_at > 5:
            return "5 s after its start log line"


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))] if s else float("nan")


def append_line(path: Path, line: bytes) -> int:
    """Append one whole line the way Claude Code does; returns the file size after it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------

@dataclass
class Seed:
    run: Run
    objects: int
    stored: int
    sent: int


@dataclass
class Results:
    rows: list[tuple[str, str, str, str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, what: str, syncd: str = "", restic: str = "", rclone: str = "",
            target: str = "", met: bool | None = None) -> None:
        self.rows.append((what, syncd, restic, rclone, target,
                          "" if met is None else ("yes" if met else "NO")))

    def table(self) -> str:
        return render_table(("figure", "syncd", "restic", "rclone", "target", "met"),
                            self.rows, self.notes)


def render_table(head: tuple[str, ...], rows: list[tuple[str, ...]], notes: list[str]) -> str:
    """Columns padded to fit; a row whose first cell starts with '#' is a section title."""
    body = [r for r in rows if not r[0].startswith("#")]
    w = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    line = "  ".join("-" * x for x in w)
    out = [line, "  ".join(h.ljust(w[i]) for i, h in enumerate(head)), line]
    for r in rows:
        if r[0].startswith("#"):
            out.append(r[0][1:].strip())
            continue
        out.append("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip())
    out.append(line)
    out.extend(f"note: {n}" for n in notes)
    return "\n".join(out)


def fmt_mb(n: float) -> str:
    return f"{n / MB:.1f} MB"


class BenchBase:
    """What every bench has: a work dir, logs, processes, results, SeaweedFS, the tools."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True)
        self.procs = Procs()
        self.res = Results()
        self.rng = random.Random(args.seed)
        self.sw: Seaweed | None = None
        self.syncd = tool("syncd")
        self.peers = not args.skip_peers
        if self.peers:
            self.restic = tool("restic")

    def close(self) -> None:
        self.procs.stop_all()
        proxy = getattr(self, "proxy", None)  # restore and compact count requests
        if proxy is not None:
            proxy.close()
        if self.sw is not None:
            self.sw.stop()

    def base_env(self) -> dict[str, str]:
        assert self.sw is not None
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SYNCD_", "RESTIC_", "RCLONE_"))}
        env.update(self.sw.env())
        # The syncd under test is this checkout's, whichever one the venv was installed from.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        return env

    def start_tree_and_seaweed(self, size_mb: int, buckets: tuple[str, ...]) -> Corpus:
        """The main tree (``self.tree``), SeaweedFS with ``buckets``, the usual notes."""
        corpus = None if self.args.synthetic else load_samples(SAMPLES)
        if corpus is None:
            corpus = synthetic_corpus(self.rng)
        log(f"content: {corpus.origin}")
        log(f"generating {size_mb} MB tree ...")
        self.tree = build_main_tree(self.work / "claude", corpus, self.rng, size_mb * MB)
        log(f"tree: {self.tree.files} files, {fmt_mb(self.tree.bytes)}, "
            f"{len(self.tree.sessions)} sessions")
        log("starting SeaweedFS ...")
        self.sw = start_seaweed(self.work / "seaweed")
        os.environ.update(self.sw.env())  # for the stores this process opens itself
        for b in buckets:
            self.sw.create_bucket(b)
        self.res.notes.append(f"syncd under test: {git_describe()}")
        self.res.notes.append("load average (1 min) at start: "
                              f"{os.getloadavg()[0]:.2f}; other work on the machine skews times")
        self.res.notes.append(f"content: {corpus.origin}")
        return corpus


class Bench(BenchBase):
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        super().__init__(args, work)
        if self.peers:
            self.rclone = tool("rclone")

    # -- environments -------------------------------------------------------

    def syncd_env(self, source: Path, store: str, name: str) -> dict[str, str]:
        assert self.sw is not None
        return {**self.base_env(), "SYNCD_SOURCE": str(source), "SYNCD_STORE": store,
                "SYNCD_STATE_DIR": str(self.work / f"state-{name}"),
                "SYNCD_MACHINE_ID": f"bench-{name}", "SYNCD_S3_ENDPOINT_URL": self.sw.endpoint,
                "SYNCD_CONFIG": os.devnull}

    def restic_env(self, bucket: str = "restic") -> dict[str, str]:
        assert self.sw is not None
        return {**self.base_env(), "RESTIC_REPOSITORY": f"s3:{self.sw.endpoint}/{bucket}",
                "RESTIC_PASSWORD": "bench-password",
                "RESTIC_CACHE_DIR": str(self.work / "restic-cache")}

    def rclone_env(self) -> dict[str, str]:
        assert self.sw is not None
        env = self.base_env()
        # rclone refuses a custom CA bundle with its own HTTP transport; plain http here.
        env.pop("AWS_CA_BUNDLE", None)
        creds = self.sw.env()
        env.update({"RCLONE_CONFIG": str(self.work / "rclone.conf"),
                    "RCLONE_CONFIG_SW_TYPE": "s3", "RCLONE_CONFIG_SW_PROVIDER": "Other",
                    "RCLONE_CONFIG_SW_ENDPOINT": self.sw.endpoint,
                    "RCLONE_CONFIG_SW_ACCESS_KEY_ID": creds["AWS_ACCESS_KEY_ID"],
                    "RCLONE_CONFIG_SW_SECRET_ACCESS_KEY": creds["AWS_SECRET_ACCESS_KEY"],
                    "RCLONE_CONFIG_SW_REGION": "us-east-1",
                    "RCLONE_CONFIG_SW_FORCE_PATH_STYLE": "true"})
        (self.work / "rclone.conf").touch()
        return env

    def rclone_copy(self, name: str, prefix: str = "tree") -> tuple[Run, int]:
        r = run_measured(self.procs, [self.rclone, "copy", str(self.tree.root),
                                      f"sw:rclone/{prefix}",
                                      "-v", "--use-json-log", "--stats", "1h",
                                      "--stats-one-line"], self.rclone_env(), self.logs, name)
        sent = 0
        for ln in r.err.splitlines():
            with contextlib.suppress(ValueError):
                d = json.loads(ln)
                if isinstance(d, dict) and isinstance(d.get("stats"), dict):
                    sent = int(d["stats"].get("bytes", 0))
        return r, sent

    def next_seq(self, env: dict[str, str]) -> int:
        st = json.loads(subprocess.run([self.syncd, "status", "--json"], env=env, check=True,
                                       capture_output=True, text=True).stdout)
        return int(st["next_seq"])

    def segment_split(self, seq: int) -> tuple[int, int] | None:
        """(header + frames, index + trailer) bytes of one segment in the syncd bucket."""
        key = "bench/" + layout.segment_key("bench-main", seq)
        try:
            blob = self.sw.client().get_object(Bucket="syncd", Key=key)["Body"].read()  # type: ignore[union-attr]
        except Exception:
            return None
        off = TRAILER.unpack(blob[-TRAILER.size:])[0]
        return off, len(blob) - off

    # -- steps --------------------------------------------------------------
    def run_all(self) -> None:
        a = self.args
        corpus = None if a.synthetic else load_samples(SAMPLES)
        if corpus is None:
            corpus = synthetic_corpus(self.rng)
        log(f"content: {corpus.origin}")
        log(f"generating {a.size_mb} MB tree ...")
        self.tree = build_main_tree(self.work / "claude", corpus, self.rng, a.size_mb * MB)
        log(f"main tree: {self.tree.files} files, {fmt_mb(self.tree.bytes)}, "
            f"{len(self.tree.sessions)} sessions")
        log(f"generating {a.small_files} small files ...")
        self.small = build_small_tree(self.work / "claude-small", corpus, self.rng,
                                      a.small_files)
        log(f"small tree: {self.small.files} files, {fmt_mb(self.small.bytes)}")
        self.corpus = corpus
        log("starting SeaweedFS ...")
        self.sw = start_seaweed(self.work / "seaweed")
        os.environ.update(self.sw.env())  # for the store this process reads segments from
        for b in ("syncd", "restic", "rclone"):
            self.sw.create_bucket(b)
        log(f"SeaweedFS at {self.sw.endpoint}")
        self.res.notes.append(f"syncd under test: {git_describe()}")
        self.res.notes.append("load average (1 min) at start: "
                              f"{os.getloadavg()[0]:.2f}; other work on the machine skews times")
        self.res.notes.append(f"content: {corpus.origin}")
        self.res.notes.append(f"main tree: {self.tree.files} files, {fmt_mb(self.tree.bytes)}, "
                              f"{len(self.tree.sessions)} sessions; small tree: "
                              f"{self.small.files} files, {fmt_mb(self.small.bytes)}")
        self.fig1_seed()
        self.fig2_append()
        self.fig3_latency()
        self.fig4_idle()
        self.res.notes.append(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")

    def seed_syncd(self, k: int) -> Seed:
        prefix = "bench" if k == 0 else f"rep{k}"
        env = self.syncd_env(self.tree.root, f"s3://syncd/{prefix}", "main" if k == 0
                             else f"rep{k}")
        r = run_measured(self.procs, [self.syncd, "sync"], env, self.logs, f"syncd-seed{k}")
        n, stored = bucket_stats(self.sw, "syncd", prefix + "/")  # type: ignore[arg-type]
        return Seed(r, n, stored, stored)

    def seed_syncd_encrypted(self, k: int) -> Seed:
        """The same seed into an encrypted store (``init --encrypt`` first, not timed)."""
        prefix = f"enc{k}"
        env = {**self.syncd_env(self.tree.root, f"s3://syncd/{prefix}", prefix),
               "SYNCD_PASSPHRASE": "bench passphrase"}
        init = run_measured(self.procs, [self.syncd, "init", "--encrypt"], env, self.logs,
                            f"syncd-init-{prefix}")
        if init.rc:
            raise RuntimeError(f"syncd init --encrypt failed: {init.err}")
        r = run_measured(self.procs, [self.syncd, "sync"], env, self.logs, f"syncd-seed-{prefix}")
        n, stored = bucket_stats(self.sw, "syncd", prefix + "/")  # type: ignore[arg-type]
        return Seed(r, n, stored, stored)

    def seed_restic(self, k: int) -> Seed:
        bucket = "restic" if k == 0 else f"restic-rep{k}"
        if k:
            self.sw.create_bucket(bucket)  # type: ignore[union-attr]
        env = self.restic_env(bucket)
        run_measured(self.procs, [self.restic, "init", "--repository-version", "2"], env,
                     self.logs, f"restic-init{k}")
        n0, _ = bucket_stats(self.sw, bucket)  # type: ignore[arg-type]
        r = run_measured(self.procs, [self.restic, "backup", "--compression", "auto",
                                      "--host", "bench", "--json", str(self.tree.root)],
                         env, self.logs, f"restic-seed{k}")
        n1, s1 = bucket_stats(self.sw, bucket)  # type: ignore[arg-type]
        return Seed(r, n1 - n0, s1, s1)

    def seed_rclone(self, k: int) -> Seed:
        prefix = "tree" if k == 0 else f"rep{k}"
        r, sent = self.rclone_copy(f"rclone-seed{k}", prefix)
        n, stored = bucket_stats(self.sw, "rclone", prefix + "/")  # type: ignore[arg-type]
        return Seed(r, n, stored, sent)

    def fig1_seed(self) -> None:
        res, tree, reps = self.res, self.tree, self.args.repeat
        res.add(f"# 1. initial seed of the whole tree into SeaweedFS (median of {reps} runs, "
                "fresh destination each; stored/ratio/RSS from the first)")
        tools = {"syncd": self.seed_syncd, "syncd-enc": self.seed_syncd_encrypted}
        if self.peers:
            tools |= {"restic": self.seed_restic, "rclone": self.seed_rclone}
        runs: dict[str, list[Seed]] = {t: [] for t in tools}
        for k in range(reps):
            # Interleaved, so that a burst of other load on the machine hits every tool.
            for name, fn in tools.items():
                log(f"fig 1: {name} seed {k + 1}/{reps} ...")
                sd = fn(k)
                runs[name].append(sd)
                log(f"  {name}: {sd.run.wall:.2f}s, {tree.bytes / MB / sd.run.wall:.1f} MB/s, "
                    f"{fmt_mb(sd.stored)} in {sd.objects} objects")
        cols: dict[str, dict[str, str]] = {"restic": {}, "rclone": {}}
        rates: dict[str, float] = {}
        for name, seeds in runs.items():
            rs = [tree.bytes / MB / sd.run.wall for sd in seeds]
            rates[name] = statistics.median(rs)
            first = seeds[0]
            stored = f"{fmt_mb(first.stored)}"
            if name == "restic":
                stored += " (repo)"
            elif name == "rclone":
                stored += f" (sent {fmt_mb(first.sent)})"
            cols[name] = {
                "rate": f"{rates[name]:.1f}" + (f" ({min(rs):.0f}-{max(rs):.0f})"
                                                if len(rs) > 1 else ""),
                "wall": f"{statistics.median(sd.run.wall for sd in seeds):.2f}",
                "cpu": f"{statistics.median(sd.run.cpu for sd in seeds):.2f}",
                "stored": stored, "ratio": f"{tree.bytes / first.stored:.2f}",
                "objs": str(first.objects), "rss": fmt_mb(first.run.maxrss)}
        first = runs["syncd"][0]
        restic_rate = rates.get("restic")

        def add(key: str, what: str, target: str = "", met: bool | None = None) -> None:
            res.add(what, cols["syncd"][key], cols["restic"].get(key, ""),
                    cols["rclone"].get(key, ""), target, met)

        add("rate", "1 seed throughput, tree MB / wall s",
            f">= restic ({restic_rate:.1f})" if restic_rate else ">= restic",
            None if restic_rate is None else rates["syncd"] >= restic_rate)
        add("wall", "1 seed wall time, s")
        add("cpu", "1 seed CPU (user+sys), s")
        add("stored", "1 stored bytes")
        ratio = tree.bytes / first.stored
        add("ratio", "1 ratio tree bytes / stored bytes", ">= 5", ratio >= 5)
        add("objs", "1 objects written")
        add("rss", "1 peak RSS of the seed process", "<= 80 MB",
            first.run.maxrss <= 80 * MB)
        self._encryption_cost(runs["syncd"], runs["syncd-enc"])

    def _encryption_cost(self, plain: list[Seed], sealed: list[Seed]) -> None:
        """Figure 1e: the same seed into an encrypted store, interleaved with the plain one.
        The cost includes the passphrase's scrypt, which runs once per process start; its
        time alone is measured here and shown beside it."""
        from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

        t = time.perf_counter()
        Scrypt(salt=os.urandom(16), length=32, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P).derive(b"x")
        unlock = time.perf_counter() - t
        mb = self.tree.bytes / MB
        rates = [mb / sd.run.wall for sd in sealed]
        rate = statistics.median(mb / sd.run.wall for sd in plain)
        rate_enc = statistics.median(rates)
        cost = 100 * (1 - rate_enc / rate)
        first = sealed[0]
        self.res.add("1e encrypted seed throughput, tree MB / wall s",
                     f"{rate_enc:.1f}" + (f" ({min(rates):.0f}-{max(rates):.0f})"
                                          if len(rates) > 1 else ""))
        self.res.add("1e encryption cost, % of seed throughput",
                     f"{cost:.1f} % (incl. a {unlock:.2f} s key unlock)", target="<= 15 %",
                     met=cost <= 15)
        self.res.add("1e encrypted stored bytes / objects",
                     f"{fmt_mb(first.stored)} / {first.objects} (incl. the key file)")
        self.res.add("1e peak RSS of the encrypted seed", fmt_mb(first.run.maxrss))

    def fig2_append(self) -> None:
        res, tree, rng = self.res, self.tree, self.rng
        res.add("# 2. 20 sessions each append one ~1 KB line, then one pass")
        chosen = rng.sample(tree.sessions, min(20, len(tree.sessions)))
        changed_size = 0
        appended = 0
        for path, sid, cwd in chosen:
            line = self.corpus.line(rng, sid, cwd)
            changed_size = changed_size + append_line(path, line)
            appended += len(line)
        log(f"fig 2: appended {appended} bytes to {len(chosen)} sessions "
            f"(those files total {fmt_mb(changed_size)})")
        n0, s0 = bucket_stats(self.sw, "syncd", "bench/")  # type: ignore[arg-type]
        env = self.syncd_env(tree.root, "s3://syncd/bench", "main")
        next_seq = self.next_seq(env)
        r = run_measured(self.procs, [self.syncd, "sync"], env, self.logs, "syncd-append")
        n1, s1 = bucket_stats(self.sw, "syncd", "bench/")  # type: ignore[arg-type]
        per = (s1 - s0) / appended
        split = self.segment_split(next_seq)
        log(f"  syncd: +{s1 - s0} bytes, +{n1 - n0} objects in {r.wall:.2f}s; {r.out.strip()}")
        rs = {"per": "", "delta": "", "puts": "", "wall": ""}
        cs = dict(rs)
        if self.peers:
            m0, t0 = bucket_stats(self.sw, "restic")  # type: ignore[arg-type]
            rr = run_measured(self.procs, [self.restic, "backup", "--compression", "auto",
                                           "--host", "bench", "--json", str(tree.root)],
                              self.restic_env(), self.logs, "restic-append")
            m1, t1 = bucket_stats(self.sw, "restic")  # type: ignore[arg-type]
            log(f"  restic: +{t1 - t0} bytes, +{m1 - m0} objects in {rr.wall:.2f}s")
            rs = {"per": f"{(t1 - t0) / appended:.1f}", "delta": f"{t1 - t0} B",
                  "puts": str(m1 - m0), "wall": f"{rr.wall:.2f}"}
            cr, sent = self.rclone_copy("rclone-append")
            log(f"  rclone: sent {sent} bytes in {cr.wall:.2f}s")
            cs = {"per": f"{sent / appended:.1f}", "delta": f"{sent} B (sent)",
                  "puts": f"{len(chosen)} (overwrites)", "wall": f"{cr.wall:.2f}"}
        both = f"{appended} B" if self.peers else ""
        res.add(f"2 appended bytes ({len(chosen)} lines)", f"{appended} B", both, both)
        res.add("2 stored bytes delta", f"{s1 - s0} B", rs["delta"], cs["delta"])
        res.add("2 stored bytes per appended byte", f"{per:.2f}", rs["per"], cs["per"],
                "<= 1.0", per <= 1.0)
        res.add("2 PUTs (new objects) for the flush", str(n1 - n0), rs["puts"], cs["puts"],
                "= 1", n1 - n0 == 1)
        if split:
            res.add("2 segment: header+frames / index+trailer", f"{split[0]} B / {split[1]} B")
        res.add("2 wall time of the pass, s", f"{r.wall:.2f}", rs["wall"], cs["wall"])

    def fig3_latency(self) -> None:
        res, tree, rng, a = self.res, self.tree, self.rng, self.args
        fields = Settings.model_fields
        flush = ", ".join(f"{k.removeprefix('flush_')} {fields[k].default:g} s"
                          for k in fields if k.startswith("flush_"))
        res.add(f"# 3. append -> durable, 10 sessions x 2 lines/s for {a.latency_seconds:.0f} s, "
                f"syncd run, default flush settings ({flush})")
        env = self.syncd_env(tree.root, "s3://syncd/bench", "main")
        next_seq = self.next_seq(env)
        machine = env["SYNCD_MACHINE_ID"]
        err = self.logs / "syncd-run-latency.err"
        notify = self.work / "notify.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(notify))
        try:
            d = self.procs.start([self.syncd, "run"], {**env, "NOTIFY_SOCKET": str(notify)},
                                 self.logs / "syncd-run-latency.out", err)
            how = wait_ready(d, err, sock)
        finally:
            # Closed once ready: later notifications fail fast instead of filling a queue.
            sock.close()
            notify.unlink()
        log(f"fig 3: daemon up (pid {d.pid}, {how}); waiting for seg {next_seq:016x} onwards")
        store = open_store("s3://syncd/bench", endpoint_url=self.sw.endpoint)  # type: ignore[union-attr]
        client = self.sw.client()  # type: ignore[union-attr]

        # Every appended line: (rel path, end offset, append time, durable time).
        lines: list[list[Any]] = []
        lock = threading.Lock()
        writers_done = threading.Event()
        stop = threading.Event()
        chosen = rng.sample(tree.sessions, min(10, len(tree.sessions)))
        per_session = int(a.latency_seconds * 2)
        start_at = time.time() + 0.5

        def writer(k: int, path: Path, sid: str, cwd: str, wrng: random.Random) -> None:
            rel = str(path.relative_to(tree.root))
            phase = wrng.uniform(0, 0.5)
            for i in range(per_session):
                delay = start_at + phase + i * 0.5 - time.time()
                if delay > 0:
                    time.sleep(delay)
                line = self.corpus.line(wrng, sid, cwd)
                end = append_line(path, line)
                t = time.time()
                with lock:
                    lines.append([rel, end, t, None])

        segs: list[tuple[int, float, int]] = []   # (seq, found at, extents)

        def poller() -> None:
            seq = next_seq
            covered: dict[str, int] = {}
            while not stop.is_set():
                key = "bench/" + layout.segment_key(machine, seq)
                try:
                    client.head_object(Bucket="syncd", Key=key)
                except Exception:
                    if writers_done.is_set():
                        with lock:
                            if all(x[3] is not None for x in lines):
                                return
                    time.sleep(0.05)
                    continue
                found = time.time()
                try:
                    ix = Repository(store, machine).read_index(
                        layout.segment_key(machine, seq))
                except Exception as e:
                    log(f"  cannot read segment {seq:016x}: {e}")
                    time.sleep(0.05)
                    continue
                for e in ix.extents:
                    p = e.path.decode()
                    covered[p] = max(covered.get(p, 0), e.end)
                with lock:
                    for x in lines:
                        if x[3] is None and covered.get(x[0], -1) >= x[1]:
                            x[3] = found
                segs.append((seq, found, len(ix.extents)))
                seq += 1

        cpu0, w0 = proc_cpu(d.pid), time.monotonic()
        threads = [threading.Thread(target=writer, args=(k, *s, random.Random(rng.random())))
                   for k, s in enumerate(chosen)]
        pt = threading.Thread(target=poller)
        pt.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        writers_done.set()
        cpu1, w1 = proc_cpu(d.pid), time.monotonic()
        log(f"fig 3: {len(lines)} lines appended; waiting for the last flush ...")
        pt.join(timeout=30)
        stop.set()
        pt.join()
        mem = proc_mem(d.pid)
        stop_process(d)
        lat = [x[3] - x[2] for x in lines if x[3] is not None]
        missing = sum(1 for x in lines if x[3] is None)
        p50, p99, mx = pct(lat, 0.5), pct(lat, 0.99), max(lat) if lat else float("nan")
        log(f"  p50 {p50:.2f}s p99 {p99:.2f}s max {mx:.2f}s over {len(lat)} lines, "
            f"{len(segs)} segments, {missing} not durable")
        res.add("3 latency p50, s", f"{p50:.2f}", target="<= 3", met=p50 <= 3)
        res.add("3 latency p99, s", f"{p99:.2f}", target="<= 11", met=p99 <= 11)
        res.add("3 latency max, s", f"{mx:.2f}")
        res.add("3 lines durable / appended", f"{len(lat)}/{len(lines)}",
                target="all", met=missing == 0)
        gaps = [b[1] - a_[1] for a_, b in itertools.pairwise(segs)]
        res.add("3 segments written (PUTs)", f"{len(segs)} (every {pct(gaps, 0.5):.1f} s)"
                if gaps else str(len(segs)))
        res.add("3 daemon CPU while appending", f"{(cpu1 - cpu0) / (w1 - w0) * 100:.1f} %")
        res.add("3 daemon RSS / peak RSS", f"{fmt_mb(mem['VmRSS'])} / {fmt_mb(mem['VmHWM'])}",
                target="<= 80 MB", met=mem["VmHWM"] <= 80 * MB)

    def fig4_idle(self) -> None:
        res, a = self.res, self.args
        res.add(f"# 4. idle daemon tracking {self.small.files} files "
                f"(CPU over {a.idle_seconds:.0f} s after the seed)")
        self.sw.create_bucket("idle")  # type: ignore[union-attr]
        for kind, store in (("file://", (self.work / "idle-store").as_uri()),
                            ("s3", "s3://idle/bench")):
            name = "idle-file" if kind == "file://" else "idle-s3"
            env = self.syncd_env(self.small.root, store, name)
            log(f"fig 4 [{kind}]: syncd run seeding {self.small.files} files ...")
            t = time.monotonic()
            d = self.procs.start([self.syncd, "run"], env, self.logs / f"{name}.out",
                                 self.logs / f"{name}.err")
            while True:
                time.sleep(0.5)
                if d.poll() is not None:
                    raise RuntimeError(f"syncd run exited: "
                                       f"{(self.logs / f'{name}.err').read_text()[-2000:]}")
                # Read the daemon's state, not the tree: a status scan would open every
                # directory under the daemon's inotify watches.
                if shipped_files(Path(env["SYNCD_STATE_DIR"])) >= self.small.files:
                    break
                if time.monotonic() - t > 600:
                    raise RuntimeError("seed of the small tree did not finish in 600 s")
            seed_s = time.monotonic() - t
            seed_mem = proc_mem(d.pid)
            log(f"  seeded in {seed_s:.1f}s, peak RSS {fmt_mb(seed_mem['VmHWM'])}; idling ...")
            time.sleep(2)
            c0, w0 = proc_cpu(d.pid), time.monotonic()
            time.sleep(a.idle_seconds)
            c1, w1 = proc_cpu(d.pid), time.monotonic()
            mem = proc_mem(d.pid)
            stop_process(d)
            cpu = (c1 - c0) / (w1 - w0) * 100
            log(f"  idle CPU {cpu:.2f} %, RSS {fmt_mb(mem['VmRSS'])}")
            if kind == "s3":
                stored = bucket_stats(self.sw, "idle", "bench/")[1]  # type: ignore[arg-type]
            else:
                stored = sum(f.stat().st_size for f in (self.work / "idle-store").rglob("*")
                             if f.is_file())
            res.add(f"4 [{kind}] seed of the small tree, s", f"{seed_s:.1f}")
            res.add(f"4 [{kind}] small tree ratio tree / stored",
                    f"{self.small.bytes / stored:.2f} ({fmt_mb(stored)})")
            # The daemon ships a start-up backlog in a child process: its peak is the
            # child's, which the daemon logs (its own VmHWM would hide it).
            child = catchup_peak_rss((self.logs / f"{name}.err").read_text(errors="replace"))
            peak = max(mem["VmHWM"], child or 0)
            res.add(f"4 [{kind}] peak RSS during the seed (daemon / catch-up child)",
                    f"{fmt_mb(mem['VmHWM'])} / "
                    f"{'no child' if child is None else fmt_mb(child)}",
                    target="<= 80 MB", met=peak <= 80 * MB)
            res.add(f"4 [{kind}] idle CPU", f"{cpu:.2f} %", target="~0 % (< 0.5)",
                    met=cpu < 0.5)
            res.add(f"4 [{kind}] idle RSS", fmt_mb(mem["VmRSS"]), target="<= 80 MB",
                    met=mem["VmRSS"] <= 80 * MB)


def main() -> int:
    ap = bench_parser(__doc__, 200, "restic/rclone")
    ap.add_argument("--latency-seconds", type=float, default=None)
    ap.add_argument("--idle-seconds", type=float, default=None)
    ap.add_argument("--small-files", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=None,
                    help="seed runs per tool for figure 1 (default 3, quick 1)")
    args = ap.parse_args()
    q = args.quick
    args.size_mb = args.size_mb or (20 if q else 200)
    args.latency_seconds = args.latency_seconds or (15.0 if q else 60.0)
    args.idle_seconds = args.idle_seconds or (5.0 if q else 30.0)
    args.small_files = args.small_files or (1000 if q else 10_000)
    args.repeat = max(1, args.repeat or (1 if q else 3))

    return run_bench("core", args, "syncd-bench-", Bench)


def bench_parser(doc: str, size_default: int, peers: str = "restic") -> argparse.ArgumentParser:
    """The options every bench has."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=None,
                    help=f"main tree size (default {size_default})")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--skip-peers", action="store_true", help=f"syncd only, no {peers}")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where to put trees, servers and state (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--synthetic", action="store_true",
                    help="synthetic lines even when real samples are present")
    ap.add_argument("--seed", type=int, default=1, help="random seed for the trees")
    return ap


def run_bench(name: str, args: argparse.Namespace, prefix: str,
              make: Callable[[argparse.Namespace, Path], Any]) -> int:
    """Make the bench in a fresh work dir, run it, print its table."""
    work = workdir(args, prefix)
    bench = make(args, work)
    if run_in(work, args, bench.run_all, bench.close):
        print(f"syncd {name} benchmark ({'quick' if args.quick else 'full'} run, "
              f"{os.cpu_count()} CPUs)")
        print(bench.res.table())
    return 0


def workdir(args: argparse.Namespace, prefix: str) -> Path:
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=args.workdir))
    log(f"work directory {work}")
    return work


def run_in(work: Path, args: argparse.Namespace, run: Callable[[], None],
           close: Callable[[], None]) -> bool:
    """Run the bench, then stop what it started and remove ``work`` (unless --keep)."""
    try:
        run()
        return True
    finally:
        close()
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

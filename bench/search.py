#!/usr/bin/env python3
"""Search figures (issue 27): indexing speed, index size, query latency over ~2 GB of
generated transcripts; optionally the daemon's idle RSS and CPU before and after.

    .venv/bin/python bench/search.py                  # 2 GB of transcripts
    .venv/bin/python bench/search.py --size-mb 200    # a quicker run
    .venv/bin/python bench/search.py --idle --old /work/old-main   # + the idle daemon

Transcripts are shaped as Claude Code 2.1 writes them (per turn: a prompt, progress
lines, a thinking block with its signature, an answer, tool calls with their results,
file-history snapshots), their words drawn from a Zipf-distributed vocabulary: the
words of ../shared/claude-samples/ when present, then generated ones (50 000 in all).
Indexing is timed in process CPU time (one core: one thread), from the files on disk
through ``Indexer.update_all``. Queries (single words of several frequencies, phrases,
prefixes, AND/OR/NOT) run against the finished index in the same process; each query
of the mix runs ``--repeat`` times, interleaved; the median and p90 of all runs are
printed, and per kind. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from syncd.search.index import FILE_NAME, SearchIndex  # noqa: E402
from syncd.search.indexer import Indexer  # noqa: E402
from syncd.search.query import search  # noqa: E402

SAMPLES = REPO.parent / "shared" / "claude-samples"
VOCAB = 50_000
POOL = 4_000_000  # words drawn once; texts are windows of it at random offsets
_WORD = re.compile(r"[A-Za-z][a-z]{2,14}")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def vocabulary(rng: random.Random) -> list[str]:
    words: dict[str, int] = defaultdict(int)
    for f in SAMPLES.rglob("*.jsonl") if SAMPLES.exists() else []:
        for w in _WORD.findall(f.read_text(errors="replace")):
            words[w.lower()] += 1
    ranked = sorted(words, key=lambda w: -words[w])[:VOCAB // 2]
    syll = ["ka", "lo", "mi", "ter", "ven", "sol", "ra", "qui", "do", "ne", "bra", "sto",
            "fen", "lu", "gar", "pi", "tho", "zen", "cor", "mu"]
    seen = set(ranked)
    while len(ranked) < VOCAB:
        w = "".join(rng.choice(syll) for _ in range(rng.randint(2, 4)))
        if w not in seen:
            seen.add(w)
            ranked.append(w)
    return ranked


class Words:
    def __init__(self, rng: random.Random, vocab: list[str]) -> None:
        weights = [1.0 / (r + 1) ** 1.07 for r in range(len(vocab))]
        self.vocab = vocab
        self.pool = rng.choices(vocab, weights=weights, k=POOL)
        self.rng = rng

    def text(self, n: int) -> str:
        i = self.rng.randrange(0, POOL - n)
        return " ".join(self.pool[i:i + n])


def _meta(sid: str, cwd: str, ts: float, kind: str, parent: str | None) -> dict[str, object]:
    return {"parentUuid": parent, "isSidechain": False, "userType": "external", "cwd": cwd,
            "sessionId": sid, "version": "2.1.332", "gitBranch": "main", "type": kind,
            "uuid": str(uuid.uuid4()),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))}


def _dump(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def session_bytes(w: Words, sid: str, cwd: str, target: int, t0: float) -> bytes:
    out: list[bytes] = []
    size = 0
    ts = t0
    parent = None
    rng = w.rng
    while size < target:
        ts += rng.uniform(5, 120)
        u = _meta(sid, cwd, ts, "user", parent)
        u["message"] = {"role": "user", "content": w.text(rng.randint(8, 150))}
        lines = [_dump(u)]
        a = _meta(sid, cwd, ts, "assistant", parent)
        a["message"] = {"model": "claude-opus-4-5", "id": "msg_x", "role": "assistant",
                        "content": [{"type": "thinking", "thinking": w.text(rng.randint(30, 200)),
                                     "signature": os.urandom(300).hex()}],
                        "usage": {"input_tokens": 10, "output_tokens": 300}}
        lines.append(_dump(a))
        for _ in range(rng.randint(1, 4)):
            t = _meta(sid, cwd, ts, "assistant", parent)
            tool = rng.choice(["Bash", "Read", "Edit", "Grep"])
            inp = {"Bash": {"command": w.text(6), "description": w.text(5)},
                   "Read": {"file_path": f"{cwd}/src/{w.text(1)}.py"},
                   "Edit": {"file_path": f"{cwd}/src/{w.text(1)}.py",
                            "old_string": w.text(rng.randint(5, 40)),
                            "new_string": w.text(rng.randint(5, 40))},
                   "Grep": {"pattern": w.text(2), "path": cwd}}[tool]
            t["message"] = {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_x", "name": tool, "input": inp}]}
            lines.append(_dump(t))
            # Agent and hook progress, a few per call: what they embed is not searched.
            for _ in range(rng.randint(1, 4)):
                p = _meta(sid, cwd, ts, "progress", parent)
                p["data"] = {"type": "agent_progress", "message": {
                    "type": "assistant", "message": {"content": [
                        {"type": "text", "text": w.text(rng.randint(40, 200))}]}}}
                lines.append(_dump(p))
            r = _meta(sid, cwd, ts, "user", parent)
            result = w.text(rng.randint(20, 1300))
            r["message"] = {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_x", "content": result}]}
            # As the CLI keeps it: the result again, for its own display.
            r["toolUseResult"] = {"stdout": result, "stderr": "", "interrupted": False}
            lines.append(_dump(r))
        a = _meta(sid, cwd, ts, "assistant", parent)
        a["message"] = {"role": "assistant", "content": [
            {"type": "text", "text": w.text(rng.randint(10, 90))}]}
        lines.append(_dump(a))
        if rng.random() < 0.3:
            lines.append(_dump({"type": "file-history-snapshot", "messageId": "m",
                                "snapshot": {"trackedFileBackups": {
                                    f"{cwd}/{w.text(1)}": {"backupFileName": "x@v2",
                                                           "version": 2}}}}))
        parent = str(u["uuid"])
        out.extend(lines)
        size += sum(map(len, lines))
    return b"".join(out)


def generate(root: Path, size_mb: int, seed: int) -> tuple[int, Words]:
    rng = random.Random(seed)
    w = Words(rng, vocabulary(rng))
    total = 0
    n = 0
    t0 = 1.79e9
    while total < size_mb << 20:
        cwd = f"/home/dev/code/{w.vocab[rng.randrange(200, 2000)]}"
        folder = cwd.replace("/", "-")
        target = int(min(20 << 20, rng.lognormvariate(13.3, 1.0)))  # median ~600 kB
        sid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        data = session_bytes(w, sid, cwd, target, t0 + n * 600)
        path = root / "projects" / folder / f"{sid}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        total += len(data)
        n += 1
        if n % 200 == 0:
            log(f"  generated {total >> 20} MB, {n} sessions")
    return total, w


def text_share(root: Path, limit: int = 20) -> float:
    """The share of a few files' bytes that is searched text (the samples': ~8.5 %)."""
    from syncd.search import extract

    got = seen = 0
    for f in sorted(root.rglob("*.jsonl"))[:limit]:
        data = f.read_bytes()
        seen += len(data)
        got += sum(len(r.body) + len(r.tools) + len(r.output) for r in extract.rows(data))
    return got / max(1, seen)


def queries(w: Words, rng: random.Random) -> list[tuple[str, str]]:
    v = w.vocab
    out: list[tuple[str, str]] = []
    for _ in range(20):
        out.append(("word, rank 100-1000", v[rng.randrange(100, 1000)]))
        out.append(("word, rank 1000-20000", v[rng.randrange(1000, 20000)]))
        out.append(("word, rank 10-100", v[rng.randrange(10, 100)]))
        a = w.text(2)
        out.append(("phrase", json.dumps(a)))
        out.append(("prefix", v[rng.randrange(50, 5000)][:4] + "*"))
        out.append(("a AND b", f"{v[rng.randrange(50, 3000)]} AND {v[rng.randrange(50, 3000)]}"))
        out.append(("a OR b", f"{v[rng.randrange(500, 5000)]} OR {v[rng.randrange(500, 5000)]}"))
        out.append(("a NOT b", f"{v[rng.randrange(100, 3000)]} NOT {v[rng.randrange(10, 300)]}"))
    return out


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def idle_daemon(pythonpath: Path, work: Path, seconds: float,
                extra_env: dict[str, str] | None = None) -> tuple[float, float]:
    """RSS (MB) and CPU (% of a core) of `syncd run` idle over ``seconds``, after its
    start-up settled, on a small tree."""
    src = work / f"idle-src-{pythonpath.name}"
    shutil.rmtree(src, ignore_errors=True)
    for i in range(20):
        p = src / "projects" / "-home-dev-x" / f"{uuid.UUID(int=i + 1, version=4)}.jsonl"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_dump({"type": "user", "cwd": "/home/dev/x", "timestamp":
                             "2026-11-30T10:00:00.000Z", "message": {"content": f"hello {i}"}})
                      * 200)
    state = work / f"idle-state-{pythonpath.name}"
    shutil.rmtree(state, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")}
    env.update(PYTHONPATH=str(pythonpath), SYNCD_SOURCE=str(src), SYNCD_STATE_DIR=str(state),
               SYNCD_STORE=(work / f"idle-store-{pythonpath.name}").as_uri(),
               SYNCD_MACHINE_ID="idle", SYNCD_CONFIG=os.devnull, HOME=str(work))
    env.update(extra_env or {})
    proc = subprocess.Popen([sys.executable, "-m", "syncd", "run"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(15)  # start-up and its first pass done (a settle time, not a measure)
        stat = Path(f"/proc/{proc.pid}/stat")

        def cpu() -> float:
            f = stat.read_text().rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

        c0 = cpu()
        time.sleep(seconds)
        used = cpu() - c0
        rss = next(int(x.split()[1]) for x in Path(f"/proc/{proc.pid}/status").read_text()
                   .splitlines() if x.startswith("VmRSS:")) / 1024
        return rss, 100 * used / seconds
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--index-runs", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--idle", action="store_true", help="also the idle daemon, before/after")
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--old", type=Path, default=Path("/work/old-main"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="search-bench-", dir=args.workdir))
    try:
        root = work / "claude"
        log(f"generating {args.size_mb} MB of transcripts in {root}")
        total, words = generate(root, args.size_mb, args.seed)
        share = text_share(root)
        log(f"indexing {total >> 20} MB")
        rates: list[tuple[float, float]] = []
        for run in range(args.index_runs):  # each into a fresh index
            shutil.rmtree(work / "state", ignore_errors=True)
            ix = SearchIndex.open(work / "state" / FILE_NAME)
            c0, t0 = time.process_time(), time.perf_counter()
            done = Indexer(ix, root, "bench").update_all()
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            rates.append((total / cpu / 1e6, total / wall / 1e6))
            log(f"  index run {run + 1}: {rates[-1][0]:.1f} MB/s CPU")
            ix.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            ix.close()
        db = work / "state" / FILE_NAME
        size = db.stat().st_size
        ix = SearchIndex.open(db)
        parts = dict(ix.db.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
        texts = sum(parts.get(n, 0) for n in ("docs",))
        fts = sum(v for n, v in parts.items() if n.startswith("text_"))
        rng = random.Random(args.seed + 1)
        mix = queries(words, rng)
        times: dict[str, list[float]] = defaultdict(list)
        for q in mix[:8]:  # warm the page cache as a running machine has it
            search(ix, q[1])
        hits_of: dict[str, int] = {}
        for _ in range(args.repeat):
            for kind, q in mix:
                t = time.perf_counter()
                hits = search(ix, q)
                times[kind].append(time.perf_counter() - t)
                hits_of[q] = len(hits)
        rows = ix.db.execute("SELECT count(*) FROM docs").fetchone()[0]
        ix.close()
        every = [x for xs in times.values() for x in xs]
        load = os.getloadavg()
        print(f"transcripts: {total / 1e6:.0f} MB in {done.files} files; {rows} rows; "
              f"searched text {100 * share:.1f} % of their bytes")
        cpus = sorted(r[0] for r in rates)
        print(f"indexing: {statistics.median(cpus):.1f} MB/s CPU (one core; "
              f"{cpus[0]:.1f}-{cpus[-1]:.1f} over {len(cpus)} runs), "
              f"{statistics.median(r[1] for r in rates):.1f} MB/s wall")
        print(f"index: {size / 1e6:.0f} MB = {100 * size / total:.1f} % of the transcripts "
              f"(FTS5 lists {fts / 1e6:.0f} MB, stored text {texts / 1e6:.0f} MB)")
        print(f"queries ({len(mix)} x {args.repeat}): median "
              f"{1000 * statistics.median(every):.1f} ms, p90 {1000 * pct(every, 0.9):.1f} ms, "
              f"max {1000 * max(every):.1f} ms")
        for kind, xs in times.items():
            print(f"  {kind:24} median {1000 * statistics.median(xs):7.1f} ms  p90 "
                  f"{1000 * pct(xs, 0.9):7.1f} ms")
        print(f"load average during the run: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
        if args.idle:
            res = defaultdict(list)
            for _ in range(2):  # interleaved: before, after, before, after
                for name, path in (("before", args.old), ("after", REPO)):
                    res[name].append(idle_daemon(path, work, args.idle_seconds))
            for name, xs in res.items():
                print(f"idle daemon {name}: RSS {statistics.median(x[0] for x in xs):.1f} MB "
                      f"({', '.join(f'{x[0]:.1f}' for x in xs)}), CPU "
                      f"{statistics.median(x[1] for x in xs):.2f} % "
                      f"({', '.join(f'{x[1]:.2f}' for x in xs)})")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"kept {work}")


if __name__ == "__main__":
    main()

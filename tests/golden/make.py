"""Build the golden stores: small stores written by this version's code, committed as
fixtures that every later reader must restore byte for byte (tests/test_golden.py).

docs/FORMAT.md promises that a newer reader reads every older store. These stores are
the evidence: each is written once, by the code of its format version, and never
rewritten afterwards. Run this script by hand, and only when a new format version (or
a new kind of object or index entry) is introduced: add the new store to ``STORES`` in
tests/test_golden.py and build just that one (``--only NAME``). A store that exists is
never replaced (``--force`` is for a build that went wrong before it was ever committed).

    .venv/bin/python -m tests.golden.make [--only v1-plain] [--force]

What it writes, under tests/golden/:

- ``<store>/``: a ``file://`` store of machine ``golden-laptop``, written through the
  project's own shipper, compaction and dictionary training, with a clock of its own so
  that every segment, manifest and tombstone time is fixed. The history (``step``):
  flushes 0-2 (new files, appends, a truncate-and-rewrite, a deletion), compaction,
  dictionary training, flushes 3-4 (small frames with the dictionary, a torn line, a
  second rewrite), compaction, flushes 5-6 (the dictionary again, a new session, a
  deleted transcript). The tree is synthetic (a seeded generator), never a real one.
  Each store compacts as the code of its time did (``STORIES``): v1-plain and
  v2-encrypted wrote a manifest at every compaction; v1-deltas, written after deltas
  came, writes a manifest, then a delta of segments 3-4, then (after flush 6, with a
  chain of one delta allowed) a manifest of seq 6 that carries its own points.
  v1-copies, written after copies came, plays ``step_copies``: the same flushes with a
  cut of the subagent transcript in flush 5, and flushes 7-10 (a cut, a rename over a
  file, a cut alone, a session moved to another project folder); a manifest, a delta of
  segments 3-5 that carries the cut's copy, a manifest of seq 7 with parts of the delta's
  frames, and segments 8-10.
- ``expected/<store>/<point>.json``: for each point in time the test restores, every
  file of the restored tree (path, or ``path_b64`` for a name that is not UTF-8; sha256;
  size) and every session with its title. Worked out from the source tree as it was
  after each flush (a restore brings deleted files back), not from the store; the
  script then restores each point with today's reader and refuses to finish unless it
  matches.

The trees hold paths under ``/home/golden`` (machine.json's ``home``); the test maps
that home to itself, so a restore is byte-exact on any machine.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime as dt
import hashlib
import json
import os
import platform
import random
import shutil
import socket
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncd.archive.compact import CompactOptions, compact
from syncd.archive.options import ensure_dictionary
from syncd.archive.verify import verify
from syncd.backup.scan import scan
from syncd.backup.ship import Shipper, ship_with_restart
from syncd.backup.state import State
from syncd.claude import Selection, project_folder
from syncd.config import Settings, load_settings
from syncd.repository import Repository
from syncd.restore.listing import load_all, sessions_table
from syncd.restore.restorer import RestoreOptions, restore
from syncd.security.crypto import Crypto
from syncd.security.keys import init_encryption
from syncd.store import LocalStore, Store
from tests.readers import read_index
from tests.test_golden import (
    CHEAP_SCRYPT_N,
    COPY_KINDS,
    GOLDEN,
    HOME,
    MACHINE,
    OBJECTS,
    PASSPHRASE,
    POINTS,
    STEP,
    STORES,
    T0,
    Point,
    copy_kinds,
    open_golden,
    restored_files,
    session_titles,
)

APP = f"{HOME}/code/app"
LIB = f"{HOME}/code/lib"


def folder(cwd: str) -> str:
    return f"projects/{project_folder(cwd)}"


# -- a synthetic Claude tree ----------------------------------------------------------------

WORDS = ("build", "test", "fixture", "parser", "segment", "frame", "index", "module",
         "import", "restore", "snapshot", "manifest", "retry", "timeout", "lease", "queue",
         "worker", "config", "schema", "migration", "flaky", "cache", "token", "branch",
         "commit", "review", "loader", "handler", "session", "request", "response", "error",
         "warning", "docstring", "type", "annotation", "coverage", "benchmark", "latency",
         "memory", "thread", "lock", "signal", "daemon", "socket", "payload", "checksum",
         "offset", "header", "trailer", "café", "naïve", "→", "✓", "日本語")
TOOLS = (("Bash", "command"), ("Read", "file_path"), ("Grep", "pattern"), ("Edit", "file_path"))
FILES = ("src/app/loader.py", "src/app/cache.py", "tests/test_loader.py", "pyproject.toml",
         "src/app/cli.py", "README.md", "src/lib/parse.py", "tests/conftest.py")


class Session:
    """Transcript lines of one session, shaped like Claude Code's (compact JSON, one entry
    per line, a uuid chain), from a seeded generator."""

    def __init__(self, rng: random.Random, cwd: str, branch: str, start: float) -> None:
        self.rng = rng
        self.id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        self.cwd = cwd
        self.branch = branch
        self.clock = start
        self.parent: str | None = None
        self.prompts: list[str] = []
        self.path = f"{folder(cwd)}/{self.id}.jsonl"

    def words(self, n: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    def _entry(self, kind: str, message: dict[str, Any], **extra: Any) -> bytes:
        self.clock += self.rng.uniform(0.5, 4.0)
        me = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        doc: dict[str, Any] = {
            "parentUuid": self.parent, "isSidechain": False, "userType": "external",
            "cwd": self.cwd, "sessionId": self.id, "version": "2.1.5",
            "gitBranch": self.branch, "type": kind, "message": message, "uuid": me,
            "timestamp": _iso(self.clock), **extra}
        self.parent = me
        return _jsonl(doc)

    def prompt(self, text: str | None = None) -> bytes:
        text = text or f"please look at the {self.words(2)} and fix the {self.words(3)}"
        self.prompts.append(text)
        return self._entry("user", {"role": "user", "content": text})

    def reply(self) -> bytes:
        text = f"I checked the {self.words(4)}. " + ". ".join(
            self.words(self.rng.randint(5, 14)) for _ in range(self.rng.randint(1, 3))) + "."
        return self._entry("assistant", {
            "id": f"msg_{self.rng.getrandbits(64):016x}", "type": "message",
            "role": "assistant", "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "usage": {"input_tokens": self.rng.randint(10, 9000),
                      "output_tokens": self.rng.randint(10, 900)}})

    def tool(self, result: str | None = None) -> bytes:
        name, arg = self.rng.choice(TOOLS)
        value = (f"pytest -q {self.rng.choice(FILES)}" if name == "Bash"
                 else f"{self.cwd}/{self.rng.choice(FILES)}")
        tid = f"toolu_{self.rng.getrandbits(80):020x}"
        use = self._entry("assistant", {
            "id": f"msg_{self.rng.getrandbits(64):016x}", "type": "message",
            "role": "assistant", "model": "claude-sonnet-4-5",
            "content": [{"type": "tool_use", "id": tid, "name": name, "input": {arg: value}}],
            "stop_reason": "tool_use"})
        out = result or "\n".join(f"{i:3d}  {self.words(self.rng.randint(3, 9))}"
                                  for i in range(self.rng.randint(1, 4)))
        got = self._entry("user", {"role": "user", "content": [
            {"tool_use_id": tid, "type": "tool_result", "content": out, "is_error": False}]},
            toolUseResult={"stdout": out[:80], "stderr": "", "interrupted": False})
        return use + got

    def turns(self, n: int) -> bytes:
        """About ``n`` lines: prompts, replies and tool calls."""
        out: list[bytes] = []
        while sum(b.count(b"\n") for b in out) < n:
            r = self.rng.random()
            out.append(self.prompt() if r < 0.15 else self.tool() if r < 0.55 else self.reply())
        return b"".join(out)

    def special(self, kind: str, **fields: str) -> bytes:
        return _jsonl({"type": kind, **fields, "sessionId": self.id})

    def history(self) -> bytes:
        """history.jsonl lines for the prompts made since the last call."""
        out = b"".join(_jsonl({"display": p, "pastedContents": {},
                               "timestamp": int(self.clock * 1000), "project": self.cwd,
                               "sessionId": self.id}) for p in self.prompts)
        self.prompts = []
        return out


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.") + \
        f"{int(t * 1000) % 1000:03d}Z"


def _jsonl(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


@dataclass
class Tree:
    root: Path
    rng: random.Random = field(default_factory=lambda: random.Random("syncd golden tree"))
    torn: bytes = b""  # the end of a line written by the next flush
    moved: set[bytes] = field(default_factory=set)  # files moved to another folder

    def __post_init__(self) -> None:
        self.a = Session(self.rng, APP, "main", T0 - 3000)
        self.b = Session(self.rng, LIB, "feature/parser", T0 - 2400)
        self.c = Session(self.rng, APP, "main", T0 + 300)
        self.d = Session(self.rng, LIB, "feature/parser", T0 + 5 * STEP - 300)
        self.agent = f"{folder(APP)}/{self.a.id}/subagents/agent-a7f3c2e.jsonl"
        self.result = f"{folder(APP)}/{self.a.id}/tool-results/toolu_01GoldenPytestLog.txt"
        self.todos = f"todos/{self.a.id}-agent-{self.a.id}.json"
        self.fh = f"file-history/{self.a.id}/3f9a1c0d2b7e4a65"

    def write(self, rel: str | bytes, data: bytes, mode: str = "ab") -> None:
        path = os.path.join(os.fsencode(self.root), os.fsencode(rel))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, mode) as f:
            f.write(data)

    def remove(self, rel: str) -> None:
        os.unlink(os.path.join(os.fsencode(self.root), os.fsencode(rel)))

    def history(self, *sessions: Session) -> None:
        self.write("history.jsonl", b"".join(s.history() for s in sessions))

    def todo_list(self, n: int) -> bytes:
        items = [{"content": f"fix the {self.a.words(3)}", "status": s, "activeForm": "Fixing"}
                 for s in (["completed"] * (n - 2) + ["in_progress", "pending"])[:n]]
        return json.dumps(items, indent=2).encode()

    def agent_lines(self, n: int) -> bytes:
        lines = self.a.turns(n).replace(b'"isSidechain":false', b'"isSidechain":true')
        return lines.replace(b'"type":"user"', b'"agentId":"a7f3c2e","type":"user"')


def step(t: Tree, k: int) -> None:
    """What changes in the tree before flush ``k``."""
    a, b, c, d = t.a, t.b, t.c, t.d
    if k == 0:  # the seed: enough transcript lines to train a dictionary on
        log = "\n".join(f"tests/test_loader.py::test_{a.words(1)}_{i} PASSED" for i in
                        range(60)) + "\n60 passed in 3.21s\n"
        t.write(a.path, a.prompt("the build fails on the second run of the fixture loader; "
                                 "find out why") + a.turns(330) + a.tool(
            f"<persisted-output>{HOME}/.claude/{t.result}</persisted-output>") + a.turns(330))
        t.write(b.path, b.prompt("add a streaming mode to the parser") + b.turns(520))
        t.write(t.agent, t.agent_lines(24))
        t.write(t.result, log.encode())
        t.write(t.todos, t.todo_list(9), "wb")
        t.write(t.fh + "@v1", b"".join(f"def load_{i}(path):\n    return open(path).read()\n"
                                      .encode() for i in range(40)))
        t.write(t.fh + "@v2", b"".join(f"def load_{i}(path: str) -> str:\n    with open(path)"
                                      f" as f:\n        return f.read()\n".encode()
                                      for i in range(40)))
        t.write("plans/empty-draft.md", b"")
        t.write(b"paste-cache/r\xe9sum\xe9-latin1.txt", "pasted in Latin-1: résumé, naïve\n"
                .encode("latin-1"))
        t.history(a, b)
    elif k == 1:
        t.write(a.path, a.turns(20))
        t.write(b.path, b.special("ai-title", aiTitle="Streaming mode for the parser")
                + b.turns(10))
        t.write(c.path, c.prompt("why is the cache warm only after a restart?") + c.turns(28)
                + c.special("summary", summary="Cache warm-up after restart", leafUuid=c.id))
        t.history(a, b, c)
    elif k == 2:  # a truncate-and-rewrite (new generation) and a deletion (tombstone)
        t.write(t.todos, t.todo_list(4), "wb")
        t.remove(t.fh + "@v1")
        t.write(a.path, a.turns(10))
        t.history(a)
    elif k == 3:  # small appends: frames with the dictionary; a line torn mid-way
        t.write(a.path, a.special("custom-title", customTitle="Golden store: flaky loader")
                + a.prompt() + a.turns(6))
        t.write(t.agent, t.agent_lines(5))
        line = b.turns(6) + b.reply()
        t.write(b.path, line[: len(line) - 40])
        t.torn = line[len(line) - 40:]
        t.history(a, b)
    elif k == 4:  # the torn line completed; the todo list rewritten again
        t.write(b.path, t.torn + b.turns(4))
        t.write(t.todos, t.todo_list(3), "wb")
        t.write(c.path, c.turns(5))
        t.write(f"{folder(APP)}/{a.id}/tool-results/toolu_02GoldenGrepHits.txt",
                b"src/app/loader.py:12: cache = {}\nsrc/app/cache.py:40: cache.clear()\n")
        t.history(b, c)
    elif k == 5:
        t.write(d.path, d.prompt("benchmark the parser on a 2 GB log") + d.turns(12))
        t.write(a.path, a.turns(6))
        t.history(a, d)
    elif k == 6:  # a transcript deleted after the last compaction: a tombstone in a segment
        t.remove(c.path)
        t.write(d.path, d.turns(4) + d.special("last-prompt", lastPrompt="now with 8 threads"))
        t.write(t.fh + "@v3", b"def load(path: str) -> str:\n    return Path(path).read_text()\n")
        t.history(d)


APP2 = f"{HOME}/code/loader"  # where session a is moved (Claude's /cd) in v1-copies


def cut_tail(t: Tree, rel: str, lines: int, new: bytes = b"") -> None:
    """Claude withdrawing streamed rows: the file cut before its last ``lines`` lines (at a
    line end) and ``new`` written in their place, in place (same inode)."""
    path = os.path.join(os.fsencode(t.root), os.fsencode(rel))
    with open(path, "rb") as f:
        data = f.read()
    at = len(data) - sum(len(line) for line in data.splitlines(keepends=True)[-lines:])
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(new)
        f.truncate(at + len(new))


def move_session(t: Tree, s: Session, cwd: str) -> None:
    """Claude's ``/cd``: the transcript and the session's folder (subagents, tool results)
    go to the new cwd's project folder, and a relocated record is appended."""
    root = os.fsencode(t.root)
    old, old_dir = s.path, s.path[: -len(".jsonl")]
    s.cwd, s.path = cwd, f"{folder(cwd)}/{s.id}.jsonl"
    new_dir = s.path[: -len(".jsonl")]
    t.moved |= {old.encode()} | {rel for rel in tree_files(t.root)
                                 if rel.startswith(f"{old_dir}/".encode())}
    os.makedirs(os.path.join(root, os.fsencode(folder(cwd))))
    os.rename(os.path.join(root, os.fsencode(old)), os.path.join(root, os.fsencode(s.path)))
    os.rename(os.path.join(root, os.fsencode(old_dir)), os.path.join(root, os.fsencode(new_dir)))
    t.agent = new_dir + t.agent[len(old_dir):]
    t.result = new_dir + t.result[len(old_dir):]
    t.write(s.path, s.special("relocated", relocatedCwd=cwd))


def step_copies(t: Tree, k: int) -> None:
    """v1-copies: ``step``'s story with cuts, a rename over a file and a move, which the
    shipper writes as copies (docs/FORMAT.md, "Copies"), and four flushes more. The first
    cut is of the subagent transcript (small: a manifest that rewrites the packs its copy
    reads stores those bytes again), the second of a transcript the manifest holds."""
    a, b, d = t.a, t.b, t.d
    if k == 5:  # a cut (a withdrawn row written again in place): a copy, then new bytes
        cut_tail(t, t.agent, 1, t.agent_lines(1))
        step(t, k)
    elif k < 7:
        step(t, k)
    elif k == 7:
        t.write(b.path, b.turns(3))
        t.history(b)
    elif k == 8:  # a cut with new bytes; a file renamed over the one it continues
        cut_tail(t, a.path, 2, a.turns(3))
        tmp = f"{d.path}.compact.tmp.5e1f"
        with open(os.path.join(os.fsencode(t.root), os.fsencode(d.path)), "rb") as f:
            t.write(tmp, f.read() + d.turns(2), "wb")
        os.rename(os.path.join(os.fsencode(t.root), os.fsencode(tmp)),
                  os.path.join(os.fsencode(t.root), os.fsencode(d.path)))
        t.history(a, d)
    elif k == 9:  # a cut with nothing after it: a copy alone
        cut_tail(t, t.agent, 2)
        t.write(b.path, b.turns(2))
        t.history(b)
    elif k == 10:  # the session moved to another project folder
        move_session(t, a, APP2)


STEPS: dict[str, Callable[[Tree, int], None]] = {"v1-copies": step_copies}
FLUSHES = {"v1-copies": 11}  # how many flushes a story has (7 when not named)


@dataclass(frozen=True)
class Compaction:
    after: int               # the flush it follows (the first one also trains the dictionary)
    options: CompactOptions  # ``now`` is set to half a step after that flush
    writes: str              # what it must write: "snapshot" (a manifest) or "delta"


# Before deltas, every compaction wrote a manifest: what max_chain=0 does today.
MANIFEST_EVERY_TIME = CompactOptions(max_chain=0)
OLD_STORY = (Compaction(2, MANIFEST_EVERY_TIME, "snapshot"),
             Compaction(4, MANIFEST_EVERY_TIME, "snapshot"))
STORIES = {
    "v1-plain": OLD_STORY,
    "v2-encrypted": OLD_STORY,
    # Today's defaults: the first compaction writes a manifest (there is none yet), the
    # second a delta of segments 3-4; after flush 6 a chain of one delta is enough, so a
    # manifest of seq 6 folds the delta and segments 5-6 and keeps their points as its own.
    "v1-deltas": (Compaction(2, CompactOptions(), "snapshot"),
                  Compaction(4, CompactOptions(), "delta"),
                  Compaction(6, CompactOptions(max_chain=1), "snapshot")),
    # Written after copies came: a manifest of seq 2, a delta of segments 3-5 (with the
    # cut of flush 5), a manifest of seq 7 on it (the cut generation's bytes partly parts
    # of the delta's frames), then segments 8-10 (cuts, a rename over a file, a move).
    "v1-copies": (Compaction(2, CompactOptions(), "snapshot"),
                  Compaction(5, CompactOptions(), "delta"),
                  Compaction(7, CompactOptions(max_chain=1), "snapshot")),
}


# -- writing the store with the project's code ------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def tree_files(root: Path) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    base = os.fsencode(root)
    for dirpath, _dirs, names in os.walk(base):
        for name in names:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, base)] = f.read()
    return out


@dataclass
class Built:
    states: list[dict[bytes, bytes]]             # the source tree after each flush
    sessions: list[dict[str, dict[str, Any]]]    # per flush: what `sessions` should list
    # Per flush: the files moved to another project folder by then (a restore does not
    # bring them back beside the session, in its old folder).
    moved: list[set[bytes]] = field(default_factory=list)


def build(work: Path, name: str) -> tuple[Path, Built]:
    """Play store ``name``'s story into a new store under ``work``; the store's directory
    and what the story did."""
    encrypted, story = STORES[name], {c.after: c for c in STORIES[name]}
    src, store_dir = work / "src" / ".claude", work / "store"
    src.mkdir(parents=True)
    s: Settings = load_settings(config_file=work / "none.toml", source=src,
                                store=store_dir.as_uri(), state_dir=work / "state",
                                machine_id=MACHINE)
    store = LocalStore(store_dir)
    crypto: Crypto | None = None
    if encrypted:
        crypto = init_encryption(store, PASSPHRASE, n=CHEAP_SCRYPT_N)
    clock = Clock()
    sh = Shipper(root=src, repo=Repository(store, MACHINE, crypto), state=State(s.state_file),
                 selection=Selection(), level=s.zstd_level, clock=clock)
    t = Tree(src)
    built = Built([], [])
    titles: dict[str, str] = {}
    # A session's project is the first cwd its lines name (a move keeps it).
    projects = {x.id: x.cwd for x in (t.a, t.b, t.c, t.d)}
    for k in range(FLUSHES.get(name, 7)):
        clock.t = T0 + k * STEP
        STEPS.get(name, step)(t, k)
        flush(sh, src, k)
        state = tree_files(src)
        built.states.append(state)
        built.moved.append(set(t.moved))
        titles.update(_titles(t, k))
        built.sessions.append({
            sid: {"title": title, "project": projects[sid],
                  "deleted": next(x.path for x in (t.a, t.b, t.c, t.d) if x.id == sid).encode()
                  not in state}
            for sid, title in titles.items()})
        if (c := story.get(k)) is not None:
            repo = Repository(store, MACHINE, crypto)
            rep = compact(repo, dataclasses.replace(c.options, now=clock.t + STEP / 2))
            got = "snapshot" if rep.snapshot else "delta" if rep.delta else None
            if rep.errors or got != c.writes:
                raise SystemExit(f"compaction after flush {k} wrote {got} (wanted "
                                 f"{c.writes}): {rep.errors or rep.note}")
            note = ensure_dictionary(s, repo, now=clock.t + STEP / 2)
            if k == min(story) and "adopted" not in note:
                raise SystemExit(f"no dictionary: {note}")
    sh.state.close()
    check_store(store, crypto, OBJECTS[name])
    if copy_kinds(store, crypto) != COPY_KINDS.get(name, set()):
        raise SystemExit(f"copies: {copy_kinds(store, crypto)}, wanted {COPY_KINDS.get(name)}")
    return store_dir, built


def flush(sh: Shipper, src: Path, k: int) -> None:
    found = scan(os.fsencode(src), sh.selection, sh.state)
    result = ship_with_restart(sh, found.dirty)
    if found.problems or result.problems or result.requeue or result.segments != [k]:
        raise SystemExit(f"flush {k}: segments {result.segments}, problems "
                         f"{found.problems or result.problems}, changed {result.requeue}")


def _titles(t: Tree, k: int) -> dict[str, str]:
    """The sessions whose title flush ``k`` sets (custom > AI > last prompt > summary >
    first prompt), and that title."""
    changes = {
        0: {t.a.id: "the build fails on the second run of the fixture loader; find out why",
            t.b.id: "add a streaming mode to the parser"},
        1: {t.b.id: "Streaming mode for the parser", t.c.id: "Cache warm-up after restart"},
        3: {t.a.id: "Golden store: flaky loader"},
        5: {t.d.id: "benchmark the parser on a 2 GB log"},
        6: {t.d.id: "now with 8 threads"}}
    return changes.get(k, {})


def check_store(store: Store, crypto: Crypto | None, objects: dict[str, int]) -> None:
    """What the store must hold for the fixture to be worth anything: ``objects`` (how many
    manifests, deltas and segments), packs and one dictionary, which every segment and
    delta uses."""
    keys = [o.key for o in store.list("")]
    prefix = f"machines/{MACHINE}/"
    kinds = {kind: [k for k in keys if k.startswith(prefix + kind + "/")]
             for kind in ("seg", "pack", "snap", "delta", "dict")}
    if not (all(len(kinds[kind]) == n for kind, n in objects.items()) and kinds["pack"]
            and len(kinds["dict"]) == 1):
        raise SystemExit(f"unexpected objects: {kinds}")
    dict_id = kinds["dict"][0].rsplit("/", 1)[1]
    for k in kinds["seg"] + kinds["delta"]:
        if dict_id not in {e.dict_id for e in read_index(store, k, crypto=crypto).extents}:
            raise SystemExit(f"{k} does not use the dictionary")
    if [k for k in keys if "/.tmp-" in k or "/.lock-" in k]:
        raise SystemExit(f"leftovers in the store: {keys}")
    rep = verify(Repository(store, MACHINE, crypto), read_data=100.0)
    if not rep.ok:
        raise SystemExit(f"verify: {rep.problems}")


# -- expected trees ---------------------------------------------------------------------------

def expected(built: Built, point: Point) -> dict[bytes, bytes]:
    """The tree a restore as of ``point`` gives back: every file the flushes up to it
    shipped, in its last shipped form (a restore brings deleted files back, but not those
    moved to another project folder)."""
    out: dict[bytes, bytes] = {}
    for state in built.states[: point.flush + 1]:
        out.update(state)
    for path in built.moved[point.flush] - set(built.states[point.flush]):
        del out[path]
    return out


def describe(files: dict[bytes, bytes]) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(files):
        try:
            name: dict[str, Any] = {"path": path.decode("utf-8")}
        except UnicodeDecodeError:
            name = {"path_b64": base64.b64encode(path).decode()}
        rows.append({**name, "sha256": hashlib.sha256(files[path]).hexdigest(),
                     "size": len(files[path])})
    return rows


def check_restores(dest: Path, name: str, built: Built, work: Path) -> None:
    """Today's reader gives back exactly the expected tree and sessions at every point."""
    for point in POINTS[name]:
        store, crypto = open_golden(dest, STORES[name])
        out = work / f"check-{point.name}"
        report = restore(Repository(store, MACHINE, crypto),
                         RestoreOptions(target=out, at=point.at, local_home=HOME))
        if report.errors:
            raise SystemExit(f"{dest.name} at {point.name}: {report.errors}")
        want = expected(built, point)
        got = restored_files(out)
        if got != {p: (hashlib.sha256(d).hexdigest(), len(d)) for p, d in want.items()}:
            raise SystemExit(f"{dest.name} at {point.name}: the restore differs from the "
                             f"source tree: {sorted(set(got) ^ set(want))}")
        backups, problems = load_all(Repository(store, "", crypto), MACHINE, point.at)
        if problems:
            raise SystemExit(f"{dest.name} at {point.name}: {problems}")
        rows = sessions_table(backups, work / "nowhere")
        if session_titles(rows) != built.sessions[point.flush]:
            raise SystemExit(f"{dest.name} at {point.name}: sessions {session_titles(rows)}, "
                             f"expected {built.sessions[point.flush]}")


def write_expected(name: str, built: Built, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for point in POINTS[name]:
        doc = {"store": name, "machine": MACHINE, "home": HOME, "point": point.name,
               "at": point.at, "what": point.what,
               "files": describe(expected(built, point)),
               "sessions": [{"session_id": k, **v}
                            for k, v in sorted(built.sessions[point.flush].items())]}
        (out / f"{point.name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True)
                                                + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", choices=sorted(STORES),
                    help="build only this store (repeatable)")
    ap.add_argument("--force", action="store_true", help="replace a store that exists")
    args = ap.parse_args(argv)
    # machine.json names the writer's host, OS and home: neutral ones, the same each run.
    os.environ["HOME"] = HOME
    _pin(socket, "gethostname", lambda: MACHINE)
    _pin(platform, "release", lambda: "6.1.0")
    for name in args.only or sorted(STORES):
        dest, exp = GOLDEN / name, GOLDEN / "expected" / name
        if dest.exists() and not args.force:
            print(f"{name}: exists, left as it is (a golden store is never rewritten)")
            continue
        with tempfile.TemporaryDirectory(prefix="syncd-golden-") as tmp:
            staged, built = build(Path(tmp), name)
            check_restores(staged, name, built, Path(tmp))
            shutil.rmtree(dest, ignore_errors=True)
            shutil.rmtree(exp, ignore_errors=True)
            shutil.copytree(staged, dest)
            write_expected(name, built, exp)
        print(f"{name}: written ({sum(p.stat().st_size for p in dest.rglob('*') if p.is_file())}"
              " bytes)")
    return 0


def _pin(module: Any, name: str, value: Callable[[], str]) -> None:
    setattr(module, name, value)


if __name__ == "__main__":
    sys.exit(main())

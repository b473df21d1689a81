"""A session as a person reads it: the items of its transcript (prompts, answers, thinking,
tool calls and their results, compact boundaries, summaries, titles) and its subagents,
parsed from the JSONL lines Claude Code writes (2.1.x, see docs/ARCHITECTURE.md).

A transcript comes from a store or another machine: untrusted. Its size never decides
memory: a line over ``MAX_LINE`` bytes is one "[line too long]" item (never buffered),
each item's text is cut at ``TEXT_MAX`` characters (saying how much), and a session's
items and their text stop at ``ITEMS_MAX`` and ``TOTAL_MAX`` (its subagents included)
with a note. Nothing here writes: a backup is read through its extents.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from syncd.errors import AmbiguousSession, LookupFailed, NoBackup
from syncd.format.catalog import MAX_LINE, Session, is_injected, is_session_id
from syncd.restore.sessionref import matching, one
from syncd.untrusted import loads

if TYPE_CHECKING:
    from syncd.config import Settings
    from syncd.format.snapshot import Entry
    from syncd.repository import Repository
    from syncd.view import Backup

# Characters kept of one item's text (a prompt, an answer), and of a tool result's.
TEXT_MAX = 64 << 10
RESULT_MAX = 8 << 10
# Characters of a tool call's key argument (one line).
ARG_MAX = 200
# Items of one session, subagents included, and characters of text they hold in all.
ITEMS_MAX = 20_000
TOTAL_MAX = 16 << 20
# Subagent transcripts read of one session.
SUBAGENTS_MAX = 200
# Bytes read from a backup at once (one window of one object's frames).
WINDOW = 16 << 20
# Chunks a local file is read in.
CHUNK = 1 << 20

Kind = Literal["prompt", "answer", "thinking", "tool", "result", "compact", "summary",
               "title", "command", "injected", "note", "error", "toolong"]


@dataclass
class Item:
    """One thing a reader sees. ``text``: the store's text (Markdown for prompts and
    answers), cut to its limit; ``cut``: characters left out of it."""

    kind: Kind
    text: str = ""
    time: str | None = None
    # A tool call: its name, its key argument (``text``), its id; a result: the call's id.
    name: str = ""
    tool_id: str = ""
    # A tool call that started a subagent: the agent's id (a section of the transcript).
    agent: str | None = None
    error: bool = False
    cut: int = 0


@dataclass
class Transcript:
    session: str
    machine: str | None = None
    # The transcript's path relative to the tree (projects/<folder>/<sid>.jsonl).
    path: str = ""
    items: list[Item] = field(default_factory=list)
    title: str | None = None
    # Its last prompt record, else its last summary: the title when there is no other.
    fallback_title: str | None = None
    cwd: str | None = None
    git_branch: str | None = None
    models: list[str] = field(default_factory=list)
    first_time: str | None = None
    last_time: str | None = None
    # A subagent's own transcript: its agent id (its anchor) and what it was asked.
    agent: str | None = None
    description: str | None = None
    subagents: list[Transcript] = field(default_factory=list)
    # What was left out (limits reached), one line each.
    notes: list[str] = field(default_factory=list)
    # The point in time of the backup read (None: the local tree, now), and when the
    # session was deleted on its machine as of then (None: it was there).
    at: float | None = None
    deleted_at: float | None = None


# What a terminal or a text file must not get from a store: control characters (escape
# sequences), bidirectional overrides. Newlines stay; a tab becomes spaces.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                     "\u2066-\u2069]")


def readable(text: str) -> str:
    """``text`` with every control character but the newline shown as ``?``."""
    text = text.replace("\r\n", "\n").replace("\t", "    ")
    return _UNSAFE.sub("?", text)


def display_title(t: Transcript) -> str:
    """What to call the transcript, as the session list does: its title, else its last
    prompt or summary, else its first prompt's start, else its id."""
    if t.title or t.fallback_title:
        return t.title or t.fallback_title or ""
    first = next((i.text for i in t.items if i.kind == "prompt"), "")
    return _one_line(first, 100) if first.strip() else (t.agent or t.session)


class Budget:
    """Items and characters a session (its subagents included), or a page of several,
    may still take."""

    def __init__(self) -> None:
        self.items = ITEMS_MAX
        self.chars = TOTAL_MAX

    @property
    def spent(self) -> bool:
        return self.items <= 0 or self.chars <= 0


# -- lines -------------------------------------------------------------------------------

def lines_of(chunks: Iterable[bytes]) -> Iterator[bytes | int]:
    """The complete lines of a stream of chunks; a line over ``MAX_LINE`` bytes is its
    length instead (never held whole). A last line without a newline counts too (a
    reader of a transcript shows what is there)."""
    carry = b""
    skipping = -1  # bytes of an overlong line seen so far, -1 when not in one
    for data in chunks:
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if skipping >= 0:
                if nl < 0:
                    skipping += len(data) - pos
                    break
                yield skipping + nl - pos
                skipping, pos = -1, nl + 1
                continue
            if nl < 0:
                carry += data[pos:]
                if len(carry) > MAX_LINE:
                    skipping, carry = len(carry), b""
                break
            line = carry + data[pos:nl] if carry else data[pos:nl]
            carry, pos = b"", nl + 1
            yield line if len(line) <= MAX_LINE else len(line)
    if skipping >= 0:
        yield skipping
    elif carry.strip():
        yield carry


# -- records -----------------------------------------------------------------------------

# The argument that says what a call did, by the tools' own names for it, in order.
_KEY_ARGS = ("file_path", "notebook_path", "command", "pattern", "url", "query", "path",
             "description", "prompt", "skill", "subagent_type", "task_id", "shell_id",
             "plan", "todos", "questions")
_TAG = re.compile(r"^\s*<([a-z][\w-]*)[\s>]")
_COMMAND = re.compile(r"<command-name>(.*?)</command-name>", re.S)
_COMMAND_ARGS = re.compile(r"<command-args>(.*?)</command-args>", re.S)
_BASH_INPUT = re.compile(r"<bash-input>([\s\S]*?)</bash-input>")


def _one_line(text: str, limit: int = ARG_MAX) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def key_argument(args: object) -> str:
    """The one argument of a tool call a reader needs (a file, a command, a pattern…),
    on one line; else the first string argument."""
    if not isinstance(args, dict):
        return ""
    for key in _KEY_ARGS:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return _one_line(value)
        if isinstance(value, list) and value:
            return f"{len(value)} {key}"
    for value in args.values():
        if isinstance(value, str) and value.strip():
            return _one_line(value)
    return ""


def _str(value: object, limit: int = 256) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def _texts(content: object) -> list[str]:
    """The text pieces of a message's or a tool result's content (images named)."""
    if isinstance(content, str):
        return [content]
    out = []
    if isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                out.append(block["text"])
            elif block.get("type") in ("image", "document"):
                out.append(f"[{block['type']}]")
    return out


class _Parser:
    """Items of one transcript, line by line, within a budget."""

    def __init__(self, t: Transcript, budget: Budget) -> None:
        self.t = t
        self.budget = budget
        self.agents: dict[str, str] = {}  # tool_use id → agent id (from its result)
        self.stopped = 0  # lines not looked at once the budget was spent
        # The fallbacks of a title, in the catalog's order after custom and AI titles.
        self.custom = False
        self.last_prompt: str | None = None
        self.summary: str | None = None

    def add(self, item: Item, limit: int = TEXT_MAX) -> None:
        if self.budget.spent:
            return
        limit = min(limit, self.budget.chars)
        if len(item.text) > limit:
            item.cut += len(item.text) - limit
            item.text = item.text[:limit]
        self.budget.items -= 1
        self.budget.chars -= len(item.text) + 1
        self.t.items.append(item)

    def line(self, raw: bytes | int) -> None:
        if self.budget.spent:
            self.stopped += 1
            return
        if isinstance(raw, int):
            self.add(Item("toolong", f"[line too long: {raw} bytes]"))
            return
        if not raw.strip():
            return
        try:
            entry = loads(raw)
        except ValueError:  # a torn last line, or not JSON: no item of its own
            return
        if isinstance(entry, dict):
            self.entry(entry)

    def entry(self, e: dict[str, Any]) -> None:
        kind = e.get("type")
        when = _str(e.get("timestamp"), 64)
        t = self.t
        if when is not None and kind in ("user", "assistant"):
            t.first_time = t.first_time or when
            t.last_time = when
        if t.cwd is None:
            t.cwd = _str(e.get("cwd"), 4096)
        if kind in ("user", "assistant") and _str(e.get("gitBranch")):
            t.git_branch = _str(e.get("gitBranch"))
        if kind == "user":
            self.user(e, when)
        elif kind == "assistant":
            self.assistant(e, when)
        elif kind == "system":
            self.system(e, when)
        elif kind == "summary" and _str(e.get("summary")):
            # The title Claude gave a branch (its picker's), not a compacted conversation.
            self.summary = _one_line(e["summary"], 256)
            self.add(Item("title", self.summary, when))
        elif kind == "custom-title" and _str(e.get("customTitle")):
            t.title = _one_line(e["customTitle"], 256)
            self.custom = True
            self.add(Item("title", t.title, when))
        elif kind == "ai-title" and _str(e.get("aiTitle") or e.get("title")):
            if not self.custom:
                t.title = _one_line(e.get("aiTitle") or e["title"], 256)
        elif kind == "last-prompt" and _str(e.get("lastPrompt")) and \
                not is_injected(e["lastPrompt"]):  # a <task-notification>: the last real one
            self.last_prompt = _one_line(e["lastPrompt"], 256)
        elif kind == "relocated" and _str(e.get("relocatedCwd"), 4096):
            self.add(Item("note", f"session moved to {e['relocatedCwd'][:4096]}", when))
        # progress, file-history-snapshot, queue-operation, last-prompt, attachment…:
        # bookkeeping, not conversation.

    def user(self, e: dict[str, Any], when: str | None) -> None:
        message = e.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if e.get("isCompactSummary") is True:
            self.add(Item("summary", "\n".join(_texts(content)), when))
            return
        if isinstance(content, list) and any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            result = e.get("toolUseResult")
            for b in content:
                if not isinstance(b, dict) or b.get("type") != "tool_result":
                    continue
                tid = _str(b.get("tool_use_id")) or ""
                if isinstance(result, dict) and _str(result.get("agentId")) and tid:
                    self.agents[tid] = result["agentId"][:64]
                self.add(Item("result", "\n".join(_texts(b.get("content"))), when,
                              tool_id=tid, error=b.get("is_error") is True), RESULT_MAX)
            return
        for text in _texts(content):
            command = _COMMAND.search(text)
            bash = _BASH_INPUT.search(text)
            if command:
                args = _COMMAND_ARGS.search(text)
                line = command.group(1).strip() + (" " + args.group(1).strip() if args
                                                   and args.group(1).strip() else "")
                self.add(Item("command", _one_line(line), when))
            elif bash:
                self.add(Item("command", _one_line("! " + bash.group(1).strip()), when))
            elif e.get("isMeta") is True or _TAG.match(text):
                # What the CLI injects (<system-reminder>, <local-command-stdout>, caveats).
                self.add(Item("injected", text, when), RESULT_MAX)
            elif text.strip():
                self.add(Item("prompt", text, when))

    def assistant(self, e: dict[str, Any], when: str | None) -> None:
        message = e.get("message")
        if not isinstance(message, dict):
            return
        model = _str(message.get("model"), 128)
        if model and model != "<synthetic>" and model not in self.t.models and \
                len(self.t.models) < 64:
            self.t.models.append(model)
        content = message.get("content")
        if e.get("isApiErrorMessage") is True:
            self.add(Item("error", "\n".join(_texts(content)), when))
            return
        if isinstance(content, str):
            self.add(Item("answer", content, when))
            return
        if not isinstance(content, list):
            return
        for b in content:
            if not isinstance(b, dict):
                continue
            kind = b.get("type")
            if kind == "text" and isinstance(b.get("text"), str) and b["text"].strip():
                self.add(Item("answer", b["text"], when))
            elif kind == "thinking" and isinstance(b.get("thinking"), str):
                self.add(Item("thinking", b["thinking"], when))
            elif kind == "redacted_thinking":
                self.add(Item("thinking", "[redacted thinking]", when))
            elif kind in ("tool_use", "server_tool_use"):
                name = _one_line(_str(b.get("name")) or "tool", 64)
                self.add(Item("tool", key_argument(b.get("input")), when, name=name,
                              tool_id=_str(b.get("id")) or ""))

    def system(self, e: dict[str, Any], when: str | None) -> None:
        sub = e.get("subtype")
        if sub == "compact_boundary":
            meta = e.get("compactMetadata")
            how = []
            if isinstance(meta, dict):
                if _str(meta.get("trigger"), 32):
                    how.append(meta["trigger"][:32])
                if isinstance(meta.get("preTokens"), int):
                    how.append(f"{meta['preTokens']} tokens before")
            self.add(Item("compact", "conversation compacted" +
                          (f" ({', '.join(how)})" if how else ""), when))
        elif sub == "local_command" and isinstance(e.get("content"), str):
            self.add(Item("injected", e["content"], when), RESULT_MAX)
        elif e.get("level") in ("error", "warning") and isinstance(e.get("content"), str):
            self.add(Item("error" if e["level"] == "error" else "note", e["content"], when))
        # turn_duration, stop_hook_summary, informational: bookkeeping.

    def finish(self) -> None:
        self.t.fallback_title = self.last_prompt or self.summary
        for item in self.t.items:
            if item.kind == "tool" and item.tool_id in self.agents:
                item.agent = self.agents[item.tool_id]
        if self.stopped:
            self.t.notes.append(f"{self.stopped} more lines not shown (the rendering stops "
                                f"at {ITEMS_MAX} items or {TOTAL_MAX >> 20} MiB of text)")
        cut = sum(i.cut for i in self.t.items)
        if cut:
            self.t.notes.append(f"{cut} characters cut from long items")


def parse(lines: Iterable[bytes | int], session: str, *, budget: Budget | None = None,
          **fields: Any) -> Transcript:
    """The transcript of ``lines`` (as ``lines_of`` gives them)."""
    t = Transcript(session, **fields)
    p = _Parser(t, budget or Budget())
    for raw in lines:
        p.line(raw)
    p.finish()
    return t


def parse_bytes(data: bytes, session: str = "", **fields: Any) -> Transcript:
    """The transcript of a whole file's bytes (tests, small files)."""
    return parse(lines_of([data]), session, **fields)


# -- where a session is -------------------------------------------------------------------

_AGENT = re.compile(r"agent-[\w-]{1,64}\.jsonl")
_META_MAX = 16 << 10


def _agent_id(name: str) -> str:
    return name[len("agent-"):-len(".jsonl")]


def _description(meta: bytes | None) -> str | None:
    if meta is None or len(meta) > _META_MAX:
        return None
    try:
        doc = loads(meta)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    text = _str(doc.get("description")) or _str(doc.get("agentType"))
    return _one_line(text, 256) if text else None


def _with_subagents(main: Iterable[bytes | int], session: str,
                    agents: list[tuple[str, Callable[[], Iterable[bytes | int]],
                                       bytes | None]],
                    **fields: Any) -> Transcript:
    budget = Budget()
    t = parse(main, session, budget=budget, **fields)
    for name, read, meta in sorted(agents, key=lambda a: a[0])[:SUBAGENTS_MAX]:
        sub = parse(read(), session, budget=budget, machine=t.machine,
                    agent=_agent_id(name), description=_description(meta))
        t.subagents.append(sub)
    if len(agents) > SUBAGENTS_MAX:
        t.notes.append(f"{len(agents) - SUBAGENTS_MAX} more subagents not shown")
    return t


def _read_local(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def _local_lines(path: Path) -> Iterator[bytes | int]:
    return lines_of(_read_local(path))


def _local_matches(root: Path, ref: str, machine: str) -> list[tuple[str, Session]]:
    try:
        paths = [p for p in (root / "projects").glob("*/*.jsonl") if is_session_id(p.stem)]
    except OSError:
        return []
    sessions = [(machine, Session(p.stem, machine, os.fsencode(p.relative_to(root))))
                for p in paths]
    return matching(ref, sessions)


def _local(root: Path, sid: str, rel: bytes, machine: str) -> Transcript:
    path = root / os.fsdecode(rel)
    folder = path.with_suffix("") / "subagents"
    agents: list[tuple[str, Callable[[], Iterable[bytes | int]], bytes | None]] = []
    try:
        names = sorted(p.name for p in folder.iterdir() if _AGENT.fullmatch(p.name))
    except OSError:
        names = []
    for name in names:
        meta_path = folder / (name[:-len(".jsonl")] + ".meta.json")
        try:
            meta = meta_path.read_bytes() if meta_path.stat().st_size <= _META_MAX else None
        except OSError:
            meta = None
        agents.append((name, partial(_local_lines, folder / name), meta))
    return _with_subagents(lines_of(_read_local(path)), sid, agents, machine=machine,
                           path=os.fsdecode(rel))


def entry_bytes(repo: Repository, e: Entry) -> Iterator[bytes]:
    """Bytes [0, size) of a backup's file, a window of one object's frames at a time."""
    return repo.entry_bytes(e, e.size, WINDOW)


def _entry_lines(repo: Repository, e: Entry) -> Iterator[bytes | int]:
    return lines_of(entry_bytes(repo, e))


def _backup_meta(repo: Repository, b: Backup, path: bytes) -> bytes | None:
    e = b.files.get(path)
    if e is None or e.deleted_at is not None or e.size > _META_MAX:
        return None
    return b"".join(entry_bytes(repo, e))


def _from_backup(repo: Repository, b: Backup, s: Session, at: float | None) -> Transcript:
    e = b.files.get(s.path)
    if e is None:
        raise LookupFailed(f"session {s.session_id} is not in machine {b.machine!r}'s backup")
    prefix = s.path[:-len(b".jsonl")] + b"/subagents/"
    agents: list[tuple[str, Callable[[], Iterable[bytes | int]], bytes | None]] = []
    for path, f in sorted(b.files.items()):
        name = path[len(prefix):].decode("utf-8", "replace")
        if not path.startswith(prefix) or not _AGENT.fullmatch(name) or \
                (f.deleted_at is not None and s.deleted_at is None):
            continue
        meta = _backup_meta(repo, b, prefix + name[:-len(".jsonl")].encode() + b".meta.json")
        agents.append((name, partial(_entry_lines, repo, f), meta))
    t = _with_subagents(lines_of(entry_bytes(repo, e)), s.session_id, agents,
                        machine=b.machine, path=s.path.decode("utf-8", "replace"),
                        at=b.point[1] if b.point else at, deleted_at=s.deleted_at)
    # A title its catalog knows from elsewhere (custom-title.json), not its prompts'.
    title = s.fields.get("custom_title") or s.fields.get("ai_title")
    if title and t.title is None:
        t.title = _one_line(title, 256)
    return t


def open_repository(settings: Settings) -> Repository:
    """This machine's repository of the configured store, unlocked without a prompt."""
    from syncd.backup.state import remembered_key
    from syncd.repository import Repository
    from syncd.security.keys import open_crypto
    from syncd.store import open_store

    store = open_store(settings.store, endpoint_url=settings.s3_endpoint_url,
                       region=settings.s3_region)
    crypto = open_crypto(store, settings.passphrase_file, prompt=False,
                         hint=remembered_key(settings.state_file))
    return Repository(store, settings.machine_id, crypto)


def load_transcript(settings: Settings, session: str, *, machine: str | None = None,
                    at: float | None = None,
                    repository: Callable[[], Repository] | None = None) -> Transcript:
    """The session ``session`` names (its id or a unique prefix of 8 characters or more)
    as a person reads it: from the local tree when ``machine`` is None or this machine
    and ``at`` is None (and the tree has it); else from that machine's backup (none
    named: this machine's, else the one machine holding it) as of ``at`` (None: its last
    flush), read through its extents, nothing written. ``repository``: opens the store
    when one is needed (default: the configured one, without a prompt). Unknown or
    ambiguous: the lines ``restore --session`` gives."""
    from syncd.restore.listing import locate_session

    here = settings.machine_id
    if at is None and machine in (None, here):
        found = _local_matches(settings.source, session, here)
        if found:
            sid = one(session, found, True)
            rel = next(s.path for _, s in found if s.session_id == sid)
            return _local(settings.source, sid, rel, here)
    repo = (repository or partial(open_repository, settings))()
    if machine is None:
        # This machine's backup first, as `restore` reads it (a session follow imported
        # elsewhere is on two machines: this one's is the one meant), then any machine's.
        try:
            return _as_of(repo.for_machine(here), session, at)
        except AmbiguousSession:
            raise
        except (LookupFailed, NoBackup):
            pass
        where, copies = locate_session(repo, session, None)
        return _as_of(repo.for_machine(where), copies[0].session_id, at)
    return _as_of(repo.for_machine(machine), session, at)


def _as_of(repo: Repository, session: str, at: float | None) -> Transcript:
    """The session ``session`` names in ``repo``'s machine's backup as of ``at``."""
    from syncd.restore.listing import resolve_sessions
    from syncd.view import load_backup

    [sid] = resolve_sessions(repo, [session], at=at)
    b = load_backup(repo, at=at, sessions=[sid])
    s = b.find_session(sid)
    if s is None:
        raise LookupFailed(f"session {sid} is not in machine {repo.machine!r}'s backup"
                           + (" at that time" if at is not None else ""))
    return _from_backup(repo, b, s, at)

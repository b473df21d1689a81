"""The session catalog: what `syncd sessions` lists, without downloading transcripts.

The shipper extracts a few fields from the new lines of each top-level transcript
(``projects/<folder>/<session>.jsonl``) and stores them in the segment index; a
reader folds the indexes in seq order. Only complete lines of at most
``MAX_LINE`` bytes are looked at, and only those whose raw bytes name a field of
interest, so the flush path pays little.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

MAX_LINE = 1 << 20
# A catalog field keeps at most this many characters (a path, a title, a prompt's start):
# indexes stay small, and a store's index cannot make a listing hold more.
FIELD_MAX = 4096
SPECIAL_MAX = 8 << 10
_SPECIAL = re.compile(rb'"type":"(?:custom-title|ai-title|last-prompt|summary|relocated)"')
_PROMPT = re.compile(rb'"type":"(?:user|custom-title|ai-title|last-prompt|summary|relocated)"')
_FIRST = re.compile(rb'"type":"(?:user|custom-title|ai-title|last-prompt|summary|relocated)"'
                    rb'|"cwd":"')
# Lines looked at per chunk for its last message: a run of lines that only embed one
# (agent progress) costs no more than this.
MESSAGE_TRIES = 32
# Fields whose newest value wins, and those whose first value wins.
LATEST = ("custom_title", "ai_title", "last_prompt", "summary", "last_activity", "git_branch",
          "origin", "relocated_cwd")
FIRST = ("cwd", "first_prompt")
TITLE_ORDER = ("custom_title", "ai_title", "last_prompt", "summary", "first_prompt")


# Claude Code names a transcript by its session id, a UUID. A store can name anything:
# only such names are sessions, so an id never carries a shell metacharacter or a path.
SESSION_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                        r"[0-9a-fA-F]{12}")


def is_session_id(text: str) -> bool:
    return SESSION_ID.fullmatch(text) is not None


def session_of(path: bytes) -> str | None:
    """The session id of a top-level transcript path (a UUID), else None."""
    parts = path.split(b"/")
    if len(parts) == 3 and parts[0] == b"projects" and parts[2].endswith(b".jsonl"):
        sid = parts[2][:-6].decode("ascii", errors="replace")
        return sid if is_session_id(sid) else None
    return None


def session_of_any(path: bytes) -> str | None:
    """The session a path under projects/ belongs to: its transcript, or anything under
    ``<sid>/`` beside it (subagents, tool results)."""
    parts = path.split(b"/")
    if len(parts) < 3 or parts[0] != b"projects":
        return None
    name = parts[2] if len(parts) > 3 else parts[2].removesuffix(b".jsonl")
    if len(parts) == 3 and not parts[2].endswith(b".jsonl"):
        return None
    sid = name.decode("ascii", errors="replace")
    return sid if is_session_id(sid) else None


# Claude Code (2.1.332) keeps a session's title beside its other files too, in
# projects/<folder>/<sid>/custom-title.json: {"customTitle": …, "by": …, "at": …}, written
# by each /rename just after the transcript's custom-title record (removed when the
# title is). Its list takes a record in the transcript's last 64 KiB first, then this
# file, then a record further back. A few hundred bytes: a larger one is not read.
TITLE_FILE = b"custom-title.json"
TITLE_FILE_MAX = 16 << 10


def title_file_owner(path: bytes) -> bytes | None:
    """The transcript whose title file ``path`` is, else None."""
    parts = path.split(b"/")
    if len(parts) == 4 and parts[0] == b"projects" and parts[3] == TITLE_FILE and \
            is_session_id(parts[2].decode("ascii", errors="replace")):
        return b"/".join(parts[:3]) + b".jsonl"
    return None


def title_file_fields(data: bytes) -> dict[str, str]:
    """The catalog fields a title file's bytes name: its title as ``custom_title`` (the
    newest value wins: shipped after the transcript it names, it wins as in Claude's
    list); none when it is not what Claude writes."""
    if len(data) > TITLE_FILE_MAX:
        return {}
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError included; nested too deep
        return {}
    title = doc.get("customTitle") if isinstance(doc, dict) else None
    if not isinstance(title, str) or not title.strip():
        return {}
    return {"custom_title": title.strip()[:FIELD_MAX]}


# What Claude Code (2.1.332) takes for a prompt when it lists sessions: a user entry that
# is not meta, a compact summary or a tool result; its text with pasted blocks unwrapped
# and newlines as spaces; not a slash command (only a fallback there), and not text that
# opens with a tag (what the CLI injects: <task-notification>, <command-message>,
# <local-command-stdout>, <system-reminder>, …) or an interruption notice. A shell
# escape (<bash-input>) reads "! command". Kept to 200 characters and an ellipsis.
_INJECTED = re.compile(r"^(?:\s*<[a-z][\w-]*[\s>]|\[Request interrupted by user[^\]]*\])")
_COMMAND = re.compile(r"<command-name>(.*?)</command-name>")
_BASH_INPUT = re.compile(r"<bash-input>([\s\S]*?)</bash-input>")
_PASTED = re.compile(r'\n{0,2}<pasted_content id="([0-9a-f]{4})">\n([\s\S]*?)\n'
                     r'</pasted_content id="\1">\n{0,2}')
PROMPT_MAX = 200


def _clip(text: str) -> str:
    return text if len(text) <= PROMPT_MAX else text[:PROMPT_MAX].strip() + "\u2026"


def _prompt_text(entry: dict[str, Any]) -> str | None:
    if entry.get("type") != "user" or entry.get("isMeta") is True or \
            entry.get("isCompactSummary") is True or entry.get("isSidechain"):
        return None
    content = (entry.get("message") or {}).get("content")
    if isinstance(content, str):
        texts = [content]
    elif isinstance(content, list):
        if any(isinstance(c, dict) and c.get("type") == "tool_result" for c in content):
            return None
        texts = [c["text"] for c in content if isinstance(c, dict) and
                 c.get("type") == "text" and isinstance(c.get("text"), str)]
    else:
        return None
    for raw in texts:
        if '<pasted_content id="' in raw:
            raw = _PASTED.sub(lambda m: m.group(2), raw)
        text = raw.replace("\n", " ").strip()
        if not text or _COMMAND.search(text):
            continue
        bash = _BASH_INPUT.search(text)
        if bash:
            return _clip(f"! {bash.group(1).strip()}")
        if _INJECTED.match(text):
            continue
        return _clip(text)
    return None


def is_injected(prompt: str) -> bool:
    """A ``last-prompt`` record's prompt that is not one (older CLIs recorded what they
    injected there too: a ``<task-notification>``, a command's wrapper)."""
    return _INJECTED.match(prompt) is not None


class MetaScanner:
    """Fields found in one stretch of a transcript (one flush's new bytes), fed in chunks."""

    def __init__(self, *, at_line_start: bool) -> None:
        self.fields: dict[str, str] = {}
        self._carry = b""
        # A stretch that starts mid-line begins with the tail of a line already seen.
        self._skip_first = not at_line_start
        self._overlong = False
        self._last: tuple[str, str | None] | None = None  # the last message: when, branch

    def feed(self, data: bytes) -> None:
        buf = self._carry + data
        end = buf.rfind(b"\n")
        # The last piece has no newline yet: kept for the next chunk (or a torn line).
        complete, self._carry = (b"", buf) if end < 0 else (buf[:end], buf[end + 1 :])
        if end >= 0 and (self._skip_first or self._overlong):
            self._skip_first = self._overlong = False
            cut = complete.find(b"\n")
            complete = b"" if cut < 0 else complete[cut + 1 :]
            end = -1 if cut < 0 else end
        if end >= 0:
            self._scan(complete)
            self._last = self._last_message(complete) or self._last
        if len(self._carry) > MAX_LINE:
            self._carry, self._overlong = b"", True

    def _scan(self, text: bytes) -> None:
        # Only the lines that can still name a field, found by regex over the whole
        # stretch rather than a Python loop over every line: once cwd and the first
        # prompt are known (the first lines), only titles and summaries are left.
        f = self.fields
        pos = 0
        while True:
            done = "cwd" in f and "first_prompt" in f
            rx = _SPECIAL if done else _PROMPT if "cwd" in f else _FIRST
            m = rx.search(text, pos)
            if m is None:
                return
            start = text.rfind(b"\n", 0, m.start()) + 1
            stop = text.find(b"\n", m.end())
            stop = len(text) if stop < 0 else stop
            # A tool result is a "user" entry too, never a prompt: skipped unparsed.
            if stop - start <= (SPECIAL_MAX if done else MAX_LINE) and (
                    rx is not _PROMPT or text.find(b'"tool_result"', start, stop) < 0):
                self._line(text[start:stop])
            pos = stop + 1

    @staticmethod
    def _last_message(text: bytes) -> tuple[str, str | None] | None:
        """The timestamp (and branch) of the last user or assistant entry in ``text``, as
        Claude's session list dates a session: not the trailing bookkeeping lines
        (file-history snapshots, last-prompt, system entries) some carry stamps of
        their own, older than the conversation."""
        # Where each marker last occurs before the line looked at: each searched again only
        # once passed, so a stretch is read backwards at most once per marker.
        markers = [b'"type":"user"', b'"type":"assistant"']
        found = [text.rfind(m) for m in markers]
        for _ in range(MESSAGE_TRIES):
            at = max(found)
            if at < 0:
                return None
            start = text.rfind(b"\n", 0, at) + 1
            stop = text.find(b"\n", at)
            stop = len(text) if stop < 0 else stop
            found = [f if f < start else text.rfind(m, 0, start)
                     for f, m in zip(found, markers, strict=True)]
            if stop - start > MAX_LINE or text.find(b'"timestamp":', start, stop) < 0:
                continue
            try:
                entry = json.loads(text[start:stop])
            except (ValueError, RecursionError):  # not JSON, or nested too deep
                continue
            if isinstance(entry, dict) and entry.get("type") in ("user", "assistant") and \
                    isinstance(entry.get("timestamp"), str) and entry["timestamp"]:
                branch = entry.get("gitBranch")
                return (entry["timestamp"][:64],
                        branch if isinstance(branch, str) and branch else None)
        return None

    def finish(self) -> dict[str, str]:
        if self._last is not None:
            self.fields["last_activity"], branch = self._last
            if branch is not None:
                self.fields["git_branch"] = branch[:FIELD_MAX]
        return self.fields

    def _line(self, line: bytes) -> None:
        f = self.fields
        if "cwd" in f and "first_prompt" in f:
            # Only titles and prompts are left to find, and those entries are short lines.
            if len(line) > SPECIAL_MAX or not _SPECIAL.search(line):
                return
        elif not _FIRST.search(line):
            return
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or nested too deep
            return
        if not isinstance(entry, dict):
            return
        kind = entry.get("type")
        if "cwd" not in f and isinstance(entry.get("cwd"), str):
            f["cwd"] = entry["cwd"]
        if kind == "user" and "first_prompt" not in f:
            text = _prompt_text(entry)
            if text:
                f["first_prompt"] = text
        elif kind == "custom-title" and isinstance(entry.get("customTitle"), str):
            f["custom_title"] = entry["customTitle"]
        elif kind == "ai-title" and isinstance(entry.get("aiTitle") or entry.get("title"), str):
            f["ai_title"] = entry.get("aiTitle") or entry["title"]
        elif kind == "last-prompt" and isinstance(entry.get("lastPrompt"), str):
            prompt = entry["lastPrompt"].replace("\n", " ").strip()
            if prompt and not is_injected(prompt):  # else the last real one is kept
                f["last_prompt"] = _clip(prompt)
        elif kind == "summary" and isinstance(entry.get("summary"), str):
            f["summary"] = entry["summary"]
        elif kind == "relocated" and isinstance(entry.get("relocatedCwd"), str):
            # A moved session (/cd, a worktree): Claude places it by the last one.
            f["relocated_cwd"] = entry["relocatedCwd"]
        for key, value in f.items():
            f[key] = value[:FIELD_MAX]


# A session restored here from another machine: where from, and the path rules that
# restore used (docs/FORMAT.md "origin"). Bounded: a store's claim never costs more.
ORIGIN_RULES_MAX = 32
ORIGIN_PATH_MAX = 1024


@dataclass(frozen=True)
class Origin:
    """The catalog's ``origin``: the session's lines up to where this machine took it over
    were machine ``machine``'s ``path``, mapped by ``rules`` ((old, new) prefixes)."""

    machine: str
    path: str
    rules: tuple[tuple[str, str], ...]

    def encode(self) -> str:
        """As the catalog field, within ``FIELD_MAX`` characters: rules that do not fit are
        left out, the most specific (longest) first, so the broad ones (the home) stay."""
        rules = sorted(self.rules, key=lambda r: len(r[0]))[:ORIGIN_RULES_MAX]
        while True:
            text = json.dumps({"machine": self.machine, "path": self.path,
                               "rules": [list(r) for r in rules]},
                              ensure_ascii=False, separators=(",", ":"))
            if len(text) <= FIELD_MAX or not rules:
                return text
            rules.pop()


_MACHINE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def parse_origin(text: str | None) -> Origin | None:
    """The catalog field as a store holds it; None when absent or not what a writer of
    ours makes (a stranger's field decides nothing)."""
    if not text:
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    machine, path, rules = doc.get("machine"), doc.get("path"), doc.get("rules")
    if not isinstance(machine, str) or not _MACHINE.fullmatch(machine) or \
            not isinstance(path, str) or len(path) > ORIGIN_PATH_MAX or \
            not isinstance(rules, list) or len(rules) > ORIGIN_RULES_MAX:
        return None
    pairs = []
    for r in rules:
        if not (isinstance(r, list) and len(r) == 2 and all(
                isinstance(x, str) and 0 < len(x) <= ORIGIN_PATH_MAX and "\0" not in x
                for x in r)):
            return None
        pairs.append((r[0], r[1]))
    return Origin(machine, path, tuple(pairs))


@dataclass
class Session:
    """One backed-up session as the catalog knows it."""

    session_id: str
    machine: str
    path: bytes
    gen: int = 0
    size: int = 0
    deleted_at: float | None = None
    last_seq: int = 0
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def title(self) -> str:
        """Custom title > AI title > last prompt > summary > first prompt, like Claude's picker."""
        for key in TITLE_ORDER:
            if self.fields.get(key):
                return self.fields[key]
        return ""

    @property
    def project(self) -> str | None:
        return self.fields.get("cwd")

    @property
    def place(self) -> str | None:
        """Where the session is now: its last ``relocatedCwd`` (``/cd``, a worktree move)
        or else the directory it started in."""
        return self.fields.get("relocated_cwd") or self.project

    @property
    def places(self) -> list[str]:
        """The directories a ``--project`` finds it by: where it started, where it is."""
        return [p for p in dict.fromkeys((self.project, self.place)) if p]

    @property
    def folder(self) -> str:
        return self.path.split(b"/")[1].decode(errors="surrogateescape")

    def fold(self, gen: int, found: dict[str, Any]) -> None:
        if gen > self.gen:
            self.gen, self.fields = gen, {}
        elif gen < self.gen:
            return
        for key in FIRST:
            if key in found and key not in self.fields:
                self.fields[key] = str(found[key])[:FIELD_MAX]
        for key in LATEST:
            if key in found:
                self.fields[key] = str(found[key])[:FIELD_MAX]

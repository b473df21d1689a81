"""What of a transcript's lines is searched: prompts, answers, tool names and inputs, and
(for ``--all-text`` only) tool outputs. Never thinking, redacted thinking or signatures.

A transcript is untrusted input: a line over ``catalog.MAX_LINE`` bytes is skipped, each
kind of text is cut to a few KiB per line, and lines that hold no message (progress,
snapshots, queue operations: most of a file) are passed over by raw byte checks
without being parsed, so little Python runs per line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, NamedTuple

from syncd.format.catalog import MAX_LINE

# Characters kept per line and kind: a prompt or answer reads whole, a tool's input and
# output only for their start (a file written or read whole would make the index huge).
BODY_MAX = 16 << 10
TOOLS_MAX = 2 << 10
OUTPUT_MAX = 2 << 10
# Query-side snippet markers (private use characters): never stored, so a transcript
# cannot forge a match.
MARK_START = "\ue000"
MARK_END = "\ue001"
_NO_MARKS = {ord(MARK_START): None, ord(MARK_END): None}
# Only lines of these kinds hold searchable text; agent progress embeds a subagent's
# messages, which its own transcript holds too.
_USER = b'"type":"user"'
_ASSISTANT = b'"type":"assistant"'
_PROGRESS = b'"type":"progress"'


class Row(NamedTuple):
    """One line's searchable text, by kind (empty strings when it holds none)."""

    body: str    # prompts and answers
    tools: str   # tool names and inputs
    output: str  # tool results


def _clean(text: str, limit: int) -> str:
    if len(text) > limit:
        text = text[:limit]
    if MARK_START in text or MARK_END in text:
        text = text.translate(_NO_MARKS)
    return text


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(c["text"] for c in content if isinstance(c, dict) and
                         c.get("type") == "text" and isinstance(c.get("text"), str))
    return ""


def _tool_text(block: dict[str, Any]) -> str:
    name = block.get("name")
    args = block.get("input")
    text = name if isinstance(name, str) else ""
    if isinstance(args, dict):
        # The values read better than JSON: a command, a path, a pattern.
        vals = [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                for v in args.values()]
        text = f"{text} {' '.join(vals)}"
    return text


def row_of(entry: Any) -> Row | None:
    """The searchable text of one parsed transcript entry (None: none)."""
    if not isinstance(entry, dict) or entry.get("type") not in ("user", "assistant"):
        return None
    msg = entry.get("message")
    if not isinstance(msg, dict):
        return None
    content = msg.get("content")
    if isinstance(content, str):
        text = "" if entry.get("isMeta") is True else content
        return Row(_clean(text, BODY_MAX), "", "") if text else None
    if not isinstance(content, list):
        return None
    body: list[str] = []
    tools: list[str] = []
    output: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            body.append(block["text"])
        elif kind == "tool_use":
            tools.append(_tool_text(block))
        elif kind == "tool_result":
            output.append(_result_text(block.get("content")))
        # thinking, redacted_thinking, images, signatures: not searched
    if entry.get("isMeta") is True:
        body = []
    row = Row(_clean("\n".join(body), BODY_MAX), _clean("\n".join(tools), TOOLS_MAX),
              _clean("\n".join(output), OUTPUT_MAX))
    return row if row.body or row.tools or row.output else None


def rows(complete: bytes) -> Iterator[Row]:
    """The rows of ``complete``: whole lines (the last newline optional)."""
    start = 0
    n = len(complete)
    while start < n:
        stop = complete.find(b"\n", start)
        if stop < 0:
            stop = n
        if stop - start <= MAX_LINE:
            # Raw checks first: most lines are neither a message nor worth parsing.
            # (A progress entry names its type before what it embeds; a message's
            # content comes before its type, so a marker there is not taken.)
            head = complete.find(_PROGRESS, start, min(stop, start + 512))
            if head >= 0 and complete.find(b'"message":', start, head) >= 0:
                head = -1
            if head < 0 and (complete.find(_USER, start, stop) >= 0 or
                             complete.find(_ASSISTANT, start, stop) >= 0):
                try:
                    row = row_of(json.loads(complete[start:stop]))
                except ValueError:  # a torn or foreign line: not ours to read
                    row = None
                if row is not None:
                    yield row
        start = stop + 1

"""A transcript as a Markdown file that reads well on its own.

Prompts and answers are Markdown already and stay so, contained: a code fence an
answer leaves open is closed at its end, and raw HTML in one (a ``<script>``, an
unclosed ``<!--`` that would hide the rest of the file in a viewer) is escaped to text,
as are links to anything but http(s) and images (never loaded).
Everything else from the store (tool arguments and results, titles, paths) is text:
inline escaped, or in a fence longer than any run of its backticks, so no transcript
breaks the file's structure. Control characters never reach the file.
"""

from __future__ import annotations

import re

from syncd.render.transcript import Item, Transcript, display_title, readable

# CommonMark's fence: up to 3 spaces, 3 or more backticks or tildes (and an info string).
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_BACKTICKS = re.compile(r"`+")
# Characters that mean something inline in Markdown (escaped in text taken literally).
_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~!&$])")
# Each of these is escaped where it is not already: after an even run of backslashes
# (none included), since "\\" + "\\<" would be an escaped backslash, then raw HTML.
_UNESCAPED = r"(?<!\\)((?:\\\\)*)"
# What opens raw HTML or an autolink: '<' before a letter, '/', '!' or '?'.
_HTML_OPEN = re.compile(_UNESCAPED + r"<(?=[A-Za-z/!?])")
# A link's or a link definition's end, unless what follows is http(s) or an anchor here
# (the HTML's rule): a viewer would follow javascript:, data:… as the store wrote them.
_LINK_END = re.compile(_UNESCAPED + r"\](?=[(:](?!\s*<?(?:https?://|#)))")
# An image: a viewer that loads a store's image tells a third party the file is read.
_IMAGE = re.compile(_UNESCAPED + r"!(?=\[)")


def escape(text: str) -> str:
    """``text`` as literal inline Markdown: one line, every special character escaped."""
    line = " ".join(readable(text).split())
    line = _SPECIAL.sub(r"\\\1", line)
    # A line that begins like a list item, a heading or a quote is not one.
    return re.sub(r"^([-+=]|\d+[.)])", r"\\\1", line)


def _longest_run(text: str, char: str = "`") -> int:
    return max((len(m) for m in re.findall(re.escape(char) + "+", text)), default=0)


def code_span(text: str) -> str:
    """``text`` (one line) as an inline code span no backtick inside can end."""
    line = " ".join(readable(text).split())
    ticks = "`" * (_longest_run(line) + 1)
    pad = " " if line.startswith("`") or line.endswith("`") or not line else ""
    return f"{ticks}{pad}{line}{pad}{ticks}"


def fenced(text: str, info: str = "") -> str:
    """``text`` as a fenced code block no line inside can close."""
    fence = "`" * max(3, _longest_run(text) + 1)
    body = readable(text).rstrip("\n")
    return f"{fence}{info}\n{body}\n{fence}"


def contained(text: str) -> str:
    """A store's Markdown kept as Markdown, but unable to reach past its own end: raw
    HTML escaped outside code blocks, an open fence closed; links only to http(s) and
    images as text."""
    out = []
    fence: str | None = None  # the open fence's characters
    for line in readable(text).split("\n"):
        m = _FENCE.match(line)
        if fence is None:
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                fence = m.group(1)
                out.append(line)
                continue
            line = _HTML_OPEN.sub(r"\1\\<", line)
            out.append(_IMAGE.sub(r"\1\\!", _LINK_END.sub(r"\1\\]", line)))
        else:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and \
                    not m.group(2).strip():
                fence = None
            out.append(line)
    if fence is not None:
        out.append(fence)
    return "\n".join(out).strip("\n")


def _quoted(text: str) -> str:
    return "\n".join("> " + line if line else ">" for line in text.split("\n"))


def _when(time: str | None) -> str:
    return f" · {escape(time[:19].replace('T', ' '))}" if time else ""


def _anchor(agent: str) -> str:
    # GitHub's heading slug of "Subagent <id>" (ids are [\w-]: nothing else to drop).
    return "subagent-" + re.sub(r"[^a-z0-9_-]", "", agent.lower())


def _item(i: Item, with_thinking: bool, with_tools: bool, agents: set[str]) -> str:
    cut = f"\n\n*[{i.cut} characters cut]*" if i.cut else ""
    if i.kind == "prompt":
        return f"### You{_when(i.time)}\n\n{contained(i.text)}{cut}"
    if i.kind == "answer":
        return f"### Claude{_when(i.time)}\n\n{contained(i.text)}{cut}"
    if i.kind == "thinking":
        return _quoted(f"*Thinking*\n\n{contained(i.text)}{cut}") if with_thinking else ""
    if i.kind == "tool":
        link = f" ([subagent](#{_anchor(i.agent)}))" \
            if i.agent and _anchor(i.agent) in agents else ""
        return f"- **{escape(i.name)}** {code_span(i.text) if i.text else ''}{link}"
    if i.kind in ("result", "injected"):
        if not with_tools:
            return ""
        label = "injected by Claude Code" if i.kind == "injected" else \
            "error" if i.error else "result"
        return f"*{label}:*\n\n{fenced(i.text)}{cut}"
    if i.kind == "compact":
        return f"---\n\n*— {escape(i.text)}{_when(i.time)} —*\n\n---"
    if i.kind == "summary":
        return _quoted(f"**Summary of the earlier conversation**\n\n{contained(i.text)}{cut}")
    if i.kind == "title":
        return f"*Titled: {escape(i.text)}*"
    if i.kind == "command":
        return f"- {code_span(i.text)}{_when(i.time)}"
    return f"*{escape(i.text)}*{cut}"


def _body(t: Transcript, with_thinking: bool, with_tools: bool, agents: set[str]
          ) -> list[str]:
    parts = [_item(i, with_thinking, with_tools, agents) for i in t.items]
    return parts + [f"*{escape(n)}*" for n in t.notes]


def to_markdown(t: Transcript, *, with_thinking: bool = False,
                with_tools: bool = False) -> str:
    """The transcript as Markdown: a title, what it is (session, machine, project…), then
    its turns; tool calls one line each; subagents as sections the calls link to."""
    from syncd.duration import format_time

    rows = [("Session", t.session), ("Machine", t.machine), ("Project", t.cwd),
            ("Branch", t.git_branch), ("Models", ", ".join(t.models) or None),
            ("From", t.first_time), ("To", t.last_time),
            ("As of", format_time(t.at) if t.at is not None else None),
            ("Deleted", format_time(t.deleted_at) if t.deleted_at is not None else None)]
    parts = [f"# {escape(display_title(t))}",
             "\n".join(f"- **{k}:** {code_span(v)}" for k, v in rows if v)]
    agents = {_anchor(sub.agent or "") for sub in t.subagents}
    parts += _body(t, with_thinking, with_tools, agents)
    for sub in t.subagents:
        parts.append(f"## Subagent {escape(sub.agent or '')}")
        if sub.description:
            parts.append(f"*{escape(sub.description)}*")
        parts += _body(sub, with_thinking, with_tools, agents)
    return "\n\n".join(p for p in parts if p) + "\n"

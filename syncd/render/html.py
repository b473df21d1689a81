"""A transcript as HTML: a fragment the web page embeds, and a standalone document.

Every string comes from a transcript, so from a store: untrusted. Markdown is rendered
by markdown-it-py with raw HTML disabled, links only to http(s) (anything else stays
text), images as links (never loaded), code highlighted by Pygments with classes; every
other string is escaped here. The output holds no script, no event attribute and no
style attribute (a page's CSP forbids inline script; classes only), so a hostile
transcript runs nothing in a browser.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from functools import cache
from typing import TYPE_CHECKING

from syncd.render.transcript import Item, Transcript, display_title

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.renderer import RendererHTML
    from markdown_it.token import Token
    from markdown_it.utils import EnvType, OptionsDict

_SAFE_SCHEMES = ("http://", "https://")
# An anchor made of a store's agent id: only what such ids are made of.
_ANCHOR = re.compile(r"[^A-Za-z0-9_-]")
_CODE_CLASS = "hl"
# Pygments' lexers are regular expressions, some quadratic on a crafted block (AutoIt's on
# 8 KiB of spaces: 11 s of CPU, C#'s on 16 KiB of "a\n": 27 s): a block over
# HIGHLIGHT_MAX characters is shown plain, and so is every block once one rendering has
# spent HIGHLIGHT_SECONDS of its thread's CPU highlighting.
HIGHLIGHT_MAX = 4 << 10
HIGHLIGHT_SECONDS = 1.0
_highlight_left: ContextVar[list[float] | None] = ContextVar("highlight_left", default=None)


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _validate_link(url: str) -> bool:
    return url.strip().lower().startswith(_SAFE_SCHEMES)


@cache
def _lexer(name: str) -> object | None:
    """The Pygments lexer of a fence's language (None: none by that name); looked up
    once per name, as a lookup scans every lexer Pygments knows."""
    from pygments.lexers import get_lexer_by_name  # type: ignore[import-untyped]
    from pygments.util import ClassNotFound  # type: ignore[import-untyped]

    try:
        return get_lexer_by_name(name)  # type: ignore[no-any-return]
    except ClassNotFound:
        return None


@cache
def _formatter() -> object:
    from pygments.formatters import HtmlFormatter  # type: ignore[import-untyped]

    return HtmlFormatter(nowrap=True, classprefix="hl-")


def _highlight(code: str, lang: str, attrs: str) -> str:
    # (Pygments ships no type information.)
    from pygments import highlight  # type: ignore[import-untyped]

    left = _highlight_left.get()
    lexer = _lexer(lang.strip().split()[0]) if lang.strip() else None
    if lexer is None or len(code) > HIGHLIGHT_MAX or (left is not None and left[0] <= 0):
        return f'<pre class="{_CODE_CLASS}"><code>{_esc(code)}</code></pre>\n'
    started = time.thread_time()
    body: str = highlight(code, lexer, _formatter())
    if left is not None:
        left[0] -= time.thread_time() - started
    return f'<pre class="{_CODE_CLASS}"><code>{body}</code></pre>\n'


def _image(self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict,
           env: EnvType) -> str:
    """An image as a link to it (a page that loads a store's images would tell a third
    party it is being read)."""
    token = tokens[idx]
    src = str(token.attrGet("src") or "")
    alt = self.renderInlineAsText(token.children or [], options, env) or src
    return (f'<a class="image" href="{_esc(src)}" rel="noopener noreferrer nofollow">'
            f'[image: {_esc(alt)}]</a>')


def _link_open(self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict,
               env: EnvType) -> str:
    tokens[idx].attrSet("rel", "noopener noreferrer nofollow")
    return self.renderToken(tokens, idx, options, env)


@cache
def _md() -> MarkdownIt:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False, "highlight": _highlight}).enable("table")
    md.enable("strikethrough")
    # With raw HTML off these rules match nothing: skip trying them at every line and
    # every "<" (the output is the same).
    md.disable(["html_block", "html_inline"])
    md.validateLink = _validate_link  # type: ignore[method-assign]
    md.add_render_rule("image", _image)
    md.add_render_rule("link_open", _link_open)
    return md


# Text that markdown-it would turn into nothing but paragraphs of itself: no character
# any block or inline rule starts at (escapes, code, emphasis, links, entities, tables,
# "<" and ">"; CR and NUL, which it rewrites), no line opening with a block marker
# (headings, lists, rules, quotes, setext underlines) or whitespace (indented code,
# stripped margins), none ending in whitespace (hard breaks, stripped).
_MD_SPECIAL = re.compile(r"[\\`*_~\[\]<>&|\r\x00]|^(?:[-+=#>]|\d+[.)])", re.MULTILINE)


def _paragraph(lines: list[str]) -> str | None:
    """markdown-it's HTML of ``lines`` (one block, no blank line) when they are a plain
    paragraph (None: they may hold Markdown)."""
    text = "\n".join(lines)
    if _MD_SPECIAL.search(text) or any(line != line.strip() for line in lines):
        return None
    # markdown-it escapes & < > and "; only " can be here.
    return f"<p>{text.replace(chr(34), '&quot;')}</p>\n"


# Link reference definitions are used anywhere in a text: such a text is parsed whole.
_MD_REFERENCE = re.compile(r"\]:")
# A line that may open or close a fence, at its start or in a list item or a quote.
_FENCE_LINE = re.compile(r"```|~~~")
# A fence opened at the left margin is one of the text's top level (no container holds a
# line there that is not a paragraph's); its info string holds no backtick.
_TOP_FENCE = re.compile(r"(`{3,})[^`]*|(~{3,}).*")


def _closes(line: str, fence: tuple[str, int]) -> bool:
    """Whether ``line`` closes a top-level fence of ``fence[1]`` ``fence[0]``s."""
    bare = line.lstrip(" ")
    if len(line) - len(bare) > 3:
        return False
    bare = bare.rstrip(" ")
    return len(bare) >= fence[1] and bare == fence[0] * len(bare)


def markdown_html(text: str) -> str:
    """``text`` (a store's Markdown) as safe HTML.

    A plain paragraph (see ``_MD_SPECIAL``) after a blank line, outside a fence, closes
    whatever came before it (a list, a quote, indented code), so such paragraphs are
    written here and only the runs between them go through markdown-it: the same output
    as parsing it whole (tests/test_render.py compares them), for a part of the work. A
    fence this cannot follow (indented, or an odd info string) sends the rest of the
    text to markdown-it."""
    if _MD_REFERENCE.search(text):
        return _parsed(text)
    out: list[str] = []
    rich: list[str] = []  # lines since the last plain paragraph
    block: list[str] = []  # lines since the last blank line
    fence: tuple[str, int] | None = None  # the top-level fence open
    stuck = False  # a fence not followed: no more plain paragraphs

    def close_block() -> None:
        nonlocal rich
        plain = _paragraph(block) if block else None
        if plain is None:
            rich += block
            return
        if rich:
            out.append(_parsed("\n".join(rich)))
            rich = []
        out.append(plain)

    for line in text.split("\n"):
        if fence is not None or stuck:
            rich.append(line)
            if fence is not None and _closes(line, fence):
                fence = None
            continue
        if _FENCE_LINE.search(line):
            rich += block
            block = []
            rich.append(line)
            top = _TOP_FENCE.fullmatch(line)
            if top is None:
                stuck = True
            else:
                marker = top.group(1) or top.group(2)
                fence = (marker[0], len(marker))
            continue
        if line:
            block.append(line)
            continue
        close_block()
        block = []
        if rich:
            rich.append("")
    close_block()
    if rich:
        out.append(_parsed("\n".join(rich)))
    return "".join(out)


def _parsed(text: str) -> str:
    out: str = _md().render(text)
    return out


def _anchor(agent: str) -> str:
    return "agent-" + _ANCHOR.sub("", agent)[:64]


def _time(when: str | None) -> str:
    if not when:
        return ""
    shown = when[:19].replace("T", " ")
    return f' <time datetime="{_esc(when)}">{_esc(shown)}</time>'


def _item(i: Item, with_thinking: bool, with_tools: bool, agents: set[str]) -> str:
    cut = f'<p class="cut">[{i.cut} characters cut]</p>' if i.cut else ""
    if i.kind == "prompt":
        return (f'<section class="turn prompt"><div class="who">You{_time(i.time)}</div>'
                f'<div class="md">{markdown_html(i.text)}</div>{cut}</section>')
    if i.kind == "answer":
        return (f'<section class="turn answer"><div class="who">Claude{_time(i.time)}</div>'
                f'<div class="md">{markdown_html(i.text)}</div>{cut}</section>')
    if i.kind == "thinking":
        if not with_thinking:
            return ""
        return (f'<details class="thinking"><summary>Thinking</summary>'
                f'<div class="md">{markdown_html(i.text)}</div>{cut}</details>')
    if i.kind == "tool":
        # A link only to a section this page has (the subagent's file may be gone).
        link = f' <a class="agent-link" href="#{_anchor(i.agent)}">subagent</a>' \
            if i.agent and _anchor(i.agent) in agents else ""
        return (f'<div class="tool"><span class="tool-name">{_esc(i.name)}</span> '
                f'<code class="tool-arg">{_esc(i.text)}</code>{link}</div>')
    if i.kind in ("result", "injected"):
        if not with_tools:
            return ""
        label = "injected by Claude Code" if i.kind == "injected" else \
            "error" if i.error else "result"
        klass = "result error" if i.error else i.kind
        return (f'<details class="{klass}"><summary>{label}</summary>'
                f'<pre>{_esc(i.text)}</pre>{cut}</details>')
    if i.kind == "compact":
        return (f'<div class="compact" role="separator"><span>{_esc(i.text)}'
                f'{_time(i.time)}</span></div>')
    if i.kind == "summary":
        return (f'<details class="summary"><summary>Summary of the earlier conversation'
                f'</summary><div class="md">{markdown_html(i.text)}</div>{cut}</details>')
    if i.kind == "title":
        return f'<p class="note title">Titled: {_esc(i.text)}</p>'
    if i.kind == "command":
        return f'<div class="command"><code>{_esc(i.text)}</code>{_time(i.time)}</div>'
    note = "note error" if i.kind == "error" else "note"
    return f'<p class="{note}">{_esc(i.text)}{cut}</p>'


def _meta(t: Transcript) -> str:
    rows = [("session", t.session), ("machine", t.machine), ("project", t.cwd),
            ("branch", t.git_branch), ("models", ", ".join(t.models) or None),
            ("from", t.first_time), ("to", t.last_time)]
    from syncd.duration import format_time

    if t.at is not None:
        rows.append(("as of", format_time(t.at)))
    if t.deleted_at is not None:
        rows.append(("deleted", f"on its machine at {format_time(t.deleted_at)}"))
    cells = "".join(f"<dt>{k}</dt><dd>{_esc(v)}</dd>" for k, v in rows if v)
    return f'<dl class="meta">{cells}</dl>'


# One unit of a rendered transcript: an item or a note, of the session (None) or of a
# subagent; a subagent's heading is its own unit (``None`` as the item).
_Unit = tuple["Transcript | None", "Item | str | None"]


def _units(t: Transcript) -> list[_Unit]:
    units: list[_Unit] = [(None, i) for i in t.items]
    units += [(None, n) for n in t.notes]
    for sub in t.subagents:
        units.append((sub, None))
        units += [(sub, i) for i in sub.items]
        units += [(sub, n) for n in sub.notes]
    return units


def _weight(unit: _Unit) -> int:
    return len(unit[1].text) if isinstance(unit[1], Item) else 100


def _render_units(units: Sequence[_Unit], with_thinking: bool, with_tools: bool,
                  agents: set[str]) -> list[str]:
    parts: list[str] = []
    open_sub: Transcript | None = None
    for owner, what in units:
        if owner is not open_sub:
            if open_sub is not None:
                parts.append("</section>")
            open_sub = owner
            if owner is not None and what is not None:  # a subagent's part, continued
                parts.append('<section class="subagent">')
        if what is None and owner is not None:
            agent = owner.agent or ""
            about = f": {_esc(owner.description)}" if owner.description else ""
            parts.append(f'<section class="subagent" id="{_anchor(agent)}">'
                         f'<h2>Subagent {_esc(agent)}{about}</h2>')
        elif isinstance(what, Item):
            parts.append(_item(what, with_thinking, with_tools, agents))
        elif what is not None:
            parts.append(f'<p class="cut">{_esc(what)}</p>')
    if open_sub is not None:
        parts.append("</section>")
    return parts


def units_of(t: Transcript) -> int:
    """How many units (items, notes, subagents' headings) ``html_fragment`` pages over."""
    return len(_units(t))


def html_fragment(t: Transcript, *, with_thinking: bool = False, with_tools: bool = True,
                  start: int = 0, stop: int | None = None, budget: int | None = None,
                  more: Callable[[int], str] | None = None) -> str:
    """The transcript as an HTML fragment (no ``<html>`` or ``<head>``): classes only, no
    script, every string escaped; subagents as sections the tool calls link to.

    A part of it, for a page that loads a long one piece by piece: its units from
    ``start`` to ``stop``, and past the first no more than ``budget`` characters of
    their text; where it ends before the last unit, ``more(end)`` gives the markup (safe
    HTML) that fetches the rest. A part from ``start`` > 0 is the units alone, to go
    where that markup was."""
    units = _units(t)
    end = len(units) if stop is None else max(start, min(stop, len(units)))
    if budget is not None:
        spent, cut = 0, start
        while cut < end and (cut == start or spent < budget):
            spent += _weight(units[cut])
            cut += 1
        end = cut
    parts: list[str] = []
    if start == 0:
        session = _ANCHOR.sub("", t.session)[:64]
        parts += [f'<article class="transcript" id="session-{session}">',
                  f'<header><h1 class="title">{_esc(display_title(t))}</h1>{_meta(t)}'
                  '</header>']
    agents = {_anchor(sub.agent or "") for sub in t.subagents}
    left = _highlight_left.set([HIGHLIGHT_SECONDS])
    try:
        parts += _render_units(units[start:end], with_thinking, with_tools, agents)
    finally:
        _highlight_left.reset(left)
    if end < len(units) and more is not None:
        parts.append(more(end))
    if start == 0:
        parts.append("</article>")
    return "\n".join(p for p in parts if p)


@cache
def stylesheet() -> str:
    """The CSS of a rendered transcript (light and dark), Pygments' classes included."""
    from pygments.formatters import HtmlFormatter

    light: str = HtmlFormatter(style="default", classprefix="hl-").get_style_defs(
        f".{_CODE_CLASS}")
    dark: str = HtmlFormatter(style="monokai", classprefix="hl-").get_style_defs(
        f".{_CODE_CLASS}")
    return _CSS + light + "\n@media (prefers-color-scheme: dark) {\n" + dark + "\n}\n"


_CSS = """\
:root { color-scheme: light dark; --fg: #1f2328; --bg: #ffffff; --muted: #656d76;
  --line: #d0d7de; --prompt: #eef4ff; --tool: #f6f8fa; --err: #cf222e; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e6edf3; --bg: #0d1117; --muted: #8d96a0; --line: #30363d;
    --prompt: #132339; --tool: #161b22; --err: #ff7b72; } }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; }
.transcript { max-width: 60rem; margin: 0 auto; padding: 1rem 1.5rem 4rem; }
.transcript h1.title { font-size: 1.4rem; margin: .5rem 0; overflow-wrap: anywhere; }
.meta { display: grid; grid-template-columns: max-content 1fr; gap: 0 1rem;
  color: var(--muted); font-size: .85rem; margin: 0 0 1.5rem; }
.meta dt { font-weight: 600; } .meta dd { margin: 0; overflow-wrap: anywhere; }
.turn { margin: 1rem 0; padding: .5rem 1rem; border-radius: 6px; }
.turn.prompt { background: var(--prompt); }
.who { color: var(--muted); font-size: .8rem; font-weight: 600; }
time { font-weight: 400; margin-left: .5rem; }
.md { overflow-wrap: anywhere; } .md pre { overflow-x: auto; }
.md table { border-collapse: collapse; } .md td, .md th { border: 1px solid var(--line);
  padding: .2rem .5rem; }
pre.hl, details pre { padding: .6rem; border-radius: 6px; overflow-x: auto;
  font-size: .85rem; }
details pre { background: var(--tool); white-space: pre-wrap; max-height: 30rem; }
.tool, .command { font-family: ui-monospace, monospace; font-size: .85rem;
  background: var(--tool); padding: .15rem .6rem; margin: .2rem 0; border-radius: 4px;
  white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.tool-name { font-weight: 700; }
details { margin: .3rem 0; } details > summary { color: var(--muted); cursor: pointer;
  font-size: .85rem; }
details.error > summary, .note.error { color: var(--err); }
.compact { display: flex; align-items: center; gap: .8rem; margin: 2rem 0;
  color: var(--muted); font-size: .85rem; }
.compact::before, .compact::after { content: ""; flex: 1; border-top: 3px double var(--line); }
.note, .cut { color: var(--muted); font-size: .85rem; font-style: italic; }
.subagent { border-left: 3px solid var(--line); padding-left: 1rem; margin-top: 3rem; }
.subagent h2 { font-size: 1.1rem; overflow-wrap: anywhere; }
a { color: #0969da; } @media (prefers-color-scheme: dark) { a { color: #4493f8; } }
"""

# Exported files forbid everything but their own stylesheet (a second wall behind the
# escaping: nothing loads, nothing runs).
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; base-uri 'none'; " \
       "form-action 'none'"


def html_document(t: Transcript, *, with_thinking: bool = False,
                  with_tools: bool = True) -> str:
    """A standalone HTML file of the transcript: its CSS in a ``<style>`` element, light
    and dark by ``prefers-color-scheme``, no script at all."""
    title = _esc(display_title(t))
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            '<meta name="color-scheme" content="light dark">\n'
            f"<title>{title}</title>\n<style>\n{stylesheet()}</style>\n</head>\n<body>\n"
            f"{html_fragment(t, with_thinking=with_thinking, with_tools=with_tools)}\n"
            "</body>\n</html>\n")

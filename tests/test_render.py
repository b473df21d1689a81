"""A session rendered for a person (syncd/render/): every record kind Claude Code writes
becomes the item a reader sees, in HTML, Markdown and on a terminal; thinking only when
asked; a hostile transcript (script, event attributes, javascript: links, data: images,
raw HTML, rich markup, escape sequences, fences) stays inert text; its size never decides
memory. The real samples render (skipped when absent)."""

from __future__ import annotations

import io
import json
import os
import shutil
import tracemalloc
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt

from syncd.render import transcript as tr
from syncd.render.html import html_document, html_fragment, markdown_html
from syncd.render.markdown import to_markdown
from syncd.render.text import print_text
from syncd.render.transcript import Transcript, display_title, lines_of, parse, parse_bytes
from tests.helpers import write

SID = "0f8e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b"
CWD = "/home/alice/code/app"


def line(**entry: Any) -> bytes:
    entry.setdefault("sessionId", SID)
    return json.dumps(entry).encode() + b"\n"


def user(content: Any, **more: Any) -> bytes:
    return line(type="user", cwd=CWD, timestamp="2026-11-01T10:00:00.000Z",
                message={"role": "user", "content": content}, **more)


def assistant(*blocks: dict[str, Any], **more: Any) -> bytes:
    return line(type="assistant", cwd=CWD, timestamp="2026-11-01T10:00:05.000Z",
                gitBranch="main", message={"role": "assistant", "model": "claude-opus-4-6",
                                           "content": list(blocks)}, **more)


def tool(name: str, tid: str, **args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tid, "name": name, "input": args}


def result(tid: str, text: str, **more: Any) -> bytes:
    return user([{"type": "tool_result", "tool_use_id": tid, "content": text}], **more)


# Every kind of record 2.1.x writes that a reader sees, and the bookkeeping it does not.
SESSION = b"".join([
    line(type="file-history-snapshot", messageId="x", snapshot={}),
    user("Fix the **parser** please"),
    assistant({"type": "thinking", "thinking": "deep thoughts here", "signature": "s"},
              {"type": "text", "text": "Looking at it:\n\n```python\nx = 1\n```"},
              tool("Bash", "t1", command="pytest -q", description="run tests"),
              tool("Read", "t2", file_path="/home/alice/code/app/p.py"),
              tool("Grep", "t3", pattern="def parse", path="src"),
              tool("WebFetch", "t4", url="https://example.com/doc", prompt="read"),
              tool("Task", "t5", description="explore the code", prompt="look around")),
    result("t1", "3 passed in 0.1s"),
    result("t5", "explored", toolUseResult={"agentId": "a1b2c3"}),
    line(type="progress", data={"type": "hook_progress"}),
    line(type="system", subtype="compact_boundary", content="Conversation compacted",
         timestamp="2026-11-01T11:00:00.000Z",
         compactMetadata={"trigger": "auto", "preTokens": 170251}),
    user("This session is being continued: a summary of the work so far",
         isCompactSummary=True),
    line(type="summary", summary="Parser fixes", leafUuid="u"),
    line(type="custom-title", customTitle="parser work"),
    user("<command-name>/clear</command-name><command-args></command-args>"),
    user("<local-command-stdout>cleared</local-command-stdout>"),
    line(type="assistant", isApiErrorMessage=True, timestamp="2026-11-01T11:00:06.000Z",
         message={"role": "assistant", "model": "<synthetic>",
                  "content": [{"type": "text", "text": "API Error: overloaded"}]}),
    line(type="relocated", relocatedCwd="/home/alice/code/app2"),
    line(type="last-prompt", lastPrompt="x"),
    line(type="queue-operation", operation="enqueue"),
    line(type="system", subtype="turn_duration", durationMs=5),
])
SUBAGENT = b"".join([
    user("look around", isSidechain=True, agentId="a1b2c3"),
    assistant({"type": "text", "text": "found the parser in src/"}, isSidechain=True),
])


def tree(tmp_path: Path, data: bytes = SESSION) -> Path:
    root = tmp_path / "claude"
    folder = "projects/-home-alice-code-app"
    write(root, f"{folder}/{SID}.jsonl", data)
    write(root, f"{folder}/{SID}/subagents/agent-a1b2c3.jsonl", SUBAGENT)
    write(root, f"{folder}/{SID}/subagents/agent-a1b2c3.meta.json",
          json.dumps({"agentType": "Explore", "description": "explore the code"}).encode())
    return root


def local(tmp_path: Path, data: bytes = SESSION) -> Transcript:
    root = tree(tmp_path, data)
    return tr._local(root, SID, f"projects/-home-alice-code-app/{SID}.jsonl".encode(), "m1")


def test_each_record_kind_is_an_item() -> None:
    t = parse_bytes(SESSION, SID)
    kinds = [i.kind for i in t.items]
    assert kinds == ["prompt", "thinking", "answer", "tool", "tool", "tool", "tool", "tool",
                     "result", "result", "compact", "summary", "title", "title", "command",
                     "injected", "error", "note"]
    tools = [(i.name, i.text) for i in t.items if i.kind == "tool"]
    assert tools == [("Bash", "pytest -q"), ("Read", "/home/alice/code/app/p.py"),
                     ("Grep", "def parse"), ("WebFetch", "https://example.com/doc"),
                     ("Task", "explore the code")]
    assert [i.agent for i in t.items if i.kind == "tool"] == [None] * 4 + ["a1b2c3"]
    assert t.title == "parser work" and t.cwd == CWD and t.git_branch == "main"
    assert t.models == ["claude-opus-4-6"]
    assert t.items[10].text == "conversation compacted (auto, 170251 tokens before)"
    assert t.items[14].text == "/clear"
    assert t.first_time == "2026-11-01T10:00:00.000Z"


class Tags(HTMLParser):
    """Every start tag and its attributes, and the text, of an HTML document."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def tags_of(doc: str) -> Tags:
    p = Tags()
    p.feed(doc)
    p.close()
    return p


def classes(doc: str, name: str) -> list[dict[str, str | None]]:
    return [a for _, a in tags_of(doc).tags if name in (a.get("class") or "").split()]


def test_html_renders_turns_tools_subagents_and_the_compact_boundary(tmp_path: Path) -> None:
    doc = html_fragment(local(tmp_path), with_tools=False)
    assert not {t for t, _ in tags_of(doc).tags} & {"html", "head", "body", "style", "script"}
    # (One prompt and one answer are the subagent's.)
    assert len(classes(doc, "prompt")) == 2 and len(classes(doc, "answer")) == 2
    assert len(classes(doc, "tool")) == 5  # one line per call
    assert len(classes(doc, "compact")) == 1 and classes(doc, "compact")[0]["role"] == "separator"
    # The subagent is a section; the call that started it links to it.
    sections = [a for t, a in tags_of(doc).tags if t == "section" and "subagent" in
                (a.get("class") or "")]
    assert [s["id"] for s in sections] == ["agent-a1b2c3"]
    assert [a["href"] for a in classes(doc, "agent-link")] == ["#agent-a1b2c3"]
    assert "found the parser in src/" in doc and "explore the code" in doc
    # Markdown is rendered, code highlighted by class.
    assert "<strong>parser</strong>" in doc and 'class="hl"' in doc and "hl-" in doc
    # Results and what the CLI injected: only with tools.
    assert "3 passed" not in doc and "cleared" not in doc
    with_tools = html_fragment(local(tmp_path / "b"), with_tools=True)
    assert "3 passed" in with_tools and "cleared" in with_tools


def test_thinking_is_hidden_unless_asked(tmp_path: Path) -> None:
    t = local(tmp_path)
    assert "deep thoughts" not in html_fragment(t)
    assert "deep thoughts" in html_fragment(t, with_thinking=True)
    assert "deep thoughts" not in to_markdown(t)
    assert "deep thoughts" in to_markdown(t, with_thinking=True)
    out = io.StringIO()
    print_text(t, _console(out), page=False)
    assert "deep thoughts" not in out.getvalue()
    out = io.StringIO()
    print_text(t, _console(out), with_thinking=True, page=False)
    assert "deep thoughts" in out.getvalue()


def test_markdown_has_every_part(tmp_path: Path) -> None:
    md = to_markdown(local(tmp_path), with_tools=True)
    assert md.startswith("# parser work\n")
    assert "- **Bash** `pytest -q`" in md
    assert "- **Task** `explore the code` ([subagent](#subagent-a1b2c3))" in md
    assert "\n## Subagent a1b2c3\n" in md and "found the parser in src/" in md
    assert "\n---\n\n*— conversation compacted (auto, 170251 tokens before)" in md
    assert "Fix the **parser** please" in md  # Markdown kept as Markdown
    assert "```\n3 passed in 0.1s\n```" in md
    assert "3 passed" not in to_markdown(local(tmp_path / "b"))


# -- hostile transcripts ------------------------------------------------------------------

XSS = [
    "<script>window.__pwned = 1</script>",
    "<img src=x onerror=window.__pwned=1>",
    "[click](javascript:window.__pwned=1)",
    "[click](JaVaScRiPt:window.__pwned=1)",
    "[click]( javascript:alert(1) )",
    "[click](&#106;avascript:alert(1))",
    "<javascript:alert(1)>",
    "![pic](data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+)",
    "![pic](https://evil.example/track.png)",
    "[ref]\n\n[ref]: javascript:alert(1)",
    '<a href="javascript:alert(1)">x</a>',
    "<iframe src=https://evil.example></iframe>",
    '<svg onload="window.__pwned=1"></svg>',
    "```\"><script>window.__pwned=1</script>\nx\n```",
    '<div style="background:url(javascript:alert(1))">x</div>',
    "<!-- an unclosed comment",
]


def hostile_session() -> bytes:
    text = "\n\n".join(XSS)
    return b"".join([
        line(type="custom-title", customTitle="<img src=x onerror=window.__pwned=1>"),
        user(text),
        assistant({"type": "text", "text": text},
                  {"type": "thinking", "thinking": text},
                  tool("<script>x</script>", "t\"><script>", command=text)),
        result("t\"><script>", text, toolUseResult={"agentId": '"><script>x</script>'}),
        user(text, isCompactSummary=True),
        line(type="system", subtype="compact_boundary",
             compactMetadata={"trigger": "<script>x</script>"}),
        line(type="relocated", relocatedCwd="<script>x</script>"),
    ])


def assert_inert(doc: str) -> None:
    """No script, no event handler, no style attribute, no link or source but http(s) or
    the page's own anchors, nothing embedded."""
    p = tags_of(doc)
    for tag, attrs in p.tags:
        assert tag not in ("script", "iframe", "object", "embed", "img", "svg", "base",
                           "form", "meta", "link") or (tag == "meta" and attrs.get(
                               "http-equiv") in ("Content-Security-Policy", None)), tag
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            assert name != "style", tag
            if name in ("href", "src", "action", "formaction", "srcset", "xlink:href"):
                assert value is not None and value.startswith(("http://", "https://", "#")), \
                    (tag, name, value)


def test_hostile_html_is_inert_and_shown_as_text(tmp_path: Path) -> None:
    t = local(tmp_path, hostile_session())
    for doc in (html_fragment(t, with_thinking=True, with_tools=True),
                html_document(t, with_thinking=True, with_tools=True)):
        assert_inert(doc)
        text = "".join(tags_of(doc).text)
        assert "<script>window.__pwned = 1</script>" in text  # shown, as text
        assert "<img src=x onerror=window.__pwned=1>" in text
    # The data: image is no image and no link; the https one a link, never loaded.
    doc = markdown_html("![pic](data:image/png;base64,AAAA) ![pic](https://e.example/p.png)")
    assert [a.get("href") for _, a in tags_of(doc).tags if _ == "a"] == \
        ["https://e.example/p.png"]


def test_a_hostile_transcript_runs_nothing_in_a_browser(tmp_path: Path) -> None:
    """The standalone file in a real browser: no script of the transcript runs."""
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        pytest.skip("no chromium on this machine (Debian's chromium package)")
    sync_api = pytest.importorskip("playwright.sync_api")
    doc = tmp_path / "s.html"
    doc.write_text(html_document(local(tmp_path, hostile_session()), with_thinking=True,
                                 with_tools=True))
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=args)
        try:
            page = browser.new_page()
            page.goto(doc.as_uri())
            page.wait_for_load_state("load")
            for a in page.query_selector_all("a"):  # a click follows nothing hostile
                assert (a.get_attribute("href") or "").startswith(("http", "#"))
            assert page.evaluate("() => window.__pwned") is None
            assert page.evaluate("() => document.scripts.length") == 0
            assert "<script>window.__pwned = 1</script>" in page.inner_text("body")
            page.screenshot(path=str(tmp_path / "hostile.png"))
        finally:
            browser.close()


def md_tokens(md: str) -> list[Any]:
    return MarkdownIt("commonmark", {"html": True}).parse(md)


def test_markdown_cannot_be_broken_by_a_transcript() -> None:
    """An answer leaving a fence open, a result full of backtick runs, raw HTML, an
    unclosed comment: each stays inside its own turn; the turns after still are."""
    data = b"".join([
        user("first <!-- hides everything after it in a viewer"),
        assistant({"type": "text", "text": "look:\n```python\nnever closed"},
                  tool("Bash", "t1", command="echo ``` `` ````")),
        result("t1", "````\n```\n# not a heading\n`````"),
        assistant({"type": "text", "text": "<script>alert(1)</script> and <b>bold</b>"}),
        user("last prompt"),
    ])
    md = to_markdown(parse_bytes(data, SID), with_tools=True)
    tokens = md_tokens(md)
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings[1:] == ["You · 2026-11-01 10:00:00", "Claude · 2026-11-01 10:00:05",
                            "Claude · 2026-11-01 10:00:05", "You · 2026-11-01 10:00:00"]
    assert not [t for t in tokens if t.type == "html_block"]
    inline = [c for t in tokens for c in (t.children or []) if c.type == "html_inline"]
    assert inline == []
    # The tool's command is one code span, whole.
    spans = [c.content for t in tokens for c in (t.children or []) if c.type == "code_inline"]
    assert "echo ``` `` ````" in spans
    fences = [t.content for t in tokens if t.type == "fence"]
    assert "````\n```\n# not a heading\n`````\n" in fences
    assert "never closed\n" in fences


def _console(out: io.StringIO) -> Any:
    from rich.console import Console

    return Console(file=out, force_terminal=True, width=100, color_system="truecolor")


def test_the_terminal_gets_no_markup_and_no_escape_sequences() -> None:
    data = b"".join([
        line(type="custom-title", customTitle="[bold red]title[/bold red]\x1b]0;pwned\x07"),
        user("[bold]not bold[/bold] and \x1b[31mred\x1b[0m and \x1b]8;;http://e\x1b\\link"),
        assistant({"type": "text", "text": "[link=https://e.example]x[/link] \x9b31m"},
                  tool("Bash[/]", "t", command="rm -rf [red]x\x1b[2J")),
    ])
    out = io.StringIO()
    print_text(parse_bytes(data, SID), _console(out), page=False)
    got = out.getvalue()
    assert "[bold]not bold[/bold]" in got and "[bold red]title[/bold red]" in got
    assert "[link=https://e.example]x[/link]" in got and "[red]x" in got
    for evil in ("\x1b[31mred", "\x1b]0;pwned", "\x1b]8;;http://e", "\x1b[2J", "\x9b", "\x07"):
        assert evil not in got, evil
    assert "?[31mred" in got


def test_a_terminal_pages_through_the_pager(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGER", f"cat > {tmp_path / 'paged'}")
    monkeypatch.setenv("LESS", "")  # (so that the test leaves it as it was)
    monkeypatch.delenv("LESS")
    out = io.StringIO()
    print_text(parse_bytes(user("a prompt to page"), SID), _console(out))  # a terminal
    paged = (tmp_path / "paged").read_text()
    assert out.getvalue() == "" and "a prompt to page" in paged and "\x1b[" in paged
    assert os.environ["LESS"] == "FRX"  # less shows the colours


def test_the_pager_gets_the_session_as_it_is_laid_out(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    from syncd.render import text

    t = parse_bytes(b"".join(user(f"prompt {n} " + "words " * 50) for n in range(2000)), SID)
    laid: list[int] = []
    whole = text.renderables

    def counted(*args: Any, **kw: Any) -> Any:
        for r in whole(*args, **kw):
            laid.append(1)
            yield r

    monkeypatch.setattr(text, "renderables", counted)
    # A reader who quits after the first screens: the rest is never laid out.
    monkeypatch.setenv("PAGER", f"head -c 20000 > {tmp_path / 'seen'}")
    print_text(t, _console(io.StringIO()))
    assert (tmp_path / "seen").stat().st_size == 20000
    assert 0 < len(laid) < 1000  # of 2000 prompts and the title's lines


# -- bounds -------------------------------------------------------------------------------

def test_a_huge_line_is_one_item_and_never_held(tmp_path: Path) -> None:
    huge = b'{"type":"user","message":{"content":"' + b"x" * (48 << 20) + b'"}}\n'
    path = tmp_path / "t.jsonl"
    path.write_bytes(user("before") + huge + user("after"))
    del huge
    tracemalloc.start()
    try:
        t = parse(lines_of(tr._read_local(path)), SID)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [i.text for i in t.items] == ["before", f"[line too long: {(48 << 20) + 40} bytes]",
                                         "after"]
    assert peak < 8 << 20, peak  # a few chunks, not the line


def test_long_items_are_cut_and_say_so() -> None:
    t = parse_bytes(assistant({"type": "text", "text": "y" * (tr.TEXT_MAX + 500)}), SID)
    [item] = t.items
    assert len(item.text) == tr.TEXT_MAX and item.cut == 500
    assert "[500 characters cut]" in html_fragment(t)
    assert "500 characters cut" in to_markdown(t)
    assert t.notes == ["500 characters cut from long items"]


def test_items_stop_at_the_limit_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tr, "ITEMS_MAX", 10)
    t = parse_bytes(b"".join(user(f"prompt {n}") for n in range(25)), SID)
    assert [i.text for i in t.items] == [f"prompt {n}" for n in range(10)]
    assert t.notes and t.notes[0].startswith("15 more lines not shown")


def test_the_budget_is_shared_with_subagents(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tr, "ITEMS_MAX", 3)
    t = local(tmp_path)
    assert len(t.items) + sum(len(s.items) for s in t.subagents) == 3


def test_lines_of_splits_across_chunks_and_keeps_a_torn_last_line() -> None:
    chunks = [b'{"a":', b'1}\n{"b"', b":2}\n", b"\n", b'{"torn"']
    assert list(lines_of(chunks)) == [b'{"a":1}', b'{"b":2}', b"", b'{"torn"']


def test_a_deleted_session_shows_from_its_backup_and_says_so(tmp_path: Path) -> None:
    """What that session said before it was lost: its bytes are still in the backup."""
    from syncd.repository import Repository
    from syncd.store.memory import MemoryStore
    from syncd.view import load_backup
    from tests.helpers import shipper

    store, rel = MemoryStore(), f"projects/-home-alice-code-app/{SID}.jsonl"
    root = tree(tmp_path)
    ship = shipper(root, store, tmp_path / "s.db", machine="desk")
    agent = f"projects/-home-alice-code-app/{SID}/subagents/agent-a1b2c3.jsonl"
    ship.ship([rel.encode(), agent.encode()])
    (root / rel).unlink()
    (root / agent).unlink()
    ship.ship([rel.encode(), agent.encode()])
    repo = Repository(store, "desk")
    b = load_backup(repo, sessions=[SID])
    s = b.find_session(SID)
    assert s is not None and s.deleted_at is not None
    t = tr._from_backup(repo, b, s, None)
    assert t.deleted_at == s.deleted_at and t.machine == "desk"
    assert [i.kind for i in t.items] == [i.kind for i in parse_bytes(SESSION, SID).items]
    assert [sub.agent for sub in t.subagents] == ["a1b2c3"]
    assert "<dt>deleted</dt>" in html_fragment(t) and "- **Deleted:**" in to_markdown(t)


# -- the real samples ---------------------------------------------------------------------

def test_the_real_samples_render(samples: Path) -> None:
    found = sorted(samples.glob("*/projects/*/*.jsonl"))
    assert len(found) >= 3
    for path in found:
        root = path.parents[2]
        t = tr._local(root, path.stem, str(path.relative_to(root)).encode(), "m1")
        assert sum(i.kind == "prompt" for i in t.items) >= 1
        assert sum(i.kind == "tool" for i in t.items) >= 50
        raw = path.read_bytes()
        assert sum(i.kind == "compact" for i in t.items) == raw.count(b'"compact_boundary"')
        doc = html_document(t, with_thinking=True, with_tools=True)
        assert_inert(doc)
        md = to_markdown(t, with_thinking=True, with_tools=True)
        assert not [x for x in md_tokens(md) if x.type == "html_block"]
        out = io.StringIO()
        print_text(t, _console(out), with_thinking=True, with_tools=True, page=False)
        assert len(out.getvalue()) > 10_000
        if path.stem.startswith("4d5611e5"):
            assert sorted(s.agent or "" for s in t.subagents) == ["a2898e3", "acompact-e1f845"]
            # The Task call that started the first links to its section.
            assert [a["href"] for a in classes(doc, "agent-link")] == ["#agent-a2898e3"]


def test_a_summary_record_is_a_title_not_a_compact_summary() -> None:
    # {"type":"summary","leafUuid":…} is the title Claude gave a branch (the one its
    # picker and `syncd sessions` show), not the summary of a compacted conversation.
    data = b"".join([user("```"), line(type="summary", summary="Charm with Traefik", leafUuid="u"),
                     line(type="summary", summary="Rock build with uv", leafUuid="v"),
                     assistant({"type": "text", "text": "ok"})])
    t = parse_bytes(data, SID)
    assert [(i.kind, i.text) for i in t.items if i.kind in ("summary", "title")] == [
        ("title", "Charm with Traefik"), ("title", "Rock build with uv")]
    assert display_title(t) == "Rock build with uv"  # the last, as the catalog takes it
    assert "Summary of the earlier" not in html_fragment(t)
    # A last prompt record comes before a summary, an AI title before both, as in the list.
    t = parse_bytes(data + line(type="last-prompt", lastPrompt="fix the rock"), SID)
    assert display_title(t) == "fix the rock"
    # What the CLI injected is no prompt of the user's: the last real one stays.
    t = parse_bytes(data + line(type="last-prompt", lastPrompt="fix the rock") + line(
        type="last-prompt", lastPrompt="<task-notification> <task-id>a1</task-id>"), SID)
    assert display_title(t) == "fix the rock"
    t = parse_bytes(data + line(type="ai-title", aiTitle="one") + line(type="ai-title",
                                                                       aiTitle="two"), SID)
    assert display_title(t) == "two"
    custom = data + line(type="custom-title", customTitle="mine") + line(type="ai-title",
                                                                         aiTitle="two")
    assert display_title(parse_bytes(custom, SID)) == "mine"


# -- the same output, for less work ----------------------------------------------------------

def _whole(text: str) -> str:
    """markdown-it's HTML of the whole text (what markdown_html gave before it wrote plain
    paragraphs itself)."""
    from syncd.render.html import _md

    out: str = _md().render(text)
    return out


# Lines that open, close or continue every block markdown-it knows, and plain ones.
_MD_LINES = [
    "- a", "* b", "+ c", "1. one", "2) two", "   - nested", "  cont", "    code", "\tcode",
    "> quote", ">", "plain words", "other plain", "# h", "===", "---", "***", "`x`",
    "**b**", "_e_", "", "", "", "  ", "| a | b |", "|---|---|", "[x]: http://a", "[x]",
    "```py", "```", "~~~", 'say "q"', "text  ", "a\u00a0", "<b>", "&amp;", "x\\",
    "2024 was", "~~s~~", "1.5 percent", "- [ ] task", "    ", "Title", "a | b", "````",
    "  ```", "    ```", "- ```", "> ```", "```a`b", "~~~~ x`", "``` ", "\t```", " ~~~",
    "```js", "1. ```", "   ```", "- > a", "  - b", "\\```", "a\rb", "nul\x00", "\u2003x",
]


def test_markdown_html_is_markdown_its_output_of_the_whole_text() -> None:
    import random

    rnd = random.Random(27)
    plain = 0
    for _ in range(5_000):
        text = "\n".join(rnd.choice(_MD_LINES) for _ in range(rnd.randrange(0, 14)))
        text += "\n" * rnd.randrange(0, 2)
        assert markdown_html(text) == _whole(text), text
        plain += markdown_html(text) != "" and "<p>" in markdown_html(text)
    assert plain > 250


def test_the_real_samples_markdown_is_the_same_as_parsed_whole(samples: Path) -> None:
    texts = 0
    for path in sorted(samples.glob("*/projects/*/*.jsonl")):
        root = path.parents[2]
        t = tr._local(root, path.stem, str(path.relative_to(root)).encode(), "m1")
        for x in [t, *t.subagents]:
            for i in x.items:
                if i.kind in ("prompt", "answer", "thinking", "summary"):
                    assert markdown_html(i.text) == _whole(i.text)
                    texts += 1
    assert texts > 100


def _old_fragment(t: Transcript) -> str:
    """html_fragment as it was before it rendered parts: the reference."""
    from syncd.render.html import _ANCHOR, _anchor, _esc, _item, _meta, display_title

    def body(x: Transcript) -> list[str]:
        parts = [_item(i, True, True, agents) for i in x.items]
        return parts + [f'<p class="cut">{_esc(n)}</p>' for n in x.notes]

    agents = {_anchor(sub.agent or "") for sub in t.subagents}
    parts = [f'<article class="transcript" id="session-{_ANCHOR.sub("", t.session)[:64]}">',
             f'<header><h1 class="title">{_esc(display_title(t))}</h1>{_meta(t)}</header>']
    parts += body(t)
    for sub in t.subagents:
        about = f": {_esc(sub.description)}" if sub.description else ""
        parts.append(f'<section class="subagent" id="{_anchor(sub.agent or "")}">'
                     f'<h2>Subagent {_esc(sub.agent or "")}{about}</h2>')
        parts += body(sub)
        parts.append("</section>")
    parts.append("</article>")
    return "\n".join(p for p in parts if p)


def test_the_real_samples_fragment_is_the_same_as_before(samples: Path) -> None:
    for path in sorted(samples.glob("*/projects/*/*.jsonl")):
        root = path.parents[2]
        t = tr._local(root, path.stem, str(path.relative_to(root)).encode(), "m1")
        assert html_fragment(t, with_thinking=True) == _old_fragment(t)


def test_a_fragment_in_parts_holds_every_item_once() -> None:
    from syncd.render.html import units_of

    data = SESSION + b"".join(user(f"prompt number {n} " + "words " * 200) for n in range(40))
    t = parse_bytes(data, SID)
    t.subagents = [parse_bytes(b"".join(user(f"asked {n}") for n in range(30)), SID,
                               agent="a1b2c3", description="look around")]
    assert units_of(t) > 70
    assert html_fragment(t, with_thinking=True) == _old_fragment(t)
    ends: list[int] = []

    def more(end: int) -> str:
        ends.append(end)
        return f'<p class="more" data-from="{end}"></p>'

    first = html_fragment(t, budget=5000, more=more)
    assert first.startswith("<article") and first.endswith("</article>")
    assert ends and ends[-1] < units_of(t) and "prompt number 39" not in first
    seen = [first]
    while ends[-1] < units_of(t):
        start = ends[-1]
        part = html_fragment(t, start=start, budget=5000, more=more)
        assert not part.startswith("<article") and part.count("<section") == \
            part.count("</section>")
        seen.append(part)
        if ends[-1] == start:
            break
    text = "".join(seen)
    for n in range(40):
        assert text.count(f"prompt number {n} ") == 1
    for n in range(30):
        assert text.count(f"asked {n}<") == 1
    # The subagent's section: its heading once, in whichever part holds it.
    assert text.count('id="agent-a1b2c3"') == 1
    # A live reload of what the page shows: the units before the first part's end.
    assert html_fragment(t, stop=ends[0], more=more) == first

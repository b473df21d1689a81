"""Attacks on ``syncd show``'s exports by someone who writes a transcript (a followed
machine, a shared bucket, a tool's output quoted in an answer): the Markdown file, read in
a viewer that renders raw HTML and follows links as written (many do), runs nothing and
loads nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from syncd.render.markdown import to_markdown
from syncd.render.transcript import parse_bytes

SID = "0f8e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b"


def answer(text: str) -> bytes:
    return json.dumps({"type": "assistant", "timestamp": "2026-11-01T10:00:05Z", "message": {
        "role": "assistant", "content": [{"type": "text", "text": text}]}}).encode() + b"\n"


def viewer_tokens(md: str) -> list[Any]:
    """The inline tokens a permissive viewer makes of ``md``: raw HTML on, every link
    followed as written."""
    from markdown_it import MarkdownIt

    viewer = MarkdownIt("commonmark", {"html": True})
    viewer.validateLink = lambda url: True  # type: ignore[method-assign]
    tokens = viewer.parse(md)
    return [*tokens, *(c for t in tokens for c in (t.children or []))]


HOSTILE = [
    # An escape of the transcript's own before what the export escapes.
    r"\<img src=x onerror=alert(1)>",
    r"\\<img src=x onerror=alert(1)>",
    "[click](javascript:alert(1))",
    r"[click\\](javascript:alert(1))",
    "[click]( JaVaScRiPt:alert(1))",
    "[click](java&#115;cript:alert(1))",
    "[click](data:text/html,<script>alert(1)</script>)",
    "[click](\njavascript:alert(1))",
    "[ref]\n\n[ref]: javascript:alert(1)",
    "[ref]\n\n[ref]:\n  vbscript:alert(1)",
    "![pixel](https://evil.example/pixel.png)",
    r"\\![pixel](https://evil.example/pixel.png)",
    "![pixel][p]\n\n[p]: https://evil.example/pixel.png",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_markdown_export_holds_no_raw_html_script_link_or_image(text: str) -> None:
    md = to_markdown(parse_bytes(answer(text), SID))
    tokens = viewer_tokens(md)
    assert not [t for t in tokens if t.type in ("html_inline", "html_block", "image")], md
    hrefs = [str(t.attrGet("href")) for t in tokens if t.type == "link_open"]
    assert all(h.startswith(("http://", "https://", "#")) for h in hrefs), (hrefs, md)


def test_http_links_stay_links() -> None:
    md = to_markdown(parse_bytes(answer("see [the docs](https://example.com/a_b) and "
                                        "[here](#subagent-x)"), SID))
    hrefs = [t.attrGet("href") for t in viewer_tokens(md) if t.type == "link_open"]
    assert hrefs == ["https://example.com/a_b", "#subagent-x"]


def test_code_blocks_crafted_for_a_slow_lexer_cost_a_bounded_time() -> None:
    # Pygments' AutoIt lexer is quadratic on spaces (8 KiB: ~11 s). One big block, then
    # many a little under the size limit: highlighting stops at the rendering's budget.
    import time

    from syncd.render.html import html_fragment

    big = answer("```autoit\n" + " " * (12 << 10) + "\n```")
    many = b"".join(answer("```autoit\n" + " " * 2000 + f"x{i}\n```") for i in range(30))
    small = answer("```python\nprint('still highlighted')\n```")
    t = parse_bytes(small + big + many, SID)
    started = time.thread_time()
    out = html_fragment(t)
    assert time.thread_time() - started < 6.0
    assert "hl-" in out.split("still highlighted")[0]  # the small block first, highlighted
    assert out.count("<pre") == 32


def test_the_terminal_highlights_within_the_same_bounds() -> None:
    import io
    import time

    from rich.console import Console

    from syncd.render.text import print_text

    big = answer("```autoit\n" + " " * (12 << 10) + "\n```")
    many = b"".join(answer("```autoit\n" + " " * 2000 + f"x{i}\n```") for i in range(30))
    t = parse_bytes(answer("```python\nprint('still highlighted')\n```") + big + many, SID)
    out = io.StringIO()
    started = time.thread_time()
    print_text(t, Console(file=out, force_terminal=True, width=100), page=False)
    assert time.thread_time() - started < 6.0
    assert "x29" in out.getvalue() and "\x1b[" in out.getvalue().split("highlighted")[0]

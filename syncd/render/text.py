"""A transcript on a terminal, through rich: prompts and answers as rich Markdown, the
rest as plain ``Text``. A store's string is never rich markup (``[bold]`` in a
transcript prints as typed: rich's Markdown parses Markdown, ``Text`` parses nothing),
and its control characters and escape sequences are neutralised before rich sees them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from contextvars import ContextVar
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

from syncd.render.html import HIGHLIGHT_MAX, HIGHLIGHT_SECONDS
from syncd.render.transcript import Item, Transcript, display_title, readable

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.text import Text

# Lines of a tool result shown (with --with-tools): the rest is counted.
RESULT_LINES = 20


def _text(text: str, style: str = "") -> Text:
    from rich.text import Text

    return Text(readable(text), style=style)


# CPU seconds the printing of one transcript may still spend highlighting code (as the
# HTML's: some Pygments lexers are quadratic on a crafted block).
_highlight_left: ContextVar[list[float] | None] = ContextVar("highlight_left", default=None)


@cache
def _markdown_class() -> Any:
    from rich.markdown import CodeBlock, Markdown, MarkdownElement

    class BoundedCodeBlock(CodeBlock):
        """A code block highlighted up to HIGHLIGHT_MAX characters, within the budget."""

        def __rich_console__(self, console: Any, options: Any) -> Any:
            left = _highlight_left.get()
            if len(self.text) > HIGHLIGHT_MAX or (left is not None and left[0] <= 0):
                self.lexer_name = "text"
            started = time.thread_time()
            yield from super().__rich_console__(console, options)  # rendered as it goes
            if left is not None and self.lexer_name != "text":
                left[0] -= time.thread_time() - started

    class BoundedMarkdown(Markdown):
        elements: ClassVar[dict[str, type[MarkdownElement]]] = {
            **Markdown.elements, "fence": BoundedCodeBlock, "code_block": BoundedCodeBlock}

    return BoundedMarkdown


def _markdown(text: str, style: str = "") -> RenderableType:
    # Links shown as text, not as terminal hyperlinks (a store's URL is not followed).
    markdown: RenderableType = _markdown_class()(readable(text), style=style or "none",
                                                 hyperlinks=False)
    return markdown


def _header(who: str, time: str | None, style: str) -> RenderableType:
    from rich.text import Text

    line = Text(who, style=style)
    if time:
        line.append("  " + readable(time[:19].replace("T", " ")), style="dim")
    return line


def _result(i: Item) -> RenderableType:
    from rich.padding import Padding

    lines = readable(i.text).split("\n")
    more = len(lines) - RESULT_LINES
    shown = "\n".join(lines[:RESULT_LINES]) + (f"\n… {more} more lines" if more > 0 else "")
    label = "injected by Claude Code" if i.kind == "injected" else \
        "error" if i.error else "result"
    return Padding(_text(f"{label}: {shown}", "red" if i.error else "dim"), (0, 0, 0, 4))


def _item(i: Item, with_thinking: bool, with_tools: bool) -> Iterator[RenderableType]:
    from rich.padding import Padding
    from rich.rule import Rule
    from rich.text import Text

    cut = [_text(f"[{i.cut} characters cut]", "dim italic")] if i.cut else []
    if i.kind == "prompt":
        yield Text("")
        yield _header("You", i.time, "bold cyan")
        yield _markdown(i.text)
        yield from cut
    elif i.kind == "answer":
        yield Text("")
        yield _header("Claude", i.time, "bold magenta")
        yield _markdown(i.text)
        yield from cut
    elif i.kind == "thinking":
        if with_thinking:
            yield Padding(_markdown(i.text, "dim italic"), (0, 0, 0, 2))
            yield from cut
    elif i.kind == "tool":
        line = Text("  ● ", style="dim")
        line.append(readable(i.name), style="bold yellow")
        line.append(" " + readable(i.text))
        if i.agent:
            line.append(f"  → subagent {readable(i.agent)}", style="dim")
        line.no_wrap, line.overflow = True, "ellipsis"
        yield line
    elif i.kind in ("result", "injected"):
        if with_tools:
            yield _result(i)
    elif i.kind == "compact":
        yield Rule(Text(readable(i.text), style="bold"), characters="═", style="yellow")
    elif i.kind == "summary":
        yield Padding(_markdown("**Summary of the earlier conversation**\n\n" + i.text,
                                "dim"), (0, 0, 0, 2))
    elif i.kind == "title":
        yield _text(f"titled: {i.text}", "italic")
    elif i.kind == "command":
        yield _text(f"  $ {i.text}", "bold")
    else:
        yield _text(i.text, "red" if i.kind == "error" else "dim italic")


def _body(t: Transcript, with_thinking: bool, with_tools: bool) -> Iterator[RenderableType]:
    for i in t.items:
        yield from _item(i, with_thinking, with_tools)
    for note in t.notes:
        yield _text(note, "dim italic")


def renderables(t: Transcript, *, with_thinking: bool = False,
                with_tools: bool = False) -> Iterator[RenderableType]:
    """What a console prints of the transcript, in order."""
    from rich.rule import Rule
    from rich.text import Text

    from syncd.duration import format_time

    yield _text(display_title(t), "bold")
    when = {"as of": format_time(t.at) if t.at is not None else "",
            "deleted": format_time(t.deleted_at) if t.deleted_at is not None else ""}
    for label, value in (("session", t.session), ("machine", t.machine),
                         ("project", t.cwd), ("branch", t.git_branch),
                         ("models", ", ".join(t.models)), ("from", t.first_time),
                         ("to", t.last_time), *when.items()):
        if value:
            line = Text(f"{label}: ", style="dim")
            line.append(readable(value))
            yield line
    yield from _body(t, with_thinking, with_tools)
    for sub in t.subagents:
        title = f"subagent {sub.agent or ''}" + (f": {sub.description}" if sub.description
                                                 else "")
        yield Text("")
        yield Rule(_text(title, "bold"), style="blue")
        yield from _body(sub, with_thinking, with_tools)


def print_text(t: Transcript, console: Console | None = None, *, with_thinking: bool = False,
               with_tools: bool = False, page: bool | None = None) -> None:
    """Print the transcript; paged when ``page``, by default when the console is a
    terminal."""
    from rich.console import Console

    console = console or Console()
    page = console.is_terminal if page is None else page
    items = renderables(t, with_thinking=with_thinking, with_tools=with_tools)
    budget = _highlight_left.set([HIGHLIGHT_SECONDS])
    try:
        if page:
            _paged(console, items)
        else:
            for r in items:
                console.print(r)
    finally:
        _highlight_left.reset(budget)


def _paged(console: Console, items: Iterator[RenderableType]) -> None:
    """``items`` streamed into ``$PAGER`` (else ``less``) as they are laid out: the pager
    opens on the first screen (rich's own pager lays the whole session out first), and
    a reader who quits early stops the layout."""
    import subprocess

    from rich.console import Console

    # less shows colours only with -R; as git does, when the user set no options.
    os.environ.setdefault("LESS", "FRX")
    command = os.environ.get("PAGER", "").strip() or "less"
    try:
        # The user's own setting, a shell command as pydoc and git run it.
        proc = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE,
                                text=True, encoding="utf-8", errors="replace")
    except OSError:
        for r in items:
            console.print(r)
        return
    assert proc.stdin is not None

    class Piped(Console):
        def on_broken_pipe(self) -> None:
            # (rich's own exits the process.)
            raise BrokenPipeError

    # (color_system reads back as one of the names it is set by.)
    out = Piped(file=proc.stdin, force_terminal=True,
                color_system=console.color_system,  # type: ignore[arg-type]
                width=console.width, height=console.height, soft_wrap=console.soft_wrap)
    try:
        for r in items:
            out.print(r)
            if proc.poll() is not None:  # the reader quit
                break
    except BrokenPipeError:
        pass  # the reader quit
    finally:
        with contextlib.suppress(BrokenPipeError, OSError):
            proc.stdin.close()
        while True:
            try:
                proc.wait()
                break
            except KeyboardInterrupt:  # as pydoc's pager: Ctrl-C is for the pager
                continue

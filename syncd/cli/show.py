"""``syncd show``: one session as a person reads it, from the local tree or any
machine's backup as of any point."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from syncd.cli.util import repository_of, session_prefix, settings_of, source_option, time_option
from syncd.errors import UsageError

# What it needs is imported inside it (see syncd.cli.main): its --help loads click alone.


@click.command(short_help="Show a session: prompts, answers and tool calls, from the local "
                          "tree or any machine's backup as of any time.")
@click.argument("session", callback=session_prefix)
@click.option("--machine", default=None,
              help="The machine whose backup to read (default: the local tree, else this "
                   "machine's backup, else the one machine holding the session).")
@click.option("--at", default=None, callback=time_option,
              help="As of this time (from the backup): ISO 8601 or a duration ago (2h, 3d).")
@click.option("--format", "fmt", type=click.Choice(["text", "md", "html"]), default="text",
              help="text: for the terminal (paged); md, html: a file that reads on its own.")
@click.option("--with-thinking", is_flag=True, help="Also show thinking blocks.")
@click.option("--with-tools", is_flag=True,
              help="Also show tool results and what Claude Code injected (collapsed in html).")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write md or html to this file (default: stdout).")
@source_option
@click.pass_context
def show(ctx: click.Context, session: str, machine: str | None, at: float | None, fmt: str,
         with_thinking: bool, with_tools: bool, output: Path | None) -> None:
    """Show one session as a person reads it: prompts and answers as Markdown, each tool
    call on one line (its name and key argument), subagents as sections, compact
    boundaries marked.

    From the local tree, or (--machine, --at, or a session not here) straight from a
    machine's backup as of a point in time: nothing is written locally.
    """
    from syncd.render.transcript import load_transcript

    if output is not None and fmt == "text":
        raise UsageError("-o/--output: only with --format md or html")
    settings = settings_of(ctx)
    t = load_transcript(settings, session, machine=machine, at=at,
                        repository=lambda: repository_of(settings))
    if fmt == "text":
        from syncd.render.text import print_text

        print_text(t, with_thinking=with_thinking, with_tools=with_tools)
        return
    if fmt == "md":
        from syncd.render.markdown import to_markdown

        doc = to_markdown(t, with_thinking=with_thinking, with_tools=with_tools)
    else:
        from syncd.render.html import html_document

        doc = html_document(t, with_thinking=with_thinking, with_tools=with_tools)
    if output is None:
        sys.stdout.write(doc)
        sys.stdout.flush()
    else:
        output.write_text(doc, encoding="utf-8")
        click.echo(f"syncd: wrote {output}", err=True)


COMMANDS = (show,)

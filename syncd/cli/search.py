"""``syncd search``: full-text search over the sessions indexed here."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from syncd.cli.util import settings_of

if TYPE_CHECKING:
    from syncd.config import Settings
    from syncd.search.index import SearchIndex
    from syncd.search.query import Hit


def _bring_up_to_date(settings: Settings) -> None:
    """Without a daemon (just installed, or stopped): index this machine's trees first."""
    from syncd.backup.state import State
    from syncd.search.indexer import update_local
    from syncd.security.lock import ProcessLock

    if not settings.search:
        return
    trees = [settings.for_source(t.name) for t in settings.trees()] if settings.sources \
        else [settings]
    for one in trees:
        if ProcessLock(one.state_file.with_suffix(".lock")).holder() is not None:
            continue  # its daemon keeps the index current
        if not one.source.is_dir():
            continue

        def origins(one: Settings = one) -> dict[str, str]:
            if not one.state_file.exists():
                return {}
            state = State(one.state_file, readonly=True)
            try:
                return state.origin_machines()
            finally:
                state.close()

        update_local(one.state_dir, one.source, one.machine_id, origins)


def _as_json(hit: Hit) -> dict[str, object]:
    return {"machine": hit.machine, "session": hit.session, "project": hit.project,
            "last_activity": hit.last_activity, "title": hit.title,
            "snippet": [[text, match] for text, match in hit.snippet],
            "deleted": hit.deleted, "origin": hit.origin, "score": hit.score,
            "catalog_only": getattr(hit, "catalog_only", False)}


def _head(hit: Hit) -> str:
    from syncd.duration import format_time
    from syncd.untrusted import printable

    when = format_time(hit.last_activity) if hit.last_activity is not None else "-"
    machine = hit.machine if hit.origin is None else f"{hit.machine} (from {hit.origin})"
    parts = [hit.session, machine, when, hit.project or "-", hit.title or "-"]
    line = "  ".join(printable(p.replace("\n", " ")) for p in parts)
    if getattr(hit, "catalog_only", False):
        line += "  [catalog only]"
    return line + ("  [deleted]" if hit.deleted else "")


def _flat(text: str) -> str:
    """A snippet piece on one line: each run of whitespace (newlines of code, a long
    answer's indents) one space, then what is left unprintable a ``?``."""
    import re

    from syncd.untrusted import printable

    return printable(re.sub(r"\s+", " ", text))


def _print(hits: list[Hit]) -> None:
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.text import Text

        console = Console(highlight=False)
        for hit in hits:
            # Store text is never markup: each piece is a Text, the match styled bold.
            console.print(Text(_head(hit), style="bold" if not hit.deleted else "dim"))
            snip = Text("    ")
            for text, match in hit.snippet:
                snip.append(_flat(text), style="bold red" if match else "")
            console.print(snip)
        return
    for hit in hits:
        click.echo(_head(hit))
        click.echo("    " + "".join(
            f"[{_flat(t)}]" if m else _flat(t) for t, m in hit.snippet))


def _in_catalogs(settings: Settings, index: SearchIndex, query: str, *, machine: str | None,
                 project: str | None, since: float | None, until: float | None,
                 limit: int) -> list[Hit]:
    """The catalog hits of the store's machines the index does not hold; a store that does
    not answer is one line on stderr, and the index's hits stand alone."""
    from syncd.cli.util import repository_of
    from syncd.errors import BadQuery, SyncdError
    from syncd.redact import redact
    from syncd.search.catalogs import indexed_machines, search_catalogs

    problems: list[str] = []
    try:
        found: list[Hit] = list(search_catalogs(
            repository_of(settings), query, skip=indexed_machines(index) | {
                settings.machine_id}, machine=machine, project=project, since=since,
            until=until, limit=limit, problems=problems))
    except BadQuery:
        raise
    except SyncdError as e:
        problems, found = [f"the store's other machines were not searched: {e}"], []
    for p in problems:
        click.echo(redact(f"syncd: search: {p}"), err=True)
    return found


@click.command(short_help="Full-text search over the sessions indexed here.")
@click.argument("query")
@click.option("--machine", default=None, help="Only this machine's sessions (or those "
              "brought here from it).")
@click.option("--project", default=None, help="Only sessions of this project directory "
              "(or under it).")
@click.option("--since", default=None, metavar="TIME",
              help="Last active at or after TIME (ISO 8601, or a duration ago: 2h, 7d).")
@click.option("--until", default=None, metavar="TIME", help="Last active at or before TIME.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000),
              help="At most this many sessions.")
@click.option("--all-text", is_flag=True, help="Search tool outputs too.")
@click.option("--local", is_flag=True, help="Only the index here: not the catalogs (titles, "
              "prompts, projects) of the store's machines whose text it does not hold.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (one JSON "
              "array; snippets as [text, is_match] pieces).")
@click.pass_context
def search(ctx: click.Context, query: str, machine: str | None, project: str | None,
           since: str | None, until: str | None, limit: int, all_text: bool, local: bool,
           as_json: bool) -> None:
    """Search the prompts, answers, tool names and tool inputs of every session indexed
    here (not thinking; tool outputs with --all-text), best first, one row per session.

    QUERY is SQLite FTS5 syntax: words (all must match), "a phrase", prefix*, AND, OR,
    NOT, parentheses. Without a daemon running, this machine's tree is indexed first.
    The store's other machines, whose text is not indexed here (`syncd index`), are
    searched by their catalogs (one LIST, and one GET of each head), after the index's
    hits and marked so; --local leaves them out.
    """
    from syncd.duration import parse_time
    from syncd.errors import UsageError
    from syncd.search.index import FILE_NAME, SearchIndex
    from syncd.search.query import search as run_search

    def when(option: str, text: str | None) -> float | None:
        try:
            return None if text is None else parse_time(text)
        except UsageError as e:
            raise UsageError(f"{option}: {e}") from None

    settings = settings_of(ctx)
    t0, t1 = when("--since", since), when("--until", until)
    _bring_up_to_date(settings)
    with SearchIndex.open(settings.state_dir / FILE_NAME) as index:
        hits = run_search(index, query, machine=machine, project=project, since=t0,
                          until=t1, limit=limit, all_text=all_text)
        if not local and len(hits) < limit:
            hits += _in_catalogs(settings, index, query, machine=machine, project=project,
                                 since=t0, until=t1, limit=limit - len(hits))
    if as_json:
        click.echo(json.dumps([_as_json(h) for h in hits], ensure_ascii=False, indent=1))
    elif hits:
        _print(hits)
    else:
        click.echo("no session matches", err=True)


COMMANDS = [search]

"""``syncd web``: the local page (dashboard, sessions, one session)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from syncd.cli.util import settings_of, source_option
from syncd.errors import UsageError

# What a command needs is imported inside it (see syncd.cli.main).


@click.command(short_help="A local web page: dashboard, sessions, one session.")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Port on 127.0.0.1 (0: any free one, printed; default: the config's "
                   "web_port).")
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), default=None,
              help="Listen on this Unix socket (mode 0600) instead of a port.")
@click.option("--open", "open_browser", is_flag=True, help="Open it in the browser.")
@click.option("--url", "print_url", is_flag=True,
              help="Print the URL of the page the daemon serves (web = true) and exit.")
@source_option
@click.pass_context
def web(ctx: click.Context, port: int | None, socket_path: Path | None, open_browser: bool,
        print_url: bool) -> None:
    """Serve a page on 127.0.0.1 only, until Ctrl-C: this machine's health, the machines
    it follows, every session of every machine (filters, search), and one session as
    `show` renders it, with restore and resume.

    Every start makes a new token; the URL printed carries it (open that one). Nothing
    is served to a request without it, to a Host header other than the printed one, or
    a POST without the page's CSRF token.
    """
    settings = settings_of(ctx)
    if print_url:
        from syncd.web.server import read_url

        url = read_url(settings.state_dir)
        if url is None:
            raise UsageError("the daemon serves no page (set web = true and run syncd run)")
        click.echo(url)
        return
    if port is not None and socket_path is not None:
        raise UsageError("--port and --socket: one or the other")
    import signal

    from syncd.cli.util import repository_of
    from syncd.web.server import WebServer, bind

    # Unlocked here, where a terminal can prompt for the passphrase.
    repo = repository_of(settings)
    try:
        bound = bind(settings.web_port if port is None else port, socket_path)
    except UsageError as e:
        from syncd.web.server import read_url

        served = read_url(settings.state_dir) is not None
        raise UsageError(f"{e}" + (" (the daemon serves the page: syncd web --url; or "
                                   "--port 0)" if served else " (--port 0: any free port)")
                         ) from None
    server = WebServer(settings, bound, repo=repo)
    # A SIGTERM stops the server (before it listens too) and is exit 0: uvicorn raises
    # it again, once stopped, under this handler.
    signal.signal(signal.SIGTERM, lambda *_: server.server.handle_exit(signal.SIGTERM, None))
    where = f" (on the Unix socket {bound.socket_path})" if bound.socket_path else ""
    click.echo(f"syncd web: {bound.url}{where}", err=False)
    click.echo("(the token in it is this start's own; Ctrl-C stops)", err=True)
    if open_browser:
        import webbrowser

        webbrowser.open(bound.url)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stopped, as asked
        server.serve()


COMMANDS = [web]

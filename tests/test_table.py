"""Tables: `machines` and `sessions` print a header row and aligned columns, plain when
piped and drawn by rich on a terminal; store text is printed literally, never as markup
or escape sequences."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

from syncd.claude import project_folder
from syncd.cli.table import Column, Table, width
from syncd.store import LocalStore
from syncd.untrusted import printable
from tests.helpers import shipper, write

DESK = "aaaaaaaa-0000-4000-8000-000000000001"
LAPTOP = "bbbbbbbb-0000-4000-8000-000000000002"
# Markup rich would act on, an OSC 52 (sets the clipboard), a BEL, a bidi override.
# (`sessions` shows a title's first 60 characters: this one is 59.)
HOSTILE = "[bold red]x[/] [link=https://e.vil]y[/link] \x1b]52;c;Zm9v\x07 \u202ez"
SHOWN = "[bold red]x[/] [link=https://e.vil]y[/link] ?]52;c;Zm9v? ?z"
SGR = re.compile(r"\x1b\[[0-9;]*m")  # rich's own styling (bold headers)


# -- the table itself ---------------------------------------------------------------------

COLUMNS = (Column("NAME"), Column("SIZE", right=True), Column("NOTE", wrap=True))
ROWS = [("a", "1B", "short"), ("longer-name", "1023.5KB", "two  spaces"), ("日本", "0B", "-")]


def starts(line: str, col: int) -> bool:
    """A cell starts at ``col``: a gap (or the line's start) before it, text at it."""
    return (col == 0 or line[col - 1] == " ") and line[col:col + 1] not in ("", " ")


def test_plain_table_has_a_header_and_aligned_columns() -> None:
    lines = list(Table(COLUMNS, ROWS, lambda r: r).lines())
    assert lines == [
        "NAME             SIZE  NOTE",
        "a                  1B  short",
        "longer-name  1023.5KB  two  spaces",
        "日本               0B  -",  # two wide characters take four cells
    ]
    assert all(line == line.rstrip() for line in lines)


def test_every_cell_is_made_printable() -> None:
    out = "\n".join(Table(COLUMNS, [("a\x1b[2Jb", "\x9b1m", "x\ny\u202ez")],
                          lambda r: r).lines())
    assert out.splitlines()[1] == "a?[2Jb   ?1m  x?y?z"
    assert printable("ok\t\x00") == "ok??" and width("e\u0301") == 1


def test_a_row_with_the_wrong_number_of_cells_is_refused() -> None:
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        list(Table(COLUMNS, [("a", "b")], lambda r: r).lines())


def rich_lines(table: Table[tuple[str, ...]], columns: int) -> list[str]:
    buf = io.StringIO()
    table.echo(buf, terminal=True, columns=columns)
    out = buf.getvalue()
    plain = SGR.sub("", out)
    assert "\x1b" not in plain, out  # rich's styling only: no escape came from a cell
    return [line.rstrip() for line in plain.splitlines()]


def test_rich_table_has_a_header_and_prints_markup_literally() -> None:
    rows = [(DESK, "desk", HOSTILE), (LAPTOP, "laptop", "[i]plain[/i] :smile:")]
    cols = (Column("SESSION"), Column("MACHINE"), Column("TITLE", wrap=True))
    lines = rich_lines(Table(cols, rows, lambda r: r), 120)
    assert re.fullmatch(r"SESSION\s+MACHINE\s+TITLE", lines[0]), lines
    assert set(lines[1]) == {"─"}  # the rule under the header
    assert lines[2] == f"{DESK}  desk     {SHOWN}"
    assert lines[3] == f"{LAPTOP}  laptop   [i]plain[/i] :smile:"


def test_rich_table_on_a_narrow_terminal_keeps_ids_whole() -> None:
    rows = [(DESK, "desk", "a title long enough to need more than one line here")]
    cols = (Column("SESSION"), Column("MACHINE"), Column("TITLE", wrap=True))
    lines = rich_lines(Table(cols, rows, lambda r: r), 64)
    assert lines[2].startswith(f"{DESK}  desk     a title")
    assert len(lines) > 3 and max(width(line) for line in lines) <= 64
    # Narrower than the ids themselves: lines get longer, no column is dropped.
    lines = rich_lines(Table(cols, rows, lambda r: r), 20)
    assert lines[2].startswith(f"{DESK}  desk     a title") and "TITLE" in lines[0]


# -- machines and sessions ------------------------------------------------------------------

def transcript(sid: str, cwd: str, prompt: str, title: str | None) -> bytes:
    entries: list[dict[str, object]] = [
        {"type": "user", "uuid": f"u-{sid}", "cwd": cwd, "sessionId": sid,
         "timestamp": "2026-11-01T10:00:00.000Z",
         "message": {"role": "user", "content": prompt}}]
    if title is not None:
        entries.append({"type": "custom-title", "customTitle": title, "sessionId": sid})
    return b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in entries)


@pytest.fixture
def world(tmp_path: Path) -> dict[str, str]:
    """A store with two machines' sessions (one with a hostile title), and the
    environment of a third machine that lists them."""
    store = LocalStore(tmp_path / "store")
    for machine, cwd, sid, prompt, title in [
            ("desk", "/home/a/app", DESK, "fix the parser", None),
            ("laptop-long-name", "/home/b/web", LAPTOP, "hello", HOSTILE)]:
        src = tmp_path / f"src-{machine}"
        rel = f"projects/{project_folder(cwd)}/{sid}.jsonl"
        write(src, rel, transcript(sid, cwd, prompt, title))
        shipper(src, store, tmp_path / f"{machine}.db", machine=machine).ship([rel.encode()])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
    env.update({"HOME": str(tmp_path / "home"), "SYNCD_SOURCE": str(tmp_path / "dst"),
                "SYNCD_STORE": (tmp_path / "store").as_uri(), "SYNCD_MACHINE_ID": "desk",
                "SYNCD_STATE_DIR": str(tmp_path / "state"), "SYNCD_CONFIG": os.devnull,
                "COLUMNS": "200", "TERM": "xterm-256color"})
    env.pop("NO_COLOR", None)
    return env


def syncd(env: dict[str, str], *args: str) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "syncd", *args], env=env, capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and r.stderr == "", (r.returncode, r.stdout, r.stderr)
    return r.stdout.splitlines()


def test_sessions_plain_has_a_header_and_aligned_columns(world: dict[str, str]) -> None:
    lines = syncd(world, "sessions")
    header = lines[0]
    names = ["SESSION", "LAST ACTIVITY", "LOCAL", "SIZE", "MACHINE", "PROJECT", "TITLE"]
    assert re.fullmatch(r"\s+".join(map(re.escape, names)), header), header
    assert len(lines) == 3  # one line per session
    at = {name: header.index(name) for name in names}
    for line in lines[1:]:
        for name in names:
            if name == "SIZE":  # right-aligned: ends where its header ends
                end = at[name] + len(name)
                assert line[end - 1] != " " and line[end] == " ", line
            else:
                assert starts(line, at[name]), (name, line)
    rows = {line[:36]: line for line in lines[1:]}
    desk, laptop = rows[DESK], rows[LAPTOP]
    assert desk[at["LAST ACTIVITY"]:].startswith("2026-11-01T10:00  no")
    assert desk[at["MACHINE"]:].split() == ["desk", "/home/a/app", "fix", "the", "parser"]
    assert laptop[at["MACHINE"]:] == f"laptop-long-name  /home/b/web  {SHOWN}"


def test_machines_plain_has_a_header_and_marks_this_machine(world: dict[str, str]) -> None:
    lines = syncd(world, "machines")
    header = lines[0]
    names = ["MACHINE", "HOST", "LAST BACKUP", "SNAPSHOTS", "DELTAS", "PACKS", "SEGMENTS",
             "STORED", "SESSIONS", "HOME"]
    assert re.fullmatch(r"\s+" + r"\s+".join(names), header), header
    assert len(lines) == 3 and lines[1].split()[:2] == ["*", "desk"]
    assert lines[2].startswith(" ") and lines[2].split()[0] == "laptop-long-name"
    at = header.index("MACHINE")
    for line in lines[1:]:
        assert starts(line, at) and starts(line, header.index("HOST"))
        # Counts are right-aligned under their headers: 0 snapshots, deltas, packs, 1 segment.
        counts = [line[header.index(n):header.index(n) + len(n)] for n in names[3:7]]
        assert [c.strip() for c in counts] == ["0", "0", "0", "1"], line
        assert all(c[-1] != " " for c in counts), line


def test_json_is_what_it_was(world: dict[str, str]) -> None:
    """--json is untouched by the tables: the same keys (and, added at the end, ``here``:
    the LOCAL column's yes/no/imported/behind), the raw (escaped) title."""
    doc = json.loads("\n".join(syncd(world, "sessions", "--json")))
    assert [r["session_id"] for r in doc] in ([DESK, LAPTOP], [LAPTOP, DESK])
    assert {r["title"] for r in doc} == {"fix the parser", HOSTILE}
    assert list(doc[0]) == ["session_id", "machine", "project", "title", "size",
                            "last_activity", "git_branch", "deleted_locally_at", "local",
                            "here"]
    machines = json.loads("\n".join(syncd(world, "machines", "--json")))
    assert [m["machine"] for m in machines] == ["desk", "laptop-long-name"]


def on_a_terminal(env: dict[str, str], *args: str) -> str:
    """What ``syncd ARGS`` writes to a terminal (a pseudo-terminal, COLUMNS wide)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "syncd", *args], env=env, stdout=slave,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            assert ready, "no output from syncd within 60 s"
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        err = p.communicate(timeout=60)[1]
    assert p.returncode == 0 and not err, (p.returncode, out, err)
    return out.decode().replace("\r\n", "\n")


def test_sessions_on_a_terminal_is_a_rich_table_that_prints_titles_literally(
        world: dict[str, str]) -> None:
    out = on_a_terminal(world, "sessions")
    plain = SGR.sub("", out)
    assert "\x1b" not in plain and "\x07" not in plain and "\u202e" not in plain, out
    lines = [line.rstrip() for line in plain.splitlines()]
    assert lines[0].split() == ["SESSION", "LAST", "ACTIVITY", "LOCAL", "SIZE", "MACHINE",
                                "PROJECT", "TITLE"]
    assert set(lines[1]) == {"─"} and len(lines[1]) <= 200
    assert len(lines) == 4 and SHOWN in plain  # 200 columns: one line a session, as written
    assert any(line.startswith(DESK) for line in lines)


def test_prune_dry_run_lists_its_verdicts_under_a_header(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
    env.update({"HOME": str(tmp_path / "home"), "SYNCD_SOURCE": str(tmp_path / "src"),
                "SYNCD_STORE": (tmp_path / "store").as_uri(), "SYNCD_MACHINE_ID": "m1",
                "SYNCD_STATE_DIR": str(tmp_path / "state"), "SYNCD_CONFIG": os.devnull,
                "SYNCD_KEEP_LAST": "2", "SYNCD_KEEP_HOURLY": "0", "SYNCD_KEEP_DAILY": "0",
                "SYNCD_KEEP_WEEKLY": "0", "SYNCD_KEEP_MONTHLY": "0", "SYNCD_MAX_DELTAS": "0",
                # A head every pass: compaction folds only what the head covers.
                "SYNCD_HEAD_INTERVAL": "0"})
    for i in range(3):
        write(tmp_path / "src", "history.jsonl", b'{"display":"%d"}\n' % i, "ab")
        syncd(env, "sync")
        syncd(env, "compact")
    lines = syncd(env, "prune", "--dry-run")
    assert lines[0] == "m1: policy last 2"
    assert re.fullmatch(r"VERDICT  SNAPSHOT\s+SEQ  WHY", lines[1]), lines
    verdicts = [(line.split()[0], line.split()[3]) for line in lines[2:5]]
    assert verdicts == [("keep", "2"), ("keep", "1"), ("forget", "0")], lines
    seq = lines[1].index("SEQ") + len("SEQ")
    assert all(line[seq - 1] != " " and line[seq] == " " for line in lines[2:5]), lines

"""Tables: `machines` and `sessions` print a header row and aligned columns, plain when
piped and drawn by rich on a terminal; store text is printed literally, never as markup
or escape sequences."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from rich.cells import cell_len

from syncd.claude import project_folder
from syncd.cli.table import (
    Column,
    Table,
    cells_upto,
    cut,
    cut_end,
    cut_path,
    fit,
    short_ids,
    width,
)
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

COLUMNS = (Column("NAME"), Column("SIZE", right=True), Column("NOTE", cut="end"))
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
    cols = (Column("SESSION"), Column("MACHINE"), Column("TITLE", cut="end"))
    lines = rich_lines(Table(cols, rows, lambda r: r), 120)
    assert re.fullmatch(r"SESSION\s+MACHINE\s+TITLE", lines[0]), lines
    assert set(lines[1]) == {"─"}  # the rule under the header
    assert lines[2] == f"{DESK}  desk     {SHOWN}"
    assert lines[3] == f"{LAPTOP}  laptop   [i]plain[/i] :smile:"


def test_rich_table_on_a_narrow_terminal_cuts_text_on_one_line() -> None:
    rows = [(DESK, "desk", "a title long enough to need more than one line here")]
    cols = (Column("SESSION"), Column("MACHINE"), Column("TITLE", cut="end"))
    lines = rich_lines(Table(cols, rows, lambda r: r), 64)
    assert lines[2] == f"{DESK}  desk     a title long eno…"
    assert len(lines) == 3 and max(width(line) for line in lines) <= 64
    # Narrower than the ids themselves: lines get longer, no column is dropped.
    lines = rich_lines(Table(cols, rows, lambda r: r), 20)
    assert lines[2] == f"{DESK}  desk     a ti…" and "TITLE" in lines[0]


def test_paths_keep_their_head_and_last_components_titles_their_start() -> None:
    path = "/home/alice/src/github.com/example-org/project/worktrees/fix"
    assert cut_path(path, 60) == path
    assert cut_path(path, 30) == "/home/a…/project/worktrees/fix"
    assert cut_path(path, 20) == "/home…/worktrees/fix"
    assert cut_path(path, 12) == "/home/a…/fix"
    # A last component too long to keep whole: the path's two ends.
    assert cut_path("/home/a/" + "x" * 30 + "yz", 12) == "/home…xxxxyz"
    assert cut_path("relative/name", 8) == "re…/name"
    # Cells, not characters: a wide character never straddles the cut.
    for text, room in [("日本語のタイトル", 7), ("日本語のタイトル", 8), ("🎉🎉🎉", 4),
                       ("/home/项目/很长的名字/目录", 13), ("/项目/很长的名字的目录", 9)]:
        for how in ("end", "path"):
            got = cut(text, room, how)  # type: ignore[arg-type]
            assert room - 1 <= cell_len(got) <= room and "…" in got, (text, room, how, got)
    assert cut_end("日本語", 4) == "日…" and cut_end("abc", 3) == "abc"
    # What a hostile store may hold: thousands of zero-width marks, of components.
    marks = "a" + "\u0301" * 4000 + "bcdef"
    assert cut_end(marks, 4) == marks[:-3] + "…" and cells_upto(marks, 80) == 6
    deep = "/a" * 2000 + "/last"
    assert cut_path(deep, 20) == "/a…/a/a/a/a/a/a/last" and cells_upto(deep, 80) == 81


def test_ids_are_shown_by_as_many_characters_as_tell_them_apart() -> None:
    ids = [ALIKE1, ALIKE2, WIDE, WIDE, ALIKE1[:12] + "ffff"]
    assert short_ids(ids, 8) == {ALIKE1: ALIKE1[:13], ALIKE2: ALIKE2[:10], WIDE: WIDE[:8],
                                 ALIKE1[:12] + "ffff": ALIKE1[:12] + "f"}


def test_a_shown_id_names_one_session_as_the_commands_take_it() -> None:
    # Commands take ids in either case (a UUID's case is no part of it): a store's
    # "ABCDEF12-…" and "abcdef12-…" are told apart past their first 8 characters, and an
    # id that differs from another in case alone is that one.
    upper, lower = "ABCDEF12-1111-4000-8000-000000000001", "abcdef12-2222-4000-8000-000000000002"
    twin = "AAAAAAAA-0000-4000-8000-000000000001"
    shown = short_ids([upper, lower, twin, DESK], 8)
    assert shown == {upper: upper[:10], lower: lower[:10], twin: twin[:8], DESK: DESK[:8]}


def test_columns_are_left_out_least_useful_first() -> None:
    cols = (Column("ID"), Column("A", drop=1), Column("B", drop=2), Column("TEXT", cut="end"))
    natural = [10, 5, 5, 40]
    assert fit(cols, natural, 80) == ([0, 1, 2, 3], [10, 5, 5, 40])
    assert fit(cols, natural, 40) == ([0, 1, 2, 3], [10, 5, 5, 14])
    assert fit(cols, natural, 30) == ([0, 1, 3], [10, 5, 11])  # B first
    assert fit(cols, natural, 22) == ([0, 3], [10, 10])
    assert fit(cols, natural, 10) == ([0, 3], [10, 4])  # wider than asked: nothing left


@pytest.mark.parametrize("columns", [40, 80, 120])
def test_a_hostile_title_is_one_literal_line_that_fits(columns: int) -> None:
    cols = (Column("SESSION", short=8), Column("PROJECT", cut="path"),
            Column("TITLE", cut="end"))
    rows = [(WIDE, CJK_PROJECT, NASTY), (DESK, LONG_PROJECT, "[i]x[/i] :smile:\r\nnext")]
    lines = rich_lines(Table(cols, rows, lambda r: r), columns)
    assert len(lines) == 4 and all(cell_len(line) <= columns for line in lines), lines
    assert lines[2].startswith("cccccccc  /home") and lines[3].startswith("aaaaaaaa  /home")
    assert "[bold]x" in lines[2] and "[i]x[/i]" in lines[3]
    wide = rich_lines(Table(cols, rows, lambda r: r), columns)
    assert wide == lines
    buf = io.StringIO()
    Table(cols, rows, lambda r: r).echo(buf, terminal=True, columns=columns, wide=True)
    text = SGR.sub("", buf.getvalue())
    assert len(text.splitlines()) == 4 and printable(NASTY) in text and WIDE in text
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text


def test_prunes_verdicts_fit_with_their_reasons_cut_at_the_end() -> None:
    from syncd.cli.archive import VERDICT_COLUMNS
    why = "hourly 2026-11-30T10, daily 2026-11-30, weekly 2026-W48, monthly 2026-11, last 3"
    rows = [("keep", "2026-11-30 10:00", "12", why), ("forget", "2026-11-29 09:00", "11", "-")]
    lines = rich_lines(Table(VERDICT_COLUMNS, rows, lambda r: r), 60)
    assert len(lines) == 4 and all(cell_len(line) <= 60 for line in lines), lines
    assert lines[2].startswith("keep     2026-11-30 10:00   12  hourly") and \
        lines[2].endswith("…")
    buf = io.StringIO()
    Table(VERDICT_COLUMNS, rows, lambda r: r).echo(buf, terminal=True, columns=60, wide=True)
    assert why in buf.getvalue()


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


def on_a_terminal(env: dict[str, str], *args: str, columns: int | None = None) -> str:
    """What ``syncd ARGS`` writes to a pseudo-terminal (``columns`` wide, its size set as
    a terminal's; else as COLUMNS says)."""
    master, slave = pty.openpty()
    if columns is not None:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
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
    return out.decode()


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
    assert any(line.startswith(DESK[:8] + " ") for line in lines)


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


# -- tables that fit the terminal -------------------------------------------------------------

# Two of desk's sessions share their first 8 characters; the laptop's title is hostile in
# every way a store's string can be: markup, an SGR and an OSC escape, a BEL, a newline,
# a bidi override, wide (CJK) characters and emoji.
ALIKE1 = "0f8e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b"
ALIKE2 = "0f8e4c2a-9c3d-4e5f-8a9b-0c1d2e3f4a5b"
WIDE = "cccccccc-0000-4000-8000-000000000003"
LONG_PROJECT = "/home/alice/src/github.com/example-org/a-rather-long-project-name/worktrees/fix"
LONG_TITLE = ("Refactor the parser so that nested quotes in shell arguments survive the "
              "round trip through the remapper and back")
NASTY = ("[bold]x[/bold] [link=https://e.vil]y[/link] \x1b[31mred\x1b[0m \x1b]52;c;Zm9v\x07 "
         "日本語のタイトル 🎉🎉 line1\nline2 \u202eend")
CJK_PROJECT = "/home/bob/项目/很长的名字的目录/深一点/还要更深的目录"
LONG_MACHINE = "laptop-with-a-rather-long-name"
LONG_HOME = "/Users/bob/Library/Mobile Documents/com~apple~CloudDocs/home"


@pytest.fixture(scope="module")
def crowd(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A file:// store with what makes tables wide: long projects, titles, machine names
    and homes, a hostile title, two ids alike in their first 8 characters."""
    tmp = tmp_path_factory.mktemp("crowd")
    store = LocalStore(tmp / "store")
    mp = pytest.MonkeyPatch()
    try:
        for machine, home, sessions in [
                ("desk", "/home/alice", [(ALIKE1, LONG_PROJECT, LONG_TITLE),
                                         (ALIKE2, "/home/alice/app", "short")]),
                (LONG_MACHINE, LONG_HOME, [(WIDE, CJK_PROJECT, NASTY)])]:
            mp.setattr("syncd.backup.ship.machine_facts", lambda root, h=home, m=machine: {
                "hostname": f"{m}.corp.example.org", "os": "Linux 6.1", "home": h,
                "claude_root": os.fsdecode(root)})
            src = tmp / f"src-{machine}"
            rels = []
            for sid, cwd, title in sessions:
                rel = f"projects/{project_folder(cwd)}/{sid}.jsonl"
                write(src, rel, transcript(sid, cwd, "a prompt", title))
                rels.append(rel.encode())
            shipper(src, store, tmp / f"{machine}.db", machine=machine).ship(rels)
    finally:
        mp.undo()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SYNCD_", "AWS_")) and k not in ("COLUMNS", "LINES")}
    env.update({"HOME": str(tmp / "home"), "SYNCD_SOURCE": str(tmp / "dst"),
                "SYNCD_STORE": (tmp / "store").as_uri(), "SYNCD_MACHINE_ID": "desk",
                "SYNCD_STATE_DIR": str(tmp / "state"), "SYNCD_CONFIG": os.devnull,
                "TERM": "xterm-256color"})
    env.pop("NO_COLOR", None)
    return env


def sized_terminal(env: dict[str, str], columns: int, *args: str) -> list[str]:
    """The lines ``syncd ARGS`` writes to a pseudo-terminal ``columns`` wide (its size
    set as a terminal's, no COLUMNS), rich's styling taken out."""
    out = on_a_terminal(env, *args, columns=columns)
    text = SGR.sub("", out)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text, out
    assert text.endswith("\r\n") and "\r\n\n" not in text, out
    return text[:-2].split("\r\n")


def fits(lines: list[str], columns: int) -> None:
    """Every line within the terminal's width (in cells), none wrapped."""
    assert all(cell_len(line) <= columns for line in lines), \
        "\n".join(f"{cell_len(line):4} {line}" for line in lines)


@pytest.mark.parametrize("columns", [80, 100, 160])
def test_sessions_fit_the_terminal_one_line_a_session(crowd: dict[str, str],
                                                      columns: int) -> None:
    lines = sized_terminal(crowd, columns, "sessions")
    fits(lines, columns)
    assert lines[0].split()[:3] == ["SESSION", "LAST", "ACTIVITY"] and set(lines[1]) == {"─"}
    assert len(lines) == 5, lines  # header, rule, one line per session
    rows = {line.split()[0]: line for line in lines[2:]}
    # 8 characters, more where two ids begin alike: each is a prefix resume takes.
    assert set(rows) == {WIDE[:8], ALIKE1[:10], ALIKE2[:10]}, lines
    assert not any(sid in "\n".join(lines) for sid in (ALIKE1, ALIKE2, WIDE))
    long_row, nasty_row = rows[ALIKE1[:10]], rows[WIDE[:8]]
    assert "[bold]x[/b" in nasty_row  # markup printed as written
    if columns < 160:
        # A project keeps its head and its last components, a title its start.
        project = next(w for w in long_row.split() if w.startswith("/home/"))
        assert "…" in project and project.endswith("/fix"), long_row
        assert re.search(r"  Refactor t[^…]*…$", long_row), long_row


@pytest.mark.parametrize("columns", [80, 100, 160])
def test_machines_and_snapshots_fit_the_terminal(crowd: dict[str, str], columns: int) -> None:
    lines = sized_terminal(crowd, columns, "machines")
    fits(lines, columns)
    assert len(lines) == 4 and lines[0].split()[0] == "MACHINE", lines
    assert lines[2].split()[:2] == ["*", "desk"], lines
    assert lines[3].split()[0].startswith("laptop-"), lines
    if columns < 160:
        assert re.search(r"  /U[^ ]*…[^ ]*/home$", lines[3]), lines  # its head and end
    for machine in ("desk", LONG_MACHINE):
        lines = sized_terminal(crowd, columns, "snapshots", "--machine", machine)
        fits(lines, columns)
        assert len(lines) == 3, lines


def test_wide_shows_everything_on_a_terminal(crowd: dict[str, str]) -> None:
    lines = sized_terminal(crowd, 100, "sessions", "--wide")
    text = "\n".join(lines)
    assert len(lines) == 5, lines  # longer than the terminal, but never folded
    for whole in (ALIKE1, ALIKE2, WIDE, LONG_PROJECT, LONG_TITLE, CJK_PROJECT):
        assert whole in text
    lines = sized_terminal(crowd, 100, "machines", "--wide")
    assert len(lines) == 4 and LONG_HOME in "\n".join(lines) and LONG_MACHINE in lines[3]


def test_piped_tables_and_json_keep_whole_values(crowd: dict[str, str]) -> None:
    lines = syncd(crowd, "sessions")
    assert len(lines) == 4, lines  # one line a session, whatever its title holds
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {ALIKE1, ALIKE2, WIDE}
    assert rows[ALIKE1].endswith(f"  {LONG_PROJECT}  {LONG_TITLE}")
    assert re.search(f"  {CJK_PROJECT} +{re.escape(printable(NASTY))}$", rows[WIDE])
    lines = syncd(crowd, "machines")
    assert len(lines) == 3 and lines[2].split()[0] == LONG_MACHINE
    assert lines[2].endswith(f"  {LONG_HOME}"), lines
    doc = json.loads("\n".join(syncd(crowd, "sessions", "--json")))
    assert {r["session_id"]: r["title"] for r in doc} == {
        ALIKE1: LONG_TITLE, ALIKE2: "short", WIDE: NASTY}
    assert {r["project"] for r in doc} == {LONG_PROJECT, "/home/alice/app", CJK_PROJECT}

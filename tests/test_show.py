"""`syncd show SESSION`: a session from the local tree, or straight from any machine's
backup as of any point (a real SeaweedFS store), in text, Markdown or HTML; nothing
written locally; an unknown session is the line `restore --session` gives."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from syncd.claude import project_folder
from syncd.duration import format_time
from syncd.repository import Repository
from syncd.store import open_store
from syncd.view import load_backup
from tests.helpers import one_line, shipper, syncd, write
from tests.seaweed import Seaweed
from tests.test_startup import HEAVY, imported

DESKS = "d0d0d0d0-1111-4000-8000-000000000001"
LAPTOPS = "1a1a1a1a-2222-4000-8000-000000000002"
UNKNOWN = "deadbeef-0000-4000-8000-000000000000"
CWD = "/home/alice/code/app"


def entry(kind: str, text: str, **more: Any) -> bytes:
    role = {"role": kind, "content": text if kind == "user" else [{"type": "text",
                                                                    "text": text}]}
    e = {"type": kind, "cwd": CWD, "sessionId": more.pop("sid", DESKS),
         "timestamp": "2026-11-01T10:00:00.000Z", "message": role, **more}
    return json.dumps(e).encode() + b"\n"


def rel(sid: str, tail: str = ".jsonl") -> str:
    return f"projects/{project_folder(CWD)}/{sid}{tail}"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, seaweed: Seaweed) -> dict[str, Any]:
    """desk's session backed up twice (its last answer rewritten in between, as a tail cut
    does), with a subagent; the laptop's session of its own."""
    tmp = tmp_path_factory.mktemp("show")
    name = f"show{os.getpid()}"
    seaweed.create_bucket(name)
    url = f"s3://{name}/p"
    store = open_store(url, endpoint_url=seaweed.endpoint)
    desk = tmp / "desk"
    ship = shipper(desk, store, tmp / "desk.db", machine="desk")
    first = entry("user", "fix the parser")
    write(desk, rel(DESKS), first + entry("assistant", "OLD ANSWER"))
    write(desk, rel(DESKS, "/subagents/agent-a77.jsonl"),
          entry("user", "explore it", isSidechain=True) +
          entry("assistant", "SUBAGENT FINDING", isSidechain=True))
    ship.ship([rel(DESKS).encode(), rel(DESKS, "/subagents/agent-a77.jsonl").encode()])
    point1 = load_backup(Repository(store, "desk")).point
    write(desk, rel(DESKS), first + entry("assistant", "NEW"))  # shorter: a tail cut
    ship.ship([rel(DESKS).encode()])
    point2 = load_backup(Repository(store, "desk")).point
    assert point1 is not None and point2 is not None and point2[1] > point1[1]
    laptop = tmp / "laptop"
    write(laptop, rel(LAPTOPS), entry("user", "LAPTOP PROMPT", sid=LAPTOPS))
    # The laptop holds a copy of desk's session too (as follow imports it), its own way.
    write(laptop, rel(DESKS), first + entry("assistant", "LAPTOP'S COPY"))
    shipper(laptop, store, tmp / "laptop.db", machine="laptop").ship(
        [rel(LAPTOPS).encode(), rel(DESKS).encode()])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
    env.update({**seaweed.env(), "HOME": str(tmp / "home"), "SYNCD_SOURCE": str(tmp / "here"),
                "SYNCD_STORE": url, "SYNCD_S3_ENDPOINT_URL": seaweed.endpoint,
                "SYNCD_MACHINE_ID": "desk", "SYNCD_STATE_DIR": str(tmp / "state"),
                "SYNCD_CONFIG": os.devnull})
    return {"env": env, "at1": format_time(point1[1]), "tmp": tmp}


def shown(env: dict[str, str], *args: str) -> str:
    r = syncd(env, "show", *args)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r.stdout


def test_show_from_a_backup_as_of_a_point_before_a_later_change(world: dict[str, Any]) -> None:
    env = world["env"]
    then = shown(env, DESKS[:8], "--at", world["at1"], "--format", "md")
    assert "OLD ANSWER" in then and "\nNEW\n" not in then
    assert "- **As of:**" in then and "\n## Subagent a77\n" in then
    assert "SUBAGENT FINDING" in then
    now = shown(env, DESKS, "--format", "md")  # not here: desk's backup, its last flush
    assert "\nNEW\n" in now and "OLD ANSWER" not in now
    # Read through the store alone: the local tree is not created, let alone written.
    assert not (world["tmp"] / "here").exists()


def test_show_another_machines_session(world: dict[str, Any]) -> None:
    env = world["env"]
    for args in ((LAPTOPS, "--machine", "laptop"), (LAPTOPS[:8],)):
        md = shown(env, *args, "--format", "md")
        assert "LAPTOP PROMPT" in md and "- **Machine:** `laptop`" in md
    # A session on two machines: this one's unless another is named, as restore reads it.
    assert "LAPTOP'S COPY" in shown(env, DESKS[:8], "--machine", "laptop", "--format", "md")
    for args in ((), ("--at", world["at1"])):
        md = shown(env, DESKS[:8], *args, "--format", "md")
        assert "LAPTOP'S COPY" not in md and "- **Machine:** `desk`" in md


def test_show_text_and_html_and_a_file(world: dict[str, Any], tmp_path: Path) -> None:
    env = world["env"]
    text = shown(env, DESKS[:8])
    assert "fix the parser" in text and "NEW" in text and "\x1b[" not in text  # not a tty
    out = tmp_path / "s.html"
    r = syncd(env, "show", DESKS[:8], "--format", "html", "-o", str(out))
    assert r.returncode == 0 and r.stdout == "", r.stderr
    doc = out.read_text()
    assert doc.startswith("<!DOCTYPE html>") and "<style>" in doc and "fix the parser" in doc
    assert one_line(syncd(env, "show", DESKS[:8], "-o", str(out)), 2) == \
        "syncd: -o/--output: only with --format md or html"


def test_the_local_tree_wins_unless_asked_for_a_backup(world: dict[str, Any],
                                                       tmp_path: Path) -> None:
    env = {**world["env"], "SYNCD_SOURCE": str(tmp_path / "src")}
    write(tmp_path / "src", rel(DESKS), entry("user", "fix the parser") +
          entry("assistant", "LOCAL ANSWER"))
    assert "LOCAL ANSWER" in shown(env, DESKS[:8], "--format", "md")
    assert "LOCAL ANSWER" in shown(env, DESKS[:8], "--machine", "desk", "--format", "md")
    then = shown(env, DESKS[:8], "--at", world["at1"], "--format", "md")
    assert "OLD ANSWER" in then and "LOCAL ANSWER" not in then


@pytest.mark.parametrize("args", [
    (UNKNOWN, "--machine", "desk"),
    (UNKNOWN[:8], "--machine", "desk"),
    (UNKNOWN[:8], "--machine", "desk", "--at", "2099-01-01T00:00:00Z"),
])
def test_an_unknown_session_is_the_line_restore_gives(world: dict[str, Any],
                                                      args: tuple[str, ...]) -> None:
    env = world["env"]
    restored = one_line(syncd(env, "restore", "--dry-run", "--session", *args), 1)
    assert one_line(syncd(env, "show", *args), 1) == restored
    assert args[0] in restored


def test_an_unknown_session_on_no_machine_says_where_it_looked(world: dict[str, Any]) -> None:
    line = one_line(syncd(world["env"], "show", UNKNOWN), 1)
    assert line.startswith(f"syncd: session {UNKNOWN} is in no backup (desk, laptop)"), line


def test_show_help_loads_click_alone(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
    env.update({"HOME": str(tmp_path), "SYNCD_CONFIG": os.devnull,
                "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    for args, code in ((("show", "--help"), 0), (("show", "nope"), 2)):
        heavy = imported(env, *args, code=code) & {*HEAVY, "markdown_it", "pygments"}
        assert heavy == set(), (args, heavy)


def test_a_bad_time_is_usage(world: dict[str, Any]) -> None:
    r: subprocess.CompletedProcess[str] = syncd(world["env"], "show", DESKS, "--at", "nope")
    assert one_line(r, 2).startswith("syncd: --at: cannot read time")

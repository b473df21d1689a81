"""A session named by its first characters (syncd/restore/sessionref.py): every command
that takes a session id (`restore --session`, `resume`) takes a unique prefix of 8
characters or more, resolved against the sessions of the machine(s) in question; an
ambiguous one is one line naming the matches (id, machine, project), exit 2; an unknown
one says so, exit 1, as does one session on two machines when none is named. Against a
file:// store, through the command line."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from syncd.claude import project_folder
from syncd.errors import AmbiguousSession, LookupFailed, UsageError, exit_code
from syncd.format.catalog import Session
from syncd.restore.sessionref import NAMED_MAX, matching, names, one
from syncd.store import LocalStore
from tests.helpers import one_line, shipper, syncd, write

ALIKE1 = "0f8e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b"
ALIKE2 = "0f8e4c2a-9c3d-4e5f-8a9b-0c1d2e3f4a5b"
LAPTOPS = "cccccccc-0000-4000-8000-000000000003"
UNKNOWN = "deadbeef-0000-4000-8000-000000000000"
# A project path from a hostile machine: an escape that would set the terminal's title.
HOSTILE_CWD = "/home/alice/\x1b]0;pwn\x07app"


def transcript(sid: str, cwd: str) -> bytes:
    entry = {"type": "user", "uuid": f"u-{sid}", "cwd": cwd, "sessionId": sid,
             "timestamp": "2026-11-01T10:00:00.000Z",
             "message": {"role": "user", "content": "a prompt"}}
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """desk holds two sessions alike in their first 8 characters; the laptop one of its
    own and a copy of desk's first (an import: the same session on two machines)."""
    tmp = tmp_path_factory.mktemp("refs")
    store = LocalStore(tmp / "store")
    for machine, sessions in [
            ("desk", [(ALIKE1, "/home/alice/code/parser"), (ALIKE2, HOSTILE_CWD)]),
            ("laptop", [(LAPTOPS, "/home/bob/web"), (ALIKE1, "/home/bob/parser")])]:
        src = tmp / f"src-{machine}"
        rels = []
        for sid, cwd in sessions:
            rel = f"projects/{project_folder(cwd)}/{sid}.jsonl"
            write(src, rel, transcript(sid, cwd))
            rels.append(rel.encode())
        shipper(src, store, tmp / f"{machine}.db", machine=machine).ship(rels)
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
    e.update({"HOME": str(tmp / "home"), "SYNCD_SOURCE": str(tmp / "dst"),
              "SYNCD_STORE": (tmp / "store").as_uri(), "SYNCD_MACHINE_ID": "desk",
              "SYNCD_STATE_DIR": str(tmp / "state"), "SYNCD_CONFIG": os.devnull})
    return e


def planned(r: subprocess.CompletedProcess[str]) -> set[str]:
    """The session ids whose transcripts a dry run's plan creates."""
    assert r.returncode == 0, (r.stdout, r.stderr)
    return {line.split()[1].rsplit("/", 1)[1].removesuffix(".jsonl")
            for line in r.stdout.splitlines()
            if line.startswith("create ") and line.split()[1].endswith(".jsonl")}


AMBIGUOUS = ("syncd: session 0f8e4c2a matches 2 sessions: "
             f"{ALIKE1} (desk, /home/alice/code/parser), "
             f"{ALIKE2} (desk, /home/alice/?]0;pwn?app); give more of its id")


@pytest.mark.parametrize("ref", [ALIKE1[:10], ALIKE1[:10].upper(), ALIKE1[:20], ALIKE1])
def test_restore_session_takes_a_unique_prefix(env: dict[str, str], ref: str) -> None:
    assert planned(syncd(env, "restore", "--session", ref, "--dry-run")) == {ALIKE1}


def test_restore_session_prefixes_are_resolved_against_the_machine_restored(
        env: dict[str, str]) -> None:
    # cccccccc is the laptop's alone: unknown to desk, unique to the laptop.
    line = one_line(syncd(env, "restore", "--session", LAPTOPS[:8], "--dry-run"), 1)
    assert line == "syncd: session cccccccc is in no backup (desk)"
    r = syncd(env, "restore", "--machine", "laptop", "--session", LAPTOPS[:8],
              "--session", "0f8e4c2a", "--dry-run")
    assert planned(r) == {LAPTOPS, ALIKE1}  # 0f8e4c2a is one session on the laptop


def test_an_ambiguous_prefix_names_every_match_in_one_line(env: dict[str, str]) -> None:
    for args in (("restore", "--session", "0f8e4c2a", "--dry-run"),
                 ("restore", "--session", ALIKE1, "--session", "0f8e4c2a"),
                 ("resume", "0f8e4c2a", "--machine", "desk")):
        assert one_line(syncd(env, *args), 2) == AMBIGUOUS, args
    # Every machine's sessions: desk's two and the laptop's copy of the first.
    line = one_line(syncd(env, "resume", "0f8e4c2a"), 2)
    assert line.startswith("syncd: session 0f8e4c2a matches 2 sessions: "
                           f"{ALIKE1} (desk, /home/alice/code/parser), "
                           f"{ALIKE1} (laptop, /home/bob/parser), {ALIKE2} (desk, "), line
    # One session that two machines hold, neither of them this one: which one is asked
    # for (exit 1, as before). This machine's own is the one meant (test_follow).
    line = one_line(syncd({**env, "SYNCD_MACHINE_ID": "other"}, "resume", ALIKE1[:12]), 1)
    assert line.startswith(f"syncd: session {ALIKE1[:12]} is in several machines' backups: "
                           "desk (last activity "), line
    assert line.endswith("; pick one with --machine"), line
    assert not (Path(env["SYNCD_SOURCE"]) / "projects").exists()  # nothing restored


def test_an_unknown_session_says_so(env: dict[str, str]) -> None:
    assert one_line(syncd(env, "resume", "deadbeef"), 1) == \
        "syncd: session deadbeef is in no backup (desk, laptop); a session begun in the " \
        "last few minutes may not be listed yet: name its machine with --machine"
    assert one_line(syncd(env, "resume", "deadbeef", "--machine", "laptop"), 1) == \
        "syncd: session deadbeef is in no backup (laptop)"
    assert one_line(syncd(env, "restore", "--session", "deadbeef-00", "--dry-run"), 1) == \
        "syncd: session deadbeef-00 is in no backup (desk)"
    # A whole id goes to the restore as it is, which says the same in its words.
    assert one_line(syncd(env, "restore", "--session", UNKNOWN, "--dry-run"), 1) == \
        f"syncd: session {UNKNOWN} is not in machine 'desk''s backup"


def test_resume_takes_a_unique_prefix(env: dict[str, str]) -> None:
    r = syncd(env, "resume", LAPTOPS[:8])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == f"cd /home/bob/web && claude --resume {LAPTOPS}"


def session(sid: str, machine: str, place: str) -> Session:
    return Session(sid, machine, f"projects/-x/{sid}.jsonl".encode(), fields={"cwd": place})


def test_matching_rules() -> None:
    assert names("0F8E4C2A", ALIKE1) and names(ALIKE1.upper(), ALIKE1)
    assert not names("0f8e4c2", ALIKE1) and not names(ALIKE1 + "0", ALIKE1)
    found = matching("0f8e4c2a-1", [("a", session(ALIKE1, "a", "/p")),
                                    ("a", session(ALIKE2, "a", "/q"))])
    assert [s.session_id for _, s in found] == [ALIKE1]
    # One machine's session in two project folders is one session.
    assert one("0f8e4c2a", found + found, machine_named=False) == ALIKE1
    many = [(f"m{i}", session(f"0f8e4c2a-{i:04x}-4000-8000-000000000000", f"m{i}", "/p"))
            for i in range(NAMED_MAX + 3)]
    with pytest.raises(AmbiguousSession, match=r"matches 8 sessions: .*m4, /p\) and 3 more; "):
        one("0f8e4c2a", many, machine_named=False)
    assert isinstance(AmbiguousSession("x"), UsageError)
    assert exit_code(AmbiguousSession("x")) == 2


def test_a_session_id_in_another_case_is_the_same_session() -> None:
    # A UUID's case is no part of it: a machine listing "0F8E4C2A-…" holds the session
    # "0f8e4c2a-…" too. Named whole, or by its prefix, it is that one session on two
    # machines (pick one with --machine), never "give more of its id" (there is none).
    upper = ALIKE1.upper()
    found = [("desk", session(ALIKE1, "desk", "/p")), ("evil", session(upper, "evil", "/e"))]
    for ref in (ALIKE1, ALIKE1[:8]):
        with pytest.raises(LookupFailed, match=r"several machines' backups: desk .*, evil "
                                               r".*pick one with --machine") as e:
            one(ref, matching(ref, found), machine_named=False)
        assert not isinstance(e.value, AmbiguousSession)
    # Each machine's own spelling, when it is named.
    assert one(ALIKE1, matching(ALIKE1, found[:1]), machine_named=True) == ALIKE1
    assert one(ALIKE1, matching(ALIKE1, found[1:]), machine_named=True) == upper


def test_a_hostile_machines_long_strings_leave_the_error_line_short() -> None:
    # A project path or a last activity is up to 4,096 characters from a store: the line
    # naming the matches shows each cut in its middle, its two ends kept.
    long_place = "/home/evil/" + "x" * 4000 + "/end"
    found = [(f"evil{i}", session(f"0f8e4c2a-{i:04x}-4000-8000-000000000000", f"evil{i}",
                                  long_place)) for i in range(NAMED_MAX)]
    with pytest.raises(AmbiguousSession) as e:
        one("0f8e4c2a", found, machine_named=False)
    line = str(e.value)
    assert len(line) < 1200, len(line)
    assert "(evil0, /home/evil/x" in line and "…" in line and "x/end)" in line, line
    twin = [(m, Session(ALIKE1, m, b"projects/-x/a.jsonl",
                        fields={"last_activity": "2026" + "9" * 4000})) for m in ("a", "b")]
    with pytest.raises(LookupFailed) as e:
        one(ALIKE1, twin, machine_named=False)
    assert len(str(e.value)) < 600, len(str(e.value))


def test_restore_at_a_time_resolves_a_prefix_in_the_backup_as_of_then(
        tmp_path: Path, env: dict[str, str]) -> None:
    """Two sessions alike in their first 8 characters, the second made after the first
    flush: as of that flush the prefix names one session, as of now it is ambiguous."""
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "src"
    ship = shipper(src, store, tmp_path / "desk.db", machine="desk")
    for sid in (ALIKE1, ALIKE2):
        rel = f"projects/{project_folder('/home/alice/p')}/{sid}.jsonl"
        write(src, rel, transcript(sid, "/home/alice/p"))
        ship.ship([rel.encode()])
        shipped = time.time()
        while time.time() < shipped + 0.002:  # the next flush a later millisecond
            pass
    e = dict(env, SYNCD_STORE=(tmp_path / "store").as_uri(),
             SYNCD_STATE_DIR=str(tmp_path / "state"))
    r = syncd(e, "snapshots", "--json")
    assert r.returncode == 0, r.stderr
    first = min(json.loads(r.stdout), key=lambda p: p["seq"])["at"]
    # `snapshots` shows each as the commands take it: longer where the two begin alike.
    table = syncd(e, "snapshots").stdout
    assert ALIKE1[:10] in table and ALIKE2[:10] in table and " 0f8e4c2a " not in table, table
    assert planned(syncd(e, "restore", "--session", "0f8e4c2a", "--at", first,
                         "--dry-run")) == {ALIKE1}
    assert one_line(syncd(e, "restore", "--session", "0f8e4c2a", "--dry-run"), 2) \
        .startswith("syncd: session 0f8e4c2a matches 2 sessions: ")

"""``syncd forget`` and ``syncd redact`` as a user runs them: the local tree, the state,
the search index and the backup agree afterwards, and nothing ships again."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, restore
from syncd.store import LocalStore
from tests.helpers import one_line, syncd, tree_bytes, write

SA = "aaaaaaaa-0000-4000-8000-000000000001"
SB = "bbbbbbbb-0000-4000-8000-000000000002"
TA = f"projects/-home-u-app/{SA}.jsonl"
TB = f"projects/-home-u-app/{SB}.jsonl"
SUB = f"projects/-home-u-app/{SA}/subagents/agent-a1.jsonl"
SECRET = "ghp_" + "Z9" * 18  # a GitHub token's shape
OLD = 1_700_000_000  # files older than any quiet window


def entry(sid: str, i: int, text: str) -> bytes:
    return json.dumps({"type": "user", "sessionId": sid, "uuid": f"{i:08x}",
                       "cwd": "/home/u/app", "message": {"role": "user", "content": text}}
                      ).encode() + b"\n"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
    e.update({"HOME": str(tmp_path / "home"), "SYNCD_SOURCE": str(tmp_path / "claude"),
              "SYNCD_STORE": (tmp_path / "store").as_uri(), "SYNCD_MACHINE_ID": "desk",
              "SYNCD_STATE_DIR": str(tmp_path / "state"), "SYNCD_CONFIG": os.devnull})
    src = tmp_path / "claude"
    write(src, TA, entry(SA, 0, "hello") + entry(SA, 1, "my token " + SECRET))
    write(src, SUB, entry(SA, 2, "sub"))
    write(src, TB, entry(SB, 0, "other " + SECRET) + entry(SB, 1, "bye"))
    write(src, "history.jsonl", b"".join(
        json.dumps({"display": f"p{i}", "sessionId": s}).encode() + b"\n"
        for i, s in enumerate([SA, SB, SA])))
    for dirpath, _, names in os.walk(src):
        for n in names:
            os.utime(os.path.join(dirpath, n), (OLD, OLD))
    r = syncd(e, "sync")
    assert r.returncode == 0, r.stderr
    r = syncd(e, "compact")
    assert r.returncode == 0, r.stderr
    return e


def backup(env: dict[str, str]) -> dict[bytes, bytes]:
    store = LocalStore(Path(env["SYNCD_STORE"].removeprefix("file://")))
    with tempfile.TemporaryDirectory() as d:
        r = restore(Repository(store, "desk"), RestoreOptions(target=Path(d),
                                                              local_machine="desk"))
        assert r.errors == []
        return tree_bytes(Path(d))


def test_forget_local_takes_the_session_out_here_and_in_the_backup(env: dict[str, str]) -> None:
    src = Path(env["SYNCD_SOURCE"])
    dry = syncd(env, "forget", "--session", SA[:8], "--local", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert (src / TA).exists()

    r = syncd(env, "forget", "--session", SA[:8], "--local")

    assert r.returncode == 0, r.stderr
    assert not (src / TA).exists() and not (src / SUB).exists()
    hist = (src / "history.jsonl").read_bytes()
    assert SA.encode() not in hist and hist.count(b"\n") == 3
    got = backup(env)
    assert not any(SA.encode() in p for p in got)
    assert got[TB.encode()] == (src / TB).read_bytes()
    assert got[b"history.jsonl"] == hist
    # Nothing ships again: a sync finds nothing new.
    again = syncd(env, "sync")
    assert again.returncode == 0, again.stderr
    assert backup(env) == got


def test_redact_masks_here_and_in_the_backup_and_nothing_ships_again(
        env: dict[str, str]) -> None:
    src = Path(env["SYNCD_SOURCE"])
    r = syncd(env, "redact", "ghp_[A-Za-z0-9]{36}")
    assert r.returncode == 0, r.stderr
    for rel in (TA, TB):
        data = (src / rel).read_bytes()
        assert SECRET.encode() not in data and b"[REDACTED" in data
    got = backup(env)
    assert got[TA.encode()] == (src / TA).read_bytes()
    assert got[TB.encode()] == (src / TB).read_bytes()
    before = sorted(os.listdir(Path(env["SYNCD_STORE"].removeprefix("file://"))
                               / "machines" / "desk" / "snap"))
    again = syncd(env, "sync")
    assert again.returncode == 0, again.stderr
    # One segment: the redaction's tombstone (for followers), none of the masked files.
    repo = Repository(LocalStore(Path(env["SYNCD_STORE"].removeprefix("file://"))), "desk")
    segs = [repo.read_index(k, n) for k, n in repo.segments()]
    assert len(segs) == 1 and {r.session for r in segs[0].redacted} == {SA, SB}
    assert not segs[0].extents and not segs[0].copies, "the masked files were shipped again"
    assert before


def test_redact_refuses_a_pattern_that_matches_nothing(env: dict[str, str]) -> None:
    assert "empty match" in one_line(syncd(env, "redact", "x*"), 2)


def test_redact_refuses_while_a_file_is_being_written(env: dict[str, str]) -> None:
    src = Path(env["SYNCD_SOURCE"])
    os.utime(src / TA)  # written just now
    before = tree_bytes(src)
    r = syncd(env, "redact", "ghp_[A-Za-z0-9]{36}")
    assert r.returncode == 1 and "being written" in r.stderr, r.stderr
    assert tree_bytes(src) == before
    assert SECRET.encode() in backup(env)[TA.encode()]


def test_redact_leaves_a_thinking_block_alone_and_says_so(env: dict[str, str]) -> None:
    src = Path(env["SYNCD_SOURCE"])
    think = json.dumps({"type": "assistant", "sessionId": SB, "message": {"content": [
        {"type": "thinking", "thinking": "recall " + SECRET, "signature": "c2ln"}]}}
                       ).encode() + b"\n"
    write(src, TB, think, "ab")
    os.utime(src / TB, (OLD, OLD))
    assert syncd(env, "sync").returncode == 0
    r = syncd(env, "redact", "ghp_[A-Za-z0-9]{36}")
    assert r.returncode == 0, r.stderr
    assert "left alone" in r.stderr and "thinking" in r.stderr
    assert f"syncd forget --session {SB}" in r.stderr
    data = (src / TB).read_bytes()
    assert data.endswith(think) and data.count(SECRET.encode()) == 1
    assert backup(env)[TB.encode()] == data


def test_forget_on_another_machine_only_while_its_lease_is_free(
        env: dict[str, str], tmp_path: Path) -> None:
    from syncd.security.lease import Lease
    lap_src = tmp_path / "lap"
    lid = "cccccccc-0000-4000-8000-000000000003"
    lt = f"projects/-home-l-x/{lid}.jsonl"
    write(lap_src, lt, entry(lid, 0, "on the laptop"))
    lap = {**env, "SYNCD_MACHINE_ID": "lap", "SYNCD_SOURCE": str(lap_src),
           "SYNCD_STATE_DIR": str(tmp_path / "lapstate")}
    assert syncd(lap, "sync").returncode == 0
    store = LocalStore(Path(env["SYNCD_STORE"].removeprefix("file://")))
    held = Lease(store, "lap", owner="someone-else")
    held.acquire()
    try:
        r = syncd(env, "forget", "--session", lid, "--machine", "lap")
        assert r.returncode == 1 and "not reached: lap" in r.stderr, r.stderr
        # forget has no --takeover, and lap does not follow this machine: neither is
        # offered; stopping its daemon is
        assert "--takeover" not in r.stderr and "tombstone" not in r.stderr, r.stderr
        assert "stop its daemon" in r.stderr, r.stderr
    finally:
        held.release()
    r = syncd(env, "forget", "--session", lid, "--machine", "lap")
    assert r.returncode == 0, r.stderr
    with tempfile.TemporaryDirectory() as d:
        rr = restore(Repository(store, "lap"), RestoreOptions(target=Path(d)))
        assert rr.errors == [] and lid.encode() not in b"".join(tree_bytes(Path(d)))


def test_forget_wakes_the_running_daemon_to_ship_the_tombstone(env: dict[str, str]) -> None:
    import subprocess
    import sys

    from tests.helpers import wait_for
    store = LocalStore(Path(env["SYNCD_STORE"].removeprefix("file://")))
    sc = "dddddddd-0000-4000-8000-000000000004"  # no history line: forgetting it changes
    src = Path(env["SYNCD_SOURCE"])                # no file here
    write(src, f"projects/-home-u-app/{sc}.jsonl", entry(sc, 0, "quiet one"))
    os.utime(src / f"projects/-home-u-app/{sc}.jsonl", (OLD, OLD))
    # An hour between reconcile scans: only a wake makes the idle daemon flush.
    e = {**env, "SYNCD_RECONCILE_INTERVAL": "3600"}
    p = subprocess.Popen([sys.executable, "-m", "syncd", "run"], env=e,
                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        def running() -> bool:
            r = syncd(e, "status", "--json")
            return r.returncode in (0, 1) and json.loads(r.stdout).get("daemon_pid") == p.pid
        wait_for(running, 60, "the daemon")

        def announced() -> bool:  # the store confirmed the segment carrying it
            from syncd.backup.state import State
            (db,) = Path(env["SYNCD_STATE_DIR"]).glob("desk@*.sqlite")
            st = State(db, readonly=True)
            try:
                f = st.forgotten().get(sc)
                return f is not None and f.announced == 1
            finally:
                st.close()
        wait_for(lambda: bool(list(store.list("machines/desk/seg/"))), 60, "the seed")
        r = syncd(e, "forget", "--session", sc)
        assert r.returncode == 0, r.stderr
        wait_for(announced, 60, "the tombstone")
    finally:
        p.terminate()
        p.wait(30)


def test_redact_a_finding_of_syncd_secrets_everywhere(env: dict[str, str]) -> None:
    src = Path(env["SYNCD_SOURCE"])
    r = syncd(env, "secrets", "--json")
    assert r.returncode == 1, r.stderr  # findings
    found = [f for s in json.loads(r.stdout)["sessions"] for f in s["findings"]
             if f["kind"] == "GitHub Token"]
    assert found, r.stdout
    r = syncd(env, "redact", "--finding", found[0]["id"])
    assert r.returncode == 0, r.stderr
    for rel in (TA, TB):  # the value, wherever it is
        assert SECRET.encode() not in (src / rel).read_bytes()
        assert SECRET.encode() not in backup(env)[rel.encode()]
    r = syncd(env, "secrets")
    assert r.returncode == 0, r.stdout + r.stderr  # nothing left to find
    assert "no finding" in one_line(syncd(env, "redact", "--finding", "0" * 12), 2)


def test_redact_the_next_finding_of_a_file_a_redact_masked(env: dict[str, str]) -> None:
    """The ids `syncd secrets` listed stay usable: a redact drops the findings of the
    files it masked (scanned again), and the next `redact --finding` of that list scans
    first instead of saying there is no such finding."""
    src = Path(env["SYNCD_SOURCE"])
    key = "AKIAZ3MXQ7RPLW4KT2NB"
    write(src, TA, entry(SA, 3, "and the key " + key), "ab")
    os.utime(src / TA, (OLD, OLD))
    assert syncd(env, "sync").returncode == 0
    r = syncd(env, "secrets", "--json")
    found = {f["kind"]: f["id"] for s in json.loads(r.stdout)["sessions"]
             for f in s["findings"] if f["path"] == TA}
    assert set(found) >= {"GitHub Token", "AWS Access Key"}, r.stdout
    r = syncd(env, "redact", "--finding", found["GitHub Token"])
    assert r.returncode == 0, r.stderr
    os.utime(src / TA, (OLD, OLD))  # quiet again

    r = syncd(env, "redact", "--finding", found["AWS Access Key"])

    assert r.returncode == 0, r.stderr
    assert key.encode() not in (src / TA).read_bytes()
    assert key.encode() not in backup(env)[TA.encode()]


def test_forget_without_a_session_is_bad_usage_in_one_line(env: dict[str, str]) -> None:
    assert "--session" in one_line(syncd(env, "forget"), 2)
    assert "--session" in one_line(syncd(env, "forget", "--lift"), 2)


def test_lift_a_forgotten_session_by_its_prefix(env: dict[str, str]) -> None:
    """The backup no longer holds a forgotten session, so its prefix is found among the
    forgotten sessions here; a session not forgotten is said to be so."""
    assert syncd(env, "forget", "--session", SA[:8]).returncode == 0

    r = syncd(env, "forget", "--session", SA[:8], "--lift")

    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{SA}: lifted"), r.stdout
    assert "not forgotten" in one_line(syncd(env, "forget", "--session", SA, "--lift"), 1)


def test_a_redact_right_after_another_is_not_refused_for_its_own_write(
        env: dict[str, str]) -> None:
    """The first redact's in-place mask is no write of Claude's: the next redact of the
    same file goes ahead (a write since, or the file held open, still refuses it)."""
    src = Path(env["SYNCD_SOURCE"])
    assert syncd(env, "redact", "ghp_[A-Za-z0-9]{36}").returncode == 0

    r = syncd(env, "redact", "hello")

    assert r.returncode == 0, r.stderr
    assert b"hello" not in (src / TA).read_bytes()
    write(src, TA, entry(SA, 5, "more"), "ab")  # Claude writes again
    r = syncd(env, "redact", "more")
    assert r.returncode == 1 and "being written" in r.stderr, r.stderr


def test_a_dry_run_names_the_files(env: dict[str, str]) -> None:
    r = syncd(env, "redact", "ghp_[A-Za-z0-9]{36}", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert f"    {TA}: 1" in r.stdout and f"    {TB}: 1" in r.stdout, r.stdout
    r = syncd(env, "forget", "--session", SA[:8], "--dry-run")
    assert f"    {TA}: dropped" in r.stdout and f"    {SUB}: dropped" in r.stdout, r.stdout


def test_redact_beside_a_running_daemon_takes_what_it_just_shipped(
        env: dict[str, str]) -> None:
    import subprocess
    import sys

    from tests.helpers import wait_for
    src = Path(env["SYNCD_SOURCE"])
    fresh = "ghp_" + "Q7" * 18
    p = subprocess.Popen([sys.executable, "-m", "syncd", "run"], env=env,
                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        def running() -> bool:
            r = syncd(env, "status", "--json")
            return r.returncode in (0, 1) and json.loads(r.stdout).get("daemon_pid") == p.pid
        wait_for(running, 60, "the daemon")
        write(src, TB, entry(SB, 9, "new token " + fresh), "ab")
        os.utime(src / TB, (OLD, OLD))
        wait_for(lambda: fresh.encode() in backup(env).get(TB.encode(), b""), 60,
                 "the new line shipped")
        r = syncd(env, "redact", "ghp_Q7[A-Za-z0-9]{34}")  # (the head lags: 5 min)
        assert r.returncode == 0, r.stdout + r.stderr
        assert fresh.encode() not in (src / TB).read_bytes()
        assert fresh.encode() not in backup(env)[TB.encode()]
    finally:
        p.terminate()
        p.wait(30)

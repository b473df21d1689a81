"""Local hygiene: private modes for everything syncd creates, secrets masked everywhere,
and the never-upload list enforced in one place with nothing going around it."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from syncd.backup.engine import sync_once
from syncd.backup.errorlog import record_error
from syncd.backup.scan import scan
from syncd.backup.state import State
from syncd.claude import NEVER_DIRS, Selection, is_never, project_folder
from syncd.format.segment import HEADER, TRAILER, SegmentWriter
from syncd.redact import add_env_secrets, add_secret, redact
from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, restore, restore_tree
from syncd.service.log import PLAIN_FORMAT, OneLine
from syncd.store import LocalStore, MemoryStore
from syncd.store.layout import segment_key
from tests.faultkit import make_settings, store_of, write
from tests.helpers import shipper

SECRET = b"sk-ant-TOP-SECRET-credential-9d1e"
SID = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
NEVER_PATHS = [".credentials.json", ".claude.json", ".claude.json.backup", ".Credentials.json",
               "projects/-home-a/x.lock", *(f"{d}/file.json" for d in sorted(NEVER_DIRS)),
               # remote sessions' ingress token and an auth file, at any depth
               ".session_ingress_token", "remote/.session_ingress_token",
               ".Session_Ingress_Token", "hfi-auth.json", "projects/-home-a/hfi-auth.json",
               "plugins/x/HFI-Auth.json", "hfi-auth.json.tmp.123",
               # syncd's own: a killed restore's temp file and staging folder
               "projects/-home-a/.syncd-4242-0123456789ab.tmp",
               "projects/-home-a/.syncd-0123456789ab.tmp", ".syncd-restore-k2j3h4/0/1a2b"]


def mode(p: Path | str) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0o022)  # what a user's shell usually has: modes must not depend on it
    try:
        yield
    finally:
        os.umask(old)


# -- modes ------------------------------------------------------------------------------------

def test_state_lock_and_local_store_are_private(tmp_path: Path, loose_umask: None) -> None:
    s = make_settings(tmp_path, state_dir=tmp_path / "deep" / "state",
                      store=(tmp_path / "deep2" / "store").as_uri())
    write(s.source, "projects/-home-a/s.jsonl", b"line\n")
    sync_once(s)
    for d in (tmp_path / "deep", s.state_dir, tmp_path / "deep2", tmp_path / "deep2" / "store",
              tmp_path / "deep2" / "store" / "machines" / "m1" / "seg"):
        assert mode(d) == 0o700, d
    files = [p for p in s.state_dir.iterdir()]
    assert {p.suffix for p in files} >= {".sqlite", ".lock"}
    for p in [*files, *(tmp_path / "deep2" / "store").rglob("*")]:
        if p.is_file():
            assert mode(p) == 0o600, p


def test_a_loose_state_dir_is_tightened(tmp_path: Path, loose_umask: None) -> None:
    s = make_settings(tmp_path)
    s.state_dir.mkdir(mode=0o755)
    os.chmod(s.state_dir, 0o755)
    write(s.source, "history.jsonl", b"x\n")
    sync_once(s)
    assert mode(s.state_dir) == 0o700
    st = State(s.state_file)
    st.close()
    assert mode(s.state_file) == 0o600


def test_conflict_copies_are_private(tmp_path: Path, loose_umask: None) -> None:
    s = make_settings(tmp_path)
    write(s.source, "plans/p.md", b"backed up\n")
    sync_once(s)
    write(s.source, "plans/p.md", b"changed here\n")  # diverged: local kept, copy saved
    conflicts = tmp_path / "state" / "conflicts"
    report = restore(Repository(store_of(s), "m1"),
                     RestoreOptions(target=s.source, conflicts_dir=conflicts))
    [copy] = [a.conflict_copy for a in report.actions if a.conflict_copy]
    assert copy is not None and Path(copy).read_bytes() == b"backed up\n"
    assert mode(copy) == 0o600
    d = Path(copy).parent
    while d != tmp_path / "state":
        assert mode(d) == 0o700, d
        d = d.parent


# -- secrets ----------------------------------------------------------------------------------

def test_redact_masks_registered_secrets_and_url_credentials() -> None:
    add_secret("hunter2-passphrase")
    add_secret("ab")  # too short to mask safely: ignored
    assert redact("bad hunter2-passphrase here") == "bad *** here"
    assert redact("s3://AKIA:wJalr@bucket/x and http://u:p@h:1/") == \
        "s3://***@bucket/x and http://***@h:1/"
    assert redact("ab cd") == "ab cd"
    add_secret("8-chars!")  # the shortest masked anywhere
    assert redact("key=8-chars!;") == "key=***;"


def test_a_short_secret_does_not_garble_our_own_words() -> None:
    """Masking "wrong" would turn our text into "*** passphrase": unreadable, and in a
    known sentence it points at the secret."""
    add_secret("wrong")
    add_secret(" pass\n")
    message = "keys/k1: does not open with this passphrase (wrong passphrase, or altered)"
    assert redact(message) == message



def test_no_control_character_reaches_a_shown_line() -> None:
    """A store's file name with an escape sequence or a bidi override in an error line
    cannot drive the terminal; lines and tabs stay."""
    shown = redact("projects/x\x1b]0;pwned\x07\u202eld.jsonl: gone\tsee\nnext \x9b2J")
    assert shown == "projects/x?]0;pwned??ld.jsonl: gone\tsee\nnext ?2J"

def test_logs_and_the_error_log_never_hold_a_secret(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value-123")
    add_env_secrets()  # what the CLI's logging setup does first
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(OneLine(PLAIN_FORMAT, journal=False))
    logger = logging.getLogger("syncd.test-redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.error("request failed: key=%s", "aws-secret-value-123")
        try:
            raise ValueError("token aws-secret-value-123\nsecond line")
        except ValueError:
            logger.exception("boom")
    finally:
        logger.removeHandler(handler)
    assert "aws-secret-value-123" not in buf.getvalue() and "***" in buf.getvalue()
    assert len(buf.getvalue().splitlines()) == 2  # one line per event, tracebacks included
    st = State(tmp_path / "s.sqlite")
    try:
        record_error(st, "store said: aws-secret-value-123")
        assert "aws-secret-value-123" not in (st.meta("last_error") or "")
    finally:
        st.close()


# -- the never-upload list ----------------------------------------------------------------------

@pytest.mark.parametrize("rel", NEVER_PATHS)
def test_never_list_wins_over_any_glob(rel: str) -> None:
    assert is_never(rel)
    assert not Selection(include=["**", rel]).wants(rel)


def _all_plaintext(store: LocalStore) -> bytes:
    out = []
    for info in store.list(""):
        blob = store.get(info.key)
        out.append(blob)
        if "/seg/" in info.key:
            off, length = TRAILER.unpack(blob[-TRAILER.size:])[:2]
            reader = zstandard.ZstdDecompressor().stream_reader(
                io.BytesIO(blob[HEADER.size : off + length]), read_across_frames=True)
            out.append(reader.read())
    return b"".join(out)


def test_nothing_on_the_never_list_leaves_by_any_path(tmp_path: Path) -> None:
    s = make_settings(tmp_path, include=["**"])
    for rel in NEVER_PATHS:
        write(s.source, rel, SECRET)
    write(s.source, "projects/-home-a/s.jsonl", b"ok\n")
    # The scan does not report them, a full sync does not ship them...
    st = State(tmp_path / "probe.sqlite")
    found = scan(os.fsencode(s.source), Selection(include=["**"]), st)
    st.close()
    assert found.dirty == {b"projects/-home-a/s.jsonl"}
    sync_once(s)
    # ...and neither does the shipper when handed their paths directly (a watcher bug, say).
    sh = shipper(s.source, store_of(s), tmp_path / "direct.sqlite", machine="m2")
    sh.selection = Selection(include=["**"])
    result = sh.ship([os.fsencode(r) for r in NEVER_PATHS])
    assert result.files == 0 and not result.segments
    store = LocalStore(tmp_path / "store")
    assert SECRET not in _all_plaintext(store)
    assert b"ok\n" in _all_plaintext(store)


def test_restore_never_writes_a_never_list_file(tmp_path: Path) -> None:
    """A credentials file planted in the store is not restored into the Claude tree."""
    store = MemoryStore()
    w = SegmentWriter("m1", 0, 1.0)
    w.add_data(b".credentials.json", 1, 0, SECRET, mode=0o600, mtime_ns=1)
    w.add_data(b"statsig/x", 1, 0, SECRET, mode=0o600, mtime_ns=1)
    w.add_data(b"history.jsonl", 1, 0, b"h\n", mode=0o600, mtime_ns=1)
    store.put(segment_key("m1", 0), w.finish())
    report = restore_tree(Repository(store, "m1"), tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["history.jsonl"]
    skipped = {a.path for a in report.actions if a.action == "refuse"}
    assert skipped == {".credentials.json", "statsig/x"}


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_token_in_a_git_remote_never_reaches_the_store(tmp_path: Path) -> None:
    """The project's git facts (for restore's clone matching) hold its remote without the
    credential a CI or devcontainer checkout may carry in the URL."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (("init", "-q"), ("remote", "add", "origin",
                                  "https://x-access-token:ghs_SeCrEtToKeN42@github.com/acme/app.git")):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    s = make_settings(tmp_path)
    write(s.source, f"projects/{project_folder(str(repo))}/{SID}.jsonl",
          json.dumps({"type": "user", "uuid": "u1", "sessionId": SID, "cwd": str(repo)},
                     separators=(",", ":")).encode() + b"\n")
    sync_once(s)
    stored = _all_plaintext(LocalStore(tmp_path / "store"))
    assert b"ghs_SeCrEtToKeN42" not in stored and b"x-access-token" not in stored
    assert b"https://github.com/acme/app.git" in stored  # the fact itself was recorded

"""Secrets: the detector (detect-secrets' plugins on decoded strings, findings placed in
the raw bytes, signed strings marked), the findings database, the incremental scanner,
the daemon's scan after a flush, another machine's backup scanned (SeaweedFS, plain and
encrypted), hostile input, real samples, and ``syncd secrets`` / ``status``."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from syncd.backup.ship import Shipper
from syncd.backup.state import State
from syncd.claude import Selection
from syncd.config import Settings, load_settings
from syncd.repository import Repository
from syncd.secrets.detector import LINE_MAX, RawFinding, scan_bytes
from syncd.secrets.findings import FILE_NAME, Findings, lookup, value_of
from syncd.secrets.remote import scan_machine
from syncd.secrets.scanner import Scanner
from syncd.security.keys import init_encryption
from syncd.store import MemoryStore, Store, layout, open_store
from tests.helpers import one_line, running, syncd, wait_for, write
from tests.seaweed import Seaweed

S1 = "11111111-1111-4111-8111-111111111111"
S2 = "22222222-2222-4222-8222-222222222222"
T1 = f"projects/-home-u-app/{S1}.jsonl"
T2 = f"projects/-home-u-app/{S2}.jsonl"
SUB = f"projects/-home-u-app/{S1}/subagents/agent-a1.jsonl"
TOOL = f"projects/-home-u-app/{S1}/tool-results/toolu_01.txt"
CHEAP = 1 << 12

# Well-known example values (AWS's documentation's own) and made-up tokens.
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GITHUB = "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"
GITHUB2 = "ghp_Zx9Qm2Lr7Tb4Kc8Vn1Hs5Dw3Gy6Pa0Ej2Fo7"
PASSWORD = "Tr0ub4dor&3-horse"
PEM = ("-----BEGIN RSA PRIVATE KEY-----\n"
       "MIIEpAIBAAKCAQEA7bq3xYz1Lm9QvJk2Rw8Hn4Tg5Cp6Df0Ae1Bs2Ct3Du4Ev5Fw6\n"
       "Gx7Hy8Iz9Ja0Kb1Lc2Md3Ne4Of5Pg6Qh7Ri8Sj9Tk0Ul1Vm2Wn3Xo4Yp5Zq6==\n"
       "-----END RSA PRIVATE KEY-----")


def line(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


def user(content: Any) -> bytes:
    return line({"type": "user", "sessionId": S1, "cwd": "/home/u/app",
                 "message": {"role": "user", "content": content}})


def tool_result(out: str) -> bytes:
    return user([{"type": "tool_result", "tool_use_id": "toolu_01", "content": out}])


def answer(*blocks: dict[str, Any]) -> bytes:
    return line({"type": "assistant", "requestId": "req_011CY4p6wvSLjiJyWSJ2VXzB",
                 "message": {"role": "assistant", "content": list(blocks)}})


def thinking(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text,
            "signature": "EqQBCkYIBxgCKkBzP7dW2tA9gQ4Lq1nRk8mVhX0cJfYs3eUoBi5TaZrNwGp6Hd"}


def planted() -> bytes:
    return b"".join([
        user(f"my keys: {AWS_ID} and aws_secret_access_key = \"{AWS_SECRET}\""),
        tool_result(f"$ cat ~/.ssh/id_rsa\n{PEM}\n$ echo done"),
        answer({"type": "text", "text": f'config.py has db_password = "{PASSWORD}"'}),
        answer(thinking(f"the user pasted {GITHUB} earlier"),
               {"type": "text", "text": "I will not repeat it."}),
        user("nothing here, just words about a password policy"),
    ])


def kinds(found: list[RawFinding]) -> list[str]:
    return [f.kind for f in found]


def test_planted_secrets_are_found_where_their_raw_bytes_are() -> None:
    data = planted()
    found = scan_bytes(data, 1000)
    assert sorted(kinds(found)) == sorted([
        "AWS Access Key", "AWS Access Key", "Private Key", "Secret Keyword", "GitHub Token"])
    by = {data[f.offset - 1000:f.offset - 1000 + f.length]: f for f in found}
    # The value as it is in the file: the key's newlines as the two bytes \n.
    raw_pem = json.dumps(PEM)[1:-1].encode()
    assert set(by) == {AWS_ID.encode(), AWS_SECRET.encode(), raw_pem, PASSWORD.encode(),
                       GITHUB.encode()}
    assert [by[v.encode()].line for v in (AWS_ID, AWS_SECRET, PASSWORD, GITHUB)] == \
        [1, 1, 3, 4]
    assert by[raw_pem].line == 2
    for raw, f in by.items():
        assert f.sha256 == hashlib.sha256(raw).hexdigest()
        left, _, right = f.masked.partition("…")
        assert len(left) <= 4 and len(right) <= 4 and f.masked.count("…") == 1
    assert by[AWS_ID.encode()].masked == "AKIA…MPLE"
    assert by[raw_pem].masked == "MIIE…q6=="  # the key's body, not its armour
    assert [f.signed for f in found if f.kind == "GitHub Token"] == [True]
    assert not any(f.signed for f in found if f.kind != "GitHub Token")
    # Each can be replaced in place: the lines stay JSON, the rest as it was.
    out = bytearray(data)
    for f in sorted(found, key=lambda f: -f.offset):
        out[f.offset - 1000:f.offset - 1000 + f.length] = b"[REDACTED]"
    rows = [json.loads(x) for x in bytes(out).splitlines()]
    assert "[REDACTED]" in rows[1]["message"]["content"][0]["content"]
    assert "BEGIN RSA" not in bytes(out).decode() and AWS_SECRET not in bytes(out).decode()


def test_escapes_and_non_ascii_before_a_secret_keep_its_offset() -> None:
    data = line({"type": "user", "message": {"content": "é\u2192\t\"q\" \ud83d\ude00 "
                 f"\\ {GITHUB2}"}}) + line({"x": "\\u00e9 é " + GITHUB2}).replace(
        b"\xc3\xa9", b"\\u00e9", 1)
    found = scan_bytes(data)
    assert [data[f.offset:f.offset + f.length] for f in found] == [GITHUB2.encode()] * 2
    assert [f.line for f in found] == [1, 2]


def test_ids_digests_paths_and_placeholders_are_not_secrets() -> None:
    data = b"".join([
        answer({"type": "text", "text": 'sha256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b'
                '934ca495991b7852b855" and commit "4b825dc642cb6eb9a060e54bf8d69288fbee4904"'}),
        user('error {"request_id": "req_011CY4p6xasfHCB9AheUuTkb", "uuid": '
             '"4d5611e5-241a-462a-8d15-5122611a9569"}'),
        user('see "/home/u/app/experiments/2026-03-13-code-review/charming-analysis/x.md"'),
        user("format: postgres://username:password@endpoint/db and "
             'STORE_PASSWORD = "changeit"'),
    ])
    assert scan_bytes(data) == []


def test_the_signed_strings_are_thinking_signature_and_redacted_data() -> None:
    tok = GITHUB2
    data = answer(
        {"type": "thinking", "thinking": "t " + tok, "signature": "s " + tok},
        {"type": "redacted_thinking", "data": "d " + tok},
        {"type": "text", "text": "x " + tok},
        {"type": "tool_use", "name": "Bash", "input": {"command": "echo " + tok}})
    found = scan_bytes(data)
    assert [f.signed for f in found] == [True, True, True, False, False]


# -- hostile input ----------------------------------------------------------------------

def test_hostile_lines_are_a_note_each_and_the_scan_goes_on() -> None:
    huge = b'{"type":"user","message":{"content":"' + b"A" * (LINE_MAX + 10) + b'"}}\n'
    bad_utf8 = b'{"type":"user","message":{"content":"\xff\xfe caf\xc3 ' + \
        GITHUB.encode() + b' \\uZZZZ \\"}}\n'
    deep = b"[" * 200_000 + b'"' + GITHUB2.encode() + b'"' + b"]" * 200_000 + b"\n"
    unclosed = b'{"a":"' + b"x\\" * 1000 + b"\n"
    notes: list[str] = []
    data = huge + bad_utf8 + deep + unclosed + user(f"after all that: {AWS_ID}")
    found = scan_bytes(data, notes=notes)
    assert [(f.kind, f.line) for f in found] == [
        ("GitHub Token", 2), ("GitHub Token", 3), ("AWS Access Key", 5)]
    assert [data[f.offset:f.offset + f.length] for f in found] == [
        GITHUB.encode(), GITHUB2.encode(), AWS_ID.encode()]
    assert len(notes) == 1 and notes[0].startswith("line 1 at byte 0: ")


# -- the findings and the scanner --------------------------------------------------------

@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "claude"
    (root / "projects").mkdir(parents=True)
    return root


@pytest.fixture
def db(tmp_path: Path) -> Findings:
    f = Findings.open(tmp_path / "state" / FILE_NAME)
    yield f  # type: ignore[misc]
    f.close()


def snapshot(root: Path) -> dict[str, tuple[bytes, int, int]]:
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_ino)
            for p in root.rglob("*") if p.is_file()}


def test_the_tree_s_transcripts_subagents_and_tool_results_are_scanned(
        tree: Path, db: Findings, tmp_path: Path) -> None:
    write(tree, T1, planted())
    write(tree, SUB, tool_result(f"found {GITHUB2} in .env"))
    write(tree, TOOL, f"line one\nSLACK=xoxb-1234-5678-abcdefghijkl\n{PEM}\n".encode())
    write(tree, T2, user("a clean session"))
    write(tree, "history.jsonl", line({"display": f"export TOKEN={GITHUB2}",
                                       "sessionId": S2}))
    write(tree, "settings.json", f'{{"k": "{GITHUB2}"}}'.encode())  # not scanned
    before = snapshot(tree)
    p = Scanner(db, tree, "m1").update_all()
    assert snapshot(tree) == before  # nothing altered, not even an mtime
    assert p.files == 5
    found = db.findings("m1")
    where = {(f.path.decode(), f.kind) for f in found}
    assert (SUB, "GitHub Token") in where and (TOOL, "Slack Token") in where
    assert (TOOL, "Private Key") in where and ("history.jsonl", "GitHub Token") in where
    assert not any(f.path.decode() in (T2, "settings.json") for f in found)
    assert {f.session for f in found if f.path.decode() != "history.jsonl"} == {S1}
    assert db.sessions_with_findings("m1") == 2  # S1, and S2 by its history line
    assert [f.session for f in found if f.path == b"history.jsonl"] == [S2]
    tool = [f for f in found if f.path.decode() == TOOL]
    assert [f.line for f in tool] == [2, 3]
    assert value_of(tree, tool[1]) == PEM.encode()
    # The ids are stable, lookup finds them, and no value is in the database.
    again = lookup(tmp_path / "state", found[0].id)
    assert again == found[0] and len(found[0].id) == 12
    assert lookup(tmp_path / "state", "0" * 12) is None
    db.commit()
    stored = b"".join(p.read_bytes() for p in (tmp_path / "state").iterdir())
    for value in (AWS_SECRET, GITHUB, GITHUB2, PASSWORD, "abcdefghijkl"):
        assert value.encode() not in stored
    assert stat.S_IMODE(os.stat(tmp_path / "state" / FILE_NAME).st_mode) == 0o600


def test_appended_bytes_only_are_scanned_and_a_rewrite_is_scanned_again(
        tree: Path, db: Findings) -> None:
    first = planted()
    write(tree, T1, first)
    s = Scanner(db, tree, "m1")
    assert s.update_all().bytes == len(first)
    ids = {f.id for f in db.findings()}
    tail = user(f"and later {GITHUB2}")
    write(tree, T1, tail, mode="ab")
    p = s.update([T1.encode()])
    assert (p.bytes, p.rescanned) == (len(tail), 0)  # the new line only
    after = db.findings()
    assert {f.id for f in after} > ids and len(after) == len(ids) + 1
    new = next(f for f in after if f.id not in ids)
    assert (new.line, new.offset) == (6, len(first) + tail.index(GITHUB2.encode()))
    extents = db.db.execute("SELECT start, end, found, scans FROM extents").fetchall()
    assert extents == [(0, len(first) + len(tail), len(ids) + 1, 2)]  # grown, not a row each
    # A cut (same inode, shorter) and a rewrite (a new inode) are scanned from 0.
    with open(tree / T1, "r+b") as f:
        f.truncate(len(first))
    p = s.update([T1.encode()])
    assert p.rescanned == 1 and {f.id for f in db.findings()} == ids
    os.rename(write(tree, T1 + ".tmp", user("rewritten, clean")), tree / T1)
    p = s.update([T1.encode()])
    assert p.rescanned == 1 and db.findings() == []
    # Gone: its findings go; value_of of an old finding is None.
    write(tree, T1, planted())
    s.update([T1.encode()])
    f0 = db.findings()[0]
    (tree / T1).write_bytes(planted().replace(AWS_ID.encode(), b"AKIAIOSFODNN7EXAMPL0"))
    assert value_of(tree, f0) is None
    (tree / T1).unlink()
    assert s.update_all().deleted == 1 and db.findings() == []


def test_an_overlong_line_is_a_note_and_never_read_whole(tree: Path, db: Findings,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    from syncd.secrets import findings as fmod
    from syncd.secrets import scanner as smod

    monkeypatch.setattr(fmod, "LINE_MAX", 1 << 16)
    monkeypatch.setattr(smod, "WINDOW", (1 << 16) + 1)
    reads: list[int] = []
    real = os.pread

    def pread(fd: int, n: int, off: int) -> bytes:
        reads.append(n)
        return real(fd, n, off)

    monkeypatch.setattr(smod.os, "pread", pread)
    big = b'{"a":"' + b"x" * (1 << 18) + b'"}\n'
    write(tree, T1, user("before") + big + user(f"after {GITHUB}"))
    Scanner(db, tree, "m1").update_all()
    assert [f.line for f in db.findings()] == [3]
    assert max(reads) <= (1 << 16) + 1
    assert [n for _, _, n in db.notes()] == [f"line 2 at byte {len(user('before'))}: over "
                                            f"{1 << 16} bytes, not scanned"]


def test_real_samples_find_only_what_a_person_would_call_a_secret(
        samples: Path, db: Findings) -> None:
    s = Scanner(db, samples, "m1")
    s.files = lambda: sorted(  # type: ignore[method-assign]
        os.fsencode(p.relative_to(samples)) for p in samples.rglob("*.jsonl"))
    p = s.update_all()
    found = db.findings()
    for f in found:
        print(f.path.decode(), f.line, f.kind, f.masked, f.signed)
    assert p.bytes > 5_000_000
    assert len(found) <= 2


# -- the daemon -------------------------------------------------------------------------

def _settings(tmp_path: Path, **kw: object) -> Settings:
    base: dict[str, object] = dict(source=tmp_path / "src", store=(tmp_path / "store").as_uri(),
                                   state_dir=tmp_path / "state", machine_id="m1",
                                   flush_quiet=0.2, flush_max_delay=1.0)
    base.update(kw)
    return load_settings(config_file=tmp_path / "none.toml", **base)


def _kinds(s: Settings) -> list[str]:
    path = s.state_dir / FILE_NAME
    if not path.exists():
        return []
    with Findings.open(path, readonly=True) as db:
        return [f.kind for f in db.findings("m1")]


def test_the_daemon_scans_what_each_flush_shipped(tmp_path: Path) -> None:
    write(tmp_path / "src", T1, user(f"at start {AWS_ID}"))
    s = _settings(tmp_path)
    with running(s):
        wait_for(lambda: _kinds(s) == ["AWS Access Key"], what="the first pass")
        write(tmp_path / "src", T1, user(f"flushed later {GITHUB}"), mode="ab")
        wait_for(lambda: sorted(_kinds(s)) == ["AWS Access Key", "GitHub Token"],
                 what="the flushed bytes scanned")
        with Findings.open(s.state_dir / FILE_NAME, readonly=True) as db:
            spans = db.db.execute("SELECT start, end, scans FROM extents").fetchall()
        # Two scans, the second from where the first ended.
        assert spans == [(0, (tmp_path / "src" / T1).stat().st_size, 2)]


def test_secrets_scan_off_scans_nothing(tmp_path: Path) -> None:
    write(tmp_path / "src", T1, user(f"never scanned {AWS_ID}"))
    s = _settings(tmp_path, secrets_scan=False)
    with running(s) as d:
        wait_for(lambda: d._ready, what="the daemon up")
        assert d._secrets is None
    assert not (s.state_dir / FILE_NAME).exists()


# -- another machine's backup ------------------------------------------------------------

class Other:
    """Machine ``m2``: its tree and a shipper into ``store``."""

    def __init__(self, tmp: Path, store: Store, crypto: Any = None) -> None:
        self.root = tmp / "m2"
        self.root.mkdir(parents=True, exist_ok=True)
        self.shipper = Shipper(root=self.root, repo=Repository(store, "m2", crypto),
                               state=State(tmp / "m2.db"), selection=Selection())

    def ship(self, *paths: str) -> list[str]:
        return [layout.segment_key("m2", seq)
                for seq in self.shipper.ship([p.encode() for p in paths]).segments]


@pytest.fixture
def s3(seaweed: Seaweed, bucket: str) -> Store:
    return open_store(f"s3://{bucket}/backup", endpoint_url=seaweed.endpoint)


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "encrypted"])
def test_another_machine_s_backup_is_scanned_incrementally(tmp_path: Path, s3: Store,
                                                           db: Findings, sealed: bool) -> None:
    crypto = init_encryption(s3, "a passphrase for the secrets test", n=CHEAP) \
        if sealed else None
    other = Other(tmp_path, s3, crypto)
    write(other.root, T1, planted())
    write(other.root, SUB, tool_result(f"in a subagent {GITHUB2}"))
    other.ship(T1, SUB)
    repo = Repository(s3, "here", crypto)
    r = scan_machine(repo, "m2", db)
    assert r.problems == [] and r.scanned == 2
    assert r.bytes == len(planted()) + (other.root / SUB).stat().st_size
    assert sorted({f.kind for f in db.findings("m2")}) == [
        "AWS Access Key", "GitHub Token", "Private Key", "Secret Keyword"]
    assert {f.path.decode() for f in db.findings("m2")} == {T1, SUB}
    tail = user(f"later {AWS_ID}")
    write(other.root, T1, tail, mode="ab")
    other.ship(T1)
    r = scan_machine(repo, "m2", db)
    assert (r.scanned, r.bytes) == (1, len(tail))
    assert [f.line for f in db.findings("m2") if f.path.decode() == T1][-1] == 6
    if sealed:  # without the key nothing is read, and it says why
        with pytest.raises(Exception, match="encrypted"):
            scan_machine(Repository(s3, "here"), "m2", db)


def test_an_object_that_does_not_read_is_one_problem_and_the_rest_is_scanned(
        tmp_path: Path, db: Findings) -> None:
    store = MemoryStore()
    other = Other(tmp_path, store)
    write(other.root, T1, user(f"first {AWS_ID}"))
    [bad] = other.ship(T1)
    write(other.root, T2, user(f"second {GITHUB}"))
    other.ship(T2)
    blob = bytearray(store.get(bad))
    blob[30:40] = b"\0" * 10  # the first segment's frame damaged
    store.objects[bad] = bytes(blob)
    r = scan_machine(Repository(store, "here"), "m2", db)
    assert len(r.problems) == 1 and "m2" in r.problems[0]
    assert [f.kind for f in db.findings("m2")] == ["GitHub Token"]


# -- the command line -------------------------------------------------------------------

def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
    env.update({"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
                "SYNCD_SOURCE": str(tmp_path / "src"), "SYNCD_STATE_DIR": str(tmp_path / "state"),
                "SYNCD_MACHINE_ID": "m1", "SYNCD_STORE": (tmp_path / "store").as_uri(),
                "SYNCD_CONFIG": os.devnull})
    return env


def test_the_secrets_command_and_status(tmp_path: Path) -> None:
    env = _env(tmp_path)
    write(tmp_path / "src", T2, user("clean"))
    r = syncd(env, "secrets")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "no secrets found\n")
    write(tmp_path / "src", T1, planted())
    r = syncd(env, "secrets")
    assert r.returncode == 1, r.stderr
    head, *rows = r.stdout.splitlines()
    assert head == f"{S1}  m1  5 findings"
    assert rows[0].startswith(f"    {T1}:1  AWS Access Key  AKIA…MPLE  ")
    assert next(x for x in rows if "signed" in x).split()[1:3] == ["GitHub", "Token"]
    assert AWS_SECRET not in r.stdout and GITHUB not in r.stdout
    r = syncd(env, "secrets", "--json", "--session", S1)
    got = json.loads(r.stdout)
    (sess,) = got["sessions"]
    assert sess["session"] == S1 and len(sess["findings"]) == 5
    assert {f["signed"] for f in sess["findings"]} == {True, False}
    assert json.loads(syncd(env, "secrets", "--json", "--session", S2).stdout)[
        "sessions"] == []
    one_line(syncd(env, "secrets", "--session", "not-a-session"), 2)
    st = json.loads(syncd(env, "status", "--json").stdout)
    assert st["sessions_with_secrets"] == 1
    assert "secrets:      1 sessions with findings" in syncd(env, "status").stdout


def test_decoding_places_every_character_in_the_raw_bytes() -> None:
    import random

    from syncd.secrets.detector import decode

    rng = random.Random(28)
    alphabet = ["a", "Z", "0", " ", '"', "\\", "\n", "\t", "\x01", "é", "→", "😀", "/",
                "\ud800"]
    for _ in range(300):
        value = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        # Claude (JSON.stringify) writes a lone surrogate as an escape only.
        for ascii_only in (True, False) if "\ud800" not in value else (True,):
            raw = json.dumps(value, ensure_ascii=ascii_only)[1:-1].encode(
                "utf-8", "surrogatepass")
            text, at = decode(raw)
            assert text == value
            for i in range(len(text)):
                piece = raw[at[i]:at[i + 1]]
                assert json.loads(b'"' + piece + b'"') == text[i], (raw, i)
            assert at[len(text)] == len(raw)


def test_the_secrets_command_reads_another_machine_s_backup(tmp_path: Path) -> None:
    env = _env(tmp_path)
    (tmp_path / "src").mkdir()
    store = open_store((tmp_path / "store").as_uri())
    other = Other(tmp_path, store)
    write(other.root, T1, planted())
    other.ship(T1)
    r = syncd(env, "secrets", "--machine", "m2", "--json")
    assert r.returncode == 1, r.stderr
    (sess,) = json.loads(r.stdout)["sessions"]
    assert (sess["machine"], sess["session"], len(sess["findings"])) == ("m2", S1, 5)
    # This machine's own tree is not part of it, and has nothing.
    assert syncd(env, "secrets").returncode == 0
    r = syncd(env, "secrets", "--all")
    assert r.returncode == 1 and r.stdout.startswith(f"{S1}  m2  5 findings")
    one_line(syncd(env, "secrets", "--all", "--machine", "m2"), 2)


def test_a_reader_before_the_writer_made_its_tables_finds_nothing(tmp_path: Path) -> None:
    # The daemon's thread creates the file, then its tables: a command may open between.
    (tmp_path / FILE_NAME).touch(mode=0o600)
    assert lookup(tmp_path, "0" * 12) is None
    with Findings.open(tmp_path / FILE_NAME, readonly=True) as db:
        assert (db.findings(), db.notes(), db.sessions_with_findings()) == ([], [], 0)


def test_an_env_file_s_unquoted_values_are_found_but_not_code_s_names() -> None:
    env = ("$ cat .env\nOPENAI_API_KEY=sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z\n"
           "DB_PASSWORD=s3cr3tP4ss\nSECRET_NAME=STORE_PASSWORD\n")
    code = ("    mock_charm.model.get_secret = mock_get_secret_not_found\n"
            "    secret_ca_certificate = None  # stays None\n"
            "    store_pwd=STORE_PASSWORD,\n    api_key = settings.api_key_v2\n")
    data = tool_result(env) + tool_result(code)
    found = scan_bytes(data)
    assert [data[f.offset:f.offset + f.length] for f in found] == [
        b"sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z", b"s3cr3tP4ss"]
    assert {f.kind for f in found} == {"Secret Keyword"}


def test_a_cut_line_s_open_thinking_block_is_still_signed() -> None:
    whole = answer(thinking(f"the user pasted {GITHUB} earlier"))
    cut = whole[:whole.index(GITHUB.encode()) + len(GITHUB) + 5]
    (f,) = scan_bytes(cut)
    assert f.kind == "GitHub Token" and f.signed


def test_an_unquoted_value_in_a_sentence_is_found_up_to_its_end() -> None:
    """A prompt that pastes ``KEY=value`` amid words (``… and SECRET=… please``): the
    value is the word after the equal sign, not the rest of the line."""
    key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq9Tk3LmQp"
    data = user(f"the creds: AWS_SECRET_ACCESS_KEY={key} please configure")
    found = scan_bytes(data)
    assert [data[f.offset:f.offset + f.length] for f in found] == [key.encode()]
    assert scan_bytes(user("set the password = later when you can")) == []


def test_secrets_session_takes_a_prefix_as_sessions_shows_it(tmp_path: Path) -> None:
    env = _env(tmp_path)
    write(tmp_path / "src", T1, planted())
    write(tmp_path / "src", T2, user("clean"))
    r = syncd(env, "secrets", "--json", "--session", S1[:8])
    assert r.returncode == 1, r.stderr
    assert [s["session"] for s in json.loads(r.stdout)["sessions"]] == [S1]
    r = syncd(env, "secrets", "--json", "--session", S2[:8])
    assert (r.returncode, json.loads(r.stdout)["sessions"]) == (0, [])
    one_line(syncd(env, "secrets", "--session", S1[:5]), 2)


def test_the_json_holds_no_hash_of_a_value(tmp_path: Path) -> None:
    """An unsalted sha256 of a found password is the password to a dictionary: the
    output names a finding by its id, never by a hash of its value."""
    env = _env(tmp_path)
    write(tmp_path / "src", T1, planted())
    r = syncd(env, "secrets", "--json")
    assert r.returncode == 1, r.stderr
    for value in (GITHUB, AWS_SECRET):
        assert hashlib.sha256(value.encode()).hexdigest() not in r.stdout

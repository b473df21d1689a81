"""Encrypted stores end to end on a real SeaweedFS, through the ``syncd`` command line:
round trip, wrong and missing passphrases, tampered, swapped and truncated objects,
key rotation, one writer per machine id, and no secret in any output."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import zstandard

from syncd.config import Settings
from syncd.format.segment import HEADER, TRAILER
from syncd.security.keys import init_encryption
from syncd.store import open_store
from tests.faultkit import (
    MACHINE,
    A,
    B,
    D,
    cli_env,
    line,
    make_settings,
    tree,
    write,
)
from tests.helpers import shipped, wait_for
from tests.seaweed import SECRET_KEY, Seaweed

PASSPHRASE = "correct horse battery staple 7f3a"
WRONG = "incorrect donkey 19cc"
NEW = "new passphrase after rotation 5e2b"
SECRETS = (PASSPHRASE, WRONG, NEW, SECRET_KEY)
PATH_WORDS = (b"home-u-app", b"aaaa", b"bbbb", b"-home-", b"projects", b"history",
              b"/home/", b'"cwd"')
SEG0 = f"machines/{MACHINE}/seg/{0:016x}"
SEG1 = f"machines/{MACHINE}/seg/{1:016x}"
MACHINE_JSON = f"machines/{MACHINE}/machine.json"
HEAD = f"machines/{MACHINE}/head"

# Every line any syncd process of this module printed: checked for secrets at the end.
OUTPUTS: list[str] = []


@dataclass
class Box:
    """One encrypted store in its own bucket, and a tree backed up into it."""

    s: Settings
    sw: Seaweed
    bucket: str
    env: dict[str, str]
    logs: list[Path] = field(default_factory=list)

    def syncd(self, *args: str, env: dict[str, str] | None = None,
              drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        e = {**os.environ, **self.env, **(env or {})}
        for k in drop:
            e.pop(k, None)
        # No terminal on stdin: syncd must not ask for a passphrase here.
        r = subprocess.run([sys.executable, "-m", "syncd", *args], env=e, capture_output=True,
                           text=True, timeout=120, stdin=subprocess.DEVNULL)
        OUTPUTS.extend([r.stdout, r.stderr])
        return r

    def key(self, rel: str) -> str:
        return f"backup/{rel}"

    def objects(self) -> dict[str, bytes]:
        c = self.sw.client()
        out = {}
        for o in c.list_objects_v2(Bucket=self.bucket).get("Contents", []):
            out[o["Key"][len("backup/"):]] = c.get_object(Bucket=self.bucket,
                                                          Key=o["Key"])["Body"].read()
        return out

    def put_raw(self, rel: str, data: bytes) -> None:
        self.sw.client().put_object(Bucket=self.bucket, Key=self.key(rel), Body=data)

    def flip(self, rel: str, offset: int) -> None:
        blob = bytearray(self.objects()[rel])
        blob[offset] ^= 0x10
        self.put_raw(rel, bytes(blob))

    def daemon(self, state: str, *args: str, ttl: float = 3.0) -> subprocess.Popen[str]:
        log = self.s.state_dir.parent / f"{state}-{len(self.logs)}.log"
        self.logs.append(log)
        env = {**os.environ, **self.env, "SYNCD_STATE_DIR": str(self.s.state_dir.parent / state),
               "SYNCD_LEASE_TTL": str(ttl)}
        with open(log, "w") as f:
            return subprocess.Popen([sys.executable, "-m", "syncd", "-v", "run", *args],
                                    env=env, stdout=f, stderr=subprocess.STDOUT, text=True,
                                    stdin=subprocess.DEVNULL)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("syncd: ")]
    assert lines, r.stderr
    return r.stderr


CHEAP = 1 << 12  # scrypt N of the key files most tests make: unlocking costs ~5 ms, not 0.6 s


def make_box(tmp_path: Path, sw: Seaweed, bucket: str, cli_init: bool) -> Box:
    s = make_settings(tmp_path, store=f"s3://{bucket}/backup", endpoint=sw.endpoint)
    env = {**cli_env(s), "SYNCD_PASSPHRASE": PASSPHRASE}
    b = Box(s, sw, bucket, env)
    write(s.source, A, line(1) + line(2))
    write(s.source, B, line(3) * 50)
    write(s.source, "history.jsonl", b'{"display":"hi","project":"/home/u/app"}\n')
    if cli_init:
        r = b.syncd("init", "--encrypt")
        assert r.returncode == 0, r.stderr
        assert "encrypted; key file keys/" in r.stdout
    else:
        init_encryption(open_store(s.store, endpoint_url=sw.endpoint), PASSPHRASE, n=CHEAP)
    r = b.syncd("sync")
    assert r.returncode == 0, r.stderr
    return b


@pytest.fixture
def box(tmp_path: Path, seaweed: Seaweed, bucket: str) -> Iterator[Box]:
    b = make_box(tmp_path, seaweed, bucket, cli_init=False)
    yield b
    for log in b.logs:
        if log.exists():
            OUTPUTS.append(log.read_text(errors="replace"))


def restored(b: Box, name: str = "out", **kw: str) -> tuple[subprocess.CompletedProcess[str],
                                                           Path]:
    out = b.s.state_dir.parent / name
    return b.syncd("restore", "--to", str(out), **kw), out


# -- round trip -----------------------------------------------------------------------------

def test_round_trip_and_nothing_in_clear(tmp_path: Path, seaweed: Seaweed,
                                         bucket: str) -> None:
    box = make_box(tmp_path, seaweed, bucket, cli_init=True)  # the real scrypt cost here
    write(box.s.source, A, line(4), "ab")
    write(box.s.source, D, line(5))
    r = box.syncd("sync")
    assert r.returncode == 0, r.stderr
    r, out = restored(box)
    assert r.returncode == 0, r.stderr
    assert tree(out) == tree(box.s.source)

    objs = box.objects()
    keys = sorted(objs)
    assert keys[:1] == [k for k in keys if k.startswith("keys/")]
    assert keys[1:] == [HEAD, MACHINE_JSON, SEG0, SEG1]  # the head too: sealed
    plain = b"".join(tree(box.s.source).values())
    for key, blob in objs.items():
        for word in PATH_WORDS:
            assert word not in key.encode()
            assert word not in blob, (key, word)
        assert plain[:40] not in blob and b'"type":"user"' not in blob
        if "/seg/" in key:  # frames are sealed: no zstd frame decompresses
            off = TRAILER.unpack(blob[-TRAILER.size:])[0]
            with pytest.raises(zstandard.ZstdError):
                zstandard.ZstdDecompressor().decompress(blob[HEADER.size:off])

    sessions = box.syncd("sessions")
    assert sessions.returncode == 0 and "aaaa" in sessions.stdout, sessions.stderr
    machines = box.syncd("machines")
    assert machines.returncode == 0 and MACHINE in machines.stdout, machines.stderr
    # The passphrase may also come from a file.
    pfile = box.s.state_dir.parent / "passphrase"
    pfile.write_text(PASSPHRASE + "\n")
    pfile.chmod(0o600)
    r, out2 = restored(box, "out2", env={"SYNCD_PASSPHRASE_FILE": str(pfile)},
                       drop=("SYNCD_PASSPHRASE",))
    assert r.returncode == 0, r.stderr
    assert tree(out2) == tree(box.s.source)


def test_wrong_or_missing_passphrase_fails_closed(box: Box) -> None:
    write(box.s.source, A, line(6), "ab")
    for extra, drop, why in [({"SYNCD_PASSPHRASE": WRONG}, (), "opens none of the store's key "
                              "files"),
                             ({}, ("SYNCD_PASSPHRASE",), "is encrypted (1 key file(s) in keys/) "
                              "and no passphrase is set")]:
        for args in (("sync",), ("restore", "--to", str(box.s.state_dir.parent / "o")),
                     ("sessions",), ("run",)):
            r = box.syncd(*args, env=extra, drop=drop)
            assert why in one_line_error(r), (args, r.stderr)
            assert "keys/" in r.stderr
    assert not (box.s.state_dir.parent / "o").exists()
    assert shipped(box.s, A) == len(line(1) + line(2))  # nothing new was written


def test_passphrase_for_a_plain_store_is_refused(tmp_path: Path, seaweed: Seaweed,
                                                 bucket: str) -> None:
    s = make_settings(tmp_path, store=f"s3://{bucket}/plain", endpoint=seaweed.endpoint)
    b = Box(s, seaweed, bucket, {**cli_env(s), "SYNCD_PASSPHRASE": PASSPHRASE})
    write(s.source, A, line(1))
    r = b.syncd("sync")
    assert "a passphrase is set but the store has no keys/" in one_line_error(r)
    assert b.syncd("sync", drop=("SYNCD_PASSPHRASE",)).returncode == 0


# -- tampering ------------------------------------------------------------------------------

def _index_offset(blob: bytes) -> int:
    return int(TRAILER.unpack(blob[-TRAILER.size:])[0])


@pytest.mark.parametrize("kind", ["frame", "index", "trailer", "machine.json", "key file"])
def test_one_flipped_bit_is_detected(box: Box, kind: str) -> None:
    objs = box.objects()
    seg = objs[SEG0]
    [key_file] = [k for k in objs if k.startswith("keys/")]
    target, offset = {
        "frame": (SEG0, HEADER.size + 20),
        "index": (SEG0, _index_offset(seg) + 30),
        "trailer": (SEG0, len(seg) - 20),
        "machine.json": (MACHINE_JSON, len(objs[MACHINE_JSON]) - 5),
        "key file": (key_file, len(objs[key_file]) // 2),
    }[kind]
    box.flip(target, offset)
    if kind == "index":
        # Also fix the trailer's sha256, as an attacker would: only the seal is left.
        blob = box.objects()[SEG0]
        off, length = TRAILER.unpack(blob[-TRAILER.size:])[:2]
        digest = hashlib.sha256(blob[off : off + length]).digest()
        box.put_raw(SEG0, blob[: -TRAILER.size + 16] + digest + blob[-8:])
    r, out = restored(box)
    err = one_line_error(r)
    assert target in err, err
    # Never plaintext output: what was written (if anything) is exactly the backup.
    want = tree(box.s.source)
    for rel, data in tree(out).items():
        assert want[rel] == data
    if kind in ("frame",):
        assert "fails authentication" in err
        assert len(tree(out)) < len(want)  # the tampered file is not written
    elif kind == "index":
        assert "fails authentication" in err
    elif kind == "trailer":
        assert "checksum mismatch" in err or "trailer" in err
    elif kind == "machine.json":
        # One bad object is one line: the segments still authenticate and restore.
        assert "fails authentication" in err and tree(out) == want
    else:
        assert not out.exists() or not tree(out)
    if kind == "key file":
        assert box.syncd("sync").returncode == 1  # the daemon refuses too


def test_swapped_segments_are_detected(box: Box) -> None:
    write(box.s.source, A, line(7), "ab")
    assert box.syncd("sync").returncode == 0
    objs = box.objects()
    box.put_raw(SEG0, objs[SEG1])
    box.put_raw(SEG1, objs[SEG0])
    r, out = restored(box)
    err = one_line_error(r)
    assert SEG0 in err and SEG1 in err and "fails authentication" in err
    assert not out.exists() or not tree(out)


def test_truncated_segment_is_detected(box: Box) -> None:
    write(box.s.source, A, line(8), "ab")
    assert box.syncd("sync").returncode == 0
    seg1 = box.objects()[SEG1]
    box.put_raw(SEG1, seg1[: len(seg1) - 100])
    r, out = restored(box)
    err = one_line_error(r)
    assert SEG1 in err and ("truncated" in err or "trailer" in err), err
    want = tree(box.s.source)
    for rel, data in tree(out).items():
        assert want[rel].startswith(data)  # seg 0's state of the file, never garbage


# -- keys -----------------------------------------------------------------------------------

def test_key_rotation(box: Box) -> None:
    newfile = box.s.state_dir.parent / "new-passphrase"
    newfile.write_text(NEW)
    newfile.chmod(0o600)
    r = box.syncd("key", "add", "--new-passphrase-file", str(newfile))
    assert r.returncode == 0, r.stderr
    new_id = r.stdout.split("keys/")[1].strip()
    listed = box.syncd("key", "list", drop=("SYNCD_PASSPHRASE",))
    assert listed.returncode == 0 and listed.stdout.count("scrypt n=") == 2
    old_id = next(ln.split()[0] for ln in listed.stdout.splitlines() if new_id not in ln)
    r = box.syncd("key", "remove", old_id)  # with the old passphrase: refused
    assert "your passphrase opens" in one_line_error(r)
    r = box.syncd("key", "remove", old_id, env={"SYNCD_PASSPHRASE": NEW})
    assert r.returncode == 0, r.stderr
    r = box.syncd("key", "remove", new_id, env={"SYNCD_PASSPHRASE": NEW})
    assert "refusing to remove the last key file" in one_line_error(r)
    assert "opens none" in one_line_error(restored(box, "o1")[0])
    r, out = restored(box, "o2", env={"SYNCD_PASSPHRASE": NEW})
    assert r.returncode == 0 and tree(out) == tree(box.s.source)
    r = box.syncd("init", "--encrypt")
    assert "already encrypted" in one_line_error(r)


# -- one writer per machine id --------------------------------------------------------------

def test_two_daemons_with_the_same_machine_id(box: Box) -> None:
    first = box.daemon("state-first")
    try:
        wait_for(lambda: f"machines/{MACHINE}/lease.json" in box.objects(), 30,
                 "the first lease")
        second = box.daemon("state-second")
        second.wait(60)
        text = box.logs[1].read_text()
        assert second.returncode == 1, text
        assert f"already being backed up by host {os.uname().nodename} pid {first.pid}" in text
        assert "flushed segment" not in text and "adopted" not in text  # it wrote nothing
        write(box.s.source, C_FILE, line(9))
        wait_for(lambda: _has_seq(box, 1), 30, "the first daemon to write")
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(30)
    assert first.returncode == 0
    r, out = restored(box)
    assert r.returncode == 0, r.stderr
    assert tree(out) == tree(box.s.source)


C_FILE = b"projects/-home-u-app/cccc.jsonl"


def _has_seq(b: Box, seq: int) -> bool:
    return f"machines/{MACHINE}/seg/{seq:016x}" in b.objects()


def test_lease_of_a_killed_daemon(box: Box) -> None:
    # Long enough that the second daemon, on a loaded machine, starts within it.
    ttl = 12.0
    first = box.daemon("state-a", ttl=ttl)
    wait_for(lambda: f"machines/{MACHINE}/lease.json" in box.objects(), 30, "the lease")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    killed_at = time.monotonic()
    second = box.daemon("state-b", ttl=ttl)  # another host, in effect: its own state
    second.wait(60)
    text = box.logs[1].read_text()
    assert second.returncode == 1 and f"pid {first.pid}" in text, text
    # After the TTL the lease is taken over, with a warning, and the new daemon writes.
    time.sleep(max(0.0, ttl + 0.5 - (time.monotonic() - killed_at)))
    third = box.daemon("state-b", ttl=ttl)
    try:
        write(box.s.source, C_FILE, line(10))
        wait_for(lambda: _has_seq(box, 1), 30, "the takeover daemon to write")
        assert "expired" in box.logs[2].read_text() and "taking it over" in box.logs[2].read_text()
        os.kill(third.pid, signal.SIGKILL)
        third.wait(10)
        # --takeover does not wait for the TTL.
        fourth = box.daemon("state-c", "--takeover", ttl=ttl)
        write(box.s.source, A, line(11), "ab")
        wait_for(lambda: _has_seq(box, 2), 30, "the --takeover daemon to write")
        fourth.send_signal(signal.SIGTERM)
        assert fourth.wait(30) == 0
    finally:
        for p in (third,):
            if p.poll() is None:
                p.kill()
                p.wait()
    r, out = restored(box)
    assert r.returncode == 0, r.stderr
    assert tree(out) == tree(box.s.source)


# -- secrets --------------------------------------------------------------------------------

def test_no_secret_in_any_output(box: Box) -> None:
    """Debug logs of a daemon, status (text and JSON), failures with a wrong passphrase,
    and every output this module's tests produced before: none holds a secret."""
    d = box.daemon("state-debug")
    try:
        write(box.s.source, A, line(12), "ab")
        wait_for(lambda: _has_seq(box, 1), 30, "a flush")
        status = box.syncd("status", env={"SYNCD_STATE_DIR": str(box.s.state_dir.parent /
                                                                  "state-debug")})
        status_json = box.syncd("status", "--json")
        assert status.returncode == 0 and status_json.returncode == 0
    finally:
        d.send_signal(signal.SIGTERM)
        d.wait(30)
    box.syncd("-v", "sync", env={"SYNCD_PASSPHRASE": WRONG})
    box.syncd("-v", "restore", "--to", str(box.s.state_dir.parent / "o"),
              env={"SYNCD_PASSPHRASE": WRONG})
    box.syncd("-v", "sync", env={"SYNCD_S3_ENDPOINT_URL": "http://127.0.0.1:9"})
    for log in box.logs:
        OUTPUTS.append(log.read_text(errors="replace"))
    # Every file the test left: state databases (and their WAL), locks, daemon logs.
    state_files = [p for p in box.s.state_dir.parent.rglob("*") if p.is_file()]
    assert any(p.suffix == ".sqlite" for p in state_files)
    everything = "\n".join(OUTPUTS) + "".join(
        p.read_bytes().decode(errors="replace") for p in state_files)
    assert "DEBUG" in everything and "flushed segment" in everything
    for secret in SECRETS:
        assert secret not in everything, f"a secret leaked: {secret[:4]}…"

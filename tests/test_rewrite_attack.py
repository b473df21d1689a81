"""Rewrite under attack: kill -9 before every store write, encrypted stores, SeaweedFS,
pruned stores with long chains, copies and patches, hostile objects, and what later
compactions, prunes and verify make of a rewritten store."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest
import zstandard

from syncd.archive.compact import CompactOptions, compact
from syncd.archive.prune import prune
from syncd.archive.retention import Policy
from syncd.archive.rewrite import Rewrite, rewrite
from syncd.archive.verify import verify
from syncd.backup.headwriter import HeadWriter
from syncd.errors import CryptoError
from syncd.format.dictionary import Dictionary
from syncd.format.segment import TRAILER
from syncd.format.snapshot import current
from syncd.mask import mask_of
from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, restore
from syncd.security.crypto import Crypto, new_master, unpad
from syncd.store import LocalStore, MemoryStore, Store, layout, open_store
from syncd.timeline import timeline
from syncd.view import load_backup
from tests.helpers import tree_bytes, write
from tests.seaweed import Seaweed
from tests.test_compact import (
    APP,
    HIST,
    LIB,
    SA,
    SB,
    TA,
    TB,
    Clock,
    history,
    line,
    make_shipper,
    ship_all,
)
from tests.test_rewrite import SECRET, M, all_raw, build, forgotten, points, said

ROOT = Path(__file__).resolve().parent.parent
FORGET_SA = Rewrite(forget=frozenset({SA}))


def assert_gone(store: Store) -> None:
    raw = all_raw(store)
    assert SA.encode() not in raw and SA[:8].encode() not in raw


Tree = dict[bytes, bytes]


def assert_between(before: dict[int, Tree], after: dict[int, Tree],
                   want: dict[int, Tree], what: str = "") -> None:
    """Every point holds, file by file, what it held or what the rewrite makes of it: no
    file of another session is missing or changed otherwise."""
    assert sorted(after) == sorted(before)
    for seq, tree in before.items():
        got = after[seq]
        for p, data in got.items():
            assert data in (tree.get(p), want[seq].get(p)), f"{what} point {seq}: {p!r}"
        assert set(want[seq]) <= set(got) <= set(tree), f"{what} point {seq}"


def redacted(tree: Tree, value: bytes) -> Tree:
    """A point's tree with ``value`` masked but in signed blocks."""
    fill = mask_of(len(value))
    return {p: b"".join(x if b'"thinking"' in x else x.replace(value, fill)
                        for x in data.splitlines(keepends=True)) for p, data in tree.items()}


# -- kill -9 -----------------------------------------------------------------------

def kill_rewrite(base: Path, work: Path, kill_at: int, mode: str, now: float | None
                 ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """A rewrite of a copy of ``base`` in a process SIGKILLed before write ``kill_at``."""
    shutil.copytree(base, work / "store")
    log = work / "writes.log"
    r = subprocess.run([sys.executable, "-m", "tests.compactkill", str(work / "store"), M,
                        str(kill_at), str(log), str(8 << 10), str(4 << 10), mode,
                        *([] if now is None else [repr(now)])],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    return r, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("scenario", ["forget", "redact", "forget-in-the-long-story"])
def test_kill_9_before_every_store_write_of_a_rewrite(tmp_path: Path, scenario: str) -> None:
    base = tmp_path / "base"
    now: float | None = None
    if scenario == "forget-in-the-long-story":  # detached, orphaned and replaced deltas
        now = long_story(tmp_path, LocalStore(base)).t
        sid, value = SM, b""
    else:
        build(tmp_path, LocalStore(base))
        sid, value = (SA, b"") if scenario == "forget" else ("", SECRET)
    before = points(LocalStore(base))
    assert len(before) >= 5
    want = {seq: without(t, sid) if sid else redacted(t, value) for seq, t in before.items()}
    spec = Rewrite(forget=frozenset({sid})) if sid else Rewrite(redact=(value,))
    mode = f"forget={sid}" if sid else f"redact={value.decode()}"
    clean, writes = kill_rewrite(base, tmp_path / "clean", 0, mode, now)
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["errors"] == []
    kinds = [w.split("/")[2] if w.startswith("put ") else "delete" for w in writes]
    # The fold first, then new packs and manifests, then deletions.
    assert "pack" in kinds and "snap" in kinds and kinds[-1] == "delete", kinds
    assert points(LocalStore(tmp_path / "clean" / "store")) == want

    for k in range(1, len(writes) + 1):
        work = tmp_path / f"kill-{k}"
        r, done = kill_rewrite(base, work, k, mode, now)
        assert r.returncode == -signal.SIGKILL, (k, r.stdout, r.stderr)
        assert len(done) == k
        store = LocalStore(work / "store")
        assert_between(before, points(store), want, f"killed before write {k}:")

        again = rewrite(Repository(store, M), spec, CompactOptions(now=now))

        assert again.errors == [], (k, again.errors)
        assert points(store) == want, k
        raw = all_raw(store)
        if sid:
            assert sid.encode() not in raw and sid[:8].encode() not in raw
        else:  # only the signed block keeps it
            assert raw.count(value) == raw.count(b"thinking of " + value)
        shutil.rmtree(work)


# -- encrypted ---------------------------------------------------------------------

def all_plain(store: Store, crypto: Crypto) -> bytes:
    """Every object of the machine opened: indexes and frames of containers (with their
    dictionary), dictionaries, boxes; what does not open is kept as stored."""
    repo = Repository(store, M, crypto)
    out = bytearray()
    for info in store.list(f"machines/{M}/"):
        key, blob = info.key, store.get(info.key)
        kind = layout.kind_of(key)
        if kind == "dict":
            out += repo.dictionary(key.rsplit("/", 1)[1]).data
            continue
        if kind is None:
            for pos in ("machine.json", "head"):
                try:
                    out += crypto.open_box(key, pos, blob, key)
                    break
                except CryptoError:  # not that box: the next, or kept as it is
                    continue
            else:
                out += blob
            continue
        c = crypto.cipher(key)
        off, length, _, _ = TRAILER.unpack(blob[-TRAILER.size:])
        text = zstandard.ZstdDecompressor().decompress(
            unpad(c.open(f"index@{off}", blob[off:off + length], key), key),
            max_output_size=64 << 20)
        out += text
        doc = json.loads(text)
        zd = repo.dictionary(doc["dict"]).zdict if "dict" in doc else None
        for e in doc["entries"]:
            if "off" not in e or "clen" not in e:
                continue
            frame = c.open(f"frame@{e['off']}", blob[e["off"]:e["off"] + e["clen"]], key)
            d = zstandard.ZstdDecompressor(dict_data=zd) if e.get("d") else \
                zstandard.ZstdDecompressor()
            out += d.decompress(frame, max_output_size=8 << 20)
    return bytes(out)


def test_forget_and_redact_on_an_encrypted_store(tmp_path: Path) -> None:
    crypto = Crypto(new_master())
    _, store, _ = build(tmp_path, MemoryStore(), crypto)
    before = points(store, crypto)
    plain = all_plain(store, crypto)
    assert SA.encode() in plain and SECRET in plain and b"the key is" in plain
    assert SA.encode() not in b"".join(store.get(i.key) for i in store.list(""))

    rep = rewrite(Repository(store, M, crypto),
                  Rewrite(forget=frozenset({SA}), redact=(SECRET,)))

    assert rep.errors == [] and rep.files_dropped and rep.ranges_masked
    masked = mask_of(len(SECRET))
    after = points(store, crypto)
    assert sorted(after) == sorted(before)
    for seq, tree in before.items():
        want = {p: d.replace(SECRET, masked) for p, d in forgotten(tree).items()}
        assert after[seq] == want, f"point {seq}"
    plain = all_plain(store, crypto)
    for gone in (SA.encode(), SA[:8].encode(), SECRET, b"the key is", b"thinking of"):
        assert gone not in plain, gone
    assert b"also " + masked in plain  # (the helper does read the frames)


# -- SeaweedFS ---------------------------------------------------------------------

def test_forget_on_seaweedfs(tmp_path: Path, seaweed: Seaweed, bucket: str) -> None:
    store = open_store(f"s3://{bucket}/backup", endpoint_url=seaweed.endpoint)
    build(tmp_path, store)
    before = points(store)

    rep = rewrite(Repository(store, M), FORGET_SA)

    assert rep.errors == [] and rep.deleted and rep.written
    assert points(store) == {seq: forgotten(t) for seq, t in before.items()}
    assert_gone(store)
    assert rewrite(Repository(store, M), FORGET_SA).note == "nothing holds it"


# -- pruned stores, long chains, copies and patches ---------------------------------

SM = "cccccccc-0000-4000-8000-000000000003"  # moved between project folders (/cd)
SP = "dddddddd-0000-4000-8000-000000000004"  # patched (a row removed further back)
TM_APP, TM_LIB = f"{APP}/{SM}.jsonl", f"{LIB}/{SM}.jsonl"
AGENT_M = "subagents/agent-m1.jsonl"
TP = f"{APP}/{SP}.jsonl"
SPAN = b"ghp_" + b"Z9" * 18  # a token's shape, shipped half in one flush, half in the next
HOUR = 3600.0


def without(tree: dict[bytes, bytes], sid: str) -> dict[bytes, bytes]:
    """A point's tree with session ``sid`` forgotten (its history lines spaces)."""
    out = {}
    for p, data in tree.items():
        if sid.encode() in p:
            continue
        if p == HIST.encode():
            data = b"".join(b" " * (len(x) - 1) + b"\n" if sid.encode() in x else x
                            for x in data.splitlines(keepends=True))
        out[p] = data
    return out


def long_story(tmp_path: Path, store: Store) -> Clock:
    """Six hours of flushes every 10 minutes: a manifest every hour, deltas between them
    (small ones grown), SA deleted from the tree in hour 2 (only its tombstone after), SM
    moved from app to lib in hour 3, SP patched in hour 4, a token of SB's shipped half
    in one flush and half in the next, history lines of every session; then a prune that
    keeps the last 90 minutes and 3 hourly manifests."""
    src, clock = tmp_path / "src", Clock()
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    repo = Repository(store, M)
    write(src, TA, line(SA, 0))
    write(src, TB, line(SB, 0, cwd="/home/u/lib"))
    write(src, TM_APP, line(SM, 0))
    write(src, f"{APP}/{SM}/{AGENT_M}", line(SM, 900))
    write(src, TP, b"".join(line(SP, i) for i in range(260)))  # ~90 KB: patches apply
    write(src, HIST, history(SA, 0) + history(SM, 0))
    for step in range(36):
        gone: list[str] = []
        if step != 28:  # (which ends the line the flush before began)
            write(src, TB, line(SB, step + 1, cwd="/home/u/lib"), "ab")
        write(src, HIST, history([SA, SB, SM, SP][step % 4], step + 1), "ab")
        if step < 12:
            write(src, TA, line(SA, step + 1), "ab")
        if step == 12:  # SA gone from the tree: its tombstone
            (src / TA).unlink()
            gone.append(TA)
        if step == 18:  # /cd: SM moves to lib, a relocated record appended
            os.makedirs(src / LIB / SM / "subagents", exist_ok=True)
            os.rename(src / TM_APP, src / TM_LIB)
            os.rename(src / APP / SM / AGENT_M, src / LIB / SM / AGENT_M)
            shutil.rmtree(src / APP / SM)
            relocated = json.dumps({"type": "relocated", "sessionId": SM,
                                    "relocatedCwd": "/home/u/lib"}).encode() + b"\n"
            write(src, TM_LIB, relocated, "ab")
            gone += [TM_APP, f"{APP}/{SM}/{AGENT_M}"]
        elif step < 18:
            write(src, TM_APP, line(SM, step + 1), "ab")
        else:
            write(src, TM_LIB, line(SM, step + 1, cwd="/home/u/lib"), "ab")
        if step == 24:  # a row removed further back: Claude writes the file whole
            data = (src / TP).read_bytes()
            (src / TP).write_bytes(data.replace(line(SP, 100), b""))
        if step == 27:  # half a token, the rest in the next flush
            write(src, TB, b'{"type":"user","sessionId":"' + SB.encode()
                  + b'","message":{"content":"my token ' + SPAN[:21], "ab")
        if step == 28:
            write(src, TB, SPAN[21:] + b' ok"}}\n', "ab")
        ship_all(sh, src, *gone)
        clock.t += 600
        if step % 6 == 5:
            compact(repo, CompactOptions(max_chain=0, now=clock.t))
        elif step % 2 == 1:
            compact(repo, CompactOptions(now=clock.t))
    prune(repo, Policy(keep_within=5400, keep_hourly=3), opts=CompactOptions(now=clock.t))
    return clock


def story_shape(store: Store) -> None:
    """What the story is meant to make: kept manifests, deltas in the window, a segment
    or more, copies (a move and a patch) and history frames that name their sessions."""
    repo = Repository(store, M)
    kinds = [layout.kind_of(i.key) for i in store.list(f"machines/{M}/")]
    assert kinds.count("snap") >= 3 and kinds.count("delta") >= 2, kinds
    newest = repo.read_manifest(current(repo.snapshots())[-1][2])
    groups = repo.read_groups(newest)
    hist = [e for g in groups.values() for e in g.entries if e.path == HIST.encode()]
    assert hist and any(hist[0].sids.values()), "history.jsonl is in packs with sids"
    parts = [e.path for g in groups.values() for e in g.entries
             if any(x.frame for _, x in e.extents)]
    assert TM_LIB.encode() in parts and TP.encode() in parts, "copies: parts of frames"


Story = tuple[Path, dict[int, dict[bytes, bytes]], CompactOptions]


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Story:
    """The long story's store, every point of it, and options on its clock (a tombstone
    expires by the compaction's clock)."""
    tmp = tmp_path_factory.mktemp("story")
    clock = long_story(tmp, LocalStore(tmp / "store"))
    story_shape(LocalStore(tmp / "store"))
    every = points(LocalStore(tmp / "store"))
    assert len(every) >= 12, sorted(every)  # the window's flushes and the kept manifests
    return tmp / "store", every, CompactOptions(now=clock.t)


def copy_of(base: Path, tmp_path: Path) -> LocalStore:
    shutil.copytree(base, tmp_path / "store")
    return LocalStore(tmp_path / "store")


@pytest.mark.parametrize("sid", [SA, SM], ids=["only-in-old-points", "moved-and-live"])
def test_forget_in_a_pruned_store_with_chains_copies_and_patches(
        tmp_path: Path, story: Story, sid: str) -> None:
    base, before, opts = story
    assert any(sid.encode() in p for t in before.values() for p in t)
    store = copy_of(base, tmp_path)

    rep = rewrite(Repository(store, M), Rewrite(forget=frozenset({sid})), opts)

    assert rep.errors == [], rep.errors
    after = points(store)
    assert sorted(after) == sorted(before)
    for seq, tree in before.items():
        assert after[seq] == without(tree, sid), f"point {seq}"
    raw = all_raw(store)
    assert sid.encode() not in raw and sid[:8].encode() not in raw
    assert verify(Repository(store, M), read_data=1.0).problems == []


def test_redact_a_value_shipped_half_in_one_flush_and_half_in_the_next(
        tmp_path: Path, story: Story) -> None:
    base, before, opts = story
    tb = TB.encode()
    at = max(before.items())[1][tb].index(SPAN)
    halves = [seq for seq, t in before.items() if t[tb].endswith(SPAN[:21])]
    assert halves, "a point holds the first half of the token only"
    store = copy_of(base, tmp_path)

    rep = rewrite(Repository(store, M), Rewrite(redact=(SPAN,)), opts)

    assert rep.errors == [] and rep.ranges_masked == 1, rep
    after = points(store)
    assert sorted(after) == sorted(before)
    fill = mask_of(len(SPAN))
    for seq, tree in before.items():
        data = tree[tb]
        cut = max(0, min(len(SPAN), len(data) - at))
        want = {**tree, tb: data[:at] + fill[:cut] + data[at + cut:]}
        assert after[seq] == want, f"point {seq}"
    assert after[halves[0]][tb].endswith(fill[:21])  # the half is masked where it was
    raw = all_raw(store)
    assert SPAN[:21] not in raw and SPAN[21:] not in raw


# -- hostile and odd stores -----------------------------------------------------------

class Keeping(MemoryStore):
    """A memory store that keeps what it deletes (to put a leftover back)."""

    def __init__(self) -> None:
        super().__init__()
        self.gone: dict[str, bytes] = {}

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self.gone.update({k: self.objects[k] for k in keys if k in self.objects})
        super().delete_many(keys)


def lenient(store: Store) -> tuple[dict[int, dict[bytes, bytes]], list[str]]:
    """Every point's tree, and every line the timeline and the restores said."""
    rows, errors = timeline(Repository(store, M))
    out = {}
    for row in rows:
        with tempfile.TemporaryDirectory() as d:
            r = restore(Repository(store, M), RestoreOptions(target=Path(d), at=row.time,
                                                             local_machine=M))
            errors += r.errors
            out[row.seq] = tree_bytes(Path(d))
    return out, errors


def key_of(store: MemoryStore, kind: str, i: int = 0) -> str:
    return sorted(k for k in store.objects if f"/{kind}/" in k)[i]


def damage_index(store: MemoryStore, key: str) -> None:
    """A flipped byte in the index: the object no longer reads, its frames still do."""
    blob = bytearray(store.objects[key])
    blob[-TRAILER.size - 3] ^= 0x55
    store.objects[key] = bytes(blob)


def hostile_case(case: str, tmp_path: Path) -> tuple[MemoryStore, str]:
    """A built store made odd as ``case`` says; returns it and the odd object."""
    store = Keeping()
    build(tmp_path, store)
    if case == "unreadable-older-manifest":
        compact(Repository(store, M), CompactOptions(max_chain=0))  # a newer manifest
        odd = key_of(store, "snap", 0)
        store.objects[odd] = store.objects[odd][:-10]
    elif case == "unreadable-delta":
        odd = key_of(store, "delta")
        damage_index(store, odd)
    elif case == "leftover-narrower-delta":
        [odd] = [k for k in store.gone if "/delta/" in k]  # the small delta that grew
        store.objects[odd] = store.gone[odd]
    elif case == "unreadable-wider-delta":
        real = key_of(store, "delta")
        lo, hi = layout.delta_range(real) or (0, 0)
        odd = layout.delta_key(M, lo, hi + 1)  # a planted wider one: readers pass it over
        store.objects[odd] = store.objects[real][:-1]
    else:  # a planted pack naming the session, nothing references it
        real = key_of(store, "pack")
        lo, hi, _ = real.rsplit("/", 1)[1].split("-")
        odd = f"machines/{M}/pack/{lo}-{hi}-0badc0de"
        store.objects[odd] = store.objects[real]
    return store, odd


@pytest.mark.parametrize("case", ["unreadable-older-manifest", "unreadable-delta",
                                  "leftover-narrower-delta", "unreadable-wider-delta",
                                  "planted-pack"])
def test_forget_in_a_hostile_store(tmp_path: Path, case: str) -> None:
    store, odd = hostile_case(case, tmp_path)
    before, _ = lenient(store)

    rep = rewrite(Repository(store, M), FORGET_SA)

    after, _ = lenient(store)
    assert sorted(after) == sorted(before)
    for seq, tree in before.items():
        assert after[seq] == forgotten(tree), f"point {seq}"
    if case in ("leftover-narrower-delta", "planted-pack"):
        assert rep.errors == [] and odd not in store.objects
        assert_gone(store)
    else:  # one line; and what the fold could not fold past an unreadable delta, or a
        # delta behind an unreadable manifest (whose points cannot be restated)
        assert len([e for e in rep.errors if odd in e]) == 1, rep.errors
        assert all(odd in e or "/seg/" in e or "before it does not read" in e
                   for e in rep.errors), rep.errors


# -- what comes after -----------------------------------------------------------------

def test_compactions_prunes_and_verify_after_a_rewrite(tmp_path: Path) -> None:
    """A rewritten store goes on: flushes, a delta, a manifest and a prune keep every
    point the rewrite left, exactly, and verify finds nothing wrong."""
    src, store, clock = build(tmp_path)
    repo = Repository(store, M)
    rewrite(repo, Rewrite(forget=frozenset({SA}), redact=(SECRET,)))
    done = points(store)
    assert verify(repo, read_data=1.0).problems == []
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    for i in range(5, 11):  # only SB grows (SA's files are the forget's --local to take)
        clock.t += 60
        write(src, TB, line(SB, i, cwd="/home/u/lib"), "ab")
        sh.ship([TB.encode()])
        compact(repo, CompactOptions(max_chain=0 if i == 8 else 24, now=clock.t))
    prune(repo, Policy(keep_within=3 * HOUR), opts=CompactOptions(now=clock.t))

    later = points(store)
    assert len(later) == len(done) + 6
    assert {seq: later[seq] for seq in done} == done
    assert verify(repo, read_data=1.0).problems == []
    raw = all_raw(store)
    assert SA.encode() not in raw and SECRET not in raw


def test_a_trained_dictionary_that_holds_the_session_goes_and_the_others_stay(
        tmp_path: Path) -> None:
    """A dictionary learnt from the machine's newest transcripts may hold the forgotten
    session's lines: no object names it once the rewrite is done, and it is deleted; one
    that holds nothing of it stays."""
    _, store, _ = build(tmp_path)
    before = points(store)
    repo = Repository(store, M)
    learnt = repo.publish(Dictionary(line(SA, 7) * 20 + line(SB, 7) * 20))
    other = repo.publish(Dictionary(line(SB, 8) * 40))

    rep = rewrite(repo, FORGET_SA)

    assert rep.errors == [] and rep.dictionaries == [learnt.rsplit("/", 1)[-1]]
    assert [i.key for i in store.list(f"machines/{M}/dict/")] == [other]
    assert points(store) == {seq: forgotten(t) for seq, t in before.items()}


SC = "eeeeeeee-0000-4000-8000-000000000005"


def test_redact_reaches_catalog_fields_of_every_point(tmp_path: Path) -> None:
    """A value in a session's first prompt is in the catalog of segments, deltas and
    manifests (and in the points' catalogs) and in history.jsonl: masked there as in the
    transcript."""
    src, store, clock = build(tmp_path)
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    tc = f"{APP}/{SC}.jsonl"
    write(src, tc, json.dumps({"type": "user", "sessionId": SC, "cwd": "/home/u/app",
                               "message": {"role": "user",
                                           "content": "deploy with " + SECRET.decode()}},
                              separators=(",", ":")).encode() + b"\n")
    write(src, HIST, json.dumps({"display": "deploy with " + SECRET.decode(),
                                 "project": "/home/u/app", "sessionId": SC}).encode() + b"\n",
          "ab")  # and the prompt in history.jsonl
    sh.ship([tc.encode(), HIST.encode()])
    clock.t += 10
    compact(Repository(store, M), CompactOptions())  # a delta with its catalog
    write(src, tc, json.dumps({"type": "last-prompt", "sessionId": SC,
                               "lastPrompt": "use " + SECRET.decode() + " again"},
                              separators=(",", ":")).encode() + b"\n", "ab")
    sh.ship([tc.encode()])
    assert b"deploy with " + SECRET in all_raw(store)
    before = points(store)

    rep = rewrite(Repository(store, M), Rewrite(redact=(SECRET,)))

    assert rep.errors == []
    assert points(store) == {seq: redacted(t, SECRET) for seq, t in before.items()}
    raw = all_raw(store)
    assert b"deploy with " + SECRET not in raw and b"deploy with " + mask_of(20) in raw
    b = load_backup(Repository(store, M))
    fill = mask_of(len(SECRET)).decode()
    fields = b.sessions[tc.encode()].fields
    assert (fields["first_prompt"], fields["last_prompt"]) == (
        "deploy with " + fill, f"use {fill} again")


def test_a_dry_run_writes_nothing(tmp_path: Path) -> None:
    _, store, _ = build(tmp_path)
    assert isinstance(store, MemoryStore)
    objects = dict(store.objects)

    rep = rewrite(Repository(store, M), Rewrite(forget=frozenset({SA}), redact=(SECRET,)),
                  CompactOptions(dry_run=True))

    assert store.objects == objects
    assert rep.dry_run and rep.files_dropped and rep.ranges_masked and rep.rewritten
    assert rep.written == [] and rep.deleted == []


def test_the_head_is_written_again_without_what_goes(tmp_path: Path) -> None:
    """The head lists every session and its catalog fields: a forgotten session leaves
    it, a redacted value is masked in it (the same flush: readers fold as before)."""
    src, store, clock = build(tmp_path)
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    write(src, TB, json.dumps({"type": "user", "sessionId": SB, "cwd": "/home/u/lib",
                               "message": {"role": "user", "content": "hi " + SECRET.decode()}},
                              separators=(",", ":")).encode() + b"\n", "ab")
    sh.ship([TB.encode()])
    HeadWriter(Repository(store, M), sh.state, os.fsencode(src), interval=300,
               tombstone_keep=0).write()
    repo = Repository(store, M)
    head = repo.head()
    assert head is not None and {s.path for s in head.sessions} == {TA.encode(), TB.encode()}

    rep = rewrite(repo, Rewrite(forget=frozenset({SA}), redact=(SECRET,)))

    assert rep.errors == []
    after = repo.head()
    assert after is not None and (after.seq, after.time) == (head.seq, head.time)
    assert [s.path for s in after.sessions] == [TB.encode()]
    assert after.sessions[0].fields["first_prompt"] == "hi " + mask_of(len(SECRET)).decode()
    assert SA.encode() not in all_raw(store)
    assert rewrite(repo, FORGET_SA).note == "nothing holds it"


def test_redact_masks_a_value_in_files_that_are_no_json(tmp_path: Path) -> None:
    """A tool's output and a file's copy in file-history are plain text (a .env file,
    a command's output): every occurrence of the value there is masked."""
    src, store, clock = build(tmp_path)
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    env = f"file-history/{SB}/3f2a9c1b@v1"
    out = f"{LIB}/{SB}/tool-results/toolu_01abc.txt"
    write(src, env, b"DEBUG=1\nAWS_ACCESS_KEY_ID=" + SECRET + b"\n")
    write(src, out, b"$ env | grep AWS\nAWS_ACCESS_KEY_ID=" + SECRET + b" (x2: " + SECRET
          + b")\n")
    sh.ship([env.encode(), out.encode()])
    compact(Repository(store, M), CompactOptions(max_chain=0))
    before = points(store)

    rep = rewrite(Repository(store, M), Rewrite(redact=(SECRET,)))

    assert rep.errors == [] and not [w for w in rep.left_alone if "not inside" in w]
    assert points(store) == {seq: redacted(t, SECRET) for seq, t in before.items()}
    raw = all_raw(store)
    assert raw.count(SECRET) == raw.count(b"thinking of " + SECRET)  # the signed block


def test_forget_a_session_only_history_names(tmp_path: Path) -> None:
    """A session whose transcript is long gone still has lines in history.jsonl, and an
    older manifest's history extents name its id's first 8 hex digits (``sids``)."""
    src, store, clock = tmp_path / "src", MemoryStore(), Clock()
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    write(src, TB, line(SB, 0, cwd="/home/u/lib"))
    write(src, HIST, history(SC, 0) + history(SB, 0))
    ship_all(sh, src)
    compact(Repository(store, M), CompactOptions(max_chain=0))
    for i in (1, 2):
        clock.t += 10
        write(src, TB, line(SB, i, cwd="/home/u/lib"), "ab")
        write(src, HIST, history(SB, i), "ab")
        ship_all(sh, src)
        compact(Repository(store, M), CompactOptions(max_chain=0))
    assert SC[:8].encode() in all_raw(store)
    before = points(store)

    rep = rewrite(Repository(store, M), Rewrite(forget=frozenset({SC})))

    assert rep.errors == [] and rep.ranges_masked == 1
    assert points(store) == {seq: without(t, SC) for seq, t in before.items()}
    assert SC[:8].encode() not in all_raw(store)


def test_a_segment_beyond_the_head_is_named_then_rewritten_once_covered(
        tmp_path: Path) -> None:
    """Compaction folds no segment past the machine's head (readers fold those onto it):
    one holding what goes is named, and the run after the next head finishes the job."""
    src, store, clock = build(tmp_path)
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    heads = HeadWriter(Repository(store, M), sh.state, os.fsencode(src), interval=300,
                       tombstone_keep=0)
    heads.write()
    clock.t += 10
    write(src, TA, line(SA, 9), "ab")
    sh.ship([TA.encode()])  # past the head
    before = points(store)

    rep = rewrite(Repository(store, M), FORGET_SA)

    [seg] = [k for k, _ in Repository(store, M).segments()]
    assert len(rep.errors) == 1 and seg in rep.errors[0] and "not folded" in rep.errors[0]
    assert SA.encode() in all_raw(store)
    heads.write()
    again = rewrite(Repository(store, M), FORGET_SA)
    assert again.errors == []
    assert points(store) == {seq: forgotten(t) for seq, t in before.items()}
    assert_gone(store)


def test_a_value_only_in_a_segment_beyond_the_head_is_named_not_nothing(
        tmp_path: Path) -> None:
    """A value shipped after the head (a flush the head does not cover yet, as right after
    `syncd sync`): the fold leaves its segment, and the run says so (an error naming it),
    never "nothing holds it"; once a head covers it, the next run masks it."""
    src, store, clock = build(tmp_path)
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    heads = HeadWriter(Repository(store, M), sh.state, os.fsencode(src), interval=300,
                       tombstone_keep=0)
    heads.write()
    fresh = b"ghp_R8tQ2vLmN4pZ7wXc1yB6kJ3hF9sD0aE5gU2i"
    clock.t += 10
    write(src, TB, said(SB, 7, "export GITHUB_TOKEN=" + fresh.decode()), "ab")
    sh.ship([TB.encode()])  # past the head
    before = points(store)

    rep = rewrite(Repository(store, M), Rewrite(redact=(fresh,)))

    [seg] = [k for k, _ in Repository(store, M).segments()]
    assert rep.note != "nothing holds it"
    assert len(rep.errors) == 1 and seg in rep.errors[0] and "not folded" in rep.errors[0]
    assert fresh in all_raw(store)
    heads.write()
    again = rewrite(Repository(store, M), Rewrite(redact=(fresh,)))
    assert again.errors == [] and again.ranges_masked == 1
    assert points(store) == {seq: redacted(t, fresh) for seq, t in before.items()}
    assert fresh not in all_raw(store)


def test_redact_a_value_in_frames_two_generations_share(tmp_path: Path, story: Story) -> None:
    """The patched transcript's new generation is copies of runs of the old one (parts of
    the same frames) and a moved session's files copies of their old paths: a value in
    those bytes is masked in both generations, in every point."""
    base, before, opts = story
    patched = json.loads(line(SP, 50))["message"]["content"][40:80].encode()
    moved = json.loads(line(SM, 3))["message"]["content"][40:80].encode()
    holders = {p for t in before.values() for p, d in t.items() if patched in d or moved in d}
    assert holders == {TP.encode(), TM_LIB.encode()}, holders  # (the old path: pruned)
    store = copy_of(base, tmp_path)

    rep = rewrite(Repository(store, M), Rewrite(redact=(patched, moved)), opts)

    assert rep.errors == []
    after = points(store)
    assert after == {seq: redacted(redacted(t, patched), moved) for seq, t in before.items()}
    raw = all_raw(store)
    assert patched not in raw and moved not in raw
    assert verify(Repository(store, M), read_data=1.0).problems == []


def test_two_forgets_one_after_the_other(tmp_path: Path, story: Story) -> None:
    base, before, opts = story
    store = copy_of(base, tmp_path)
    for sid in (SA, SM):
        assert rewrite(Repository(store, M), Rewrite(forget=frozenset({sid})), opts
                       ).errors == []
    assert points(store) == {seq: without(without(t, SA), SM) for seq, t in before.items()}
    raw = all_raw(store)
    assert not [s for s in (SA, SM) if s[:8].encode() in raw]

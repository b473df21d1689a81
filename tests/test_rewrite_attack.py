"""Rewrite under attack: kill -9 before every store write, encrypted stores, SeaweedFS,
pruned stores with long chains, copies and patches, hostile objects, and what later
compactions, prunes and verify make of a rewritten store."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import zstandard

from syncd.archive.compact import CompactOptions
from syncd.archive.rewrite import Rewrite, rewrite
from syncd.errors import CryptoError
from syncd.format.segment import TRAILER
from syncd.mask import mask_of
from syncd.repository import Repository
from syncd.security.crypto import Crypto, new_master, unpad
from syncd.store import LocalStore, MemoryStore, Store, layout, open_store
from tests.seaweed import Seaweed
from tests.test_compact import SA
from tests.test_rewrite import SECRET, M, all_raw, build, forgotten, points

ROOT = Path(__file__).resolve().parent.parent
FORGET_SA = Rewrite(forget=frozenset({SA}))


def assert_gone(store: Store) -> None:
    raw = all_raw(store)
    assert SA.encode() not in raw and SA[:8].encode() not in raw


def assert_between(before: dict[int, dict[bytes, bytes]],
                   after: dict[int, dict[bytes, bytes]]) -> None:
    """Every point holds, file by file, what it held or its forgotten version: no file of
    another session is missing or changed otherwise."""
    assert sorted(after) == sorted(before)
    for seq, tree in before.items():
        want = forgotten(tree)
        got = after[seq]
        for p, data in got.items():
            assert data in (tree.get(p), want.get(p)), f"point {seq}: {p!r}"
        assert set(want) <= set(got) <= set(tree), f"point {seq}"


# -- kill -9 -----------------------------------------------------------------------

def kill_rewrite(base: Path, work: Path, kill_at: int, mode: str) -> tuple[
        subprocess.CompletedProcess[str], list[str]]:
    """A rewrite of a copy of ``base`` in a process SIGKILLed before write ``kill_at``."""
    shutil.copytree(base, work / "store")
    log = work / "writes.log"
    r = subprocess.run([sys.executable, "-m", "tests.compactkill", str(work / "store"), M,
                        str(kill_at), str(log), str(8 << 10), str(4 << 10), mode],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    return r, log.read_text().splitlines() if log.exists() else []


def test_kill_9_before_every_store_write_of_a_forget(tmp_path: Path) -> None:
    base = tmp_path / "base"
    build(tmp_path, LocalStore(base))
    before = points(LocalStore(base))
    want = {seq: forgotten(t) for seq, t in before.items()}
    clean, writes = kill_rewrite(base, tmp_path / "clean", 0, f"forget={SA}")
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["errors"] == []
    kinds = [w.split("/")[2] if w.startswith("put ") else "delete" for w in writes]
    # The fold first, then new packs and manifests, then deletions.
    assert "pack" in kinds and "snap" in kinds and kinds[-1] == "delete", kinds
    assert points(LocalStore(tmp_path / "clean" / "store")) == want

    for k in range(1, len(writes) + 1):
        work = tmp_path / f"kill-{k}"
        r, done = kill_rewrite(base, work, k, f"forget={SA}")
        assert r.returncode == -signal.SIGKILL, (k, r.stdout, r.stderr)
        assert done == writes[:k] or len(done) == k
        store = LocalStore(work / "store")
        assert_between(before, points(store))

        again = rewrite(Repository(store, M), FORGET_SA, CompactOptions())

        assert again.errors == [], (k, again.errors)
        assert points(store) == want, k
        assert_gone(store)
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

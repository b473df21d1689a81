"""``syncd check-store``: does a provider do what syncd relies on, before it is trusted?

Every check runs against a scratch prefix (``check-store/<random>/``) that is removed
at the end. A provider that silently ignores ``If-None-Match`` or ``If-Match`` would let
two writers overwrite each other's segments or leases: those are required features.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from syncd.errors import AlreadyExists, PreconditionFailed, StoreError
from syncd.store import Store


@dataclass(frozen=True)
class Verdict:
    feature: str
    ok: bool
    detail: str = ""
    required: bool = True

    def line(self) -> str:
        mark = "ok  " if self.ok else ("FAIL" if self.required else "warn")
        return f"{mark}  {self.feature}" + (f": {self.detail}" if self.detail else "")


class _Failed(Exception):
    pass


def _expect(cond: bool, why: str) -> None:
    if not cond:
        raise _Failed(why)


class _Checker:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.prefix = f"check-store/{os.urandom(6).hex()}/"
        self.verdicts: list[Verdict] = []

    def k(self, name: str) -> str:
        return self.prefix + name

    def run(self, feature: str, fn: Callable[[], str | None], required: bool = True) -> bool:
        try:
            detail = fn() or ""
        except _Failed as e:
            self.verdicts.append(Verdict(feature, False, str(e), required))
            return False
        except StoreError as e:
            self.verdicts.append(Verdict(feature, False, f"{type(e).__name__}: {e}", required))
            return False
        self.verdicts.append(Verdict(feature, True, detail, required))
        return True

    # -- the checks --------------------------------------------------------------------
    def put_get(self) -> str:
        etag = self.store.put(self.k("obj"), b"0123456789")
        _expect(self.store.get(self.k("obj")) == b"0123456789", "read back other bytes")
        info = self.store.head(self.k("obj"))
        _expect(info is not None and info.size == 10, f"HEAD says {info}")
        assert info is not None
        _expect(bool(etag) and info.etag == etag,
                f"PUT answered etag {etag!r}, HEAD says {info.etag!r}")
        return ""

    def conditional_create(self) -> str:
        try:
            self.store.put(self.k("obj"), b"overwritten", if_none_match=True)
        except AlreadyExists:
            pass
        else:
            raise _Failed("a second PUT with If-None-Match: * succeeded (412 expected)")
        _expect(self.store.get(self.k("obj")) == b"0123456789",
                "the object was overwritten despite the 412")
        return "412 on an existing key, object kept"

    def conditional_replace(self) -> str:
        info = self.store.head(self.k("obj"))
        assert info is not None
        new = self.store.put(self.k("obj"), b"replaced", if_match=info.etag)
        _expect(self.store.get(self.k("obj")) == b"replaced", "If-Match PUT did not replace")
        _expect(new != info.etag, "the etag did not change")
        self._old_etag = info.etag
        return "replaced with the current etag"

    def stale_etag(self) -> str:
        try:
            self.store.put(self.k("obj"), b"stale writer", if_match=self._old_etag)
        except PreconditionFailed:
            pass
        else:
            raise _Failed("a PUT with a stale If-Match etag succeeded (412 expected)")
        _expect(self.store.get(self.k("obj")) == b"replaced", "the stale PUT changed the object")
        try:
            self.store.put(self.k("missing"), b"x", if_match=self._old_etag)
        except PreconditionFailed:
            pass
        else:
            raise _Failed("a PUT with If-Match on a missing key succeeded")
        _expect(self.store.head(self.k("missing")) is None, "the missing key was created")
        return "412 on a stale etag and on a missing key"

    def ranged_get(self) -> str:
        data = bytes(range(256)) * 4
        self.store.put(self.k("range"), data)
        cases = [((100, 50), data[100:150]), ((1000,), data[1000:]), ((-24,), data[-24:]),
                 ((-5000,), data), ((0, 0), b"")]
        for args, want in cases:
            got = self.store.get(self.k("range"), *args)
            _expect(got == want, f"get{args} returned {len(got)} wrong bytes")
        return "offset+length, open-ended, suffix (also longer than the object)"

    def list_order(self) -> str:
        names = ["seg/0000000000000010", "seg/0000000000000002", "seg/000000000000000a",
                 "seg/0000000000000001", "seg-other", "seg/0000000000000100"]
        for n in names:
            self.store.put(self.k(n), b"x")
        got = [o.key[len(self.prefix):] for o in self.store.list(self.k("seg/"))]
        want = sorted((n for n in names if n.startswith("seg/")), key=str.encode)
        _expect(got == want, f"listed {got}, expected {want}")
        after = [o.key[len(self.prefix):] for o in
                 self.store.list(self.k("seg/"), start_after=self.k(want[1]))]
        _expect(after == want[2:], f"start-after listed {after}, expected {want[2:]}")
        return "byte order under a prefix, start-after"

    def delimited_list(self) -> str:
        # The machines of a store are the common prefixes under machines/.
        for n in ("dl/b/1", "dl/a/x/2", "dl/a/3", "dl/c"):
            self.store.put(self.k(n), b"x")
        got = [p[len(self.prefix):] for p in self.store.prefixes(self.k("dl/"))]
        _expect(got == ["dl/a/", "dl/b/"], f"listed {got}, expected ['dl/a/', 'dl/b/']")
        return "common prefixes one level down, in byte order"

    def delete(self) -> str:
        keys = [o.key for o in self.store.list(self.prefix)]
        self.store.delete_many([*keys, self.k("never-existed")])
        left = [o.key for o in self.store.list(self.prefix)]
        _expect(not left, f"{len(left)} objects still listed after delete")
        _expect(self.store.head(self.k("obj")) is None, "HEAD still finds a deleted object")
        return f"{len(keys)} objects and a missing key in one call"


def check_store(store: Store) -> list[Verdict]:
    """Run every check; one verdict per feature.

    ``StoreError`` when the store cannot be reached at all (nor with these credentials):
    one read decides that before any check, which would each run into the deadline.
    """
    c = _Checker(store)
    store.head(c.k("obj"))
    try:
        if c.run("PUT, GET and HEAD (size, etag)", c.put_get):
            c.run("conditional create (If-None-Match: *)", c.conditional_create)
            if c.run("conditional replace (If-Match, current etag)", c.conditional_replace):
                c.run("conditional replace refused (If-Match, stale etag or missing key)",
                      c.stale_etag)
        c.run("ranged GET (range, open-ended, suffix)", c.ranged_get)
        c.run("LIST order and start-after", c.list_order)
        c.run("delimited LIST (common prefixes)", c.delimited_list)
        c.run("DELETE (batch, missing keys ignored)", c.delete)
    finally:
        try:
            left = [o.key for o in store.list(c.prefix)]
            if left:
                store.delete_many(left)
        except StoreError as e:
            c.verdicts.append(Verdict("clean-up of the scratch prefix", False, str(e),
                                      required=False))
    return c.verdicts

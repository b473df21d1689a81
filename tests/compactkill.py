"""One compaction (or prune) of a local store that SIGKILLs itself right before its k-th
store write.

    python -m tests.compactkill STORE_DIR MACHINE KILL_AT LOG PACK_TARGET SMALL_PACK [MODE [NOW]]

MODE ``prune`` runs a prune that keeps the newest snapshot only (keep_last 1) instead;
``prune-window`` a prune that keeps the flushes of the last second and 1 hourly point;
``delta`` a compaction that may write a delta (without a mode, every compaction writes a
manifest); ``forget=<session id>`` and ``redact=<value>`` a rewrite (``archive/rewrite``)
that takes that session or value out of every point, with deltas for the compaction it
starts with. NOW: the compaction's clock (seconds since the epoch).

A store write is a ``put`` or a ``delete_many``. Each one is appended to LOG (``put <key>``
or ``delete <n>``) and flushed before it is made (or the process killed instead), so the
caller knows what the k-th write was. KILL_AT 0 never kills: the run completes and prints
its report as JSON.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterable
from pathlib import Path

from syncd.archive.compact import CompactOptions, compact
from syncd.archive.prune import prune
from syncd.archive.retention import Policy
from syncd.archive.rewrite import Rewrite, rewrite
from syncd.repository import Repository
from syncd.store import LocalStore


class KillingStore(LocalStore):
    def __init__(self, root: Path, kill_at: int, log: Path) -> None:
        super().__init__(root)
        self.kill_at = kill_at
        self.log = log
        self.writes = 0

    def _write(self, what: str) -> None:
        self.writes += 1
        with open(self.log, "a") as f:
            f.write(what + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.writes == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def put(self, key: str, data: bytes, *, if_none_match: bool = True,
            if_match: str | None = None) -> str:
        self._write(f"put {key}")
        return super().put(key, data, if_none_match=if_none_match, if_match=if_match)

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self._write(f"delete {len(keys)}")
        super().delete_many(keys)


def main(argv: list[str]) -> int:
    root, machine, kill_at, log, pack_target, small_pack, *rest = argv
    mode = rest[0] if rest else ""
    store = KillingStore(Path(root), int(kill_at), Path(log))
    opts = CompactOptions(pack_target=int(pack_target), small_pack=int(small_pack),
                          max_chain=24 if mode in ("delta", "prune-window") else 0,
                          delta_target=0 if mode == "prune-window" else 64 << 10,
                          now=float(rest[1]) if len(rest) > 1 else None)
    repo = Repository(store, machine)
    if mode.startswith(("forget=", "redact=")):
        what, _, value = mode.partition("=")
        spec = Rewrite(forget=frozenset({value})) if what == "forget" else \
            Rewrite(redact=(value.encode(),))
        print(json.dumps(rewrite(repo, spec, opts).as_dict()))
    elif mode == "prune":
        print(json.dumps(prune(repo, Policy(keep_last=1), opts=opts).as_dict()))
    elif mode == "prune-window":
        policy = Policy(keep_within=1.0, keep_hourly=1)
        print(json.dumps(prune(repo, policy, opts=opts).as_dict()))
    else:
        print(json.dumps(compact(Repository(store, machine), opts=opts).as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

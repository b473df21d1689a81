"""Prune: forget the snapshots the retention policy does not keep, then reclaim their data.

Forgetting deletes manifests (oldest first, at most a share of the machine's objects per
run); reclaiming is a compaction that recomputes which older generations the kept
snapshots still need and rewrites packs that are mostly garbage. The newest snapshot
is never deleted, and a policy that would keep nothing by its own rules is refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from syncd.archive.compact import CompactOptions, CompactReport, _compact, exclusive
from syncd.archive.retention import Policy, SnapRef, Verdict, plan
from syncd.errors import CompactError, FormatError, PolicyError, StoreError
from syncd.format.snapshot import current
from syncd.repository import Repository


@dataclass
class PruneReport:
    machine: str
    policy: str
    verdicts: list[Verdict] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)
    compaction: CompactReport | None = None
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"machine": self.machine, "policy": self.policy, "dry_run": self.dry_run,
                "snapshots": [{"key": v.snap.key, "seq": v.snap.seq, "time": v.snap.time,
                               "keep": v.keep, "reasons": list(v.reasons)}
                              for v in self.verdicts],
                "forgotten": self.forgotten, "deferred": self.deferred, "errors": self.errors,
                "compaction": None if self.compaction is None else self.compaction.as_dict()}


def prune(repo: Repository, policy: Policy, *, max_share: float = 0.5,
          opts: CompactOptions | None = None) -> PruneReport:
    """Forget the repository machine's snapshots ``policy`` does not keep, then reclaim
    what only they needed."""
    machine = repo.machine
    opts = opts or CompactOptions()
    rep = PruneReport(machine, policy.describe(), dry_run=opts.dry_run)
    with exclusive(opts.lock, "prune"):
        snaps = repo.snapshots()
        refs: list[SnapRef] = []
        unreadable: list[str] = []
        for seq, _, key in current(snaps):
            try:
                refs.append(SnapRef(key, seq, repo.read_manifest(key).time))
            except (FormatError, StoreError) as e:
                # Kept: what it holds cannot be judged, and deleting it proves nothing.
                unreadable.append(key)
                rep.errors.append(f"kept, unreadable: {e}")
        if not refs:
            rep.errors.append(f"machine {machine!r} has no readable snapshot to prune "
                              "(run syncd compact first)")
            return rep
        try:
            rep.verdicts = plan(refs, policy)
        except PolicyError as e:
            raise CompactError(str(e)) from None
        forget = sorted((v.snap for v in rep.verdicts if not v.keep), key=lambda s: s.seq)
        objects = len(repo.objects())
        allowed = max(1, int(max_share * objects))
        now_forget, later = forget[:allowed], forget[allowed:]
        rep.forgotten = [s.key for s in now_forget]
        rep.deferred = [s.key for s in later]
        keep = [v.snap.key for v in rep.verdicts if v.keep] + rep.deferred + unreadable
        if opts.dry_run:
            rep.compaction = _compact(repo, dataclasses.replace(opts, keep=keep))
            return rep
        gone = {s.seq for s in now_forget}
        # Every revision of a forgotten seq goes; data stays referenced by the newest
        # manifest until the compaction below writes one that no longer needs it.
        repo.delete([key for seq, _, key in snaps if seq in gone])
        rep.compaction = _compact(repo, dataclasses.replace(opts, keep=keep))
    return rep

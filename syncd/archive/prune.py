"""Prune: forget the snapshots the retention policy does not keep, then reclaim their data.

Forgetting deletes manifests (oldest first, at most a share of the machine's objects per
run); reclaiming is a compaction that recomputes which older generations the kept
snapshots still need and rewrites packs that are mostly garbage. The newest snapshot
is never deleted, and a policy that would keep nothing by its own rules is refused.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from syncd.archive.compact import CompactOptions, CompactReport, _compact, exclusive
from syncd.archive.retention import Policy, SnapRef, Verdict, format_duration, plan
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
    dropped: list[str] = field(default_factory=list)
    compaction: CompactReport | None = None
    folded: CompactReport | None = None
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"machine": self.machine, "policy": self.policy, "dry_run": self.dry_run,
                "snapshots": [{"key": v.snap.key, "seq": v.snap.seq, "time": v.snap.time,
                               "keep": v.keep, "reasons": list(v.reasons)}
                              for v in self.verdicts],
                "forgotten": self.forgotten, "deferred": self.deferred,
                "dropped": self.dropped, "errors": self.errors,
                "compaction": None if self.compaction is None else self.compaction.as_dict(),
                "folded": None if self.folded is None else self.folded.as_dict()}


def prune(repo: Repository, policy: Policy, *, max_share: float = 0.5,
          opts: CompactOptions | None = None) -> PruneReport:
    """Forget the repository machine's snapshots ``policy`` does not keep, then reclaim
    what only they needed.

    Every flush within the policy's window stays a point: the newest manifest at or
    before the window's start (its *base*) is kept, and every delta and manifest after
    it. Deltas before the base are dropped once a compaction has moved their data.
    """
    machine = repo.machine
    opts = opts or CompactOptions()
    rep = PruneReport(machine, policy.describe(), dry_run=opts.dry_run)
    with exclusive(opts.lock, "prune"):
        # The flushes since the last compaction first, as any compaction folds them (a
        # delta): the reclaiming below then writes a manifest only to reclaim something.
        rep.folded = _compact(repo, opts)
        rep.errors += rep.folded.errors
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
        deltas = repo.deltas()
        # The newest point: the newest manifest's, or the end of the deltas chained after
        # it that read and that the writer confirmed (never a planted key's word), and
        # never later than now.
        chain = repo.delta_chain(max(r.seq for r in refs), opts.acknowledged)
        newest = max([r.time for r in refs] + [d.time for d in chain[-1:]])
        now = time.time() if opts.now is None else opts.now
        base = _window_base(refs, min(newest, max(now, max(r.time for r in refs))), policy)
        rep.verdicts = [v if v.keep or v.snap.seq < base.seq else
                        Verdict(v.snap, True, (f"within {_window(policy)} (every flush)",))
                        for v in rep.verdicts]
        forget = sorted((v.snap for v in rep.verdicts if not v.keep), key=lambda s: s.seq)
        drop = [d[2] for d in deltas if d[1] <= base.seq]
        objects = len(repo.objects())
        allowed = max(1, int(max_share * objects))
        now_forget, later = forget[:allowed], forget[allowed:]
        drop = drop[:max(0, allowed - len(now_forget))]
        rep.forgotten = [s.key for s in now_forget]
        rep.deferred = [s.key for s in later]
        rep.dropped = drop
        keep = [v.snap.key for v in rep.verdicts if v.keep] + rep.deferred + unreadable
        for _, _, key, size in [d for d in deltas if d[2] not in drop]:
            try:
                repo.read_delta(key, size)
                keep.append(key)
            except (FormatError, StoreError) as e:
                # Its points are lost already; what it holds is no kept point's.
                rep.errors.append(f"left as it is, unreadable: {e}")
        pruned = dataclasses.replace(opts, keep=keep, drop=drop)
        if opts.dry_run:
            rep.compaction = _compact(repo, pruned)
            return rep
        gone = {s.seq for s in now_forget}
        # Every revision of a forgotten seq goes; data stays referenced by the newest
        # manifest until the compaction below writes one that no longer needs it.
        repo.delete([key for seq, _, key in snaps if seq in gone])
        rep.compaction = _compact(repo, pruned)
    return rep


def _window(policy: Policy) -> str:
    return "the last " + (format_duration(policy.window) if not policy.empty else "ever")


def _window_base(refs: list[SnapRef], newest: float, policy: Policy) -> SnapRef:
    """The newest manifest at or before the start of the policy's window, measured from
    the ``newest`` point (the oldest manifest when none is that old): every point after
    it stays."""
    ordered = sorted(refs, key=lambda r: r.seq)
    if policy.empty:
        return ordered[0]
    start = newest - policy.window
    older = [r for r in ordered if r.time <= start]
    return older[-1] if older else ordered[0]

"""Another machine's files scanned for secrets from its backup (``syncd secrets
--machine M``).

The backup is read as a view (indexes only); of each file only the bytes past what the
findings already hold for it are fetched, a window of one object's frames at a time,
as ``search/remote`` indexes. What a store says is untrusted: windows bound the memory
whatever sizes it claims, and an object that does not read is one line, the other
files still scanned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from syncd.format.segment import Extent
from syncd.repository import Repository
from syncd.search.remote import windows
from syncd.secrets.findings import Findings, is_scanned
from syncd.view import load_backup


@dataclass
class RemoteScan:
    machine: str
    files: int = 0      # files of the backup the scan reads
    scanned: int = 0    # of those, with bytes not scanned before
    bytes: int = 0      # raw bytes scanned
    deleted: int = 0    # files gone from the backup (their findings dropped)
    problems: list[str] = field(default_factory=list)


def scan_machine(repo: Repository, machine: str, findings: Findings) -> RemoteScan:
    """Scan ``machine``'s files as its backup holds them now into ``findings``. Raises
    what ``load_backup`` raises for a backup that does not read at all."""
    b = load_backup(repo.for_machine(machine))
    r = RemoteScan(machine, problems=list(b.errors))
    mrepo = repo.for_machine(machine)
    live = set()
    for path, f in sorted(b.files.items()):
        if not is_scanned(path) or f.deleted_at is not None:
            continue
        live.add(path)
        r.files += 1
        c = findings.cursor(machine, path)
        if c is not None and not c.deleted and c.gen == f.gen and c.size == f.size:
            continue
        start = c.size if c is not None and not c.deleted and c.gen == f.gen and \
            c.size <= f.size else 0
        exts = [(k, x) for k, x in f.extents if x.end > start and x.start < f.size]
        findings.feed(machine, path, f.gen, start, b"")  # from 0: the old ones go
        if not exts:
            if f.size > start:
                r.problems.append(f"{path.decode(errors='replace')} (machine {machine!r}): "
                                  f"bytes {start}..{f.size} are in no object of the store")
            continue
        r.scanned += 1
        _scan_file(mrepo, machine, path, f.gen, start, f.size, exts, findings, r)
        findings.commit()
    for path, deleted in findings.files(machine).items():
        if not deleted and path not in live:
            findings.mark_deleted(machine, path)
            r.deleted += 1
    findings.commit()
    return r


def _scan_file(repo: Repository, machine: str, path: bytes, gen: int, start: int,
               size: int, exts: list[tuple[str, Extent]], findings: Findings,
               r: RemoteScan) -> None:
    """Feed the file's bytes from ``start`` window by window; the first that does not
    read ends this file (what came before it stays scanned)."""
    name = path.decode(errors="replace")
    pos = start  # the findings hold [0, pos)
    carry = b""  # bytes from pos on that end in no complete line yet
    for w in windows(repo, exts, start, size):
        data = carry + w.data
        while data:  # a window may hold more than a feed takes (a long line's rest)
            took = findings.feed(machine, path, gen, pos, data)
            r.bytes += took
            pos += took
            data = data[took:]
            if took == 0:
                break
        carry = data
        if w.bad:
            r.problems.append(f"{w.bad} ({name} of machine {machine!r} scanned up to "
                              f"byte {pos})")
            return
        if w.end >= size:  # a last line with no newline yet waits, as here
            return

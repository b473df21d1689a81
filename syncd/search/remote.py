"""Another machine's transcripts indexed from its backup, on request (`syncd index`).

The backup is read as a view (indexes only); of each transcript only the extents past
what the search index already holds are fetched, a window at a time, so a second run
reads only what was flushed since. What a store says is untrusted: windows bound the
memory whatever sizes it claims, and an object that does not read is one line, the
other files still indexed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from syncd.errors import FormatError, StoreError
from syncd.format.catalog import Session, parse_origin, session_of
from syncd.format.segment import Extent
from syncd.format.snapshot import Entry
from syncd.repository import Repository
from syncd.view import load_backup

# Raw transcript bytes fetched and fed at a time (a frame is 4 MiB at most).
WINDOW = 16 << 20
# A line longer than this is not waited for: the file is indexed up to it (the index
# could not hold it in one row anyway, and waiting would hold it all in memory).
LINE_MAX = 16 << 20


class Index(Protocol):
    """What indexing a machine needs of ``syncd.search.index.SearchIndex``."""

    def cursor(self, machine: str, path: bytes) -> tuple[int, int] | None: ...

    def feed(self, machine: str, path: bytes, gen: int, start: int, data: bytes) -> int: ...

    def set_session(self, machine: str, session: str,
                    fields: dict[str, str | float | None]) -> None: ...

    def mark_deleted(self, machine: str, path: bytes) -> None: ...

    def files(self, machine: str) -> dict[bytes, bool]: ...

    def commit(self) -> None: ...


@dataclass
class Todo:
    """One file to index: its generation, from where, and the extents that hold it."""

    path: bytes
    gen: int
    start: int
    size: int
    extents: list[tuple[str, Extent]]
    deleted: bool


@dataclass
class RemoteIndexReport:
    machine: str
    dry_run: bool = False
    files: int = 0  # transcripts in the backup
    to_index: int = 0  # of those, with bytes not indexed yet
    planned_bytes: int = 0  # stored bytes of the frames to fetch
    planned_objects: int = 0  # objects they are in
    raw_bytes: int = 0  # transcript bytes to index
    fetched_bytes: int = 0  # stored bytes of the frames read
    indexed_bytes: int = 0  # transcript bytes the index took
    deleted: int = 0  # files marked deleted
    sessions: int = 0  # catalog entries given to the index
    problems: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def is_transcript(path: bytes) -> bool:
    """A session's transcript or one of its subagents' (projects/**.jsonl)."""
    return path.startswith(b"projects/") and path.endswith(b".jsonl") and \
        path.count(b"/") >= 2


def index_machine(repo: Repository, machine: str, index: Index, *, dry_run: bool = False,
                  on_plan: Callable[[RemoteIndexReport], None] | None = None
                  ) -> RemoteIndexReport:
    """Index ``machine``'s transcripts as its backup holds them now into ``index``.

    ``on_plan`` hears what will be downloaded before a byte of a transcript is (the
    dry run stops there). Raises what ``load_backup`` raises for a backup that does not
    read at all; anything less is a line of ``problems``.
    """
    b = load_backup(repo.for_machine(machine))
    r = RemoteIndexReport(machine, dry_run=dry_run, problems=list(b.errors))
    todo = plan(b.machine, b.files, index, r)
    if on_plan is not None:
        on_plan(r)
    if dry_run:
        return r
    for t in todo:
        _index_file(repo.for_machine(machine), machine, t, index, r)
        index.commit()
    # Deleted there, or gone from the backup (expired): still findable, marked so. Not
    # the old copy of a session moved to another project folder: it lives on there
    # (marking a transcript marks its session).
    known = index.files(machine)
    live = {sid for p, f in b.files.items()
            if f.deleted_at is None and (sid := session_of(p)) is not None}
    gone = {p for p, f in b.files.items() if f.deleted_at is not None and is_transcript(p)}
    gone |= {p for p in known if p not in b.files}
    for path in sorted(gone):
        if not known.get(path, False) and session_of(path) not in live:
            index.mark_deleted(machine, path)
            r.deleted += 1
    for sid, s in _sessions(b.sessions).items():
        index.set_session(machine, sid, catalog_fields(s))
        r.sessions += 1
    index.commit()
    return r


def plan(machine: str, files: dict[bytes, Entry], index: Index,
         r: RemoteIndexReport) -> list[Todo]:
    """The files with bytes past the index's cursor, and what fetching them costs."""
    todo = []
    frames: set[tuple[str, int]] = set()
    for path, f in sorted(files.items()):
        if not is_transcript(path):
            continue
        r.files += 1
        cur = index.cursor(machine, path)
        start = cur[1] if cur is not None and cur[0] == f.gen and cur[1] <= f.size else 0
        if cur is not None and (cur[0], cur[1]) == (f.gen, f.size):
            continue
        exts = [(k, x) for k, x in f.extents if x.end > start and x.start < f.size]
        if not exts and f.size > start:
            r.problems.append(f"{path.decode(errors='replace')} (machine {machine!r}): "
                              f"bytes {start}..{f.size} are in no object of the store")
            continue
        todo.append(Todo(path, f.gen, start, f.size, exts, f.deleted_at is not None))
        r.to_index += 1
        r.raw_bytes += f.size - start
        for k, x in exts:
            if (k, x.off) not in frames:  # parts of one frame are fetched once
                frames.add((k, x.off))
                r.planned_bytes += x.clen
    r.planned_objects = len({k for k, _ in frames})
    return todo


def _windows(exts: list[tuple[str, Extent]]) -> Iterator[tuple[str, list[Extent]]]:
    """Runs of consecutive extents of one object, ``WINDOW`` raw bytes at most each
    (one extent alone when it is larger: a frame is bounded by the reader)."""
    run: list[Extent] = []
    key = ""
    for k, x in exts:
        if run and (k != key or sum(e.end - e.start for e in run) + x.end - x.start > WINDOW):
            yield key, run
            run = []
        key = k
        run.append(x)
    if run:
        yield key, run


@dataclass
class Window:
    """One run of a backed-up file's bytes, as ``windows`` reads it."""

    data: bytes  # the file's bytes from the next one wanted
    end: int  # the byte after them
    fetched: int  # the stored bytes of the run's frames
    bad: str | None  # why the run stops short (what did not read): the last window


def windows(repo: Repository, exts: list[tuple[str, Extent]], start: int, size: int
            ) -> Iterator[Window]:
    """Bytes ``start``… (up to ``size``) of a file whose extents are ``exts``, a run of
    one object's frames at a time (``WINDOW`` raw bytes at most); the first extent that
    does not read ends it (what read before it comes in that last window)."""
    expect = start  # the next byte wanted
    for key, run in _windows(exts):
        bad: list[str] = []

        def damaged(x: Extent, err: FormatError, bad: list[str] = bad) -> None:
            bad.append(str(err))

        got: dict[int, bytes] = {}
        try:
            for x, data in repo.read_extents(key, run, damaged):
                got[x.start] = data
        except (FormatError, StoreError) as e:  # the object itself (its header, a GET)
            bad.append(str(e))
        pieces = []
        for x in run:  # in file order (parts of frames need not be in object order)
            if x.start not in got:  # it did not read: the file is read up to it
                bad = bad or [f"{repo.where(key)}: extent at byte {x.start} did not read"]
                break
            pieces.append(got.pop(x.start)[expect - x.start:max(0, size - x.start)])
            expect = min(x.end, size)
        got.clear()
        yield Window(b"".join(pieces), expect, sum({x.off: x.clen for x in run}.values()),
                     bad[0] if bad else None)
        if bad:
            return


def _index_file(repo: Repository, machine: str, t: Todo, index: Index,
                r: RemoteIndexReport) -> None:
    """Feed ``t``'s bytes from ``t.start`` window by window; the first that does not
    read ends this file (what came before it stays indexed)."""
    name = t.path.decode(errors="replace")
    pos = t.start  # the index holds [0, pos)
    carry = b""  # bytes from pos on that end in no complete line yet
    for w in windows(repo, t.extents, t.start, t.size):
        r.fetched_bytes += w.fetched
        data = carry + w.data
        took = index.feed(machine, t.path, t.gen, pos, data) if data else 0
        r.indexed_bytes += took
        pos += took
        carry = data[took:]
        if w.bad:
            r.problems.append(f"{w.bad} ({name} of machine {machine!r} indexed up to "
                              f"byte {pos})")
            return
        if len(carry) > LINE_MAX:
            r.problems.append(f"{name} (machine {machine!r}): a line longer than "
                              f"{LINE_MAX} bytes at byte {pos}: indexed up to it")
            return
        if w.end >= t.size:
            return


def _sessions(sessions: dict[bytes, Session]) -> dict[str, Session]:
    """One catalog entry per session id: of several (moved between project folders),
    the one still there, changed last (as ``Backup.find_session`` chooses)."""
    out: dict[str, Session] = {}
    for s in sessions.values():
        o = out.get(s.session_id)
        if o is None or (s.deleted_at is None, s.last_seq, s.path) > \
                (o.deleted_at is None, o.last_seq, o.path):
            out[s.session_id] = s
    return out


def catalog_fields(s: Session) -> dict[str, str | float | None]:
    """What the search index keeps of a session's catalog entry: an imported session
    keeps the machine it came from, so a hit names that machine as the daemon's do."""
    came = parse_origin(s.fields.get("origin"))
    return {"title": s.title or None, "project": s.place,
            "origin": came.machine if came is not None else None,
            "last_activity": activity_time(s.fields.get("last_activity")),
            "git_branch": s.fields.get("git_branch"),
            "first_prompt": s.fields.get("first_prompt"),
            "last_prompt": s.fields.get("last_prompt")}


def activity_time(text: str | None) -> float | None:
    """A transcript's ISO timestamp as a time (None: none, or not one)."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None

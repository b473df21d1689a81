"""The rewrite of a staged file to this machine's paths (and a history filtered to the
sessions restored): in memory when small, a chunk of lines at a time when big, in worker
processes when a restore rewrites much (the remapper is Python: threads share one core).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import re
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from syncd.format.snapshot import Entry
from syncd.restore.mapping import _remapped
from syncd.restore.remap import Remapper, Rule, rewrite_lines

_HISTORY_SID = re.compile(rb'"sessionId"\s*:\s*"([^"]+)"')


def _filter_history(data: bytes, sids: set[str]) -> bytes:
    wanted = {s.encode() for s in sids}
    # A sparse history has holes (zero bytes) before the frames that were fetched.
    keep = [line.lstrip(b"\0") for line in data.split(b"\n")
            if (m := _HISTORY_SID.search(line)) and m.group(1) in wanted]
    return b"".join(line + b"\n" for line in keep)


def _rewrite(staged: Path, f: Entry, remap: Remapper,
             history_sids: set[str] | None) -> tuple[Path, int]:
    """``staged`` remapped (and a history filtered) into a new staged file; its size."""
    sids = history_sids if f.path == b"history.jsonl" else None
    return _rewrite_lines(staged, remap, sids, sids is not None and f.sparse)


# A restore that rewrites this much starts worker processes for it: the rewrite is Python
# (regex substitutions with a callback per path), which threads would run on one core.
POOL_MIN_BYTES = 32 << 20
REWRITERS_MAX = 4
# A worker process's remapper, made once when it starts.
_worker_remap: Remapper | None = None


def _rewriters(files: dict[bytes, Entry], remap: Remapper,
               history_sids: set[str] | None) -> ProcessPoolExecutor | None:
    """Worker processes for the rewrite, when it is big enough and there are cores to
    share it; started now, before this process has other threads (a fork copies only the
    thread that calls it)."""
    work = sum(f.size for p, f in files.items()
               if (_remapped(p) and not remap.identity) or
               (history_sids is not None and p == b"history.jsonl"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1
    if work < POOL_MIN_BYTES or cores < 2:
        return None
    method = "fork" if threading.active_count() == 1 and \
        "fork" in multiprocessing.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(min(cores, REWRITERS_MAX), multiprocessing.get_context(method),
                               initializer=_start_rewriter, initargs=(remap.rules, remap.folders))
    # A forked process's collector would walk (and so copy) every object it inherited.
    gc.freeze()
    try:
        pool.submit(int).result()  # forks them all now (their threads come later)
    finally:
        gc.unfreeze()
    return pool


def _start_rewriter(rules: list[Rule], folders: dict[str, str]) -> None:
    global _worker_remap
    _worker_remap = Remapper(rules, folders)


def _rewrite_job(staged: Path, sids: set[str] | None, holes: bool,
                 whole: bool) -> tuple[Path, int]:
    """In a worker process: ``staged`` rewritten as ``_place`` rewrites it (``whole``: at
    once, the small file's way), and the staged file that holds it now, and its size."""
    assert _worker_remap is not None
    # Not made durable here: the installer's threads fsync what they install (a file of a
    # merge is written anew), so this process goes on with the next file meanwhile
    # rather than wait for the disk.
    if not whole:
        return _rewrite_lines(staged, _worker_remap, sids, holes)
    # Written back into the staged file: a new file costs the filesystem an inode.
    with open(staged, "r+b") as fh:
        data = fh.read()
        out = _lines_out(data.replace(b"\0", b"") if holes else data, _worker_remap, sids)
        fh.seek(0)
        fh.write(out)
        fh.truncate()
    return staged, len(out)


def _rewrite_lines(staged: Path, remap: Remapper, sids: set[str] | None,
                   holes: bool) -> tuple[Path, int]:
    out_path = staged.with_name(staged.name + ".out")
    size = 0
    with open(staged, "rb") as src, open(out_path, "wb") as out:
        os.fchmod(out.fileno(), 0o600)

        def emit(text: bytes) -> None:
            nonlocal size
            out.write(text)
            size += len(text)

        # A filtered sparse history has zero bytes where other sessions' lines were.
        rewrite_lines(src, emit, lambda text: _lines_out(text, remap, sids), holes=holes)
    staged.unlink()
    return out_path, size


def _lines_out(text: bytes, remap: Remapper, sids: set[str] | None) -> bytes:
    return remap.lines(text if sids is None else _filter_history(text, sids))

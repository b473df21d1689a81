"""What this host's readers have seen of each machine in a store: the newest seq.

A store that loses its newest segments, or is rolled back to an older copy, looks to a
reader like a backup that simply stopped earlier; encryption cannot tell either (each
object authenticates on its own). A reader that remembers the newest seq it saw notices
when a store holds less than that, and says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from pathlib import Path

from syncd.private import private_dir, write_private
from syncd.store import layout

# Entries kept per file: a team bucket can hold many machines, the file stays small.
MAX_MACHINES = 4096


class Seen:
    """The newest seq per machine of one store, read from and saved to ``state_dir``."""

    def __init__(self, state_dir: Path, store_url: str) -> None:
        tag = hashlib.sha256(store_url.encode()).hexdigest()[:12]
        self.path = state_dir / f"seen@{tag}.json"
        self.url = store_url
        self._marks: dict[str, tuple[int, float]] = {}
        self._changed = False
        self._lock = threading.Lock()  # machines are read concurrently
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            raw = json.loads(self.path.read_bytes()[: 1 << 20])
            self._marks = {str(m): (int(v[0]), float(v[1])) for m, v in raw.items()}

    def check(self, machine: str, newest: int | None) -> str | None:
        """A problem when ``newest`` (the machine's newest seq the store lists now, None:
        nothing) is below the newest seen here before."""
        with self._lock:
            seen = self._marks.get(machine)
        now = -1 if newest is None else newest
        if seen is None or now >= seen[0]:
            return None
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(seen[1]))
        return (f"{self.url}{layout.machine_prefix(machine)}: the store's newest segment is "
                f"{'none' if newest is None else f'{newest:016x}'}, but {seen[0]:016x} "
                f"was seen here on {when}: segments were lost or the store was rolled "
                f"back (if it was reset on purpose, remove {self.path})")

    def saw(self, machine: str, seq: int) -> None:
        """Remember ``seq``, one whose object was read whole (a name alone, which anyone
        who can write the bucket can plant, never raises the mark)."""
        with self._lock:
            seen = self._marks.get(machine)
            if seen is None or seq > seen[0]:
                self._marks[machine] = (seq, time.time())
                self._changed = True

    def check_head(self, machine: str, seq: int) -> str | None:
        """A problem when ``machine``'s head covers an older flush (``seq``) than a head
        of it read here before, and else remember ``seq``. Heads have marks of their own:
        a head lags its machine's newest segment by up to ``head_interval``."""
        mark = f"{machine}/head"  # no machine id has a "/"
        with self._lock:
            seen = self._marks.get(mark)
        if seen is not None and seq < seen[0]:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(seen[1]))
            return (f"{self.url}{layout.head_key(machine)}: covers flush {seq}, but a head "
                    f"covering flush {seen[0]} was read here on {when}: the head or the "
                    f"store was rolled back (if it was reset on purpose, remove {self.path})")
        self.saw(mark, seq)
        return None

    def save(self) -> None:
        if not self._changed:
            return
        if len(self._marks) > MAX_MACHINES:  # keep the marks refreshed last
            newest = sorted(self._marks.items(), key=lambda kv: kv[1][1])[-MAX_MACHINES:]
            self._marks = dict(newest)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            private_dir(self.path.parent)
            write_private(os.fsencode(tmp), json.dumps(
                {m: list(v) for m, v in self._marks.items()}).encode())
            os.replace(tmp, self.path)
            self._changed = False
        except OSError:  # a full or read-only state dir: kept for the next save
            with contextlib.suppress(OSError):
                tmp.unlink()

"""A small error log in the state's meta table: the last error and the recent error times.

``syncd status`` and the metrics endpoint read it to say how many errors the last
hour saw; it is bounded (an hour's worth, at most ``KEEP`` entries).
"""

from __future__ import annotations

import json
import time

from syncd.backup.state import State
from syncd.redact import redact

WINDOW = 3600.0
KEEP = 1000


def _times(state: State) -> list[float]:
    raw = state.meta("error_times")
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except ValueError:
        return []
    return [float(t) for t in data if isinstance(t, int | float)]


def record_error(state: State, message: str, now: float | None = None) -> None:
    """Remember ``message`` as the last error and count it in the last hour's errors."""
    now = time.time() if now is None else now
    recent = [t for t in _times(state) if t > now - WINDOW][-(KEEP - 1):]
    recent.append(now)
    # Shown by `syncd status`: a secret that slipped into an error's text is masked here.
    state.set_meta(last_error=f"{now!r} {redact(message)}", error_times=json.dumps(recent))


def errors_since(state: State, since: float) -> int:
    return sum(1 for t in _times(state) if t > since)

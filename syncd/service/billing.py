"""What the store costs at S3 prices: the requests this machine's daemon made (counted by
the store wrapper, added to the state's meta every few minutes) and what the store holds.

The prices are S3 Standard's (us-east-1), as bench/cost.py has them.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from syncd.backup.state import State
from syncd.store.requests import KINDS, REQUESTS

# Dollars per 1,000 requests of a kind; per GB-month stored.
PRICE = {"PUT": 0.005, "LIST": 0.005, "GET": 0.0004, "HEAD": 0.0004, "DELETE": 0.0}
STORAGE = 0.023
META = "store_requests"
# How often the daemon adds its counts to the state.
RECORD_EVERY = 300.0
MONTH = 30 * 86400.0


def counted(state: State) -> dict[str, Any]:
    """The counts the state holds: ``since`` (when counting began) and one per kind."""
    doc: dict[str, Any] = {}
    with contextlib.suppress(ValueError, TypeError):
        raw = json.loads(state.meta(META) or "{}")
        if isinstance(raw, dict):
            doc = raw
    out: dict[str, Any] = {"since": None}
    since = doc.get("since")
    out["since"] = float(since) if isinstance(since, int | float) else None
    for k in KINDS:
        n = doc.get(k)
        out[k] = int(n) if isinstance(n, int) and n >= 0 else 0
    return out


def record(state: State, now: float | None = None) -> dict[str, Any]:
    """Add the requests made since the last call to the state's counts."""
    now = time.time() if now is None else now
    got = REQUESTS.take()
    doc = counted(state)
    if doc["since"] is None:
        doc["since"] = now
    for k in KINDS:
        doc[k] += got.get(k, 0)
    state.set_meta(**{META: json.dumps(doc)})
    return doc


def monthly(counts: dict[str, Any], stored_bytes: int, now: float | None = None
            ) -> dict[str, Any]:
    """Dollars a month at the rate the counts were made (since ``since``, at least an
    hour's worth), and for what is stored."""
    now = time.time() if now is None else now
    since = counts.get("since")
    span = max(3600.0, now - since) if since is not None else None
    per_month = {k: (counts.get(k, 0) * MONTH / span if span else 0.0) for k in KINDS}
    requests = sum(PRICE[k] * n / 1000 for k, n in per_month.items())
    storage = stored_bytes / 1e9 * STORAGE
    return {"since": since, "counts": {k: counts.get(k, 0) for k in KINDS},
            "per_month": per_month, "requests": requests, "storage": storage,
            "total": requests + storage, "stored_bytes": stored_bytes}

"""What every view of one running page shares: the settings, the guard, the repository,
and the caches the views keep (``site_of(request)``)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from syncd.config import Settings
from syncd.web.security import Guard

if TYPE_CHECKING:
    from syncd.repository import Repository


@dataclass
class Site:
    settings: Settings
    guard: Guard
    started: float = field(default_factory=time.time)
    # Opened on first use (a view that needs none never touches the store).
    _repo: Repository | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # Per-view caches, by name (each view module owns its entry).
    caches: dict[str, Any] = field(default_factory=dict)

    def repository(self, machine: str | None = None) -> Repository:
        """The store's repository for ``machine`` (default this one), unlocked without a
        prompt: the page runs where no terminal may be (the daemon)."""
        with self._lock:
            if self._repo is None:
                from syncd.backup.state import remembered_key
                from syncd.repository import Repository
                from syncd.security.keys import open_crypto
                from syncd.store import open_store

                s = self.settings
                store = open_store(s.store, endpoint_url=s.s3_endpoint_url,
                                   region=s.s3_region, retry_deadline=10.0, create=False)
                crypto = open_crypto(store, s.passphrase_file, prompt=False,
                                     hint=remembered_key(s.state_file))
                self._repo = Repository(store, s.machine_id, crypto)
            repo = self._repo
        return repo if machine is None else repo.for_machine(machine)

    def cache(self, name: str, make: Any) -> Any:
        """The cache ``name``, made by ``make()`` on first use."""
        with self._lock:
            if name not in self.caches:
                self.caches[name] = make()
            return self.caches[name]


def site_of(request: Request) -> Site:
    site: Site = request.app.state.site
    return site

"""Several Claude trees in one daemon (``sources``): a ``Daemon`` per tree, each in a
thread of its own with its own engine, lease, state, watcher, follower and archive jobs,
so that one tree's failure (its lease taken over, its root unusable) never stops another.
systemd hears of one service: READY once every tree is up (or has stopped), one STATUS
line for all of them."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

from syncd.config import DEFAULT_SOURCE, Settings
from syncd.errors import SyncdError, UsageError
from syncd.service.daemon import Daemon
from syncd.service.log import TREE
from syncd.service.notify import Notifier

log = logging.getLogger("syncd.daemon")

# How often the main thread wakes from joining the trees (signals are handled between).
_JOIN_POLL = 1.0


class _Hub:
    """The one notifier systemd talks to, and what each tree told it."""

    def __init__(self, names: list[str], notifier: Notifier | None = None) -> None:
        self.real = Notifier() if notifier is None else notifier
        self.names = names
        self._lock = threading.Lock()
        self._ready: set[str] = set()
        self._gone: set[str] = set()  # ended: up for good (a reload waits for the others)
        self._status: dict[str, str] = {}
        self._up = False  # READY=1 sent (and not withdrawn by a reload)

    def part(self, name: str) -> _Part:
        return _Part(self, name)

    def _text(self) -> str:
        return "; ".join(f"{n}: {self._status[n]}" for n in self.names if n in self._status)

    def ready(self, name: str, status: str | None) -> None:
        with self._lock:
            self._ready.add(name)
            if status:
                self._status[name] = status
            if not self._up and self._ready >= set(self.names):
                self._up = True
                self.real.ready(self._text())

    def status(self, name: str, text: str) -> None:
        with self._lock:
            self._status[name] = text
            if self._up:
                self.real.status(self._text())

    def gone(self, name: str, why: str) -> None:
        """A tree's daemon ended: it counts as up (the others are not held back)."""
        with self._lock:
            self._gone.add(name)
        self.status(name, f"stopped: {why}"[:200])
        self.ready(name, None)

    def reloading(self) -> None:
        """SIGHUP: READY=1 again once every tree applied it."""
        with self._lock:
            self._up = False
            self._ready = set(self._gone)
            self.real.reloading()


class _Part(Notifier):
    """What one tree's daemon takes for its notifier: its calls go to the hub."""

    def __init__(self, hub: _Hub, name: str) -> None:
        super().__init__(env={})
        self.hub, self.name = hub, name
        self.watchdog_interval = hub.real.watchdog_interval

    @property
    def enabled(self) -> bool:
        return self.hub.real.enabled

    def ready(self, status: str | None = None) -> None:
        self.hub.ready(self.name, status)

    def status(self, text: str) -> None:
        self.hub.status(self.name, text)

    def watchdog(self) -> None:
        self.hub.real.watchdog()

    def extend_timeout(self, seconds: float) -> None:
        self.hub.real.extend_timeout(seconds)

    # The service stops and reloads as a whole: the main thread says so, once.
    def stopping(self) -> None:
        pass

    def reloading(self) -> None:
        pass

    def close(self) -> None:
        pass


class Trees:
    """The daemons of every tree of ``settings`` (``settings.trees()``). ``reload`` re-reads
    the whole configuration; each tree takes its own part of it."""

    def __init__(self, settings: Settings, reload: Callable[[], Settings] | None = None, *,
                 takeover: bool = False, prompt: bool = False,
                 notifier: Notifier | None = None) -> None:
        trees = settings.trees()
        names = [t.name for t in trees]
        self.hub = _Hub(names, notifier)
        self.daemons: dict[str, Daemon] = {}
        for t in trees:
            again = None if reload is None else _reload_of(reload, t.name, names)
            self.daemons[t.name] = Daemon(
                settings.for_source(t.name), again, takeover=takeover,
                # One passphrase prompt on the terminal (the others read the file or
                # $SYNCD_PASSPHRASE), one metrics port.
                prompt=prompt and t.name == DEFAULT_SOURCE, notify=self.hub.part(t.name),
                metrics=t.name == DEFAULT_SOURCE)
        self.failed: dict[str, BaseException] = {}
        self._threads: list[threading.Thread] = []

    def request_stop(self, signum: int = 0, frame: FrameType | None = None) -> None:
        self.hub.real.stopping()
        for d in self.daemons.values():
            d.request_stop(signum)

    def request_reload(self, signum: int = 0, frame: FrameType | None = None) -> None:
        self.hub.reloading()
        for d in self.daemons.values():
            d.request_reload(signum)

    def _run(self, name: str, daemon: Daemon) -> None:
        TREE.set(name)
        try:
            daemon.run()
        except BaseException as e:  # a tree's end, whatever it is, is its own
            self.failed[name] = e
            log.error("tree %s (%s) stopped: %s; the other trees go on", name,
                      daemon.settings.source, str(e).replace("\n", " "))
            self.hub.gone(name, str(e))

    def start(self) -> None:
        for name, daemon in self.daemons.items():
            t = threading.Thread(target=self._run, args=(name, daemon),
                                 name=f"syncd-tree-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def wait(self, timeout: float | None = None) -> bool:
        """Join the trees' threads; True when all have ended."""
        for t in self._threads:
            t.join(timeout)
        return not any(t.is_alive() for t in self._threads)

    def run(self) -> None:
        """Run every tree until a signal stops them; raise when a tree failed."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self.request_stop)
            signal.signal(signal.SIGHUP, self.request_reload)
        log.info("syncd running %d trees: %s", len(self.daemons), ", ".join(
            f"{n} ({d.settings.source}, machine {d.settings.machine_id})"
            for n, d in self.daemons.items()))
        self.start()
        try:
            while not self.wait(_JOIN_POLL):
                pass
        finally:
            self.hub.real.close()
        if self.failed:
            name, first = next(iter(self.failed.items()))
            more = f" (and {len(self.failed) - 1} more)" if len(self.failed) > 1 else ""
            # Bad configuration of a tree stays exit 2; anything else is 1.
            kind = UsageError if isinstance(first, UsageError) else SyncdError
            raise kind(f"tree {name}: {first}{more}") from first


def _reload_of(reload: Callable[[], Settings], name: str,
               names: list[str]) -> Callable[[], Settings]:
    """What tree ``name`` re-reads on SIGHUP: its part of the configuration (a tree no
    longer there fails its reload: it keeps running as it was)."""
    def again() -> Settings:
        new = reload()
        now = [t.name for t in new.trees()]
        if name == DEFAULT_SOURCE and now != names:  # said once, by one tree
            log.warning("reload: the trees are now %s (were %s): a restart applies that",
                        ", ".join(now), ", ".join(names))
        return new.for_source(name)
    return again

"""The engine: everything one flush needs (store, state, key, lease, shipper), shared by
the daemon's loop and ``syncd sync``; and ``sync_once``, one pass that ships everything
pending."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

from syncd.backup.errorlog import record_error
from syncd.backup.headwriter import HeadWriter
from syncd.backup.scan import scan
from syncd.backup.ship import FlushResult, Shipper, ship_with_restart
from syncd.backup.state import State, key_hint
from syncd.claude import Selection
from syncd.config import Settings
from syncd.duration import parse_duration
from syncd.errors import CryptoError, SyncdError, SyncError, SyncStopped
from syncd.progress import Meter
from syncd.repository import Repository
from syncd.security.crypto import Crypto
from syncd.security.keys import open_crypto, passphrase_configured
from syncd.security.lease import LOOK_EVERY, Lease
from syncd.security.lock import ProcessLock
from syncd.store import RetryStore, open_store


class Engine:
    """Everything one flush needs: store, state, key, lease, shipper. Shared by ``run``
    and ``sync``.

    Start-up, in order: the state's process lock; then ``connect``: one LIST of
    ``keys/`` (an encrypted store is unlocked, or refused without a working passphrase)
    and the machine's lease (refused when another writer holds it). Nothing is written
    before ``connect`` succeeded; a flush connects before its first upload if needed, so
    a daemon whose store is down at boot starts anyway and connects when the store is
    back, and ``sync`` reads and compresses while the S3 client is being built.
    """

    def __init__(self, settings: Settings, stop: threading.Event | None = None,
                 progress: Callable[[int], None] | None = None, *, takeover: bool = False,
                 on_lease_lost: Callable[[str], None] | None = None,
                 prompt: bool = False, connect: bool = True) -> None:
        self.settings = settings
        self.stop = stop or threading.Event()
        self.takeover = takeover
        self.prompt = prompt
        self.on_lease_lost = on_lease_lost or (lambda msg: None)
        if not settings.source.is_dir():
            raise SyncError(f"source {settings.source} is not a directory")
        self.lock = ProcessLock(settings.state_file.with_suffix(".lock"))
        self.lock.acquire()
        self.lease: Lease | None = None
        self.connected = False
        try:
            # One connection attempt takes at most half the retry budget (sync's is short).
            self.store: RetryStore = open_store(
                settings.store, endpoint_url=settings.s3_endpoint_url, region=settings.s3_region,
                retry_deadline=settings.store_retry_deadline, stop=self.stop,
                connect_timeout=min(10.0, settings.store_retry_deadline / 2))
            self.state = State(settings.state_file)
        except Exception:
            self.lock.release()
            raise
        # Its cipher is set by ``connect`` once the store is unlocked.
        self.repo = Repository(self.store, settings.machine_id)
        self.selection = Selection(settings.include, settings.exclude)
        self.root = os.fsencode(settings.source)
        self.shipper = Shipper(root=settings.source, repo=self.repo, state=self.state,
                               selection=self.selection, level=settings.zstd_level,
                               segment_max=settings.segment_max_bytes,
                               should_stop=self.stop.is_set, prepare=self.connect,
                               revive_within=_revive_within(settings))
        if progress is not None:
            self.shipper.progress = progress
        self.head = HeadWriter(self.repo, self.state, self.root,
                               interval=settings.head_interval,
                               tombstone_keep=_tombstone_keep(settings))
        if connect:
            try:
                self.connect()
            except Exception:
                self.close()
                raise

    def connect(self) -> None:
        """Unlock the store (if encrypted) and take the lease; a no-op once done.

        ``StoreError``: the store is unreachable, try again later. ``CryptoError`` and
        ``LeaseHeld``: this process must not write to this store; do not retry.
        """
        if self.connected:
            return
        crypto = self._unlock(self.state, self.prompt)
        lease = self._take_lease(self.state, self.takeover)
        lease.start(self.on_lease_lost)
        self.repo.crypto, self.lease = crypto, lease
        self.shipper.lease = self.head.lease = lease
        # Every write of this process through its store (segments, head, machine.json,
        # the archive jobs'), each retry too, first makes sure the lease is still ours.
        self.store.fence = lease.ensure
        self.connected = True

    @property
    def crypto(self) -> Crypto | None:
        return self.repo.crypto

    def _unlock(self, state: State, prompt: bool) -> Crypto | None:
        """The store's key (None: plain), checked against what this state wrote before.

        The key file that opened it last is tried first, then those naming the master key
        remembered: planted key files cost nothing then, and whatever opens, a master key
        other than the remembered one is refused.
        """
        hint = key_hint(state)
        crypto = open_crypto(self.store, self.settings.passphrase_file, prompt=prompt,
                             hint=hint)
        known = hint.master
        found = None if crypto is None else crypto.fingerprint
        if known and found != known:
            raise CryptoError(
                f"{self.store.url}: this machine's backup there is encrypted with key "
                f"{known}, but the store now " + ("has no keys/ (removed?)" if found is None
                                                  else f"holds key {found}")
                + ": refusing to write")
        if found and not known:
            if state.next_seq:
                raise CryptoError(f"{self.store.url}: encrypted, but this machine already "
                                  "wrote unencrypted segments there: refusing to mix them "
                                  f"(remove {state.path} to start an encrypted backup)")
            state.set_meta(key_fingerprint=found)
        if crypto is not None and crypto.key_id != hint.key_id:
            state.set_meta(key_id=crypto.key_id)
        return crypto

    def _take_lease(self, state: State, takeover: bool) -> Lease:
        owner = state.meta("lease_owner")
        if not owner:
            owner = os.urandom(16).hex()
            state.set_meta(lease_owner=owner)
        ttl = self.settings.lease_ttl
        # Its own retries, unfenced: a renewal gives up before the renewal thread's next
        # look (which tries again).
        store = RetryStore(self.store.inner, deadline=min(ttl / 3, LOOK_EVERY), stop=self.stop)
        lease = Lease(store, self.settings.machine_id, owner=owner, ttl=ttl, takeover=takeover,
                      probe=self.store.inner)
        lease.acquire()
        return lease

    def close(self) -> None:
        if self.lease is not None:
            self.lease.release()
        self.state.close()
        self.lock.release()

    def flush(self, paths: set[bytes]) -> FlushResult:
        try:
            result = ship_with_restart(self.shipper, paths)  # connects before its first PUT
        except InterruptedError:
            raise  # a stop (an OSError too), not an error
        except (SyncdError, OSError) as e:
            record_error(self.state, str(e))
            raise
        if result.problems:
            first = next(iter(result.problems.values()))
            record_error(self.state, first)
        self.head.shipped(result)
        return result


def sync_once(settings: Settings, progress: Meter | None = None, *, takeover: bool = False,
              prompt: bool = False, stop: threading.Event | None = None,
              before: Callable[[Engine], None] | None = None) -> FlushResult:
    """Scan, ship everything pending, return when it is durable; raise SyncError otherwise.

    ``progress`` is told the bytes to read, then every frame read (a first seed's bar).
    The machine's lease is held for the duration (``takeover``: from a dead holder).
    ``stop``, once set, ends the pass at the next segment boundary (the segment in flight
    is committed) with ``SyncStopped``. ``before`` is called with the connected engine
    before the scan (what it writes in the tree is shipped by this pass).
    """
    # The store is connected to before the first upload, so the seed reads and compresses
    # while the S3 client is built; but a passphrase prompt comes first, not mid-progress.
    may_prompt = prompt and sys.stdin.isatty() and not passphrase_configured(
        settings.passphrase_file)
    engine = Engine(settings, stop, progress=progress.advance if progress is not None else None,
                    takeover=takeover, prompt=prompt, connect=may_prompt)
    try:
        if before is not None:
            engine.connect()
            before(engine)
        found = scan(engine.root, engine.selection, engine.state)
        if progress is not None:
            progress.start(found.pending_bytes)
        total = FlushResult()
        pending = found.dirty
        for _ in range(5):
            try:
                result = engine.flush(pending)
            except InterruptedError:
                if not engine.stop.is_set():
                    raise
                raise SyncStopped("stopped: what was not shipped waits for the next run") \
                    from None
            total.segments += result.segments
            total.raw_bytes += result.raw_bytes
            total.stored_bytes += result.stored_bytes
            total.files += result.files
            total.tombstones += result.tombstones
            total.problems.update(result.problems)
            # Files that changed while being read get another pass.
            pending = result.requeue
            if not pending:
                break
        # The head when it is due (a session came or went, or head_interval passed): a
        # pass that only appended is one PUT, as a flush is.
        engine.head.write_if_due()
        problems = {**found.problems, **total.problems}
        if problems:
            first = next(iter(problems.values()))
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise SyncError(f"not backed up: {first}{more}")
        return total
    finally:
        engine.close()


def _tombstone_keep(settings: Settings) -> float:
    return parse_duration(settings.tombstone_keep) if settings.tombstone_keep.strip() else 0.0


def _revive_within(settings: Settings) -> float:
    """How long after a deletion a restored generation may be revived: a day less than
    compaction keeps its tombstone (none when it keeps none)."""
    return max(0.0, _tombstone_keep(settings) - 86400.0)

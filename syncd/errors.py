"""Every error syncd raises on purpose, under one root.

Messages are one line that names the object (a store URL and key, a path, a setting)
and says why. The command line maps them to exit codes in one place
(``syncd.cli.main``): a ``UsageError`` is bad usage or configuration (2), any other
``SyncdError`` is work that could not be completed (1).
"""

from __future__ import annotations

import errno
import os


class SyncdError(Exception):
    """The root: something syncd could not do, said in one line."""


class UsageError(SyncdError):
    """Bad usage or configuration: what the user typed or wrote cannot be used."""


class ConfigError(UsageError, ValueError):
    """A setting, a config file or a duration that cannot be used (a ValueError too, so
    that settings validation reports it)."""


# -- the store ----------------------------------------------------------------------------

class StoreError(SyncdError):
    """A store operation failed; the message names the store and the key."""


class NotFound(StoreError):
    """The object does not exist."""


class PreconditionFailed(StoreError):
    """A conditional write found the object not as required (HTTP 412); nothing was written.

    Raised as is by ``put(..., if_match=etag)`` when the object has another etag or is
    missing.
    """


class AlreadyExists(PreconditionFailed):
    """A conditional create found the key taken (HTTP 412); nothing was written."""


class TransientError(StoreError):
    """A failure that may pass: 5xx, throttling, timeouts, refused connections."""


class InvalidKey(StoreError):
    """A key that could escape the store's namespace (``..``, absolute, empty parts)."""


class NoSuchStore(StoreError, UsageError):
    """The store's directory is missing and was not to be created (a command that only
    reads it: a typo in the URL must not leave an empty store behind)."""


# -- what the store holds -----------------------------------------------------------------

class FormatError(SyncdError):
    """An object is not what syncd writes (or its bytes fail their checksum)."""


class CryptoError(SyncdError):
    """A key or a sealed object that cannot be opened; the message names the object."""


class BadPassphrase(CryptoError):
    """The passphrase opens none of the store's key files."""


class BackupError(SyncdError):
    """The backup asked for cannot be read: it does not exist, or is damaged."""


class NoBackup(BackupError):
    """The machine has no backup (or none at that time): nothing damaged."""


# -- this machine -------------------------------------------------------------------------

class StateError(SyncdError):
    """The state database cannot be opened or written."""

    @classmethod
    def of(cls, what: str, path: str | bytes | os.PathLike[str], e: Exception) -> StateError:
        """``what`` at ``path`` (the state database, the lock) could not be opened or
        written: which, why, and what to do when the disk is full or the dir read-only."""
        code = getattr(e, "errno", None)
        sqlite = getattr(e, "sqlite_errorcode", -1) & 0xFF  # SQLITE_FULL 13, READONLY 8
        where = os.path.dirname(os.fsdecode(path))
        try:  # SQLite says "disk I/O error" when it cannot grow its shared memory file
            full = os.statvfs(where).f_bavail == 0
        except OSError:
            full = False
        if code in (errno.ENOSPC, errno.EDQUOT) or sqlite == 13 or full:
            hint = " (the disk is full: free space there, or set state_dir elsewhere)"
        elif code in (errno.EACCES, errno.EPERM, errno.EROFS) or sqlite == 8 or \
                (os.path.isdir(where) and not os.access(where, os.W_OK)):
            hint = " (fix the permissions of it and its dir, or set state_dir elsewhere)"
        else:
            hint = ""
        why = getattr(e, "strerror", None) or str(e)
        return cls(f"{what} {os.fsdecode(path)}: {why}{hint}")


class Locked(SyncdError):
    """Another process holds the lock; the message names its pid."""


class LeaseError(SyncdError):
    """The machine's lease is not ours (the message names the holder)."""


class LeaseHeld(LeaseError):
    """Another live writer holds the lease."""


class LeaseLost(LeaseError):
    """We held the lease and someone took it over: stop writing."""


class LeaseStale(LeaseError):
    """Our lease could not be renewed lately (store unreachable): no writes until it is."""


# -- the work -----------------------------------------------------------------------------

class SyncError(SyncdError):
    """Not everything could be made durable; the message says what and why."""


class SyncStopped(SyncError):
    """``sync_once`` was stopped (its ``stop`` was set) at a segment boundary: what was
    committed stays, the rest waits for the next run."""


class RestoreError(SyncdError):
    """The restore could not be done; the message says which object or path and why."""


class RestoreBusy(RestoreError):
    """Another restore of the web page is running: one at a time."""


class BadQuery(UsageError):
    """A search query SQLite FTS5 cannot parse (exit 2); the message names it."""


class LookupFailed(SyncdError):
    """A lookup that cannot be answered as asked (an unknown or ambiguous session)."""


class OnSeveralMachines(LookupFailed):
    """One session in several machines' backups and no machine named; ``machines``
    names them (a command may know which is meant: the one follow imported it from)."""

    def __init__(self, message: str, machines: list[str]) -> None:
        super().__init__(message)
        self.machines = machines


class AmbiguousSession(LookupFailed, UsageError):
    """A session named by a prefix several sessions share: the user must say more of
    its id (exit 2)."""


class CompactError(SyncdError):
    """Compaction could not run; the message names the object or the reason."""


class RewriteRefused(SyncdError):
    """``forget``/``redact`` will not run now (a file being written, a signed block)."""


class PolicyError(SyncdError):
    """A retention policy that would forget all but the newest snapshot, or a bad one."""


class ScheduleError(ConfigError):
    """A schedule setting that is neither an interval, a cron line nor "off"."""


def exit_code(e: SyncdError) -> int:
    """What the command line exits with: 2 for bad usage or configuration, else 1."""
    return 2 if isinstance(e, UsageError) else 1


__all__ = [
    "AlreadyExists", "AmbiguousSession", "BackupError", "BadPassphrase", "BadQuery", "CompactError",
    "ConfigError", "CryptoError", "FormatError", "InvalidKey", "LeaseError", "LeaseHeld",
    "LeaseLost", "LeaseStale", "Locked", "LookupFailed", "NoBackup", "NoSuchStore", "NotFound",
    "OnSeveralMachines", "PolicyError", "PreconditionFailed", "RestoreError", "RewriteRefused",
    "ScheduleError", "StateError",
    "StoreError", "SyncError", "SyncStopped", "SyncdError", "TransientError", "UsageError",
    "exit_code",
]

"""syncd: continuous append-only backup of Claude Code's session store.

The public face: what a program embedding syncd uses. Names are imported when first
used, so ``import syncd.store`` does not load the daemon (nor the S3 client).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from syncd.errors import (
    BackupError,
    ConfigError,
    CryptoError,
    FormatError,
    RestoreError,
    StoreError,
    SyncdError,
    SyncError,
    UsageError,
)
from syncd.version import __version__

if TYPE_CHECKING:
    from syncd.backup.engine import Engine, sync_once
    from syncd.backup.ship import FlushResult
    from syncd.claude import Selection, default_root
    from syncd.config import Settings, load_settings
    from syncd.repository import Repository
    from syncd.restore.restorer import RestoreOptions, RestoreReport, restore, restore_tree
    from syncd.service.daemon import Daemon
    from syncd.store import Store, open_store

_WHERE = {
    "Daemon": "syncd.service.daemon",
    "Engine": "syncd.backup.engine",
    "FlushResult": "syncd.backup.ship",
    "Repository": "syncd.repository",
    "RestoreOptions": "syncd.restore.restorer",
    "RestoreReport": "syncd.restore.restorer",
    "Selection": "syncd.claude",
    "Settings": "syncd.config",
    "Store": "syncd.store",
    "default_root": "syncd.claude",
    "load_settings": "syncd.config",
    "open_store": "syncd.store",
    "restore": "syncd.restore.restorer",
    "restore_tree": "syncd.restore.restorer",
    "sync_once": "syncd.backup.engine",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'syncd' has no attribute {name!r}")
    return getattr(importlib.import_module(where), name)


__all__ = [
    "BackupError", "ConfigError", "CryptoError", "Daemon", "Engine", "FlushResult",
    "FormatError", "Repository", "RestoreError", "RestoreOptions", "RestoreReport",
    "Selection", "Settings", "Store", "StoreError", "SyncError", "SyncdError", "UsageError",
    "__version__", "default_root", "load_settings", "open_store", "restore", "restore_tree",
    "sync_once",
]

"""syncd: continuous append-only backup of Claude Code's session store."""

from __future__ import annotations

__version__ = "0.1.0"

from syncd.backup.ship import FlushResult, Shipper
from syncd.backup.state import FileState, State
from syncd.claude import Selection, default_root
from syncd.config import Settings, load_settings
from syncd.errors import FormatError, RestoreError, SyncError
from syncd.restore.restorer import RestoreReport, restore_tree
from syncd.service.daemon import Daemon, Engine, sync_once

__all__ = [
    "Daemon",
    "Engine",
    "FileState",
    "FlushResult",
    "FormatError",
    "RestoreError",
    "RestoreReport",
    "Selection",
    "Settings",
    "Shipper",
    "State",
    "SyncError",
    "__version__",
    "default_root",
    "load_settings",
    "restore_tree",
    "sync_once",
]

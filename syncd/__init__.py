"""syncd: continuous append-only backup of Claude Code's session store."""

from __future__ import annotations

__version__ = "0.1.0"

from ._claude import Selection, default_root
from ._config import Settings, load_settings
from ._daemon import Daemon, Engine, SyncError, sync_once
from ._restore import RestoreError, RestoreReport, restore_tree
from ._segment import FormatError
from ._ship import FlushResult, Shipper
from ._state import FileState, State

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

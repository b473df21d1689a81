"""Logging: one event per line, with a level.

Under systemd (stderr is the journal stream named by ``$JOURNAL_STREAM``) each line
starts with its syslog priority ``<N>`` (journald's SyslogLevelPrefix) and carries no
timestamp: the journal adds its own. Elsewhere lines are plain text with a timestamp.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TextIO

from syncd.redact import add_env_secrets, redact

# logging level → syslog priority
PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
            logging.CRITICAL: 2}
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s%(tree)s: %(message)s"
# Libraries that log routine chatter at INFO ("Found credentials in environment variables").
_CHATTY = ("botocore", "boto3", "urllib3")


def to_journal(stream: TextIO, env: Mapping[str, str] | None = None) -> bool:
    """True when ``stream`` is the journal stream systemd connected (``$JOURNAL_STREAM``).

    systemd sets ``JOURNAL_STREAM=<dev>:<inode>`` of the stream it gave the service; a
    child whose stderr was redirected elsewhere inherits the variable but not the stream.
    """
    value = (os.environ if env is None else env).get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


# The tree a thread works for when one daemon backs up several (service/trees.py): its
# lines say "syncd.daemon[work]: ...". A thread sets it for itself (contexts are per thread).
TREE: ContextVar[str] = ContextVar("syncd_tree", default="")


class OneLine(logging.Formatter):
    """Every record on exactly one line: newlines in messages and tracebacks are escaped."""

    def __init__(self, fmt: str, journal: bool) -> None:
        super().__init__(fmt)
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        # Formatted in the thread that logs: its tree, if any, is the one that spoke.
        tree = TREE.get()
        record.tree = f"[{tree}]" if tree else ""
        # Secrets are masked whatever put them in the message (an exception's text).
        text = redact(super().format(record)).replace("\r", "\\r").replace("\n", "\\n")
        if self.journal:
            prio = PRIORITY.get(record.levelno)
            if prio is None:  # custom levels: the nearest standard one below
                prio = PRIORITY[max(lvl for lvl in PRIORITY if lvl <= max(record.levelno, 10))]
            return f"<{prio}>{text}"
        return text


def setup(level: int | str = logging.WARNING, stream: TextIO | None = None,
          env: Mapping[str, str] | None = None) -> bool:
    """Send the root logger's records to ``stream`` (stderr); returns True for journal mode."""
    stream = stream or sys.stderr
    add_env_secrets()
    journal = to_journal(stream, env)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(OneLine("%(name)s%(tree)s: %(message)s" if journal else PLAIN_FORMAT,
                                 journal))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    set_level(level)
    return journal


def set_level(level: int | str) -> None:
    """Set the root level; noisy libraries stay at WARNING unless we are debugging."""
    if isinstance(level, str):
        level = logging.getLevelName(level.upper())
        if not isinstance(level, int):
            raise ValueError(f"unknown log level {level!r}")
    logging.getLogger().setLevel(level)
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.NOTSET if level <= logging.DEBUG
                                         else max(level, logging.WARNING))
    # The watcher learns of inotify overflows from watchdog's WARNING records: keep them.
    logging.getLogger("watchdog.observers").setLevel(min(level, logging.WARNING))

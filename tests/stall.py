"""``syncd ARGS…`` that stops for good right before it renames its first temp file into
place (a ``.syncd-*.tmp`` beside its destination, written and fsynced), so that a test can
SIGKILL it there: what a crash in the middle of a restore or an import leaves.

    python -m tests.stall ARGS…
"""

from __future__ import annotations

import os
import re
import sys
import threading
from typing import Any

from syncd.cli.main import main

# Any version's temp names (``syncd.claude.temp_name``; before it, no pid).
TEMP = re.compile(r"\.syncd-.*\.tmp")

_replace = os.replace


def _stalling(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
    if TEMP.fullmatch(os.path.basename(os.fsdecode(src))):
        threading.Event().wait()  # until killed
    _replace(src, dst, *args, **kwargs)


if __name__ == "__main__":
    os.replace = _stalling
    sys.argv = ["syncd", *sys.argv[1:]]
    main()

"""Secrets never reach a log line, ``status`` or an error message.

The values that matter (the passphrase, S3 secret keys and session tokens) are
registered here when they are read; ``redact`` replaces each with ``***``, and URLs
lose any ``user:password@``. The log formatter, ``syncd status`` and every one-line
error go through it: a secret that slips into an exception message is still masked.

Only secrets of ``MIN_LENGTH`` characters or more are masked. A shorter one (a passphrase
like "wrong") matches words of syncd's own messages: masking those garbles them and, in
a known sentence, shows the secret to whoever reads the line. S3 secret keys (40
characters) and session tokens are far longer.

Control characters go too (but newlines and tabs): a store's strings reach these lines,
and an escape sequence in a file name must not drive the reader's terminal.
"""

from __future__ import annotations

import os
import re
import threading

_ENV_SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                "SYNCD_PASSPHRASE", "SYNCD_NEW_PASSPHRASE")
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")
MIN_LENGTH = 8
# C0 and C1 controls but \t and \n, and the bidirectional overrides (text shown reversed).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")

_lock = threading.Lock()
_secrets: set[str] = set()


def add_secret(value: str | None) -> None:
    """Mask ``value`` (and its surrounding whitespace-free form) from now on."""
    if value and len(value.strip()) >= MIN_LENGTH:
        with _lock:
            _secrets.add(value)
            _secrets.add(value.strip())


def add_env_secrets() -> None:
    for name in _ENV_SECRETS:
        add_secret(os.environ.get(name))


def redact(text: str) -> str:
    with _lock:
        values = sorted(_secrets, key=len, reverse=True)
    for v in values:
        if v in text:
            text = text.replace(v, "***")
    return _CONTROL.sub("?", _USERINFO.sub(r"\g<scheme>***@", text))


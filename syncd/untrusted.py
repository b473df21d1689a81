"""Text from outside: JSON (a store's index or group, machine.json, a lease, a key file),
parsed within bounds, and strings made printable before they reach a terminal.

``json.loads`` builds whatever the text describes: a few MiB of ``[{},{},…]`` become
millions of objects (64 bytes and more each), ``[[[…`` exhausts the stack, a number
with hundreds of digits or ``Infinity`` later overflows a conversion. Text from outside
is held to what a writer of syncd makes: at most one container per 16 bytes (a real
index or group has one per 50 to 300), no NaN or infinity, no integer a float cannot
hold (an absurd value in one entry, say an mtime of 10**30, is that entry's problem,
not the object's). Anything else is a ``ValueError``, which every caller already
reports as an unreadable object, naming it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

# Containers allowed per byte of text, with some slack for tiny objects.
_BYTES_PER_CONTAINER = 16
_SLACK = 64
# A JSON string (brackets inside one, say in a session's summary, are not containers).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number syncd writes")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 300:  # float(int) overflows beyond ~1.8e308
        raise ValueError(f"number {text[:20]}… is out of range")
    return int(text)


def loads(data: bytes | str,
          object_hook: Callable[[dict[str, Any]], Any] | None = None) -> Any:
    """The JSON value of ``data``, or ``ValueError`` if it is not one a writer of syncd
    makes (see the module's docstring). ``object_hook``: as ``json.loads``'s, told of each
    object as it is parsed (a caller counting them can stop the parse there)."""
    raw = data.encode() if isinstance(data, str) else data
    limit = len(raw) // _BYTES_PER_CONTAINER + _SLACK
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > limit:  # an upper bound: take away the strings' brackets (no copy)
        for m in _STRING.finditer(raw):
            start, end = m.span()
            containers -= raw.count(b"{", start, end) + raw.count(b"[", start, end)
    if containers > limit:
        raise ValueError(f"{containers} objects and arrays in {len(raw)} bytes: more than "
                         "any writer makes (refusing to build them)")
    try:
        return json.loads(raw, parse_constant=_constant, parse_float=_float, parse_int=_int,
                          object_hook=object_hook)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def printable(text: str) -> str:
    """``text`` with each character that is not printable (a control character, an escape,
    a bidirectional override) replaced by ``?``."""
    if text.isprintable():  # most are: one pass in C, not one call per character
        return text
    return "".join(c if c.isprintable() else "?" for c in text)

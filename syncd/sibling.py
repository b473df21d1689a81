"""A session's siblings: the files Claude Code keeps beside its transcript in the project
folder, named after the session, that go with it wherever it is restored or followed.

Claude Code 2.1.332 writes ``<sid>.ccr-tip.json`` and ``<sid>.precompact.json`` (or
``ccr-tip.json`` and ``precompact.json`` inside ``<sid>/``), ``<sid>.desktop-released.json``,
``<sid>/custom-title.json`` and ``<sid>/<stamp>.cast`` (terminal recordings), and its cleanup
deletes them with the transcript. Those inside ``<sid>/`` already belong to the session
(``format.catalog.session_of_any``); the ones named here are the project-level ones.
Their in-flight temp files (``….json.tmp.<hex>``) are not siblings.
"""

from __future__ import annotations

from syncd.format.catalog import is_session_id, session_of_any

# ``projects/<folder>/<sid><suffix>``.
SUFFIXES = (b".ccr-tip.json", b".precompact.json", b".desktop-released.json")
# ``projects/<folder>/<sid>/<name>``, rewritten whole like those (recordings are appended).
_INSIDE = frozenset({b"ccr-tip.json", b"precompact.json", b"custom-title.json"})


def siblings(transcript: bytes) -> tuple[bytes, ...]:
    """The project-level sibling paths of transcript ``projects/<folder>/<sid>.jsonl``
    (none for any other path)."""
    if not transcript.endswith(b".jsonl") or transcript.count(b"/") != 2:
        return ()
    stem = transcript[: -len(b".jsonl")]
    return tuple(stem + s for s in SUFFIXES)


def sibling_of(path: bytes) -> str | None:
    """The session whose project-level sibling ``path`` is, else None."""
    parts = path.split(b"/")
    if len(parts) != 3 or parts[0] != b"projects":
        return None
    for suffix in SUFFIXES:
        if parts[2].endswith(suffix):
            sid = parts[2][: -len(suffix)].decode("ascii", errors="replace")
            return sid if is_session_id(sid) else None
    return None


def is_sibling(path: bytes) -> bool:
    """Whether ``path`` is a sibling Claude rewrites whole (a project-level one, or
    ``ccr-tip.json``, ``precompact.json`` or ``custom-title.json`` in ``<sid>/``): a newer
    copy of it supersedes an older one rather than diverging from it."""
    parts = path.split(b"/")
    if len(parts) == 4 and parts[3] in _INSIDE:
        return parts[0] == b"projects" and is_session_id(parts[2].decode("ascii", "replace"))
    return sibling_of(path) is not None


def owner_of(path: bytes) -> str | None:
    """The session a path under projects/ belongs to: its transcript, anything under
    ``<sid>/`` beside it (subagents, tool results, recordings), or a sibling."""
    return session_of_any(path) or sibling_of(path)


__all__ = ["SUFFIXES", "is_sibling", "owner_of", "sibling_of", "siblings"]

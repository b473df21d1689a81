from __future__ import annotations

from syncd.restore.merge import decide


def _t(uuid: str, ts: str, parent: str = "") -> bytes:
    return (f'{{"parentUuid":"{parent}","type":"user","uuid":"{uuid}",'
            f'"timestamp":"2026-01-01T00:00:{ts}Z"}}').encode()


def test_basic_cases() -> None:
    assert decide("file", None, b"x").action == "create"
    assert decide("file", b"x", b"x").action == "skip"
    d = decide("file", b"a\n", b"a\nb\n")
    assert d.action == "fast-forward" and d.content == b"a\nb\n"
    assert decide("file", b"a\nb\n", b"a\n").action == "keep"
    d = decide("file", b"a\nX\n", b"a\nb\n")
    assert d.action == "conflict" and d.conflict and d.content is None


def test_diverged_transcript_with_newer_backup_appends_its_branch() -> None:
    common = _t("1", "01") + b"\n"
    local = common + _t("L", "02", "1") + b"\n"
    backup = common + _t("B", "09", "1") + b"\n"
    d = decide("transcript", local, backup)
    assert d.action == "merge"
    assert d.content == local + _t("B", "09", "1") + b"\n"  # local bytes first, untouched


def test_diverged_transcript_with_newer_local_is_kept() -> None:
    common = _t("1", "01") + b"\n"
    local = common + _t("L", "09", "1") + b"\n"
    backup = common + _t("B", "02", "1") + b"\n"
    d = decide("transcript", local, backup)
    assert d.action == "conflict" and d.conflict and d.content is None


def test_history_is_a_union_without_duplicates() -> None:
    local = b'{"display":"a"}\n{"display":"b"}\n'
    backup = b'{"display":"a"}\n{"display":"c"}\n'
    d = decide("history", local, backup)
    assert d.action == "merge" and d.content == local + b'{"display":"c"}\n'
    assert decide("history", local + b'{"display":"c"}\n', backup).action == "keep"

"""syncd.heap: a bulk period sets glibc's thresholds once, however many restores share it,
and gives them back (and trims the heap) when the last one ends."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from syncd import heap


class FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("trim", pad))
        return 1


@pytest.fixture
def libc(monkeypatch: pytest.MonkeyPatch) -> FakeLibc:
    fake = FakeLibc()
    monkeypatch.setattr(heap, "_libc", lambda: fake)
    return fake


SET = [("mallopt", heap._M_MMAP_THRESHOLD, heap.BULK_MMAP),
       ("mallopt", heap._M_TRIM_THRESHOLD, heap.BULK_TRIM)]
RESET = [("mallopt", heap._M_MMAP_THRESHOLD, heap._DEFAULT),
         ("mallopt", heap._M_TRIM_THRESHOLD, heap._DEFAULT), ("trim", 0)]


def test_nested_bulk_periods_set_once_and_reset_once(libc: FakeLibc) -> None:
    with heap.bulk():
        assert libc.calls == SET
        with heap.bulk():
            pass
        assert libc.calls == SET  # the inner one's end is not the period's
    assert libc.calls == SET + RESET


def test_a_bulk_period_not_wanted_touches_nothing(libc: FakeLibc) -> None:
    with heap.bulk(False):
        pass
    assert libc.calls == []


def test_a_failure_inside_still_gives_the_thresholds_back(libc: FakeLibc) -> None:
    with pytest.raises(RuntimeError), heap.bulk():
        raise RuntimeError("boom")
    assert libc.calls == SET + RESET


def test_concurrent_restores_share_one_period(libc: FakeLibc) -> None:
    inside, leave = threading.Barrier(3), threading.Event()

    def restore() -> None:
        with heap.bulk():
            inside.wait(timeout=10)
            assert leave.wait(timeout=10)

    threads = [threading.Thread(target=restore) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        inside.wait(timeout=10)  # both are in: set once
        assert libc.calls == SET
    finally:
        leave.set()
        for t in threads:
            t.join(timeout=10)
    assert libc.calls == SET + RESET


def test_the_real_heap_takes_the_settings() -> None:
    """Where glibc is there, a bulk period runs (mallopt and malloc_trim exist)."""
    if heap._libc() is None:
        pytest.skip("no glibc")
    with heap.bulk():
        assert len(bytearray(heap.BULK_MMAP // 2)) == heap.BULK_MMAP // 2

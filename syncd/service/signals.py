"""Stopping on SIGTERM and SIGINT at a safe point."""

from __future__ import annotations

import os
import signal
import threading


def stop_on_signals() -> threading.Event:
    """An Event set by SIGTERM or SIGINT (a second one exits).

    The signals are blocked in every thread (those started later inherit the mask) and
    taken by one thread in ``sigwait``: a Python handler would run in the main thread
    between any two bytecodes, where setting an Event can deadlock on the lock that
    thread may be holding (a retry's ``stop.wait``)."""
    stopping = threading.Event()
    sigs = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)

    def take() -> None:
        signal.sigwait(sigs)
        stopping.set()
        # A second one ends the process at once (a prompt waiting for input, an impatient
        # Ctrl-C): safe, the state only ever holds what the store confirmed.
        os._exit(128 + signal.sigwait(sigs))

    threading.Thread(target=take, name="syncd-signals", daemon=True).start()
    return stopping

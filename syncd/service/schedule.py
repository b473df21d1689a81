"""The daemon's archive jobs: compaction, prune and verify on APScheduler.

Jobs run one at a time in the scheduler's single worker thread, niced, so the flush
loop (its own thread) is never delayed by them. Each records its time and outcome in
the state's meta table, where ``status`` and the metrics read it; a failure is recorded
as the daemon's last error and retried at the next scheduled time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from syncd.archive import purge as purges
from syncd.archive import redactions
from syncd.archive.compact import compact
from syncd.archive.options import (
    acknowledged_seq,
    compact_options,
    ensure_dictionary,
    policy_of,
    record_job,
    verify_budget,
)
from syncd.archive.prune import prune
from syncd.archive.verify import verify
from syncd.backup.errorlog import record_error
from syncd.backup.state import State
from syncd.config import Settings
from syncd.duration import parse_duration
from syncd.errors import CompactError, ConfigError, ScheduleError, SyncdError
from syncd.repository import Repository
from syncd.service.purge import forget_here, redact_here

log = logging.getLogger("syncd.schedule")
# Its own INFO lines (job added, scheduler started) say nothing a user needs.
logging.getLogger("apscheduler").setLevel(logging.WARNING)

JOBS = ("compaction", "prune", "verify")
# Lower than the flush loop: a compaction never delays a flush.
NICE = 10
# How often the purge queue (sessions forgotten on a followed machine's word) is looked
# at: one read of the state when it is empty.
PURGE_EVERY = 60.0


def trigger(name: str, text: str) -> BaseTrigger | None:
    text = text.strip()
    if text.lower() in ("off", "never", ""):
        return None
    if len(text.split()) == 5:
        try:
            return CronTrigger.from_crontab(text)
        except ValueError as e:
            raise ScheduleError(f"{name}: bad cron line {text!r}: {e}") from None
    try:
        return IntervalTrigger(seconds=parse_duration(text))
    except ConfigError as e:
        raise ScheduleError(f"{name}: {e} (or give a cron line, or off)") from None


class Archiver:
    """Runs the archive jobs while the daemon runs; ``connected`` gives this machine's
    repository once the daemon has connected (None: skip this run)."""

    def __init__(self, settings: Settings,
                 connected: Callable[[], Repository | None],
                 stop: threading.Event, on_stored: Callable[[], None] = lambda: None) -> None:
        self.settings = settings
        self.connected = connected
        self.stop = stop
        self.on_stored = on_stored  # told when a job changed what the machine stores
        self.triggers = {
            "compaction": trigger("compact_schedule", settings.compact_schedule),
            "prune": trigger("prune_schedule", settings.prune_schedule),
            "verify": trigger("verify_schedule", settings.verify_schedule)}
        self._sched = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(1)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None})
        self._run_lock = threading.Lock()

    def start(self) -> None:
        for name, trig in self.triggers.items():
            if trig is not None:
                self._sched.add_job(self.run, trig, args=[name], id=name, name=name)
        self._sched.add_job(self.purge, IntervalTrigger(seconds=PURGE_EVERY), id="purge",
                            name="purge")
        self._sched.add_job(self.redact, IntervalTrigger(seconds=PURGE_EVERY), id="redact",
                            name="redact")
        self._sched.start()
        self._record()

    def shutdown(self) -> None:
        # Not waiting: a job in flight sees ``stop`` and ends at its next safe point.
        with contextlib.suppress(Exception):
            self._sched.shutdown(wait=False)

    def next_times(self) -> dict[str, float | None]:
        out: dict[str, float | None] = dict.fromkeys(JOBS)
        for job in self._sched.get_jobs():
            if job.id in out and job.next_run_time is not None:
                out[job.id] = job.next_run_time.timestamp()
        return out

    def run(self, name: str) -> dict[str, Any] | None:
        """Run one job now (the scheduler calls this; so can tests). Never raises."""
        with self._run_lock:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
            repo = self.connected()
            if repo is None:
                log.info("%s skipped: not connected to the store yet", name)
                return None
            s = self.settings
            opts = compact_options(s)
            opts.should_stop = self.stop.is_set
            started = time.time()
            try:
                result: dict[str, Any]
                if name == "compaction":
                    note = ensure_dictionary(s, repo)
                    result = compact(repo, opts).as_dict()
                    result["dictionary"] = note
                    if result["errors"]:
                        # Done as far as it could go (a missing or damaged segment stops
                        # it there): worth a look, and it shows in status.
                        self._record(error=f"compaction: {result['errors'][0]}")
                elif name == "prune":
                    result = prune(repo, policy_of(s), max_share=s.prune_max_share,
                                   opts=opts).as_dict()
                else:
                    share, limit = verify_budget(s)
                    report = verify(repo, read_data=share, max_duration=limit,
                                    acknowledged=acknowledged_seq(s),
                                    head_interval=s.head_interval)
                    result = report.as_dict()
                    if not report.ok:
                        raise CompactError(f"verify found {len(report.problems)} problems: "
                                           f"{report.problems[0]}")
            except (SyncdError, OSError) as e:
                log.error("%s failed: %s", name, e)
                self._record(error=f"{name}: {e}")
                return None
            log.info("%s done in %.1f s", name, time.time() - started)
            if name != "verify":
                self.on_stored()
            record_job(s, name)
            self._record()
            return result

    def purge(self) -> dict[str, Any] | None:
        """Rewrite this machine's backup without the sessions queued for it (follow
        queues those a followed machine's tombstone forgot here); they leave the queue
        only once the rewrite returned. Never raises; None when there was nothing to do
        or it failed (recorded, tried again at the next look)."""
        with self._run_lock:
            state = State(self.settings.state_file)
            try:
                sids = frozenset(purges.pending(state))
            finally:
                state.close()
            if not sids:
                return None
            repo = self.connected()
            if repo is None:
                return None
            opts = compact_options(self.settings)
            opts.should_stop = self.stop.is_set
            try:
                report, whole = forget_here(self.settings, repo, sids, opts)
            except (SyncdError, OSError) as e:
                log.error("purge of %d forgotten sessions failed: %s", len(sids), e)
                self._record(error=f"purge: {e}")
                return None
            if not whole:  # this tree's history lines wait until it is quiet
                return None
            state = State(self.settings.state_file)
            try:
                purges.done(state, sids)
            finally:
                state.close()
            log.info("purged %d forgotten sessions from this machine's backup", len(sids))
            self.on_stored()
            as_dict = getattr(report, "as_dict", None)
            return as_dict() if callable(as_dict) else {"sessions": sorted(sids)}

    def redact(self) -> list[dict[str, Any]] | None:
        """Mask here, and in this machine's backup, the values a followed machine redacted
        in sessions that came from it (follow queues them, by digest); each leaves the
        queue once its session's rewrite returned, or stays for the next look (its files
        busy, the store down). Never raises; None when nothing was done."""
        with self._run_lock:
            state = State(self.settings.state_file)
            try:
                queued = redactions.pending(state)
            finally:
                state.close()
            if not queued:
                return None
            repo = self.connected()
            if repo is None:
                return None
            by_session: dict[str, list[redactions.Redaction]] = {}
            for r in queued:
                by_session.setdefault(r.session, []).append(r)
            out: list[dict[str, Any]] = []
            for sid, rs in sorted(by_session.items()):
                if self.stop.is_set():
                    break
                opts = compact_options(self.settings)
                opts.should_stop = self.stop.is_set
                digests = frozenset(v for r in rs for v in r.values)
                try:
                    report, whole = redact_here(self.settings, repo, sid, digests, opts)
                except (SyncdError, OSError) as e:
                    log.error("redaction of %d values in session %s failed: %s",
                              len(digests), sid, e)
                    self._record(error=f"redact: {e}")
                    continue
                if not whole:  # its files here are being written: at a later look
                    continue
                state = State(self.settings.state_file)
                try:
                    redactions.done(state, rs)
                finally:
                    state.close()
                log.info("masked %d values redacted on their origin in session %s",
                         len(digests), sid)
                out.append(report.as_dict() if report is not None else {"session": sid})
            if out:
                self.on_stored()
            return out or None

    def _record(self, error: str | None = None) -> None:
        """The error (if any) and the next run times, through a connection of its own
        (SQLite connections stay in the thread that made them)."""
        state = State(self.settings.state_file)
        try:
            if error is not None:
                record_error(state, error)
            state.set_meta(**{f"next_{k}_time": repr(v) if v else ""
                              for k, v in self.next_times().items()})
        finally:
            state.close()

"""A Prometheus text endpoint on 127.0.0.1 with the figures of ``syncd status --json``.

Off by default (``metrics_port = 0``). Every scrape computes ``status()`` afresh, so the
endpoint and ``status --json`` cannot disagree; the store probe reuses one client.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from syncd.config import Settings
from syncd.service.status import STORE_CHECK_TIMEOUT, status
from syncd.store import Store, open_store
from syncd.version import __version__

log = logging.getLogger("syncd.metrics")

# (key in status --json, metric name, type, help). None values are left out of a scrape.
METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("running", "syncd_daemon_running", "gauge", "1 while the daemon holds the state"),
    ("lag_seconds", "syncd_lag_seconds", "gauge",
     "Age of the oldest unshipped change (0: nothing pending)"),
    ("bytes_pending", "syncd_pending_bytes", "gauge", "Bytes not yet in the store"),
    ("files_pending", "syncd_pending_files", "gauge", "Files with bytes not yet in the store"),
    ("last_flush_time", "syncd_last_flush_timestamp_seconds", "gauge",
     "Time of the last successful flush"),
    ("last_flush_seq", "syncd_last_flush_seq", "gauge", "Seq of the last segment shipped"),
    ("next_seq", "syncd_next_seq", "gauge", "Seq the next segment will get"),
    ("files_tracked", "syncd_files_tracked", "gauge", "Files backed up and present locally"),
    ("files_deleted", "syncd_files_deleted", "gauge",
     "Files deleted locally, kept in the store"),
    ("bytes_shipped", "syncd_shipped_bytes", "gauge", "Bytes of present files in the store"),
    ("errors_last_hour", "syncd_errors_last_hour", "gauge", "Errors in the last hour"),
    ("last_error_time", "syncd_last_error_timestamp_seconds", "gauge", "Time of the last error"),
    ("store_reachable", "syncd_store_reachable", "gauge", "1 when a HEAD of machine.json worked"),
    ("last_reconcile_time", "syncd_last_reconcile_timestamp_seconds", "gauge",
     "Time of the last reconcile scan"),
    ("last_compaction_time", "syncd_last_compaction_timestamp_seconds", "gauge",
     "Time of the last compaction"),
    ("last_prune_time", "syncd_last_prune_timestamp_seconds", "gauge",
     "Time of the last retention prune"),
    ("last_verify_time", "syncd_last_verify_timestamp_seconds", "gauge",
     "Time of the last verification"),
    ("sessions_with_secrets", "syncd_sessions_with_secrets", "gauge",
     "Sessions of this tree with what looks like a secret (syncd secrets)"),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(s: dict[str, Any]) -> str:
    """Prometheus text format (0.0.4) of a ``status()`` dict."""
    labels = f'machine="{_label(s["machine_id"])}"'
    lines = ["# HELP syncd_info Version, machine and store of this syncd",
             "# TYPE syncd_info gauge",
             f'syncd_info{{{labels},store="{_label(s["store"])}",version="{__version__}"}} 1']
    for key, name, kind, help_ in METRICS:
        value = s.get(key)
        if value is None:
            continue
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}",
                  f"{name}{{{labels}}} {float(value)!r}"]
    jobs = sorted((k, v) for k, v in (s.get("next_jobs") or {}).items() if v is not None)
    if jobs:
        lines += ["# HELP syncd_next_job_timestamp_seconds When a scheduled job runs next",
                  "# TYPE syncd_next_job_timestamp_seconds gauge"]
    for job, when in jobs:
        if when is not None:
            lines.append(f'syncd_next_job_timestamp_seconds{{{labels},job="{job}"}} '
                         f"{float(when)!r}")
    return "\n".join(lines) + "\n"


class MetricsServer:
    """``GET /metrics`` on 127.0.0.1:port, served by a daemon thread."""

    def __init__(self, port: int, figures: Callable[[], dict[str, Any]]) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "try /metrics")
                    return
                try:
                    body = render(outer.figures()).encode()
                except Exception as e:  # a scrape must never take the daemon down
                    log.error("metrics: %s", e)
                    self.send_error(500, str(e)[:200])
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("metrics: " + format, *args)

        self.figures = figures
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="syncd-metrics",
                                        daemon=True)
        self._thread.start()
        log.info("metrics on http://127.0.0.1:%d/metrics", self.port)

    @classmethod
    def start_for(cls, settings: Settings) -> MetricsServer | None:
        """The daemon's endpoint when ``metrics_port`` is set; a busy port is logged, not fatal."""
        if not settings.metrics_port:
            return None
        probe: Store = open_store(settings.store, endpoint_url=settings.s3_endpoint_url,
                                  region=settings.s3_region,
                                  retry_deadline=STORE_CHECK_TIMEOUT, timeout=STORE_CHECK_TIMEOUT)
        try:
            return cls(settings.metrics_port,
                       lambda: status(settings, probe_store=True, store=probe))
        except OSError as e:
            log.error("metrics endpoint on 127.0.0.1:%d not started: %s",
                      settings.metrics_port, e)
            return None

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

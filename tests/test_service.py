"""syncd as a systemd service: the unit, sd_notify, reload, graceful stop, logs, metrics.

No systemd is mocked: the unit is checked by systemd-analyze, and the daemon talks to a
real notify socket (a bound AF_UNIX datagram socket) that the test owns, the way the
service manager does.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from syncd.backup.state import State
from syncd.config import load_settings
from syncd.service.daemon import Daemon
from syncd.service.metrics import METRICS
from tests.helpers import tree_bytes, wait_for, write
from tests.test_catchup import _catchup_child, _freeze, _sigterm_pending

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "syncd.service"
SYNCD = [sys.executable, "-m", "syncd"]


# -- harness ---------------------------------------------------------------------------------

class NotifySocket:
    """The service manager's end of sd_notify: every datagram the daemon sends, in order."""

    def __init__(self) -> None:
        # AF_UNIX paths are short (108 bytes): not under pytest's long tmp_path.
        self.dir = tempfile.mkdtemp(prefix="sdn")
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.messages: list[dict[str, str]] = []
        self._seen = 0

    def _recv(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not ready:
            return False
        data = self.sock.recv(65536).decode()
        self.messages.append(dict(line.split("=", 1) for line in data.splitlines() if "=" in line))
        return True

    def wait_for(self, cond: Callable[[dict[str, str]], bool], timeout: float = 30.0,
                 what: str = "message") -> dict[str, str]:
        """The next message (after those already waited for) that satisfies ``cond``."""
        deadline = time.monotonic() + timeout
        while True:
            while self._seen < len(self.messages):
                msg = self.messages[self._seen]
                self._seen += 1
                if cond(msg):
                    return msg
            if not self._recv(deadline - time.monotonic()) and time.monotonic() >= deadline:
                raise AssertionError(f"no {what} within {timeout}s; got {self.messages}")

    def drain(self) -> None:
        while self._recv(0.0):
            pass

    def close(self) -> None:
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    n = NotifySocket()
    try:
        yield n
    finally:
        n.close()


def base_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "config.toml").touch()  # a config file named by $SYNCD_CONFIG must exist
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SYNCD_", "NOTIFY_", "WATCHDOG_", "JOURNAL_"))}
    env.update({"SYNCD_SOURCE": str(tmp_path / "src"),
                "SYNCD_STORE": (tmp_path / "store").as_uri(),
                "SYNCD_STATE_DIR": str(tmp_path / "state"), "SYNCD_MACHINE_ID": "m1",
                "SYNCD_CONFIG": str(tmp_path / "config.toml")})
    env.update(extra)
    return env


def state_file(env: dict[str, str]) -> Path:
    # Every setting that names the state file comes from env; the config file may be broken.
    return load_settings(Path(env["SYNCD_STATE_DIR"]) / "none.toml", source=env["SYNCD_SOURCE"],
                         store=env["SYNCD_STORE"], state_dir=env["SYNCD_STATE_DIR"],
                         machine_id=env["SYNCD_MACHINE_ID"]).state_file


def shipped(env: dict[str, str], rel: str) -> int:
    path = state_file(env)
    if not path.exists():
        return -1
    st = State(path, readonly=True)
    try:
        f = st.get(rel.encode())
        return -1 if f is None else f.offset
    finally:
        st.close()


def syncd(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SYNCD, *args], env=env, capture_output=True, text=True, timeout=300)


def start(env: dict[str, str], notify: NotifySocket | None = None,
          stderr: int = subprocess.PIPE) -> subprocess.Popen[str]:
    if notify is not None:
        env = {**env, "NOTIFY_SOCKET": notify.path}
    return subprocess.Popen([*SYNCD, "run"], env=env, stderr=stderr, stdout=subprocess.DEVNULL,
                            text=True)


def stop(p: subprocess.Popen[str]) -> str:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        _out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return err or ""


def unit_value(key: str) -> str:
    for line in UNIT.read_text().splitlines():
        if line.startswith(f"{key}="):
            return line.split("=", 1)[1]
    raise AssertionError(f"{key}= not in {UNIT}")


def seconds(value: str) -> float:
    units = {"min": 60.0, "s": 1.0, "ms": 0.001}
    m = re.fullmatch(r"(\d+)(min|s|ms)?", value)
    assert m, value
    return int(m.group(1)) * units[m.group(2) or "s"]


# -- the unit file ---------------------------------------------------------------------------

def _verify(unit: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """systemd-analyze verify as a user unit (HOME decides %h, so ExecStart must exist there)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    runtime = home / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}
    r = subprocess.run([analyze, "--user", "verify", str(unit)], env=env, capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0 and "Failed to initialize manager" in r.stderr:
        # No user manager can be set up here (no runtime dir support): verify as a system unit.
        r = subprocess.run([analyze, "verify", str(unit)], env=env, capture_output=True,
                           text=True, timeout=60)
    return r


def _fake_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    exe = shutil.which("syncd", path=str(Path(sys.executable).parent)) or shutil.which("syncd")
    assert exe, "the syncd command is not installed in this environment"
    (home / ".local" / "bin" / "syncd").symlink_to(exe)
    return home


def test_unit_file_verifies(tmp_path: Path) -> None:
    home = _fake_home(tmp_path)
    r = _verify(UNIT, home)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stderr
    # The check is not vacuous: a misspelt key in a copy of the unit is reported.
    broken = tmp_path / "syncd.service"
    broken.write_text(UNIT.read_text().replace("NoNewPrivileges=", "NoNewPrivilege="))
    r = _verify(broken, home)
    assert "NoNewPrivilege" in r.stderr


def test_unit_file_is_a_hardened_notify_service() -> None:
    assert unit_value("Type") == "notify"
    assert unit_value("Restart") == "on-failure"
    assert unit_value("ExecReload") == "kill -HUP $MAINPID"
    assert unit_value("ExecStart").endswith("/syncd run")
    assert seconds(unit_value("WatchdogSec")) >= 60
    assert seconds(unit_value("TimeoutStopSec")) >= 30
    assert unit_value("NoNewPrivileges") == "yes" and unit_value("PrivateTmp") == "yes"
    assert unit_value("ProtectSystem") == "strict"
    # Writable: the state and data dirs, and the Claude tree (follow writes imported
    # sessions there); each made before the sandbox binds it.
    writable = unit_value("ReadWritePaths").split()
    assert writable == ["%h/.local/state/syncd", "%h/.local/share/syncd", "%h/.claude"]
    assert unit_value("ExecStartPre").split()[2:] == writable


# -- sd_notify -------------------------------------------------------------------------------

def test_ready_after_first_flush_then_watchdog_then_stopping(tmp_path: Path,
                                                            notify: NotifySocket) -> None:
    env = base_env(tmp_path, WATCHDOG_USEC="400000")
    f = write(tmp_path / "src", "projects/-home-a/s.jsonl", b'{"n":1}\n' * 100)
    p = start(env, notify)
    try:
        ready = notify.wait_for(lambda m: m.get("READY") == "1", what="READY=1")
        # READY means the first reconcile scan and its flush are done.
        assert shipped(env, "projects/-home-a/s.jsonl") == f.stat().st_size
        assert "nothing pending" in ready["STATUS"] and "last flush" in ready["STATUS"]
        # Idle, the loop still wakes every WATCHDOG_USEC/2 to ping.
        t0 = time.monotonic()
        for _ in range(4):
            notify.wait_for(lambda m: m.get("WATCHDOG") == "1", timeout=5, what="WATCHDOG=1")
        assert time.monotonic() - t0 < 5
        # A change shows in STATUS, then the flush brings it back to idle.
        write(tmp_path / "src", "projects/-home-a/s.jsonl", b'{"n":2}\n', "ab")
        notify.wait_for(lambda m: "pending since" in m.get("STATUS", ""), what="STATUS pending")
        notify.wait_for(lambda m: "nothing pending" in m.get("STATUS", ""), what="STATUS idle")
        assert shipped(env, "projects/-home-a/s.jsonl") == f.stat().st_size
        p.send_signal(signal.SIGTERM)
        notify.wait_for(lambda m: m.get("STOPPING") == "1", what="STOPPING=1")
        p.wait(timeout=30)
    finally:
        err = stop(p)
    assert p.returncode == 0, err
    # Quiet when nothing happens: many idle wake-ups, and only these lines in the log.
    events = [re.sub(r"^\S+ \S+ ", "", line) for line in err.splitlines()]
    assert [e.split(":")[0] for e in events] == ["INFO syncd.daemon"] * 2 + [
        "INFO syncd.ship"] * 2 + ["INFO syncd.daemon"] * 2, err
    assert "reconcile scan: 1 files, 1 changed" in events[1]


def test_without_watchdog_the_daemon_sleeps_until_its_next_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings(tmp_path / "none.toml", source=tmp_path, store=(tmp_path / "st").as_uri(),
                      state_dir=tmp_path / "state", machine_id="m1")
    for var in ("WATCHDOG_USEC", "WATCHDOG_PID", "NOTIFY_SOCKET"):
        monkeypatch.delenv(var, raising=False)
    idle = Daemon(s)._timeout(time.monotonic() + 3600)
    assert idle > 3500
    monkeypatch.setenv("WATCHDOG_USEC", "10000000")
    assert Daemon(s)._timeout(time.monotonic() + 3600) == pytest.approx(5.0, abs=0.1)
    # A watchdog meant for another process (WATCHDOG_PID) is not ours to ping.
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert Daemon(s)._timeout(time.monotonic() + 3600) > 3500


# -- reload ----------------------------------------------------------------------------------

def test_sighup_reloads_flush_timings_without_restart(tmp_path: Path,
                                                      notify: NotifySocket) -> None:
    config = tmp_path / "config.toml"
    config.write_text("flush_quiet = 3600.0\nflush_max_delay = 3600.0\nflush_busy_interval = 0\n")
    env = base_env(tmp_path)
    (tmp_path / "src").mkdir()
    p = start(env, notify)
    try:
        notify.wait_for(lambda m: m.get("READY") == "1", what="READY=1")
        write(tmp_path / "src", "history.jsonl", b'{"display":"a"}\n')
        # The daemon saw it and holds it: an hour of quiet is due before a flush.
        notify.wait_for(lambda m: "pending since" in m.get("STATUS", ""), what="pending")
        assert shipped(env, "history.jsonl") == -1

        config.write_text("flush_quiet = 0.2\nflush_max_delay = 1.0\nflush_busy_interval = 0\n")
        p.send_signal(signal.SIGHUP)
        notify.wait_for(lambda m: m.get("RELOADING") == "1" and "MONOTONIC_USEC" in m,
                        what="RELOADING=1")
        notify.wait_for(lambda m: m.get("READY") == "1", what="READY=1 after reload")
        wait_for(lambda: shipped(env, "history.jsonl") == 16, timeout=30,
                 what="pending change flushed under the reloaded timings")
        write(tmp_path / "src", "history.jsonl", b'{"display":"b"}\n', "ab")
        wait_for(lambda: shipped(env, "history.jsonl") == 32, timeout=30, what="next change")
        assert p.poll() is None  # same process: reloaded, not restarted
        status = json.loads(syncd("status", "--json", env=env).stdout)
        assert status["daemon_pid"] == p.pid

        # A broken config is refused and the running one is kept.
        config.write_text("flush_quiet = -1\n")
        p.send_signal(signal.SIGHUP)
        notify.wait_for(lambda m: m.get("RELOADING") == "1", what="second RELOADING=1")
        notify.wait_for(lambda m: m.get("READY") == "1", what="READY=1 after failed reload")
        write(tmp_path / "src", "history.jsonl", b'{"display":"c"}\n', "ab")
        wait_for(lambda: shipped(env, "history.jsonl") == 48, timeout=30,
                 what="change flushed with the kept timings")
        assert p.poll() is None
    finally:
        err = stop(p)
    assert p.returncode == 0, err
    assert "reloaded configuration: flush_quiet=0.2, flush_max_delay=1.0" in err
    assert "reload failed, configuration unchanged" in err and "flush_quiet" in err


# -- graceful stop ---------------------------------------------------------------------------

@pytest.fixture
def fast_store(tmp_path: Path) -> Iterator[Path]:
    """A store directory on tmpfs where there is one: a seed goes as fast as this machine
    can make it, which is what a stop has to keep up with."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    path = Path(tempfile.mkdtemp(prefix="syncd-store-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_sigterm_during_a_large_flush_exits_in_time_and_loses_nothing(
        tmp_path: Path, notify: NotifySocket, fast_store: Path) -> None:
    src = tmp_path / "src"
    for i in range(64):
        write(src, f"file-history/big/{i:03d}", os.urandom(2 << 20))
    total = sum(len(v) for v in tree_bytes(src).values())
    # 128 MiB pending: the start-up catch-up ships it in a child process, one 2 MiB file
    # per segment, and the stop must reach that child.
    env = base_env(tmp_path, SYNCD_SEGMENT_MAX_BYTES=str(1 << 20),
                   SYNCD_STORE=fast_store.as_uri())

    def next_seq() -> int:
        path = state_file(env)
        if not path.exists():
            return 0
        st = State(path, readonly=True)
        try:
            return st.next_seq
        finally:
            st.close()

    p = start(env, notify)
    child = None
    try:
        def found() -> bool:
            nonlocal child
            child = _catchup_child(p.pid)
            return child is not None or p.poll() is not None

        wait_for(found, timeout=60, what="the catch-up child")
        assert child is not None, "no catch-up child"
        deadline = time.monotonic() + 60
        while next_seq() < 2 and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.002)
        # Hold the child where it is, mid-seed, until the stop has reached it: however fast
        # it ships, what it does after the stop is then all that is measured.
        _freeze(child)
        held = next_seq()
        assert 2 <= held < 64, f"the child was not caught mid-seed (segment {held})"
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        notify.wait_for(lambda m: m.get("STOPPING") == "1", what="STOPPING=1")
        # Passed on at once, not at the daemon's next look at its child.
        wait_for(lambda: _sigterm_pending(child), what="SIGTERM passed to the child")
        os.kill(child, signal.SIGCONT)
        p.wait(timeout=seconds(unit_value("TimeoutStopSec")))
        took = time.monotonic() - t0
    finally:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGCONT)
        err = stop(p)
    assert p.returncode == 0, err
    assert took < 30, f"stop took {took:.1f}s"
    assert "start-up catch-up stopped" in err, err
    assert not re.search(r"Traceback| (WARNING|ERROR) ", err), err
    # Stopped at a segment boundary: the upload in flight and the segment being read were
    # committed, no more; and the daemon did not ship the rest itself.
    assert next_seq() <= held + 2
    st = State(state_file(env), readonly=True)
    done = sum(f.offset for f in st.files())
    st.close()
    assert 0 < done < total
    # The child released the lease on its way out, rather than leaving it to expire.
    assert not (fast_store / "machines" / "m1" / "lease.json").exists()
    r = syncd("sync", env=env)
    assert r.returncode == 0, r.stderr
    r = syncd("restore", "--to", str(tmp_path / "out"), env=env)
    assert r.returncode == 0, r.stderr
    assert tree_bytes(tmp_path / "out") == tree_bytes(src)


# -- logs ------------------------------------------------------------------------------------

def test_logs_under_systemd_carry_syslog_priorities(tmp_path: Path,
                                                    notify: NotifySocket) -> None:
    # The store is unreachable (nothing listens on that port): a warning and an error.
    env = base_env(tmp_path, SYNCD_STORE="s3://bucket/pre",
                   SYNCD_S3_ENDPOINT_URL="http://127.0.0.1:9", SYNCD_STORE_RETRY_DEADLINE="2",
                   AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y")
    write(tmp_path / "src", "history.jsonl", b'{"display":"a"}\n')
    r, w = os.pipe()
    st = os.fstat(w)
    env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
    p = start(env, notify, stderr=w)
    os.close(w)
    try:
        notify.wait_for(lambda m: m.get("READY") == "1", what="READY=1")
        status = json.loads(syncd("status", "--json", env=env).stdout)
        text = syncd("status", env=env).stdout
    finally:
        stop(p)
        with os.fdopen(r) as fh:
            log = fh.read()
    assert p.returncode == 0, log
    lines = log.splitlines()
    assert lines and all(re.match(r"<[0-7]>syncd\.[a-z.]+: \S", line) for line in lines), log
    # Running once the store was tried: down, it does not keep the daemon from starting.
    assert any(line.startswith("<6>syncd.daemon: syncd running: machine m1")
               for line in lines), log
    assert any(line.startswith("<4>syncd.store: store ") for line in lines), log
    assert any(line.startswith("<3>syncd.daemon: flush failed") for line in lines), log
    # Health shows it too.
    assert status["store_reachable"] is False and status["errors_last_hour"] >= 1
    assert status["running"] is True and status["bytes_pending"] == 16
    assert "store unreachable" in text and "errors in the last hour" in text


def test_logs_elsewhere_are_plain_with_timestamps(tmp_path: Path) -> None:
    env = base_env(tmp_path)
    write(tmp_path / "src", "history.jsonl", b"x\n")
    r = syncd("-v", "sync", env=env)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.splitlines() if "flushed segment" in x)
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO syncd\.ship: flushed segment 0",
                    line), r.stderr


# -- status and metrics ----------------------------------------------------------------------

def test_status_when_nothing_runs(tmp_path: Path) -> None:
    env = base_env(tmp_path)
    write(tmp_path / "src", "history.jsonl", b"one\n")
    assert syncd("sync", env=env).returncode == 0
    write(tmp_path / "src", "history.jsonl", b"two\n", "ab")
    s = json.loads(syncd("status", "--json", env=env).stdout)
    assert s["running"] is False and s["daemon_pid"] is None
    assert s["store_reachable"] is True and s["store_error"] is None
    assert s["bytes_pending"] == 4 and s["files_pending"] == 1
    assert s["lag_seconds"] is not None and s["lag_seconds"] >= 0
    assert s["last_flush_seq"] == 0 and s["errors_last_hour"] == 0
    assert s["last_compaction_time"] is None and s["last_prune_time"] is None
    assert s["next_jobs"] == {"reconcile": None, "compaction": None, "prune": None,
                              "verify": None}
    text = syncd("status", env=env).stdout
    assert "health:       daemon not running" in text
    assert "(reachable)" in text and "compaction:   never" in text
    assert "next jobs:    reconcile scan not scheduled" in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _parse_metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            out[name_labels] = float(value)
    return out


def test_metrics_endpoint_serves_the_status_figures(tmp_path: Path,
                                                    notify: NotifySocket) -> None:
    port = _free_port()
    env = base_env(tmp_path, SYNCD_METRICS_PORT=str(port))
    write(tmp_path / "src", "projects/-home-a/s.jsonl", b'{"a":1}\n' * 10)
    write(tmp_path / "src", "history.jsonl", b'{"display":"a"}\n')
    p = start(env, notify)
    try:
        notify.wait_for(lambda m: m.get("READY") == "1", what="READY=1")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            metrics = _parse_metrics(resp.read().decode())
        status = json.loads(syncd("status", "--json", env=env).stdout)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10)
        assert e.value.code == 404
    finally:
        err = stop(p)
    assert p.returncode == 0, err
    compared = 0
    for key, name, _kind, _help in METRICS:
        value = status[key]
        series = f'{name}{{machine="m1"}}'
        if value is None:
            assert series not in metrics, name
            continue
        assert metrics[series] == pytest.approx(float(value), abs=1e-6), name
        compared += 1
    assert compared >= 12
    assert metrics['syncd_next_job_timestamp_seconds{machine="m1",job="reconcile"}'] == \
        pytest.approx(status["next_jobs"]["reconcile"])
    assert status["files_tracked"] == 2 and metrics['syncd_files_tracked{machine="m1"}'] == 2
    assert metrics['syncd_daemon_running{machine="m1"}'] == 1


# -- progress, completion, help --------------------------------------------------------------

def test_sync_draws_a_progress_bar_only_on_a_terminal(tmp_path: Path) -> None:
    env = base_env(tmp_path, COLUMNS="100", TERM="xterm")
    for i in range(8):
        write(tmp_path / "src", f"file-history/s/{i}", os.urandom(1 << 20))
    master, slave = pty.openpty()
    p = subprocess.Popen([*SYNCD, "sync"], env=env, stdout=subprocess.PIPE, stderr=slave,
                         text=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the other end is closed
            break
        if not data:
            break
        chunks.append(data)
    out, _ = p.communicate(timeout=120)
    os.close(master)
    drawn = b"".join(chunks).decode(errors="replace")
    assert p.returncode == 0
    assert "shipping" in drawn and "MB" in drawn
    assert out.startswith("synced: 8 files")
    # Not a terminal: no bar, no escape codes, just the summary on stdout.
    write(tmp_path / "src", "file-history/s/9", os.urandom(1 << 20))
    r = syncd("sync", env=env)
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith("synced: 1 files")


def test_shell_completion_and_help(tmp_path: Path) -> None:
    env = base_env(tmp_path, _SYNCD_COMPLETE="bash_complete", COMP_WORDS="syncd st",
                   COMP_CWORD="1")
    r = subprocess.run([*SYNCD], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "plain,status" in r.stdout.splitlines()
    env = base_env(tmp_path, _SYNCD_COMPLETE="bash_source")
    r = subprocess.run([*SYNCD], env=env, capture_output=True, text=True, timeout=60)
    assert "complete -o nosort -F _syncd_completion syncd" in r.stdout
    r = syncd("--help", env=base_env(tmp_path))
    assert r.returncode == 0
    assert "Exit codes:" in r.stdout and "2  bad usage or configuration" in r.stdout
    assert '_SYNCD_COMPLETE=bash_source syncd' in r.stdout
    r = syncd("nonsense", env=base_env(tmp_path))
    assert r.returncode == 2

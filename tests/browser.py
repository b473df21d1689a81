"""Browser tests' fixtures: Debian's chromium driven by Playwright, and ``syncd web`` as a
whole process on port 0 over a tree backed up to a file:// store.

Skipped with a reason when Playwright or /usr/bin/chromium is missing (no browser can be
downloaded here). Import the fixtures into a test module with
``from tests.browser import browser, page, web  # noqa: F401``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
URL = re.compile(r"(http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]+)")


def env_of(tmp_path: Path, machine: str = "m1", **extra: str) -> dict[str, str]:
    """The environment of a syncd process on ``tmp_path``'s tree, store and state."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
    env.update({"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
                "SYNCD_SOURCE": str(tmp_path / "src"),
                "SYNCD_STATE_DIR": str(tmp_path / "state"), "SYNCD_MACHINE_ID": machine,
                "SYNCD_STORE": (tmp_path / "store").as_uri(), "SYNCD_CONFIG": os.devnull,
                "PYTHONPATH": str(ROOT), **extra})
    return env


@dataclass
class Web:
    """A running ``syncd web``: its URL (with the token), host:port, and its output."""

    process: subprocess.Popen[str]
    url: str
    tmp_path: Path
    lines: list[str] = field(default_factory=list)

    @property
    def hostport(self) -> str:
        return self.url.split("/")[2]

    @property
    def base(self) -> str:
        return f"http://{self.hostport}"

    @property
    def token(self) -> str:
        return self.url.rpartition("token=")[2]


def start_web(env: dict[str, str], tmp_path: Path, *args: str, deadline: float = 60.0) -> Web:
    """``syncd web --port 0`` as a process; returns once it printed its URL."""
    p = subprocess.Popen([sys.executable, "-m", "syncd", "web", "--port", "0", *args],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         stdin=subprocess.DEVNULL)
    assert p.stdout is not None
    lines: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)
            m = URL.search(line)
            if m and not url:
                url.append(m.group(1))
                found.set()
        found.set()  # it ended

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(deadline) or not url:
        p.kill()
        p.wait(10)
        raise AssertionError(f"syncd web printed no URL: {''.join(lines)}")
    return Web(p, url[0], tmp_path, lines)


def stop_web(w: Web) -> None:
    w.process.terminate()
    try:
        w.process.wait(15)
    except subprocess.TimeoutExpired:
        w.process.kill()
        w.process.wait(10)


def sync(env: dict[str, str]) -> None:
    r = subprocess.run([sys.executable, "-m", "syncd", "sync"], env=env, capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr


@pytest.fixture
def web(tmp_path: Path) -> Iterator[Callable[..., Web]]:
    """Starts ``syncd web`` on ``tmp_path``'s store (back it up first, e.g. ``sync``);
    every one started is stopped at the end."""
    started: list[Web] = []

    def start(env: dict[str, str] | None = None, *args: str) -> Web:
        w = start_web(env or env_of(tmp_path), tmp_path, *args)
        started.append(w)
        return w

    yield start
    for w in started:
        stop_web(w)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium (headless), or the test is skipped with the reason. One per test module:
    each module imports its own copy of this fixture, and Playwright's sync API allows
    one running instance at a time."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no browser: {CHROMIUM} is missing (apt-get install chromium)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any, tmp_path: Path) -> Iterator[Any]:
    """A fresh browser page (its own cookies); console errors and failed page scripts are
    kept in ``page.syncd_errors``."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    p.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    p.syncd_errors = errors
    p.set_default_timeout(30_000)
    try:
        yield p
    finally:
        context.close()


def screenshot(p: Any, tmp_path: Path, name: str) -> Path:
    """A screenshot of the page under the test's tmp dir (checked to be written)."""
    out = tmp_path / "screenshots" / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    p.screenshot(path=str(out), full_page=True)
    assert out.stat().st_size > 1000
    return out


def wait_until(cond: Callable[[], Any], deadline: float = 30.0, what: str = "condition") -> Any:
    end = time.monotonic() + deadline
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)

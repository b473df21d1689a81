"""The page in a real browser: each view loaded through ``syncd web`` and checked through
the DOM, a screenshot of each under the test's tmp dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.browser import browser, env_of, page, screenshot, sync, web  # noqa: F401
from tests.helpers import write

SID = "0f8e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b"
SID2 = "1a2b3c4d-5e6f-4a0b-8c1d-2e3f4a5b6c7d"


def transcript(sid: str, cwd: str, prompt: str, when: str) -> bytes:
    lines = [
        {"type": "user", "sessionId": sid, "cwd": cwd, "timestamp": when, "uuid": "u1",
         "message": {"role": "user", "content": prompt}},
        {"type": "assistant", "sessionId": sid, "cwd": cwd, "timestamp": when, "uuid": "a1",
         "parentUuid": "u1", "message": {"role": "assistant",
                                         "content": [{"type": "text", "text": "done"}]}},
    ]
    return b"".join(json.dumps(x, separators=(",", ":")).encode() + b"\n" for x in lines)


def tree(tmp_path: Path) -> dict[str, str]:
    src = tmp_path / "src"
    write(src, f"projects/-home-u-alpha/{SID}.jsonl",
          transcript(SID, "/home/u/alpha", "fix the parser", "2026-11-30T10:00:00.000Z"))
    write(src, f"projects/-home-u-beta/{SID2}.jsonl",
          transcript(SID2, "/home/u/beta", "write the docs", "2026-12-01T09:00:00.000Z"))
    env = env_of(tmp_path)
    sync(env)
    return env


def test_dashboard_and_sessions_views(tmp_path: Path, web: Any, page: Any) -> None:  # noqa: F811
    w = web(tree(tmp_path))
    page.goto(w.url)
    # The token became a cookie and left the address bar.
    assert "token=" not in page.url
    assert page.locator("h1").inner_text() == "Dashboard"
    assert page.locator("#status").inner_text().count("m1") >= 1
    # The figures are refreshed from the JSON endpoint by the static script.
    page.wait_for_selector("body[data-refreshed]", state="attached")
    # Stored bytes per machine: a sample taken at the first view, drawn as SVG.
    line = page.locator('#stored-plot polyline[data-machine="m1"]')
    assert line.count() == 1
    assert len(line.get_attribute("points").split()) >= 1
    assert "m1" in page.locator(".legend").inner_text()
    assert page.locator('#cost [data-field="cost_total"]').inner_text().startswith("$")
    screenshot(page, tmp_path, "dashboard")
    page.click("nav >> text=Sessions")
    rows = page.locator("#sessions tbody tr")
    assert rows.count() == 2
    # Newest first.
    assert rows.nth(0).get_attribute("data-session") == SID2
    assert rows.nth(1).locator(".title a").get_attribute("href") == f"/session/m1/{SID}"
    screenshot(page, tmp_path, "sessions")
    page.fill("input[name=project]", "alpha")
    page.click("button[type=submit]")
    assert page.locator("#sessions tbody tr").count() == 1
    assert page.syncd_errors == []

"""The session pages in a real browser (``syncd web`` as a process, chromium through
Playwright): the rendered transcript and its points, switching point, the restore plan
before the confirm that writes the file, resume's line and copy button, conflict copies
side by side, a live session updating without reload, and a hostile transcript running
nothing. A screenshot of each view under the test's tmp dir."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from syncd.claude import project_folder
from tests.browser import (  # noqa: F401 (fixtures)
    browser,
    env_of,
    page,
    screenshot,
    sync,
    wait_until,
    web,
)
from tests.helpers import write

S1 = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
S3 = "3c3eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
S4 = "4d4eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


def entry(sid: str, cwd: str, i: int, text: str, kind: str = "user") -> bytes:
    message: dict[str, Any] = {"role": kind, "content": text} if kind == "user" else \
        {"role": kind, "content": [{"type": "text", "text": text}]}
    doc = {"type": kind, "sessionId": sid, "cwd": cwd, "uuid": f"{sid[:8]}-{i}",
           "timestamp": f"2026-12-01T10:{i:02d}:00.000Z", "message": message}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def laptop(tmp_path: Path) -> tuple[dict[str, str], str]:
    """Machine "laptop": S1 backed up in two flushes; its env and S1's cwd there."""
    env = env_of(tmp_path, "laptop", HOME=str(tmp_path / "lhome"),
                 SYNCD_SOURCE=str(tmp_path / "lsrc"), SYNCD_STATE_DIR=str(tmp_path / "lstate"))
    cwd = str(tmp_path / "lhome" / "app")
    rel = f"projects/{project_folder(cwd)}/{S1}.jsonl"
    write(tmp_path / "lsrc", rel, entry(S1, cwd, 0, "the first prompt"))
    sync(env)
    write(tmp_path / "lsrc", rel, entry(S1, cwd, 1, "the second prompt"), "ab")
    sync(env)
    return env, cwd


def here(tmp_path: Path, sid: str) -> Path:
    """Where a session of laptop's lands in this machine's (m1's) tree."""
    cwd = str(tmp_path / "home" / "app")
    return tmp_path / "src" / "projects" / project_folder(cwd) / f"{sid}.jsonl"


def test_session_points_restore_and_resume(tmp_path: Path, web: Any,  # noqa: F811
                                           page: Any) -> None:  # noqa: F811
    laptop(tmp_path)
    w = web(env_of(tmp_path))
    page.goto(w.url)
    page.goto(f"{w.base}/session/laptop/{S1}")
    box = page.locator("#transcript")
    assert "the second prompt" in box.inner_text()
    points = page.locator("#points a[data-point]")
    assert points.count() == 3  # now, and the two flushes
    screenshot(page, tmp_path, "session")
    # The oldest point: the session as it was then.
    points.nth(2).click()
    page.wait_for_url("**?at=*")
    assert "the first prompt" in box.inner_text()
    assert "the second prompt" not in box.inner_text()
    screenshot(page, tmp_path, "session-point")
    # Restore here (as of that point): the plan first, nothing written.
    page.click("#restore-here")
    page.locator("#restore-plan").wait_for()  # the POST's page, not the one before it
    assert page.locator("#confirm").is_visible()
    assert not here(tmp_path, S1).exists()
    screenshot(page, tmp_path, "restore-plan")
    page.click("#confirm")
    page.locator("#restore-report").wait_for()
    data = here(tmp_path, S1).read_bytes()
    assert b"the first prompt" in data and b"the second prompt" not in data
    screenshot(page, tmp_path, "restore-report")
    # Resume: it is here now, so the line at once, with a copy button.
    page.goto(f"{w.base}/session/laptop/{S1}")
    page.click("#resume-here")
    line = f"cd {tmp_path / 'home' / 'app'} && claude --resume {S1}"
    assert page.locator("#resume-line").inner_text() == line
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=w.base)
    page.click("#copy-line")
    page.locator("#copied").wait_for(state="visible")
    assert page.evaluate("navigator.clipboard.readText()") == line
    screenshot(page, tmp_path, "resume")
    assert page.syncd_errors == []


def test_resume_restores_a_session_that_is_not_here(tmp_path: Path, web: Any,  # noqa: F811
                                                    page: Any) -> None:  # noqa: F811
    laptop(tmp_path)
    w = web(env_of(tmp_path))
    page.goto(w.url)
    page.goto(f"{w.base}/session/laptop/{S1}")
    page.click("#resume-here")
    page.locator("#restore-plan").wait_for()  # the POST's page, not the one before it
    assert page.locator("#resume-line").count() == 0
    assert not here(tmp_path, S1).exists()
    page.click("#confirm")
    assert page.locator("#resume-line").inner_text().endswith(f"claude --resume {S1}")
    assert b"the second prompt" in here(tmp_path, S1).read_bytes()


def test_conflict_copies_side_by_side(tmp_path: Path, web: Any, page: Any  # noqa: F811
                                      ) -> None:
    cwd = "/home/u/app"
    rel = f"projects/{project_folder(cwd)}/{S1}.jsonl"
    local = write(tmp_path / "src", rel, entry(S1, cwd, 0, "local words"))
    old = time.time() - 3600
    os.utime(local, (old, old))
    second = tmp_path / "state" / "conflicts" / "laptop" / "20261201T101010"
    write(second, rel, entry(S1, cwd, 0, "copy words <script>window.__pwned=1</script>"))
    write(second, "notes.txt", b"<img src=x onerror=window.__pwned=1>\n")
    write(tmp_path / "src", "notes.txt", b"plain\n")
    sync(env_of(tmp_path))
    w = web(env_of(tmp_path))
    page.goto(w.url)
    page.goto(f"{w.base}/conflicts")
    pair = page.locator(".side-by-side")
    assert pair.count() == 1
    assert "local words" in pair.locator(".side.local").inner_text()
    assert "copy words" in pair.locator(".side.copy").inner_text()
    assert "<img src=x" in page.locator("pre.diff").inner_text()
    screenshot(page, tmp_path, "conflicts")
    assert page.evaluate("typeof window.__pwned") == "undefined"
    section = page.locator(".conflict", has=page.locator(".side-by-side"))
    section.locator(".keep-copy").click()
    assert "is now the copy from laptop" in page.locator("#done").inner_text()
    assert b"copy words" in local.read_bytes()
    # The local one was kept as a copy of this machine's: no byte lost.
    saved = list((tmp_path / "state" / "conflicts" / "m1").rglob(f"{S1}.jsonl"))
    assert len(saved) == 1 and b"local words" in saved[0].read_bytes()
    assert page.evaluate("typeof window.__pwned") == "undefined"


def test_a_live_session_updates_without_reload(tmp_path: Path, web: Any,  # noqa: F811
                                               page: Any) -> None:  # noqa: F811
    cwd = "/home/u/app"
    path = write(tmp_path / "src", f"projects/{project_folder(cwd)}/{S4}.jsonl",
                 entry(S4, cwd, 0, "an early prompt"))
    sync(env_of(tmp_path))
    w = web(env_of(tmp_path))
    page.goto(w.url)
    page.goto(f"{w.base}/session/m1/{S4}")
    page.evaluate("window.__same_page = 1")
    assert "an early prompt" in page.locator("#transcript").inner_text()
    write(tmp_path / "src", os.fspath(path.relative_to(tmp_path / "src")),
          entry(S4, cwd, 1, "a later answer", "assistant"), "ab")
    # The static script polls the size every 2 s and reloads the fragment when it grew.
    wait_until(lambda: "a later answer" in page.locator("#transcript").inner_text(), 30,
               "the new line on the page")
    assert page.evaluate("window.__same_page") == 1  # no reload
    screenshot(page, tmp_path, "live")


def test_a_hostile_transcript_runs_nothing(tmp_path: Path, web: Any,  # noqa: F811
                                           page: Any) -> None:  # noqa: F811
    env = env_of(tmp_path, "laptop", HOME=str(tmp_path / "lhome"),
                 SYNCD_SOURCE=str(tmp_path / "lsrc"), SYNCD_STATE_DIR=str(tmp_path / "lstate"))
    cwd = "/home/evil/<img src=x onerror=window.__pwned=1>"
    write(tmp_path / "lsrc", f"projects/{project_folder(cwd)}/{S3}.jsonl", b"".join([
        entry(S3, cwd, 0, "look: <script>window.__pwned=1</script>"),
        entry(S3, cwd, 1, '<img src=x onerror="window.__pwned=1"> and '
              "[click me](javascript:window.__pwned=1)", "assistant"),
        entry(S3, cwd, 2, '<a href="javascript:window.__pwned=1">raw link</a>'),
    ]))
    sync(env)
    w = web(env_of(tmp_path))
    page.goto(w.url)
    page.goto(f"{w.base}/session/laptop/{S3}")
    text = page.locator("#transcript").inner_text()
    assert "<script>window.__pwned=1</script>" in text  # shown as text
    assert '<img src=x onerror="window.__pwned=1">' in text
    assert page.locator("#transcript script, #transcript img").count() == 0
    for link in page.locator("#transcript a").all():
        href = link.get_attribute("href") or ""
        assert not href.lower().startswith("javascript:")
    if page.locator("#transcript a", has_text="click me").count():
        page.locator("#transcript a", has_text="click me").click()
    page.click("#restore-here")  # the plan names the hostile path: escaped too
    screenshot(page, tmp_path, "hostile")
    assert page.evaluate("typeof window.__pwned") == "undefined"


def test_a_long_session_loads_its_parts_on_demand(tmp_path: Path, web: Any,  # noqa: F811
                                                  page: Any) -> None:  # noqa: F811
    cwd = "/home/u/app"
    hostile = '<img src=x onerror="window.__pwned=1"> <script>window.__pwned=1</script>'
    write(tmp_path / "src", f"projects/{project_folder(cwd)}/{S4}.jsonl", b"".join(
        entry(S4, cwd, n % 60, f"marker-{n}- {hostile} " + "**word** " * 220)
        for n in range(300)))
    sync(env_of(tmp_path))
    w = web(env_of(tmp_path))
    page.goto(w.url)
    page.goto(f"{w.base}/session/m1/{S4}")
    page.evaluate("window.__same_page = 1")

    def shown(text: str) -> bool:  # textContent: no layout of a long page to wait for
        return bool(page.evaluate(
            "t => document.getElementById('transcript').textContent.includes(t)", text))

    assert shown("marker-0-") and not shown("marker-299-")
    first = int(page.locator(".more").first.get_attribute("data-from") or "0")
    screenshot(page, tmp_path, "parts")
    page.click(".more-next")
    wait_until(lambda: shown(f"marker-{first}-"), 30, "the next part")
    assert not shown("marker-299-")
    page.click(".more-all")
    wait_until(lambda: shown("marker-299-"), 30, "the rest")
    assert page.locator(".more").count() == 0
    assert page.locator("#transcript script, #transcript img").count() == 0
    assert page.evaluate("window.__same_page") == 1  # no reload
    assert page.evaluate("typeof window.__pwned") == "undefined"

"""Helpers for end-to-end tests with the real Claude Code CLI (tests/test_e2e_claude.py,
tests/test_follow_e2e.py, tests/test_e2e_picker.py).

The CLI is installed once with npm into a cache directory and run against the loopback
stand-in for the Messages API (tests/standin.py), with an isolated HOME per machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import wait_for
from tests.standin import Block, Responder, StandIn
from tests.terminal import Terminal

CLAUDE_VERSION = "2.1.332"
CLAUDE_PACKAGE = f"@anthropic-ai/claude-code@{CLAUDE_VERSION}"
CLAUDE_TIMEOUT = 120.0
SYNCD_TIMEOUT = 300.0


def cache_dir() -> Path:
    base = os.environ.get("SYNCD_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "syncd-tests")
    return Path(base) / f"claude-code-{CLAUDE_VERSION}"


def _binary(prefix: Path) -> Path:
    return prefix / "node_modules" / "@anthropic-ai" / "claude-code" / "bin" / "claude.exe"


def _version_ok(binary: Path) -> bool:
    if not binary.is_file():
        return False
    try:
        with tempfile.TemporaryDirectory() as home:
            r = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                               timeout=60, env={"PATH": os.environ.get("PATH", ""), "HOME": home})
    except OSError:
        return False
    return r.returncode == 0 and CLAUDE_VERSION in r.stdout


def install_claude(npm: str) -> Path:
    """The native CLI binary, installed with ``npm install --prefix <cache>`` on first use.

    A failed install raises (a test error, not a skip). Concurrent test runs share the
    cache under a file lock.
    """
    prefix = cache_dir()
    prefix.mkdir(parents=True, exist_ok=True)
    binary = _binary(prefix)
    with open(prefix.parent / f".{prefix.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _version_ok(binary):
            return binary
        r = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                            "--loglevel=error", CLAUDE_PACKAGE],
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"npm install {CLAUDE_PACKAGE} failed ({r.returncode}):\n"
                               f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        if not _version_ok(binary):
            raise RuntimeError(f"npm install {CLAUDE_PACKAGE} left no working binary at {binary}"
                               f"\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return binary


# -- running the CLI -----------------------------------------------------------------


@dataclass
class Run:
    """One CLI invocation and everything the stand-in received during it."""

    args: list[str]
    cwd: Path
    returncode: int
    stdout: str
    stderr: str
    requests: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> str:
        counts = [len(r.get("messages", [])) for r in self.requests]
        return (f"`claude {' '.join(self.args)}` in {self.cwd}: exit {self.returncode}, "
                f"{len(self.requests)} request(s) with {counts} messages\n"
                f"  stdout: {self.stdout.strip()[-600:]!r}\n"
                f"  stderr: {self.stderr.strip()[-600:]!r}")


class Claude:
    def __init__(self, binary: Path) -> None:
        self.binary = binary

    def env(self, home: Path, url: str) -> dict[str, str]:
        """A clean environment: nothing of the caller's Claude or Anthropic settings leaks in."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "LANG": "C.UTF-8", "SHELL": "/bin/bash", "TERM": "dumb",
               "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "dummy",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
               "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1"}
        if os.environ.get("TMPDIR"):
            env["TMPDIR"] = os.environ["TMPDIR"]
        return env

    def run(self, home: Path, cwd: Path, *args: str, respond: Responder | None = None) -> Run:
        """``claude -p ARGS`` in ``cwd`` under ``HOME=home`` against a fresh stand-in."""
        argv = ["-p", *args]
        with StandIn(respond=respond) as standin:
            r = subprocess.run([str(self.binary), *argv], cwd=cwd,
                               env=self.env(home, standin.url), capture_output=True, text=True,
                               timeout=CLAUDE_TIMEOUT, stdin=subprocess.DEVNULL)
            requests = list(standin.requests)
        return Run(argv, cwd, r.returncode, r.stdout, r.stderr, requests)

    def shell(self, home: Path, line: str) -> Run:
        """Run a printed ``cd … && claude …`` line in bash; ``claude`` means ``claude -p … ok``."""
        with StandIn() as standin:
            env = self.env(home, standin.url) | {"CLAUDE_BIN": str(self.binary)}
            script = 'claude() { "$CLAUDE_BIN" -p "$@" ok; }\n' + line
            r = subprocess.run(["bash", "-c", script], cwd=home, env=env, capture_output=True,
                               text=True, timeout=CLAUDE_TIMEOUT, stdin=subprocess.DEVNULL)
            requests = list(standin.requests)
        return Run(["(bash)", line], home, r.returncode, r.stdout, r.stderr, requests)


def recorded_session(home: Path, folder: str) -> str:
    """The id of the only transcript the CLI wrote into ``projects/<folder>``."""
    d = home / ".claude" / "projects" / folder
    found = sorted(p.stem for p in d.glob("*.jsonl")) if d.is_dir() else []
    if len(found) != 1:
        listing = sorted(str(p.relative_to(home)) for p in (home / ".claude").rglob("*.jsonl"))
        raise AssertionError(f"expected one transcript in {d}, found {found}; all: {listing}")
    return found[0]


# -- what the CLI sent ---------------------------------------------------------------


def message_counts(requests: list[dict[str, Any]]) -> list[int]:
    return [len(r.get("messages", [])) for r in requests]


def thinking_blocks(requests: list[dict[str, Any]]) -> list[Block]:
    """Every thinking/redacted_thinking block of every request, in order."""
    out = []
    for r in requests:
        for m in r.get("messages", []):
            content = m.get("content")
            if isinstance(content, list):
                out.extend(b for b in content if isinstance(b, dict)
                           and b.get("type") in ("thinking", "redacted_thinking"))
    return out


def strings_outside_thinking(requests: list[dict[str, Any]]) -> str:
    """Every string in the requests' messages, one a line, thinking blocks left out."""
    out: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, list):
            for y in x:
                walk(y)
        elif isinstance(x, dict) and x.get("type") not in ("thinking", "redacted_thinking"):
            for y in x.values():
                walk(y)
    for r in requests:
        walk(r.get("messages", []))
    return "\n".join(out)


def _user_texts(request: dict[str, Any]) -> list[str]:
    out = []
    for m in request.get("messages", []):
        if m.get("role") == "user":
            c = m.get("content")
            out.append(c if isinstance(c, str) else "\n".join(
                b.get("text", "") for b in c or [] if isinstance(b, dict)))
    return out


def last_user_text(request: dict[str, Any]) -> str:
    texts = _user_texts(request)
    return texts[-1] if texts else ""


def first_user_text(request: dict[str, Any]) -> str:
    texts = _user_texts(request)
    return texts[0] if texts else ""


# -- scripted sessions -----------------------------------------------------------------

SUBAGENT_MARK = "SUBAGENT-TASK"


def tool_script(project: Path) -> Responder:
    """A main turn that thinks, reads a file, runs a big Bash command (its output is
    persisted under ``<sid>/tool-results/``), starts a subagent (``<sid>/subagents/``)
    that runs ``pwd``, and then answers."""
    def respond(body: dict[str, Any]) -> list[Block]:
        done = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        if SUBAGENT_MARK in first_user_text(body):
            if done == 0:
                return [{"type": "tool_use", "id": "toolu_sub_pwd", "name": "Bash",
                         "input": {"command": "pwd", "description": "Print the directory"}}]
            return [{"type": "text", "text": "subagent done"}]
        steps: list[list[Block]] = [
            [{"type": "thinking", "signature": "c3RhbmQtaW4tc2lnbmF0dXJlLTE=",
              "thinking": f"The notes are in {project}/notes.txt; read them first."},
             {"type": "tool_use", "id": "toolu_read_notes", "name": "Read",
              "input": {"file_path": f"{project}/notes.txt"}}],
            [{"type": "tool_use", "id": "toolu_bash_big", "name": "Bash",
              "input": {"command": "pwd; seq 1 8000", "description": "Print dir and numbers"}}],
            [{"type": "tool_use", "id": "toolu_agent", "name": "Agent",
              "input": {"description": "Check the directory", "subagent_type": "general-purpose",
                        "prompt": f"{SUBAGENT_MARK}: print the working directory"}}],
            [{"type": "text", "text": "all done"}],
        ]
        return steps[min(done, len(steps) - 1)]
    return respond


# -- files -----------------------------------------------------------------------------


def first_cwd(transcript: Path) -> str:
    with open(transcript, "rb") as f:
        for line in f:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("cwd"), str):
                return str(doc["cwd"])
    raise AssertionError(f"no cwd in {transcript}")


def json_lines(path: Path) -> list[Any]:
    out = []
    with open(path, "rb") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append(None)
    return out


def files_under(root: Path) -> dict[str, bytes]:
    if not root.is_dir():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


@contextlib.contextmanager
def pristine(root: Path) -> Iterator[None]:
    """Put ``root`` back as it was afterwards (a CLI run appends to the session it resumes,
    or starts a new one when it does not find it)."""
    before = files_under(root)
    try:
        yield
    finally:
        if root.is_dir():
            for p in sorted(root.rglob("*"), reverse=True):
                rel = str(p.relative_to(root))
                if p.is_file() and rel not in before:
                    p.unlink()
        for rel, data in before.items():
            p = root / rel
            if not p.is_file() or p.read_bytes() != data:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)


def git(cwd: Path, *args: str) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd),
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def git_repo_with_worktree(repo: Path, slug: str | None) -> Path | None:
    """A git repository with one commit and, if ``slug``, a worktree at
    ``.claude/worktrees/<slug>`` (where ``claude --worktree`` puts them)."""
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "README.md").write_text("demo\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", "init")
    if slug is None:
        return None
    git(repo, "worktree", "add", "-q", "-b", slug, f".claude/worktrees/{slug}")
    return repo / ".claude" / "worktrees" / slug


# -- syncd -----------------------------------------------------------------------------


def syncd_env(home: Path, store: Path, machine: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "LANG": "C.UTF-8", "SYNCD_SOURCE": str(home / ".claude"),
           "SYNCD_STORE": store.as_uri(), "SYNCD_STATE_DIR": str(home / "state"),
           "SYNCD_MACHINE_ID": machine, "SYNCD_CONFIG": os.devnull}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def syncd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m syncd ARGS``, run from the machine's home (not from the repository)."""
    Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "syncd", *args], env=env, cwd=env["HOME"],
                          capture_output=True, text=True, timeout=SYNCD_TIMEOUT,
                          stdin=subprocess.DEVNULL)


def show(r: subprocess.CompletedProcess[str]) -> str:
    return (f"`syncd {' '.join(r.args[3:])}` exit {r.returncode}\n"
            f"  stdout: {r.stdout.strip()[-1500:]}\n  stderr: {r.stderr.strip()[-1500:]}")


def copy_tree(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, symlinks=True)


# -- the CLI in a terminal -------------------------------------------------------------

# The interactive CLI asks once whether to use a key from ANTHROPIC_API_KEY; the answer is
# kept in ~/.claude.json by the key's last 20 characters.
API_KEY = "sk-ant-api03-loopback-stand-in-key-0123456789"


def skip_first_run(home: Path, *projects: Path) -> None:
    """Write ``home/.claude.json`` as the CLI leaves it after its first-run screens:
    onboarding (the theme) done, the stand-in's key approved, each project trusted."""
    path = home / ".claude.json"
    doc: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    doc |= {"hasCompletedOnboarding": True, "theme": "dark",
            "customApiKeyResponses": {"approved": [API_KEY[-20:]], "rejected": []}}
    trusted = doc.setdefault("projects", {})
    for p in projects:
        trusted.setdefault(str(p), {})["hasTrustDialogAccepted"] = True
    home.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))


def answer_to(prompt: str) -> str:
    return f"answer to {prompt}"


PROMPT_LINE = "\u276f "  # the mark of the CLI's input line and the picker's selected row
NO_SESSIONS = "No sessions in this project yet"  # what the picker shows for none


@dataclass
class Picker:
    """The ``/resume`` picker as the screen shows it: under the search box a line naming
    the project, then per session a title row (PROMPT_LINE marks the selected one) and a line
    like ``2 seconds ago · HEAD · 159.6KB`` (or "No sessions in this project yet"); a help
    line ("Ctrl+A to show all projects · …") ends it."""

    screen: str
    rows: list[str]          # the picker's lines between the search box and the help line
    titles: list[str]
    selected: str | None

    @staticmethod
    def read(screen: str) -> Picker | None:
        lines = screen.splitlines()
        top = next((i for i, ln in enumerate(lines) if ln.strip() == "Resume session"), None)
        if top is None:
            return None
        box = next((i for i in range(top, len(lines)) if lines[i].strip().startswith("╰")),
                   None)
        end = next((i for i in range(top, len(lines)) if "Ctrl+A to show all" in lines[i]),
                   None)
        if box is None or end is None:
            return None
        rows = [ln.strip() for ln in lines[box + 1:end] if ln.strip()]
        titles, selected = [], None
        for row, after in zip(rows, [*rows[1:], ""], strict=True):
            if " · " not in after:
                continue
            title = row.removeprefix(PROMPT_LINE)
            titles.append(title)
            if row.startswith(PROMPT_LINE):
                selected = title
        return Picker(screen, rows, titles, selected)


class Interactive:
    """``claude ARGS`` as a person runs it: in a terminal (tests/terminal.py), in ``cwd``
    under ``HOME=home``, against its own stand-in. Typed prompts are answered with
    ``answer to <prompt>``."""

    def __init__(self, binary: Path, home: Path, cwd: Path, *args: str) -> None:
        self.binary, self.home, self.cwd, self.args = binary, home, cwd, args
        self.prompts: list[str] = []
        self.standin = StandIn(respond=self._answer)
        self.term: Terminal | None = None

    def _answer(self, body: dict[str, Any]) -> list[Block]:
        text = last_user_text(body)
        prompt = next((p for p in reversed(self.prompts) if p in text), None)
        return [{"type": "text", "text": "ok" if prompt is None else answer_to(prompt)}]

    def __enter__(self) -> Interactive:
        self.standin.__enter__()
        env = Claude(self.binary).env(self.home, self.standin.url)
        env |= {"ANTHROPIC_API_KEY": API_KEY, "TERM": "xterm-256color"}
        try:
            self.term = Terminal([str(self.binary), *self.args], self.cwd, env)
            self.term.wait_screen(f"Claude Code v{CLAUDE_VERSION}", "the CLI to start",
                                  timeout=CLAUDE_TIMEOUT)
            self._wait_line(PROMPT_LINE.strip(), "the CLI's empty input line")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.term is not None:
            self.term.close()
        self.standin.__exit__()

    @property
    def terminal(self) -> Terminal:
        assert self.term is not None
        return self.term

    def _wait_line(self, line: str, what: str) -> str:
        def shown() -> str:
            s = self.terminal.screen()
            return s if any(ln.strip() == line for ln in s.splitlines()) else ""
        found: str = wait_for(shown, CLAUDE_TIMEOUT, what, interval=0.2,
                              explain=self.terminal.explain)
        return found

    def submit(self, text: str) -> None:
        """Type ``text`` into the input line, see it there, and press Enter."""
        self.terminal.type(text)
        self._wait_line(PROMPT_LINE + text, f"{text!r} in the input line")
        self.terminal.key("Enter")

    def ask(self, prompt: str) -> dict[str, Any]:
        """Submit ``prompt``; the request that carried it, once its answer is on screen."""
        seen = len(self.standin.requests)
        self.prompts.append(prompt)
        self.submit(prompt)

        def sent() -> dict[str, Any] | None:
            return next((r for r in self.standin.requests[seen:]
                         if prompt in last_user_text(r)), None)
        request: dict[str, Any] = wait_for(sent, CLAUDE_TIMEOUT, f"the stand-in to get {prompt!r}",
                                           interval=0.2, explain=self.terminal.explain)
        self.terminal.wait_screen(answer_to(prompt), f"the answer to {prompt!r}",
                                  timeout=CLAUDE_TIMEOUT)
        return request

    def picker(self) -> Picker:
        """``/resume``: the session picker once it has listed the sessions."""
        self.submit("/resume")

        def listed() -> Picker | None:
            p = Picker.read(self.terminal.screen())
            done = p is not None and (p.selected is not None or NO_SESSIONS in p.rows)
            return p if done else None
        found: Picker = wait_for(listed, CLAUDE_TIMEOUT, "the /resume picker to list sessions",
                                 interval=0.2, explain=self.terminal.explain)
        return found

    def exit(self) -> None:
        """``/exit``, and wait for the CLI to end (it has written its transcript then)."""
        self.submit("/exit")
        self.terminal.wait_exit("the CLI to exit after /exit", timeout=CLAUDE_TIMEOUT)

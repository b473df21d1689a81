"""Helpers for end-to-end tests with the real Claude Code CLI (tests/test_e2e_claude.py).

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

from tests.standin import Block, Responder, StandIn

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

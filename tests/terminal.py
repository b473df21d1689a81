"""A program driven through a terminal: one private tmux server per program.

The end-to-end picker tests (tests/test_e2e_picker.py) run the real Claude Code CLI
interactively, which ``claude -p`` is not: they type into it with ``send-keys`` and read
the screen with ``capture-pane``. Each terminal has its own socket in its own directory,
so no tmux server of the user's is touched and none is left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from tests.helpers import wait_for

TMUX_TIMEOUT = 30.0


class Terminal:
    """``argv`` running in a detached tmux pane (``width`` columns, ``height`` lines), in
    ``cwd``, with exactly ``env`` (the server is started with it, so nothing of the
    caller's leaks in)."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str],
                 width: int = 200, height: int = 50) -> None:
        tmux = shutil.which("tmux")
        if tmux is None:
            raise RuntimeError("tmux is not on PATH")
        self.tmux = tmux
        self.argv = argv
        # A short path: a unix socket's name is limited to about 100 bytes.
        self._dir = Path(tempfile.mkdtemp(prefix="syncd-tmux-", dir="/tmp"))
        self.socket = self._dir / "sock"
        self.env = env
        self.pid: int | None = None
        # Not the user's configuration; the pane stays when the program exits, so its
        # last screen can still be read.
        conf = self._dir / "tmux.conf"
        conf.write_text("set-option -g remain-on-exit on\n")
        try:
            self._run("-f", str(conf), "new-session", "-d", "-s", "main", "-x", str(width),
                      "-y", str(height), "-c", str(cwd), "--", *argv)
            self.pid = int(self._run("display-message", "-p", "-t", "main",
                                     "#{pane_pid}").stdout)
        except BaseException:
            self.close()
            raise

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([self.tmux, "-S", str(self.socket), *args], env=self.env,
                           capture_output=True, text=True, timeout=TMUX_TIMEOUT,
                           stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)}: exit {r.returncode}: {r.stderr}")
        return r

    def screen(self) -> str:
        """What the pane shows now, wrapped lines joined, trailing blanks dropped and
        no-break spaces as spaces (Claude's input line puts one after its prompt mark)."""
        r = self._run("capture-pane", "-p", "-J", "-t", "main", check=False)
        text = r.stdout.replace("\u00a0", " ")
        return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n")

    def type(self, text: str) -> None:
        """Keys typed as they are (``send-keys -l``: no key names)."""
        self._run("send-keys", "-t", "main", "-l", text)

    def key(self, *names: str) -> None:
        """Named keys (``Enter``, ``Escape``, ``C-c``, ``Down``)."""
        self._run("send-keys", "-t", "main", *names)

    def exited(self) -> bool:
        """Whether the program has exited (its pane is dead)."""
        r = self._run("display-message", "-p", "-t", "main", "#{pane_dead}", check=False)
        return r.returncode != 0 or r.stdout.strip() == "1"

    def wait_screen(self, text: str, what: str, timeout: float = 60.0) -> str:
        """The screen once it shows ``text`` (fails with the last screen after ``timeout``)."""
        def shown() -> str:
            s = self.screen()
            return s if text in s else ""
        found: str = wait_for(shown, timeout, what, interval=0.2, explain=self.explain)
        return found

    def wait_exit(self, what: str, timeout: float = 60.0) -> None:
        wait_for(self.exited, timeout, what, interval=0.2, explain=self.explain)

    def explain(self) -> str:
        return f"--- the screen of `{' '.join(self.argv)[-120:]}` ---\n{self.screen()}"

    def close(self) -> None:
        """Kill the server (which hangs up on the program) and remove its socket; the
        program is killed if it outlives the hang-up."""
        if self.socket.exists():
            self._run("kill-server", check=False)
        pid = self.pid
        if pid is not None:
            try:
                wait_for(lambda: not _alive(pid), 10.0, f"pid {pid} to exit")
            except AssertionError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self._dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie does not: tmux, its parent, reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False

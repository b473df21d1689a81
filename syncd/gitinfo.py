"""What git says about a project directory: its remote and its worktrees.

Recorded by the backing-up machine so that a restore elsewhere can find the
local clone of the same repository (see ``restore/remap.py``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

_TIMEOUT = 5.0


def _git(cwd: str, *args: str) -> str | None:
    git = shutil.which("git")
    if git is None:
        return None
    try:
        r = subprocess.run([git, "-C", cwd, *args], capture_output=True, text=True,
                           timeout=_TIMEOUT, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def project_info(cwd: str) -> dict[str, Any] | None:
    """``{"toplevel", "remote", "main", "worktrees": [{"path", "branch"}]}`` or None."""
    if not os.path.isdir(cwd):
        return None
    top = _git(cwd, "rev-parse", "--show-toplevel")
    if not top:
        return None
    worktrees: list[dict[str, str]] = []
    for block in (_git(cwd, "worktree", "list", "--porcelain") or "").split("\n\n"):
        item: dict[str, str] = {}
        for line in block.splitlines():
            key, _, value = line.partition(" ")
            if key == "worktree":
                item["path"] = value
            elif key == "branch":
                item["branch"] = value.removeprefix("refs/heads/")
        if "path" in item:
            worktrees.append(item)
    remote = _git(cwd, "config", "--get", "remote.origin.url")
    return {"toplevel": top, "remote": None if remote is None else without_userinfo(remote),
            "main": worktrees[0]["path"] if worktrees else top, "worktrees": worktrees}


def without_userinfo(url: str) -> str:
    """A remote URL without a credential in it: ``https://<token>@host/…`` or any
    ``user:password@`` (what CI and some devcontainers write) would put it into the
    store; matching ignores user info (``normalize_remote``). An ssh user (``git@``) is
    no secret and stays."""
    url = url.strip()
    m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*://)([^@/]*)@", url)
    if m and (":" in m[2] or m[1].lower() in ("http://", "https://")):
        return m[1] + url[m.end():]
    return url


def normalize_remote(url: str) -> str:
    """One spelling for one repository: git@host:o/r.git, https://host/o/r, ssh://… alike."""
    u = url.strip().rstrip("/")
    u = re.sub(r"\.git$", "", u)
    m = re.match(r"^[\w.-]+@([\w.-]+):(.+)$", u)  # scp-like syntax
    if m:
        return f"{m.group(1)}/{m.group(2)}".lower()
    u = re.sub(r"^[a-z+]+://", "", u)
    u = re.sub(r"^[^@/]+@", "", u)  # user info
    u = re.sub(r"^([^/:]+):\d+/", r"\1/", u)  # port
    return u.lower()


def find_clones(roots: list[str], depth: int = 3) -> dict[str, str]:
    """Local clones under ``roots``: normalized remote → top-level path, its real path
    (what Claude started there records as its cwd and names its project folder by, when
    a root or the clone is reached through a symlink)."""
    found: dict[str, str] = {}
    for root in roots:
        root = os.path.expanduser(root)
        base_depth = root.rstrip("/").count("/")
        for dirpath, dirnames, _files in os.walk(root):
            if ".git" in dirnames or os.path.isfile(os.path.join(dirpath, ".git")):
                remote = _git(dirpath, "config", "--get", "remote.origin.url")
                if remote:
                    found.setdefault(normalize_remote(remote), os.path.realpath(dirpath))
                dirnames[:] = []
                continue
            if dirpath.count("/") - base_depth >= depth:
                dirnames[:] = []
            else:
                # In name order: of two clones of one repository, always the same one.
                dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                                     and d != "node_modules")
    return found

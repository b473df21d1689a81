"""Sessions from the official Claude Code devcontainer, restored on the host.

In the container ``~/.claude`` is a volume (``CLAUDE_CONFIG_DIR=/home/node/.claude``) and
the repository is at ``/workspace``: every session is ``projects/-workspace`` with its cwd
under ``/workspace``. The container backs up as a machine of its own (syncd's shipper, its
home ``/home/node``, its git facts as git in the container gives them). On the host the
checkout of the same repository is elsewhere (``~/src/app``); a restore, or follow, must
put the session in the folder Claude derives from that checkout's real path, every cwd
rewritten, found either by the git remote (``project_roots``) or by a ``[remap]`` rule
(README "Sessions from a devcontainer").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from syncd.backup import ship
from syncd.backup.engine import sync_once
from syncd.claude import project_folder
from syncd.config import load_settings
from syncd.restore.remap import Remapper, Rule
from tests.claude_fixtures import Claude, first_user_text, message_counts, show, syncd, syncd_env
from tests.test_follow import Machine

CONTAINER = "app-devcontainer"
CONTAINER_HOME = "/home/node"
WORKSPACE = "/workspace"
REMOTE = "git@github.com:acme/app.git"
SID = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _entry(i: int, cwd: str) -> bytes:
    return json.dumps({"type": "user", "uuid": f"00000000-0000-4000-8000-00000000000{i}",
                       "sessionId": SID, "cwd": cwd,
                       "timestamp": f"2026-11-0{i + 1}T10:00:00.000Z",
                       "message": {"role": "user", "content": f"look at {cwd}/main.py"}},
                      separators=(",", ":")).encode() + b"\n"


def container_transcript() -> bytes:
    """What Claude in the container writes: started in /workspace, then in a subdirectory."""
    return _entry(0, WORKSPACE) + _entry(1, f"{WORKSPACE}/src")


def container_backup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     remote: str | None, transcript: bytes | None = None,
                     sid: str = SID) -> Path:
    """The container's tree backed up by syncd's own shipper into ``tmp_path/store``, as
    the container ships it: its home /home/node, ``$CLAUDE_CONFIG_DIR`` the volume, and
    git's facts of /workspace (``remote``: its origin; None: git refused the mount, as it
    does a checkout owned by another user, so there are none)."""
    volume = tmp_path / "volume"  # mounted at /home/node/.claude in the container
    folder = volume / "projects" / project_folder(WORKSPACE)
    folder.mkdir(parents=True)
    (folder / f"{sid}.jsonl").write_bytes(transcript or container_transcript())
    (volume / "history.jsonl").write_bytes(json.dumps(
        {"display": "look", "project": WORKSPACE, "sessionId": sid, "timestamp": 1},
        separators=(",", ":")).encode() + b"\n")
    facts = {"toplevel": WORKSPACE, "remote": remote, "main": WORKSPACE,
             "worktrees": [{"path": WORKSPACE, "branch": "main"}]}
    monkeypatch.setattr(ship, "project_info", lambda cwd: facts if remote and (
        cwd == WORKSPACE or cwd.startswith(WORKSPACE + "/")) else None)
    with monkeypatch.context() as m:
        m.setenv("HOME", CONTAINER_HOME)
        m.setenv("CLAUDE_CONFIG_DIR", str(volume))
        sync_once(load_settings(config_file=tmp_path / "none.toml",
                                store=(tmp_path / "store").as_uri(),
                                state_dir=tmp_path / "container-state", machine_id=CONTAINER))
    return tmp_path / "store"


def host_checkout(home: Path, remote: str = "https://github.com/acme/app") -> Path:
    """The host's clone of the repository at ~/src/app, and ~/code a symlink to ~/src."""
    checkout = home / "src" / "app"
    checkout.mkdir(parents=True)
    for args in (("init", "-q"), ("remote", "add", "origin", remote)):
        subprocess.run(["git", "-C", str(checkout), *args], check=True, capture_output=True)
    (home / "code").symlink_to(home / "src")
    return checkout


def assert_placed(tree: Path, checkout: Path, history: bool = True) -> None:
    """The session is in the folder Claude derives from the checkout (its real path), every
    cwd rewritten to it, and nothing of /workspace is left in the tree."""
    real = os.path.realpath(checkout)
    folders = sorted(p.name for p in (tree / "projects").iterdir())
    assert folders == [project_folder(real)], folders
    transcript = tree / "projects" / project_folder(real) / f"{SID}.jsonl"
    cwds = [json.loads(line)["cwd"] for line in transcript.read_bytes().splitlines()]
    assert cwds == [real, f"{real}/src"]
    if history:  # (follow brings sessions, not history lines)
        assert json.loads((tree / "history.jsonl").read_bytes())["project"] == real
    for p in (tree / "projects").rglob("*"):
        if p.is_file():
            assert WORKSPACE.encode() + b"/" not in p.read_bytes() and \
                b'"' + WORKSPACE.encode() + b'"' not in p.read_bytes(), p


def restore_on_host(tmp_path: Path, config: str, *args: str
                    ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``syncd restore --machine app-devcontainer ARGS`` on the host with ``config``."""
    home = tmp_path / "host"
    env = syncd_env(home, tmp_path / "store", "host")
    (home / "syncd.toml").write_text(config)
    env["SYNCD_CONFIG"] = str(home / "syncd.toml")
    r = syncd(env, "restore", "--machine", CONTAINER, *args)
    assert r.returncode == 0, show(r)
    return home / ".claude", r


@needs_git
@pytest.mark.parametrize("root", ["~/src", "~/code"], ids=["checkout", "through-a-symlink"])
def test_the_git_remote_puts_a_container_session_in_the_host_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root: str) -> None:
    container_backup(tmp_path, monkeypatch, REMOTE)
    checkout = host_checkout(tmp_path / "host")
    tree, r = restore_on_host(tmp_path, f'project_roots = ["{root}"]\n')
    assert "same git remote" in r.stdout, show(r)
    assert_placed(tree, checkout)


@needs_git
def test_a_session_restored_to_workspace_before_moves_to_the_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Restored once with no rule (it lands in projects/-workspace, no checkout of which
    is here), then with project_roots: the copy moves, not a second one."""
    container_backup(tmp_path, monkeypatch, REMOTE)
    checkout = host_checkout(tmp_path / "host")
    tree, _ = restore_on_host(tmp_path, "")
    assert (tree / "projects" / project_folder(WORKSPACE) / f"{SID}.jsonl").is_file()
    tree, _ = restore_on_host(tmp_path, 'project_roots = ["~/src"]\n')
    # (history.jsonl is a union of lines: the first restore's stays.)
    assert_placed(tree, checkout, history=False)


@needs_git
@pytest.mark.parametrize("target", ["~/src/app", "~/code/app"],
                         ids=["checkout", "through-a-symlink"])
def test_a_remap_rule_puts_a_container_session_in_the_host_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    """No git facts from the container (git there refused the bind-mounted checkout): the
    README's ``[remap]`` recipe."""
    container_backup(tmp_path, monkeypatch, None)
    checkout = host_checkout(tmp_path / "host")
    tree, r = restore_on_host(tmp_path, f'project_roots = ["~/src"]\n\n[remap]\n'
                                        f'"{WORKSPACE}" = "{target}"\n')
    assert "config remap" in r.stdout, show(r)
    assert_placed(tree, checkout)


@needs_git
def test_map_puts_a_container_session_in_the_host_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several containers (each its own repository at /workspace): ``--map`` per restore."""
    container_backup(tmp_path, monkeypatch, None)
    checkout = host_checkout(tmp_path / "host")
    tree, _ = restore_on_host(tmp_path, "", "--map", f"{WORKSPACE}=~/code/app")
    assert_placed(tree, checkout)


@needs_git
def test_following_the_container_puts_its_session_in_the_host_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    container_backup(tmp_path, monkeypatch, REMOTE)
    host = Machine(tmp_path, "host", "/host", follow=[CONTAINER],
                   project_roots=[str(tmp_path / "host" / "code")])
    checkout = host_checkout(host.home)
    host.poll(monkeypatch)
    assert_placed(host.settings.source, checkout, history=False)


def _as_in_the_container(transcript: Path, workspace: Path, home: Path) -> bytes:
    """A transcript the real CLI wrote in ``workspace`` under ``home``, with the paths the
    container would have given it."""
    remap = Remapper([Rule(str(workspace), WORKSPACE), Rule(str(home), CONTAINER_HOME)])
    return b"".join(remap.line(line) for line in transcript.read_bytes().splitlines(True))


@needs_git
def test_claude_continue_in_the_host_checkout_finds_the_container_session(
        claude: Claude, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real CLI: a session recorded as the container would have it, restored by the git
    remote, is what ``claude --continue`` in the checkout resumes."""
    recorder = tmp_path / "recorder"
    workspace = recorder / "workspace"
    workspace.mkdir(parents=True)
    run = claude.run(recorder / "home", workspace, "DEVCONTAINER-FIRST-PROMPT")
    assert run.returncode == 0, run.describe()
    [recorded] = (recorder / "home" / ".claude" / "projects").glob("*/*.jsonl")
    sid = recorded.stem
    data = _as_in_the_container(recorded, workspace, recorder / "home")
    assert str(recorder).encode() not in data
    container_backup(tmp_path, monkeypatch, REMOTE, data, sid)
    checkout = host_checkout(tmp_path / "host")
    tree, _ = restore_on_host(tmp_path, 'project_roots = ["~/code"]\n')
    folder = tree / "projects" / project_folder(os.path.realpath(checkout))
    assert [p.name for p in folder.glob("*.jsonl")] == [f"{sid}.jsonl"]
    cont = claude.run(tmp_path / "host", checkout, "--continue", "ok")
    assert cont.returncode == 0, cont.describe()
    sent: dict[str, Any] = cont.requests[-1]
    # (The CLI puts a system reminder before the first prompt's text.)
    assert "DEVCONTAINER-FIRST-PROMPT" in first_user_text(sent), cont.describe()
    assert message_counts(cont.requests)[-1] >= 3, cont.describe()
    # It went on in the restored file, not a new session.
    assert [p.name for p in folder.glob("*.jsonl")] == [f"{sid}.jsonl"]

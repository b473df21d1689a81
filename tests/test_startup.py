"""Start-up costs what the command needs: the modules a whole ``syncd`` process imports.

Help, a command's help and bad usage import no library beyond click; the commands that
read a local (file://) store import no S3 client. Checked through ``-X importtime``,
which lists every module a process imports (``main`` leaves through ``os._exit``, so
nothing can look at ``sys.modules`` on the way out).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from syncd.cli.main import cli
from tests.helpers import write

ROOT = Path(__file__).resolve().parent.parent

# What a command that only prints help or refuses its arguments has no use for.
HEAVY = ("boto3", "botocore", "s3transfer", "pydantic", "pydantic_core", "pydantic_settings",
         "watchdog", "apscheduler", "zstandard", "cryptography", "rich")
# What a command on a local store has no use for: the S3 client, the daemon's watcher and
# scheduler, and (a plain store) the cipher.
NOT_FOR_LOCAL = ("boto3", "botocore", "s3transfer", "watchdog", "apscheduler", "cryptography")
SID = "0f8e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
    env.update({"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
                "SYNCD_SOURCE": str(tmp_path / "src"), "SYNCD_STATE_DIR": str(tmp_path / "state"),
                "SYNCD_MACHINE_ID": "m1", "SYNCD_STORE": (tmp_path / "store").as_uri(),
                "SYNCD_CONFIG": os.devnull, "PYTHONPATH": str(ROOT)})
    return env


def imported(env: dict[str, str], *args: str, code: int = 0) -> set[str]:
    """The top-level packages a ``syncd ARGS`` process imported (it must exit ``code``)."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "syncd", *args], env=env,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr[-2000:])
    names = {line.rpartition("|")[2].strip() for line in r.stderr.splitlines()
             if line.startswith("import time:")}
    assert "syncd.cli.main" in names, r.stderr[-2000:]  # the listing is there at all
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("args,code", [
    (("--help",), 0),
    (("sessions", "--help"), 0),
    (("restore", "--help"), 0),
    (("key", "add", "--help"), 0),
    (("--version",), 0),
    (("no-such-command",), 2),
    (("restore", "--no-such-option"), 2),
    (("restore", "--session", "not-a-uuid"), 2),
    (("restore", "--at", "yesterday-ish"), 2),
    (("verify", "--max-duration", "3 fortnights"), 2),
])
def test_help_and_bad_usage_import_only_click(tmp_path: Path, args: tuple[str, ...],
                                              code: int) -> None:
    mods = imported(_env(tmp_path), *args, code=code)
    assert sorted(mods & set(HEAVY)) == []


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, cmd in group.commands.items():
        out.append((*path, name))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, (*path, name))
    return out


def test_every_command_s_help_imports_only_click(tmp_path: Path) -> None:
    env = _env(tmp_path)
    heavy = {cmd: sorted(imported(env, *cmd, "--help") & set(HEAVY))
             for cmd in _commands(cli)}
    assert len(heavy) >= 15 and {c: h for c, h in heavy.items() if h} == {}


@pytest.fixture
def local_store(tmp_path: Path) -> dict[str, str]:
    """A file:// store holding one machine's backup of one session."""
    env = _env(tmp_path)
    write(tmp_path / "src", f"projects/-home-u-p/{SID}.jsonl",
          b'{"type":"user","cwd":"/home/u/p","sessionId":"' + SID.encode() + b'"}\n')
    r = subprocess.run([sys.executable, "-m", "syncd", "sync"], env=env, capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return env


@pytest.mark.parametrize("args", [("status",), ("status", "--json"), ("sessions",),
                                  ("sessions", "--json"), ("machines",), ("snapshots",)])
def test_commands_on_a_local_store_import_no_s3_client(local_store: dict[str, str],
                                                       args: tuple[str, ...]) -> None:
    mods = imported(local_store, *args)
    assert sorted(mods & set(NOT_FOR_LOCAL)) == []

"""The README's recipes run as written: every ``syncd`` and ``export`` line of each
recipe's block, in a throwaway home, against ``file://`` stores.

The placeholders are swapped for the test's own: ``s3://my-bucket/claude…`` for store
URLs, ``--at 1h`` for a time between the desk's two backups (the test cannot wait an
hour) and ``/tmp/…`` for a directory of the test. The machine id and session id in the
README are the ones the desk is given here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from syncd.claude import project_folder
from syncd.config import Settings

README = Path(__file__).resolve().parent.parent / "README.md"
DESK = "alice.desk-1a2b3c4d"
LAPTOP = "bob.laptop-5e6f7a8b"
SID = "0f8e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b"
PASSPHRASE = "a passphrase for the recipes"


def recipes() -> dict[str, str]:
    """Heading → the shell lines of its first ``sh`` block, under "## Recipes"."""
    text = README.read_text()
    section = text.split("\n## Recipes\n", 1)[1].split("\n## ", 1)[0]
    out = {}
    for part in section.split("\n### ")[1:]:
        heading, _, body = part.partition("\n")
        m = re.search(r"```sh\n(.*?)```", body, re.S)
        if m:
            out[heading.strip()] = m.group(1)
    return out


def runnable(block: str) -> list[str]:
    """The lines the test runs: ``syncd …`` and ``export …`` (comments are shell's)."""
    return [line for line in block.splitlines() if line.startswith(("syncd ", "export "))]


def _line(cwd: str, uuid: str, text: str) -> bytes:
    return json.dumps({"type": "user", "uuid": uuid, "sessionId": SID, "cwd": cwd,
                       "timestamp": "2026-11-30T10:00:00.000Z",
                       "message": {"role": "user", "content": text}},
                      separators=(",", ":")).encode() + b"\n"


class Homes:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.store = (tmp / "store").as_uri()
        self.encrypted = (tmp / "store-encrypted").as_uri()

    def home(self, machine: str) -> Path:
        return self.tmp / machine.split(".")[0]

    def env(self, machine: str, *, store: bool = True) -> dict[str, str]:
        home = self.home(machine)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SYNCD_", "AWS_", "CLAUDE_", "XDG_"))}
        env.update({"HOME": str(home), "SYNCD_MACHINE_ID": machine,
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"})
        if store:
            env["SYNCD_STORE"] = self.store
        return env

    def syncd(self, machine: str, *args: str, check: bool = True
              ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([sys.executable, "-m", "syncd", *args], env=self.env(machine),
                           capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0 or not check, (args, r.stdout, r.stderr)
        return r

    def run(self, recipe: str, machine: str, *, store: bool = True,
            swap: Callable[[str], str] = lambda s: s) -> subprocess.CompletedProcess[str]:
        """The recipe's lines, placeholders swapped, in one bash with ``set -eu``."""
        lines = [swap(line.replace("s3://my-bucket/claude-encrypted", self.encrypted)
                      .replace("s3://my-bucket/claude", self.store))
                 for line in runnable(recipes()[recipe])]
        assert lines, f"no commands in {recipe!r}"
        script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
        r = subprocess.run(["bash", "-c", script], env=self.env(machine, store=store),
                           cwd=self.home(machine), capture_output=True, text=True,
                           timeout=300, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, (recipe, script, r.stdout, r.stderr)
        return r


@pytest.fixture
def homes(tmp_path: Path) -> Homes:
    """The desk (alice, home /…/alice) backed up a session of ~/code/app and its config."""
    h = Homes(tmp_path)
    home = h.home(DESK)
    claude = home / ".claude"
    cwd = str(home / "code" / "app")
    t = claude / "projects" / project_folder(cwd) / f"{SID}.jsonl"
    t.parent.mkdir(parents=True)
    t.write_bytes(_line(cwd, "u1", "fix the bug"))
    (claude / "settings.json").write_text(json.dumps({"hooks": {"Stop": [{"hooks": [
        {"type": "command", "command": f"{home}/.claude/hooks/done.sh"}]}]}}))
    (home / ".config" / "syncd").mkdir(parents=True)
    h.syncd(DESK, "sync")
    h.home(LAPTOP).mkdir()
    return h


def test_every_recipe_has_commands() -> None:
    assert set(recipes()) == {
        "I just deleted ~/.claude/projects", "A new laptop on the same bucket",
        "Resume one session from another machine", "Restore as of an hour ago",
        "Encrypt an existing plain store's future writes", "Sessions from a devcontainer",
        "Forget a session, redact a secret"}
    assert all(runnable(block) for block in recipes().values())


def test_recover_after_deleting_projects(homes: Homes) -> None:
    projects = homes.home(DESK) / ".claude" / "projects"
    before = {p: p.read_bytes() for p in projects.rglob("*") if p.is_file()}
    shutil.rmtree(projects)
    assert "1 deletions" in homes.syncd(DESK, "sync").stdout  # as the daemon would
    r = homes.run("I just deleted ~/.claude/projects", DESK)
    assert "would restore" in r.stdout
    assert {p: p.read_bytes() for p in projects.rglob("*") if p.is_file()} == before
    # Nothing is shipped again: the restored files are what the store holds.
    assert " 0 bytes in 1 segments" in homes.syncd(DESK, "sync").stdout


def test_a_new_laptop(homes: Homes) -> None:
    r = homes.run("A new laptop on the same bucket", LAPTOP, store=False)
    assert DESK in r.stdout and "+++ backup/settings.json" in r.stdout
    laptop = homes.home(LAPTOP)
    cwd = str(laptop / "code" / "app")
    t = laptop / ".claude" / "projects" / project_folder(cwd) / f"{SID}.jsonl"
    assert json.loads(t.read_bytes())["cwd"] == cwd
    settings = json.loads((laptop / ".claude" / "settings.json").read_bytes())
    assert settings["hooks"]["Stop"][0]["hooks"][0]["command"] == \
        f"{laptop}/.claude/hooks/done.sh"


def test_resume_one_session(homes: Homes) -> None:
    r = homes.run("Resume one session from another machine", LAPTOP)
    laptop = homes.home(LAPTOP)
    cwd = str(laptop / "code" / "app")
    assert f"cd {cwd} && claude --resume {SID}" in r.stdout
    assert (laptop / ".claude" / "projects" / project_folder(cwd) / f"{SID}.jsonl").is_file()


def test_restore_as_of_an_hour_ago(homes: Homes, tmp_path: Path) -> None:
    first = (homes.home(DESK) / ".claude" / "projects").rglob(f"{SID}.jsonl")
    [t] = list(first)
    old = t.read_bytes()
    between = time.time()
    while time.time() <= between + 0.01:  # the next backup's time is after `between`
        time.sleep(0.01)
    with open(t, "ab") as fh:
        fh.write(_line(str(homes.home(DESK) / "code" / "app"), "u2", "and the tests"))
    homes.syncd(DESK, "sync")
    out = tmp_path / "an-hour-ago"
    # In UTC: a local time is ambiguous in the hour a clock goes back.
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(between)) + \
        f".{int(between % 1 * 1e6):06d}+00:00"
    homes.run("Restore as of an hour ago", DESK,
              swap=lambda s: s.replace("--at 1h", f"--at {at}")
              .replace("/tmp/claude-1h-ago", str(out)))
    assert (out / t.relative_to(homes.home(DESK) / ".claude")).read_bytes() == old


def toml_blocks(heading: str) -> list[str]:
    """The ``toml`` blocks of a recipe, in order."""
    section = README.read_text().split(f"\n### {heading}\n", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"```toml\n(.*?)```", section, re.S)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize("known", [True, False], ids=["git-remote", "remap"])
def test_sessions_from_a_devcontainer(homes: Homes, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch, known: bool) -> None:
    """The container's backup, then the host's config (the project_roots block; the
    [remap] one too when the container recorded no remote) and the recipe's commands."""
    from tests.test_devcontainer import REMOTE, assert_placed, container_backup, host_checkout
    container_backup(tmp_path, monkeypatch, REMOTE if known else None)
    host = homes.home(LAPTOP)
    checkout = host_checkout(host)
    config = toml_blocks("Sessions from a devcontainer")
    (host / ".config" / "syncd").mkdir(parents=True)
    (host / ".config" / "syncd" / "config.toml").write_text(
        config[0] + ("" if known else "\n" + config[1]))
    r = homes.run("Sessions from a devcontainer", LAPTOP)
    assert ("same git remote" if known else "config remap") in r.stdout, r.stdout
    assert_placed(host / ".claude", checkout)


def test_encrypt_future_writes(homes: Homes) -> None:
    secret = homes.home(DESK) / ".config" / "syncd" / "passphrase"
    secret.write_text(PASSPHRASE)
    secret.chmod(0o600)
    homes.run("Encrypt an existing plain store's future writes", DESK)
    assert any((homes.tmp / "store-encrypted" / "keys").iterdir())
    env = {**homes.env(DESK), "SYNCD_STORE": homes.encrypted, "SYNCD_PASSPHRASE": PASSPHRASE}
    r = subprocess.run([sys.executable, "-m", "syncd", "sessions", "--json"], env=env,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert [s["session_id"] for s in json.loads(r.stdout)] == [SID]
    # Without the passphrase the new store reads as nothing.
    env.pop("SYNCD_PASSPHRASE")
    r = subprocess.run([sys.executable, "-m", "syncd", "sessions"], env=env,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode != 0 and SID not in r.stdout


def test_the_configuration_block_names_every_key() -> None:
    text = README.read_text()
    section = text.split("\n## Configuration\n", 1)[1]
    block = section.split("```toml\n", 1)[1].split("```", 1)[0]
    named = set(re.findall(r"^([a-z0-9_]+) = ", block, re.M))
    named |= set(re.findall(r"^\[([a-z0-9_]+)\]", block, re.M))
    assert named == set(Settings.model_fields), named ^ set(Settings.model_fields)


def test_forget_and_redact(homes: Homes) -> None:
    home = homes.home(DESK)
    cwd = str(home / "code" / "app")
    t = home / ".claude" / "projects" / project_folder(cwd) / f"{SID}.jsonl"
    token = "ghp_" + "Hk4" * 12
    with open(t, "ab") as f:
        f.write(_line(cwd, "u2", "my token " + token))
    os.utime(t, (1_700_000_000, 1_700_000_000))  # quiet long since
    homes.syncd(DESK, "sync")
    found = json.loads(homes.syncd(DESK, "secrets", "--json", check=False).stdout)
    (fid,) = [f["id"] for s in found["sessions"] for f in s["findings"]]
    homes.run("Forget a session, redact a secret", DESK, swap=lambda s: s.replace(
        "3f2a9c01b7de", fid).replace("0a0e1f2c", SID[:8]).replace(
        "syncd secrets ", "syncd secrets || true ", 1))
    assert not t.exists()
    listed = json.loads(homes.syncd(DESK, "sessions", "--json").stdout or "[]")
    assert SID not in json.dumps(listed)

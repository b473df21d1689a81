"""The command line's exit codes and one-line errors: configuration, arguments, stores
that are missing or cannot be reached, and the shell line `resume` prints."""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import botocore.exceptions
import click
import pytest
from click.testing import CliRunner

from syncd.claude import resume_line
from syncd.cli.main import cli
from syncd.cli.util import (
    INTERACTIVE_CONNECT_TIMEOUT,
    INTERACTIVE_DEADLINE,
    interactive,
    store_of,
)
from syncd.config import Settings, load_settings
from syncd.errors import RestoreError
from syncd.security.keys import init_encryption
from syncd.store import LocalStore, S3Store
from tests.counting import Counts
from tests.helpers import one_line, shipper, start_daemon, syncd, wait_for, write
from tests.seaweed import Seaweed

SID = "0f8e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b"
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens there


def env_of(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
    env.update({"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
                "SYNCD_SOURCE": str(tmp_path / "src"), "SYNCD_STATE_DIR": str(tmp_path / "state"),
                "SYNCD_MACHINE_ID": "m1", "SYNCD_STORE": (tmp_path / "store").as_uri(),
                "SYNCD_CONFIG": os.devnull})
    env.update(extra)
    return env


# -- configuration --------------------------------------------------------------------------

def test_a_toml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text('store = "s3://b/p"\nkeep_daily = = 3\n')
    line = one_line(syncd(env_of(tmp_path), "--config", str(cfg), "machines"), 2)
    assert str(cfg) in line and "invalid TOML" in line and "line 2" in line
    assert "Traceback" not in line


def test_an_unknown_key_names_the_file_and_suggests_the_close_one(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text("keep_hourly = 1\nkeep_dialy = 3\n")
    line = one_line(syncd(env_of(tmp_path, SYNCD_CONFIG=str(cfg)), "sessions"), 2)
    assert line == (f"syncd: config file {cfg}, line 2: unknown key `keep_dialy` "
                    "(did you mean `keep_daily`?)")
    cfg.write_text("zzzz = 1\n")
    line = one_line(syncd(env_of(tmp_path, SYNCD_CONFIG=str(cfg)), "sessions"), 2)
    assert line.endswith("unknown key `zzzz`")


def test_a_named_config_file_must_exist_the_default_one_need_not(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    nope = tmp_path / "nope.toml"
    line = one_line(syncd(env_of(tmp_path), "--config", str(nope), "sessions"), 2)
    assert line == f"syncd: config file {nope} does not exist"
    line = one_line(syncd(env_of(tmp_path, SYNCD_CONFIG=str(nope)), "sessions"), 2)
    assert line == f"syncd: config file {nope} ($SYNCD_CONFIG) does not exist"
    env = env_of(tmp_path)
    del env["SYNCD_CONFIG"]  # and $XDG_CONFIG_HOME/syncd/config.toml does not exist
    r = syncd(env, "sessions", "--json")
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


def test_a_bad_value_names_where_it_came_from(tmp_path: Path) -> None:
    line = one_line(syncd(env_of(tmp_path, SYNCD_KEEP_DAILY="many"), "machines"), 2)
    assert line.startswith("syncd: $SYNCD_KEEP_DAILY: keep_daily: ")
    cfg = tmp_path / "config.toml"
    cfg.write_text('\nflush_quiet = -1\n')
    line = one_line(syncd(env_of(tmp_path), "--config", str(cfg), "machines"), 2)
    assert line.startswith(f"syncd: config file {cfg}, line 2: flush_quiet: ")
    line = one_line(syncd(env_of(tmp_path, SYNCD_STORE="ftp://host/x"), "machines"), 2)
    assert "$SYNCD_STORE: store: " in line and "s3://bucket/prefix" in line


# -- --store ----------------------------------------------------------------------------------

def store_shown(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, r.stderr
    return str(json.loads(r.stdout)["store"])


def test_the_store_option_wins_over_the_variable_and_the_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    in_file, in_env, in_option = (f"file://{tmp_path}/{n}" for n in ("file", "env", "option"))
    cfg.write_text(f'store = "{in_file}"\n')
    env = env_of(tmp_path, SYNCD_CONFIG=str(cfg))
    del env["SYNCD_STORE"]
    assert store_shown(syncd(env, "status", "--json")) == in_file
    env["SYNCD_STORE"] = in_env
    assert store_shown(syncd(env, "status", "--json")) == in_env
    assert store_shown(syncd(env, "--store", in_option, "status", "--json")) == in_option
    # A bare path is a local store, as in the config file.
    assert store_shown(syncd(env, "--store", str(tmp_path / "p"), "status", "--json")) == \
        (tmp_path / "p").as_uri()


@pytest.mark.parametrize(("url", "says"), [
    ("ftp://host/x", "syncd: --store: unsupported store URL 'ftp://host/x': use file:///path"),
    ("s3://", "syncd: --store: missing bucket (s3://bucket/prefix)"),
    ("file://host/x", "syncd: --store: file URLs take an absolute path (file:///path)"),
])
def test_a_bad_store_option_is_bad_usage(tmp_path: Path, url: str, says: str) -> None:
    for args in (("machines",), ("status",), ("key", "list")):
        line = one_line(syncd(env_of(tmp_path), "--store", url, *args), 2)
        assert line.startswith(says), line


def test_a_reload_of_the_daemon_keeps_the_store_option(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGHUP re-reads the config file and the environment; --store still wins."""
    reloads: list[tuple[Settings, Callable[[], Settings]]] = []

    class Daemon:
        def __init__(self, settings: Settings, reload: Callable[[], Settings],
                     **kwargs: object) -> None:
            reloads.append((settings, reload))

        def run(self) -> None:
            pass

    # `run` imports the daemon and set_level when it runs: patched where they live.
    monkeypatch.setattr("syncd.service.daemon.Daemon", Daemon)
    # This process's logging stays as it is.
    monkeypatch.setattr("syncd.cli.main.setup_logging", lambda level: None)
    monkeypatch.setattr("syncd.service.log.set_level", lambda level: None)
    for k, v in env_of(tmp_path).items():
        monkeypatch.setenv(k, v)
    for k in os.environ:
        if k.startswith("SYNCD_") and k not in env_of(tmp_path):
            monkeypatch.delenv(k)
    given, before, after = (f"file://{tmp_path}/{n}" for n in ("given", "before", "after"))
    monkeypatch.setenv("SYNCD_STORE", before)
    for args in (["--store", given, "run"], ["run"]):
        r = CliRunner().invoke(cli, args, catch_exceptions=False)
        assert r.exit_code == 0, r.output
    monkeypatch.setenv("SYNCD_STORE", after)  # changed before the SIGHUP
    [(settings, reload), (plain, plain_reload)] = reloads
    assert (settings.store, reload().store) == (given, given)
    assert (plain.store, plain_reload().store) == (before, after)


# -- a local store that is not there ----------------------------------------------------------

@pytest.mark.parametrize("args", [("machines",), ("sessions",), ("restore", "--dry-run"),
                                  ("resume", SID), ("verify",), ("compact",), ("prune",),
                                  ("key", "list"), ("key", "add"), ("check-store",)])
def test_commands_that_read_never_create_a_missing_local_store(tmp_path: Path,
                                                               args: tuple[str, ...]) -> None:
    typo = tmp_path / "typo"
    line = one_line(syncd(env_of(tmp_path, SYNCD_STORE=typo.as_uri()), *args), 2)
    assert line == f"syncd: store {typo.as_uri()} does not exist"
    assert not typo.exists()


def test_the_default_store_missing_says_nothing_is_backed_up_yet(tmp_path: Path) -> None:
    env = env_of(tmp_path, XDG_DATA_HOME=str(tmp_path / "data"))
    del env["SYNCD_STORE"]
    line = one_line(syncd(env, "machines"), 2)
    assert "does not exist (nothing is backed up yet" in line
    assert not (tmp_path / "data").exists()


def test_status_reports_a_missing_store_without_creating_it(tmp_path: Path) -> None:
    typo = tmp_path / "typo"
    r = syncd(env_of(tmp_path, SYNCD_STORE=typo.as_uri()), "status")
    assert r.returncode == 0, r.stderr
    assert f"UNREACHABLE: store {typo.as_uri()} does not exist" in r.stdout
    assert not typo.exists()


def test_sync_and_init_make_a_new_local_store(tmp_path: Path) -> None:
    write(tmp_path / "src", "history.jsonl", b'{"display":"a"}\n')
    r = syncd(env_of(tmp_path, SYNCD_STORE=(tmp_path / "a").as_uri()), "sync")
    assert r.returncode == 0 and (tmp_path / "a" / "machines").is_dir(), r.stderr
    r = syncd(env_of(tmp_path, SYNCD_STORE=(tmp_path / "b").as_uri()), "init")
    assert r.returncode == 0 and "not encrypted" in r.stdout and (tmp_path / "b").is_dir()


# -- a state dir that cannot be written ------------------------------------------------------

def without_root_powers() -> list[str]:
    """What runs a command without root's permission override, under which a read-only
    directory is as writable as any (nothing as another user)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root, and no setpriv to drop CAP_DAC_OVERRIDE")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


def last_line(r: subprocess.CompletedProcess[str], code: int) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    return r.stderr.splitlines()[-1]


@pytest.mark.parametrize("made", [False, True])
def test_a_read_only_state_dir_is_named_with_what_to_do(tmp_path: Path, made: bool) -> None:
    write(tmp_path / "src", "history.jsonl", b'{"display":"a"}\n')
    parent = tmp_path / "ro"
    state = parent / "state" if not made else parent
    parent.mkdir(mode=0o500)
    env = env_of(tmp_path, SYNCD_STATE_DIR=str(state))
    try:
        for args in (("sync",), ("run",)):
            r = subprocess.run([*without_root_powers(), sys.executable, "-m", "syncd", *args],
                               env=env, capture_output=True, text=True, timeout=120,
                               stdin=subprocess.DEVNULL)
            line = last_line(r, 1)
            assert line.startswith(f"syncd: lock file {state}/m1@"), line
            assert line.endswith(": Permission denied (fix the permissions of it and its dir, "
                                 "or set state_dir elsewhere)"), line
    finally:
        parent.chmod(0o700)


def in_tmpfs(mount: Path, size: str, fill: bool, *args: str) -> list[str]:
    """``args`` run with a tmpfs of ``size`` at ``mount`` (its own mount namespace),
    filled up first for ``fill``."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-Urm", "true"],
                                         capture_output=True).returncode != 0:
        pytest.skip("no user and mount namespaces here to mount a small tmpfs in")
    script = f'mount -t tmpfs -o size={size} none "$0" || exit 99\n'
    if fill:
        script += 'cat /dev/zero > "$0/fill" 2>/dev/null\n'
    return [unshare, "-Urm", "sh", "-c", script + 'exec "$@"', str(mount), *args]


@pytest.mark.parametrize(("size", "fill"), [("8k", False), ("16k", False), ("64k", True)])
def test_a_full_state_dir_is_named_with_what_to_do(tmp_path: Path, size: str,
                                                   fill: bool) -> None:
    """The disk really full (SQLite's words for it vary: "database or disk is full",
    "disk I/O error"; the lock file's pid gets ENOSPC)."""
    write(tmp_path / "src", "history.jsonl", b'{"display":"a"}\n')
    mount = tmp_path / "small"
    mount.mkdir()
    state = mount / "state"
    env = env_of(tmp_path, SYNCD_STATE_DIR=str(state))
    for args in (("sync",), ("run",)):
        r = subprocess.run(in_tmpfs(mount, size, fill, sys.executable, "-m", "syncd", *args),
                           env=env, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        line = last_line(r, 1)
        assert line.startswith((f"syncd: state database {state}/m1@",
                                f"syncd: lock file {state}/m1@")), line
        assert line.endswith("(the disk is full: free space there, or set state_dir "
                             "elsewhere)"), line


# -- arguments ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "says"), [
    (("restore", "--at", "notatime"), "syncd: --at: cannot read time 'notatime'"),
    (("restore", "--at", "2026-13-45"), "syncd: --at: cannot read time"),
    (("restore", "--session", "deadbee"), "syncd: --session: 'deadbee' is not a session id"),
    (("restore", "--session", SID + "0"), "is not a session id"),
    (("resume", "deadbee"), "syncd: SESSION_ID: 'deadbee' is not a session id"),
    (("resume", "deadbeef;echo INJECTED"), "is not a session id"),
    (("resume", "../../../etc/x"), "is not a session id"),
    (("resume", "deadbeefdead"), "is not a session id"),  # no dash after 8 digits
    (("restore", "--map", "nomapping"), "syncd: --map takes OLD=NEW"),
    (("verify", "--max-duration", "soon"), "syncd: --max-duration: bad duration 'soon'"),
])
def test_bad_arguments_are_usage_errors(tmp_path: Path, args: tuple[str, ...],
                                        says: str) -> None:
    (tmp_path / "store").mkdir()
    line = one_line(syncd(env_of(tmp_path), *args), 2)
    assert line.startswith(says) or says in line, line
    assert not (tmp_path / "src").exists()


@pytest.mark.parametrize("sid", [SID, SID[:8], SID[:13], SID.upper()])
def test_session_ids_and_prefixes_are_accepted(tmp_path: Path, sid: str) -> None:
    (tmp_path / "store").mkdir()
    line = one_line(syncd(env_of(tmp_path), "resume", sid), 1)
    assert line == f"syncd: session {sid} is in no backup (no machines)"


# -- a store that cannot be reached -------------------------------------------------------------

def test_an_unreachable_store_fails_a_command_with_one_line(tmp_path: Path) -> None:
    write(tmp_path / "src", "history.jsonl", b'{"display":"a"}\n')
    env = env_of(tmp_path, SYNCD_STORE="s3://bucket/p", SYNCD_S3_ENDPOINT_URL=UNREACHABLE,
                 AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y")
    runs = {name: subprocess.Popen([sys.executable, "-m", "syncd", *args], env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL)
            for name, args in [("sync", ["sync"]), ("machines", ["machines"]),
                               ("check-store", ["check-store"]),
                               ("restore", ["restore", "--dry-run"]),
                               ("verbose", ["-v", "sessions"])]}
    out = {}
    for name, p in runs.items():
        stdout, stderr = p.communicate(timeout=120)
        out[name] = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    for name in ("sync", "machines", "check-store", "restore"):
        line = one_line(out[name], 1)
        assert "s3://bucket/p/" in line and "127.0.0.1:9" in line, line
        assert out[name].stdout == "", name
    # The retries are there for whoever asks (-v), below WARNING.
    lines = out["verbose"].stderr.splitlines()
    assert out["verbose"].returncode == 1 and lines[-1].startswith("syncd: s3://bucket/p/")
    retries = lines[:-1]
    assert retries and all(" INFO syncd.store: " in ln and "retrying in" in ln
                           for ln in retries), lines


def test_a_missing_bucket_is_named_as_such(tmp_path: Path, seaweed: Seaweed,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """Not as a key of it that is not found: every key is, and the URL is what to fix."""
    name = f"nosuch{os.getpid()}"
    store = f"s3://{name}/p"
    says = f"store {store}/: bucket {name!r} does not exist (create it, or fix the store URL)"
    write(tmp_path / "src", "history.jsonl", b'{"display":"a"}\n')
    env = env_of(tmp_path, SYNCD_STORE=store, SYNCD_S3_ENDPOINT_URL=seaweed.endpoint,
                 **seaweed.env())
    for args in (("sync",), ("sessions",), ("machines",), ("restore", "--dry-run")):
        assert one_line(syncd(env, *args), 2) == f"syncd: {says}", args
    r = syncd(env, "status")
    assert r.returncode == 0 and f"(UNREACHABLE: {says})" in r.stdout, r.stdout
    # The daemon keeps trying (the bucket may be created), saying why at each flush.
    caplog.set_level(logging.INFO, logger="syncd")
    dt = start_daemon(load_settings(Path(os.devnull), source=tmp_path / "src", store=store,
                                    s3_endpoint_url=seaweed.endpoint, machine_id="m1",
                                    state_dir=tmp_path / "state-run"))
    try:
        wait_for(lambda: [rec for rec in caplog.records if rec.getMessage().startswith(
            f"flush failed, retrying in 1s: {says}")], what="the failed flush")
    finally:
        dt.stop()
    assert not dt.thread.is_alive() and not dt.errors, dt.errors
    with pytest.raises(botocore.exceptions.ClientError):  # and none was made on the way
        seaweed.client().head_bucket(Bucket=name)


def test_commands_get_the_interactive_store_budget(tmp_path: Path) -> None:
    s = load_settings(Path(os.devnull), store="s3://bucket/p", s3_endpoint_url=UNREACHABLE,
                      store_retry_deadline=60.0)
    assert s.store_retry_deadline == 60.0  # the daemon's
    assert interactive(s).store_retry_deadline == INTERACTIVE_DEADLINE
    store = store_of(s)
    assert store.deadline == INTERACTIVE_DEADLINE and isinstance(store.inner, S3Store)
    assert store.inner._s3.meta.config.connect_timeout == INTERACTIVE_CONNECT_TIMEOUT
    assert store.inner._s3.meta.config.retries["total_max_attempts"] == 1
    quick = load_settings(Path(os.devnull), store_retry_deadline=2.0)
    assert interactive(quick).store_retry_deadline == 2.0


# -- what resume prints --------------------------------------------------------------------------

def test_the_resume_line_runs_nothing_but_cd_and_claude(tmp_path: Path) -> None:
    cwd = tmp_path / "it's a $(dir)"
    cwd.mkdir()
    evil = "deadbeef;echo INJECTED-$(id -un);#"
    line = resume_line(str(cwd), evil)
    assert shlex.split(line) == ["cd", str(cwd), "&&", "claude", "--resume", evil]
    # Pasted into a shell whose `claude` prints its arguments: one call, nothing injected.
    r = subprocess.run(["sh", "-c", 'claude() { printf "[%s]" "$@"; pwd; }\n' + line],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == f"[--resume][{evil}]{cwd}\n", r.stdout
    assert resume_line("/home/a/app", SID) == f"cd /home/a/app && claude --resume {SID}"


@pytest.mark.parametrize("bad", ["/home/a\n rm -rf ~", "/home/\x1b[2Ka", "/home/\u202ea"])
def test_the_resume_line_refuses_control_characters(bad: str) -> None:
    with pytest.raises(RestoreError, match="control characters"):
        resume_line(bad, SID)


def test_the_resume_line_refuses_a_cwd_inside_the_claude_tree(tmp_path: Path) -> None:
    root = tmp_path / ".claude"
    (root / "projects" / "-x").mkdir(parents=True)
    (tmp_path / "code").mkdir()
    (tmp_path / "link").symlink_to(root / "projects")
    for cwd in (root, root / "projects" / "-x", tmp_path / "link" / "-x"):
        with pytest.raises(RestoreError, match="inside the Claude tree"):
            resume_line(str(cwd), SID, root)
    assert resume_line(str(tmp_path / "code"), SID, root).startswith("cd ")
    assert resume_line(str(tmp_path / ".claude-other"), SID, root).startswith("cd ")


# -- what the read commands ask of the store ------------------------------------------------------

def test_read_commands_only_read_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           store_counts: Counts) -> None:
    """machines, sessions and resume list and get; none writes or deletes an object."""
    cwd = "/home/a/app"
    rel = f"projects/-home-a-app/{SID}.jsonl"
    write(tmp_path / "desk", rel, json.dumps({
        "type": "user", "uuid": "u1", "cwd": cwd, "sessionId": SID,
        "timestamp": "2026-11-01T10:00:00.000Z",
        "message": {"role": "user", "content": "hi"}}, separators=(",", ":")).encode() + b"\n")
    shipper(tmp_path / "desk", LocalStore(tmp_path / "store"), tmp_path / "desk.db",
            machine="desk").ship([rel.encode()])
    for k, v in env_of(tmp_path).items():
        monkeypatch.setenv(k, v)
    for args in (["machines", "--json"], ["sessions", "--json"], ["resume", SID]):
        store_counts.calls.clear()
        r = CliRunner().invoke(cli, args, catch_exceptions=False)
        assert r.exit_code == 0, r.output
        kinds = store_counts.by_kind()
        assert kinds["LIST"] >= 1 and kinds["GET"] >= 1, (args, kinds)
        assert kinds["PUT"] == kinds["DELETE"] == 0, (args, kinds)


# -- secrets in messages ------------------------------------------------------------------------

def test_a_short_wrong_passphrase_leaves_the_message_readable(tmp_path: Path) -> None:
    init_encryption(LocalStore(tmp_path / "store"), "correct horse battery", n=1 << 10)
    line = one_line(syncd(env_of(tmp_path, SYNCD_PASSPHRASE="wrong"), "machines"), 1)
    assert line.endswith(": wrong passphrase, or tampered key files") and "***" not in line


# -- help ---------------------------------------------------------------------------------------

def help_of(*path: str, width: int = 80) -> str:
    """``syncd PATH... --help`` on a terminal ``width`` columns wide (whatever this one is)."""
    ctx = cli.make_context("syncd", [], terminal_width=width, resilient_parsing=True)
    cmd: click.Command = cli
    for name in path:
        assert isinstance(cmd, click.Group)
        sub = cmd.get_command(ctx, name)
        assert sub is not None, name
        cmd = sub
        ctx = cmd.make_context(name, [], parent=ctx, resilient_parsing=True)
    return cmd.get_help(ctx)


def commands(group: click.Group = cli, path: tuple[str, ...] = ()) -> list[
        tuple[tuple[str, ...], click.Command]]:
    """Every command under ``group`` (groups too), with its path of names."""
    out: list[tuple[tuple[str, ...], click.Command]] = []
    for name, cmd in sorted(group.commands.items()):
        out.append(((*path, name), cmd))
        if isinstance(cmd, click.Group):
            out += commands(cmd, (*path, name))
    return out


def listing(text: str) -> str:
    """The Commands section of a help text, its whitespace runs made single spaces."""
    section = text.partition("\nCommands:\n")[2].partition("\n\n")[0]
    return " ".join(section.split())


HELP = """\
Usage: syncd [OPTIONS] COMMAND [ARGS]...

  Continuous append-only backup of Claude Code's session store (~/.claude).

  Run `syncd run` as a service (see deploy/ and systemd/), `syncd status` to see
  that it keeps up, and `syncd restore` to get the sessions back.

Options:
  --version      Show the version and exit.
  --config PATH  Config file (default $SYNCD_CONFIG, else
                 ~/.config/syncd/config.toml); one named here or in
                 $SYNCD_CONFIG must exist.
  --store URL    The store: s3://bucket/prefix, file:///path or an absolute path
                 (default $SYNCD_STORE, else the config file's `store`, else
                 ~/.local/share/syncd/store).
  -v, --verbose  Log more: every flush and scan (debug detail for run).
  -h, --help     Show this message and exit.

Commands:
  check-store  Check that the store provider does what syncd needs.
  compact      Fold segments into a delta, or packs and a manifest.
  forget       Take a session out of every point of the backups.
  index        Index other machines' transcripts for `syncd search`.
  init         Prepare the store (--encrypt: make it encrypted).
  key          Passphrases of an encrypted store: add, remove, list.
  machines     The machines that have a backup in the store.
  prune        Delete the snapshots the retention policy lets go.
  redact       Mask a value in the files here and every backup.
  restore      Restore a machine's backup (or some sessions) into the local
               Claude tree.
  resume       Restore one session from any machine's backup and print how to
               resume it.
  run          The daemon: watch ~/.claude, back up every appended byte.
  search       Full-text search over the sessions indexed here.
  secrets      Which sessions hold what looks like a secret.
  sessions     Every backed-up session: title, project, machine, size, last
               activity, local or not.
  show         Show a session: prompts, answers and tool calls, from the local
               tree or any machine's backup as of any time.
  snapshots    The points in time a restore can reach, newest first: every flush
               within the retention window, then the compacted snapshots the
               policy keeps.
  status       Health at a glance (--json for scripts).
  sync         Back up everything pending once; exit 0 when durable.
  verify       Check the backup is whole (exit 1 on any problem).
  web          A local web page: dashboard, sessions, one session.

  Environment:
    SYNCD_STORE       the store URL (as --store; the option wins over it,
                      and it over the config file's `store`)
    SYNCD_CONFIG      the config file (as --config)
    SYNCD_<KEY>       any config key, e.g. SYNCD_MACHINE_ID=desk or
                      SYNCD_KEEP_DAILY=7 (wins over the config file; a list
                      or a table is written as JSON)
    SYNCD_PASSPHRASE  the passphrase of an encrypted store

  Exit codes:
    0  success
    1  the work could not be completed (one line on stderr says why),
       or verify found a problem, or secrets found some
    2  bad usage or configuration

  Shell completion (add to your shell's rc file):
    bash:  eval "$(_SYNCD_COMPLETE=bash_source syncd)"
    zsh:   eval "$(_SYNCD_COMPLETE=zsh_source syncd)"
    fish:  _SYNCD_COMPLETE=fish_source syncd | source
"""


def test_the_top_level_help_as_an_80_column_terminal_shows_it() -> None:
    assert help_of() + "\n" == HELP


@pytest.mark.parametrize("width", [50, 80])
@pytest.mark.parametrize("group", [(), ("key",)])
def test_every_command_is_listed_with_its_whole_description(width: int,
                                                            group: tuple[str, ...]) -> None:
    listed = listing(help_of(*group, width=width))
    assert "..." not in listed
    parent = cli if not group else cli.commands[group[0]]
    assert isinstance(parent, click.Group) and parent.commands
    for name, cmd in parent.commands.items():
        whole = " ".join(cmd.get_short_help_str(limit=1 << 20).split())
        # The first sentence of the docstring, or the short help: ends as a sentence.
        assert whole.endswith((".", ")")) and f"{name} {whole}" in listed, (name, listed)


def test_every_option_of_every_command_has_help() -> None:
    for path, cmd in [((), cli), *commands()]:
        assert (cmd.help or cmd.short_help or "").strip(), path
        for param in cmd.params:
            if isinstance(param, click.Option):
                assert (param.help or "").strip(), (path, param.opts)
        assert help_of(*path)  # and each help renders


def test_restore_of_a_project_the_backup_does_not_have_plans_nothing(tmp_path: Path) -> None:
    """As an unknown --session: exit 1, one line, nothing planned (not even history)."""
    rel = f"projects/-home-a-app/{SID}.jsonl"
    write(tmp_path / "src", rel, json.dumps({
        "type": "user", "uuid": "u1", "cwd": "/home/a/app", "sessionId": SID,
        "timestamp": "2026-11-01T10:00:00.000Z",
        "message": {"role": "user", "content": "hi"}}, separators=(",", ":")).encode()
        + b"\n")  # compact, as Claude Code writes it (the catalog reads it so)
    write(tmp_path / "src", "history.jsonl", json.dumps({
        "display": "hi", "project": "/home/a/app", "sessionId": SID},
        separators=(",", ":")).encode() + b"\n")
    env = env_of(tmp_path)
    assert syncd(env, "sync").returncode == 0
    out = tmp_path / "out"
    for args in (("--dry-run",), ("--to", str(out))):
        r = syncd(env, "restore", "--project", "/home/a/app", "--project", "/home/a/nope",
                  *args)
        assert one_line(r, 1) == ("syncd: no project in machine 'm1''s backup matches "
                                  "/home/a/nope (syncd sessions lists them)")
        assert r.stdout == "", r.stdout
    assert not out.exists()
    r = syncd(env, "restore", "--project", "/home/a", "--to", str(out))
    assert r.returncode == 0 and (out / rel).exists(), r.stderr


def test_restore_says_in_one_line_that_a_conflict_copy_bigger_than_conflict_bytes_is_not_kept(
        tmp_path: Path) -> None:
    env = env_of(tmp_path, SYNCD_CONFLICT_BYTES=str(1 << 20), SYNCD_FOLLOW_QUIET="0")
    rel = f"projects/-home-a/{SID}.jsonl"
    write(tmp_path / "src", rel, b"a\n" + b"b" * (2 << 20) + b"\n")
    assert syncd(env, "sync").returncode == 0
    write(tmp_path / "src", rel, b"a\nX\n")  # diverged here since
    r = syncd(env, "restore")
    assert r.returncode == 1, (r.stdout, r.stderr)
    said = [ln for ln in r.stderr.splitlines() if "conflict_bytes" in ln]
    assert len(said) == 1 and rel in said[0] and said[0].startswith("syncd: "), r.stderr
    assert (tmp_path / "src" / rel).read_bytes() == b"a\nX\n"
    assert not [p for p in (tmp_path / "state").rglob("*") if "conflicts" in p.parts
                and p.is_file()]


def test_search_snippet_whitespace_is_one_space_piped(capsys: pytest.CaptureFixture[str]) -> None:
    # A snippet from code or a long answer spans lines: piped, each run of whitespace
    # reads as one space (never a "?"), and a control character is still a "?".
    from syncd.cli import search as search_cli
    from syncd.search.query import Hit

    hit = Hit(machine="m", session="s", project="/p", last_activity=None, title="t",
              snippet=[("a line\n\n    then\t", False), ("Evi\ndence", True),
                       ("\r\nend\x1b[2J", False)],
              deleted=False, score=-1.0)
    search_cli._print([hit])
    snippet = capsys.readouterr().out.splitlines()[1]
    assert snippet == "    a line then [Evi dence] end?[2J"

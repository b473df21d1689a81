from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from syncd import claude
from syncd.claude import (
    Selection,
    default_root,
    folder_match,
    project_folder,
    sweep_temps,
    temp_name,
    tree_writable,
)


@pytest.mark.parametrize("rel", [
    "projects/-home-a/0a0eb7b7-3abb.jsonl",
    "projects/-home-a/0a0eb7b7-3abb/subagents/agent-a1.jsonl",
    "projects/-home-a/0a0eb7b7-3abb/subagents/agent-a1.meta.json",
    "projects/-home-a/0a0eb7b7-3abb/tool-results/toolu_1.txt",
    "projects/-home-a/memory/MEMORY.md",
    "history.jsonl",
    "plans/bright-owl.md",
    "todos/x-agent-x.json",
    "tasks/list/1.json",
    "file-history/sid/abc@v1",
    "paste-cache/p.txt",
])
def test_default_includes(rel: str) -> None:
    assert Selection().wants(rel)


@pytest.mark.parametrize("rel", [
    ".credentials.json", ".claude.json", ".claude.json.backup", "backups/.claude.json.1",
    "ide/1234.lock", "sessions/x.json", "shell-snapshots/snap.sh", "session-env/a/b",
    "statsig/cache", "cache/changelog.md", "debug/latest", "telemetry/x.json",
    "projects/-home-a/.credentials.json", "projects/-home-a/x.lock", "settings.local.json",
    # Claude Code's own temp files of a write whole, renamed over the file at once
    "projects/-home-a/0a0eb7b7-3abb/subagents/agent-a1.meta.json.tmp.13e10986",
    "projects/-home-a/0a0eb7b7-3abb.jsonl.compact.tmp.1a2b3c4d5e",
])
def test_never_and_unselected(rel: str) -> None:
    assert not Selection().wants(rel)


@pytest.mark.parametrize("rel", ["state/consent.json", "shares/s1.json"])
def test_host_bound_state_and_shares_are_not_in_the_default_include_set(rel: str) -> None:
    # state/ holds consent given on this host; shares/ is not a session's
    assert not Selection().wants(rel)
    assert not Selection().may_descend(rel.split("/")[0])


def test_never_list_beats_include_globs() -> None:
    sel = Selection(include=["**"], exclude=[])
    assert sel.wants("settings.json")
    assert not sel.wants(".credentials.json")
    assert not sel.wants("shell-snapshots/x.sh")
    assert not sel.wants("projects/a/b.lock")


@pytest.mark.parametrize("rel", [
    "projects/-home-a/.syncd-4242-0123456789ab.tmp",  # a restore's temp file
    "projects/-home-a/.syncd-0123456789ab.tmp",  # an older version's
    "agents/.syncd-1-abcdefabcdef.tmp", ".syncd-77-0123456789ab.tmp",
    ".syncd-restore-k2j3h4/0/1a2b", ".syncd-restore-k2j3h4/.held",  # restore staging
])
def test_syncds_own_files_are_never_selected_whatever_the_globs(rel: str) -> None:
    for sel in (Selection(), Selection(include=["**", rel])):
        assert not sel.wants(rel)
    # A scan does not even walk a staging folder.
    assert not Selection(include=["**"]).may_descend(".syncd-restore-k2j3h4")
    assert Selection(include=["**"]).may_descend("projects")
    assert temp_name() != temp_name() and claude.is_temp(temp_name())


def _dead_pid() -> int:
    """A pid no process has: a child's, once it has exited and been reaped."""
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                       capture_output=True, text=True, check=True)
    return int(p.stdout)


def test_only_temps_whose_writer_is_gone_are_swept(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    alive = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        dead = _dead_pid()
        names = {
            "mine": temp_name(),  # this process: alive
            "child": f".syncd-{alive.pid}-0123456789ab.tmp",  # another live process
            "dead": f".syncd-{dead}-0123456789ab.tmp",
            "old style": ".syncd-0123456789ab.tmp",  # no pid, changed just now
            "other": ".syncd-x.tmp.jsonl",
            "session": "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b.jsonl",
        }
        for name in names.values():
            (tmp_path / name).write_bytes(b"x" * 100)
        # Named like a dead writer's temp, but not a regular file: never touched.
        (tmp_path / f".syncd-{dead}-00000000000a.tmp").mkdir()
        os.symlink(tmp_path / names["session"], tmp_path / f".syncd-{dead}-00000000000b.tmp")
        removed = sweep_temps(os.fsencode(tmp_path))
        assert removed == [os.fsencode(tmp_path / names["dead"])]
        left = {p.name for p in tmp_path.iterdir()}
        assert left == {*names.values(), f".syncd-{dead}-00000000000a.tmp",
                        f".syncd-{dead}-00000000000b.tmp"} - {names["dead"]}
        # An older version's temp, unchanged for an hour, is gone too.
        monkeypatch.setattr(claude, "OLD_TEMP_AGE", -1.0)
        assert sweep_temps(os.fsencode(tmp_path)) == [os.fsencode(tmp_path / names["old style"])]
        assert (tmp_path / names["mine"]).exists() and (tmp_path / names["child"]).exists()
    finally:
        alive.communicate(b"")
    # Its writer gone now, the other process's temp goes too.
    assert sweep_temps(os.fsencode(tmp_path)) == [os.fsencode(tmp_path / names["child"])]


def test_tree_writable_looks_where_imports_go(tmp_path: Path) -> None:
    tree = tmp_path / "claude"
    assert tree_writable(tree) is None  # not there yet: made by the first import
    tree.mkdir()
    assert tree_writable(tree) is None
    (tree / "projects").mkdir()
    assert tree_writable(tree) is None
    link = tmp_path / "link"
    link.symlink_to(tree)
    assert tree_writable(link) is None  # a tree that is a symlink is fine
    (tree / "projects").rmdir()
    (tree / "projects").write_text("")
    assert tree_writable(tree) == f"{tree / 'projects'}: Not a directory"
    (tree / "projects").unlink()
    (tree / "projects").symlink_to(tmp_path)  # restore never writes through one
    assert tree_writable(tree) == \
        f"{tree / 'projects'}: Not a directory (a symlink: restore does not follow it)"


# Says it runs, then prints what tree_writable says of argv[1] and what creating a file
# there does.
_CHECK = """import os, sys, pathlib
print("checking", flush=True)
from syncd.claude import tree_writable
print(tree_writable(pathlib.Path(sys.argv[1])))
try:
    os.close(os.open(os.path.join(sys.argv[1], "probe"), os.O_CREAT | os.O_WRONLY, 0o600))
    print("created")
except OSError as e:
    print(e.strerror)
"""


def _checked(argv: list[str], what: str) -> list[str]:
    """``_CHECK``'s lines, run by ``argv``; a skip when the tool that sets it up cannot
    (the check never ran), never when the check itself fails."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    lines = r.stdout.splitlines()
    if lines[:1] != ["checking"]:
        pytest.skip(f"{what} is not permitted here: {r.stderr.strip()[:200]}")
    assert r.returncode == 0, r.stderr
    return lines[1:]


def test_tree_writable_sees_a_read_only_mount_even_as_root(tmp_path: Path) -> None:
    """The service's sandbox (ProtectSystem=strict without the tree in ReadWritePaths) is
    a read-only bind mount: file modes say nothing of it, and root writes anywhere else."""
    unshare = shutil.which("unshare")
    if unshare is None or sys.platform != "linux":
        pytest.skip("unshare (util-linux) is needed for a private read-only mount")
    tree = tmp_path / "claude"
    (tree / "projects").mkdir(parents=True)
    assert tree_writable(tree) is None
    script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" && '
              'exec "$2" -c "$3" "$4"')
    out = _checked([unshare, "-m", "sh", "-c", script, "sh", str(tree), sys.executable,
                    _CHECK, str(tree / "projects")], "a private read-only mount (unshare -m)")
    assert out == [f"{tree / 'projects'}: Read-only file system", "Read-only file system"]
    assert tree_writable(tree) is None and not (tree / "projects" / "probe").exists()


def test_tree_writable_sees_what_file_modes_forbid(tmp_path: Path) -> None:
    tree = tmp_path / "claude"
    (tree / "projects").mkdir(parents=True)
    (tree / "projects").chmod(0o500)
    try:
        argv = [sys.executable, "-c", _CHECK, str(tree / "projects")]
        if os.geteuid() == 0:  # root without the capability that lets it ignore modes
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                pytest.skip("root ignores file modes; setpriv (util-linux) can drop that")
            caps = "-dac_override,-dac_read_search"
            argv = [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}", *argv]
        out = _checked(argv, "dropping CAP_DAC_OVERRIDE (setpriv)")
    finally:
        (tree / "projects").chmod(0o700)
    assert out == [f"{tree / 'projects'}: Permission denied", "Permission denied"]


def test_exclude_glob() -> None:
    sel = Selection(exclude=["projects/*/tool-results/**", "file-history/"])
    assert not sel.wants("projects/a/tool-results/t.txt")
    assert not sel.wants("file-history/s/x")
    assert sel.wants("projects/a/s.jsonl")


def test_star_stays_in_one_directory() -> None:
    sel = Selection(include=["projects/*.jsonl"])
    assert sel.wants("projects/a.jsonl")
    assert not sel.wants("projects/x/a.jsonl")


def test_may_descend_prunes_unrelated_dirs() -> None:
    sel = Selection()
    assert sel.may_descend("projects")
    assert sel.may_descend("projects/-home-a/sid/subagents")
    assert not sel.may_descend("shell-snapshots")
    assert not sel.may_descend("plugins/cache")


def test_default_root_honours_claude_config_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", "/tmp/cc")
    assert str(default_root()) == "/tmp/cc"
    monkeypatch.delenv("CLAUDE_CONFIG_DIR")
    assert default_root().name == ".claude"


@pytest.mark.parametrize("path,folder", [
    ("/home/alice/code/app", "-home-alice-code-app"),
    ("/Users/bob/my project", "-Users-bob-my-project"),
    ("/home/a/café", "-home-a-caf-"),
    ("/home/a/🚀x", "-home-a---x"),
    ("C:\\Users\\bob\\app", "C--Users-bob-app"),
    ("/home/a/repo/.claude/worktrees/feat", "-home-a-repo--claude-worktrees-feat"),
])
def test_project_folder(path: str, folder: str) -> None:
    from syncd.claude import project_folder

    assert project_folder(path) == folder


def test_long_project_folder_matches_the_real_cli() -> None:
    from syncd.claude import project_folder

    path = "/home/alice/code/" + "a-very-long-directory-name/" * 9 + "project"
    name = project_folder(path)
    assert name.endswith("-1wttu5") and len(name) == 200 + len("-1wttu5")
    assert name[:200] == path.replace("/", "-")[:200]


def test_a_folder_is_recognised_by_any_known_variant_of_the_rule() -> None:
    long = "/home/alice/" + "a-very-long-directory-name/" * 9 + "project"
    mine = project_folder(long)
    assert len(mine) > 200 and folder_match(long, mine) == "exact"
    bun = mine[:200] + "-3k9zq1"  # another runtime's hash suffix
    assert folder_match(long, bun) == "prefix"
    assert folder_match(long + "/sub", mine) == "prefix"  # a subdirectory matches too
    assert folder_match(long, mine[:199] + "x-3k9zq1") is None
    assert folder_match(long, mine[:200]) is None  # no suffix: not a long name's folder
    emoji = "/home/alice/\U0001F600app"
    assert project_folder(emoji) == "-home-alice---app"
    assert folder_match(emoji, "-home-alice---app") == "exact"
    assert folder_match(emoji, "-home-alice--app") == "variant"
    assert folder_match(emoji, "-home-alice-app") is None
    assert folder_match("/home/alice/app", "-home-alice-ap") is None

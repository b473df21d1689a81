"""The user's config files: backed up by default, restored only with ``--config``, paths
remapped, a dry run's diff (secrets hidden), the local file kept beside its replacement.

The round trips run the real command line: ``syncd sync`` on one machine (its home
``/…/desk``), ``syncd restore --machine desk`` on another (home ``/…/laptop``), over one
``file://`` store, plain and encrypted."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from syncd.claude import DEFAULT_INCLUDE, USER_CONFIG, Selection, is_user_config
from syncd.errors import RestoreError
from syncd.restore.remap import Remapper, Rule
from syncd.restore.userconfig import (
    config_diff,
    install_config,
    keep_beside,
    remapped,
    restored_mode,
)
from tests.hostile import MB, Piece, rss_bound
from tests.test_hostile_store import World, sane

PASSPHRASE = "correct horse battery staple"
SECRET = "sk-ant-api03-0123456789abcdefSECRET"


def _settings(home: str) -> bytes:
    doc = {"env": {"ANTHROPIC_API_KEY": SECRET, "DEBUG": "1"},
           "hooks": {"PostToolUse": [{"matcher": "Edit", "hooks": [
               {"type": "command", "command": f"{home}/.claude/hooks/fmt.sh --root {home}/src"}]}]},
           "statusLine": {"type": "command", "command": f"{home}/.claude/statusline.sh"},
           "permissions": {"additionalDirectories": [f"{home}/notes", "/srv/shared"]}}
    return json.dumps(doc, indent=2).encode() + b"\n"


def _config_files(home: str) -> dict[str, bytes]:
    return {
        "settings.json": _settings(home),
        "CLAUDE.md": f"Notes live in {home}/notes; never in {home}/notesarchive.\n".encode(),
        "keybindings.json": b'{"bindings": []}\n',
        "commands/ship.md": b"Run the release checklist.\n",
        "agents/linter.md": b"---\nname: linter\n---\nLint carefully.\n",
        "skills/pdf/SKILL.md": b"---\nname: pdf\n---\nUse the script.\n",
        "skills/pdf/logo.bin": b"\x00\x01/home\xff" + home.encode(),
        "hooks/fmt.sh": f"#!/bin/sh\nexec {home}/bin/fmt \"$@\"\n".encode(),
        "statusline.sh": b"#!/bin/sh\necho ok\n",
        "plugins/installed_plugins.json":
            json.dumps({"plugins": {"x@m": [{"installPath":
                        f"{home}/.claude/plugins/cache/m/x"}]}}).encode(),
    }


# -- what is backed up ----------------------------------------------------------------------

def test_config_files_are_in_the_default_include_set() -> None:
    sel = Selection(DEFAULT_INCLUDE)
    for rel in _config_files("/h"):
        assert sel.wants(rel) and is_user_config(rel), rel
    # Not the plugins themselves, nor credentials, nor project settings.
    for rel in ("plugins/cache/m/x/plugin.json", "plugins/marketplaces/m/README.md",
                ".credentials.json", "settings.local.json"):
        assert not is_user_config(rel), rel
    assert not sel.wants(".credentials.json")
    assert set(USER_CONFIG) <= set(DEFAULT_INCLUDE)
    assert not is_user_config("projects/-h-app/CLAUDE.md")


# -- remapping, modes, diffs, kept copies ---------------------------------------------------

def test_text_is_remapped_at_path_boundaries_and_binary_files_are_kept() -> None:
    remap = Remapper([Rule("/home/alice", "/Users/alice")])
    assert remapped(b"cd /home/alice/x && /home/alicex\n", remap) == \
        b"cd /Users/alice/x && /home/alicex\n"
    blob = b"\x00\x01/home/alice/x\xff"
    assert remapped(blob, remap) == blob
    assert remapped(b"/home/alice", Remapper([])) == b"/home/alice"


def test_only_the_owner_keeps_an_executable_bit() -> None:
    assert restored_mode(0o755) == 0o700
    assert restored_mode(0o4777) == 0o700
    assert restored_mode(0o644) == 0o600
    assert restored_mode(0o666) == 0o600


def test_the_diff_hides_env_values_and_names_both_sides() -> None:
    old = _settings("/home/bob")
    new = _settings("/home/bob").replace(SECRET.encode(), b"sk-ant-other").replace(
        b"/srv/shared", b"/srv/team")
    d = config_diff("settings.json", old, new)
    assert d.startswith("--- local/settings.json\n+++ backup/settings.json\n"
                        "# env values that differ (not shown): ANTHROPIC_API_KEY\n")
    assert SECRET not in d and "sk-ant-other" not in d
    created = config_diff("settings.json", None, new)
    assert '+    "ANTHROPIC_API_KEY": "<hidden>",' in created and "sk-ant-other" not in created
    assert '+      "/srv/team"' in d and '-      "/srv/shared"' in d
    created = config_diff("CLAUDE.md", None, b"a\nb")
    assert created.startswith("--- /dev/null\n+++ backup/CLAUDE.md\n")
    assert "+b\n\\ No newline at end of file\n" in created
    assert config_diff("x.bin", b"a", b"\x00") == \
        "Binary files local/x.bin and backup/x.bin differ\n"


def test_a_long_diff_is_cut_and_says_how_much_more() -> None:
    new = b"".join(b"line %d\n" % i for i in range(1000))
    d = config_diff("CLAUDE.md", None, new)
    assert len(d.splitlines()) == 401 and d.endswith("(more lines: the diff stops at 400)\n")
    big = b"x" * (300 << 10)
    assert config_diff("CLAUDE.md", b"", big) == \
        "(local/CLAUDE.md 0 bytes, backup/CLAUDE.md 307200 bytes: too big to show)\n"


def test_the_kept_copy_is_the_local_file_beside_it_and_never_overwritten(
        tmp_path: Path) -> None:
    dest = tmp_path / "settings.json"
    dest.write_bytes(b"one")
    a = keep_beside(os.fsencode(dest))
    dest.unlink()
    dest.write_bytes(b"two")
    b = keep_beside(os.fsencode(dest))
    assert a != b and Path(a).read_bytes() == b"one" and Path(b).read_bytes() == b"two"
    assert Path(a).parent == tmp_path and ".before-restore-" in Path(a).name
    assert os.stat(b).st_ino == dest.stat().st_ino  # the very file, not a copy of it


def test_a_config_file_is_installed_over_the_local_one_or_never_over_a_new_one(
        tmp_path: Path) -> None:
    dest = os.fsencode(tmp_path / "CLAUDE.md")
    assert install_config(dest, b"new\n", 10**18, 0o600, replacing=False) is None
    assert Path(os.fsdecode(dest)).read_bytes() == b"new\n"
    with pytest.raises(RestoreError, match="appeared while being restored"):
        install_config(dest, b"other\n", 10**18, 0o600, replacing=False)
    kept = install_config(dest, b"newer\n", 10**18, 0o700, replacing=True)
    assert kept is not None and Path(kept).read_bytes() == b"new\n"
    assert Path(os.fsdecode(dest)).read_bytes() == b"newer\n"
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o700
    assert sorted(p.name for p in tmp_path.iterdir() if ".syncd-" in p.name) == []


# -- round trips through the command line ---------------------------------------------------

@dataclass
class Machines:
    tmp: Path
    store: Path
    passphrase: str | None

    def env(self, name: str) -> dict[str, str]:
        home = self.tmp / name
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
        env.update({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                    "XDG_STATE_HOME": str(home / ".local/state"),
                    "CLAUDE_CONFIG_DIR": str(home / ".claude"), "SYNCD_CONFIG": os.devnull,
                    "SYNCD_MACHINE_ID": name, "SYNCD_STORE": self.store.as_uri()})
        if self.passphrase:
            env["SYNCD_PASSPHRASE"] = self.passphrase
        return env

    def syncd(self, name: str, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([sys.executable, "-m", "syncd", *args], env=self.env(name),
                           capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr)
        return r

    def claude(self, name: str) -> Path:
        return self.tmp / name / ".claude"


@pytest.fixture(params=["plain", "encrypted"])
def desk(request: pytest.FixtureRequest, tmp_path: Path) -> Machines:
    """The desk machine backed up its config (and one transcript) into the store."""
    m = Machines(tmp_path, tmp_path / "store",
                 PASSPHRASE if request.param == "encrypted" else None)
    if m.passphrase:
        m.syncd("desk", "init", "--encrypt")
    home = str(tmp_path / "desk")
    for rel, data in _config_files(home).items():
        p = m.claude("desk") / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (m.claude("desk") / "hooks/fmt.sh").chmod(0o755)
    t = m.claude("desk") / "projects" / "-x" / "0f8e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b.jsonl"
    t.parent.mkdir(parents=True)
    t.write_bytes(b'{"type":"user","cwd":"/x","uuid":"u1"}\n')
    r = m.syncd("desk", "sync")
    assert SECRET not in r.stdout + r.stderr
    return m


def test_config_comes_back_remapped_only_with_config(desk: Machines) -> None:
    laptop, desk_home = str(desk.tmp / "laptop"), str(desk.tmp / "desk")
    mine = desk.claude("laptop") / "CLAUDE.md"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"the laptop's own\n")
    r = desk.syncd("laptop", "restore", "--machine", "desk")
    assert not (desk.claude("laptop") / "settings.json").exists()
    assert mine.read_bytes() == b"the laptop's own\n"
    assert sorted(p.name for p in desk.claude("laptop").iterdir()) == ["CLAUDE.md", "projects"]
    assert "restored only with --config" in r.stdout
    mine.unlink()
    assert any(p.suffix == ".jsonl" for p in (desk.claude("laptop") / "projects").rglob("*"))

    desk.syncd("laptop", "restore", "--machine", "desk", "--config")
    for rel, data in _config_files(desk_home).items():
        got = (desk.claude("laptop") / rel).read_bytes()
        if rel == "skills/pdf/logo.bin":  # binary: as it was
            assert got == data
        else:
            assert got == _config_files(laptop)[rel], rel
    hook = json.loads((desk.claude("laptop") / "settings.json").read_bytes())
    assert hook["hooks"]["PostToolUse"][0]["hooks"][0]["command"] == \
        f"{laptop}/.claude/hooks/fmt.sh --root {laptop}/src"
    assert hook["permissions"]["additionalDirectories"] == [f"{laptop}/notes", "/srv/shared"]
    assert stat.S_IMODE((desk.claude("laptop") / "hooks/fmt.sh").stat().st_mode) == 0o700
    assert stat.S_IMODE((desk.claude("laptop") / "CLAUDE.md").stat().st_mode) == 0o600


def test_a_dry_run_shows_a_diff_and_changes_nothing(desk: Machines) -> None:
    laptop = str(desk.tmp / "laptop")
    mine = desk.claude("laptop") / "settings.json"
    mine.parent.mkdir(parents=True)
    local = _settings(laptop).replace(b'"DEBUG": "1"', b'"DEBUG": "0"')
    mine.write_bytes(local)
    r = desk.syncd("laptop", "restore", "--machine", "desk", "--config", "--dry-run")
    assert "replace      settings.json" in r.stdout
    assert ("--- local/settings.json\n+++ backup/settings.json\n"
            "# env values that differ (not shown): DEBUG\n") in r.stdout
    assert SECRET not in r.stdout
    assert "--- /dev/null\n+++ backup/CLAUDE.md\n" in r.stdout
    assert mine.read_bytes() == local
    assert not (desk.claude("laptop") / "CLAUDE.md").exists()
    doc = json.loads(desk.syncd("laptop", "restore", "--machine", "desk", "--config",
                                "--dry-run", "--json").stdout)
    [act] = [a for a in doc["actions"] if a["path"] == "settings.json"]
    assert act["action"] == "replace" and act["diff"].startswith("--- local/settings.json")


def test_a_local_file_that_differs_is_kept_beside_the_restored_one(desk: Machines) -> None:
    laptop = str(desk.tmp / "laptop")
    mine = desk.claude("laptop") / "CLAUDE.md"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"my laptop's own notes\n")
    r = desk.syncd("laptop", "restore", "--machine", "desk", "--config")
    assert mine.read_bytes() == _config_files(laptop)["CLAUDE.md"]
    [kept] = list(mine.parent.glob("CLAUDE.md.before-restore-*"))
    assert kept.read_bytes() == b"my laptop's own notes\n"
    assert f"[local kept: {kept}]" in r.stdout
    # Again: now identical, nothing replaced and no second copy.
    desk.syncd("laptop", "restore", "--machine", "desk", "--config")
    assert len(list(mine.parent.glob("CLAUDE.md.before-restore-*"))) == 1


def test_a_plain_restore_says_config_files_already_here_are_identical(
        desk: Machines) -> None:
    """Not "refuse": they are here as the backup has them (said without fetching them)."""
    def plan(name: str, *args: str) -> dict[str, list[str]]:
        r = desk.syncd(name, "restore", "--dry-run", *args)
        out: dict[str, list[str]] = {}
        for ln in r.stdout.splitlines()[:-1]:
            kind, rel, why = ln.split(maxsplit=2)
            out.setdefault(kind, []).append(f"{rel} {why}")
        return out

    files = sorted(_config_files(str(desk.tmp / "desk")))
    got = plan("desk")
    assert "refuse" not in got, got
    assert [f"{rel} (identical)" for rel in files] == \
        [x for x in got["skip"] if x.split()[0] in files]
    (desk.claude("desk") / "CLAUDE.md").write_bytes(b"changed here since\n")
    assert plan("desk")["refuse"] == ["CLAUDE.md (user config: restored only with --config)"]
    # On the laptop, desk's CLAUDE.md as it is names desk's home: --config would write it
    # remapped, so it is not the same; keybindings.json names no path.
    for rel in ("CLAUDE.md", "keybindings.json"):
        p = desk.claude("laptop") / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_config_files(str(desk.tmp / "desk"))[rel])
    got = plan("laptop", "--machine", "desk")
    assert "CLAUDE.md (user config: restored only with --config)" in got["refuse"], got
    assert "keybindings.json (identical)" in got["skip"], got


# -- a dry run's diff: memory never follows the config file's line count ---------------------

def test_dry_run_diff_of_a_big_config_file_keeps_memory_bounded(tmp_path: Path) -> None:
    """A store's CLAUDE.md of 8 MiB ("a\\n" x 4Mi) makes `restore --config --dry-run`
    peak at ~700 MB (48 MiB, still under MERGE_MAX: MemoryError traceback under 3 GB)."""
    def world(name: str, blob: bytes) -> World:
        w = World(tmp_path / name, sealed=False)
        w.good("desk")
        step = 4 << 20
        w.craft.segment("desk", 2, [Piece("CLAUDE.md", blob[i:i + step], start=i)
                                    for i in range(0, len(blob), step)])
        return w

    clean = world("clean", b"a\n" * 10).syncd("restore", "--machine", "desk", "--config",
                                              "--dry-run")
    assert clean.rc == 0, clean.describe()
    r = world("big", b"a\n" * (4 << 20)).syncd("restore", "--machine", "desk", "--config",
                                               "--dry-run")
    sane(r)
    assert r.maxrss <= rss_bound(clean), (
        f"peak RSS {r.maxrss / MB:.0f} MB, clean {clean.maxrss / MB:.0f} MB\n{r.describe()}")


# -- the dry run's diff never shows an env value ---------------------------------------------------

ENV_SECRET = "hunter2-very-secret-token-0451"


@pytest.mark.parametrize("doc", [
    '{\n  "env": {\n    "API_TOKEN":\n      "%s"\n  }\n}\n',      # value on the next line
    '{\n  "env": {\n    "API\\u005fTOKEN": "%s"\n  }\n}\n',        # key written escaped
    '{\n  "env": {\n    "A\\/B": "%s"\n  }\n}\n',                  # \\/ in the key
    '{\n  "env": {\n    "API_TOKEN": "%s",\n  }\n}\n',             # not strict JSON
], ids=["multi-line", "escaped-key", "escaped-slash", "trailing-comma"])
@pytest.mark.parametrize("side", ["local", "backup"])
def test_dry_run_diff_never_shows_an_env_value(doc: str, side: str) -> None:
    text = (doc % ENV_SECRET).encode()
    d = (config_diff("settings.json", text, b"{}\n") if side == "local"
         else config_diff("settings.json", None, text))
    assert ENV_SECRET not in d, d

"""Several Claude trees on one machine (``sources``): each backed up under its own machine
id, restored and followed into its own tree; a symlinked root is followed, a symlink in
it is not; bad configuration is one line, exit 2."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from syncd.backup.engine import sync_once
from syncd.backup.state import State
from syncd.claude import project_folder
from syncd.config import Settings, load_settings
from syncd.errors import SyncError
from syncd.follow.follower import Follower
from syncd.repository import Repository
from syncd.restore.restorer import restore_tree
from syncd.service import catchup
from syncd.service.notify import Notifier
from syncd.service.trees import Trees, _Hub
from syncd.store import open_store
from syncd.store.memory import MemoryStore
from tests.helpers import shipped, tree_bytes, wait_for, write
from tests.hostile import line as hline
from tests.seaweed import Seaweed

SID_A = "0b5f6b3e-1111-4c1e-9d59-5a0a1d6e2f01"
SID_B = "0b5f6b3e-2222-4c1e-9d59-5a0a1d6e2f02"
LINE = b'{"type":"user","message":{"role":"user","content":"hi"}}\n'


def _config(tmp_path: Path, store: str, sources: str, extra: str = "") -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f'machine_id = "m1"\nsource = "{tmp_path / "home"}"\nstore = "{store}"\n'
                    f'state_dir = "{tmp_path / "state"}"\nflush_quiet = 0.2\n'
                    f"flush_max_delay = 1.0\n{extra}{sources}")
    return path


def _source(name: str, root: Path) -> str:
    return f'[[sources]]\nname = "{name}"\nroot = "{root}"\n'


def _syncd(config: Path, *args: str, extra_env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")}
    env.update({"SYNCD_CONFIG": str(config), **(extra_env or {})})
    return subprocess.run([sys.executable, "-m", "syncd", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def _two_trees(tmp_path: Path) -> tuple[Path, Path]:
    """A default tree and a work tree, each with files of its own."""
    home, work = tmp_path / "home", tmp_path / "work"
    write(home, f"projects/-home-a/{SID_A}.jsonl", LINE)
    write(home, "history.jsonl", b'{"display":"home"}\n')
    write(work, f"projects/-home-b/{SID_B}.jsonl", LINE * 3)
    write(work, "history.jsonl", b'{"display":"work"}\n')
    return home, work


def test_sync_backs_up_two_trees_apart_and_restores_each_into_its_own(
        tmp_path: Path, seaweed: Seaweed, bucket: str) -> None:
    home, work = _two_trees(tmp_path)
    config = _config(tmp_path, f"s3://{bucket}/b", _source("work", work),
                     f's3_endpoint_url = "{seaweed.endpoint}"\n')
    r = _syncd(config, "sync")
    assert r.returncode == 0, r.stderr
    assert "synced default: 2 files" in r.stdout and "synced work: 2 files" in r.stdout
    keys = sorted(o["Key"] for o in seaweed.client().list_objects_v2(
        Bucket=bucket)["Contents"])
    assert keys == ["b/machines/m1--work/head", "b/machines/m1--work/machine.json",
                    "b/machines/m1--work/seg/0000000000000000", "b/machines/m1/head",
                    "b/machines/m1/machine.json", "b/machines/m1/seg/0000000000000000"]

    r = _syncd(config, "restore", "--source", "work", "--to", str(tmp_path / "out-work"))
    assert r.returncode == 0, r.stderr
    assert tree_bytes(tmp_path / "out-work") == tree_bytes(work)
    r = _syncd(config, "restore", "--to", str(tmp_path / "out-home"))
    assert r.returncode == 0, r.stderr
    assert tree_bytes(tmp_path / "out-home") == tree_bytes(home)
    # Into its own tree when no --to is given: the work tree lost, the default one not.
    before = tree_bytes(home)
    os.unlink(work / "history.jsonl")
    r = _syncd(config, "restore", "--source", "work")
    assert r.returncode == 0, r.stderr
    assert (work / "history.jsonl").read_bytes() == b'{"display":"work"}\n'
    assert tree_bytes(home) == before

    rows = json.loads(_syncd(config, "sessions", "--json").stdout)
    assert sorted((r["session_id"], r["machine"], r["here"]) for r in rows) == [
        (SID_A, "m1", "yes"), (SID_B, "m1--work", "yes")]
    marked = [line.split()[1] for line in _syncd(config, "machines").stdout.splitlines()
              if line.startswith("*")]
    assert marked == ["m1", "m1--work"]
    s = json.loads(_syncd(config, "status", "--json").stdout)
    assert (s["tree"], s["machine_id"], s["files_tracked"]) == ("default", "m1", 2)
    [w] = s["sources"]
    assert (w["tree"], w["machine_id"], w["source"], w["files_tracked"]) == (
        "work", "m1--work", str(work), 2)
    text = _syncd(config, "status").stdout
    assert "tree:         work\nmachine:      m1--work" in text
    one = json.loads(_syncd(config, "status", "--json", "--source", "work").stdout)
    assert one["machine_id"] == "m1--work" and "sources" not in one


def _settings(tmp_path: Path, sources: list[dict[str, object]],
              **kw: object) -> Settings:
    base: dict[str, object] = dict(
        source=tmp_path / "home", store=(tmp_path / "store").as_uri(),
        state_dir=tmp_path / "state", machine_id="m1", flush_quiet=0.2,
        flush_max_delay=1.0, sources=sources)
    base.update(kw)
    return load_settings(config_file=tmp_path / "none.toml", **base)


@contextmanager
def _running(settings: Settings) -> Iterator[Trees]:
    trees = Trees(settings)
    trees.start()
    try:
        yield trees
    finally:
        trees.request_stop()
        assert trees.wait(30), "a tree did not stop"


def _restored(s: Settings, target: Path) -> dict[bytes, bytes]:
    store = open_store(s.store)
    restore_tree(Repository(store, s.machine_id), target)
    return tree_bytes(target)


def test_daemon_backs_up_each_tree_and_one_failing_stops_no_other(tmp_path: Path) -> None:
    home, work = _two_trees(tmp_path)
    # A root that is a file: that tree cannot start; the others must not care.
    write(tmp_path, "broken", b"not a directory")
    s = _settings(tmp_path, [{"name": "work", "root": str(work)},
                             {"name": "broken", "root": str(tmp_path / "broken")}])
    ws = s.for_source("work")
    rel_b = f"projects/-home-b/{SID_B}.jsonl"
    with _running(s) as trees:
        wait_for(lambda: "broken" in trees.failed, what="the broken tree to fail")
        assert isinstance(trees.failed["broken"], SyncError)
        wait_for(lambda: shipped(ws, rel_b) == 3 * len(LINE), what="work's seed")
        wait_for(lambda: shipped(s, "history.jsonl") > 0, what="the default tree's seed")
        # Appends after the start are seen by each tree's own watcher.
        write(work, rel_b, LINE, mode="ab")
        write(home, "history.jsonl", b'{"display":"again"}\n', mode="ab")
        wait_for(lambda: shipped(ws, rel_b) == 4 * len(LINE), what="work's append")
        wait_for(lambda: shipped(s, "history.jsonl") == os.path.getsize(
            home / "history.jsonl"), what="the default tree's append")
        assert set(trees.failed) == {"broken"}
    # Each tree its own state, lease and seq: both start at seq 0.
    for one in (s, ws):
        st = State(one.state_file, readonly=True)
        try:
            assert st.meta("lease_owner")
            assert st.next_seq >= 1
        finally:
            st.close()
    assert s.state_file != ws.state_file
    assert _restored(ws, tmp_path / "out-work") == tree_bytes(work)
    assert _restored(s, tmp_path / "out-home") == tree_bytes(home)


def test_a_symlinked_root_is_backed_up_and_a_symlink_inside_it_is_not(
        tmp_path: Path) -> None:
    real, outside = tmp_path / "real-work", tmp_path / "outside"
    rel = f"projects/-home-b/{SID_B}.jsonl"
    write(real, rel, LINE)
    write(outside, f"{SID_A}.jsonl", LINE)
    write(outside, "sub/history.jsonl", LINE)
    (tmp_path / "home").mkdir()
    (tmp_path / "work").symlink_to(real)
    (real / "projects" / "elsewhere").symlink_to(outside)
    (real / "history.jsonl").symlink_to(outside / "sub" / "history.jsonl")
    s = _settings(tmp_path, [{"name": "work", "root": str(tmp_path / "work")}])
    ws = s.for_source("work")
    with _running(s) as trees:
        wait_for(lambda: shipped(ws, rel) == len(LINE), what="the linked tree's seed")
        # Events come through the linked root; not through the link inside it.
        write(real, rel, LINE, mode="ab")
        write(outside, f"{SID_A}.jsonl", LINE, mode="ab")
        write(real, "projects/-home-c/new.jsonl", LINE)
        wait_for(lambda: shipped(ws, rel) == 2 * len(LINE) and shipped(
            ws, "projects/-home-c/new.jsonl") == len(LINE), what="the appends")
        assert not trees.failed
    assert shipped(ws, f"projects/elsewhere/{SID_A}.jsonl") == -1
    assert shipped(ws, "history.jsonl") == -1
    got = _restored(ws, tmp_path / "out")
    assert got == {rel.encode(): LINE * 2, b"projects/-home-c/new.jsonl": LINE}
    # Restored into its own tree through the link; nothing through the link inside it.
    os.unlink(real / rel)
    outside_before = tree_bytes(outside)
    restore_tree(Repository(open_store(ws.store), ws.machine_id), tmp_path / "work")
    assert (real / rel).read_bytes() == LINE * 2
    assert (tmp_path / "work").is_symlink() and tree_bytes(outside) == outside_before


def test_sync_of_a_tree_that_fails_leaves_the_others_synced(tmp_path: Path) -> None:
    home, work = _two_trees(tmp_path)
    write(tmp_path, "broken", b"not a directory")
    config = _config(tmp_path, (tmp_path / "store").as_uri(),
                     _source("broken", tmp_path / "broken") + _source("work", work))
    r = _syncd(config, "sync")
    assert r.returncode == 1
    assert "synced default: 2 files" in r.stdout and "synced work: 2 files" in r.stdout
    assert f"syncd: tree broken: source {tmp_path / 'broken'} is not a directory" in r.stderr
    assert r.stderr.splitlines()[-1] == "syncd: tree broken not synced"
    s = load_settings(config)
    assert shipped(s.for_source("work"), "history.jsonl") == len(b'{"display":"work"}\n')
    assert shipped(s, "history.jsonl") == os.path.getsize(home / "history.jsonl")


@pytest.mark.parametrize("sources,says", [
    ('[[sources]]\nname = "w"\nroot = "{a}"\n[[sources]]\nname = "w"\nroot = "{b}"\n',
     "two sources are named 'w'"),
    ('[[sources]]\nname = "a.b"\nroot = "{a}"\n', "'a.b' is not a source name"),
    ('[[sources]]\nname = "a--b"\nroot = "{a}"\n', "'a--b' is not a source name"),
    (f'[[sources]]\nname = "{"a-" * 16}b"\nroot = "{{a}}"\n', "is not a source name"),
    ('[[sources]]\nname = "default"\nroot = "{a}"\n', "'default' is the tree `source` names"),
    ('[[sources]]\nname = "x"\nroot = "{a}"\n[[sources]]\nname = "y"\nroot = "{link}"\n',
     "sources 'x' and 'y' are the same tree"),
    ('[[sources]]\nname = "x"\nroot = "{home}"\n', "source 'x' is the tree `source` names"),
    (f'[[sources]]\nname = "{"n" * 32}"\nroot = "{{a}}"\nmachine_id = "{"m" * 64}"\n'
     f'[[sources]]\nname = "y"\nroot = "{{b}}"\nmachine_id = "{"m" * 64}"\n',
     "is another tree's"),
])
def test_bad_sources_are_one_line_and_exit_2(tmp_path: Path, sources: str,
                                             says: str) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    body = sources.format(a=tmp_path / "a", b=tmp_path / "b", link=tmp_path / "link",
                          home=tmp_path / "home")
    config = _config(tmp_path, (tmp_path / "store").as_uri(), body)
    for command in ("sync", "run", "status"):
        r = _syncd(config, command)
        assert r.returncode == 2, (command, r.stderr)
        assert r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
        assert f"{config}, line" in r.stderr and "sources" in r.stderr
    assert not (tmp_path / "store").exists()


def test_a_source_whose_machine_id_would_be_too_long_says_so(tmp_path: Path) -> None:
    config = _config(tmp_path, (tmp_path / "store").as_uri(),
                     _source("n" * 32, tmp_path / "a")).read_text()
    path = tmp_path / "long.toml"
    path.write_text(config.replace('machine_id = "m1"', f'machine_id = "{"m" * 40}"'))
    r = _syncd(path, "sync")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "set its machine_id" in r.stderr


def test_an_unknown_source_is_bad_usage(tmp_path: Path) -> None:
    config = _config(tmp_path, (tmp_path / "store").as_uri(), _source("work", tmp_path / "w"))
    r = _syncd(config, "restore", "--source", "play", "--to", str(tmp_path / "out"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "--source: no source named 'play' (the configuration has: default, work)" \
        in r.stderr


def test_each_tree_follows_the_same_named_tree_of_other_machines(tmp_path: Path) -> None:
    s = _settings(tmp_path, [{"name": "work", "root": str(tmp_path / "work")},
                             {"name": "play", "root": str(tmp_path / "play"),
                              "follow": ["lap--games"]}],
                  follow=["desk", "*"])
    trees = {t.name: t for t in s.trees()}
    assert trees["default"].follow == ["desk", "*"]
    assert trees["work"].follow == ["desk--work", "*"]
    assert trees["play"].follow == ["lap--games"]  # its own follow wins
    store = MemoryStore()
    for m in ("m1", "m1--work", "m1--play", "lap", "lap--work", "lap--play", "lap--other",
              "desk", "desk--work"):
        store.put(f"machines/{m}/machine.json", json.dumps({"machine": m}).encode())

    def followed(name: str) -> list[str]:
        one = s.for_source(name)
        state = State(one.state_file)
        try:
            return Follower(one, Repository(store, one.machine_id), state).machines()
        finally:
            state.close()

    # Never another tree of this machine; a named tree follows its name's trees, the
    # default one every machine's default (and trees of names it has not).
    assert followed("default") == ["desk", "lap", "lap--other"]
    assert followed("work") == ["desk--work", "lap--work"]
    assert followed("play") == ["lap--games"]


def test_cli_run_backs_up_every_tree_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    _home, work = _two_trees(tmp_path)
    config = _config(tmp_path, (tmp_path / "store").as_uri(), _source("work", work))
    s = load_settings(config)
    ws = s.for_source("work")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")}
    p = subprocess.Popen([sys.executable, "-m", "syncd", "run"],
                         env={**env, "SYNCD_CONFIG": str(config)},
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: shipped(s, "history.jsonl") > 0 and shipped(
            ws, "history.jsonl") > 0, what="both trees' seeds")
        st = json.loads(_syncd(config, "status", "--json").stdout)
        assert st["daemon_pid"] == p.pid and st["sources"][0]["daemon_pid"] == p.pid
        p.send_signal(signal.SIGHUP)
        write(work, "history.jsonl", b'{"display":"after"}\n', mode="ab")
        wait_for(lambda: shipped(ws, "history.jsonl") == os.path.getsize(
            work / "history.jsonl"), what="work's append after the reload")
        p.send_signal(signal.SIGTERM)
        _out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    # Each tree's lines say which it is; the reload was applied by both.
    assert "syncd.daemon[work]: syncd running: machine m1--work" in err
    assert "syncd.daemon[default]: syncd running: machine m1," in err
    assert "syncd.daemon[work]: reloaded configuration" in err
    assert "syncd.daemon[default]: reloaded configuration" in err
    st = json.loads(_syncd(config, "status", "--json").stdout)
    assert st["daemon_pid"] is None and st["sources"][0]["daemon_pid"] is None


class _Recorder(Notifier):
    def __init__(self) -> None:
        super().__init__(env={})
        self.sent: list[tuple[str, ...]] = []

    def send(self, *fields: str) -> bool:
        self.sent.append(fields)
        return True


def test_systemd_hears_ready_once_every_tree_is_up_or_gone() -> None:
    rec = _Recorder()
    hub = _Hub(["default", "work", "play"], rec)
    hub.part("default").ready("idle")
    hub.part("work").status("seeding")
    assert rec.sent == []
    hub.gone("play", "source /x is not a directory")
    assert rec.sent == []
    hub.part("work").ready("idle too")
    assert rec.sent == [("READY=1", "STATUS=default: idle; work: idle too; play: stopped: "
                                    "source /x is not a directory")]
    hub.part("work").status("flushing")
    assert rec.sent[-1] == ("STATUS=default: idle; work: flushing; play: stopped: source /x "
                            "is not a directory",)
    # A reload: RELOADING once, READY again once the living trees applied it.
    hub.reloading()
    assert rec.sent[-1][0] == "RELOADING=1"
    for name in ("default", "work", "play"):
        hub.part(name).reloading()
        hub.part(name).stopping()
    hub.part("default").ready()
    assert rec.sent[-1][0] == "RELOADING=1"
    hub.part("work").ready()  # play, gone, is not waited for
    assert rec.sent[-1][0] == "READY=1" and len(rec.sent) == 4


def test_each_tree_imports_the_same_named_tree_of_a_followed_machine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def machine(name: str, home: Path, **kw: object) -> Settings:
        return load_settings(config_file=tmp_path / "none.toml", source=home / ".claude",
                             store=(tmp_path / "store").as_uri(),
                             state_dir=tmp_path / name / "state", machine_id=name,
                             follow_quiet=0, sources=[
                                 {"name": "work", "root": str(home / ".claude-work")}], **kw)

    alice, bob = tmp_path / "home" / "alice", tmp_path / "users" / "bob"
    desk, laptop = machine("desk", alice), machine("laptop", bob, follow=["desk"])

    def transcript(s: Settings, tree: str, home: Path, sid: str) -> Path:
        root = s.for_source(tree).source
        return root / "projects" / project_folder(f"{home}/app") / f"{sid}.jsonl"

    write(alice, transcript(desk, "default", alice, SID_A), hline(SID_A, f"{alice}/app", 0))
    write(alice, transcript(desk, "work", alice, SID_B), hline(SID_B, f"{alice}/app", 0))
    monkeypatch.setenv("HOME", str(alice))
    for tree in ("default", "work"):
        sync_once(desk.for_source(tree))
    monkeypatch.setenv("HOME", str(bob))
    for tree in ("default", "work"):
        one = laptop.for_source(tree)
        state = State(one.state_file)
        try:
            Follower(one, Repository(open_store(one.store), one.machine_id), state,
                     clock=lambda: 2e9).poll()
        finally:
            state.close()
    assert transcript(laptop, "default", bob, SID_A).read_bytes() == hline(
        SID_A, f"{bob}/app", 0)
    assert transcript(laptop, "work", bob, SID_B).read_bytes() == hline(
        SID_B, f"{bob}/app", 0)
    assert not transcript(laptop, "default", bob, SID_B).exists()
    assert not transcript(laptop, "work", bob, SID_A).exists()


def test_each_trees_backlog_is_shipped_by_a_child_as_that_tree(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="syncd")
    monkeypatch.setattr(catchup, "MIN_FILES", 2)  # decided here; shipped by the child
    home, work = _two_trees(tmp_path)
    s = _settings(tmp_path, [{"name": "work", "root": str(work)}], follow=["*"])
    ws = s.for_source("work")

    def children() -> list[str]:
        return [r.getMessage() for r in list(caplog.records)
                if "shipped by child process" in r.getMessage()]

    with _running(s) as trees:
        wait_for(lambda: len(children()) == 2, what="both trees' children")
        assert not trees.failed
    assert all(m.startswith("start-up catch-up: 2 files") for m in children())
    # follow = "*" in a child too: neither tree took the other for another machine.
    assert not list(home.rglob(f"{SID_B}.jsonl")) and not list(work.rglob(f"{SID_A}.jsonl"))
    assert _restored(ws, tmp_path / "out-work") == tree_bytes(work)
    assert _restored(s, tmp_path / "out-home") == tree_bytes(home)


def test_resume_puts_a_session_into_the_tree_of_its_machines_name(tmp_path: Path) -> None:
    alice, bob = tmp_path / "home" / "alice", tmp_path / "users" / "bob"
    store = (tmp_path / "store").as_uri()

    def config(name: str, home: Path) -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(f'machine_id = "{name}"\nsource = "{home / ".claude"}"\n'
                        f'store = "{store}"\nstate_dir = "{tmp_path / name}"\n'
                        + _source("work", home / ".claude-work"))
        return path

    desk, laptop = config("desk", alice), config("laptop", bob)
    rel = f"projects/{project_folder(f'{alice}/app')}/{SID_B}.jsonl"
    write(alice / ".claude-work", rel, hline(SID_B, f"{alice}/app", 0))
    (alice / ".claude").mkdir()
    assert _syncd(desk, "sync", extra_env={"HOME": str(alice)}).returncode == 0
    (bob / "app").mkdir(parents=True)
    r = _syncd(laptop, "resume", SID_B, extra_env={"HOME": str(bob)})
    assert r.returncode == 0, r.stderr
    got = bob / ".claude-work" / "projects" / project_folder(f"{bob}/app") / f"{SID_B}.jsonl"
    assert got.read_bytes() == hline(SID_B, f"{bob}/app", 0)
    assert not (bob / ".claude").exists()
    assert f"map  {alice / '.claude-work'} -> {bob / '.claude-work'}  (Claude tree)" \
        in r.stdout
    assert r.stdout.splitlines()[-1] == (
        f"cd {bob}/app && CLAUDE_CONFIG_DIR={bob / '.claude-work'} claude --resume {SID_B}")

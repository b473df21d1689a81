from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from syncd.backup.state import State
from syncd.config import Settings, load_settings
from syncd.errors import ConfigError
from syncd.service.status import status
from tests.test_host import SEED, _hex8, host  # noqa: F401 (host: a fixture)


def test_toml_then_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text('store = "s3://bucket/pre"\nflush_quiet = 5.0\nmachine_id = "desk"\n'
                   'exclude = ["file-history/**"]\n')
    s = load_settings(cfg)
    assert (s.store, s.flush_quiet, s.machine_id, s.exclude) == (
        "s3://bucket/pre", 5.0, "desk", ["file-history/**"])
    monkeypatch.setenv("SYNCD_MACHINE_ID", "laptop")
    monkeypatch.setenv("SYNCD_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    s = load_settings(cfg)
    assert s.machine_id == "laptop" and s.s3_endpoint_url == "http://127.0.0.1:9"


def test_the_environment_as_pydantic_settings_read_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings reads SYNCD_* itself: a name in any case, a list or table as JSON, `follow`
    as written, a table over the file's merged key by key, an argument over both; what
    came from anywhere but a default counts as set."""
    cfg = tmp_path / "config.toml"
    cfg.write_text('keep_daily = 3\n[remap]\n"/a" = "/file"\n"/b" = "/file"\n')
    monkeypatch.setenv("syncd_Keep_Daily", "4")
    monkeypatch.setenv("SYNCD_REMAP", '{"/b": "/env", "/c": "/env"}')
    monkeypatch.setenv("SYNCD_INCLUDE", '["projects/**"]')
    monkeypatch.setenv("SYNCD_FOLLOW", "desk, laptop")
    monkeypatch.setenv("SYNCD_CATCHUP_CHILD", "0")
    monkeypatch.setenv("SYNCD_NOT_A_KEY", "1")  # not a setting: not read
    s = load_settings(cfg, keep_daily=5)
    assert (s.keep_daily, s.include, s.follow, s.catchup_child) == (
        5, ["projects/**"], ["desk", "laptop"], False)
    assert s.remap == {"/a": "/file", "/b": "/env", "/c": "/env"}
    assert {"keep_daily", "remap", "include", "follow", "catchup_child"} <= s.model_fields_set
    assert "keep_hourly" not in s.model_fields_set
    monkeypatch.setenv("SYNCD_REMAP", "null")  # unset, so the file's table stands
    assert load_settings(cfg).remap == {"/a": "/file", "/b": "/file"}
    monkeypatch.setenv("SYNCD_REMAP", "/a=/b")
    with pytest.raises(ConfigError, match=r"^\$SYNCD_REMAP: not valid JSON"):
        load_settings(cfg)


def test_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("XDG_DATA_HOME", "XDG_STATE_HOME", "CLAUDE_CONFIG_DIR"):
        monkeypatch.delenv(var, raising=False)
    s = load_settings(tmp_path / "missing.toml")
    assert s.store == (tmp_path / ".local/share/syncd/store").as_uri()
    assert s.source == tmp_path / ".claude"
    assert s.state_dir == tmp_path / ".local/state/syncd"
    assert (s.flush_quiet, s.flush_max_delay) == (2.0, 10.0)


def test_state_file_differs_per_store(tmp_path: Path) -> None:
    a = load_settings(tmp_path / "x.toml", store="s3://a/p", machine_id="m")
    b = load_settings(tmp_path / "x.toml", store="s3://b/p", machine_id="m")
    assert a.state_file != b.state_file and a.state_file.name.startswith("m@")


def test_bare_path_store_is_a_file_url(tmp_path: Path) -> None:
    assert load_settings(tmp_path / "x.toml", store="/srv/b").store == "file:///srv/b"


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "-lead", "x" * 65])
def test_machine_id_is_validated(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match=r"^machine_id: machine id must be"):
        load_settings(tmp_path / "x.toml", machine_id=bad)


def test_unknown_key_is_an_error_with_a_suggestion(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("# timings\nflush_quite = 1\n")
    with pytest.raises(ConfigError) as e:
        load_settings(cfg)
    assert str(e.value) == (f"config file {cfg}, line 2: unknown key `flush_quite` "
                            "(did you mean `flush_quiet`?)")
    cfg.write_text('[remapp]\n"/a" = "/b"\n')
    with pytest.raises(ConfigError, match=r"line 1: unknown key `remapp` \(did you mean `remap`"):
        load_settings(cfg)


def test_toml_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('store = "s3://b/p"\nkeep_daily = = 3\n')
    with pytest.raises(ConfigError) as e:
        load_settings(cfg)
    assert str(e.value).startswith(f"config file {cfg}: invalid TOML: ")
    assert "(at line 2, column 14)" in str(e.value) and "\n" not in str(e.value)
    cfg.write_bytes(b"store = '\xff'\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_settings(cfg)


def test_a_named_config_file_must_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope.toml"
    assert load_settings(missing).keep_daily == 30  # a library caller's "no file"
    with pytest.raises(ConfigError) as e:
        load_settings(missing, config_required=True)
    assert str(e.value) == f"config file {missing} does not exist"
    monkeypatch.setenv("SYNCD_CONFIG", str(missing))
    with pytest.raises(ConfigError, match=r"\(\$SYNCD_CONFIG\) does not exist"):
        load_settings()
    monkeypatch.setenv("SYNCD_CONFIG", "/dev/null")  # explicitly no configuration
    assert load_settings().keep_daily == 30
    monkeypatch.delenv("SYNCD_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))  # the default: may be absent
    assert load_settings().keep_daily == 30
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "dir.toml")


def test_a_bad_value_names_its_file_line_or_variable(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('store = "s3://b/p"\n\n  keep_daily = "many"\n')
    with pytest.raises(ConfigError) as e:
        load_settings(cfg)
    assert str(e.value).startswith(f"config file {cfg}, line 3: keep_daily: ")
    cfg.write_text("")
    monkeypatch.setenv("SYNCD_FLUSH_QUIET", "-1")
    with pytest.raises(ConfigError, match=r"^\$SYNCD_FLUSH_QUIET: flush_quiet: .*greater than 0"):
        load_settings(cfg)


@pytest.mark.parametrize(("text", "line", "says"), [
    ('keep_daily = 3\n\n[remap]\n"/home/a" = "/home/b"\n"/x" = 5\n', 5,
     'remap."/x": Input should be a valid string'),
    ('[remap]\n"/home/a" = "~/b"\n\n# a comment\n\'/srv/app\' = "src/app"\n', 5,
     "remap.\"/srv/app\": 'src/app' is not a path on this machine (absolute, or starting "
     "with ~)"),
    ('remap."/a" = "~/a"\nremap."/b" = ""\n', 2, 'remap."/b": \'\' is not a path'),
    ('[remap]\n"/a" = "/b"\n"" = "/c"\n', 3, 'remap."" (the key): an empty path prefix'),
    ('store = "s3://b/p"\nremap = { "/a" = "/b", "/c" = 1 }\n', 2, 'remap."/c": Input'),
])
def test_a_bad_remap_value_names_its_own_line(tmp_path: Path, text: str, line: int,
                                              says: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_settings(cfg)
    assert str(e.value).startswith(f"config file {cfg}, line {line}: {says}"), str(e.value)


def test_a_bad_remap_entry_is_blamed_on_where_it_is(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The file's and $SYNCD_REMAP's tables are merged: each entry's error names its own
    # source, the other one's being fine.
    cfg = tmp_path / "c.toml"
    cfg.write_text('[remap]\n"/a" = "rel"\n')
    monkeypatch.setenv("SYNCD_REMAP", '{"/b": "/c"}')
    with pytest.raises(ConfigError) as e:
        load_settings(cfg)
    assert str(e.value).startswith(f"config file {cfg}, line 2: remap.\"/a\": "), str(e.value)
    cfg.write_text('[remap]\n"/a" = "/ok"\n')
    monkeypatch.setenv("SYNCD_REMAP", '{"/b": "rel"}')
    with pytest.raises(ConfigError, match=r'^\$SYNCD_REMAP: remap\."/b": \'rel\' is not'):
        load_settings(cfg)


@pytest.mark.parametrize("spelled", ['"/home/zoë"', "'/home/zoë'", '"/home/zo\\u00eb"'])
def test_a_bad_remap_key_beyond_ascii_names_its_line_as_written(tmp_path: Path,
                                                               spelled: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[remap]\n"/a" = "/b"\n{spelled} = "rel"\n')
    with pytest.raises(ConfigError) as e:
        load_settings(cfg)
    assert str(e.value).startswith(f'config file {cfg}, line 3: remap."/home/zoë": '), \
        str(e.value)


@pytest.mark.parametrize(("store", "why"), [("ftp://h/x", "use file:///path"),
                                            ("s3:///prefix", "missing bucket"),
                                            ("file://host/x", "absolute path"),
                                            ("relative/dir", "use file:///path")])
def test_store_urls_are_validated(tmp_path: Path, store: str, why: str) -> None:
    with pytest.raises(ConfigError, match=f"^store: .*{why}"):
        load_settings(tmp_path / "x.toml", store=store)
    home = str(Path.home())
    assert load_settings(tmp_path / "x.toml", store="~/b").store == Path(home, "b").as_uri()


@pytest.mark.parametrize(("key", "bad"), [("keep_within", "two days"),
                                          ("tombstone_keep", "180"),
                                          ("verify_max_duration", "soon"),
                                          ("compact_schedule", "hourly"),
                                          ("prune_schedule", "0 3 * *")])
def test_archive_durations_and_schedules_are_validated(tmp_path: Path, key: str,
                                                       bad: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_settings(config_file=tmp_path / "none.toml", **{key: bad})


def test_archive_settings_accept_intervals_cron_and_off(tmp_path: Path) -> None:
    s = load_settings(config_file=tmp_path / "none.toml", keep_within="2d",
                      compact_schedule="30m", prune_schedule="0 3 * * *",
                      verify_schedule="off")
    assert (s.keep_within, s.compact_schedule, s.prune_schedule, s.verify_schedule) == (
        "2d", "30m", "0 3 * * *", "off")


def test_catchup_child_is_on_by_default_and_can_be_turned_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.toml"
    assert load_settings(cfg).catchup_child is True
    cfg.write_text("catchup_child = false\n")
    assert load_settings(cfg).catchup_child is False
    monkeypatch.setenv("SYNCD_CATCHUP_CHILD", "1")
    assert load_settings(cfg).catchup_child is True


def test_one_parser_for_durations_and_times() -> None:
    from syncd.duration import parse_duration, parse_time
    from syncd.errors import ConfigError

    now = 1_800_000_000.0
    # --at takes every duration the config and retention take, as that long ago.
    for text in ("90s", "30m", "1d12h", "1y2m3d", "1.5h"):
        assert parse_time(text, now=now) == now - parse_duration(text)
    assert parse_time("2026-11-30T14:00:00+00:00") == 1796047200.0
    with pytest.raises(ConfigError, match="cannot read time 'soon'"):
        parse_time("soon")


def test_a_list_variable_that_is_not_json_is_a_config_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from syncd.config import load_settings
    from syncd.duration import parse_duration
    from syncd.errors import ConfigError

    monkeypatch.setenv("SYNCD_INCLUDE", "projects/**")
    with pytest.raises(ConfigError, match=r"^\$SYNCD_INCLUDE: not valid JSON"):
        load_settings(tmp_path / "none.toml")
    assert parse_duration("2 h") == parse_duration("2h") == 7200


# -- the default machine id's upgrade path ----------------------------------------------

def _state(state_dir: Path, machine_id: str, store: str) -> Path:
    tag = hashlib.sha256(store.encode()).hexdigest()[:12]
    path = state_dir / f"{machine_id}@{tag}.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    State(path).close()
    return path


STORE = "s3://bucket/claude"


def _load(tmp_path: Path, cfg: str = "", **overrides: object) -> Settings:
    (tmp_path / "c.toml").write_text(f'store = "{STORE}"\nstate_dir = "{tmp_path / "st"}"\n'
                                     + cfg)
    return load_settings(tmp_path / "c.toml", **overrides)


@pytest.mark.usefixtures("host")
def test_an_upgraded_host_keeps_its_legacy_id(tmp_path: Path) -> None:
    new, legacy = f"alice.laptop-{_hex8(SEED)}", f"laptop-{_hex8(SEED)}"
    assert _load(tmp_path).machine_id == new  # nothing yet: the new id
    old = _state(tmp_path / "st", legacy, STORE)
    s = _load(tmp_path)
    assert (s.machine_id, s.state_file) == (legacy, old)
    assert "machine_id" not in s.model_fields_set  # still a default
    assert s.model_copy(update={"flush_quiet": 9.0}).machine_id == legacy
    shown = status(s)
    assert (shown["machine_id"], shown["state"]) == (legacy, str(old))
    _state(tmp_path / "st", new, STORE)  # both: the new one is in use already
    assert _load(tmp_path).machine_id == new


@pytest.mark.usefixtures("host")
def test_a_legacy_state_for_another_store_is_not_this_ones(tmp_path: Path) -> None:
    _state(tmp_path / "st", f"laptop-{_hex8(SEED)}", "s3://bucket/other")
    assert _load(tmp_path).machine_id == f"alice.laptop-{_hex8(SEED)}"


@pytest.mark.usefixtures("host")
def test_an_explicit_machine_id_always_wins(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    new, legacy = f"alice.laptop-{_hex8(SEED)}", f"laptop-{_hex8(SEED)}"
    _state(tmp_path / "st", legacy, STORE)
    assert _load(tmp_path, 'machine_id = "desk"\n').machine_id == "desk"
    assert _load(tmp_path, f'machine_id = "{new}"\n').machine_id == new
    assert _load(tmp_path, machine_id="arg").machine_id == "arg"
    monkeypatch.setenv("SYNCD_MACHINE_ID", "env")
    assert _load(tmp_path).machine_id == "env"
    monkeypatch.setenv("SYNCD_MACHINE_ID", new)
    assert _load(tmp_path).machine_id == new


def test_conflict_copies_are_bounded_by_default_and_the_bounds_are_validated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.toml"
    s = load_settings(cfg)
    assert (s.conflict_copies, s.conflict_bytes) == (8, 1 << 30)
    cfg.write_text("conflict_copies = 3\nconflict_bytes = 104857600\n")
    assert (load_settings(cfg).conflict_copies, load_settings(cfg).conflict_bytes) == (
        3, 100 << 20)
    monkeypatch.setenv("SYNCD_CONFLICT_BYTES", "1000")  # no copy of a transcript fits
    with pytest.raises(ConfigError, match=r"^\$SYNCD_CONFLICT_BYTES: conflict_bytes: "):
        load_settings(cfg)
    monkeypatch.delenv("SYNCD_CONFLICT_BYTES")
    cfg.write_text("conflict_copies = 0\n")  # every diverged branch dropped
    with pytest.raises(ConfigError, match=r"line 1: conflict_copies: "):
        load_settings(cfg)

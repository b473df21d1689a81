from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from syncd._config import load_settings


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
    with pytest.raises(ValidationError):
        load_settings(tmp_path / "x.toml", machine_id=bad)


def test_unknown_key_is_an_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("flush_quite = 1\n")
    with pytest.raises(ValidationError):
        load_settings(cfg)


@pytest.mark.parametrize(("key", "bad"), [("keep_within", "two days"),
                                          ("tombstone_keep", "180"),
                                          ("verify_max_duration", "soon"),
                                          ("compact_schedule", "hourly"),
                                          ("prune_schedule", "0 3 * *")])
def test_archive_durations_and_schedules_are_validated(tmp_path: Path, key: str,
                                                       bad: str) -> None:
    with pytest.raises(ValidationError, match=key):
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

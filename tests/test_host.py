"""The default machine id: its shape, its user and host parts, and where the host's
identity comes from (every host fact faked: no test depends on the machine it runs on)."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import pytest

from syncd import host as hostmod
from syncd.config import MACHINE_ID

SEED = "0123456789abcdef0123456789abcdef"
FQDN = "laptop.example.net"
UUID = "564D1A2B-3C4D-5E6F-7081-92A3B4C5D6E7"
IOREG_OUT = f"""+-o MacBookPro18,3  <class IOPlatformExpertDevice, id 0x100000220>
    {{
      "IOPlatformSerialNumber" = "C02XXXXXXXXX"
      "IOPlatformUUID" = "{UUID}"
      "model" = <"MacBookPro18,3">
    }}
"""


def _hex8(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:8]


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A made-up host "laptop" with user alice, its machine-id file in tmp_path (returned)
    and no ioreg: nothing depends on the real host's name, user or files."""
    etc = tmp_path / "etc-machine-id"
    etc.write_text(SEED + "\n")
    monkeypatch.setattr(hostmod, "_MACHINE_ID_FILES", (etc, tmp_path / "dbus-machine-id"))
    monkeypatch.setattr(hostmod, "_IOREG", (str(tmp_path / "no-ioreg"), "-rd1", "-c",
                                           "IOPlatformExpertDevice"))
    monkeypatch.setattr(socket, "gethostname", lambda: "laptop.lan")
    monkeypatch.setattr(socket, "getfqdn", lambda: FQDN)
    monkeypatch.setattr(hostmod, "user_name", lambda: "alice")
    monkeypatch.delenv("SYNCD_MACHINE_ID", raising=False)
    return etc


def _ioreg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """An ``ioreg`` stand-in running ``body`` (sh) when called with ioreg's arguments."""
    stub = tmp_path / "ioreg"
    stub.write_text('#!/bin/sh\n[ "$*" = "-rd1 -c IOPlatformExpertDevice" ] || exit 64\n'
                    + body + "\n")
    stub.chmod(0o755)
    monkeypatch.setattr(hostmod, "_IOREG", (str(stub), "-rd1", "-c", "IOPlatformExpertDevice"))


def test_default_machine_id_is_user_dot_legacy_id(host: Path) -> None:
    mid = hostmod.default_machine_id()
    assert mid == f"alice.laptop-{_hex8(SEED)}"
    assert hostmod.legacy_machine_id() == f"laptop-{_hex8(SEED)}"
    assert mid.removeprefix("alice.") == hostmod.legacy_machine_id()  # the upgrade shows
    assert MACHINE_ID.fullmatch(mid)


def test_two_users_on_one_host_differ(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    alice = hostmod.default_machine_id()
    monkeypatch.setattr(hostmod, "user_name", lambda: "bob")
    bob = hostmod.default_machine_id()
    assert alice != bob and bob == f"bob.laptop-{_hex8(SEED)}"


@pytest.mark.parametrize(("user", "part"), [
    ("j.doe", "j.doe"), ("ann smith", "ann-smith"), ("CORP\\bob", "CORP-bob"),
    ("José", "Jose"), ("_svc", "svc"), ("-x-", "x-"), ("..", None), ("山田", None),
    ("", None)])
def test_user_names_become_a_valid_id(host: Path, monkeypatch: pytest.MonkeyPatch,
                                      user: str, part: str | None) -> None:
    monkeypatch.setattr(hostmod, "user_name", lambda: user)
    mid = hostmod.default_machine_id()
    # Nothing usable in the name: the uid still tells users apart.
    assert mid == f"{part or f'uid{os.getuid()}'}.laptop-{_hex8(SEED)}"
    assert MACHINE_ID.fullmatch(mid)


def test_the_user_comes_from_the_os(monkeypatch: pytest.MonkeyPatch) -> None:
    class Entry:
        pw_name = "carol"

    monkeypatch.setattr(hostmod.pwd, "getpwuid", lambda uid: Entry())
    assert hostmod.user_name() == "carol"

    def unknown(uid: int) -> object:
        raise KeyError(uid)

    monkeypatch.setattr(hostmod.pwd, "getpwuid", unknown)  # a uid the database lacks
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("USER", "dave")
    assert hostmod.user_name() == "dave"


@pytest.mark.parametrize(("hostname", "user"), [("h" * 63, "u" * 40), ("laptop", "u" * 100),
                                                 ("h" * 63, "_")])
def test_the_id_is_at_most_64_characters(host: Path, monkeypatch: pytest.MonkeyPatch,
                                         hostname: str, user: str) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: hostname)
    monkeypatch.setattr(hostmod, "user_name", lambda: user)
    mid = hostmod.default_machine_id()
    legacy = hostmod.legacy_machine_id()
    assert len(mid) <= 64 and MACHINE_ID.fullmatch(mid)
    assert mid.endswith("." + legacy) and len(legacy) <= 57
    if len(user) > 1:
        assert mid.startswith("u" * 6)


def test_seed_is_the_machine_id_file_then_dbus_then_ioreg_then_fqdn(
        host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert hostmod.host_seed() == SEED
    dbus = tmp_path / "dbus-machine-id"
    dbus.write_text("fedcba9876543210fedcba9876543210\n")
    host.write_text("")  # an empty file (some container images) says nothing
    assert hostmod.host_seed() == "fedcba9876543210fedcba9876543210"
    host.unlink()
    dbus.unlink()
    assert hostmod.host_seed() == FQDN  # no file and no ioreg
    _ioreg(tmp_path, monkeypatch, f"cat <<'EOF'\n{IOREG_OUT}EOF")
    assert hostmod.host_seed() == UUID
    # On macOS the new id hashes the hardware UUID; the legacy id is the old FQDN rule.
    assert hostmod.default_machine_id() == f"alice.laptop-{_hex8(UUID)}"
    assert hostmod.legacy_machine_id() == f"laptop-{_hex8(FQDN)}"


@pytest.mark.parametrize("body", [
    f"cat <<'EOF'\n{IOREG_OUT}EOF\nexit 1",            # fails
    "echo 'no platform device here'",                  # no UUID line
    """echo '"IOPlatformUUID" = "<none>"'""",          # not a UUID
    "kill -9 $$"])                                     # dies
def test_an_ioreg_that_fails_means_the_fqdn(host: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    host.unlink()
    _ioreg(tmp_path, monkeypatch, body)
    assert hostmod.host_seed() == FQDN
    assert hostmod.default_machine_id() == f"alice.laptop-{_hex8(FQDN)}"


def test_command_output_is_bounded(tmp_path: Path) -> None:
    assert hostmod._command_output(["sh", "-c", "printf 0123456789"], limit=10) == b"0123456789"
    assert hostmod._command_output(["sh", "-c", "printf 0123456789"], limit=9) is None
    assert hostmod._command_output([str(tmp_path / "missing")]) is None

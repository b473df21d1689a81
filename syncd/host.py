"""This host and its user, as a default machine id: ``<user>.<hostname>-<8 hex>``, the
hex from what identifies the host (systemd's or dbus's machine id, the hardware UUID on
macOS, else the FQDN). A machine id names a backup in the store, so it must stay the same
across restarts and differ per host and per user (one writer per id)."""

from __future__ import annotations

import getpass
import hashlib
import os
import pwd
import re
import selectors
import socket
import subprocess
import time
import unicodedata
from collections.abc import Sequence
from pathlib import Path

# Where the host's identity lives: systemd's machine id (and dbus's copy, on systems
# without systemd); on macOS the hardware UUID (absolute path: launchd's PATH is short).
_MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))
_IOREG = ("/usr/sbin/ioreg", "-rd1", "-c", "IOPlatformExpertDevice")
_IOREG_UUID = re.compile(rb'^\s*"IOPlatformUUID"\s*=\s*"([0-9A-Fa-f-]{1,64})"\s*$', re.M)
# ioreg prints a few KB in well under a second: anything bigger or slower is not it.
_COMMAND_LIMIT = 256 << 10
_COMMAND_TIMEOUT = 3.0
_NOT_ID = re.compile(r"[^A-Za-z0-9._-]")


def _command_output(argv: Sequence[str], *, limit: int = _COMMAND_LIMIT,
                    timeout: float = _COMMAND_TIMEOUT) -> bytes | None:
    """``argv``'s standard output (no shell, no stdin); None if it cannot run, exits
    non-zero, prints more than ``limit`` bytes or takes longer than ``timeout``."""
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except (OSError, ValueError):
        return None
    assert proc.stdout is not None
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    break
                out += chunk
                if len(out) > limit:
                    return None
        code = proc.wait(max(0.0, deadline - time.monotonic()))
    except (OSError, subprocess.TimeoutExpired):
        return None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    return bytes(out) if code == 0 else None


def _read_small(path: Path) -> str:
    """A machine-id file's first line (empty if absent or unreadable)."""
    try:
        with path.open("rb") as f:
            head = f.read(256)
    except OSError:
        return ""
    return head.decode(errors="replace").partition("\n")[0].strip()


def host_seed() -> str:
    """What identifies this host: the first non-empty machine-id file, else the hardware
    UUID that ``ioreg`` reports (macOS), else the FQDN (which may change with networks)."""
    for path in _MACHINE_ID_FILES:
        if seed := _read_small(path):
            return seed
    out = _command_output(_IOREG)
    if out is not None and (m := _IOREG_UUID.search(out)):
        return m[1].decode()
    return socket.getfqdn()


def _host_name() -> str:
    return (_NOT_ID.sub("-", socket.gethostname().split(".")[0]) or "host")[:48]


def _hex8(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:8]


def legacy_machine_id() -> str:
    """The default machine id of earlier versions, ``<hostname>-<8 hex of
    /etc/machine-id, else of the FQDN>``: a state kept under it keeps its name."""
    try:  # only the first file; an empty one is a seed too
        with _MACHINE_ID_FILES[0].open("rb") as f:
            seed = f.read(4096).decode(errors="replace").strip()
    except OSError:
        seed = socket.getfqdn()
    return f"{_host_name()}-{_hex8(seed)}"


def user_name() -> str:
    """The OS user running this process (the password database first, then the login
    variables); empty when nothing says."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid the database does not know (containers)
        pass
    try:
        return getpass.getuser()
    except Exception:  # OSError on 3.13+, KeyError or ImportError before
        return os.environ.get("USER", "")


def _user_part(name: str) -> str:
    """``name`` in the machine id's characters, starting alphanumeric: accents dropped
    (José → Jose), anything else a "-"; a name with nothing usable is ``uid<n>``."""
    ascii_ = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    part = _NOT_ID.sub("-", ascii_).lstrip("._-")
    return part or f"uid{os.getuid()}"


def default_machine_id() -> str:
    """``<user>.<hostname>-<8 hex of the host seed>``: stable across restarts, distinct
    per host and per user on it. Where /etc/machine-id holds an id the host part is the
    legacy id, so ``alice.laptop-1a2b3c4d`` is recognisably ``laptop-1a2b3c4d`` upgraded."""
    host = f"{_host_name()}-{_hex8(host_seed())}"
    # The host part is at most 57 characters: the user gets the rest of the 64.
    return f"{_user_part(user_name())[:63 - len(host)]}.{host}"

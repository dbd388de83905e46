"""A real S3-compatible server for the staging tests: ``moto_server`` on loopback.

moto's server speaks S3's HTTP API (including conditional writes,
``If-None-Match: *`` answered 412), so the connector's staging runs its real
code paths, pyarrow's S3 filesystem and boto3, against it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.process import free_port, wait_for

__all__ = ["MotoServer", "moto_server", "S3_ENV"]

#: Credentials and region moto accepts (any work); the endpoint is per server.
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


class MotoServer:
    def __init__(self, port: int, proc: subprocess.Popen) -> None:
        self.port = port
        self.proc = proc
        self.endpoint = f"http://127.0.0.1:{port}"

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to use this server through the standard chain."""
        return {**S3_ENV, "AWS_ENDPOINT_URL": self.endpoint}

    def bucket(self, name: str) -> str:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                     aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _executable() -> str:
    found = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("moto_server is not installed: pip install -e '.[dev]'")
    return found


@contextmanager
def moto_server(log: Path) -> Iterator[MotoServer]:
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([_executable(), "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    server = MotoServer(port, proc)

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{server.endpoint}/moto-api/", timeout=1):
                return True
        except OSError:
            return proc.poll() is not None  # died: stop waiting, fail below

    try:
        wait_for(up, timeout=30, interval=0.1, message="moto_server to answer")
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited: {log.read_text()[-2000:]}")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

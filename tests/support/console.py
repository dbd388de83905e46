"""A real ``disque-console`` process for tests and benchmarks: started as
users start it (``python -m disque.console``, its own process, port 0), ready
once it logged its address and answers ``/health``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.process import wait_for

LISTENING = re.compile(r"disque-console listening on http://([\d.]+):(\d+)")


class ConsoleProcess:
    """One ``disque-console`` process and what it logged."""

    def __init__(self, workdir: Path, *args: str) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.args = list(args)
        self.log_path = workdir / "console.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, env: dict[str, str] | None = None) -> ConsoleProcess:
        import httpx  # the dev extra's; only what runs a console needs it

        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "disque.console", "--port", "0", *self.args],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "DISQUE_INTERPRETED": "1", **(env or {})})
        before = len(LISTENING.findall(self.log()))

        def listening() -> str | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"disque-console exited {self.proc.returncode}:\n"
                                     + self.log())
            found = LISTENING.findall(self.log())
            if len(found) <= before:
                return None
            host, port = found[-1]
            try:
                httpx.get(f"http://{host}:{port}/health", timeout=2)
            except httpx.HTTPError:
                return None
            return f"http://{host}:{port}"

        self.url = wait_for(listening, 60, interval=0.1, message="the console to listen")
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

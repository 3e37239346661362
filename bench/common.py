"""What the benchmarks and the tests share: a server started as a real process on a free port,
with every wait bounded (tests/conftest.py re-exports ServerProcess and free_port)."""
from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A port nobody listens on right now (bound and released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class ServerProcess:
    """A server started as a real subprocess on 127.0.0.1:0 (stdout and stderr merged into `lines`),
    its port read from what it prints, ready once `ready_path` answers 200. All of it within
    `timeout` seconds: a server that exits, prints no port or never gets ready is stopped, and
    RuntimeError says which, with everything it printed."""

    def __init__(self, args: list[str], env: dict | None = None, ready_path: str | None = "/ping",
                 port_pattern: str = r"SEMIF_ADAPTER_PORT=(\d+)", timeout: float = 120, replace_env: bool = False):
        full_env = dict(env or {}) if replace_env else {**os.environ, **(env or {})}
        self.proc = subprocess.Popen(args, cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._fresh: queue.Queue[str | None] = queue.Queue()  # lines while the port is awaited; None at EOF
        self._awaiting = True
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + timeout
        self.port = self._read_port(re.compile(port_pattern), deadline, timeout)
        self.url = f"http://127.0.0.1:{self.port}"
        if ready_path:
            self.wait_ready(ready_path, deadline)

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if self._awaiting:
                self._fresh.put(line)
        self._fresh.put(None)

    def _read_port(self, pattern: re.Pattern[str], deadline: float, timeout: float) -> int:
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._fresh.get(timeout=left)
            except queue.Empty:
                break
            if line is None:  # output closed: the server exited (or is exiting)
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
                self.stop()
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.output}")
            m = pattern.search(line)
            if m:
                self._awaiting = False
                return int(m.group(1))
        self.stop()
        raise RuntimeError(f"server printed no port within {timeout:g} s:\n{self.output}")

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_ready(self, path: str, deadline: float) -> None:
        """Until GET `path` answers 200, or time.monotonic() passes `deadline` (then stopped + RuntimeError)."""
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"server died (exit {self.proc.returncode}):\n{self.output}")
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{path} never returned 200:\n{self.output}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_adapter(model: str, env: dict | None = None, timeout: float = 600) -> tuple[subprocess.Popen, str]:
    """(process, base URL) of `python -m adapter serve` on a free port, once /ping answers 200.
    RuntimeError with the adapter's output when it exits or is not ready within `timeout` seconds
    (the first start of a chunked model assembles it: minutes, hence the long default)."""
    try:
        srv = ServerProcess([sys.executable, "-m", "adapter", "serve", "--port", "0", "--model", model,
                             "--log-level", "warning"], env=env, timeout=timeout)
    except RuntimeError as exc:
        raise RuntimeError(f"the adapter with --model {model} did not start: {exc}") from None
    return srv.proc, srv.url

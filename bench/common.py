"""What the benchmarks share: the adapter started as a real process on a free port."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def start_adapter(model: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """(process, base URL) of `python -m adapter serve`, returned once /ping answers 200."""
    proc = subprocess.Popen([sys.executable, "-m", "adapter", "serve", "--port", "0", "--model", model,
                             "--log-level", "warning"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{proc.stdout.readline().strip().split('=')[1]}"  # type: ignore[union-attr]
    while True:
        try:
            if httpx.get(url + "/ping").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise RuntimeError("the adapter exited before it was ready") from None
        time.sleep(0.2)

"""bench.common.ServerProcess (the tests' server fixture and the benchmarks' start_adapter): every
wait is bounded, and a server that does not come up is stopped and named with its output."""
from __future__ import annotations

import sys
import time

import pytest

from bench.common import ServerProcess, free_port, start_adapter


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_silent_server_times_out_and_is_stopped():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)printed no port within 1 s:\nstarting"):
        ServerProcess(python("import time; print('starting', flush=True); time.sleep(60)"), timeout=1)
    assert time.monotonic() - t0 < 10  # not the 60 s the process would have slept


def test_a_server_that_exits_is_named_with_its_output():
    with pytest.raises(RuntimeError, match=r"(?s)server exited 3:\n.*no model here"):
        ServerProcess(python("import sys; print('no model here', file=sys.stderr); sys.exit(3)"), timeout=30)


def test_a_server_that_never_gets_ready_is_stopped():
    port = free_port()  # printed, but nothing listens there
    with pytest.raises(RuntimeError, match="/ping never returned 200"):
        ServerProcess(python(f"import time; print('SEMIF_ADAPTER_PORT={port}', flush=True); time.sleep(60)"),
                      timeout=1.5)


def test_a_ready_server_keeps_its_output():
    code = ("import http.server, socketserver, sys\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200); self.end_headers()\n"
            "    def log_message(self, *a):\n"
            "        print('served', flush=True)\n"
            "s = socketserver.TCPServer(('127.0.0.1', 0), H)\n"
            "print(f'SEMIF_ADAPTER_PORT={s.server_address[1]}', flush=True)\n"
            "s.serve_forever()\n")
    srv = ServerProcess(python(code), timeout=30)
    try:
        assert srv.url == f"http://127.0.0.1:{srv.port}"
        deadline = time.monotonic() + 5
        while "served\n" not in srv.lines and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "served\n" in srv.lines  # lines after the port are still collected
    finally:
        assert srv.stop() is not None


def test_start_adapter_names_the_model_that_did_not_start():
    # the adapter answers /ping 503 while its model load has failed (SageMaker's health check): the bench
    # no longer waits forever for it, and the error carries the adapter's reason
    with pytest.raises(RuntimeError, match=r"(?s)--model /nonexistent/x.gguf did not start: /ping never returned 200"
                                           r".*does not exist"):
        start_adapter("/nonexistent/x.gguf", timeout=10)

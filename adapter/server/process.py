"""Starting and stopping the adapter process: socket, policies, uvicorn (with the bounded
connections of connections.py), and a clean drain.

SageMaker sends SIGTERM and kills 30 s later. On SIGTERM the adapter stops accepting connections,
lets in-flight requests finish for `SM_SEMIF_SHUTDOWN_GRACE` seconds, then cancels what is left
(those clients get a JSON 503 within milliseconds: llama.cpp's abort callback stops a forward
pass) and exits 0.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Callable, Iterator

import uvicorn

from adapter.server.calibrated import PolicySet
from adapter.policy import discover_policies
from adapter.server.connections import guarded_protocol
from adapter.server.app import EngineHolder, create_app
from adapter.server.admission import Admission
from adapter.server.settings import AdapterSettings

if TYPE_CHECKING:
    from adapter.engine.engine import Engine

log = logging.getLogger("semif.adapter")
# The listen backlog, which is also how many connections asyncio accepts per loop iteration before they
# reach the connection cap's check: a burst holds at most about the cap + 3 x this many sockets
# (uvicorn's default 2048 let one hold thousands, and queued /ping connections behind them).
ACCEPT_BACKLOG = 128


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, created with an explicit IPPROTO_TCP: asyncio turns Nagle's algorithm
    off (TCP_NODELAY) only on accepted sockets whose proto says TCP, and a socket made with proto 0
    passes that on. With Nagle on, uvicorn's separate header and body writes waited for the client's
    delayed ACK: every response on a kept-alive connection took 40 ms more (measured: /ping 44 ms)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(ACCEPT_BACKLOG)
    sock.set_inheritable(True)
    return sock


def policy_loader(settings: AdapterSettings) -> Callable[[Engine], PolicySet]:
    """SM_SEMIF_POLICY (files/folders, comma-separated) and policy*.json beside the model."""
    def load(engine: Engine) -> PolicySet:
        model_dir = Path(engine.info.path).parent if engine.info.source == "sagemaker" else None
        found = discover_policies(model_dir, settings.policy_paths)
        if found:
            log.info("enforcing policies: %s", ", ".join(found))
        return PolicySet(found, engine.info.sha256)
    return load


def serve(settings: AdapterSettings, loader: Callable[[], Engine]) -> int:
    """Run until SIGTERM/SIGINT, drain, and return the exit code (0 after a clean shutdown)."""
    holder = EngineHolder(loader, policy_loader(settings))
    app = create_app(holder, settings)  # first: a decision log that cannot be opened is a SettingsError (exit 2)
    holder.start()
    sock = bind_socket(settings.host, settings.port)
    bound = sock.getsockname()[1]
    print(f"SEMIF_ADAPTER_PORT={bound}", flush=True)
    print(f"semif adapter listening on http://{settings.host}:{bound} (model loading in background)",
          file=sys.stderr, flush=True)
    protocol = guarded_protocol(header_timeout=settings.header_timeout, max_connections=settings.max_connections)
    config = uvicorn.Config(app, http=protocol, log_level=settings.log_level, access_log=settings.log_level == "debug",
                            timeout_graceful_shutdown=int(settings.shutdown_grace) + 1,
                            timeout_keep_alive=settings.keep_alive_timeout, backlog=ACCEPT_BACKLOG)
    server = DrainingServer(config, app.state.admission, settings.shutdown_grace)
    server.run(sockets=[sock])
    return 0


class DrainingServer(uvicorn.Server):
    """uvicorn's graceful shutdown, plus: new requests on open connections get 503 at once, and
    in-flight work is cancelled when the grace period ends. uvicorn would re-raise SIGTERM after
    shutting down (exit 143); SageMaker and the tests expect a clean exit 0."""

    def __init__(self, config: uvicorn.Config, admission: Admission, grace: float):
        super().__init__(config)
        self.admission, self.grace = admission, grace

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.admission.draining:
            self.admission.draining = True
            n = len(self.admission)
            log.info("shutting down: %d request(s) in flight get %.0f s to finish", n, self.grace)
            timer = threading.Timer(self.grace, self.admission.cancel_all,
                                    (503, "shutting_down", "the adapter is shutting down: retry on another instance"))
            timer.daemon = True
            timer.start()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)

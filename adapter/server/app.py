"""The SemIf adapter's HTTP routes, with the SageMaker container contract.

GET  /ping                 200 once the model is loaded, 503 before (SageMaker polls it; never needs a key)
POST /invocations          one row, a JSON array of rows, or {"state", "questions": [...]} (shared state);
                           application/jsonlines: one row per line -> one result (or error object) per line
GET  /execution-parameters Batch Transform settings that suit the engine
POST /v1/systemone         TypeSafe's decision API;  GET /v1/models
GET  /info                 model, readouts, enforced policies

Here: the engine holder, the app assembled (middleware, error handlers, the routes of routes.py), and
the gate in front of every route; what a body means and how an answer is written is codecs.py.

Every answer is JSON (see http_errors.py). A POST is admitted before any work is done on it: a
bounded queue (429 + Retry-After) and its deadline first, then the body is read, decoded, parsed and
validated in a worker thread within that deadline (503 + Retry-After when it passed in the queue,
413 when the request's own work outgrew it), so the event loop - and /ping - never waits behind a
body; cancellation when the client goes away (a quiet 499, nothing logged) or the process drains
(503), and caps on bytes, JSON values, rows and option readings per request (413 / 422). With SM_SEMIF_API_KEY set, every route
but /ping needs `Authorization: Bearer <key>` - including /docs and /openapi.json.
"""
from __future__ import annotations

import hmac
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable

from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from adapter.server.admission import Admission, Stopped
from adapter.server.calibrated import PolicySet
from adapter.server.decision_log import DecisionLog, DecisionLogMiddleware, DecisionLogSettings
from adapter.server.http_body import ClientGone
from adapter.server.http_errors import HTTPProblem, Invalid, invalid, problem
from adapter.server.routes import Intake, router
from adapter.schema import RequestError
from adapter.server.settings import AdapterSettings

if TYPE_CHECKING:
    from adapter.engine.engine import Engine

log = logging.getLogger("semif.adapter")


class EngineHolder:
    """Loads the engine in the background so /ping can answer 503 while the model loads."""

    def __init__(self, loader: Callable[[], Engine], policy_loader: Callable[[Engine], PolicySet] | None = None):
        self.engine: Engine | None = None
        self.policies = PolicySet()
        self._policy_loader = policy_loader
        self.error: str | None = None
        self._loader = loader
        self.ready = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._load, name="model-loader", daemon=True).start()

    def _load(self) -> None:
        try:
            engine = self._loader()
            if self._policy_loader:  # a bad policy file fails start-up loudly (503 with the reason)
                self.policies = self._policy_loader(engine)
                for pid in self.policies.mismatched():
                    log.warning("policy %s was calibrated on another model: its decisions will be gated", pid)
            self.engine = engine
        except Exception as exc:  # shown by /ping and in the log
            log.exception("model load failed")
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ready.set()

    def get(self) -> Engine:
        if self.engine is None:
            if self.error:
                raise HTTPProblem(503, "model_load_failed", self.error)
            raise HTTPProblem(503, "loading", "the model is still loading; retry when GET /ping returns 200")
        return self.engine


# -- the app -----------------------------------------------------------------------------------------
def create_app(holder: EngineHolder, settings: AdapterSettings | None = None) -> FastAPI:
    settings = settings or AdapterSettings.from_env()
    admission = Admission(settings.max_queue)
    app = FastAPI(title="SemIf adapter", version="1", docs_url="/docs", redoc_url=None, redirect_slashes=False)
    intake = Intake(holder, settings, admission)
    app.state.holder, app.state.admission, app.state.settings, app.state.intake = holder, admission, settings, intake
    app.add_middleware(_Gate, api_key=settings.api_key, ping=intake.ping)
    decisions = DecisionLog(DecisionLogSettings.from_env())  # SM_SEMIF_DECISION_LOG: opt-in, one line per decision
    if decisions.enabled:
        app.add_middleware(DecisionLogMiddleware, decision_log=decisions)
    for kind, handler in ERROR_HANDLERS:
        app.add_exception_handler(kind, handler)
    app.include_router(router)
    return app


# -- every failure as JSON -----------------------------------------------------------------------------
async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return problem(exc.status_code, kind, str(exc.detail))


async def _problem(_: Request, exc: HTTPProblem) -> JSONResponse:
    return problem(exc.status, exc.error_type, exc.message, exc.headers)


async def _stopped(request: Request, exc: Stopped) -> JSONResponse:
    headers = {"Retry-After": str(request.app.state.admission.retry_after())} if exc.status in (429, 503) else None
    return problem(exc.status, exc.error_type, exc.message, headers)


async def _invalid(_: Request, exc: Invalid) -> JSONResponse:
    return invalid(exc.errors)


async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
    return invalid(exc.to_detail())


async def _gone(_: Request, exc: Exception) -> JSONResponse:  # nobody is listening: a quiet cancel, not an error to log
    log.debug("client closed the connection before its request was complete")
    return problem(499, "client_closed", "the client closed the connection")


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:  # a bug, not the client's fault: still JSON
    log.exception("unexpected error")
    return problem(500, "internal_error", f"{type(exc).__name__}: the adapter failed on this request")


ERROR_HANDLERS: list[tuple[Any, Callable[..., Any]]] = [
    (StarletteHTTPException, _http), (HTTPProblem, _problem), (Stopped, _stopped), (Invalid, _invalid),
    (RequestError, _request_error), (ClientGone, _gone), (ClientDisconnect, _gone), (Exception, _unexpected)]


class _Gate:
    """Pure ASGI middleware in front of every route: GET /ping is answered here, before routing and
    on the event loop itself (never queued behind a worker thread); `/x/` is served as `/x` (no
    redirect with an empty body); with an API key set every path but /ping needs it (docs and schema
    too)."""

    def __init__(self, app: ASGIApp, api_key: str | None, ping: Callable[[], Response]):
        self.app, self.api_key, self.ping = app, api_key, ping
        # the key's bytes as the environment held them (surrogateescape: even a key that is not UTF-8)
        self.key_bytes = api_key.encode("utf-8", "surrogateescape") if api_key else b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if path in ("/ping", "/ping/") and scope["method"] in ("GET", "HEAD"):  # first, and no threadpool hop
            return await self.ping()(scope, receive, send)
        if len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path.rstrip("/") or "/", "raw_path": path.rstrip("/").encode() or b"/"}
        if self.api_key and scope["path"] != "/ping":
            headers: dict[bytes, bytes] = dict(scope.get("headers") or [])
            # bytes against bytes: a header is octets (a client sends a non-ASCII key as UTF-8), compared
            # with the key's own bytes - decoding one side as latin-1 and the other as UTF-8 never matched
            scheme, _, given = headers.get(b"authorization", b"").strip().partition(b" ")
            if scheme.lower() != b"bearer" or not given.strip():
                return await problem(401, "authentication_error",
                                     "missing API key: send 'Authorization: Bearer <key>'")(scope, receive, send)
            if not hmac.compare_digest(given.strip(), self.key_bytes):
                return await problem(401, "authentication_error", "invalid API key")(scope, receive, send)
        return await self.app(scope, receive, send)

"""The SemIf adapter over HTTP, with the SageMaker container contract.

GET  /ping          200 once the model is loaded, 503 before (SageMaker polls it)
POST /invocations   one row, a JSON array of rows, or {"state", "questions": [...]} (shared state)

Errors: 422 {"detail": [{"loc", "msg", "type"}]} for bad fields (FastAPI's shape), other 4xx
{"detail": {"error_type", "message"}}. Bad input never yields a 5xx.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import signal
import socket
import sys
import threading
import zlib
from typing import Any, Callable

import uvicorn
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from .schema import DecisionRequest, RequestError, SharedStateRequest, errors_from
from .policy import PolicySet
from .systemone import SystemOneRequest, respond, to_rows

MAX_BODY = 6 * 1024 * 1024  # SageMaker's invocation payload limit
log = logging.getLogger("semif.adapter")


class HTTPProblem(Exception):
    """A non-validation 4xx/5xx: {"detail": {"error_type", "message"}}."""

    def __init__(self, status: int, error_type: str, message: str):
        super().__init__(message)
        self.status, self.error_type, self.message = status, error_type, message


def problem(status: int, error_type: str, message: str) -> JSONResponse:
    return JSONResponse({"detail": {"error_type": error_type, "message": message}}, status_code=status)


def invalid(errors: list[dict]) -> JSONResponse:
    return JSONResponse({"detail": errors}, status_code=422)


def decode_body(raw: bytes, encoding: str | None) -> bytes:
    """Undo Content-Encoding (zstd, gzip, deflate) - TypeSafe's client zstd-compresses bodies >= 1 KB."""
    enc = (encoding or "identity").strip().lower()
    try:
        if enc in ("", "identity"):
            return raw
        if enc == "gzip":
            return gzip.decompress(raw)
        if enc == "deflate":
            return zlib.decompress(raw)
        if enc == "zstd":
            import zstandard

            return zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    except Exception as exc:  # corrupt stream: the client's fault
        raise HTTPProblem(400, "invalid_encoding", f"body is not valid {enc} data ({exc})") from None
    raise HTTPProblem(415, "unsupported_encoding", f"Content-Encoding {enc!r} is not supported: send identity, gzip or zstd")


async def read_json(request: Request) -> Any:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype not in ("application/json", "") and not ctype.endswith("+json"):
        raise HTTPProblem(415, "unsupported_media_type",
                          f"Content-Type {ctype!r} is not supported: send application/json")
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise HTTPProblem(413, "payload_too_large", f"body is {len(raw)} bytes; the limit is {MAX_BODY}")
    body = decode_body(raw, request.headers.get("content-encoding"))
    if len(body) > 8 * MAX_BODY:
        raise HTTPProblem(413, "payload_too_large", "decompressed body is too large")
    if not body.strip():
        raise HTTPProblem(400, "invalid_json", "empty body: send a JSON decision row")
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HTTPProblem(400, "invalid_json", f"body is not valid JSON: {exc}") from None


class EngineHolder:
    """Loads the engine in the background so /ping can answer 503 while the model loads."""

    def __init__(self, loader: Callable[[], Any], policy_loader: Callable[[Any], PolicySet] | None = None):
        self.engine = None
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

    def get(self):
        if self.engine is None:
            if self.error:
                raise HTTPProblem(503, "model_load_failed", self.error)
            raise HTTPProblem(503, "loading", "the model is still loading; retry when GET /ping returns 200")
        return self.engine


def score_payload(engine, payload: Any, policies: PolicySet | None = None) -> Any:
    """Dispatch the three /invocations shapes; raise RequestError with a full loc on bad input.
    Rows naming a loaded policy are completed from it and answered with the gated decision."""
    policies = policies or PolicySet()

    def scored(row: DecisionRequest, policy) -> dict:
        result = engine.score(row)
        return PolicySet.decorate(result, policy) if policy else result

    if isinstance(payload, list):
        if not payload:
            raise RequestError([], "empty array: send at least one decision row")
        rows = []
        for i, item in enumerate(payload):
            policy = policies.fill(item, [i])
            try:
                rows.append((DecisionRequest.model_validate(item), policy))
            except ValidationError as exc:
                raise _Invalid(errors_from(exc, [i])) from None
        return [scored(r, p) for r, p in rows]
    if isinstance(payload, dict) and "questions" in payload:
        qs = payload["questions"] if isinstance(payload["questions"], list) else []
        used = [policies.fill(q, ["questions", i]) for i, q in enumerate(qs)]
        try:
            shared = SharedStateRequest.model_validate(payload)
        except ValidationError as exc:
            raise _Invalid(errors_from(exc)) from None
        with engine.lock:
            return [scored(r, p) for r, p in zip(shared.rows(), used)]
    if not isinstance(payload, dict):
        raise RequestError([], "send a JSON object (one row), an array of rows, or {state, questions}")
    policy = policies.fill(payload, [])
    try:
        row = DecisionRequest.model_validate(payload)
    except ValidationError as exc:
        raise _Invalid(errors_from(exc)) from None
    return scored(row, policy)


class _Invalid(Exception):
    def __init__(self, errors: list[dict]):
        self.errors = errors


def model_names(engine) -> tuple[str, list[str]]:
    """The served model's name (SM_SEMIF_MODEL_NAME, else the GGUF file stem) and its aliases."""
    name = os.environ.get("SM_SEMIF_MODEL_NAME") or engine.info.file.rsplit(".gguf", 1)[0]
    aliases = [a.strip() for a in os.environ.get("SM_SEMIF_MODEL_ALIASES", "jev-latest,semif-latest").split(",")
               if a.strip()]
    return name, aliases


def check_auth(request: Request) -> None:
    """Bearer auth when SM_SEMIF_API_KEY is set; otherwise any or no key is accepted."""
    key = os.environ.get("SM_SEMIF_API_KEY")
    if not key:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise HTTPProblem(401, "authentication_error", "missing API key: send 'Authorization: Bearer <key>'")
    import hmac

    if not hmac.compare_digest(given.strip().encode(), key.encode()):
        raise HTTPProblem(401, "authentication_error", "invalid API key")


def score_systemone(engine, payload: Any) -> dict:
    try:
        req = SystemOneRequest.model_validate(payload)
    except ValidationError as exc:
        raise _Invalid(errors_from(exc, ["body"])) from None
    name, aliases = model_names(engine)
    if req.model not in (name, *aliases):
        raise HTTPProblem(400, "invalid_request_error",
                          f"unknown model {req.model!r}: this server serves {name!r} (aliases {', '.join(aliases)}); "
                          "see GET /v1/models")
    try:
        rows = to_rows(req)
    except ValidationError as exc:
        raise _Invalid(errors_from(exc, ["body"])) from None
    with engine.lock:  # all questions in a row: the state segment is evaluated once
        try:
            results = [engine.score(row) for row in rows]
        except RequestError as exc:
            raise _Invalid(errors_from(exc, ["body"])) from None
    return respond(req, results, req.model)


def create_app(holder: EngineHolder) -> FastAPI:
    from starlette.exceptions import HTTPException as StarletteHTTPException

    app = FastAPI(title="SemIf adapter", version="1", docs_url="/docs", redoc_url=None)
    app.state.holder = holder

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return problem(exc.status_code, kind, str(exc.detail))

    @app.exception_handler(HTTPProblem)
    async def _problem(_: Request, exc: HTTPProblem):
        return problem(exc.status, exc.error_type, exc.message)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError):
        return invalid(exc.to_detail())

    @app.exception_handler(_Invalid)
    async def _invalid(_: Request, exc: _Invalid):
        return invalid(exc.errors)

    @app.get("/ping")
    def ping():
        engine = holder.get()
        return {"status": "ok", "model": engine.info.file, "sha256": engine.info.sha256}

    @app.post("/invocations")
    async def invocations(request: Request):
        payload = await read_json(request)
        engine = holder.get()
        return await run_in_threadpool(score_payload, engine, payload, holder.policies)

    @app.post("/v1/systemone")
    async def systemone(request: Request):
        check_auth(request)
        payload = await read_json(request)
        engine = holder.get()
        return await run_in_threadpool(score_systemone, engine, payload)

    @app.get("/v1/models")
    def models(request: Request):
        check_auth(request)
        engine = holder.get()
        name, aliases = model_names(engine)
        desc = f"{engine.info.description} via llama.cpp; readout {engine.info.default_readout}"
        return {"models": [{"name": n, "description": desc if n == name else f"alias of {name}",
                            "release_date": None} for n in (name, *aliases)]}

    @app.get("/info")
    def info():
        engine = holder.get()
        return {"model": engine.info.public(), "readouts": ["letters", "option-words"],
                "policies": {pid: {"name": p.name, "threshold": p.threshold, "temperature": p.temperature,
                                   "model_matches": pid not in holder.policies.mismatched()}
                             for pid, p in holder.policies.policies.items()}}

    return app


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def load_policies(engine) -> PolicySet:
    """SM_SEMIF_POLICY (files/folders, comma-separated) and policy*.json beside the model."""
    from pathlib import Path

    from .policy import discover_policies

    model_dir = Path(engine.info.path).parent if engine.info.source == "sagemaker" else None
    found = discover_policies(model_dir, os.environ.get("SM_SEMIF_POLICY"))
    if found:
        log.info("enforcing policies: %s", ", ".join(found))
    return PolicySet(found, engine.info.sha256)


def serve(host: str, port: int, loader: Callable[[], Any], log_level: str = "info") -> int:
    """Run until SIGTERM/SIGINT (uvicorn shuts down gracefully); returns the exit code."""
    holder = EngineHolder(loader, load_policies)
    holder.start()
    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    print(f"SEMIF_ADAPTER_PORT={bound}", flush=True)
    print(f"semif adapter listening on http://{host}:{bound} (model loading in background)", file=sys.stderr, flush=True)
    config = uvicorn.Config(create_app(holder), log_level=log_level, access_log=log_level == "debug",
                            timeout_graceful_shutdown=25)
    server = GracefulServer(config)
    server.run(sockets=[sock])
    return 0


class GracefulServer(uvicorn.Server):
    """uvicorn re-raises SIGTERM after its graceful shutdown, so the process would die by the
    signal (exit 143). SageMaker and tests expect a clean exit 0 after a drained shutdown."""

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)


def default_port() -> int:
    return int(os.environ.get("SAGEMAKER_BIND_TO_PORT") or 8080)

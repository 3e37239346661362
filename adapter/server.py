"""The SemIf adapter's HTTP routes, with the SageMaker container contract.

GET  /ping                 200 once the model is loaded, 503 before (SageMaker polls it; never needs a key)
POST /invocations          one row, a JSON array of rows, or {"state", "questions": [...]} (shared state);
                           application/jsonlines: one row per line -> one result (or error object) per line
GET  /execution-parameters Batch Transform settings that suit the engine
POST /v1/systemone         TypeSafe's decision API;  GET /v1/models
GET  /info                 model, readouts, enforced policies

Every answer is JSON (see http_errors.py). A POST is admitted before any work is done on it: a
bounded queue (429 + Retry-After) and its deadline first, then the body is read, decoded, parsed and
validated in a worker thread within that deadline (503 + Retry-After when it passed in the queue,
413 when the request's own work outgrew it), so the event loop - and /ping - never waits behind a
body; cancellation when the client goes away (a quiet 499, nothing logged) or the process drains
(503), and caps on bytes, JSON values, rows and option readings per request (413 / 422). With SM_SEMIF_API_KEY set, every route
but /ping needs `Authorization: Bearer <key>` - including /docs and /openapi.json.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from fastapi import FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .admission import Admission, RequestBudget, Stopped
from .http_body import ClientGone, decode, parse_json, read_raw
from .http_errors import HTTPProblem, Invalid, invalid, problem
from .calibrated import CalibratedPolicy, PolicySet
from .decision_log import DecisionLog, DecisionLogMiddleware, DecisionLogSettings, collect
from .guard import GUARDS
from .schema import DEBIAS, READOUTS, DecisionRequest, RequestError, SharedStateRequest, errors_from
from .settings import AdapterSettings
from .systemone import SystemOneRequest, respond, to_rows

log = logging.getLogger("semif.adapter")


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


# -- /invocations: the three shapes -> rows ------------------------------------------------------
@dataclass
class Invocation:
    shape: str  # "one" | "array" | "shared"
    rows: list[DecisionRequest]
    policies: list[CalibratedPolicy | None]
    locs: list[list] = field(default_factory=list)  # where each row sits in the request, for errors
    asked_hidden: list[bool] = field(default_factory=list)  # rows whose client asked for the hidden state


def _asks_hidden(item: Any) -> bool:
    """Did the client itself ask for the hidden state (before a policy's head asked for it)?"""
    return isinstance(item, dict) and item.get("hidden_state") is True


def parse_invocation(payload: Any, policies: PolicySet, settings: AdapterSettings) -> Invocation:
    """Validate a body into rows (filled from named policies), or raise Invalid with full locs."""
    if isinstance(payload, list):
        if not payload:
            raise Invalid([{"loc": [], "msg": "empty array: send at least one decision row", "type": "value_error"}])
        _cap_rows(len(payload), [], settings)
        rows, used, locs = [], [], []
        asked = [_asks_hidden(item) for item in payload]
        for i, item in enumerate(payload):
            used.append(_fill(policies, item, [i]))
            rows.append(_validate(DecisionRequest, item, [i]))
            locs.append([i])
        inv = Invocation("array", rows, used, locs, asked)
    elif isinstance(payload, dict) and "questions" in payload:
        qs = payload["questions"] if isinstance(payload["questions"], list) else []
        _cap_rows(len(qs), ["questions"], settings)
        asked = [_asks_hidden(q) for q in qs]
        used = [_fill(policies, q, ["questions", i]) for i, q in enumerate(qs)]
        shared = _validate(SharedStateRequest, payload, [])
        inv = Invocation("shared", shared.rows(), used, [["questions", i] for i in range(len(qs))], asked)
    elif isinstance(payload, dict):
        asked = [_asks_hidden(payload)]
        used = [_fill(policies, payload, [])]
        inv = Invocation("one", [_validate(DecisionRequest, payload, [])], used, [[]], asked)
    else:
        raise Invalid([{"loc": [], "msg": "send a JSON object (one row), an array of rows, or {state, questions}",
                        "type": "type_error"}])
    _cap_cost(inv.rows, settings)
    return inv


def _fill(policies: PolicySet, item: Any, loc: list) -> CalibratedPolicy | None:
    try:
        return policies.fill(item, loc)
    except RequestError as exc:
        raise Invalid(exc.to_detail()) from None


def _validate(model, item: Any, loc: list):
    try:
        return model.model_validate(item)
    except (ValidationError, RequestError) as exc:
        raise Invalid(errors_from(exc, loc)) from None


def _cap_rows(n: int, loc: list, settings: AdapterSettings) -> None:
    if n > settings.max_rows:
        raise Invalid([{"loc": loc, "msg": f"{n} rows in one request; at most {settings.max_rows} "
                        "(SM_SEMIF_MAX_ROWS): split the batch", "type": "too_long"}])


def option_readings(rows: list[DecisionRequest]) -> int:
    """The work a request asks for, in options read: a permuted row reads every option in every order."""
    return sum(len(r.options) * (len(r.options) if r.permute else 1) for r in rows)


def _cap_cost(rows: list[DecisionRequest], settings: AdapterSettings, loc: list | None = None) -> None:
    cost = option_readings(rows)
    if cost > settings.max_cost:
        raise Invalid([{"loc": loc or [], "msg": f"this request reads {cost} options (options x permutations, summed "
                        f"over rows); at most {settings.max_cost} (SM_SEMIF_MAX_COST): send fewer rows or options, "
                        "or drop permute", "type": "too_long"}])


def score_invocation(engine, inv: Invocation, budget: RequestBudget) -> Any:
    try:
        results = engine.score_many(inv.rows, budget=budget, together=inv.shape == "shared",
                                    guard_when=lambda i, r: PolicySet.automates(inv.policies[i], r))
    except RequestError as exc:
        prefix = inv.locs[exc.row] if exc.row is not None else []
        raise Invalid(errors_from(exc, prefix)) from None
    out = [(PolicySet.decorate(r, p, keep) if p else r).public()
           for r, p, keep in zip(results, inv.policies, inv.asked_hidden)]
    collect(inv.rows, out, inv.policies)
    return out[0] if inv.shape == "one" else out


# -- Batch Transform: JSON Lines in, JSON Lines out ---------------------------------------------------
JSONLINES_TYPES = ("application/jsonlines", "application/jsonl", "application/x-jsonlines", "application/x-ndjson")


def parse_lines(body: bytes, policies: PolicySet, settings: AdapterSettings) -> tuple[list, list[dict | None]]:
    """One decision row per non-empty line. Returns (rows or None, per-line error objects or None):
    a bad line becomes its own error object in the output instead of failing the batch."""
    lines = [ln for ln in body.split(b"\n") if ln.strip()]
    if not lines:
        raise Invalid([{"loc": [], "msg": "empty body: send one JSON decision row per line", "type": "value_error"}])
    _cap_rows(len(lines), [], settings)
    rows: list = []
    errors: list[dict | None] = []
    for i, line in enumerate(lines):
        row_id = None
        try:
            item = parse_json(line, settings.max_depth)
            row_id = item.get("id") if isinstance(item, dict) and isinstance(item.get("id"), str) else None
            asked = _asks_hidden(item)
            policy = _fill(policies, item, [])
            rows.append((_validate(DecisionRequest, item, []), policy, asked))
            errors.append(None)
        except Invalid as exc:
            rows.append(None)
            errors.append(line_error(row_id, 422, exc.errors))
        except ValueError as exc:
            rows.append(None)
            errors.append(line_error(row_id, 400, [{"loc": ["line", i + 1], "msg": f"not valid JSON: {exc}",
                                                    "type": "json_invalid"}]))
    _cap_cost([r[0] for r in filter(None, rows)], settings)
    return rows, errors


def line_error(row_id: str | None, status: int, detail: list[dict]) -> dict:
    return {"id": row_id, "error": {"status": status, "detail": detail}}


def score_lines(engine, rows: list, errors: list[dict | None], budget: RequestBudget) -> bytes:
    """Score the good lines (as if each came alone: calibration's numbers hold); a line the engine
    refuses gets its error object and the rest are scored."""
    todo = [i for i, r in enumerate(rows) if r is not None]
    results: dict[int, dict] = {}
    while todo:
        try:
            scored = engine.score_many([rows[i][0] for i in todo], budget=budget,
                                       guard_when=lambda k, r: PolicySet.automates(rows[todo[k]][1], r))
        except RequestError as exc:
            if exc.row is None:  # not pinned to one line (it never should be): every line gets it
                for i in todo:
                    errors[i] = line_error(rows[i][0].id, 422, errors_from(exc))
                break
            bad = todo.pop(exc.row)
            errors[bad] = line_error(rows[bad][0].id, 422, errors_from(exc))
            continue
        for i, r in zip(todo, scored):
            _, policy, asked = rows[i]
            results[i] = (PolicySet.decorate(r, policy, asked) if policy else r).public()
        break
    collect([r[0] if r else None for r in rows], [results.get(i) for i in range(len(rows))],
            [r[1] if r else None for r in rows])
    out = [json.dumps(results[i] if i in results else errors[i], ensure_ascii=False, allow_nan=False)
           for i in range(len(rows))]
    return ("\n".join(out) + "\n").encode()


# -- /v1/systemone ---------------------------------------------------------------------------------
def model_names(engine, settings: AdapterSettings) -> tuple[str, list[str]]:
    """The served model's name (SM_SEMIF_MODEL_NAME, else the GGUF file stem) and its aliases."""
    return settings.model_name or engine.info.file.rsplit(".gguf", 1)[0], list(settings.model_aliases)


def parse_systemone(engine, payload: Any, settings: AdapterSettings) -> tuple[SystemOneRequest, list[DecisionRequest]]:
    try:
        req = SystemOneRequest.model_validate(payload)
    except (ValidationError, RequestError) as exc:
        raise Invalid(errors_from(exc, ["body"])) from None
    name, aliases = model_names(engine, settings)
    if req.model not in (name, *aliases):
        raise HTTPProblem(400, "invalid_request_error",
                          f"unknown model {req.model!r}: this server serves {name!r} (aliases {', '.join(aliases)}); "
                          "see GET /v1/models")
    try:
        rows = to_rows(req)
    except (ValidationError, RequestError) as exc:
        raise Invalid(errors_from(exc, ["body"])) from None
    _cap_cost(rows, settings, ["body", "questions"])
    return req, rows


def score_systemone(engine, req: SystemOneRequest, rows: list[DecisionRequest], budget: RequestBudget) -> dict:
    try:
        results = engine.score_many(rows, budget=budget, together=True)  # one prefill of the state for all questions
    except RequestError as exc:
        qid = rows[exc.row].id if exc.row is not None else None
        raise Invalid(errors_from(exc, ["body", "questions", qid] if qid is not None else ["body"])) from None
    collect(rows, [r.public() for r in results], [None] * len(rows))
    return respond(req, results, req.model)


# -- the app -----------------------------------------------------------------------------------------
def create_app(holder: EngineHolder, settings: AdapterSettings | None = None) -> FastAPI:
    settings = settings or AdapterSettings.from_env()
    admission = Admission(settings.max_queue)
    app = FastAPI(title="SemIf adapter", version="1", docs_url="/docs", redoc_url=None, redirect_slashes=False)
    app.state.holder, app.state.admission, app.state.settings = holder, admission, settings

    def ping_answer() -> JSONResponse:
        try:
            engine = holder.get()
        except HTTPProblem as exc:
            return problem(exc.status, exc.error_type, exc.message, exc.headers)
        return JSONResponse({"status": "ok", "model": engine.info.file, "sha256": engine.info.sha256})

    app.add_middleware(_Gate, api_key=settings.api_key, ping=ping_answer)
    decisions = DecisionLog(DecisionLogSettings.from_env())  # SM_SEMIF_DECISION_LOG: opt-in, one line per decision
    if decisions.enabled:
        app.add_middleware(DecisionLogMiddleware, decision_log=decisions)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return problem(exc.status_code, kind, str(exc.detail))

    @app.exception_handler(HTTPProblem)
    async def _problem(_: Request, exc: HTTPProblem):
        return problem(exc.status, exc.error_type, exc.message, exc.headers)

    @app.exception_handler(Stopped)
    async def _stopped(_: Request, exc: Stopped):
        headers = {"Retry-After": str(admission.retry_after())} if exc.status in (429, 503) else None
        return problem(exc.status, exc.error_type, exc.message, headers)

    @app.exception_handler(Invalid)
    async def _invalid(_: Request, exc: Invalid):
        return invalid(exc.errors)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError):
        return invalid(exc.to_detail())

    @app.exception_handler(ClientGone)
    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, exc: Exception):  # nobody is listening: a quiet cancel, not an error to log
        log.debug("client closed the connection before its request was complete")
        return problem(499, "client_closed", "the client closed the connection")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):  # a bug, not the client's fault: still JSON
        log.exception("unexpected error")
        return problem(500, "internal_error", f"{type(exc).__name__}: the adapter failed on this request")

    def content_type(request: Request) -> str:
        return request.headers.get("content-type", "").split(";")[0].strip().lower()

    def require_json(request: Request, systemone: bool = False) -> None:
        ctype = content_type(request)
        if ctype not in ("application/json", "") and not ctype.endswith("+json"):
            lines = "" if systemone else ", or application/jsonlines (one row per line, Batch Transform)"
            raise HTTPProblem(415, "unsupported_media_type",
                              f"Content-Type {ctype!r} is not supported: send application/json{lines}")

    def decoded(request: Request, raw: bytes) -> bytes:
        """Content-Encoding undone, within the byte and JSON-value caps (worker thread)."""
        return decode(raw, request.headers.get("content-encoding"), settings.max_decoded, settings.max_elements)

    def json_payload(body: bytes, systemone: bool = False) -> Any:
        try:
            if not body.strip():
                raise ValueError("empty body: send a JSON document")
            return parse_json(body, settings.max_depth)
        except ValueError as exc:
            msg = f"body is not valid JSON: {exc}"
            if systemone:  # FastAPI's shape, as TypeSafe's client expects
                pos = getattr(exc, "pos", 0)
                raise Invalid([{"loc": ["body", pos], "msg": msg, "type": "json_invalid"}]) from None
            raise HTTPProblem(400, "invalid_json", msg) from None

    def on_engine(budget: RequestBudget, work: Callable[[Any, RequestBudget], Any]) -> Any:
        """The engine lock (queued: still stops on deadline or cancel), then the scoring work."""
        engine = holder.get()
        budget.working = False  # waiting behind other requests: a deadline passed here is load (503)
        while not engine.lock.acquire(timeout=0.1):
            budget.check()
        try:
            budget.check()
            budget.working = True
            t0 = time.monotonic()
            try:
                return work(engine, budget)
            finally:
                budget.served = time.monotonic() - t0
        finally:
            engine.lock.release()

    async def admitted(request: Request, work: Callable[[bytes, RequestBudget], Any]) -> Any:
        """Admission before any work: a queue slot (429) and the deadline clock first; then the body
        is read (within the deadline), and decoded, parsed, validated and scored in a worker thread
        (`work(raw body, budget)`) - never on the event loop, which keeps answering /ping. The work
        is cancelled when the client goes away."""
        budget = RequestBudget(settings.request_timeout)
        admission.enter(budget)
        watcher: asyncio.Task | None = None

        async def watch() -> None:
            while True:
                await asyncio.sleep(0.25)
                if await request.is_disconnected():
                    budget.cancel(499, "client_closed", "the client closed the connection")
                    return

        try:
            raw = await read_raw(request, settings, budget.remaining)
            watcher = asyncio.create_task(watch())  # only once the body is read: both would call receive()

            def run() -> Any:
                budget.working = True  # decoding and validating are this request's own work
                return work(raw, budget)

            return await run_in_threadpool(run)
        finally:
            if watcher is not None:
                watcher.cancel()
            admission.leave(budget, budget.served)

    @app.get("/ping")
    async def ping():  # GET is answered by _Gate before routing; this route documents it (and 405s)
        return ping_answer()

    @app.get("/execution-parameters")
    def execution_parameters():
        """What SageMaker Batch Transform should use: one engine answers one request at a time,
        so one concurrent transform; many rows per request; the SageMaker payload limit."""
        return {"MaxConcurrentTransforms": 1, "BatchStrategy": "MULTI_RECORD",
                "MaxPayloadInMB": max(1, min(100, settings.max_body // (1024 * 1024)))}

    @app.post("/invocations")
    async def invocations(request: Request):
        if content_type(request) in JSONLINES_TYPES:
            def lines(raw: bytes, budget: RequestBudget) -> bytes:
                body = decoded(request, raw)
                holder.get()
                rows, errors = parse_lines(body, holder.policies, settings)
                budget.check()
                return on_engine(budget, lambda engine, b: score_lines(engine, rows, errors, b))

            return Response(await admitted(request, lines), media_type="application/jsonlines")
        require_json(request)

        def one(raw: bytes, budget: RequestBudget) -> Any:
            payload = json_payload(decoded(request, raw))
            budget.check()
            holder.get()
            inv = parse_invocation(payload, holder.policies, settings)
            budget.check()
            return on_engine(budget, lambda engine, b: score_invocation(engine, inv, b))

        return await admitted(request, one)

    @app.post("/v1/systemone")
    async def systemone(request: Request):
        require_json(request, systemone=True)

        def one(raw: bytes, budget: RequestBudget) -> dict:
            payload = json_payload(decoded(request, raw), systemone=True)
            budget.check()
            req, rows = parse_systemone(holder.get(), payload, settings)
            budget.check()
            return on_engine(budget, lambda engine, b: score_systemone(engine, req, rows, b))

        return await admitted(request, one)

    @app.get("/v1/models")
    def models():
        engine = holder.get()
        name, aliases = model_names(engine, settings)
        desc = f"{engine.info.description} via llama.cpp; readout {engine.info.default_readout}"
        return {"models": [{"name": n, "description": desc if n == name else f"alias of {name}",
                            "release_date": settings.model_release_date or engine.info.release_date}
                           for n in (name, *aliases)]}

    @app.get("/info")
    def info():
        engine = holder.get()
        return {"model": engine.info.public(), "readouts": list(READOUTS), "debias": list(DEBIAS), "guards": list(GUARDS),
                "features": ["hidden_state"],  # rows may ask for their hidden state (what a learned head reads)
                "limits": {"request_timeout_s": settings.request_timeout, "max_queue": settings.max_queue,
                           "max_rows": settings.max_rows, "max_cost": settings.max_cost,
                           "max_body_bytes": settings.max_body, "max_elements": settings.max_elements,
                           "header_timeout_s": settings.header_timeout, "max_connections": settings.max_connections},
                "policies": {pid: {"name": p.name, "threshold": p.threshold, "temperature": p.temperature,
                                   "option_offsets": p.option_offsets, "guard": p.guard,
                                   "head": p.head.kind if p.head is not None else None,
                                   "model_matches": pid not in holder.policies.mismatched()}
                             for pid, p in holder.policies.policies.items()}}

    return app


class _Gate:
    """Pure ASGI middleware in front of every route: GET /ping is answered here, before routing and
    on the event loop itself (never queued behind a worker thread); `/x/` is served as `/x` (no
    redirect with an empty body); with an API key set every path but /ping needs it (docs and schema
    too)."""

    def __init__(self, app, api_key: str | None, ping: Callable[[], Response]):
        self.app, self.api_key, self.ping = app, api_key, ping
        # the key's bytes as the environment held them (surrogateescape: even a key that is not UTF-8)
        self.key_bytes = api_key.encode("utf-8", "surrogateescape") if api_key else b""

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if path in ("/ping", "/ping/") and scope["method"] in ("GET", "HEAD"):  # first, and no threadpool hop
            return await self.ping()(scope, receive, send)
        if len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path.rstrip("/") or "/", "raw_path": path.rstrip("/").encode() or b"/"}
        if self.api_key and scope["path"] != "/ping":
            headers = dict(scope.get("headers") or [])
            # bytes against bytes: a header is octets (a client sends a non-ASCII key as UTF-8), compared
            # with the key's own bytes - decoding one side as latin-1 and the other as UTF-8 never matched
            scheme, _, given = headers.get(b"authorization", b"").strip().partition(b" ")
            if scheme.lower() != b"bearer" or not given.strip():
                return await problem(401, "authentication_error",
                                     "missing API key: send 'Authorization: Bearer <key>'")(scope, receive, send)
            if not hmac.compare_digest(given.strip(), self.key_bytes):
                return await problem(401, "authentication_error", "invalid API key")(scope, receive, send)
        return await self.app(scope, receive, send)

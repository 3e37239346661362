"""The adapter's routes (what each answers: adapter/server/app.py's docstring) and how a POST becomes work.

A POST is admitted before any work is done on it (`Intake.admitted`): a queue slot (429 + Retry-After)
and the deadline clock first; then the body is read within the deadline, and decoded, parsed,
validated (adapter/server/codecs.py) and scored in a worker thread - never on the event loop, which keeps
answering /ping - behind the engine lock (`Intake.on_engine`), stopping on the deadline or when the
client goes away. The routes read the engine holder, the settings and the intake from app.state
(server.create_app puts them there)."""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from adapter.server.admission import Admission, RequestBudget
from adapter.server.calibrated import PolicySet
from adapter.server.codecs import (JSONLINES_TYPES, model_names, parse_invocation, parse_lines, parse_systemone,
                     score_invocation, score_lines, score_systemone)
from adapter.guard import GUARDS
from adapter.server.http_body import decode, read_raw
from adapter.json_text import parse_json
from adapter.server.http_errors import HTTPProblem, Invalid, problem
from adapter.schema import DEBIAS, READOUTS, JSONObject, RequestError
from adapter.server.settings import AdapterSettings

if TYPE_CHECKING:
    from adapter.engine.engine import Engine

router = APIRouter()
_Answer = TypeVar("_Answer")  # what a request's work gives back: a response body, or JSON Lines
# The routes declare their return types with response_model=None: FastAPI would otherwise read the
# annotation as a response model and validate and re-serialise every answer through it.


class EngineSource(Protocol):
    """What the routes need of the engine holder (app.EngineHolder, which imports this module): the
    engine once loaded (HTTPProblem 503 before) and the policies it enforces."""

    policies: PolicySet

    def get(self) -> Engine: ...


class Intake:
    """One adapter's way from a request to the engine: the holder (the model, once loaded), the
    settings (caps and timeouts) and the admission queue."""

    def __init__(self, holder: EngineSource, settings: AdapterSettings, admission: Admission):
        self.holder, self.settings, self.admission = holder, settings, admission

    def ping(self) -> JSONResponse:
        """200 with the model once it is loaded; 503 (loading, or why the load failed) before."""
        try:
            engine = self.holder.get()
        except HTTPProblem as exc:
            return problem(exc.status, exc.error_type, exc.message, exc.headers)
        return JSONResponse({"status": "ok", "model": engine.info.file, "sha256": engine.info.sha256})

    @staticmethod
    def content_type(request: Request) -> str:
        return request.headers.get("content-type", "").split(";")[0].strip().lower()

    def require_json(self, request: Request, systemone: bool = False) -> None:
        ctype = self.content_type(request)
        if ctype not in ("application/json", "") and not ctype.endswith("+json"):
            lines = "" if systemone else ", or application/jsonlines (one row per line, Batch Transform)"
            raise HTTPProblem(415, "unsupported_media_type",
                              f"Content-Type {ctype!r} is not supported: send application/json{lines}")

    def decoded(self, request: Request, raw: bytes) -> bytes:
        """Content-Encoding undone, within the byte and JSON-value caps (worker thread)."""
        return decode(raw, request.headers.get("content-encoding"), self.settings.max_decoded,
                      self.settings.max_elements)

    def json_payload(self, body: bytes, systemone: bool = False) -> Any:
        try:
            if not body.strip():
                raise ValueError("empty body: send a JSON document")
            return parse_json(body, self.settings.max_depth)
        except RequestError as exc:  # the text rule (json_text.lone_surrogate): a field-named 422
            errors = exc.to_detail()
            raise Invalid([{**e, "loc": ["body", *e["loc"]]} for e in errors] if systemone else errors) from None
        except ValueError as exc:
            msg = f"body is not valid JSON: {exc}"
            if systemone:  # FastAPI's shape, as TypeSafe's client expects
                pos = getattr(exc, "pos", 0)
                raise Invalid([{"loc": ["body", pos], "msg": msg, "type": "json_invalid"}]) from None
            raise HTTPProblem(400, "invalid_json", msg) from None

    def on_engine(self, budget: RequestBudget, work: Callable[[Engine, RequestBudget], _Answer]) -> _Answer:
        """The engine lock (queued: still stops on deadline or cancel), then the scoring work."""
        engine = self.holder.get()
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

    async def admitted(self, request: Request, work: Callable[[bytes, RequestBudget], _Answer]) -> _Answer:
        """Admission before any work: a queue slot (429) and the deadline clock first; then the body
        is read (within the deadline), and decoded, parsed, validated and scored in a worker thread
        (`work(raw body, budget)`) - never on the event loop, which keeps answering /ping. The work
        is cancelled when the client goes away."""
        budget = RequestBudget(self.settings.request_timeout, self.admission.pace)
        self.admission.enter(budget)
        watcher: asyncio.Task[None] | None = None

        async def watch() -> None:
            while True:
                await asyncio.sleep(0.25)
                if await request.is_disconnected():
                    budget.cancel(499, "client_closed", "the client closed the connection")
                    return

        try:
            raw = await read_raw(request, self.settings, budget.remaining)
            watcher = asyncio.create_task(watch())  # only once the body is read: both would call receive()

            def run() -> _Answer:
                budget.working = True  # decoding and validating are this request's own work
                return work(raw, budget)

            return await run_in_threadpool(run)
        finally:
            if watcher is not None:
                watcher.cancel()
            self.admission.leave(budget, budget.served)


def intake(request: Request) -> Intake:
    it: Intake = request.app.state.intake  # put there by app.create_app
    return it


@router.get("/ping", response_model=None)
async def ping(request: Request) -> JSONResponse:  # GET is answered by server._Gate before routing; this route documents it (and 405s)
    return intake(request).ping()


@router.get("/execution-parameters", response_model=None)
def execution_parameters(request: Request) -> JSONObject:
    """What SageMaker Batch Transform should use: one engine answers one request at a time,
    so one concurrent transform; many rows per request; the SageMaker payload limit."""
    settings = intake(request).settings
    return {"MaxConcurrentTransforms": 1, "BatchStrategy": "MULTI_RECORD",
            "MaxPayloadInMB": max(1, min(100, settings.max_body // (1024 * 1024)))}


@router.post("/invocations", response_model=None)
async def invocations(request: Request) -> Response | JSONObject | list[JSONObject]:
    it = intake(request)
    holder, settings = it.holder, it.settings
    if it.content_type(request) in JSONLINES_TYPES:
        def lines(raw: bytes, budget: RequestBudget) -> bytes:
            body = it.decoded(request, raw)
            holder.get()
            rows, errors = parse_lines(body, holder.policies, settings)
            budget.check()
            return it.on_engine(budget, lambda engine, b: score_lines(engine, rows, errors, b))

        return Response(await it.admitted(request, lines), media_type="application/jsonlines")
    it.require_json(request)

    def one(raw: bytes, budget: RequestBudget) -> JSONObject | list[JSONObject]:
        payload = it.json_payload(it.decoded(request, raw))
        budget.check()
        holder.get()
        inv = parse_invocation(payload, holder.policies, settings)
        budget.check()
        return it.on_engine(budget, lambda engine, b: score_invocation(engine, inv, b))

    return await it.admitted(request, one)


@router.post("/v1/systemone", response_model=None)
async def systemone(request: Request) -> JSONObject:
    it = intake(request)
    it.require_json(request, systemone=True)

    def one(raw: bytes, budget: RequestBudget) -> JSONObject:
        payload = it.json_payload(it.decoded(request, raw), systemone=True)
        budget.check()
        req, rows = parse_systemone(it.holder.get(), payload, it.settings)
        budget.check()
        return it.on_engine(budget, lambda engine, b: score_systemone(engine, req, rows, b))

    return await it.admitted(request, one)


@router.get("/v1/models", response_model=None)
def models(request: Request) -> JSONObject:
    it = intake(request)
    engine = it.holder.get()
    name, aliases = model_names(engine, it.settings)
    desc = f"{engine.info.description} via llama.cpp; readout {engine.info.default_readout}"
    return {"models": [{"name": n, "description": desc if n == name else f"alias of {name}",
                        "release_date": it.settings.model_release_date or engine.info.release_date}
                       for n in (name, *aliases)]}


@router.get("/info", response_model=None)
def info(request: Request) -> JSONObject:
    it = intake(request)
    holder, settings = it.holder, it.settings
    engine = holder.get()
    return {"model": engine.info.public(), "readouts": list(READOUTS), "debias": list(DEBIAS), "guards": list(GUARDS),
            "features": ["hidden_state", "head_layout"],  # rows may ask for their hidden state (what a learned head reads) and the head layout
            "limits": {"request_timeout_s": settings.request_timeout, "max_queue": settings.max_queue,
                       "max_rows": settings.max_rows, "max_cost": settings.max_cost,
                       "max_body_bytes": settings.max_body, "max_elements": settings.max_elements,
                       "header_timeout_s": settings.header_timeout, "max_connections": settings.max_connections},
            "policies": {pid: {"name": p.name, "threshold": p.threshold, "temperature": p.temperature,
                               "option_offsets": p.option_offsets, "guard": p.guard,
                               "head": p.head.kind if p.head is not None else None,
                               "model_matches": pid not in holder.policies.mismatched()}
                         for pid, p in holder.policies.policies.items()}}

"""The decision log: one JSON line per decision the adapter makes (opt-in), with its metrics.

Why here and not in the routes: the routes' admission is another concern (and changes apart from
this). The log is an ASGI middleware that opens a per-request collector (a context variable, which
the worker thread that scores inherits), the scoring functions drop each (row, result, policy)
into it, and once the response is sent the middleware writes one line per decision with the
request's id and its end-to-end latency.

`SM_SEMIF_DECISION_LOG` = `stdout` (on SageMaker: CloudWatch Logs) or a file path (appended).
Privacy by default: the state is logged only with `SM_SEMIF_LOG_STATES=1`; without it a line
carries ids, hashes, probabilities and the decision, never the text decided on.

Each line is also a CloudWatch Embedded Metric Format document (`_aws`): CloudWatch Logs turns it
into metrics per policy (Latency, Fallback, SteeringSuspected, LabelMass) with no agent and no
API call. The document is built with `aws-embedded-metrics`' own MetricsContext and LogSerializer,
used synchronously: its logger flushes through an environment it detects (coroutines, an EC2
metadata probe, an agent socket by default) and writes to stdout only, while the adapter records
decisions from worker threads and may log to a file.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import stat
import sys
import threading
import time
import uuid
from contextvars import ContextVar
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Sequence

from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError, PydanticUseDefault
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adapter.env_settings import EnvSettings, SettingsError
from adapter.policy import CalibratedPolicy, policy_version
from adapter.schema import LOG_MARKER, DecisionRequest, JSONObject

log = logging.getLogger("semif.adapter")

LINE_VERSION = 1
NAMESPACE = "SemIf/Adapter"
LOGGED_PATHS = ("/invocations", "/v1/systemone")
REQUEST_ID_HEADERS = (b"x-amzn-sagemaker-inference-id", b"x-amzn-requestid", b"x-request-id")

# a row of a request, its public result (the answer body's JSON; None: the row got an error) and its policy
Collected = tuple[DecisionRequest | None, JSONObject | None, CalibratedPolicy | None]
_collector: ContextVar[list[Collected] | None] = ContextVar("semif_decisions", default=None)


FLAG_WORDS = {"1": True, "true": True, "on": True, "yes": True, "0": False, "false": False, "off": False, "no": False}


def _destination(raw: Any) -> Any:
    """None (off), "stdout", or a file path whose folder exists."""
    if not isinstance(raw, str):
        return raw
    dest = raw.strip()
    if not dest or dest.lower() == "off":
        return None
    if dest.lower() != "stdout":
        path = Path(dest).expanduser()
        parent = path.parent
        if not parent.is_dir():
            raise PydanticCustomError("folder", "names a folder that does not exist ({parent}): create it, or use "
                                      "SM_SEMIF_DECISION_LOG=stdout", {"parent": str(parent)})
        if path.is_dir():
            raise PydanticCustomError("is_folder", "is a folder: name a file in it, e.g. {example}",
                                      {"example": str(path / "decisions.jsonl")})
        if path.exists() and not path.is_file():  # a FIFO would block the open (and serve); a device is no log
            raise PydanticCustomError("not_regular", "is not a regular file (a FIFO, socket or device): name a "
                                      "file, or use SM_SEMIF_DECISION_LOG=stdout")
        if (path.exists() and not os.access(path, os.W_OK)) or (not path.exists() and not os.access(parent, os.W_OK)):
            raise PydanticCustomError("not_writable", "cannot be written (permission denied): name a writable file, or "
                                      "use SM_SEMIF_DECISION_LOG=stdout")
    return dest


def _flag(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    word = raw.strip().lower()
    if word == "":
        raise PydanticUseDefault()
    if word not in FLAG_WORDS:
        raise PydanticCustomError("flag", "is not 1/0: set 1 to log states, leave unset not to")
    return FLAG_WORDS[word]


def _namespace(raw: Any) -> Any:
    if isinstance(raw, str) and not raw.strip():
        raise PydanticUseDefault()
    return raw.strip() if isinstance(raw, str) else raw


class DecisionLogSettings(EnvSettings):
    # None: off; "stdout"; else a file path (appended)
    destination: Annotated[str | None, BeforeValidator(_destination)] = Field(None, validation_alias="SM_SEMIF_DECISION_LOG")
    log_states: Annotated[bool, BeforeValidator(_flag)] = Field(False, validation_alias="SM_SEMIF_LOG_STATES")
    namespace: Annotated[str, BeforeValidator(_namespace)] = Field(NAMESPACE, validation_alias="SM_SEMIF_METRICS_NAMESPACE")


def collect(rows: Sequence[DecisionRequest | None], results: Sequence[JSONObject | None],
            policies: Sequence[CalibratedPolicy | None]) -> None:
    """Called by the scoring functions with the rows of a request, their public results (None for a
    row that got an error) and the calibrated policy each row named (or None). A no-op unless the
    decision log is on for this request."""
    bucket = _collector.get()
    if bucket is not None:
        bucket.extend(zip(rows, results, policies))


def question_sha256(row: DecisionRequest) -> str:
    """What was asked, without the state: question, options, examples and how they were read -
    rows of one policy share it, so an import can group rows that named no policy."""
    part = row.model_dump(mode="json", exclude={"id", "state", "policy_id", "hidden_state"})  # what is asked, not returned
    return hashlib.sha256(json.dumps(part, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def record(row: DecisionRequest, result: JSONObject, policy: CalibratedPolicy | None, *, request_id: str,
           endpoint: str, latency_s: float, rows_in_request: int, log_states: bool, at: float | None = None
           ) -> JSONObject:
    """One decision as a log record (plain JSON, before the metrics are attached): the line's fields."""
    decision = result.get("decision")
    model = result.get("model") or {}
    out: JSONObject = {
        LOG_MARKER: LINE_VERSION,
        "time": datetime.fromtimestamp(at or time.time(), timezone.utc).isoformat(timespec="milliseconds"),
        "request_id": request_id, "endpoint": endpoint, "row_id": result.get("id"), "rows_in_request": rows_in_request,
        "policy": None if policy is None else {"policy_id": policy.policy_id, "schema_version": policy.schema_version,
                                               "version": policy_version(policy), "created_at": policy.created_at},
        "model": {"file": model.get("file"), "sha256": model.get("sha256")},
        "prompt_sha256": result.get("prompt_sha256"), "prompt_version": result.get("prompt_version"),
        "question_sha256": question_sha256(row),
        "readout": result.get("readout"), "debias": result.get("debias"), "permutations": result.get("permutations"),
        "option_ids": result.get("option_ids"), "probabilities": result.get("probabilities"),
        "top_option": result.get("top_option"), "label_mass": result.get("label_mass"),
        "probability_status": result.get("probability_status"),
        "latency_ms": round(latency_s * 1000, 3), "row_seconds": result.get("total_seconds"),
    }
    if result.get("calibrated_probabilities") is not None:
        out["calibrated_probabilities"] = result["calibrated_probabilities"]
    if decision is not None:
        out["decision"] = {"option": decision.get("option_id"), "gated": decision.get("gated"),
                           "reason": decision.get("reason"), "confidence": decision.get("confidence")}
    if result.get("guard") is not None:
        out["guard"] = result["guard"]
    if log_states:
        out["state"] = row.state
    return out


def with_metrics(rec: JSONObject, namespace: str = NAMESPACE) -> str:
    """The record as one Embedded Metric Format line: its fields stay searchable properties and
    CloudWatch extracts Latency, Fallback (1 when the gate sent the row to the fallback - its mean is
    the fallback rate), SteeringSuspected and LabelMass per policy."""
    from aws_embedded_metrics.logger.metrics_context import MetricsContext
    from aws_embedded_metrics.serializers.log_serializer import LogSerializer

    ctx = MetricsContext.empty()
    ctx.namespace = namespace
    ctx.set_dimensions([{"PolicyId": (rec.get("policy") or {}).get("policy_id") or "none"}], use_default=False)
    for key, value in rec.items():
        ctx.set_property(key, value)
    ctx.put_metric("Latency", float(rec["latency_ms"]), "Milliseconds")
    ctx.put_metric("Fallback", 1.0 if (rec.get("decision") or {}).get("gated") else 0.0, "Count")
    ctx.put_metric("SteeringSuspected", 1.0 if (rec.get("guard") or {}).get("suspected") else 0.0, "Count")
    if rec.get("label_mass") is not None:
        ctx.put_metric("LabelMass", float(rec["label_mass"]), "None")
    ctx.meta["Timestamp"] = int(datetime.fromisoformat(rec["time"]).timestamp() * 1000)
    (line,) = LogSerializer.serialize(ctx)  # 4 metrics: one document (the limit is 100)
    return line


class DecisionLog:
    """Where the lines go. Writes are serialised and go straight to the file descriptor, line by line (a
    line is never torn by another writer, and a crash loses no decision already answered); a failed
    write is logged with the lines that were truly lost, never the request's failure - the decision was
    made and answered.

    A file is opened for appending and reopened when it was moved or removed (its path no longer names
    the open inode: logrotate, `mv`), so new lines go to the path configured, not to the renamed file.
    Nothing is buffered: on a full disk, os.write says how many bytes went out, so the lines reported
    lost are exactly the ones that are not in the file (a torn last line counts as lost, and a newline is
    written first next time so the following line starts clean)."""

    def __init__(self, settings: DecisionLogSettings):
        self.settings = settings
        self._lock = threading.Lock()
        self._path = (Path(settings.destination).expanduser()
                      if settings.destination and settings.destination.lower() != "stdout" else None)
        self._fd: int | None = None
        self._torn = False  # the last write ended mid-line
        self.lost = 0  # lines not written since start
        if self._path is not None:
            try:
                self._open()
            except OSError as exc:
                raise SettingsError(f"SM_SEMIF_DECISION_LOG={settings.destination!r} cannot be opened for appending "
                                    f"({exc.strerror or exc}): name a writable file, or use stdout") from None

    def _open(self) -> None:
        assert self._path is not None
        # O_NONBLOCK: a FIFO put at the path after start-up fails the open (no reader) instead of hanging;
        # anything but a regular file is refused, like at start-up
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device)")
        os.set_blocking(fd, True)
        self._fd = fd

    def _reopen_if_moved(self) -> None:
        """Reopen when the path no longer names the open file (renamed, removed, replaced)."""
        assert self._path is not None
        try:
            now = os.stat(self._path)
            mine = os.fstat(self._fd) if self._fd is not None else None
            same = mine is not None and (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev)
        except OSError:
            same = False
        if not same:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
            self._torn = False
            self._open()

    @property
    def enabled(self) -> bool:
        return self.settings.destination is not None

    def write(self, lines: list[str]) -> None:
        if not lines:
            return
        data = "".join(line + "\n" for line in lines).encode("utf-8", "backslashreplace")
        with self._lock:
            if self._path is None:
                try:
                    sys.stdout.write(data.decode("utf-8"))
                    sys.stdout.flush()
                except (OSError, ValueError) as exc:
                    self._lost(len(lines), len(lines), exc)
                return
            written = 0
            try:
                self._reopen_if_moved()
                assert self._fd is not None
                if self._torn:  # the line a full disk cut off: end it, so the next one parses
                    os.write(self._fd, b"\n")
                    self._torn = False
                while written < len(data):
                    n = os.write(self._fd, data[written:])
                    if n <= 0:
                        raise OSError("no bytes written")
                    written += n
            except OSError as exc:
                whole = data[:written].count(b"\n")
                if written:  # else the file ends where it ended: torn still (when the newline failed), or not
                    self._torn = not data[:written].endswith(b"\n")
                self._lost(len(lines) - whole, len(lines), exc)

    def _lost(self, n: int, of: int, exc: BaseException) -> None:
        self.lost += n
        log.warning("decision log: %d of %d line(s) not written (%d lost since start): %s", n, of, self.lost, exc)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _request_id(scope: Scope) -> str:
    headers: dict[bytes, bytes] = dict(scope.get("headers") or [])
    for name in REQUEST_ID_HEADERS:
        value = headers.get(name, b"").decode("latin-1").strip()
        if value and len(value) <= 200 and value.isprintable():
            return value
    return uuid.uuid4().hex


class DecisionLogMiddleware:
    """Pure ASGI middleware: for POST /invocations and /v1/systemone, a collector for the request's
    decisions, its id (SageMaker's inference id, X-Request-Id, else a new one - echoed back as
    X-Request-Id) and its latency; the lines are written after the response is sent."""

    def __init__(self, app: ASGIApp, decision_log: DecisionLog):
        self.app, self.decision_log = app, decision_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "").rstrip("/") if scope["type"] == "http" else ""
        if scope["type"] != "http" or scope.get("method") != "POST" or path not in LOGGED_PATHS:
            return await self.app(scope, receive, send)
        request_id = _request_id(scope)
        bucket: list[Collected] = []
        token = _collector.set(bucket)
        t0 = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            _collector.reset(token)
            latency = time.perf_counter() - t0
            settings = self.decision_log.settings
            decided = [(row, res, pol) for row, res, pol in bucket if res is not None and row is not None]
            try:
                lines = [with_metrics(record(row, res, pol, request_id=request_id, endpoint=path, latency_s=latency,
                                             rows_in_request=len(bucket), log_states=settings.log_states),
                                      settings.namespace) for row, res, pol in decided]
            except Exception:  # a bug here must not turn an answered request into an error
                log.exception("decision log: could not build the lines of request %s", request_id)
                lines = []
            self.decision_log.write(lines)

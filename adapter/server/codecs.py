"""What a request body means and how its answer is written, with no HTTP in sight: the three
/invocations shapes (one row, an array of rows, {"state", "questions": [...]}), Batch Transform's JSON
Lines (a bad line becomes its own error object, the rest are scored) and /v1/systemone - each parsed
into decision rows (validated, filled from the named calibrated policies, within the row and cost
caps: Invalid with full locs otherwise), scored on the engine, and encoded back. adapter/server/routes.py
calls these from its worker threads."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from pydantic import BaseModel, ValidationError

from adapter.server.admission import RequestBudget
from adapter.policy import CalibratedPolicy
from adapter.server.calibrated import Decisions, PolicySet
from adapter.server.decision_log import collect
from adapter.json_text import parse_json
from adapter.server.http_errors import HTTPProblem, Invalid
from adapter.schema import DecisionRequest, FieldError, JSONObject, Loc, RequestError, SharedStateRequest, errors_from
from adapter.server.settings import AdapterSettings
from adapter.server.systemone import SystemOneRequest, respond, to_rows

if TYPE_CHECKING:
    from adapter.engine.engine import Engine

_Model = TypeVar("_Model", bound=BaseModel)


# -- /invocations: the three shapes -> rows ------------------------------------------------------
@dataclass
class Invocation:
    shape: str  # "one" | "array" | "shared"
    rows: list[DecisionRequest]
    policies: list[CalibratedPolicy | None]
    locs: list[Loc] = field(default_factory=list)  # where each row sits in the request, for errors
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
        rows: list[DecisionRequest] = []
        used: list[CalibratedPolicy | None] = []
        locs: list[Loc] = []
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


def _fill(policies: PolicySet, item: Any, loc: Loc) -> CalibratedPolicy | None:
    try:
        return policies.fill(item, loc)
    except RequestError as exc:
        raise Invalid(exc.to_detail()) from None


def _validate(model: type[_Model], item: Any, loc: Loc) -> _Model:
    try:
        return model.model_validate(item)
    except (ValidationError, RequestError) as exc:
        raise Invalid(errors_from(exc, loc)) from None


def _cap_rows(n: int, loc: Loc, settings: AdapterSettings) -> None:
    if n > settings.max_rows:
        raise Invalid([{"loc": loc, "msg": f"{n} rows in one request; at most {settings.max_rows} "
                        "(SM_SEMIF_MAX_ROWS): split the batch", "type": "too_long"}])


def option_readings(rows: list[DecisionRequest]) -> int:
    """The work a request asks for, in options read: a permuted row reads every option in every order."""
    return sum(len(r.options) * (len(r.options) if r.permute else 1) for r in rows)


def _cap_cost(rows: list[DecisionRequest], settings: AdapterSettings, loc: Loc | None = None) -> None:
    cost = option_readings(rows)
    if cost > settings.max_cost:
        raise Invalid([{"loc": loc or [], "msg": f"this request reads {cost} options (options x permutations, summed "
                        f"over rows); at most {settings.max_cost} (SM_SEMIF_MAX_COST): send fewer rows or options, "
                        "or drop permute", "type": "too_long"}])


def score_invocation(engine: Engine, inv: Invocation, budget: RequestBudget) -> JSONObject | list[JSONObject]:
    """The answer body: one row's result for the one-row shape, else the list of them."""
    decisions = Decisions(inv.policies)
    try:
        results = engine.score_many(inv.rows, budget=budget, together=inv.shape == "shared",
                                    guard_when=decisions.automates, judge_for=decisions.judge)
    except RequestError as exc:
        prefix = inv.locs[exc.row] if exc.row is not None else []
        raise Invalid(errors_from(exc, prefix)) from None
    out = [decisions.public(i, r, keep) for i, (r, keep) in enumerate(zip(results, inv.asked_hidden))]
    collect(inv.rows, out, inv.policies)
    return out[0] if inv.shape == "one" else out


# -- Batch Transform: JSON Lines in, JSON Lines out ---------------------------------------------------
JSONLINES_TYPES = ("application/jsonlines", "application/jsonl", "application/x-jsonlines", "application/x-ndjson")
Line = tuple[DecisionRequest, CalibratedPolicy | None, bool]  # a good line: (row, its policy, asked for hidden)


class LineProblem(TypedDict):
    status: int
    detail: list[FieldError]


class LineError(TypedDict):
    """A bad line's own output line (JSON)."""

    id: str | None
    error: LineProblem


def parse_lines(body: bytes, policies: PolicySet, settings: AdapterSettings
                ) -> tuple[list[Line | None], list[LineError | None]]:
    """One decision row per non-empty line. Returns (rows or None, per-line error objects or None):
    a bad line becomes its own error object in the output instead of failing the batch."""
    lines = [ln for ln in body.split(b"\n") if ln.strip()]
    if not lines:
        raise Invalid([{"loc": [], "msg": "empty body: send one JSON decision row per line", "type": "value_error"}])
    _cap_rows(len(lines), [], settings)
    rows: list[Line | None] = []
    errors: list[LineError | None] = []
    for i, line in enumerate(lines):
        row_id = None
        try:
            try:
                item = parse_json(line, settings.max_depth)
            except RequestError as exc:  # the text rule (json_text.lone_surrogate): a field-named 422
                raise Invalid(exc.to_detail()) from None
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


def line_error(row_id: str | None, status: int, detail: list[FieldError]) -> LineError:
    return {"id": row_id, "error": {"status": status, "detail": detail}}


def score_lines(engine: Engine, rows: list[Line | None], errors: list[LineError | None], budget: RequestBudget) -> bytes:
    """Score the good lines (as if each came alone: calibration's numbers hold); a line the engine
    refuses gets its error object and the rest are scored."""
    good = {i: r for i, r in enumerate(rows) if r is not None}
    todo = list(good)
    results: dict[int, JSONObject] = {}
    while todo:
        decisions = Decisions([good[i][1] for i in todo])
        try:
            scored = engine.score_many([good[i][0] for i in todo], budget=budget, guard_when=decisions.automates,
                                       judge_for=decisions.judge)
        except RequestError as exc:
            if exc.row is None:  # not pinned to one line (it never should be): every line gets it
                for i in todo:
                    errors[i] = line_error(good[i][0].id, 422, errors_from(exc))
                break
            bad = todo.pop(exc.row)
            errors[bad] = line_error(good[bad][0].id, 422, errors_from(exc))
            continue
        for k, (i, r) in enumerate(zip(todo, scored)):
            results[i] = decisions.public(k, r, keep_hidden=good[i][2])
        break
    collect([r[0] if r else None for r in rows], [results.get(i) for i in range(len(rows))],
            [r[1] if r else None for r in rows])
    out = [json.dumps(results[i] if i in results else errors[i], ensure_ascii=False, allow_nan=False)
           for i in range(len(rows))]
    return ("\n".join(out) + "\n").encode()


# -- /v1/systemone ---------------------------------------------------------------------------------
def model_names(engine: Engine, settings: AdapterSettings) -> tuple[str, list[str]]:
    """The served model's name (SM_SEMIF_MODEL_NAME, else the GGUF file stem) and its aliases."""
    return settings.model_name or engine.info.file.rsplit(".gguf", 1)[0], list(settings.model_aliases)


def parse_systemone(engine: Engine, payload: Any, settings: AdapterSettings
                    ) -> tuple[SystemOneRequest, list[DecisionRequest]]:
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


def score_systemone(engine: Engine, req: SystemOneRequest, rows: list[DecisionRequest], budget: RequestBudget
                    ) -> JSONObject:
    try:
        results = engine.score_many(rows, budget=budget, together=True)  # one prefill of the state for all questions
    except RequestError as exc:
        qid = rows[exc.row].id if exc.row is not None else None
        raise Invalid(errors_from(exc, ["body", "questions", qid] if qid is not None else ["body"])) from None
    collect(rows, [r.public() for r in results], [None] * len(rows))
    return respond(req, results, req.model)

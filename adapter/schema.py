"""Decision rows: the request a policy + state becomes, and the result a target returns.

Validation lives here (pydantic) so every entry point - HTTP, CLI, the workbench - rejects bad
input the same way, with errors that name the field (`loc`) and say how to fix it.
"""
from __future__ import annotations

import base64
import json
import math
from typing import Annotated, Any, Literal, Sequence, TypedDict, Union, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator

from adapter.guard import Guard
from adapter.ids import collision, collision_message
from adapter.ids import id_problem as id_problem  # re-exported: the commands check a --fallback id with it
from adapter.ids import unprintable

MAX_OPTIONS = 26  # letters A..Z
MAX_EXAMPLES = 32  # few-shot examples in one policy
Readout = Literal["letters", "option-words"]
READOUTS: tuple[Readout, ...] = get_args(Readout)  # the one list: CLI choices, /info, the policy form
Layout = Literal["state-first", "policy-first"]  # policy-first: the head layout (prompt.render_policy_first)
LAYOUTS: tuple[Layout, ...] = get_args(Layout)
HEAD_LAYOUT: Layout = "policy-first"
Debias = Literal["none", "content-free"]
DEBIAS: tuple[Debias, ...] = get_args(Debias)
State = Union[str, dict[str, Any], list[Any]]
Loc = list[str | int]  # where a field sits in a request, as a path of keys and indices
# A JSON object at an edge - an HTTP body, a file, a decision log line - read or written by key; typed
# records (TypedDicts, models) stay the way inside Python
JSONObject = dict[str, Any]


class FieldError(TypedDict):
    """One field error of a 422 body, FastAPI's shape: [{"loc", "msg", "type"}]."""

    loc: Loc
    msg: str
    type: str


# every decision line the adapter logs has "semif_decision": 1 (adapter/server/decision_log.py writes it;
# the workbench's importer, app/core/decision_import.py, filters on it)
LOG_MARKER = "semif_decision"


class RequestError(ValueError):
    """Bad input: `loc` names the field (as a path), `msg` says what is wrong and how to fix it."""

    def __init__(self, loc: list[str | int], msg: str, type_: str = "value_error", status: int = 422):
        super().__init__(f"{'.'.join(map(str, loc))}: {msg}")
        self.loc, self.msg, self.type, self.status = list(loc), msg, type_, status
        self.row: int | None = None  # set by the engine: which row of a multi-row call it belongs to

    def to_detail(self) -> list[FieldError]:
        return [{"loc": self.loc, "msg": self.msg, "type": self.type}]


def _check_state(value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        raise ValueError("state is empty: send the ticket, log or context text to decide on")
    if isinstance(value, (dict, list)) and not value:
        raise ValueError("state is an empty object/array: send at least one field or item")
    return value


def _valid_id(value: Any) -> Any:
    """The id rule (adapter/ids.py), checked on the id as sent - before whitespace is stripped."""
    if isinstance(value, str):
        problem = id_problem(value)
        if problem:
            raise ValueError(problem)
    return value


class Option(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)
    id: str = Field(min_length=1, max_length=200, description="stable option id returned in option_ids")
    description: str = Field(default="", max_length=2000)

    @field_validator("id", mode="before")
    @classmethod
    def _id(cls, v: Any) -> Any:
        return _valid_id(v)


class Example(BaseModel):
    """A solved case for the few-shot `option-words` readout."""

    model_config = ConfigDict(extra="forbid")
    state: State
    option_id: str = Field(min_length=1)

    @field_validator("state")
    @classmethod
    def _state(cls, v: Any) -> Any:
        return _check_state(v)


class Question(BaseModel):
    """What is asked of a state: the question, its ordered options and how to read the answer."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)
    # kept exactly as sent (the model's str_strip_whitespace is for the question text): a client gets back
    # the id it sent, in every shape (the shared-state shape trimmed " q1" to "q1" before)
    id: Annotated[str, StringConstraints(strip_whitespace=False)] = Field(min_length=1, max_length=200)
    question: str = Field(min_length=1, max_length=8000)
    options: list[Option] = Field(min_length=2, max_length=MAX_OPTIONS)
    readout: Readout | None = Field(default=None, description="letters | option-words; default per model")
    permute: bool = Field(default=False, strict=True, description="average over cyclic option orders (debiasing)")
    debias: Debias | None = Field(default=None, description="content-free: divide out the policy's no-state prior; "
                                  "default per model and readout")
    examples: list[Example] = Field(default_factory=list, max_length=MAX_EXAMPLES)
    few_shot: bool | None = Field(default=None, strict=True, description="put the examples in the prompt; default: option-words "
                                  "does, letters does not (letters shows them as earlier chat turns)")
    guard: Guard | None = Field(default=None, description="steering guard: precheck (a directive naming an option) "
                                "or erase-and-check (precheck, then the state scored with pieces left out)")
    policy_id: str | None = Field(default=None, description="apply a loaded calibrated policy")
    hidden_state: bool = Field(default=False, strict=True, description="also return the model's hidden state at the prompt's "
                               "last token (`hidden_state` in the result): the features a learned head reads")
    layout: Layout | None = Field(
        default=None, description="state-first (default: the state, then the question and options) or policy-first "
        "(the head layout: question and options first, cached once per policy, the state last - read only by a "
        "learned head, so it needs hidden_state: true)")

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        # a row's (or a shared-state question's) id: printable, compared by skeleton between questions;
        # the caller's own key, so not held to the option-id rule (a labeled set's row ids keep working)
        problem = unprintable(v)
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _options_consistent(self) -> "Question":
        ids = [o.id for o in self.options]
        clash = collision(ids)
        if clash is not None:
            first, later = clash
            raise RequestError(["options", later, "id"], collision_message(ids[first], ids[later]))
        seen = set(ids)
        if self.layout == HEAD_LAYOUT:
            self._head_layout_settings()
        for i, ex in enumerate(self.examples):
            if ex.option_id not in seen:
                raise RequestError(["examples", i, "option_id"],
                                   f"{ex.option_id!r} is not one of the options "
                                   f"({', '.join(o.id for o in self.options)})")
        return self


    def _head_layout_settings(self) -> None:
        """The head layout has one rendering: letters, no correction, no permutation, no examples
        shown, and a hidden state for the head - anything else is refused naming its field."""
        head_only = "the policy-first layout is read only by a learned head"
        if not self.hidden_state:
            raise RequestError(["hidden_state"], f"{head_only}: set hidden_state to true, or name a calibrated "
                               "policy whose head reads this layout (policy_id)")
        for name, value, allowed in (("readout", self.readout, (None, "letters")), ("debias", self.debias, (None, "none")),
                                     ("permute", self.permute, (False,)), ("few_shot", self.few_shot, (None, False))):
            if value not in allowed:
                raise RequestError([name], f"{head_only}, which reads letters with no correction, no permutation "
                                   f"and no examples shown: drop {name} (or use layout state-first)")


class DecisionRequest(Question):
    """One row: id + state + question + options."""

    state: State

    def in_head_layout(self) -> "DecisionRequest":
        """This row as a learned head in the head layout reads it: policy first, letters, no correction,
        no permutation, no examples shown, with its hidden state (validated like any row)."""
        return DecisionRequest.model_validate({**self.model_dump(), "layout": HEAD_LAYOUT, "hidden_state": True,
                                               "readout": "letters", "debias": "none", "permute": False,
                                               "few_shot": None})

    @field_validator("state")
    @classmethod
    def _state(cls, v: Any) -> Any:
        return _check_state(v)


class SharedStateRequest(BaseModel):
    """Several questions on one state: the state is prefilled once and each question branches."""

    model_config = ConfigDict(extra="forbid")
    state: State
    questions: list[Question] = Field(min_length=1, max_length=256)

    @field_validator("state")
    @classmethod
    def _state(cls, v: Any) -> Any:
        return _check_state(v)

    @model_validator(mode="after")
    def _unique_ids(self) -> "SharedStateRequest":
        ids = [q.id for q in self.questions]
        clash = collision(ids)
        if clash is not None:
            raise RequestError(["questions", clash[1], "id"], collision_message(ids[clash[0]], ids[clash[1]]))
        return self

    def rows(self) -> list[DecisionRequest]:
        return [DecisionRequest(state=self.state, **q.model_dump()) for q in self.questions]


ProbabilityStatus = Literal["uncalibrated", "calibrated", "generated-logprobs", "generated-one-hot"]


class HiddenState(BaseModel):
    """The model's hidden state at the prompt's last token (its final norm's output, the vector the
    output layer turns into next-token logits), as little-endian float32 in base64: exact, and a
    quarter of the size of a JSON list of numbers. A learned head (adapter/head.py) reads it."""

    model_config = ConfigDict(extra="forbid")
    encoding: Literal["float32-le-base64"] = "float32-le-base64"
    dim: int = Field(gt=0, le=65536)
    data: str

    @classmethod
    def of(cls, vector: np.ndarray) -> "HiddenState":
        v = np.ascontiguousarray(vector, dtype="<f4")
        if v.ndim != 1 or not np.isfinite(v).all():
            raise ValueError("a hidden state is one finite vector")
        return cls(dim=int(v.shape[0]), data=base64.b64encode(v.tobytes()).decode("ascii"))

    def array(self) -> np.ndarray:
        """The vector as float64 (numpy), checked against `dim`."""
        raw = base64.b64decode(self.data, validate=True)
        if len(raw) != 4 * self.dim:
            raise ValueError(f"hidden_state.data holds {len(raw) // 4} values, not dim={self.dim}")
        return np.frombuffer(raw, dtype="<f4").astype(np.float64)


class DecisionResult(BaseModel):
    """What every target returns for one row: one probability per option in the request's order,
    plus how they were read. Engine results fill the token/timing fields; other targets leave
    them None and fill their own (a chat target's `generated_text`, a /v1/systemone `confidence`).
    `probability_status` tells probabilities read from logits from a generated one-hot answer."""

    model_config = ConfigDict(extra="ignore")  # a newer adapter's extra fields do not break older clients
    id: str
    option_ids: list[str]
    probabilities: list[float]
    option_logits: list[float] | None = None
    top_option: str
    probability_status: ProbabilityStatus = "uncalibrated"
    label_mass: float | None = None  # share of next-token probability the option labels held
    readout: str  # letters | option-words | chat-generation | systemone
    debias: Debias | None = None
    prompt_version: str | None = None
    prompt_sha256: str | None = None
    permutations: int = 1
    input_tokens: int | None = None
    cached_tokens: int | None = None
    evaluated_tokens: int | None = None
    label_token_counts: list[int] | None = None
    extra_evals: int = 0  # llama_decode calls spent telling options with a common first token apart
    # (the label trie's: usually 1; the per-prefix path took one per shared prefix)
    forward_seconds: float | None = None
    total_seconds: float | None = None
    model: dict[str, Any] = Field(default_factory=dict)  # file, sha256, quantization, n_ctx, ...
    prior: list[float] | None = None  # the content-free prior that was divided out
    uncorrected_probabilities: list[float] | None = None
    calibrated_probabilities: list[float] | None = None  # set when a calibrated policy was applied
    decision: dict[str, Any] | None = None
    guard: dict[str, Any] | None = None  # the steering guard's finding: suspected, piece, passes (guard.py)
    hidden_state: HiddenState | None = None  # asked for by `hidden_state: true` (or a policy's learned head)
    policy: dict[str, Any] | None = None
    confidence: float | None = None
    generated_text: str | None = None
    usage: dict[str, Any] | None = None

    def public(self) -> dict[str, Any]:
        """The JSON body: fields that apply to this result only."""
        return self.model_dump(exclude_none=True)


def errors_from(exc: ValidationError | RequestError, prefix: Sequence[str | int] = ()) -> list[FieldError]:
    """FastAPI-shaped error list: [{"loc": [...], "msg": ..., "type": ...}]."""
    if isinstance(exc, RequestError):
        return [{"loc": [*prefix, *exc.loc], "msg": exc.msg, "type": exc.type}]
    out: list[FieldError] = []
    for e in exc.errors(include_url=False):
        ctx_err = (e.get("ctx") or {}).get("error")
        if isinstance(ctx_err, RequestError):  # raised inside a model validator: keep its own loc
            out.append({"loc": [*prefix, *e["loc"], *ctx_err.loc], "msg": ctx_err.msg, "type": ctx_err.type})
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = f"unknown field {e['loc'][-1]!r}: remove it (allowed fields are documented in docs/adapter-api.md)"
        elif e["type"] == "missing":
            msg = f"field required: add {e['loc'][-1]!r}"
        elif e["loc"] and e["loc"][-1] == "options" and e["type"] in ("too_short", "too_long"):
            msg = f"{msg}: send between 2 and {MAX_OPTIONS} options (letters A..Z)"
        out.append({"loc": [*prefix, *e["loc"]], "msg": msg, "type": e["type"]})
    return out


def state_text(state: State) -> str:
    """The state as the model sees it: text verbatim, objects/arrays as indented JSON."""
    if isinstance(state, str):
        return state.strip()
    return json.dumps(state, ensure_ascii=False, indent=2)


def finite(x: float) -> float:
    """JSON has no NaN/Infinity: clamp so every number we send is finite."""
    if math.isnan(x):
        raise ValueError("NaN in a decision result")
    if math.isinf(x):
        return math.copysign(1e30, x)
    return x

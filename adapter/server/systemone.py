"""`/v1/systemone` (TypeSafe's decision API, also served by Kev, laya-serve, jev-compatible-server)
translated to decision rows and back.

- `noul`   -> options true/false (criteria texts as descriptions) -> {"noul": P(true)}
- `choice` -> one option per criteria key, in order (a null description is read by its name);
              2..255 options: up to 26 any readout; more than 26 always use `option-words` (labels
              are the names, told apart token by token) - never truncated
              -> {"choice", "probabilities" by name, "confidence" = (p_max - 1/n) / (1 - 1/n)}
- `score`  -> levels "0".."n-1" (2..10) -> {"score": sum i*p_i, "legend", "probabilities",
              "confidence" = max(0, 1 - sum p_i |i - mode| / MAD_unif)}

Question ids are the caller's and never shown to the model; the answers come back keyed the same.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adapter.ids import collision, collision_message, id_problem
from adapter.schema import MAX_OPTIONS, DecisionRequest, DecisionResult, JSONObject, Option, RequestError, State, _check_state, finite, state_text

MAX_CHOICES = 255
NOUL_QUESTION = "Is the following true for this state? Answer true or false."


Text = Union[str, dict[str, Any], list[Any]]  # structured text: shown to the model like a state


def text_of(value: Text | None, *, one_line: bool = False) -> str:
    """Instructions and criteria may be strings, objects or arrays: strings verbatim, the others as
    JSON (indented like a state; on one line where it becomes an option's description)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    return json.dumps(value, ensure_ascii=False) if one_line else state_text(value)


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid")
    instructions: Text | None = None

    @field_validator("instructions")
    @classmethod
    def _instructions_size(cls, v: Any) -> Any:
        if v is not None and len(text_of(v)) > 8000:
            raise ValueError("instructions are longer than 8000 characters")
        return v


class NoulQuestion(_Base):
    type: Literal["noul"]
    criteria: dict[Literal["true", "false"], Text | None] | None = None


class ChoiceQuestion(_Base):
    type: Literal["choice"]
    criteria: dict[str, Text | None] = Field(min_length=2, max_length=MAX_CHOICES)



class ScoreQuestion(_Base):
    type: Literal["score"]
    criteria: list[Text] = Field(min_length=2, max_length=10,
                                 description="ordered level descriptions, level 0 first (a list, not a map)")


SystemOneQuestion = Annotated[Union[NoulQuestion, ChoiceQuestion, ScoreQuestion], Field(discriminator="type")]


class SystemOneRequest(BaseModel):
    """Unknown top-level fields are ignored (clients send e.g. `seed`), as TypeSafe's API does;
    inside a question they are errors, so a misspelt `criteria` is not silently dropped."""

    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    state: State
    questions: dict[str, SystemOneQuestion] = Field(min_length=1, max_length=256)
    assets: Any = None

    @field_validator("state")
    @classmethod
    def _state(cls, v: Any) -> Any:
        return _check_state(v)

    @field_validator("assets")
    @classmethod
    def _no_assets(cls, v: Any) -> Any:
        if v:
            raise ValueError("images need a vision-language model; this adapter serves a text model: "
                             "send the content as text in state")
        return None


def _question_text(q: _Base, default: str) -> str:
    return text_of(q.instructions) or default


def to_rows(req: SystemOneRequest) -> list[DecisionRequest]:
    """One decision row per question, in the request's order; the row id is the caller's id."""
    rows = []
    check_ids(list(req.questions), ["questions"])
    for qid, q in req.questions.items():
        if q.type == "choice":  # the names are ids the caller gets back: the id rule, each at its own loc
            check_ids(list(q.criteria), ["questions", qid, "criteria"])
        if q.type == "noul":
            crit = q.criteria or {}
            options = [Option(id="true", description=text_of(crit.get("true"), one_line=True) or "yes"),
                       Option(id="false", description=text_of(crit.get("false"), one_line=True) or "no")]
            text = _question_text(q, NOUL_QUESTION)
            readout = None
        elif q.type == "choice":
            options = [Option(id=name, description=text_of(desc, one_line=True)) for name, desc in q.criteria.items()]
            text = _question_text(q, "Which of the options fits this state best?")
            readout = "option-words" if len(options) > MAX_OPTIONS else None
        else:
            options = [Option(id=str(i), description=text_of(desc, one_line=True)) for i, desc in enumerate(q.criteria)]
            text = _question_text(q, "Which level fits this state?")
            readout = None
        fields: dict[str, Any] = dict(id=qid, state=req.state, question=text, options=options, readout=readout)
        rows.append(DecisionRequest.model_construct(None, **fields, permute=False, debias=None, examples=[],
                                                    few_shot=None, guard=None, policy_id=None)
                    if len(options) > MAX_OPTIONS else DecisionRequest(**fields))
    return rows


def check_ids(keys: list[str], loc: list[str | int]) -> None:
    """The id rule (adapter/ids.py) on the keys of one map - question ids, a choice's names - each
    error at the key's own loc, before any of them becomes a decision row."""
    for key in keys:
        problem = id_problem(key)
        if problem:
            raise RequestError([*loc, key], problem)
    clash = collision(keys)
    if clash is not None:
        raise RequestError([*loc, keys[clash[1]]], collision_message(keys[clash[0]], keys[clash[1]]))


def choice_confidence(probs: list[float]) -> float:
    n = len(probs)
    return finite(max(0.0, (max(probs) - 1 / n) / (1 - 1 / n)))


def score_confidence(probs: list[float]) -> float:
    n = len(probs)
    mode = max(range(n), key=probs.__getitem__)
    mad_unif = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    spread = sum(p * abs(i - mode) for i, p in enumerate(probs))
    return finite(max(0.0, 1 - spread / mad_unif))


def to_answer(q: SystemOneQuestion, result: DecisionResult) -> JSONObject:
    """One question's answer as the response body carries it (JSON)."""
    ids, probs = result.option_ids, [float(p) for p in result.probabilities]
    extra = {"x_label_mass": result.label_mass, "x_readout": result.readout, "x_prompt_sha256": result.prompt_sha256}
    if q.type == "noul":
        return {"type": "noul", "noul": finite(probs[ids.index("true")]), **extra}
    if q.type == "choice":
        return {"type": "choice", "choice": ids[max(range(len(ids)), key=probs.__getitem__)],
                "probabilities": dict(zip(ids, probs)), "confidence": choice_confidence(probs), **extra}
    return {"type": "score", "score": finite(sum(i * p for i, p in enumerate(probs))),
            "legend": {str(i): d for i, d in enumerate(q.criteria)},  # as the caller sent them
            "probabilities": {str(i): p for i, p in enumerate(probs)}, "confidence": score_confidence(probs), **extra}


def respond(req: SystemOneRequest, results: list[DecisionResult], model_name: str) -> JSONObject:
    """The /v1/systemone response body (JSON)."""
    answers = {qid: to_answer(q, r) for (qid, q), r in zip(req.questions.items(), results)}
    prompt = sum(r.input_tokens or 0 for r in results)
    evaluated = sum(r.evaluated_tokens if r.evaluated_tokens is not None else (r.input_tokens or 0) for r in results)
    return {"model": model_name, "answers": answers,
            "usage": {"input_tokens": prompt, "output_tokens": 0},
            # the shared state is prefilled once: tokens really evaluated vs taken from the cache
            "x_usage": {"evaluated_tokens": evaluated, "cached_tokens": prompt - evaluated}}

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

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .schema import DecisionRequest, MAX_OPTIONS, Option, State, _check_state, finite

MAX_CHOICES = 255
NOUL_QUESTION = "Is the following true for this state? Answer true or false."


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid")
    instructions: str | None = Field(default=None, max_length=8000)


class NoulQuestion(_Base):
    type: Literal["noul"]
    criteria: dict[Literal["true", "false"], str | None] | None = None


class ChoiceQuestion(_Base):
    type: Literal["choice"]
    criteria: dict[str, str | None] = Field(min_length=2, max_length=MAX_CHOICES)

    @field_validator("criteria")
    @classmethod
    def _names(cls, v: dict) -> dict:
        for name in v:
            if not name.strip():
                raise ValueError("choice names must be non-empty")
        return v


class ScoreQuestion(_Base):
    type: Literal["score"]
    criteria: list[str] = Field(min_length=2, max_length=10,
                                description="ordered level descriptions, level 0 first (a list, not a map)")


SystemOneQuestion = Annotated[Union[NoulQuestion, ChoiceQuestion, ScoreQuestion], Field(discriminator="type")]


class SystemOneRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    state: State
    questions: dict[str, SystemOneQuestion] = Field(min_length=1, max_length=256)

    @model_validator(mode="before")
    @classmethod
    def _drop_extensions(cls, data: Any) -> Any:
        if isinstance(data, dict):  # x_-prefixed fields are extensions: accepted and ignored
            return {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("x_"))}
        return data

    @field_validator("state")
    @classmethod
    def _state(cls, v: Any) -> Any:
        return _check_state(v)


def _question_text(q, default: str) -> str:
    return (q.instructions or "").strip() or default


def to_rows(req: SystemOneRequest) -> list[DecisionRequest]:
    """One decision row per question, in the request's order; the row id is the caller's id."""
    rows = []
    for qid, q in req.questions.items():
        if q.type == "noul":
            crit = q.criteria or {}
            options = [Option(id="true", description=crit.get("true") or "yes"),
                       Option(id="false", description=crit.get("false") or "no")]
            text = _question_text(q, NOUL_QUESTION)
            readout = None
        elif q.type == "choice":
            options = [Option(id=name, description=desc or "") for name, desc in q.criteria.items()]
            text = _question_text(q, "Which of the options fits this state best?")
            readout = "option-words" if len(options) > MAX_OPTIONS else None
        else:
            options = [Option(id=str(i), description=desc) for i, desc in enumerate(q.criteria)]
            text = _question_text(q, "Which level fits this state?")
            readout = None
        fields = dict(id=qid, state=req.state, question=text, options=options, readout=readout)
        rows.append(DecisionRequest.model_construct(**fields, permute=False, debias=None, examples=[], policy_id=None)
                    if len(options) > MAX_OPTIONS else DecisionRequest(**fields))
    return rows


def choice_confidence(probs: list[float]) -> float:
    n = len(probs)
    return finite(max(0.0, (max(probs) - 1 / n) / (1 - 1 / n)))


def score_confidence(probs: list[float]) -> float:
    n = len(probs)
    mode = max(range(n), key=probs.__getitem__)
    mad_unif = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    spread = sum(p * abs(i - mode) for i, p in enumerate(probs))
    return finite(max(0.0, 1 - spread / mad_unif))


def to_answer(q, result: dict) -> dict:
    ids, probs = result["option_ids"], [float(p) for p in result["probabilities"]]
    extra = {"x_label_mass": result.get("label_mass"), "x_readout": result.get("readout"),
             "x_prompt_sha256": result.get("prompt_sha256")}
    if q.type == "noul":
        return {"type": "noul", "noul": finite(probs[ids.index("true")]), **extra}
    if q.type == "choice":
        return {"type": "choice", "choice": ids[max(range(len(ids)), key=probs.__getitem__)],
                "probabilities": dict(zip(ids, probs)), "confidence": choice_confidence(probs), **extra}
    return {"type": "score", "score": finite(sum(i * p for i, p in enumerate(probs))),
            "legend": {str(i): d for i, d in enumerate(q.criteria)},
            "probabilities": {str(i): p for i, p in enumerate(probs)}, "confidence": score_confidence(probs), **extra}


def respond(req: SystemOneRequest, results: list[dict], model_name: str) -> dict:
    answers = {qid: to_answer(q, r) for (qid, q), r in zip(req.questions.items(), results)}
    prompt = sum(int(r.get("input_tokens", 0)) for r in results)
    evaluated = sum(int(r.get("evaluated_tokens", r.get("input_tokens", 0))) for r in results)
    return {"model": model_name, "answers": answers,
            "usage": {"input_tokens": prompt, "output_tokens": 0},
            # the shared state is prefilled once: tokens really evaluated vs taken from the cache
            "x_usage": {"evaluated_tokens": evaluated, "cached_tokens": prompt - evaluated}}

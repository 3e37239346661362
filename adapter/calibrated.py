"""A calibrated policy config: load, validate, apply (temperature -> gate -> fallback).

Exported by the workbench's Calibrate page / `python -m app calibrate`; enforced by the adapter
(`SM_SEMIF_POLICY`, a policy*.json next to the GGUF in /opt/ml/model, or per request by id).
`apply(result)` is the one implementation of the decision rule: the workbench computes its
numbers through it too, so the page and the runtime cannot disagree.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .guard import STEERING_SUSPECTED, Guard
from .head import HEAD_NAMES, Head
from .head import uses_hidden
from .prompt import PROMPT_VERSIONS
from .schema import (HEAD_LAYOUT, Debias, DecisionResult, Example, HiddenState, Layout, Option, Readout, RequestError,
                     errors_from)

SCHEMA_VERSION = "semif-policy/1"


def calibrate_probs(probs: list[float], temperature: float, offsets: list[float] | None = None) -> list[float]:
    """softmax(log p / T + b): temperature scaling on probabilities (equal to scaling the logits),
    plus one fitted offset per option, which - unlike a temperature - can move the argmax (a
    policy whose ranking is right but whose threshold is wrong)."""
    logs = [math.log(max(p, 1e-300)) / temperature + (offsets[i] if offsets else 0.0) for i, p in enumerate(probs)]
    m = max(logs)
    exps = [math.exp(x - m) for x in logs]
    s = sum(exps)
    return [e / s for e in exps]


class ModelIdentity(BaseModel):
    file: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class CalibratedPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: str = Field(SCHEMA_VERSION, pattern=r"^semif-policy/1$")
    policy_id: str = Field(min_length=1)
    policy_version: int | None = Field(default=None, description="the saved version of the workbench policy this "
                                       "gate was measured on (its question, options and examples)")
    name: str = ""
    question: str = Field(min_length=1)
    options: list[Option] = Field(min_length=2, max_length=26)
    examples: list[Example] = Field(default_factory=list)
    readout: Readout
    debias: Debias = "none"
    permute: bool = False
    few_shot: bool | None = None
    guard: Guard = Field("none", description="steering guard run on the rows the gate would decide; a suspected "
                         "row goes to the fallback (reason steering_suspected)")
    layout: Layout = Field("state-first", description="policy-first: the head layout (the policy cached, each row "
                           "reads its state and a short tail); only with a hidden-state head")
    prompt_version: str
    model: ModelIdentity
    temperature: float = Field(gt=0, le=100)
    option_offsets: dict[str, float] = Field(default_factory=dict, description="fitted per-option offsets added to "
                                             "log p / T (the label-fitted correction); missing options get 0")
    threshold: float | None = Field(default=None, ge=0, le=1, description="global confidence gate")
    gate_source: Literal["recommended", "hand-set", "unreachable"] | None = Field(
        default=None, description="how the gate was chosen: from target_accuracy, by hand, or 1.0 because unreachable")
    head: Head | None = Field(default=None, description="a learned head (adapter/head.py): when set, the calibrated "
                              "probabilities are the head's, and every row is scored with its hidden state")
    option_thresholds: dict[str, float] = Field(default_factory=dict)
    fallback_option: str = Field(min_length=1)
    target_accuracy: float | None = Field(default=None, gt=0, le=1)
    metrics: dict[str, Any] = Field(default_factory=dict)
    dataset: dict[str, Any] = Field(default_factory=dict)
    run_id: int | None = None
    created_at: str

    @model_validator(mode="after")
    def _consistent(self) -> "CalibratedPolicy":
        ids = [o.id for o in self.options]
        for oid in self.option_thresholds:
            if oid not in ids:
                raise ValueError(f"option_thresholds: {oid!r} is not an option id")
        for oid, t in self.option_thresholds.items():
            if not 0 <= t <= 1:
                raise ValueError(f"option_thresholds.{oid}: {t} is not in [0, 1]")
        for oid, b in self.option_offsets.items():
            if oid not in ids:
                raise ValueError(f"option_offsets: {oid!r} is not an option id")
            if not math.isfinite(b) or abs(b) > 50:
                raise ValueError(f"option_offsets.{oid}: {b} is not a finite offset within ±50")
        if self.head is not None:
            head = self.head
            if head.option_ids != ids:
                raise ValueError(f"head.option_ids: a head for {len(head.option_ids)} options "
                                 f"({', '.join(head.option_ids)}) on a {len(ids)}-option policy ({', '.join(ids)}): "
                                 "calibrate this policy again")
            if head.model_sha256 != self.model.sha256:
                raise ValueError(f"head.model_sha256: the head was fitted on another model ({head.model_sha256[:12]}) "
                                 f"than this policy's {self.model.file} ({self.model.sha256[:12]}): calibrate again on it")
            if head.prompt_version != self.prompt_version:
                raise ValueError(f"head.prompt_version: the head was fitted on prompt {head.prompt_version}, this policy "
                                 f"reads {self.prompt_version}: calibrate again")
            if self.layout == HEAD_LAYOUT and not uses_hidden(head.kind):
                raise ValueError(f"head.kind: the policy-first layout is read by a hidden-state head, not {head.kind}")
            if self.temperature != 1 or self.option_offsets:
                raise ValueError("temperature: a policy with a head takes its probabilities from the head, so its "
                                 "temperature is 1 and it has no option_offsets")
        if self.layout == HEAD_LAYOUT:
            if self.head is None:
                raise ValueError("layout: the policy-first layout is read only by a learned head, and this policy has "
                                 "none - calibrate it with a head, or use layout state-first")
            want = PROMPT_VERSIONS["letters-policy-first"]
            if (self.readout, self.debias, self.permute, self.prompt_version) != ("letters", "none", False, want):
                raise ValueError(f"layout: a policy-first policy reads letters with no correction and no permutation, "
                                 f"prompt {want}: export it again from Calibrate")
        return self

    def matches(self, option_ids: list[str]) -> bool:
        return option_ids == [o.id for o in self.options]

    def gate_for(self, option_id: str) -> float | None:
        return self.option_thresholds.get(option_id, self.threshold)

    def offsets(self) -> list[float] | None:
        return [self.option_offsets.get(o.id, 0.0) for o in self.options] if self.option_offsets else None

    def corrected(self, probabilities: list[float], hidden: Any = None) -> list[float]:
        """The policy's probabilities for one row: its head's (ValueError when the row lacks what
        the head reads), else temperature and offsets on the scored probabilities."""
        if self.head is not None:
            return self.head.probabilities(hidden, probabilities)
        return calibrate_probs(list(probabilities), self.temperature, self.offsets())

    def apply(self, option_ids: list[str], probabilities: list[float], model_sha256: str | None = None,
              model_file: str | None = None, guard: dict | None = None, *, hidden: Any = None,
              prompt_version: str | None = None, hidden_model: str | None = None) -> dict:
        """{option_id, calibrated_probabilities, confidence, gated, reason} for one raw result; a row
        the steering guard suspected goes to the fallback whatever its confidence. A policy with a
        head reads the row's hidden state (`hidden`, a vector, from the model `hidden_model`); a row it
        cannot read - no hidden state, one of another model, another prompt version than the head's -
        goes to the fallback, like a row of another model."""
        ids, probs = list(option_ids), list(probabilities)
        if not self.matches(ids):
            raise ValueError(f"result options {ids} differ from the policy's {[o.id for o in self.options]}")
        if self.head is not None and prompt_version and prompt_version != self.head.prompt_version:
            return self._fallback(probs, f"prompt {prompt_version} is not the prompt the head was fitted on "
                                         f"({self.head.prompt_version})")
        if self.head is not None and model_sha256 and model_sha256 != self.model.sha256:
            return self._fallback(probs, f"model {model_file} is not the calibrated model {self.model.file}")
        if self.head is not None and hidden_model and hidden_model != self.head.model_sha256:
            return self._fallback(probs, f"the hidden state comes from another model ({model_file or hidden_model[:12]}) "
                                         f"than the head's ({self.model.file})")
        try:
            cal = self.corrected(probs, hidden)
        except ValueError as exc:
            return self._fallback(probs, f"the head cannot read this row: {exc}")
        top = max(range(len(cal)), key=cal.__getitem__)
        conf = cal[top]
        gate = self.gate_for(ids[top])
        if model_sha256 and model_sha256 != self.model.sha256:
            return {"option_id": self.fallback_option, "calibrated_probabilities": cal, "confidence": conf,
                    "gated": True, "reason": f"model {model_file} is not the calibrated model {self.model.file}"}
        if guard and guard.get("suspected"):
            return {"option_id": self.fallback_option, "calibrated_probabilities": cal, "confidence": conf,
                    "gated": True, "reason": STEERING_SUSPECTED}
        if gate is not None and conf < gate:
            return {"option_id": self.fallback_option, "calibrated_probabilities": cal, "confidence": conf,
                    "gated": True, "reason": f"confidence {conf:.3f} < gate {gate:.3f} for {ids[top]}"}
        return {"option_id": ids[top], "calibrated_probabilities": cal, "confidence": conf, "gated": False,
                "reason": "above gate" if gate is not None else "no gate set"}

    def _fallback(self, probs: list[float], reason: str) -> dict:
        """A row the head cannot read: to the fallback, the scored probabilities shown as they are."""
        return {"option_id": self.fallback_option, "calibrated_probabilities": probs, "confidence": max(probs),
                "gated": True, "reason": reason}

    @property
    def correction_name(self) -> str:
        """What turns the scored probabilities into the policy's: the head, or temperature (+ offsets)."""
        if self.head is not None:
            return HEAD_NAMES[self.head.kind]
        return "temperature + fitted offsets" if self.option_offsets else "temperature"

    def request_fields(self) -> dict:
        """What a decision row needs from this policy (question, options, examples, readout, debias)."""
        return {"question": self.question, "options": [o.model_dump() for o in self.options],
                "examples": [e.model_dump() for e in self.examples], "readout": self.readout, "debias": self.debias,
                "permute": self.permute, "few_shot": self.few_shot, "guard": self.guard,
                **({"hidden_state": True} if self.head is not None else {}),
                **({"layout": self.layout} if self.layout == HEAD_LAYOUT else {})}


class PolicyError(ValueError):
    pass


def load_policy(source: str | Path | dict) -> CalibratedPolicy:
    """Load and validate a policy file (or dict); PolicyError names the bad field."""
    try:
        data = source if isinstance(source, dict) else json.loads(Path(source).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PolicyError(f"cannot read policy {source}: {exc}") from None
    try:
        return CalibratedPolicy.model_validate(data)
    except ValidationError as exc:
        first = errors_from(exc)[0]
        raise PolicyError(f"policy {'.'.join(map(str, first['loc'])) or '(root)'}: {first['msg']}") from None


def discover_policies(model_dir: Path | None, explicit: str | None) -> dict[str, CalibratedPolicy]:
    """SM_SEMIF_POLICY (files or folders, comma-separated) plus policy*.json in the model dir."""
    paths: list[Path] = []
    for part in (explicit or "").split(","):
        if part.strip():
            p = Path(part.strip())
            paths.extend(sorted(p.glob("*.json")) if p.is_dir() else [p])
    if model_dir is not None and model_dir.is_dir():
        paths.extend(sorted(model_dir.glob("policy*.json")))
    out: dict[str, CalibratedPolicy] = {}
    for p in paths:
        pol = load_policy(p)
        out[pol.policy_id] = pol
    return out


class PolicySet:
    """The policies an adapter enforces. A row names one by `policy_id` (or, when exactly one is
    loaded, simply omits question and options); the policy supplies question, options, examples
    and readout, and the result gains the calibrated probabilities and the gated decision."""

    def __init__(self, policies: dict[str, CalibratedPolicy] | None = None, model_sha256: str | None = None):
        self.policies = policies or {}
        self.model_sha256 = model_sha256

    def __len__(self) -> int:
        return len(self.policies)

    def mismatched(self) -> list[str]:
        return [p.policy_id for p in self.policies.values() if self.model_sha256 and p.model.sha256 != self.model_sha256]

    def fill(self, row: Any, loc: list) -> CalibratedPolicy | None:
        """Complete a raw row (dict) in place from its policy; raise RequestError on conflicts."""
        if not isinstance(row, dict):
            return None
        pid = row.get("policy_id")
        if pid is not None and not isinstance(pid, str):
            raise RequestError([*loc, "policy_id"], "must be a string: the id of a loaded policy")
        if pid is None:
            if len(self.policies) == 1 and "options" not in row and "question" not in row:
                pid = next(iter(self.policies))
            else:
                return None
        if pid not in self.policies:
            known = ", ".join(self.policies) or "none (set SM_SEMIF_POLICY)"
            raise RequestError([*loc, "policy_id"], f"unknown policy {pid!r}; loaded policies: {known}")
        policy = self.policies[pid]
        wanted = policy.request_fields()
        given = row.get("options")
        if "options" in row and (not isinstance(given, list) or [o.get("id") if isinstance(o, dict) else o
                                                                 for o in given] != [o["id"] for o in wanted["options"]]):
            raise RequestError([*loc, "options"], f"differ from policy {pid!r}: omit options to use the policy's")
        if policy.guard == "none" and row.get("guard") is not None:
            wanted["guard"] = row["guard"]  # a row may ask for a guard its policy does not require
        row.update(wanted)
        row["policy_id"] = pid
        return policy

    @staticmethod
    def automates(policy: CalibratedPolicy | None, result: DecisionResult) -> bool:
        """Would the policy decide this row itself (not send it to the fallback)? The steering
        guard runs only on such rows: a row the gate sends to a person needs no second look."""
        if policy is None:
            return True
        return not policy.apply(result.option_ids, result.probabilities, result.model.get("sha256"),
                                result.model.get("file"), **row_inputs(result))["gated"]

    @staticmethod
    def decorate(result: DecisionResult, policy: CalibratedPolicy, keep_hidden: bool = True) -> DecisionResult:
        """The result with the policy applied; without `keep_hidden` the hidden state the policy's
        head read is left out of the answer (the client did not ask for it)."""
        decision = policy.apply(result.option_ids, result.probabilities, result.model.get("sha256"),
                                result.model.get("file"), result.guard, **row_inputs(result))
        calibrated = decision.pop("calibrated_probabilities")
        return result.model_copy(update={
            "calibrated_probabilities": calibrated, "decision": decision, "probability_status": "calibrated",
            **({} if keep_hidden else {"hidden_state": None}),
            "policy": {"policy_id": policy.policy_id, "schema_version": policy.schema_version,
                       "temperature": policy.temperature, "threshold": policy.threshold,
                       "option_offsets": policy.option_offsets, "guard": policy.guard,
                       "fallback_option": policy.fallback_option,
                       **({"head": policy.head.kind} if policy.head is not None else {})}})


def row_inputs(result: DecisionResult | dict) -> dict[str, Any]:
    """What a head reads from a result besides its probabilities: {hidden, prompt_version,
    hidden_model}, from a DecisionResult or its JSON (a stored response)."""
    if isinstance(result, DecisionResult):
        hidden, version, model = result.hidden_state, result.prompt_version, result.model
    else:
        raw = result.get("hidden_state")
        hidden, version = (HiddenState.model_validate(raw) if isinstance(raw, dict) else None), result.get("prompt_version")
        model = result["model"] if isinstance(result.get("model"), dict) else {}
    return {"hidden": hidden.array() if hidden is not None else None, "prompt_version": version,
            "hidden_model": (model or {}).get("sha256")}

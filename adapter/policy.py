"""The calibrated policy contract: a policy file's schema (semif-policy/1), loading, validation and
discovery, and its rule (temperature -> gate -> fallback) applied to one scored row.

Exported by the workbench's Calibrate page / `python -m app calibrate`; enforced by the adapter
(`SM_SEMIF_POLICY`, a policy*.json next to the GGUF in /opt/ml/model, or per request by id: the
per-request side, PolicySet and Decisions, is adapter/server/calibrated.py).
`apply(row)` is the one implementation of the decision rule: the workbench computes its
numbers through it too, so the page and the runtime cannot disagree. Loads no web framework.
"""
from __future__ import annotations

import hashlib
import json
import math
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ModelWrapValidatorHandler, PrivateAttr, SerializerFunctionWrapHandler,
                      ValidationError, field_validator, model_serializer, model_validator)

from adapter.engine.prompt import PROMPT_VERSIONS
from adapter.guard import STEERING_SUSPECTED, Guard
from adapter.head import KIND_WORDS, Head, uses_hidden
from adapter.json_text import SURROGATE_MSG, lone_surrogate, nesting, parse_json
from adapter.ids import id_problem
from adapter.safe_path import NAME_RULE, name_problem
from adapter.schema import (HEAD_LAYOUT, Debias, DecisionResult, Example, JSONObject, Layout, Option, Question,
                            Readout, RequestError, errors_from)

SCHEMA_VERSION = "semif-policy/1"
# The prompts the engine renders, by (readout, layout): a policy's prompt_version must be one of its pair's
KNOWN_PROMPTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("letters", "state-first"): (PROMPT_VERSIONS["letters"], PROMPT_VERSIONS["letters-examples"]),
    ("letters", "policy-first"): (PROMPT_VERSIONS["letters-policy-first"],),
    ("option-words", "state-first"): (PROMPT_VERSIONS["option-words"], PROMPT_VERSIONS["option-words-state-first"]),
}

# The fields a calibrated policy pins: everything it was calibrated with. A row that names the policy may
# omit each or repeat it exactly; any other value is a 422 naming the field and the policy. This table drives
# PolicySet.fill (adapter/server/calibrated.py), the table in docs/adapter-api.md#pinned-fields and tests/test_security_round4.py.
PINNED: dict[str, str] = {
    "question": "the question text (surrounding whitespace ignored, as every row's)",
    "options": "the option ids in the policy's order; a description, when sent, must be the policy's",
    "examples": "the solved examples, exactly",
    "readout": "letters or option-words",
    "debias": "the correction the gate was measured on",
    "permute": "permutation averaging on or off",
    "few_shot": "whether the examples are shown in the prompt",
    "layout": "state-first or policy-first (the head layout): a state-first policy's gate means nothing on "
              "head-layout letters",
    "prompt_version": "the prompt the policy was calibrated on (set by readout, layout and examples); a row may "
                      "send it only equal, and it is then dropped",
    "guard": "the steering guard; a row may add one to a policy that has none, never change or remove the policy's",
}



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


Real = int | float  # a figure as computed: an int stays an int in the file (a float field would write 3 as 3.0)


class Figures(BaseModel):
    """A group of figures in a policy file's `metrics`: typed where the workbench reads them, every other key
    kept as written (older and newer exports carry others), and written back with exactly the keys it was
    given, in the order it was built - so a policy file's JSON is the same before and after it is read.
    The adapter never reads them: they say how the gate was chosen."""
    model_config = ConfigDict(extra="allow")
    _order: list[str] = PrivateAttr(default_factory=list)  # the keys as given

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        made = handler(data)
        if isinstance(data, dict) and isinstance(made, Figures):
            made._order = list(data)
        return made

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> JSONObject:
        data: JSONObject = handler(self)
        given = self.model_fields_set | set(self.model_extra or {})
        keys = [k for k in self._order if k in data and k in given] + [k for k in data if k in given and k not in self._order]
        return {k: data[k] for k in keys}


class ProportionFigures(Figures):
    """A count out of n with its Wilson 95% interval (app/core/stats.Proportion.to_dict)."""
    k: int = 0
    n: int = 0
    rate: Real | None = None
    low: Real | None = None
    high: Real | None = None
    small_n: bool = False


class AtGate(Figures):
    """A gate's numbers on a calibration's rows: coverage and the accuracy of what it decides, each with
    its interval; `small_n` when fewer than 30 rows are decided; `in_sample` when a hand-set gate was set
    by looking at these rows."""
    n: int = 0
    decided: int = 0
    gated: int = 0
    coverage: Real | None = None
    accuracy: Real | None = None
    correct: int = 0
    accuracy_interval: ProportionFigures = Field(default_factory=ProportionFigures)
    coverage_interval: ProportionFigures = Field(default_factory=ProportionFigures)
    small_n: bool = False
    in_sample: bool = False


class Intervals(Figures):
    """95% intervals of a run's headline numbers: Wilson for accuracy, bootstrap for macro-F1 and ECE."""
    n: int = 0
    accuracy: ProportionFigures = Field(default_factory=ProportionFigures)
    macro_f1: list[Real] | None = None
    ece: list[Real] | None = None
    ece_corrected: list[Real] | None = None


class GateSelection(Figures):
    """How the recommended gate was chosen (app/core/calibration.Gate): on out-of-fold predictions, the lowest
    confidence whose decided rows' one-sided lower Clopper-Pearson bound meets the target; unreachable, `reach`
    says how many more labeled rows at the accuracy measured would make it reachable. (Exports made before
    issue 44 carry fit_/holdout_ keys instead: kept as written.)"""
    threshold: Real | None = None
    reachable: bool = False
    n: int = 0
    decided: int = 0
    correct: int = 0
    accuracy: Real | None = None
    coverage: Real | None = None
    lower_bound: Real | None = None
    target: Real | None = None
    confidence: Real | None = None
    bound: str = ""
    reach: dict[str, Real] | None = None
    note: str = ""


class CorrectionCandidate(Figures):
    """One correction compared out of fold (app/core/calibration.Correction)."""
    name: str = ""
    family: str = ""
    method: str = ""
    temperature: Real | None = None
    offsets: list[Real] = Field(default_factory=list)
    oof_accuracy: Real | None = None
    oof_nll: Real | None = None
    oof_ece: Real | None = None
    available: bool = True
    note: str = ""


class CorrectionFigures(Figures):
    chosen: str = ""
    why: str = ""
    candidates: list[CorrectionCandidate] = Field(default_factory=list)


class HeadCandidate(Figures):
    """One learned head compared out of fold (app/core/heads.HeadFit.to_dict)."""
    name: str = ""
    kind: str = ""
    available: bool = False
    note: str = ""
    oof_accuracy: Real | None = None
    oof_nll: Real | None = None
    oof_ece: Real | None = None
    oof_macro_f1: Real | None = None
    fold_regularisation: list[Real] = Field(default_factory=list)
    folds: int = 0


class HeadGain(Figures):
    """The head against the best correction on the same rows (app/core/stats.PairedGain)."""
    n: int = 0
    gain: Real | None = None
    ci: list[Real] | None = None
    fixed: int = 0
    broken: int = 0
    p: Real | None = None


class HeadFigures(Figures):
    why: str = ""
    candidates: list[HeadCandidate] = Field(default_factory=list)
    gain: HeadGain | None = None


class PolicyMetrics(Figures):
    """What a calibration measured, exported with its policy: the gate's numbers (out of fold for a head;
    with a head also on its fitted rows; beside a hand-set gate, out of fold too), the intervals, how the gate,
    the correction and the head were chosen, and the run's calibration report (app/core/calibration.Report)."""
    at_gate: AtGate | None = None
    at_gate_fitted_rows: AtGate | None = None
    intervals: Intervals | None = None
    gate_selection: GateSelection | None = None
    correction: CorrectionFigures | None = None
    head: HeadFigures | None = None
    n: int = 0
    k: int = 0
    size_flag: str = ""
    accuracy: Real | None = None
    macro_f1: Real | None = None
    brier: Real | None = None
    nll: Real | None = None
    ece_width: Real | None = None
    ece_mass: Real | None = None
    temperature: Real | None = None
    fold_temperatures: list[Real] = Field(default_factory=list)
    oof_accuracy: Real | None = None
    oof_brier: Real | None = None
    oof_nll: Real | None = None
    oof_ece_width: Real | None = None
    oof_ece_mass: Real | None = None
    confusion: list[list[int]] = Field(default_factory=list)
    oof_confusion: list[list[int]] = Field(default_factory=list)
    method: str = ""
    offsets: list[Real] = Field(default_factory=list)
    at_gate_out_of_fold: AtGate | None = None
    gate_notes: list[str] = Field(default_factory=list)  # what Calibrate said of the gate, first the gate's evidence

    @classmethod
    def stored(cls, raw: object) -> PolicyMetrics:
        """A saved or exported policy's `metrics` as stored (a JSON object), read back typed; empty when there
        are none, or they are not a policy's metrics (a record saved before they were recorded)."""
        if not isinstance(raw, dict):
            return cls()
        try:
            return cls.model_validate(raw)
        except ValidationError:
            return cls()


class CalibratedPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
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
        default=None, description="how the gate was chosen: from target_accuracy, by hand, or unreachable - then no row is "
        "decided (every case to the fallback, saturated probabilities included), except an option with its own gate")
    head: Head | None = Field(default=None, description="a learned head (adapter/head.py): when set, the calibrated "
                              "probabilities are the head's, and every row is scored with its hidden state")
    option_thresholds: dict[str, float] = Field(default_factory=dict)
    fallback_option: str = Field(min_length=1)
    target_accuracy: float | None = Field(default=None, gt=0, le=1)
    metrics: PolicyMetrics = Field(default_factory=PolicyMetrics)
    dataset: dict[str, Any] = Field(default_factory=dict)
    run_id: int | None = None
    created_at: str

    @field_validator("policy_id")
    @classmethod
    def _safe_id(cls, v: str) -> str:
        if name_problem(v):  # it names files (Deploy's policy copy, the packager's): the safe-path rule
            raise ValueError(f"{v[:80]!r} is not a policy id: use {NAME_RULE}")
        return v

    @field_validator("fallback_option")
    @classmethod
    def _fallback_id(cls, v: str) -> str:
        # returned as the decision of every gated row: held to the id rule (no U+202E, no newline, <= 200 chars)
        problem = id_problem(v)
        if problem:
            raise ValueError(f"{v[:80]!r} is not an option id: it {problem}" if not problem.startswith(repr(v))
                             else problem)
        return v

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
        self._serveable()  # last: the policy's own rules above name the fix for a policy file more exactly
        return self

    def _serveable(self) -> None:
        """The request validator's rules on the rows this policy will make (one validator for the file and
        its requests): the question's (blank, option ids that collide once normalised, examples naming no
        option, the head layout's settings) through schema.Question itself, and a known prompt for its
        readout and layout. A policy the endpoint would refuse on every row is refused on load."""
        allowed = KNOWN_PROMPTS.get((self.readout, self.layout), ())
        if self.prompt_version not in allowed:
            raise ValueError(f"prompt_version: {self.prompt_version[:60]!r} is not a prompt this adapter renders for "
                             f"readout {self.readout} in layout {self.layout} (it renders {', '.join(allowed) or 'none'}): "
                             "export the policy again from Calibrate")
        row = {"id": "policy", **self.request_fields(), "policy_id": None}
        try:
            Question.model_validate(row)
        except (ValidationError, RequestError) as exc:
            first = errors_from(exc)[0]
            where = ".".join(map(str, first["loc"])) or "(root)"
            raise ValueError(f"{where}: {first['msg']} - the endpoint would refuse every row of this policy") from None

    def matches(self, option_ids: list[str]) -> bool:
        return option_ids == [o.id for o in self.options]

    def gate_for(self, option_id: str) -> float | None:
        return self.option_thresholds.get(option_id, self.threshold)

    def decides_nothing_for(self, option_id: str) -> bool:
        """The strict rule of a gate that decides nothing: a policy exported with `gate_source: unreachable`
        sends every row whose top option has no gate of its own to the fallback, whatever its confidence -
        a probability saturated to exactly 1.0 included (its threshold 1.0 is never compared)."""
        return self.gate_source == "unreachable" and option_id not in self.option_thresholds

    def offsets(self) -> list[float] | None:
        return [self.option_offsets.get(o.id, 0.0) for o in self.options] if self.option_offsets else None

    def corrected(self, probabilities: list[float], hidden: Any = None) -> list[float]:
        """The policy's probabilities for one row: its head's (ValueError when the row lacks what
        the head reads), else temperature and offsets on the scored probabilities."""
        if self.head is not None:
            return self.head.probabilities(hidden, probabilities)
        return calibrate_probs(list(probabilities), self.temperature, self.offsets())

    def apply(self, row: RowReading) -> Decision:
        """The policy's decision on one scored row. A row the steering guard suspected goes to the
        fallback whatever its confidence. A policy with a head reads the row's hidden state; a row it
        cannot read - no hidden state, one of another model, another prompt version than the head's -
        goes to the fallback with the scored probabilities as they are, like a row of another model."""
        ids, probs = list(row.option_ids), list(row.probabilities)
        if not self.matches(ids):
            raise ValueError(f"result options {ids} differ from the policy's {[o.id for o in self.options]}")
        other_model = (f"model {row.model_file} is not the calibrated model {self.model.file}"
                       if row.model_sha256 and row.model_sha256 != self.model.sha256 else None)
        if self.head is not None:
            unreadable = self._unreadable(row, other_model)
            if unreadable:
                return Decision(self.fallback_option, tuple(probs), max(probs), True, unreadable, final=True)
        try:
            cal = self.corrected(probs, row.hidden)
        except ValueError as exc:
            return Decision(self.fallback_option, tuple(probs), max(probs), True, f"the head cannot read this row: {exc}",
                            final=True)
        top = max(range(len(cal)), key=cal.__getitem__)
        conf, gate = cal[top], self.gate_for(ids[top])
        if other_model:
            return Decision(self.fallback_option, tuple(cal), conf, True, other_model, final=True)
        if self.decides_nothing_for(ids[top]):
            decided = Decision(self.fallback_option, tuple(cal), conf, True,
                               f"no gate reached the target accuracy: every {ids[top]} decision goes to the fallback")
        elif gate is not None and conf < gate:
            decided = Decision(self.fallback_option, tuple(cal), conf, True,
                               f"confidence {conf:.3f} < gate {gate:.3f} for {ids[top]}")
        else:
            decided = Decision(ids[top], tuple(cal), conf, False, "above gate" if gate is not None else "no gate set")
        return decided.under_guard(row.steering_suspected, self.fallback_option)

    def _unreadable(self, row: RowReading, other_model: str | None) -> str | None:
        """Why the policy's head cannot read this row (another prompt, model or hidden-state model), or None."""
        assert self.head is not None
        if row.prompt_version and row.prompt_version != self.head.prompt_version:
            return f"prompt {row.prompt_version} is not the prompt the head was fitted on ({self.head.prompt_version})"
        if other_model:
            return other_model
        if row.hidden_model and row.hidden_model != self.head.model_sha256:
            return (f"the hidden state comes from another model ({row.model_file or row.hidden_model[:12]}) "
                    f"than the head's ({self.model.file})")
        return None

    @property
    def correction_name(self) -> str:
        """What turns the scored probabilities into the policy's: the head, or temperature (+ offsets)."""
        if self.head is not None:
            return KIND_WORDS[self.head.kind].name
        return "temperature + fitted offsets" if self.option_offsets else "temperature"

    def request_fields(self) -> JSONObject:
        """What a decision row needs from this policy (question, options, examples, readout, debias), as
        the JSON fields of a raw row (PolicySet.fill completes a request body's row with them)."""
        return {"question": self.question, "options": [o.model_dump() for o in self.options],
                "examples": [e.model_dump() for e in self.examples], "readout": self.readout, "debias": self.debias,
                "permute": self.permute, "few_shot": self.few_shot, "guard": self.guard, "layout": self.layout,
                **({"hidden_state": True} if self.head is not None else {})}


class PolicyError(ValueError):
    pass


MAX_POLICY_BYTES = 8 << 20  # the largest head (26 options x 65,562 features, float16) is ~4.6 MB of base64
MAX_POLICY_DEPTH = 32  # a policy file nests 5 levels; deeper is not a policy (and must not reach a recursion limit)


def policy_json(source: str | Path | bytes, what: str = "policy") -> Any:
    """A policy file's JSON, read the one safe way (every reader of a policy file - the adapter's
    start-up, Deploy's upload and packager, `calibrate`, `check` - calls this): the size checked before
    a byte is parsed (a file by its stat, then reading at most the cap), UTF-8 required, NaN and Infinity
    refused, nesting capped without recursion, and the body text rule (no lone surrogate). PolicyError
    naming what is wrong."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        try:
            if path.is_dir():
                raise PolicyError(f"cannot read {what} {path}: it is a folder - give the policy JSON file")
            info = path.stat()
            if not stat.S_ISREG(info.st_mode):  # a FIFO would block the read (the command hangs); a device is no file
                raise PolicyError(f"cannot read {what} {path}: it is not a regular file (a FIFO, socket or device) - "
                                  "give the policy JSON file")
            size = info.st_size
            if size > MAX_POLICY_BYTES:
                raise PolicyError(_too_big(what, size))
            with path.open("rb") as f:
                data = f.read(MAX_POLICY_BYTES + 1)
        except OSError as exc:
            raise PolicyError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    else:
        data = bytes(source)
    if len(data) > MAX_POLICY_BYTES:
        raise PolicyError(_too_big(what, len(data)))
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{what} is not UTF-8 text (byte {exc.start}): export it again from Calibrate") from None
    try:
        return parse_json(data, MAX_POLICY_DEPTH)
    except RequestError as exc:  # the text rule (json_text.lone_surrogate), naming where
        raise PolicyError(f"{what} {'.'.join(map(str, exc.loc)) or '(root)'}: {exc.msg}") from None
    except ValueError as exc:
        raise PolicyError(f"{what} is not valid JSON: {exc}") from None


def _too_big(what: str, size: int) -> str:
    return (f"{what} is {size:,} bytes; a calibrated policy is at most {MAX_POLICY_BYTES:,} (its largest head is "
            "~4.6 MB): this is not a policy exported by Calibrate")


def _plain(data: JSONObject, what: str) -> None:
    """A policy given as a value (from the store): the same depth, number and text rules as a file."""
    if nesting(data, MAX_POLICY_DEPTH) > MAX_POLICY_DEPTH:
        raise PolicyError(f"{what} is nested more than {MAX_POLICY_DEPTH} levels deep: not a calibrated policy")
    bad = lone_surrogate(data)
    if bad is not None:
        raise PolicyError(f"{what} {'.'.join(map(str, bad))}: {SURROGATE_MSG}")
    stack: list[tuple[Any, str]] = [(v, str(k)) for k, v in data.items() if k != "head"]  # a head names its own
    while stack:
        v, where = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise PolicyError(f"{what} {where}: holds {v} - NaN and Infinity are not numbers a policy can hold")
        if isinstance(v, dict):
            stack.extend((x, f"{where}.{k}") for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{where}.{i}") for i, x in enumerate(v))


def load_policy(source: str | Path | bytes | JSONObject, *, model_sha256: str | None = None,
                model_file: str | None = None, what: str = "policy") -> CalibratedPolicy:
    """The one policy validator: read (policy_json: size, UTF-8, numbers, depth, text) and validate a
    policy file, its bytes or its dict; with `model_sha256`, also that it was calibrated on that model
    (the packager passes the model it packages). PolicyError names the bad field."""
    data = source if isinstance(source, dict) else policy_json(source, what)
    if isinstance(source, dict):
        _plain(source, what)
    try:
        policy = CalibratedPolicy.model_validate(data)
    except ValidationError as exc:
        first = errors_from(exc)[0]
        raise PolicyError(f"{what} {'.'.join(map(str, first['loc'])) or '(root)'}: {first['msg']}") from None
    if model_sha256 is not None and policy.model.sha256 != model_sha256:
        raise PolicyError(f"{what} model.sha256: it was calibrated on {policy.model.file} ({policy.model.sha256[:12]}), "
                          f"not on the model being deployed ({model_file + ', ' if model_file else ''}{model_sha256[:12]}): its gate and head mean nothing on another "
                          "model - deploy the model it was calibrated on, or calibrate again on this one")
    return policy


def policy_version(policy: CalibratedPolicy) -> str:
    """A calibrated policy has no version counter: its content hash is its version (the same file
    always gives the same one; any change - gate, temperature, offsets - gives another)."""
    canon = json.dumps(policy.model_dump(mode="json"), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


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


@dataclass(frozen=True)
class RowReading:
    """What a policy's rule reads from one scored row: the options and their scored probabilities, the
    model that scored them, the steering guard's finding, and for a head the hidden state (with its
    prompt version and model). Built from a DecisionResult here; from a stored response's JSON by the
    workbench (app/core/stored.StoredResponse.reading)."""
    option_ids: tuple[str, ...]
    probabilities: tuple[float, ...]
    model_sha256: str | None = None
    model_file: str | None = None
    steering_suspected: bool = False
    hidden: Any = None  # a vector (numpy), or None
    prompt_version: str | None = None
    hidden_model: str | None = None

    @classmethod
    def of(cls, result: DecisionResult) -> RowReading:
        model, hidden = result.model or {}, result.hidden_state
        return cls(tuple(result.option_ids), tuple(result.probabilities), model.get("sha256"), model.get("file"),
                   bool((result.guard or {}).get("suspected")), hidden.array() if hidden is not None else None,
                   result.prompt_version, model.get("sha256"))


@dataclass(frozen=True)
class Decision:
    """A policy's decision on one row: the option it decides (the fallback when gated), its
    probabilities after the correction or head, the confidence the gate read, and why."""
    option_id: str
    calibrated_probabilities: tuple[float, ...]
    confidence: float
    gated: bool
    reason: str
    final: bool = field(default=False, compare=False)  # a row of another model or one the head cannot read

    def under_guard(self, suspected: bool, fallback: str) -> Decision:
        """The decision once the steering guard has looked: a suspected row goes to the fallback, whatever
        its confidence, unless it already went there for being of another model or unreadable."""
        if not suspected or self.final:
            return self
        return replace(self, option_id=fallback, gated=True, reason=STEERING_SUSPECTED)

    def as_json(self) -> JSONObject:
        """The response's `decision` field (the calibrated probabilities travel beside it)."""
        return {"option_id": self.option_id, "confidence": self.confidence, "gated": self.gated, "reason": self.reason}

"""A calibrated policy as deployed (no Streamlit): the one typed, frozen object that carries a saved
calibrated policy's configuration from the store to every check that names it - Robustness, Compare,
the review queue, `app check`, `app bench` - so a check tests exactly what Deploy ships.

What the adapter enforces comes from the policy's JSON alone: its question, options and examples, the
readout and correction it renders rows with, its learned head (if any), its steering guard, its gate
and fallback, its model and the policy version it was measured on. A page control that differs from
one of these is a *what-if*: measured beside the as-deployed result, never reported as the policy's.

A run that tested one records it as the JSON itself plus that JSON's sha256 (`record()`), so the
report is recomputed from the run alone whatever later happens to the saved calibrated policy.

Applied to stored rows (`answer`, `HeadPick` for a policy that must carry a learned head): every
decision here is `CalibratedPolicy.apply` on a stored result - the one rule the adapter enforces - so a
number shown is the number the deployed policy gives on the same row. (The learned head itself lives in
two homes: fitted in app/core/heads.py, applied in adapter/head.py.)

A head reads rows rendered as its policy renders them (question, options, examples, readout,
correction; the hidden state of its model at that prompt's last token). A row rendered otherwise -
a reworded question, renamed or reordered options, another readout, another model - is not a row
the head was fitted on: it is not read (and said so), never decided by it.

A state the head was fitted on (a row of the run its calibration scored) is marked wherever a head's
accuracy is counted: on those the head grades itself on its own training rows, so they are left out
of its accuracy and counted apart (`HeadPick.fitted`, hashes of those states, recorded with the pick).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence, TypedDict

from adapter.policy import CalibratedPolicy, PolicyError, RowReading, load_policy
from adapter.guard import GUARDS, STEERING_SUSPECTED
from adapter.head import KIND_WORDS, Head, head_name, uses_hidden
from adapter.schema import HEAD_LAYOUT

from app.core.store import Store
from app.core.stored import NO_RESPONSE, StoredResponse
from app.targets.base import Target


def content_hash(config: Mapping[str, Any]) -> str:
    """sha256 of a policy JSON, key order aside: what a run records beside the JSON."""
    text = json.dumps(config, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def state_key(state: Any) -> str:
    """A state as a short hash (a text as it is, an object or array as sorted JSON): how a pick
    records the states its head was fitted on without copying them."""
    text = state if isinstance(state, str) else json.dumps(state, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Content(TypedDict):
    """The question, options and examples a calibrated policy renders rows with (merged into a policy)."""
    question: str
    options: list[dict[str, Any]]
    examples: list[dict[str, Any]]


class RequestSettings(TypedDict, total=False):
    """The request fields a calibrated policy renders rows with (merged into each request)."""
    readout: str
    debias: str
    permute: bool
    few_shot: bool
    layout: str
    hidden_state: bool


class Record(TypedDict):
    """What a run stores of a calibrated policy (in its config JSON): the policy JSON itself and its sha256."""
    id: int | None
    source: str
    sha256: str
    config: dict[str, Any]  # the calibrated policy's JSON, as exported
    fitted: list[str]


class Summary(TypedDict):
    """What a report names of a calibrated policy (no weights): read by key into report JSON and tables."""
    id: int | None
    source: str
    sha256: str
    label: str
    policy_id: str
    policy_version: int | None
    head: str | None
    correction: str
    head_name: str | None
    head_rows: int | None
    model_file: str
    model_sha256: str
    readout: str
    debias: str
    guard: str
    threshold: float | None
    fallback_option: str


@dataclass(frozen=True)
class AsDeployed:
    """A calibrated policy as the adapter would enforce it: its saved id (None when it came from a
    file), its JSON and that JSON's sha256, and the validated policy."""

    id: int | None
    config: dict[str, Any]  # the policy JSON, as exported
    sha256: str
    policy: CalibratedPolicy
    source: str = ""  # the file it was read from, when not a saved one
    fitted: frozenset[str] = frozenset()  # state_key of every row its head was fitted on (when its run is known)

    @property
    def label(self) -> str:
        """'calibrated #3', or 'calibrated routing.policy.json'."""
        return f"calibrated #{self.id}" if self.id is not None else f"calibrated {self.source or self.sha256[:12]}"

    @property
    def guard(self) -> str:
        return self.policy.guard

    @property
    def threshold(self) -> float | None:
        return self.policy.threshold

    @property
    def fallback(self) -> str:
        return self.policy.fallback_option

    @property
    def has_head(self) -> bool:
        return self.policy.head is not None

    @property
    def head_layout(self) -> bool:
        """Its head reads the head layout (policy first): rows scored otherwise mean nothing to it."""
        return self.policy.layout == HEAD_LAYOUT

    @property
    def needs_hidden(self) -> bool:
        """Does it read the rows' hidden states (a hidden-state or stacked head)?"""
        return self.policy.head is not None and uses_hidden(self.policy.head.kind)

    @property
    def rendering_name(self) -> str:
        """'letters + content-free': how its rows are read."""
        p = self.policy
        return " + ".join([p.readout, p.debias, *(["permutation"] if p.permute else [])])

    def fitted_on(self, state: Any) -> bool:
        """Was its head fitted on this state (then its answer on it is in-sample)?"""
        return state_key(state) in self.fitted

    def describe(self) -> str:
        """'calibrated #3 (v2): letters + content-free, temperature, guard none, gate 0.700 -> human-review,
        model smollm2.gguf': what a check that names it runs."""
        p = self.policy
        version = f" (v{p.policy_version})" if p.policy_version is not None else ""
        gate = "no gate" if p.threshold is None else f"gate {p.threshold:.3f}"
        return (f"{self.label}{version}: {self.rendering_name}, {p.correction_name}, guard {p.guard}, {gate} → "
                f"{p.fallback_option}, model {p.model.file}")

    def rendering(self) -> tuple[Content, RequestSettings]:
        """(question, options, examples; the request settings) with which the calibrated policy renders a
        row - the rows it was calibrated on, and what the adapter sends the model once it is deployed."""
        cal = self.policy
        content: Content = {"question": cal.question, "options": [o.model_dump() for o in cal.options],
                   "examples": [e.model_dump() for e in cal.examples]}
        settings: RequestSettings = {"readout": cal.readout, "debias": cal.debias, "permute": cal.permute}
        if cal.few_shot is not None:
            settings["few_shot"] = cal.few_shot
        if cal.layout == HEAD_LAYOUT:  # the head layout is always read with the row's hidden state
            settings["layout"], settings["hidden_state"] = HEAD_LAYOUT, True
        return content, settings

    def record(self) -> Record:
        """What a run stores: enough to recompute every number without the store's copy."""
        return {"id": self.id, "source": self.source, "sha256": self.sha256, "config": self.config,
                "fitted": sorted(self.fitted)}

    def summary(self) -> Summary:
        """What a report names (no weights)."""
        p = self.policy
        head = p.head
        return {"id": self.id, "source": self.source, "sha256": self.sha256, "label": self.label,
                "policy_id": p.policy_id, "policy_version": p.policy_version,
                "head": head.kind if head is not None else None, "correction": p.correction_name,
                "head_name": p.correction_name if head is not None else None,
                "head_rows": head.rows if head is not None else None, "model_file": p.model.file,
                "model_sha256": p.model.sha256, "readout": p.readout, "debias": p.debias, "guard": p.guard,
                "threshold": p.threshold, "fallback_option": p.fallback_option}


def validated(config: Mapping[str, Any], where: str) -> tuple[dict[str, Any], CalibratedPolicy]:
    """(a plain, detached copy of the JSON, the validated policy); ValueError naming the field."""
    data = json.loads(json.dumps(config))  # what is hashed is what is recorded
    try:
        return data, load_policy(data)
    except PolicyError as exc:
        raise ValueError(f"{where}: {exc}") from None


def where(id: int | None, source: str) -> str:
    return f"calibrated #{id}" if id is not None else f"calibrated policy {source}".rstrip()


def from_config(config: Mapping[str, Any], *, id: int | None = None, source: str = "",
                fitted: frozenset[str] = frozenset()) -> AsDeployed:
    """A calibrated policy as deployed; ValueError naming the field when it is not valid."""
    data, policy = validated(config, where(id, source))
    return AsDeployed(id, data, content_hash(data), policy, source, fitted)


def from_record(record: Mapping[str, Any]) -> AsDeployed:
    """As a run recorded it; ValueError when the JSON is not the one its sha256 names."""
    p = from_config(record["config"], id=record.get("id"), source=record.get("source") or "",
                    fitted=frozenset(record.get("fitted") or ()))
    if p.sha256 != record.get("sha256"):
        raise ValueError(f"{p.label}: the recorded policy JSON does not match its recorded sha256 "
                         f"({str(record.get('sha256'))[:12]}): the run's record was changed")
    return p


# -- the steering guard, as deployed and as a what-if ---------------------------------------------------
def stronger(a: str, b: str) -> str:
    """The guard that finds what both find (erase-and-check runs the precheck first): the one to ask a
    row for when an as-deployed guard and a what-if guard are measured on the same rows."""
    return max(a or "none", b or "none", key=GUARDS.index)


def flagged_under(guard_result: Mapping[str, Any] | None, guard: str | None) -> bool:
    """Would `guard` have flagged this row, given what the (possibly stronger) guard the row was asked
    for found? The precheck's finding is kept whichever guard ran; erase-and-check flags on either."""
    if not guard or guard == "none" or not isinstance(guard_result, Mapping) or not guard_result.get("suspected"):
        return False
    if guard == "precheck":
        return guard_result.get("by") == "precheck" or bool(guard_result.get("precheck"))
    return True


def guard_as(guard_result: Mapping[str, Any] | None, guard: str | None) -> dict[str, Any] | None:
    """The row's guard finding as `guard` would have reported it: None when it would not have run or
    flagged (what CalibratedPolicy.apply reads)."""
    if not flagged_under(guard_result, guard):
        return None
    return {**dict(guard_result or {}), "suspected": True, "reason": STEERING_SUSPECTED}


@dataclass(frozen=True)
class HeadPick(AsDeployed):
    """A calibrated policy that carries a learned head, as the analyst picked it (AsDeployed, whose
    head is never None)."""

    @property
    def head(self) -> Head:
        assert self.policy.head is not None  # pick() refuses a policy without one
        return self.policy.head

    @property
    def head_name(self) -> str:
        return KIND_WORDS[self.head.kind].name


def fitted_states(store: Store, config: Mapping[str, Any]) -> frozenset[str]:
    """The states a calibrated policy's head was fitted on: the rows of the run its calibration scored,
    when that run is in this store and of this policy (a file from elsewhere: unknown, empty)."""
    run_id = config.get("run_id")
    run = store.get_run(int(run_id)) if isinstance(run_id, int) else None
    return fitted_from(config, run, store.results(run["id"]) if fitted_run(config, run) and run is not None else [])


def fitted_run(config: Mapping[str, Any], run: Mapping[str, Any] | None) -> bool:
    """Whether `run` (the config's run_id, read from this store) is the run this calibrated policy was calibrated
    on: of its policy and, when the config names one, its labeled set (else another workbench's run)."""
    raw = config.get("dataset")
    dataset: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return not (run is None or run.get("policy_id") != config.get("policy_id")
                or ("set_id" in dataset and run.get("labeled_set_id") != dataset["set_id"]))


def fitted_from(config: Mapping[str, Any], run: Mapping[str, Any] | None,
                results: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """fitted_states from the run and its results already read (app/service/inputs.py reads them in one trip)."""
    if not fitted_run(config, run):
        return frozenset()
    ids = [o.get("id") for o in config.get("options") or [] if isinstance(o, dict)]
    return frozenset(state_key(r["state"]) for r in results  # the rows a head is fitted on
                     if r.get("state") is not None and not r.get("error") and r.get("probabilities")
                     and r.get("label") in ids)


def recorded(store: Store, record: Mapping[str, Any]) -> AsDeployed:
    """A calibrated policy as a run recorded it (from_record: with a head or a correction); a
    record made before picks kept the states their head was fitted on gets them from the store, so an old
    report counts them apart too."""
    p = from_record(record)
    return p if "fitted" in record else replace(p, fitted=fitted_states(store, p.config))


def pick(config: Mapping[str, Any], *, id: int | None = None, source: str = "",
         fitted: frozenset[str] = frozenset()) -> HeadPick:
    """A calibrated policy as a head to use; ValueError naming the field when it is not valid or
    carries no head."""
    data, policy = validated(config, where(id, source))
    if policy.head is None:
        raise ValueError(f"{where(id, source)}: head: it carries no learned head (its correction is "
                         f"{policy.correction_name}) - export one with a head on Calibrate, or with python -m app "
                         "calibrate --head ...")
    return HeadPick(id, data, content_hash(data), policy, source, fitted)


def pick_from_record(record: Mapping[str, Any]) -> HeadPick:
    """A pick as a run recorded it; ValueError when the JSON is not the one its sha256 names."""
    p = from_record(record)
    return pick(p.config, id=p.id, source=p.source, fitted=p.fitted)


def record_label(record: Mapping[str, Any]) -> str:
    """How a saved calibrated policy with a head is offered: '#3 Ticket routing · hidden-state head
    (48 rows) on SmolLM2… · gate 0.500 · 2026-12-03 10:04'."""
    config = record.get("config") or {}
    head = config.get("head") or {}
    threshold = record.get("threshold")
    version = f" v{config['policy_version']}" if config.get("policy_version") is not None else ""
    correction = (f"{head_name(str(head.get('kind')))} ({head.get('rows', '?')} rows)" if head else
                  "no head")
    return (f"#{record['id']} {record.get('name') or record.get('policy_id')}{version} · {correction} on "
            f"{record.get('model_file')} · gate {'none' if threshold is None else f'{threshold:.3f}'} · "
            f"guard {config.get('guard') or 'none'} · {str(record.get('created_at', ''))[:16].replace('T', ' ')}")


# -- is this pick usable here? -----------------------------------------------------------------------
def policy_problem(p: AsDeployed, policy: Mapping[str, Any]) -> str | None:
    """Why the calibrated policy cannot decide for this policy (it was calibrated on another policy's
    rows or options), naming the field; None when it can."""
    cal = p.policy
    if cal.policy_id != policy["id"]:
        return (f"{p.label}: policy_id is {cal.policy_id!r}, not {policy['id']!r} - it was calibrated on another "
                "policy's rows: pick a calibrated policy of this policy")
    ids = [o["id"] for o in policy["options"]]
    if not cal.matches(ids):
        return (f"{p.label}: options {', '.join(o.id for o in cal.options)} are not this policy's ({', '.join(ids)}): "
                "it decides between other options - calibrate the policy as it is now")
    return None


def target_problem(p: AsDeployed, target: Target) -> str | None:
    """Why the calibrated policy cannot be tested as deployed on this target (its head reads hidden
    states the target cannot return, or the target runs another model than the calibrated one), naming
    the field; None when it can or cannot be known before."""
    head = p.policy.head
    if head is not None and uses_hidden(head.kind) and not target.returns_hidden():
        return (f"{p.label}: target {target.name!r} cannot return hidden states, which its {KIND_WORDS[head.kind].name} "
                "reads: use a local model, or a SemIf adapter that lists hidden_state in /info")
    try:
        ident = target.numerics()
        sha = ident["sha256"] if ident else None
    except Exception:  # the target's own call says why it cannot be reached
        sha = None
    if sha and head is not None and sha != head.model_sha256:
        return (f"{p.label}: model: its head was fitted on {p.policy.model.file} ({head.model_sha256[:12]}); target "
                f"{target.name!r} runs another model ({sha[:12]}), whose hidden states mean nothing to it")
    if sha and sha != p.policy.model.sha256:
        return (f"{p.label}: model: it was calibrated on {p.policy.model.file} ({p.policy.model.sha256[:12]}); target "
                f"{target.name!r} runs another model ({sha[:12]}), and as deployed every row of another model goes to "
                "the fallback: pick a target that runs the calibrated model")
    return None


def rendering(p: AsDeployed) -> tuple[Content, RequestSettings]:
    """(question, options, examples; the request settings) with which the calibrated policy renders a row."""
    return p.rendering()


def rendering_problem(policy: CalibratedPolicy, result: Mapping[str, Any]) -> str | None:
    """How a stored row was rendered otherwise than the rows the policy's head was fitted on - its
    question, options, examples, readout and correction, permutation, examples shown - or None."""
    req = result.get("request") if isinstance(result.get("request"), dict) else None
    resp = StoredResponse.of(result)
    if req is None or resp is None:
        return "the row's request or answer was not kept"
    diffs = []
    if str(req.get("question", "")).strip() != policy.question.strip():
        diffs.append("question")
    options = [(o.get("id"), o.get("description", "")) for o in req.get("options") or [] if isinstance(o, dict)]
    if options != [(o.id, o.description) for o in policy.options]:
        diffs.append("options")
    examples = [(e.get("state"), e.get("option_id")) for e in req.get("examples") or [] if isinstance(e, dict)]
    if examples != [(e.state, e.option_id) for e in policy.examples]:
        diffs.append("examples")
    readout, debias = resp.readout, resp.scored_as
    if (readout, debias) != (policy.readout, policy.debias):
        diffs.append(f"readout ({readout} + {debias}; the head's rows: {policy.readout} + {policy.debias})")
    if bool(req.get("permute")) != policy.permute:
        diffs.append("permutation setting")
    if (req.get("layout") or "state-first") != policy.layout:
        diffs.append(f"layout ({req.get('layout') or 'state-first'}; the head's rows: {policy.layout})")

    def shows(few_shot: Any, ro: Any) -> bool:
        return bool(few_shot) if few_shot is not None else ro == "option-words"

    if policy.examples and shows(req.get("few_shot"), readout) != shows(policy.few_shot, policy.readout):
        diffs.append("few-shot setting")
    return ("rendered with another " + ", ".join(diffs)) if diffs else None


# -- the head on one stored result --------------------------------------------------------------------
@dataclass(frozen=True)
class HeadAnswer:
    """The calibrated policy on one row: the head's own answer (the argmax of its probabilities; None
    when it could not read the row, `unread` says why) and the policy's decision (the head's answer, or
    the fallback when the gate - or the steering guard's flag - sends the row there)."""

    top: str | None
    option_id: str
    gated: bool
    reason: str
    confidence: float
    probabilities: list[float]
    unread: str = ""

    @property
    def read(self) -> bool:
        return self.top is not None


def unread_reason(policy: CalibratedPolicy, row: RowReading) -> str:
    """Why the head cannot read a row ('' when it can): the cases CalibratedPolicy.apply sends to the
    fallback without reading them, named for a report."""
    head = policy.head
    if not policy.matches(list(row.option_ids)):
        return f"the row's options ({', '.join(row.option_ids)}) are not the calibrated policy's"
    if head is None:  # a correction reads any row of its options; another model's row is gated by apply
        return ""
    if row.prompt_version and row.prompt_version != head.prompt_version:
        return f"the row was read with prompt {row.prompt_version}, the head with {head.prompt_version}"
    if row.model_sha256 and row.model_sha256 != policy.model.sha256:
        return f"the row was scored by another model ({row.model_sha256[:12]})"
    if row.hidden_model and row.hidden_model != head.model_sha256:
        return "the row's hidden state comes from another model"
    if uses_hidden(head.kind):
        hidden = row.hidden
        if hidden is None:
            return "the row was scored without its hidden state"
        if len(hidden) != head.hidden_dim:
            return f"the row's hidden state has {len(hidden)} values, the head reads {head.hidden_dim}"
    return ""


def answer(policy: CalibratedPolicy, result: Mapping[str, Any], *, with_guard: bool = True) -> HeadAnswer | None:
    """The calibrated policy applied to one stored result by CalibratedPolicy.apply (with `with_guard`,
    the steering guard's finding as the policy's own guard would have made it - a row checked by a
    stronger guard than the policy runs is not flagged for it); None for a failed call."""
    if result.get("error") or not result.get("probabilities"):
        return None
    response = StoredResponse.of(result) or NO_RESPONSE
    ids, probs = list(result["option_ids"]), [float(p) for p in result["probabilities"]]
    guard = guard_as(response.guard, policy.guard) if with_guard else None
    row = response.reading(ids, probs, suspected=bool((guard or {}).get("suspected")))
    why = unread_reason(policy, row)
    if not policy.matches(ids):  # apply refuses other options outright
        return HeadAnswer(None, policy.fallback_option, True, why, max(probs), probs, why)
    d = policy.apply(row)
    cal = list(d.calibrated_probabilities)
    top = None if why else ids[max(range(len(cal)), key=cal.__getitem__)]
    return HeadAnswer(top, d.option_id, d.gated, d.reason, d.confidence, cal, why)

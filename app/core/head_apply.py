"""A saved calibrated policy's learned head used where a correction is chosen (no Streamlit): the
Robustness check (does the head make steering better or worse?) and Compare (a head is a variant).

Every head decision here is `CalibratedPolicy.apply` on a stored result - the one rule the adapter
enforces - so a number shown is the number the deployed policy gives on the same row. A pick is
recorded with its run as the policy JSON itself plus that JSON's sha256: the report is recomputed
from the run alone, whatever later happens to the saved calibrated policy.

A head reads rows rendered as its policy renders them (question, options, examples, readout,
correction; the hidden state of its model at that prompt's last token). A row rendered otherwise -
a reworded question, renamed or reordered options, another readout, another model - is not a row
the head was fitted on: it is not read (and said so), never decided by it.

A state the head was fitted on (a row of the run its calibration scored) is marked wherever a head's
accuracy is counted: on those the head grades itself on its own training rows, so they are left out
of its accuracy and counted apart (`HeadPick.fitted`, hashes of those states, recorded with the pick).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from adapter.server.calibrated import CalibratedPolicy, RowReading
from adapter.engine.head import KIND_WORDS, Head, head_name, uses_hidden
from adapter.schema import HEAD_LAYOUT

from app.core import deployed
from app.core.deployed import AsDeployed as AsDeployed
from app.core.deployed import content_hash as content_hash
from app.core.deployed import state_key as state_key
from app.core.store import Store
from app.core.stored import NO_RESPONSE, StoredResponse
from app.targets.base import Target


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
    raw = config.get("dataset")
    dataset: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if (run is None or run.get("policy_id") != config.get("policy_id")
            or ("set_id" in dataset and run.get("labeled_set_id") != dataset["set_id"])):  # another workbench's run
        return frozenset()
    ids = [o.get("id") for o in config.get("options") or [] if isinstance(o, dict)]
    return frozenset(state_key(r["state"]) for r in store.results(run["id"])  # the rows a head is fitted on
                     if r.get("state") is not None and not r.get("error") and r.get("probabilities")
                     and r.get("label") in ids)


def recorded(store: Store, record: Mapping[str, Any]) -> AsDeployed:
    """A calibrated policy as a run recorded it (deployed.from_record: with a head or a correction); a
    record made before picks kept the states their head was fitted on gets them from the store, so an old
    report counts them apart too."""
    p = deployed.from_record(record)
    return p if "fitted" in record else replace(p, fitted=fitted_states(store, p.config))


def pick(config: Mapping[str, Any], *, id: int | None = None, source: str = "",
         fitted: frozenset[str] = frozenset()) -> HeadPick:
    """A calibrated policy as a head to use; ValueError naming the field when it is not valid or
    carries no head."""
    data, policy = deployed.validated(config, deployed.where(id, source))
    if policy.head is None:
        raise ValueError(f"{deployed.where(id, source)}: head: it carries no learned head (its correction is "
                         f"{policy.correction_name}) - export one with a head on Calibrate, or with python -m app "
                         "calibrate --head ...")
    return HeadPick(id, data, content_hash(data), policy, source, fitted)


def from_record(record: Mapping[str, Any]) -> HeadPick:
    """A pick as a run recorded it; ValueError when the JSON is not the one its sha256 names."""
    p = deployed.from_record(record)
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


def rendering(p: AsDeployed) -> tuple[deployed.Content, deployed.RequestSettings]:
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
    guard = deployed.guard_as(response.guard, policy.guard) if with_guard else None
    row = response.reading(ids, probs, suspected=bool((guard or {}).get("suspected")))
    why = unread_reason(policy, row)
    if not policy.matches(ids):  # apply refuses other options outright
        return HeadAnswer(None, policy.fallback_option, True, why, max(probs), probs, why)
    d = policy.apply(row)
    cal = list(d.calibrated_probabilities)
    top = None if why else ids[max(range(len(cal)), key=cal.__getitem__)]
    return HeadAnswer(top, d.option_id, d.gated, d.reason, d.confidence, cal, why)

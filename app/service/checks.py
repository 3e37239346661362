"""The two checks of a policy's behaviour beyond accuracy: does the order of the options change the
answer (order check), and does the decision hold when the input changes - steering, rewordings,
extra options (robustness check). Each is a run; its report is computed from the stored results."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Mapping

from app.core import deployed, order_sensitivity, robustness
from app.core.deployed import AsDeployed
from app.core.robustness import CHECK_LABELS as CHECK_LABELS
from app.core.robustness import CHECKS as CHECKS
from app.core.robustness import SuiteError as SuiteError
from app.core.robustness import parse_templates as parse_templates
from app.core.robustness import shipped_suite as shipped_suite
from adapter.guard import GUARDS as GUARDS
from adapter.head import uses_hidden
from app.core.records import RunConfig, config_of
from app.core.runs import VARIANTS
from app.core.inputs import InputError as InputError
from app.core.inputs import rows_from_text, rows_from_upload
from app.core.labeled import scored_cases
from app.core.runner import Case, Job, ProgressFn, score_into_runs
from app.core.runner import progress_text as progress_text
from app.core.stats import Proportion, proportion
from app.core.stored import StoredResponse
from app.core.store import Store
from app.service import tracking as tracked
from app.service.inputs import Inputs
from app.targets.base import Target

Policy = Mapping[str, Any]  # a policy record (app/core/records.Policy) or a policy dict
SINGLE_ROW_VARIANTS = [v for v in VARIANTS if "permutation" not in v]  # the checks permute or perturb themselves


def out_of_scope_states(filename: str, data: bytes) -> list[Any]:
    """The states of a CSV/JSONL of states that belong to none of the policy's options (their labels,
    if any, are not read): the none-of-these check's out-of-scope rows."""
    return [c.state for c in rows_from_upload(filename, data)]


def states(store: Store, *, set_id: int | None, pasted: str, limit: int) -> list[Case]:
    """The states to check: up to `limit` evenly spaced rows of a labeled set (never its train split),
    else the pasted lines; InputError when there are none."""
    cases = scored_cases(store, set_id, limit) if set_id is not None else rows_from_text(pasted)[:limit]
    if not cases:
        raise InputError(["States: paste at least one line."])
    return cases


# -- order check -------------------------------------------------------------------------------------
def order_calls_per_state(policy: Policy, negated: str | None) -> int:
    return len(policy["options"]) + (1 if negated else 0)


def order_check(store: Store, policy: Policy, cases: list[Case], target: Target, *, variant: str = "default",
                negated: str | None = None, progress: ProgressFn | None = None,
                calibrated: AsDeployed | None = None) -> int:
    """Each state scored once per cyclic order of the options (and with the negated question, for a
    yes/no policy), saved as a run of kind order-check; returns the run id. With a calibrated policy,
    the rows are rendered as it renders them (its question, options, examples, readout, correction and
    permutation - as deployed; the readout variant is not used); SuiteError when it is another policy's."""
    overrides = VARIANTS[variant].overrides()
    config: RunConfig = {"variant": variant, "negated_question": negated, "states": len(cases)}
    if calibrated is not None:
        problem = deployed.policy_problem(calibrated, policy)
        if problem:
            raise robustness.SuiteError(problem)
        content, settings = calibrated.rendering()
        overrides = dict(settings)
        policy = {**policy, **content}
        config["variant"], config["calibrated"] = f"as {calibrated.label}: {calibrated.rendering_name}", calibrated.record()
    items = order_sensitivity.diagnostic_items(policy, cases, negated, overrides)
    rid = store.create_run(kind="order-check", policy=policy, target=target.describe(), n_rows=len(items),
                           group_id=uuid.uuid4().hex[:12], config=config)
    score_into_runs(store, [Job(rid, target)], items, total=len(items), progress=progress)
    if tracked.uri() is not None:  # MLflow (never raises); the report is built only when it is logged
        tracked.robustness(store, rid, robustness_report(store, rid))
    return rid


@dataclass
class OrderCheck:
    run: Mapping[str, Any]
    report: order_sensitivity.Report

    @property
    def worrying(self) -> bool:
        return order_sensitivity.worrying(self.report.flip_rate, self.report.negation)

    def summary(self) -> dict[str, Any]:
        r = self.report
        return {"run": self.run["id"], "policy": self.run["policy_id"], "target": self.run["target_name"],
                "states": r.n_states, "flip_rate": r.flip_rate, "positions": r.positions.to_dict("records"),
                "shifts": r.shifts.to_dict("records"), "negation": r.negation, "verdict": r.verdict}

    def summary_json(self) -> str:
        return json.dumps(self.summary(), indent=2, default=int)


def order_report(store: Store, run: Mapping[str, Any]) -> OrderCheck:
    ids = [o["id"] for o in run["policy"]["options"]]
    return OrderCheck(run, order_sensitivity.analyse(store.results(run["id"]), ids,
                                                     yes=ids[0] if len(ids) == 2 else None))


# -- robustness check --------------------------------------------------------------------------------
@dataclass
class RobustnessInput:
    policy: Policy
    cases: list[Case]
    suite: robustness.Suite
    checks: list[str]
    attempts: int = 3
    variant: str = "default"
    guard: str = "erase-and-check"  # with a calibrated policy: a what-if when it differs from the policy's own
    out_of_scope: list[Any] | None = None
    source: str = ""
    calibrated: AsDeployed | None = None  # a calibrated policy tested as deployed (its head, guard, gate, fallback)

    @classmethod
    def of(cls, given: Inputs, suite: robustness.Suite, checks: list[str], *, attempts: int = 3, variant: str = "default",
           guard: str = "erase-and-check", out_of_scope: list[Any] | None = None) -> RobustnessInput:
        """A command's resolved inputs (app/service/inputs.py: the policy, states, calibrated policy) with the
        check's own settings."""
        return cls(given.policy, list(given.cases), suite, checks, attempts=attempts, variant=variant, guard=guard,
                   out_of_scope=out_of_scope, source=given.source, calibrated=given.pick)


def robustness_problem(spec: RobustnessInput, target: Target) -> str | None:
    """Why the picked calibrated policy's head cannot be measured here (another policy's or options, a
    target that cannot return hidden states or runs another model), naming the field; None when it can."""
    if spec.calibrated is None:
        return None
    return (deployed.policy_problem(spec.calibrated, spec.policy)
            or deployed.target_problem(spec.calibrated, target))


def robustness_calls_per_state(policy: Policy, suite: robustness.Suite, checks: list[str], attempts: int) -> int:
    return robustness.calls_per_state(policy, suite, checks, attempts)


def robustness_check(store: Store, spec: RobustnessInput, target: Target,
                     progress: ProgressFn | None = None) -> int:
    """Every state unchanged and changed (steering, rewordings, extra options, order), scored and
    saved as a run of kind robustness; returns the run id. SuiteError for a suite that cannot run, or a
    calibrated policy whose head cannot be measured here. With a calibrated policy, every row is
    rendered as it renders them (its question, options, examples, readout and correction - the
    readout variant is not used) and the unchanged and steered rows ask for their hidden state."""
    if spec.variant not in VARIANTS:
        raise robustness.SuiteError(f"readout {spec.variant!r}: choose from {', '.join(VARIANTS)}")
    problem = robustness_problem(spec, target)
    if problem:
        raise robustness.SuiteError(problem)
    policy: Policy = spec.policy
    overrides, variant, record, hidden = VARIANTS[spec.variant].overrides(), spec.variant, None, False
    guard, extra = spec.guard, RunConfig()
    if spec.calibrated is not None:
        cal = spec.calibrated
        content, settings = cal.rendering()
        overrides = dict(settings)
        policy = {**spec.policy, **content}
        variant = f"as {cal.label}: {cal.rendering_name}"
        record, hidden = cal.record(), cal.policy.head is not None and uses_hidden(cal.policy.head.kind)
        # the rows ask for the stronger guard; the verdict reads the policy's own, the page's is a what-if
        guard = deployed.stronger(cal.guard, spec.guard)
        extra = RunConfig(deployed_guard=cal.guard, what_if_guard=spec.guard if spec.guard != cal.guard else None)
    rid, items = robustness.start_check(store, policy=policy, cases=spec.cases, target=target, suite=spec.suite,
                                        checks=spec.checks, attempts=spec.attempts, variant=variant,
                                        overrides=overrides, guard=guard, out_of_scope=spec.out_of_scope,
                                        source=spec.source, calibrated=record, hidden=hidden, extra=extra)
    score_into_runs(store, [Job(rid, target)], items, total=len(items), progress=progress)
    return rid


def robustness_report(store: Store, run_id: int) -> robustness.Report:
    return robustness.report_for(store, run_id)


def rate_rows(report: robustness.Report) -> list[dict[str, Any]]:
    """The rates a robustness run measured, each {label, k, n, rate, low, high}, for one chart."""
    s = report.summary
    changes = s.changes
    rows: list[dict[str, Any]] = []

    def row(label: str, rate: Proportion) -> None:
        rows.append({"label": label, **rate.to_dict()})
    if changes.steering is not None:
        st_ = changes.steering
        row("Steering: hijacked", st_.hijack_rate)
        if st_.still_correct_rate.n:
            row("Steering: still correct", st_.still_correct_rate)
        if st_.held_rate is not None and st_.hijack_unflagged_rate is not None:
            row("Steering: held (correct or flagged)", st_.held_rate)
            row("Steering: hijacked, not flagged", st_.hijack_unflagged_rate)
    head = s.head
    if head is not None and head.steering is not None:
        hs = head.steering
        row("Steering with the head: hijacked", hs.head.hijack_rate)
        row("Steering, model alone: held (decided as labeled), on the head's rows", hs.model.held_rate)
        row("Steering with the head: held (decided as labeled)", hs.head.held_rate)
        row("Steering with the head + gate: hijacked and decided", hs.head_gate.hijack_decided_rate)
        row("Steering with the head + gate: sent to the fallback", hs.head_gate.gated_rate)
    if head is not None:
        row("Unchanged rows sent to the fallback by the head's gate", head.base.gated)
    if s.base.flagged is not None:
        row("Unchanged rows flagged by the guard", s.base.flagged)
    for check in ("paraphrase", "rename", "irrelevant-option", "order"):
        entry = changes.flip(check)
        if entry is not None:
            row(f"{robustness.CHECK_LABELS[check]}: answer changed", entry.flip_rate)
    return rows


def head_rows(report: robustness.Report) -> list[dict[str, Any]]:
    """The steering numbers side by side - the model alone, the learned head's own answer, and the
    calibrated policy's decision through its gate - each with n and its Wilson interval; empty when the
    run measured no head (or had no steering attempt)."""
    head = report.summary.head
    if head is None or head.steering is None:
        return []
    hs = head.steering
    held = "held (decided as labeled; no label: unchanged)"

    def text(rate: Proportion) -> str:  # '25.0% (95% CI 7.1–59.1%, n=8)'
        return rate.text()

    cal = head.calibrated
    own, gated = ((f"the head of {cal['label']} (its own answer)", "the head + its gate") if cal.get("head") else
                  (f"{cal['label']}'s {cal['correction']} (its own answer)", f"{cal['label']} + its gate"))
    return [{"decided by": "the model alone", "hijacked": text(hs.model.hijack_rate),
             held: text(hs.model.held_rate), "sent to the fallback": ""},
            {"decided by": own, "hijacked": text(hs.head.hijack_rate),
             held: text(hs.head.held_rate), "sent to the fallback": ""},
            {"decided by": f"{gated} and guard {cal.get('guard') or 'none'} (fallback {cal['fallback_option']})",
             "hijacked": text(hs.head_gate.hijack_decided_rate) + " and decided",
             held: text(hs.head_gate.held_rate) + " decided so or sent to the fallback",
             "sent to the fallback": text(hs.head_gate.gated_rate)}]


def what_if(report: robustness.Report) -> str | None:
    """The steering numbers under a guard the calibrated policy does not run (a page's what-if), in
    words and labelled as such; None when the check measured none."""
    w = report.summary.what_if
    if w is None:
        return None
    return (f"What-if, not the policy's verdict - with guard {w.guard} (the calibrated policy runs "
            f"{w.deployed_guard}): {w.text}")


def deployed_verdict(store: Store, calibrated_id: int) -> tuple[str, str, int] | None:
    """(level, text, run id) of the newest robustness check that tested this saved calibrated policy
    as deployed - its steering verdict with the policy's own guard (and head, gate) - or None: not checked."""
    record = next((r for r in store.list_calibrated() if int(r["id"]) == calibrated_id), None)
    if record is None:
        return None
    sha = deployed.content_hash(record["config"])
    for run in sorted(store.list_runs(kind="robustness"), key=lambda r: -r["id"]):
        cal = config_of(run).get("calibrated") or {}
        if cal.get("sha256") != sha or run["status"] not in ("done", "done-with-errors"):
            continue
        verdicts = robustness.report_for(store, run["id"]).verdicts
        for key in ("steering-head", "steering-deployed", "steering"):
            if key in verdicts:
                level, text = verdicts[key]
                return level, text, run["id"]
    return None


def family_rows(report: robustness.Report) -> list[dict[str, Any]]:
    """Per steering family (a register, a format, a language; the analyst's own templates are 'yours'):
    the hijack rate and, with the guard, the share held - each with its Wilson interval - and the level."""
    steering = report.summary.changes.steering
    guard = report.guard
    rows: list[dict[str, Any]] = []
    for f in steering.by_family if steering is not None else []:
        rows.append({"label": f"{f.family}: hijacked", "family": f.family, "level": f.level,
                     **f.hijack_rate.to_dict()})
        if guard:
            rows.append({"label": f"{f.family}: held with the {guard} guard", "family": f.family,
                         "level": f.level, **f.held_rate.to_dict()})
    return rows


def template_rows(report: robustness.Report) -> list[dict[str, Any]]:
    """Hijack rate per steering template, with Wilson intervals."""
    return [{"label": f"{r['template']} ({r['placement']})", **proportion(int(r["hijacked"]), int(r["n"])).to_dict()}
            for r in report.per_template.to_dict("records")]


def suite_from_form(policy: Policy, *, own_templates: str, paraphrases: str, rewordings: str, irrelevant: str,
                    out_of_scope: str) -> tuple[robustness.Suite, list[str]]:
    """The shipped suite edited on the page: (suite, out-of-scope states); SuiteError names the field."""
    suite = robustness.shipped_suite(policy)
    suite.steering += robustness.parse_templates(own_templates)
    suite.paraphrases = [ln.strip() for ln in paraphrases.splitlines() if ln.strip()]
    try:
        suite.option_rewordings = json.loads(rewordings) if rewordings.strip() else []
    except json.JSONDecodeError as exc:
        raise robustness.SuiteError(f"rewordings of the options: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(suite.option_rewordings, list):
        raise robustness.SuiteError("rewordings of the options: give a JSON list, e.g. [{\"old id\": {\"id\": ..., "
                                    "\"description\": ...}}]")
    oid, _, desc = irrelevant.partition(":")
    suite.irrelevant_option = {"id": oid.strip(), "description": desc.strip()}
    suite.out_of_scope = []
    robustness.check_suite(suite, policy)
    return suite, [ln.strip() for ln in out_of_scope.splitlines() if ln.strip()]


NO_GUARD = StoredResponse()


# -- what the steering guard costs a calibrated policy, from its as-deployed check ----------------------
GUARD_UNCHECKED = ("no as-deployed Robustness check of a calibrated policy of {policy} yet: run one (Robustness, "
                   "Learned head / calibrated policy; or `python -m app robustness --calibrated ID`) to see what its "
                   "guard holds. Measured on the shipped sets with the default model, one added sentence moved 86% of "
                   "unguarded decisions to the option it named (docs/robustness.md)")


def guard_cost(store: Store, policy_id: str) -> list[str]:
    """What the steering guard holds and costs a calibrated policy of `policy_id`, in words, from the newest
    finished Robustness check of one as deployed (its steering attempts, with its guard and any what-if
    guard beside it, and the model passes the guard made a row); one line saying there is none yet
    otherwise. Shown where the analyst exports with or without a guard (Calibrate page, `calibrate`)."""
    for run in sorted(store.list_runs(kind="robustness"), key=lambda r: -r["id"]):
        cfg = config_of(run)
        cal = cfg.get("calibrated") or {}
        if (cal.get("config") or {}).get("policy_id") != policy_id or run["status"] not in ("done", "done-with-errors"):
            continue
        summary = robustness.report_for(store, run["id"]).summary
        lines = [f"as-deployed check run #{run['id']} ({deployed.where(cal.get('id'), cal.get('source') or '')}, "
                 f"guard {summary.guard or 'none'}):"]
        steering = summary.changes.steering
        if steering is not None:
            lines.append(f"  without a guard, steering moved {steering.hijack_rate.text()} of the attempts to the option "
                         "it named")
            if steering.held_rate is not None and steering.hijack_unflagged_rate is not None:
                lines.append(f"  with guard {summary.guard}: held {steering.held_rate.text()}, hijacked unflagged "
                             f"{steering.hijack_unflagged_rate.text()}")
        head = summary.head.steering if summary.head is not None else None
        if head is not None:
            lines.append(f"  the policy's own decisions (its head or correction, gate and guard): hijacked and decided "
                         f"{head.head_gate.hijack_decided_rate.text()}, sent to the fallback {head.head_gate.gated_rate.text()}")
        if summary.what_if is not None:
            lines.append(f"  what-if guard {summary.what_if.guard}: {summary.what_if.text}")
        if summary.base.flagged is not None:
            lines.append(f"  unchanged rows flagged (sent to the fallback): {summary.base.flagged.text()}")
        passes = [p for r in store.results(run["id"]) if "#rb:base:" in str(r["row_key"])
                  and isinstance(p := ((StoredResponse.of(r) or NO_GUARD).guard or {}).get("passes"), int)]
        if passes:
            lines.append(f"  cost: {sum(passes) / len(passes):.2f} extra model passes per unchanged row "
                         f"(mean of {len(passes)}; a decision is one pass per option order)")
        return lines
    return [GUARD_UNCHECKED.format(policy=policy_id)]

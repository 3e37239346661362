"""`python -m app check`: evaluate a policy on a labeled set (stored results of the same model and
request are reused, not scored again), judge every threshold given, and report for CI - exit 0 when
every threshold holds, 1 when one fails, 2 for a usage or target error (nothing judged then)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from adapter.policy import CalibratedPolicy, PolicyError, load_policy, policy_json, policy_version
from adapter.schema import HEAD_LAYOUT

from app.core import check as ck
from app.core import drift as dr
from app.core import runs
from app.core.gates import Gate, measure
from app.core.run_calibration import CHECK_TITLE
from app.core.runner import model_label
from app.core.store import RunBusy, Store
from app.core.stored import NO_RESPONSE, ModelRef, first_response
from app.service import registry
from app.service import tracking as tracked
from app.service import inputs
from app.service.inputs import Inputs
from app.service.policies import resolve_policy

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = ck.EXIT_PASS, ck.EXIT_FAIL, ck.EXIT_USAGE
BOUNDS = ("min_accuracy", "min_gate_accuracy", "min_coverage", "max_ece", "max_flips", "max_broken")


class UsageError(ValueError):
    """Bad arguments, an unknown policy/set/run, a target that failed: exit 2, nothing judged."""


@dataclass
class CheckInput:
    policy: str  # a calibrated policy file (its gate is used), or a saved policy id / template / policy JSON
    labeled_set: str
    bounds: dict[str, float | int | None]
    baseline: str | None = None  # a run id or "pinned"
    gate: float | None = None  # a plain policy's confidence gate
    readout: str | None = None
    debias: str | None = None
    permute: bool = False
    reuse: bool = True


@dataclass
class CheckResult:
    report: ck.CheckReport
    run_id: int
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return self.report.exit_code


def check_policy(store: Store, ref: str) -> tuple[Mapping[str, Any], CalibratedPolicy | None]:
    """(the policy as the workbench evaluates it, the calibrated policy or None): a calibrated policy
    file (semif-policy/1) brings its question, options, examples, readout, correction and gate; so does a
    registry reference (models:/NAME@ALIAS, models:/NAME/VERSION), resolved to its file first."""
    if registry.is_reference(ref):
        try:
            ref = str(registry.resolve(ref, store=store).path)
        except registry.RegistryError as exc:
            raise UsageError(f"--policy: {exc}") from None
    path = Path(ref)
    if path.is_file():
        try:  # the adapter's reader: size before parsing, UTF-8, depth, NaN refused
            data = policy_json(path, what=f"--policy {ref}:")
        except PolicyError as exc:
            raise UsageError(str(exc)) from None
        if isinstance(data, dict) and "schema_version" in data:
            try:
                cal = load_policy(data)
            except PolicyError as exc:
                raise UsageError(f"--policy {ref}: {exc}") from None
            policy = {"id": cal.policy_id, "name": cal.name or cal.policy_id, "question": cal.question,
                      "options": [o.model_dump() for o in cal.options], "examples": [e.model_dump() for e in cal.examples],
                      "readout": cal.readout, "debias": cal.debias}
            return policy, cal
    try:
        return resolve_policy(store, ref), None
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def validate(spec: CheckInput) -> None:
    """The argument rules, before anything is loaded."""
    b = spec.bounds
    if all(v is None for v in b.values()):
        raise UsageError("give at least one threshold (--min-accuracy, --min-gate-accuracy, --min-coverage, --max-ece, "
                         "--max-flips, --max-broken)")
    if (b.get("max_flips") is not None or b.get("max_broken") is not None) and not spec.baseline:
        raise UsageError("--max-flips / --max-broken compare against a run: give --baseline RUN (a run id, or 'pinned')")


def resolve(store: Store, spec: CheckInput, target: str) -> Inputs:
    """The check's inputs in one call (app/service/inputs.py): --policy (a calibrated policy file, a registry
    reference, or a policy), --labeled-set (imported or found), --target - after the argument rules (validate)."""
    validate(spec)
    try:
        return inputs.resolve(store, inputs.Ask(spec.policy, labeled_set=spec.labeled_set, targets=(target,),
                                                policy_reader=check_policy))
    except inputs.InputsError as exc:
        raise UsageError(str(exc)) from None


def check(store: Store, spec: CheckInput, given: Inputs) -> CheckResult:
    """Evaluate and judge `given` (resolve: the policy, its calibrated policy file if any, the set, the target).
    UsageError for anything that leaves nothing to judge."""
    policy, calibrated, target = given.policy, given.policy_file, given.target
    assert given.set_id is not None
    set_id = given.set_id
    b = spec.bounds
    if (b.get("min_gate_accuracy") is not None or b.get("min_coverage") is not None) and calibrated is None \
            and spec.gate is None:
        raise UsageError("--min-gate-accuracy / --min-coverage need a gate: give a calibrated policy file "
                         "(semif-policy/1, from Calibrate) as --policy, or --gate CONFIDENCE")
    baseline = None
    if spec.baseline:
        baseline = store.pinned_run() if spec.baseline == "pinned" else (
            store.get_run(int(spec.baseline)) if spec.baseline.isdigit() else None)
        if baseline is None:
            raise UsageError(f"--baseline {spec.baseline!r}: no such run (a run id from History, or 'pinned')")
    if calibrated is not None:
        variant = (runs.HEAD_VARIANT if calibrated.layout == HEAD_LAYOUT else
                   runs.Variant(calibrated.readout, calibrated.debias, calibrated.permute, calibrated.few_shot))
    else:
        variant = runs.Variant(spec.readout, spec.debias, spec.permute)
    try:
        run_id = runs.start_eval(store, policy=policy, set_id=set_id, target=target, variant=variant, kind="check")
        counts = runs.resume_eval(store, run_id, target, reuse=spec.reuse)
    except (ValueError, RunBusy) as exc:
        raise UsageError(str(exc)) from None
    results = store.results(run_id)
    failed = [r for r in results if r["error"]]
    if failed:
        raise UsageError(f"target {target.name} failed on {len(failed)} of {len(results)} rows, e.g. "
                         f"{failed[0]['row_key']}: {failed[0]['error']} - nothing was judged")
    gate = Gate(policy=calibrated, check_model=True) if calibrated is not None else Gate(threshold=spec.gate)
    metrics = measure(results, gate)
    drift = None
    if baseline is not None:
        drift = dr.compare(store.results(baseline["id"]), results, gate=gate)
        if not drift.pairs:
            raise UsageError(f"--baseline #{baseline['id']} has no rows in common with this check (rows are matched by "
                             "id and state): pick a run of the same labeled set")
    labeled: Mapping[str, Any] = store.get_labeled_set(set_id) or {}
    model = (first_response(results) or NO_RESPONSE).model or ModelRef()
    context: dict[str, Any] = {
        "policy": policy["id"], "labeled_set": f"{labeled.get('name')} (#{set_id})",
        "dataset_hash": labeled.get("content_hash", ""), "target": target.name,
        "model": model_label(model, "unknown"), "run": run_id, "rows": len(results),
        "evaluated": counts["evaluated"], "reused": counts["reused"], "gate": gate.name}
    if calibrated is not None:
        context["policy_version"] = policy_version(calibrated)
        if model.sha256 and model.sha256 != calibrated.model.sha256:
            context["model_mismatch"] = (f"the policy was calibrated on {calibrated.model.file}; {target.name} runs "
                                         f"{model.file}: the adapter sends every row to the fallback")
        context.update(gate_said(calibrated.metrics.gate_notes))
        if calibrated.gate_source == "unreachable":
            context["gate"] += "; no gate reached the target when it was calibrated: the adapter decides nothing"
        if calibrated.guard != "none":
            context["guard"] = f"the policy's steering guard ({calibrated.guard}) is not run by check"
    if baseline is not None and drift is not None:
        context["baseline"] = f"run #{baseline['id']} ({baseline['target_name']}, {len(drift.pairs)} rows in common)"
    report = ck.CheckReport(ck.evaluate(metrics, dict(b), drift), context,
                            [p.to_dict() for p in drift.pairs if p.kind in dr.FLIP_KINDS] if drift else [])
    tracked.check(store, run_id, report)  # MLflow, when SEMIF_MLFLOW_TRACKING_URI is set (never raises)
    return CheckResult(report, run_id, counts)


def gate_said(notes: Sequence[str]) -> dict[str, str]:
    """What Calibrate said of the gate, from the policy's `metrics.gate_notes`, as `check` reports it: how the gate
    was chosen (`gate_evidence`, the first note) and the gate on the pool's random sample alone (`gate_check`:
    run_calibration.random_check's sentence, when the set had one)."""
    evidence = next((str(n) for n in notes if not str(n).startswith(CHECK_TITLE)), None)  # a hand-set gate's
    said = {"gate_evidence": evidence} if evidence else {}  # notes begin with the check: not its evidence
    if check := next((str(n) for n in notes if str(n).startswith(CHECK_TITLE)), None):
        said["gate_check"] = check
    return said


def suite_name(store: Store, result: CheckResult) -> str:
    ctx = result.report.context
    return f"semif check {ctx['policy']} on {ctx['labeled_set']} x {ctx['target']}"


def write_reports(store: Store, result: CheckResult, *, junit: str | None, summary: str | None) -> None:
    """JUnit XML (one test case per threshold) and Markdown for a pull-request comment; OSError when
    a file cannot be written."""
    if junit:
        Path(junit).write_text(ck.junit_xml(result.report, suite_name(store, result)))
    if summary:
        Path(summary).write_text(ck.markdown(result.report))

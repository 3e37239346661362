"""Calibrating a policy: evaluate it on a labeled set (several targets x readouts, resumable), then
calibrate a run (corrections compared out of fold, the gate on the corrected probabilities), then
export the calibrated policy the adapter enforces. The page and `python -m app calibrate` call these."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from adapter.policy import AtGate, CalibratedPolicy
from adapter.schema import JSONObject

from app.core import run_calibration
from app.core import calibration, head_sources, heads, reuse, runs
from app.core.run_calibration import Calibration, GateDecision, version_label
from app.core.runs import EXAMPLE_SOURCES, VARIANTS, Variant
from app.core.runner import ProgressFn, StopScoring
from app.core.stats import Proportion, proportion
from app.core.records import Run, config_of
from app.core.store import RunBusy, Store
from app.core.stored import NO_RESPONSE, StoredResponse
from app.service import tracking as tracked
from app.targets.base import Target

Policy = Mapping[str, Any]  # a policy record (app/core/records.Policy) or a policy dict


class EnoughRows(StopScoring):
    """A stop rule held: this target x readout has what the analyst asked for; the next one starts."""


@dataclass(frozen=True)
class StopRule:
    """When an evaluation may stop before every row is scored - the rows come in stratified order, so
    what is scored by then is a fair sample (and the run resumes from there later)."""
    max_rows: int | None = None  # score this many rows of the set (the run keeps the rest for later)
    max_ci_width: float | None = None  # stop once the accuracy's 95% interval is this narrow (>= 20 rows)
    min_rows: int = 20

    def reason(self, store: Store, run_id: int, done: int) -> str | None:
        if self.max_rows is not None and done >= self.max_rows:
            return f"{done} rows scored, as asked"
        if self.max_ci_width is not None and done >= self.min_rows:
            acc = accuracy_so_far(store, run_id)
            if acc.rate is not None and acc.high is not None and acc.low is not None \
                    and acc.high - acc.low <= self.max_ci_width:
                return f"accuracy {acc.text()}: the interval is narrower than {self.max_ci_width:.0%}"
        return None


def accuracy_so_far(store: Store, run_id: int) -> Proportion:
    """The top option against the label on the rows scored so far, with its Wilson 95% interval (counted
    by the store in one query: the stop rule asks after every row)."""
    return proportion(*store.accuracy_counts(run_id))


@dataclass
class EvalOutcome:
    """One target x readout of an evaluation: its run and what scoring it did, or why not."""
    label: str
    run_id: int | None = None
    resumed: bool = False
    counts: dict[str, int] = field(default_factory=dict)  # scored, skipped, evaluated, reused, errors
    same_as: str | None = None  # not scored: reads the same as this earlier variant
    error: str | None = None
    stopped: str | None = None  # a stop rule ended it early (the run is resumable)
    companions: list[int] = field(default_factory=list)  # head-layout runs scored after it, on its rows
    why_scored: str = ""  # why the rows evaluated were not copied from stored results (reuse.why_not_reused)
    source_counts: list[tuple[str, dict[str, int]]] = field(default_factory=list)  # each head-layout source's counts

    def text(self) -> str:
        if self.same_as:
            return f"{self.label}: the same readings as {self.same_as} - not scored twice"
        if self.error:
            return f"{self.label}: {self.error}"
        if self.stopped:
            return f"{self.label}: stopped early - {self.stopped}; run it again to score the rest"
        c = self.counts
        return (f"{self.label}: done — {c.get('scored', 0)} rows scored now: {c.get('reused', 0)} copied from stored "
                f"results of the same model and request, {c.get('evaluated', 0)} evaluated; "
                f"{c.get('skipped', 0)} already in this run; errors {c.get('errors', 0)}"
                + (f". {self.why_scored}" if self.why_scored else "")
                # the sources' own counts: they may score rows the main run copied (a pool scored state first)
                + "".join(f"; {name} in the head layout: {s.get('scored', 0)} rows scored now: {s.get('reused', 0)} "
                          f"copied, {s.get('evaluated', 0)} evaluated" for name, s in self.source_counts))


def evaluate_one(store: Store, policy: Policy, set_id: int, target: Target, variant: Variant, *,
                 examples: str = "policy", n_examples: int = 4, new_run: bool = False, reuse: bool = True,
                 progress: ProgressFn | None = None, label: str = "", rule: StopRule | None = None,
                 head_sources: Sequence[Target] = ()) -> EvalOutcome:
    """Find the matching run (or start one) and score the rows it still lacks, until the stop rule
    holds. `head_sources`: local models whose hidden states in the head layout are read after it (one
    companion run each), source by source on the rows the main run then holds: every source gets the
    same fair sample, and each model is loaded once (row by row, a pool smaller than the models reloaded
    one on every row: issue 43). ValueError
    when the set cannot evaluate this policy; RunBusy when another worker scores the run; StopScoring
    (the analyst's Stop) passes through - the runs are then marked stopped."""
    remote = [s.name for s in head_sources if s.kind != "local"]
    if remote:  # before any run is made or any request sent: a labeled set never goes to a remote source
        raise ValueError(f"head sources {', '.join(remote)}: not local models - a head source reads hidden states, "
                         "which only a local model gives (and the labeled rows must not be sent elsewhere for it)")
    run_id, resumed = runs.find_or_start(store, policy=policy, set_id=set_id, target=target, variant=variant,
                                               examples=examples, n_examples=n_examples, new_run=new_run)  # type: ignore[arg-type]
    pairs: list[tuple[int, Target]] = [(run_id, target)]
    for source in head_sources:
        if source.name == target.name and variant.head_layout:
            continue
        companion, _ = runs.find_or_start(store, policy=policy, set_id=set_id, target=source, variant=runs.HEAD_VARIANT,
                                          examples=examples, n_examples=n_examples,  # type: ignore[arg-type]
                                          new_run=new_run, companion_of=run_id)
        pairs.append((companion, source))
    name = label or f"{target.name} · {variant.name}"
    sources = f" and {len(pairs) - 1} head-layout source{'s' if len(pairs) > 2 else ''}" if len(pairs) > 1 else ""
    rows_done = min(len(store.done_keys(r)) for r, _ in pairs)
    if rule is not None and (why := rule.reason(store, run_id, rows_done)):
        return EvalOutcome(name + sources, run_id, resumed, {"scored": 0, "skipped": rows_done}, stopped=why,
                           companions=[r for r, _ in pairs[1:]])

    cap = rule.max_rows if rule is not None else None
    n_jobs = len(pairs)
    rows_total = len(runs.run_config(store.get_run(run_id) or {}).row_keys)
    goal = min(cap, rows_total) if cap is not None else rows_total  # rows the main run will hold when it stops
    others = sum(len(store.done_keys(r)) for r, _ in pairs[1:])  # companion rows already scored

    def watched(done: int, total: int, eta: float | None) -> None:
        """The main run first (its stop rule checked on every row); the bar counts every source's rows, its
        ETA only while no source follows (theirs are not timed yet)."""
        if progress is not None:
            left = None if eta is None or total <= done or n_jobs > 1 else eta * max(goal - done, 0) / (total - done)
            progress(done + others, goal * n_jobs, left)
        if rule is not None and (why := rule.reason(store, run_id, done)):
            raise EnoughRows(why)

    # the sources on the main target's model first: it is still loaded
    pairs[1:] = sorted(pairs[1:], key=lambda p: (p[1].config.get("model") or "") != (target.config.get("model") or ""))
    companions = [r for r, _ in pairs[1:]]
    stopped = rule.reason(store, run_id, len(store.done_keys(run_id))) if rule is not None else None
    counts: dict[str, int] = {"scored": 0, "skipped": len(store.done_keys(run_id))}
    try:
        if not stopped:
            counts = runs.resume_evals(store, pairs[:1], watched, reuse=reuse)[run_id]
    except EnoughRows as exc:
        stopped, counts = str(exc), {"scored": len(store.done_keys(run_id))}
    except StopScoring:  # the analyst's Stop before the sources' turn: they are stopped too (and resume later)
        for companion in companions:
            store.stop_run(companion, "stopped")
        raise
    held = frozenset(store.done_keys(run_id))
    source_counts: list[tuple[str, dict[str, int]]] = []
    if companions and held:  # then source by source, on the rows the main run holds: one model in use at a time
        base = len(held)

        def follow(done: int, total: int, eta: float | None) -> None:
            if progress is not None:
                progress(base + done, base * n_jobs, eta)

        by_run = runs.resume_evals(store, pairs[1:], follow, reuse=reuse, by_source=True, only=held)
        source_counts = [(t.name, by_run.get(r, {})) for r, t in pairs[1:]]
    if stopped or not held:
        for companion in companions:  # they hold only the main run's rows: stopped with it, resumed with it
            store.stop_run(companion, "stopped")
    if stopped:
        return EvalOutcome(name + sources, run_id, resumed, counts, stopped=stopped, companions=companions)
    tracked.evaluation(store, run_id)  # MLflow, when SEMIF_MLFLOW_TRACKING_URI is set (never raises)
    return EvalOutcome(name + sources, run_id, resumed, counts, companions=companions,
                       why_scored=why_scored(store, run_id) if counts.get("evaluated") else "",
                       source_counts=source_counts)


def why_scored(store: Store, run_id: int) -> str:
    """Why this run's evaluated rows were not copied from stored results: against the newest earlier run of the
    same set and target, the request fields that changed (reuse.request_changes) and the rows whose model did."""
    run = store.get_run(run_id)
    if run is None:
        return ""
    fresh = [r for r in store.results(run_id) if r.get("reused_from") is None and not r["error"]]
    earlier = [r for r in store.list_runs(kind="eval") if r["id"] < run_id and r["labeled_set_id"] == run["labeled_set_id"]
               and r["target_name"] == run["target_name"] and runs.is_head_layout(r) == runs.is_head_layout(run)]
    for other in earlier:  # newest first
        before = {r["row_key"]: r for r in store.results(other["id"]) if not r["error"]}
        pairs = [(r, before[r["row_key"]]) for r in fresh if r["row_key"] in before]
        if not pairs:
            continue
        changes: dict[str, int] = {}
        for now, then in pairs:
            for k in reuse.request_changes(now.get("request"), then.get("request")):
                changes[k] = changes.get(k, 0) + 1
        models = sum(1 for now, then in pairs if _model_sha(now) != _model_sha(then))
        return reuse.why_not_reused(len(fresh), changes, models, len(pairs), other["id"])
    return reuse.why_not_reused(len(fresh), {}, 0, 0, None)


def _model_sha(result: Mapping[str, Any]) -> str | None:
    model = (StoredResponse.of(result) or NO_RESPONSE).model
    return model.sha256 if model is not None else None


def evaluate(store: Store, policy: Policy, set_id: int, targets: list[Target], variants: list[str], *,
             examples: str = "policy", progress_for: Callable[[str], ProgressFn] | None = None,
             rule: StopRule | None = None, head_sources: Sequence[Target] = ()) -> list[EvalOutcome]:
    """Every target x readout: a 'default' that reads the same as an explicit readout on a model is
    scored once; a run that cannot be scored says why and the others go on; a stop rule ends each
    target x readout on its own. `head_sources` are read beside the first target x readout, row by row."""
    if examples not in EXAMPLE_SOURCES:
        raise ValueError(f"examples: choose one of {', '.join(EXAMPLE_SOURCES)}")
    out = []
    pending = list(head_sources)
    for target in targets:
        for name, label, same in runs.distinct_variants(variants, policy, target):
            if same:
                out.append(EvalOutcome(label, same_as=same))
                continue
            try:
                out.append(evaluate_one(store, policy, set_id, target, VARIANTS[name], examples=examples, label=label,
                                        progress=progress_for(label) if progress_for else None, rule=rule,
                                        head_sources=pending))
                pending = []
            except (RunBusy, ValueError) as exc:
                out.append(EvalOutcome(label, error=str(exc)))
    return out


def best_run(store: Store, outcomes: list[EvalOutcome]) -> int | None:
    """The most accurate run of those just evaluated (the one Calibrate opens)."""
    made = [r for r in (store.get_run(o.run_id) for o in outcomes if o.run_id) if r]
    return best_of(run_calibration.readout_table(store, made))


def best_of(rows: Sequence[run_calibration.Readout]) -> int | None:
    """The run of the most accurate row of a readout table (the rule Calibrate opens a run by), or None."""
    scored = [(r.accuracy, r.run) for r in rows if r.accuracy is not None]
    return max(scored, key=lambda a: a[0])[1] if scored else None


def runs_of(store: Store, policy_id: str, set_id: int) -> list[Run]:
    """The evaluation runs of this policy on this set, newest first."""
    return [r for r in store.list_runs(kind="eval") if r["labeled_set_id"] == set_id and r["policy_id"] == policy_id]


def by_version(policy: Policy, made: Sequence[Mapping[str, Any]]
               ) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(runs of the saved version, runs of earlier versions) - kept apart on the Calibrate page. A run
    measures the policy as saved now when it evaluated its version (a save that changed only the guard or
    the readout is a new version too: what ships is the saved one), question, options and examples: a run of
    another version is history, and its gate is never exported for this one (runs.same_version)."""
    return [r for r in made if runs.same_version(policy, r)], [r for r in made if not runs.same_version(policy, r)]


def version_of(run: Mapping[str, Any]) -> str:
    """'v3' - the saved version of the policy a run evaluated ('v?' for a run made before versions)."""
    return version_label((run.get("policy") or {}).get("version"))


def readouts(store: Store, made: Sequence[Mapping[str, Any]]) -> list[run_calibration.Readout]:
    """One row per run: readout, rows, accuracy, macro-F1, ECE before/after, NLL, the correction."""
    return run_calibration.readout_table(store, made)


HEAD_CHOICES = heads.HEAD_CHOICES


def calibrate(store: Store, run_id: int, *, target_accuracy: float = 0.9, per_option: bool = False,
              head: str = "auto") -> Calibration:
    """Corrections and learned heads compared out of fold and the one chosen (`head`: "auto" keeps a
    head only beyond noise, "none", or a kind), metrics before/after it, the gate on the corrected
    probabilities (ValueError with fewer than 4 usable labeled rows, or a head that is unavailable)."""
    cal = run_calibration.calibrate(store, run_id, target_accuracy=target_accuracy, per_option=per_option, head=head)
    run = store.get_run(run_id)
    if run is not None and runs.is_head_layout(run):
        remember_head(store, run, head_sources.run_candidates(cal, run))
    return cal


def remember_head(store: Store, run: Mapping[str, Any], made: Sequence[head_sources.Candidate]) -> None:
    """A head-layout run's best learned head, out of fold (correct of n rows), stored with the run when it is
    fitted, so History shows the run by it without fitting again (written only when it changed)."""
    if not runs.is_head_layout(run):
        return
    head = next((c for c in made if c.kind == "head" and not c.refused and c.right), None)
    if head is None:
        return
    figure: dict[str, Any] = {"head": head.method, "correct": sum(bool(v) for v in head.right.values()),
                              "n": len(head.right)}
    if config_of(run).get("head_oof") != figure:
        store.merge_run_config(run["id"], {"head_oof": figure})


def source_group(store: Store, run_id: int) -> list[Run]:
    """A run and the head-layout runs of the same rows (the same policy content and saved version, set and
    examples: a v1 companion never stands in v2's table), a state-first run first: for a head-layout run opened on its own, the newest state-first run of those rows."""
    run = store.get_run(run_id)
    if run is None:
        return []

    def rows_of(r: Mapping[str, Any]) -> tuple[Any, ...]:  # the same rows of the same saved version
        c = config_of(r)
        return r["labeled_set_id"], c.get("policy_fingerprint"), c.get("examples"), (r.get("policy") or {}).get("version")

    same = [r for r in store.list_runs(kind="eval") if rows_of(r) == rows_of(run)]  # newest first
    main = run if not runs.is_head_layout(run) else next((r for r in same if not runs.is_head_layout(r)), None)
    layouts = sorted((r for r in same if runs.is_head_layout(r)), key=lambda r: r["id"])
    return [r for r in [main, *layouts] if r is not None]


def sources(store: Store, run_id: int, *, seed: int = 0) -> head_sources.Table | None:
    """Which (model, layout, head) to ship, out of fold and by cost a row, over a run and its head-layout
    companions (None when the run has none). A member with too few rows is shown as refused, with why."""
    group = source_group(store, run_id)
    if len(group) < 2:
        return None
    candidates: list[head_sources.Candidate] = []
    for run in group:
        try:
            cal = run_calibration.calibrate(store, run["id"], seed=seed)
        except ValueError as exc:
            layout = config_of(run).get("layout") or "state-first"
            candidates.append(head_sources.Candidate(run["id"], run.get("model") or run["target_name"], layout,
                                                     "learned head" if runs.is_head_layout(run) else "zero-shot",
                                                     "head" if runs.is_head_layout(run) else "zero-shot",
                                                     {}, {}, {}, None, None, refused=str(exc)))
            continue
        made = head_sources.run_candidates(cal, run)
        remember_head(store, run, made)
        candidates += made
    return head_sources.compare(candidates, seed=seed)


def layout_words(layout: str) -> str:
    """A layout as the comparison names it ('state first', 'head layout (policy first)')."""
    return head_sources.LAYOUT_WORDS.get(layout, layout)


def source_rows(table: head_sources.Table) -> list[dict[str, Any]]:
    """The comparison as table rows (and a CSV): per candidate accuracy and macro-F1 with intervals, cost."""
    return head_sources.table_rows(table)


def source_points(table: head_sources.Table) -> list[head_sources.ChartRow]:
    """The comparison as points for the accuracy-against-cost chart."""
    return head_sources.chart_rows(table)


def head_title(cal: Calibration) -> str | None:
    """'the hidden-state head', 'LinC (...)': the exported head as a sentence names it (None: no head)."""
    return heads.the(cal.head.name) if cal.head is not None else None


def chosen_accuracy(cal: Calibration) -> Proportion:
    """Accuracy of what the export carries, out of fold and before any gate (a head's, or the chosen
    correction's): the number beside 'as scored' that says what the fitted rows bought."""
    return proportion(int((cal.oof.argmax(axis=1) == cal.y).sum()), len(cal.y))


@dataclass
class Export:
    """A calibrated policy ready to save or download, and the gate decision behind it."""
    policy: CalibratedPolicy
    gate: GateDecision
    fallback: str

    @property
    def at_gate(self) -> AtGate:
        """The exported rule's numbers on the calibration's rows (an export always records them)."""
        at = self.policy.metrics.at_gate
        assert at is not None, "build_policy records metrics.at_gate"
        return at

    @property
    def flags(self) -> list[run_calibration.GateFlag]:
        """What is wrong with what this gate decides (run_calibration.gate_flags), said before it is saved."""
        return run_calibration.gate_flags(self.at_gate, len(self.policy.options), self.policy.target_accuracy)

    def to_json(self) -> JSONObject:
        """The policy file's JSON (semif-policy/1), as it is saved, downloaded and written by `--out`."""
        return self.policy.model_dump(mode="json")


gate_flags = run_calibration.gate_flags


def option_thresholds(cal: Calibration) -> dict[str, float]:
    """Per-option gates that reached the target (fitted only when asked for)."""
    return {o: float(g.threshold) for o, g in cal.option_gates.items() if g.reachable and g.threshold is not None}


class OtherVersion(ValueError):
    """The run evaluated another version of the policy than the one saved now."""


def export(store: Store, cal: Calibration, *, fallback: str = "human-review",
           hand_gate: float | None = None, policy: Policy | None = None, guard: str | None = None) -> Export:
    """The gate (recommended, hand-set, or everything to the fallback) and the versioned policy file.
    With `policy` (the policy as saved now), a run of another version is refused: its gate was
    measured on another question or other options. `guard`: the steering guard to export with (None: the
    policy's own, else erase-and-check - run_calibration.EXPORT_GUARD; "none" turns it off)."""
    run = store.get_run(cal.run_id)
    if policy is not None and run is not None and not runs.same_version(policy, run):
        raise OtherVersion(f"run #{cal.run_id} evaluated {version_of(run)} of '{policy.get('name')}', which is saved as "
                           f"{version_label(policy.get('version'))} now (its question, options or examples changed): "
                           "evaluate the saved version to export a gate for it")
    gate = run_calibration.decide_gate(cal, hand_gate)
    calibrated = run_calibration.build_policy(store, cal, gate=gate, fallback=fallback,
                                              option_thresholds=option_thresholds(cal), guard=guard)
    if cal.head is None:  # a correction fitted on all rows decides them in sample; beside it, out of fold
        calibrated = with_out_of_fold(cal, calibrated)
    return Export(calibrated, gate, fallback)


def with_out_of_fold(cal: Calibration, policy: CalibratedPolicy) -> CalibratedPolicy:
    """A correction fitted on these rows decides them in sample (marked `in_sample`), and a gate set by hand
    was also set by looking at them. Beside them, `at_gate_out_of_fold`: the same gate
    and fallback on the correction's out-of-fold probabilities (the folds the corrections and heads are
    compared on) - each row decided by a correction that never saw it; what Deploy shows."""
    metrics = policy.metrics
    assert metrics.at_gate is not None, "build_policy records metrics.at_gate"
    out_of_fold = AtGate.model_validate(run_calibration.applied_metrics(policy, cal.results, oof=cal.oof))
    return policy.model_copy(update={"metrics": metrics.model_copy(update={
        "at_gate": metrics.at_gate.model_copy(update={"in_sample": True}), "at_gate_out_of_fold": out_of_fold})})


def model_alone(cal: Calibration) -> tuple[Proportion | None, list[str]]:
    """(accuracy of the model's own answers, before any correction - None when the run kept no
    uncorrected probabilities; the corrections applied while scoring, e.g. ['content-free'])."""
    applied = sorted({resp.scored_as for r in cal.results if (resp := StoredResponse.of(r)) is not None} - {"none"})
    right = 0
    for r, label in zip(cal.results, cal.y):
        probs = runs.scored_probabilities(r, "none")
        if probs is None:
            return None, applied
        right += int(max(range(len(probs)), key=probs.__getitem__) == int(label))
    return proportion(right, len(cal.y)), applied


def save(store: Store, exported: Export) -> int:
    """Keep the calibrated policy for Deploy; returns its id."""
    cid = store.save_calibrated(exported.to_json())
    tracked.calibration(store, exported.to_json(), cid)  # MLflow, when SEMIF_MLFLOW_TRACKING_URI is set (never raises)
    return cid


@dataclass
class Live:
    """An evaluation while it runs: what is scored, the accuracy so far with its interval, and the gate
    the rows so far would recommend (provisional: it moves as rows arrive)."""
    run: Mapping[str, Any]
    done: int
    total: int
    accuracy: Proportion
    gate: str | None

    def text(self) -> str:
        gate = self.gate or "no gate yet: fewer than 4 labeled rows scored"
        return (f"#{self.run['id']} {self.run['target_name']} · {self.done}/{self.total} rows scored · accuracy so far "
                f"{self.accuracy.text()} · {gate}")


def live(store: Store, run_id: int, *, target_accuracy: float = 0.9, stop_at: int | None = None) -> Live:
    """`stop_at`: the row count this session's Stop early asked for (the run's own total is the set's)."""
    run = store.get_run(run_id)
    if run is None:
        raise ValueError(f"no run #{run_id}")
    acc = accuracy_so_far(store, run_id)
    gate = None
    if acc.n >= 4:  # only what the line shows: a gate on the rows as scored (no corrections, heads, folds)
        P, y, _, _ = runs.arrays(store, run_id)
        if len(y) >= 4:
            g = calibration.choose_gate(P.max(axis=1), calibration.predictions(P) == y, target_accuracy)
            gate = "provisional gate on the probabilities as scored (a correction or head may move it): " + g.text()
    total = int(run["n_rows"])
    return Live(run, run.get("done_rows", acc.n), min(total, stop_at) if stop_at else total, acc, gate)


def running(store: Store, policy_id: str, set_id: int) -> list[Run]:
    """The evaluation runs of this policy x set being scored now."""
    return [r for r in runs_of(store, policy_id, set_id) if r["status"] == "running"]

"""From a finished evaluation run to the policy the adapter enforces (no Streamlit).

`calibrate` compares the corrections (temperature, per-option offsets) and the learned heads out of
fold, picks one, and chooses the gate on what it gives: one frozen `Calibration`, computed here and
only displayed by the Calibrate page and `python -m app calibrate` (as scikit-learn's
calibration_curve computes and CalibrationDisplay draws). `build_policy` turns it into the versioned
`semif-policy/1` file; its numbers at the gate come from `gates.measure`, the one way a gate is applied.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Literal, Mapping, Sequence, TypedDict

import numpy as np

from adapter.guard import Guard
from adapter.policy import SCHEMA_VERSION, AtGate, CalibratedPolicy, Decision
from adapter.head import HEAD_KINDS
from adapter.engine.prompt import PROMPT_VERSIONS
from adapter.schema import HEAD_LAYOUT

from app.core import calibration
from app.core import heads as learned
from app.core.heads import HeadFit
from app.core.gates import Gate, GateMetrics, measure
from app.core.runs import arrays, families, hidden_states, is_head_layout, run_config, scored_probabilities, variant_name
from app.core.records import Calibrated, config_of
from app.core import pool_store
from app.core import suggest as ranking
from app.core.review import RANDOM_DRAW, REVIEWED_KEY, state_key

REVIEWED_ROW = re.compile(re.escape(REVIEWED_KEY) + r"\d+")  # the row key append_version gives a reviewed row
from app.core.stats import SMALL_N, PairedGain, Proportion, ProportionJSON, bootstrap_ci, proportion
from app.core.store import Store, now
from app.core.stored import NO_RESPONSE, StoredResponse, first_response

# the steering guard a calibrated policy is exported with unless the analyst turns it off (issue 41: what
# ships had no guard by default, and one added sentence moved 92% of a walkthrough head policy's decisions)
EXPORT_GUARD: Guard = "erase-and-check"


def head_candidates(results: Sequence[Mapping[str, Any]], P: np.ndarray, y: np.ndarray, ids: list[str], *,
                    seed: int = 0) -> list[HeadFit]:
    """The learned heads of a run, out of fold; unavailable (with the reason) where its rows cannot
    support one."""
    hidden, why = hidden_states(results)
    response = first_response(results) or NO_RESPONSE
    sha, version = response.model_sha256, response.prompt_version
    if not sha or not version:
        return [HeadFit(k, False, "the results name no model sha256 and prompt version (not a llama.cpp target)")
                for k in HEAD_KINDS]
    return learned.candidates(hidden, P, y, option_ids=ids, model_sha256=sha, prompt_version=version, seed=seed,
                            no_hidden=why)


class TooFewRows(ValueError):
    """A run with fewer usable labeled results than a calibration needs (a run still being scored, or one
    whose rows failed): typed, so a page tells "still coming" from a real error without reading the text."""

    def __init__(self, run_id: int, n: int, needed: int):
        super().__init__(f"run {run_id} has {n} usable labeled results; at least {needed} are needed")
        self.run_id, self.n, self.needed = run_id, n, needed


@dataclass(frozen=True)
class Calibration:
    """A run's calibration, computed once: the corrections and learned heads compared out of fold, the
    one chosen and why, the metrics before and after it, and the gate on what it gives. A head is judged,
    gated and measured on its out-of-fold probabilities only (on the rows it was fitted on it looks far
    better than it is); a correction's gate is chosen on its probabilities fitted on all rows, as before."""

    run_id: int
    report: calibration.Report
    gate: calibration.Gate
    option_gates: dict[str, calibration.Gate]
    curve: calibration.RiskCoverage  # out of fold: what the gate was chosen on
    option_ids: list[str]
    calibrated: np.ndarray  # the probabilities the gate was chosen on
    oof: np.ndarray  # the chosen correction's or head's out-of-fold probabilities
    P: np.ndarray  # as scored
    y: np.ndarray
    results: list[Any]  # the stored results used, in the order of P and y
    target_accuracy: float
    corrections: list[calibration.Correction]
    correction: calibration.Correction  # the best correction (what is exported when no head is)
    correction_why: str
    heads: list[HeadFit]
    head: HeadFit | None  # the head the export carries, if any
    head_why: str
    head_gain: PairedGain | None
    candidate_intervals: dict[str, CandidateInterval]
    intervals: Intervals
    layout: str = "state-first"  # "policy-first": the head layout, whose letters are never exported alone
    picked: int = 0  # labeled rows added by review (the queue's or a pool's suggestions): chosen, not drawn at random
    drawn: frozenset[int] = frozenset()  # indices (into results) of the pool's random sample (drawn_rows): random_check
    draws: int = 0  # of them, rows the random share drew itself (the others: labeled from the ranking, keyed below)

    @property
    def chosen_name(self) -> str:
        """What the export carries: the learned head's name, else the correction's."""
        return self.head.name if self.head is not None else self.correction.name

    @property
    def candidates(self) -> list[calibration.Correction | HeadFit]:
        return [*self.corrections, *self.heads]

    @property
    def chance(self) -> float:
        return chance(len(self.option_ids))


def chance(n_options: int) -> float:
    """The accuracy of a coin over the options: what a gate's decided rows must beat."""
    return 1 / n_options


def calibrate(store: Store, run_id: int, *, target_accuracy: float = 0.9, per_option: bool = False,
              seed: int = 0, head: str = "auto", with_heads: bool = True) -> Calibration:
    """The calibration of a run. `head`: "auto" (exported only beyond noise), "none", or a kind to
    export; `with_heads=False` fits none (a quick look: the side-by-side table, the numbers while a run
    is scored). ValueError with fewer than 4 usable labeled rows, or a head the rows cannot support."""
    P, y, ids, used = arrays(store, run_id)
    if len(y) < 4:
        raise TooFewRows(run_id, len(y), 4)
    fams = families(used, len(ids)) or {"none": P}
    cands = calibration.corrections(fams, y, seed=seed)
    chosen, why = calibration.choose_correction(cands, len(y))
    layout_run = is_head_layout(store.get_run(run_id) or {})
    fits = head_candidates(used, P, y, ids, seed=seed) if with_heads else []
    assert chosen.oof is not None
    choice = learned.choose(fits, chosen.oof, chosen.name, y, seed=seed, want=head, required=layout_run and with_heads)
    if choice.head is not None:
        rep, oof = calibration.report(P, y, seed=seed, method=f"head:{choice.head.kind}", oof=choice.head.oof)
        cal = oof
    else:
        rep, oof = calibration.report(fams[chosen.family], y, seed=seed, method=chosen.method)
        cal = calibration.apply_temperature(fams[chosen.family], rep.temperature, np.array(rep.offsets))
    rep.accuracy = calibration.accuracy(P, y)  # "all rows, before any gate" means as scored
    rep.confusion = calibration.confusion_matrix(y, calibration.predictions(P), len(ids)).tolist()
    # the gate from evidence: chosen on the out-of-fold probabilities (each row judged by a fit without it)
    conf, correct = oof.max(axis=1), calibration.predictions(oof) == y
    gate = calibration.choose_gate(conf, correct, target_accuracy)
    option_gates = {}
    if per_option:
        option_gates = {ids[c]: g for c, g in calibration.per_option_gates(oof, y, target_accuracy).items()}
    drawn, draws = drawn_rows(store, run_id, used)
    return Calibration(run_id, rep, gate, option_gates, calibration.risk_coverage(conf, correct), ids, cal, oof, P, y,
                       list(used), target_accuracy, cands, chosen, why, fits, choice.head, choice.why, choice.gain,
                       candidate_intervals([*cands, *fits], y, seed=seed), intervals(P, y, oof, seed=seed),
                       HEAD_LAYOUT if layout_run else "state-first",
                       sum(bool(REVIEWED_ROW.fullmatch(str(r.get("row_key") or ""))) for i, r in enumerate(used)
                           if i not in drawn), drawn, draws)


def drawn_rows(store: Store, run_id: int, used: Sequence[Mapping[str, Any]]) -> tuple[frozenset[int], int]:
    """The pool's random sample among a run's used results (indices into `used`), and how many of it were drawn.

    A pool's random share draws the open rows with the smallest random keys (app/core/suggest.draw_keys: from a row's
    place in the pool alone, never its content), so the scored pool rows in key order, up to the first one not in
    the set, are a prefix of a random permutation of the pool: a uniform random sample of it, whoever labeled them
    and how (drawn, ranked, from the review queue, or before draw keys were kept). The sample is read from the pool
    itself, not from the rows' marks: a drawn row shown but left unlabeled ends the sample there (fewer rows, not
    leaning rows), and a row marked drawn by mistake changes nothing. The drawn rows alone are not such a sample:
    they come from the open rows, which the ranking has thinned of hard ones (bench.labels measured them leaning
    high). Only pools the random share drew from (some set row marked picked = "random draw") are read."""
    run = store.get_run(run_id)
    if run is None or not run["labeled_set_id"]:
        return frozenset(), 0
    by_state: dict[str, str] = {}  # a set row's state -> its row key
    drawn: set[str] = set()
    sources: set[int] = set()  # the pool runs the drawn rows came from
    for r in store.labeled_rows(run["labeled_set_id"]):
        by_state.setdefault(state_key(r["state"]), r["row_key"])
        meta = r.get("meta")
        if isinstance(meta, dict) and meta.get("picked") == RANDOM_DRAW:
            drawn.add(r["row_key"])
            if isinstance(src := meta.get("from_run"), int):
                sources.add(src)
    pool_runs: dict[int, set[int]] = {}  # pool id -> those of its runs (each run read once)
    for src in sources:
        got = store.get_run(src)
        if got is not None and isinstance(pool_id := (got.get("config") or {}).get("pool_id"), int):
            pool_runs.setdefault(pool_id, set()).add(src)
    sample: set[str] = set()
    for pool_id, runs_of in pool_runs.items():
        scored = set().union(*(store.done_keys(rid) for rid in runs_of))  # row keys only, not whole results
        rows = [(key, row.state) for row in pool_store.iter_rows(store, pool_id)
                if (key := pool_store.row_key(row)) in scored]  # a row never scored was never offered: not drawn
        keys = ranking.draw_keys([key for key, _ in rows])
        for i in np.argsort(keys, kind="stable"):
            set_key = by_state.get(state_key(rows[int(i)][1]))
            if set_key is None:  # the first pool row not labeled: the sample ends before it
                break
            sample.add(set_key)
    idx = frozenset(i for i, r in enumerate(used) if r.get("row_key") in sample)
    return idx, sum(1 for i in idx if used[i].get("row_key") in drawn)


CHECK_TITLE = "The unbiased check"  # how the check's sentence begins (the page shows it apart; `app check` picks it)


@dataclass(frozen=True)
class RandomCheck:
    """The gate checked on the pool's random sample alone (issue 44; drawn_rows: the rows the random share drew, and
    those labeled from the ranking before the draw reached them): out of fold, as the gate's own evidence, the rows
    it decides among them, how many are right, and the same one-sided Clopper-Pearson lower bound the gate is chosen
    by. Rows chosen for being hard (the ranking, the queue) are harder than the pool, so the evidence on every row
    leans low; a random sample's does not (it is noisier: `small` below SMALL_N rows). `threshold` None: the gate
    decides nothing - then the figures are those of every sampled row (what the model does on them with no gate),
    for the accuracy alone."""
    n: int  # labeled rows of the pool's random sample
    decided: int
    correct: int
    lower_bound: float  # of `correct / decided`, the gate's bound (0 when nothing is decided)
    threshold: float | None
    target: float
    rows: int  # every labeled row the gate was chosen on
    rows_decided: int
    rows_correct: int
    draws: int = 0  # of the n, rows the random share drew itself (0: not said)
    bound: str = calibration.BOUND_NAME

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.decided if self.decided else None

    @property
    def coverage(self) -> float:
        return self.decided / self.n if self.n else 0.0

    @property
    def small(self) -> bool:
        """Fewer than SMALL_N rows under the bound: the decided ones at a gate (the bound is over them), else all."""
        return (self.decided if self.threshold is not None else self.n) < SMALL_N

    def text(self) -> str:
        """The check in one sentence, beside the gate's (the page, the command line, the export's gate notes)."""
        every = (f"on all {self.rows} rows {self.rows_decided} decided, {self.rows_correct} right"
                 + (f" ({self.rows_correct / self.rows_decided:.1%})" if self.rows_decided else ""))
        small = (f" - small (under {SMALL_N} rows under the bound): a wide interval; label more of the drawn rows"
                 if self.small else "")
        lean = ("these rows are a random sample of the pool, not chosen for being hard, so unlike the figures on "
                "every row they do not lean low")
        rows = f"{self.n} labeled row{'' if self.n == 1 else 's'}"
        on = (f"on the pool's random sample ({rows}, {'all ' if self.n > 1 else ''}drawn at random)" if self.draws == self.n
              else f"on the pool's random sample ({rows}: {self.draws} drawn at random, {self.n - self.draws} "
              "labeled otherwise - ranked or reviewed - before the draw reached them)")
        if self.threshold is None:
            verdict = "meets" if self.lower_bound >= self.target else "is below"
            return (f"{CHECK_TITLE}, {on}: the gate decides nothing; with no "
                    f"gate the out-of-fold answer is right on {self.correct} of them ({self.correct / self.n:.1%}), "
                    f"{self.bound} {self.lower_bound:.1%}, which {verdict} the target {self.target:.0%} on these rows "
                    f"alone; {lean}{small}")
        if not self.decided:
            got = f"it decides none of them ({every})"
        else:
            verdict = "meets" if self.lower_bound >= self.target else "is below"
            got = (f"it decides {self.decided} of {self.n} ({self.coverage:.0%}), {self.correct} right "
                   f"({(self.accuracy or 0):.1%}); {self.bound} {self.lower_bound:.1%}, which {verdict} the target "
                   f"{self.target:.0%} on these rows alone ({every})")
        return (f"{CHECK_TITLE}, {on}: at this gate (confidence >= "
                f"{self.threshold:.3f}, out of fold) {got}; {lean}{small}")


def random_check(cal: Calibration, threshold: float | None) -> RandomCheck | None:
    """The gate `threshold` (None: a gate that decides nothing) on the pool's random sample alone (drawn_rows), out
    of fold (the probabilities the gate was chosen on); None when the set has no drawn row."""
    if not cal.drawn:
        return None
    conf, right = cal.oof.max(axis=1), calibration.predictions(cal.oof) == cal.y
    mask = np.zeros(len(cal.y), bool)
    mask[sorted(cal.drawn)] = True
    every = np.ones(len(cal.y), bool) if threshold is None else conf >= threshold
    on = mask & every
    decided, correct = int(on.sum()), int((right & on).sum())
    return RandomCheck(int(mask.sum()), decided, correct, calibration.cp_lower(correct, decided), threshold,
                       cal.target_accuracy, len(cal.y), int(every.sum()) if threshold is not None else 0,
                       int((right & every).sum()) if threshold is not None else 0, cal.draws)


@dataclass(frozen=True)
class CandidateInterval:
    """A candidate's out-of-fold numbers with their 95% intervals: a row of Calibrate's comparison table."""
    accuracy: Proportion
    macro_f1: float
    macro_f1_ci: tuple[float, float] | None
    ece: float
    ece_ci: tuple[float, float] | None


def candidate_intervals(cands: Sequence[Any], y: np.ndarray, *, seed: int = 0) -> dict[str, CandidateInterval]:
    """Per candidate (correction or head, by name): out-of-fold accuracy with its Wilson interval,
    macro-F1 and ECE with bootstrap intervals - what Calibrate's comparison table shows."""
    out: dict[str, CandidateInterval] = {}
    rows = np.arange(len(y))
    for c in cands:
        if not c.available or c.oof is None:
            continue
        pred, k = calibration.predictions(c.oof), c.oof.shape[1]
        conf, right = c.oof.max(axis=1), pred == y
        f1 = bootstrap_ci(rows, lambda i: calibration.macro_f1(y[i], pred[i], k), seed=seed, n_resamples=400)
        ece = bootstrap_ci(rows, lambda i: calibration.ece(conf[i], right[i]), seed=seed, n_resamples=400)
        out[c.name] = CandidateInterval(accuracy=proportion(int(right.sum()), len(y)),
                                        macro_f1=calibration.macro_f1(y, pred, k), macro_f1_ci=f1,
                                        ece=calibration.ece(conf, right), ece_ci=ece)
    return out


class IntervalsJSON(TypedDict):
    """Intervals as the exported policy writes them (metrics.intervals; adapter.policy.Intervals reads it)."""
    n: int
    accuracy: ProportionJSON
    macro_f1: list[float] | None
    ece: list[float] | None
    ece_corrected: list[float] | None


@dataclass(frozen=True)
class Intervals:
    """95% intervals of a run's headline numbers: Wilson for accuracy (as scored), a percentile bootstrap over
    the rows for macro-F1 and the ECE before and after the correction (out of fold); None under 2 rows."""
    n: int
    accuracy: Proportion
    macro_f1: tuple[float, float] | None
    ece: tuple[float, float] | None
    ece_corrected: tuple[float, float] | None

    def to_json(self) -> IntervalsJSON:
        def pair(ci: tuple[float, float] | None) -> list[float] | None:
            return None if ci is None else [ci[0], ci[1]]
        return {"n": self.n, "accuracy": self.accuracy.to_dict(), "macro_f1": pair(self.macro_f1),
                "ece": pair(self.ece), "ece_corrected": pair(self.ece_corrected)}


def intervals(P: np.ndarray, y: np.ndarray, oof: np.ndarray, *, seed: int = 0) -> Intervals:
    """95% intervals of a run's headline numbers: Wilson for accuracy, a percentile bootstrap over the
    rows for macro-F1 and the ECE before and after the correction (out of fold)."""
    pred, k, rows = calibration.predictions(P), P.shape[1], np.arange(len(y))
    conf, correct = P.max(axis=1), pred == y
    oconf, ocorrect = oof.max(axis=1), calibration.predictions(oof) == y

    def boot(stat: Callable[[np.ndarray], float]) -> tuple[float, float] | None:
        return bootstrap_ci(rows, stat, seed=seed)

    return Intervals(n=int(len(y)), accuracy=proportion(int(correct.sum()), len(y)),
                     macro_f1=boot(lambda i: calibration.macro_f1(y[i], pred[i], k)),
                     ece=boot(lambda i: calibration.ece(conf[i], correct[i])),
                     ece_corrected=boot(lambda i: calibration.ece(oconf[i], ocorrect[i])))


@dataclass
class GateDecision:
    """The gate an export gets, and how it was chosen - recorded in the policy file."""
    threshold: float
    source: Literal["recommended", "hand-set", "unreachable"]
    messages: list[str]  # what to tell the analyst, most important first


GateFlag = Literal["no-better-than-chance", "below-target"]


def gate_flags(at_gate: AtGate, n_options: int, target: float | None) -> list[GateFlag]:
    """The two ways a saved gate automates wrong decisions: its decided rows are no better than chance
    (their 95% interval reaches down to it), or surely below the target accuracy (the interval's top is
    under it). Empty when neither holds, or nothing is decided."""
    p = at_gate.accuracy_interval
    if not at_gate.decided or p.rate is None:
        return []
    flags: list[GateFlag] = []
    if p.low is not None and p.low <= chance(n_options):
        flags.append("no-better-than-chance")
    if target is not None and p.high is not None and p.high < target:
        flags.append("below-target")
    return flags


def version_label(version: int | None) -> str:
    """'v3' - a saved version of a policy ('v?' for one made before versions were counted)."""
    return f"v{version}" if version else "v?"


def picked_note(picked: int, n: int, drawn: int = 0) -> str:
    """Why a set grown by review likely measures the policy on harder rows than it will meet: the queue and a pool's
    ranking put the rows the model is least sure of first (a cold start's typical rows aside), so these figures
    lean low (coverage most). `picked` counts reviewed rows not drawn at random; whether a person labeled every
    row offered is not recorded, so the note says 'likely'. `drawn`: the rows a pool's random share drew (the
    check beside the gate reads them)."""
    check = (f"the pool's random sample ({drawn} rows) measures them without that lean (the unbiased check above)" if drawn
             else "a set of rows drawn at random measures them without that lean: a pool's random share draws some "
                  "into every batch (Review, `suggest --random-share`)")
    return (f"{picked} of {n} labeled rows were added by review (the review queue, or pool rows labeled from "
            "their ranking): rows chosen, likely not drawn at random - the queue and the ranking put the model's least "
            f"sure rows first, so the accuracy and coverage measured here likely lean lower than on live traffic; {check}")


def decide_gate(cal: Calibration, manual: float | None = None) -> GateDecision:
    """The threshold decision shared by the page and the CLI: the recommended gate when its out-of-fold
    evidence clears the target (calibration.choose_gate, at any number of rows), a hand-set one when given,
    else "unreachable" - a gate that decides nothing (the adapter sends every case to the fallback, saturated
    probabilities included: CalibratedPolicy.apply's strict rule), with the rows that would make it reachable."""
    rep, gate, target = cal.report, cal.gate, cal.target_accuracy
    notes = []
    if rep.size_flag == "provisional":
        notes.append(f"{rep.n} labeled rows: every figure here has a wide interval (< {calibration.PROVISIONAL} rows)")
    if calibration.at_upper_bound(rep.temperature):
        notes.append(f"the temperature hit its upper bound ({calibration.T_MAX:g}): these probabilities carry almost "
                     "no information about correctness")
    if cal.picked:
        notes.append(picked_note(cal.picked, rep.n, len(cal.drawn)))
    if manual is not None:
        check = random_check(cal, float(manual))
        return GateDecision(float(manual), "hand-set", ([check.text()] if check else []) + notes)
    if gate.reachable and gate.threshold is not None:
        check = random_check(cal, float(gate.threshold))
        return GateDecision(float(gate.threshold), "recommended", [gate.text(), *([check.text()] if check else []), *notes])
    check = random_check(cal, None)
    return GateDecision(1.0, "unreachable", [f"{gate.text()}; the exported policy decides nothing: the adapter sends "
                                             "every case to the fallback", *([check.text()] if check else []), *notes])


# a row of the readout comparison as the page's table shows it (titles): every run has the first six, a
# calibrated one the numbers (Readout.row)
ReadoutRow = TypedDict("ReadoutRow", {
    "run": int, "policy version": str, "target": str, "readout": str, "examples": str | None, "status": str,
    "rows": int | None, "correction": str, "accuracy": float, "macro_f1": float, "ece": float,
    "ece_corrected": float, "nll": float, "accuracy_corrected": float}, total=False)


@dataclass(frozen=True)
class Readout:
    """One eval run in the readout comparison: readout, rows, accuracy, macro-F1, ECE before/after temperature,
    NLL, the best correction (out of fold) - read by attribute; `row()` is the page's table row. `shape`: "run"
    (not calibrated: `status` says why), "head" (a head-layout run: its letters are never offered zero-shot, its
    numbers are its head's, on Calibrate) or "calibrated"."""
    run: int
    policy_version: str
    target: str
    readout: str
    examples: str | None
    status: str
    shape: Literal["run", "head", "calibrated"] = "run"
    rows: int | None = None
    correction: str = ""
    accuracy: float | None = None
    macro_f1: float | None = None
    ece: float | None = None
    ece_corrected: float | None = None
    nll: float | None = None
    accuracy_corrected: float | None = None

    def row(self) -> ReadoutRow:
        """The table's row, its columns titled as the page shows them (and only those this shape has)."""
        base: ReadoutRow = {"run": self.run, "policy version": self.policy_version, "target": self.target,
                            "readout": self.readout, "examples": self.examples, "status": self.status}
        if self.shape == "head":  # with its stored head's out-of-fold accuracy when it was fitted
            head: ReadoutRow = {**base, "rows": self.rows, "correction": self.correction}
            return head if self.accuracy_corrected is None else {**head, "accuracy_corrected": self.accuracy_corrected}
        if self.shape == "calibrated":
            assert self.accuracy is not None and self.macro_f1 is not None and self.ece is not None and \
                self.ece_corrected is not None and self.nll is not None and self.accuracy_corrected is not None
            return {**base, "rows": self.rows, "accuracy": self.accuracy, "macro_f1": self.macro_f1, "ece": self.ece,
                    "ece_corrected": self.ece_corrected, "nll": self.nll, "correction": self.correction,
                    "accuracy_corrected": self.accuracy_corrected}
        return base


def readout_table(store: Store, runs: Sequence[Mapping[str, Any]]) -> list[Readout]:
    """One row per eval run (same policy x set): readout, rows, accuracy, macro-F1, ECE before/after
    temperature, NLL - the side-by-side the analyst picks a readout from."""
    rows: list[Readout] = []
    for r in runs:
        cfg = config_of(r)
        base = Readout(r["id"], version_label((r.get("policy") or {}).get("version")), r["target_name"],
                       variant_name(cfg), cfg.get("examples"), r["status"])
        if is_head_layout(r):  # its letters are never offered zero-shot: its numbers are its head's (Calibrate)
            head = cfg.get("head_oof") or {}  # stored when its head was fitted (app/service/evaluate.remember_head)
            if head.get("n"):
                rows.append(replace(base, shape="head", rows=r.get("done_rows"), correction=f"its {head.get('head')} "
                                    f"only (out of fold, on {head['n']} rows)",
                                    accuracy_corrected=head["correct"] / head["n"]))
            else:
                rows.append(replace(base, shape="head", rows=r.get("done_rows"), correction="a learned head only"))
            continue
        try:
            cal = calibrate(store, r["id"], target_accuracy=0.9, with_heads=False)
            rep = cal.report
        except ValueError as exc:  # not enough usable rows yet
            why = "fewer than 4 labeled rows scored so far" if r["status"] == "running" else str(exc)
            rows.append(replace(base, status=f"{r['status']}: {why}"))
            continue
        rows.append(replace(base, shape="calibrated", rows=rep.n, accuracy=rep.accuracy, macro_f1=rep.macro_f1,
                            ece=rep.ece_width, ece_corrected=rep.oof_ece_width, nll=rep.nll,
                            correction=cal.correction.name, accuracy_corrected=cal.correction.oof_accuracy))
    return rows


def build_policy(store: Store, cal: Calibration, *, gate: GateDecision, fallback: str,
                 option_thresholds: dict[str, float] | None = None, guard: str | None = None) -> CalibratedPolicy:
    """The versioned policy config for this calibration and gate (validated by adapter.policy),
    with how the gate was chosen: the target accuracy is recorded only when it chose the gate. Its steering
    guard: `guard` when the analyst chose one ("none" turns it off), else the policy's own, else
    EXPORT_GUARD - a calibrated policy ships guarded unless the analyst says otherwise."""
    run: Mapping[str, Any] = store.get_run(cal.run_id) or {}
    cfg = run_config(run)
    evaluated = cfg.evaluated_policy
    first, response = next(((r, s) for r in cal.results if (s := StoredResponse.of(r)) is not None
                            and s.model is not None), (None, None))
    if first is None or response is None or response.model is None:
        raise ValueError("no stored result names its model (file + sha256): run the evaluation on a llama.cpp target")
    readout = cfg.readout or response.readout
    chosen, head = cal.correction, cal.head
    # a head reads the probabilities as scored; a correction the family it was fitted on
    debias = response.scored_as if head is not None else chosen.family
    config: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "policy_id": evaluated["id"], "name": evaluated.get("name", ""),
        "layout": cfg.layout or "state-first",
        "policy_version": (run.get("policy") or {}).get("version"),
        "question": evaluated["question"], "options": evaluated["options"], "examples": evaluated.get("examples") or [],
        "readout": readout, "debias": debias, "permute": cfg.permute,
        "few_shot": (first.get("request") or {}).get("few_shot") if isinstance(first.get("request"), dict) else None,
        "guard": guard or evaluated.get("guard") or EXPORT_GUARD,
        "prompt_version": response.prompt_version or PROMPT_VERSIONS[readout or ""],
        "model": {"file": response.model.file, "sha256": response.model.sha256},
        "temperature": cal.report.temperature, "threshold": gate.threshold, "gate_source": gate.source,
        "option_offsets": ({oid: b for oid, b in zip(cal.option_ids, chosen.offsets)}
                           if chosen.method == "fitted" and head is None else {}),
        "head": head.head.model_dump() if head is not None and head.head is not None else None,
        "option_thresholds": option_thresholds or {}, "fallback_option": fallback,
        "target_accuracy": None if gate.source == "hand-set" else cal.target_accuracy,
        "run_id": cal.run_id, "created_at": now(),
        "dataset": {"set_id": run["labeled_set_id"], "name": cfg.dataset_name, "content_hash": cfg.dataset_hash,
                    "rows_scored": len(cal.results)},
    }
    policy = CalibratedPolicy.model_validate(config)
    fitted = applied_metrics(policy, cal.results)
    config["metrics"] = {"at_gate": fitted if head is None else applied_metrics(policy, cal.results, oof=cal.oof),
                         **({"at_gate_fitted_rows": fitted} if head is not None else {}),
                         "intervals": cal.intervals.to_json(),
                         "gate_selection": cal.gate.to_dict(),
                         "gate_notes": list(gate.messages),
                         **({"option_gate_selection": {o: g.to_dict() for o, g in cal.option_gates.items()}}
                            if cal.option_gates else {}),
                         "correction": {"chosen": cal.chosen_name, "why": cal.correction_why,
                                        "candidates": [{k: v for k, v in c.to_dict().items() if k != "oof_confusion"}
                                                       for c in cal.corrections]},
                         "head": {"why": cal.head_why, "candidates": [f.to_dict() for f in cal.heads],
                                  "gain": asdict(cal.head_gain) if cal.head_gain is not None else None},
                         **{k: v for k, v in asdict(cal.report).items() if k not in ("bins_before", "bins_after")}}
    return CalibratedPolicy.model_validate(config)


class AtGateFigures(TypedDict):
    """A gate's numbers on a calibration's rows (at_gate): written into the exported policy's metrics and
    read by key wherever they are shown."""
    n: int
    decided: int
    gated: int
    coverage: float | None
    accuracy: float | None
    correct: int
    accuracy_interval: ProportionJSON
    coverage_interval: ProportionJSON
    small_n: bool


def at_gate(metrics: GateMetrics) -> AtGateFigures:
    """A gate's numbers on a calibration's rows as the export records them: coverage and the accuracy of
    what it decides, each with its Wilson 95% interval, and `small_n` when fewer than 30 rows are decided
    (an accuracy that rests on a handful of rows is marked as such wherever it is shown)."""
    decided, accuracy = metrics.coverage, metrics.gate_accuracy
    return {"n": metrics.n, "decided": decided.k, "gated": metrics.n - decided.k, "coverage": decided.rate,
            "accuracy": accuracy.rate, "correct": accuracy.k, "accuracy_interval": accuracy.to_dict(),
            "coverage_interval": decided.to_dict(), "small_n": accuracy.n < SMALL_N}


def applied_metrics(policy: CalibratedPolicy, results: Sequence[Mapping[str, Any]],
                    oof: np.ndarray | None = None) -> AtGateFigures:
    """The exported rule applied to stored raw results (gates.measure, the one way a gate is applied).
    With `oof` (a head's out-of-fold probabilities, one row per result) the same gate and fallback
    decide on those instead: what the head does on rows it never saw."""
    return at_gate(measure(results, Gate(policy=policy), probabilities=None if oof is None else list(oof)))


def gate_preview(calibrated: Sequence[Calibrated], policy_id: str,
                 result: Mapping[str, Any]) -> tuple[Calibrated, Decision] | None:
    """What the newest saved calibrated policy of this policy would do with a result: (its record,
    its decision) - only when it was calibrated on the model
    that answered and its readout and correction can be read from the result; None otherwise."""
    response = StoredResponse.of(result) or NO_RESPONSE
    for rec in calibrated:
        if rec.get("policy_id") != policy_id or rec.get("model_sha256") != response.model_sha256:
            continue
        policy = CalibratedPolicy.model_validate(rec["config"])
        probs = scored_probabilities(result, policy.debias)
        if probs is None or response.readout != policy.readout or not policy.matches(result["option_ids"]):
            return None
        return rec, policy.apply(response.reading(result["option_ids"], probs))
    return None

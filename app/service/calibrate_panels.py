"""The Calibrate page's panels as display objects: each builder computes what one panel shows (texts,
numbers, frames, chart inputs) from a calibration and its export, and the page only lays the fields out.
Also the words of the gate flags and of a gate that decides nothing (said before a policy is saved)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from adapter.head import KIND_WORDS
from adapter.guard import GUARDS
from adapter.policy import AtGate

from app.core import calibration, heads, run_calibration
from app.core.records import LabeledSet
from app.core.run_calibration import CHECK_TITLE, Calibration, GateFlag, chance, version_label
from app.core.stats import interval_text, range_text
from app.core.store import Store
from app.service import checks, review
from app.service.display import Cell, Column, Escape, Kind, Metric, Note, plain
from app.service.evaluate import Export, chosen_accuracy, head_title, model_alone

BANNER: dict[str, Kind] = {"recommended": "success", "hand-set": "info", "unreachable": "error"}


def flag_text(flag: GateFlag, at_gate: AtGate, n_options: int, target: float | None) -> str:
    """A gate flag in words, with the numbers behind it (a flag is raised only on a measured interval)."""
    p = at_gate.accuracy_interval
    if flag == "no-better-than-chance":
        return (f"The rows this gate decides are right {p.rate or 0:.0%} of the time (95% CI {p.low or 0:.0%}–"
                f"{p.high or 0:.0%}, n={p.n}): no better than chance ({chance(n_options):.0%} with {n_options} "
                "options). Deployed, it would decide these rows about as well as a coin - raise the gate, or improve "
                "the policy or the model first.")
    return f"Even the top of the interval ({p.high or 0:.0%}) is below the target accuracy of {target or 0:.0%}."


def nothing_decided(at_gate: AtGate, fallback: str) -> str | None:
    """What a gate that decides none of the rows means, said before anyone saves it (saving stays
    allowed: sending everything to the fallback is safe); None when the gate decides some rows."""
    if at_gate.decided:
        return None
    return (f"This gate decides none of the {at_gate.n} rows: saved as it is, the adapter sends every decision "
            f"to {fallback}. That is safe - nothing is decided wrongly - but it automates nothing. Set a lower "
            "gate by hand, or score more labeled rows, another readout or another model.")


def warnings(exported: Export) -> list[str]:
    """The export's gate flags in words (it can still be saved)."""
    n, target = len(exported.policy.options), exported.policy.target_accuracy
    return [flag_text(f, exported.at_gate, n, target) for f in exported.flags]


@dataclass(frozen=True)
class GateSlider:
    """The hand-set gate's slider: where it starts and the range of the confidences it can cut."""
    start: float
    help: str


def gate_slider(cal: Calibration) -> GateSlider:
    top = np.asarray(cal.calibrated).max(axis=1)
    return GateSlider(float(cal.gate.threshold or 0.5), f"the calibrated confidences of the scored rows lie between "
                                                       f"{top.min():.3f} and {top.max():.3f}")


@dataclass(frozen=True)
class GatePanel:
    """The gate and what it does: the gate's banner and notes, three rows of three columns of figures
    (what the gate decides; the model and the head; calibration), a note on a head's fitted rows, and
    what is wrong with saving it (still allowed)."""
    alerts: tuple[Note, ...]
    decided: tuple[Column, ...]
    fitted: str | None
    quality: tuple[Column, ...]
    calibration: tuple[Column, ...]
    problems: tuple[Note, ...]


def gate_panel(cal: Calibration, exported: Export, esc: Escape = plain) -> GatePanel:
    gate, fallback = exported.gate, exported.fallback
    hand = gate.source == "hand-set"
    # which export the banner is about: the page may show another candidate's gate just above (Export this)
    whose = esc(f"Run #{cal.run_id} with {cal.chosen_name} (what Save for deployment below exports): ")
    banner = whose + (esc(gate.messages[0]) if gate.messages and not hand else f"Gate set by hand: {gate.threshold:.3f}")
    alerts = (Note(BANNER[gate.source], banner),
              *(Note("info" if n.startswith(CHECK_TITLE) else "warning", esc(n))  # the check: a finding, not a warning
                for n in (gate.messages if hand else gate.messages[1:])))
    nothing = nothing_decided(exported.at_gate, fallback)
    problems = ((Note("warning", esc(nothing)),) if nothing else ()) + tuple(Note("error", esc(p))
                                                                           for p in warnings(exported))
    return GatePanel(alerts, decided_columns(exported, esc), fitted_rows(exported.policy.metrics.at_gate_fitted_rows),
                     quality_columns(cal, esc),
                     calibration_columns(cal), problems)


def decided_columns(exported: Export, esc: Escape) -> tuple[Column, ...]:
    """Accuracy of the decided rows (and, for a hand-set gate, out of fold), coverage, the fallback's share."""
    at = exported.at_gate
    accuracy: list[Cell] = [
        Metric("Accuracy of decided rows" + (" (in sample)" if at.in_sample else ""),
               "n/a" if at.accuracy is None else f"{at.accuracy:.1%}",
               "among the rows the gate lets through (the rest go to the fallback)"),
        Note("caption", esc(interval_text(at.accuracy_interval)))]
    if oof := exported.policy.metrics.at_gate_out_of_fold:
        accuracy += [Metric("Accuracy of decided rows (out of fold)", "n/a" if oof.accuracy is None else
                            f"{oof.accuracy:.1%}", "the same gate and fallback, each row decided by a correction "
                            "fitted without it (the folds the corrections and heads are compared on): expect this on "
                            "new rows"),
                     Note("caption", esc(interval_text(oof.accuracy_interval))
                          + (" · the gate was set by hand on these rows, so the figure above is in sample"
                             if exported.gate.source == "hand-set" else " · the correction was fitted on these rows, "
                             "so the figure above is in sample"))]
    if at.small_n and at.decided:
        accuracy.append(Note("warning", f"Only {at.decided} decided rows: this accuracy is a hint, not a "
                                        "measurement - score more labeled rows before trusting it."))
    coverage = (Metric("Coverage", "n/a" if at.coverage is None else f"{at.coverage:.1%}",
                       f"rows decided: {at.decided} of {at.n}"),
                Note("caption", esc(interval_text(at.coverage_interval))))
    return tuple(accuracy), coverage, (Metric("To the fallback", f"{at.gated} rows", f"sent to {esc(exported.fallback)}"),)


def fitted_rows(fitted: AtGate | None) -> str | None:
    """With a learned head (its figures on the rows it was fitted on, `metrics.at_gate_fitted_rows`): the
    figures are out of fold, and what the exported head does on its own rows."""
    if fitted is None:
        return None
    on_fitted = (f"decides {fitted.decided} of them with {fitted.accuracy:.1%} accuracy - optimistic, since "
                 "it saw them; expect the out-of-fold figures on new rows" if fitted.decided and
                 fitted.accuracy is not None else "decides none of them at this gate either")
    return (f"With a learned head these numbers are out of fold: each row decided by a head that never saw it, "
            f"at this gate. The exported head, fitted on all {fitted.n} rows, {on_fitted}.")


def quality_columns(cal: Calibration, esc: Escape) -> tuple[Column, ...]:
    """The model alone, macro-F1 as scored, and the exported head's accuracy (or the temperature)."""
    rep, iv = cal.report, cal.intervals
    f1 = (Metric("Macro-F1 as scored", f"{rep.macro_f1:.2f}"),
          Note("caption", range_text(iv.macro_f1, "{:.2f}", rep.n)))
    if cal.head is not None:
        acc = chosen_accuracy(cal)
        third: Column = (
            Metric(f"Accuracy with {head_title(cal)} (out of fold)", f"{acc.rate:.1%}",
                   f"{cal.head.name}, every row predicted by a head that never saw it, before any gate; L2 strength C "
                   "chosen by inner cross-validation per fold: " + ", ".join(f"{c:g}" for c in cal.head.fold_regularisation)),
            Note("caption", esc(interval_text(acc.to_dict()))))
    else:
        third = (Metric("Temperature", f"{rep.temperature:.2f}", "the exported correction's temperature"
                        + (" (with fitted per-option offsets)" if rep.method == "fitted" else "")),)
    return alone_column(cal, esc), f1, third


def alone_column(cal: Calibration, esc: Escape) -> Column:
    """The model's own accuracy, uncorrected; a correction applied while scoring is named with its own figure."""
    alone, applied = model_alone(cal)
    rep, iv = cal.report, cal.intervals
    if cal.layout == "policy-first":
        return (Metric("Letters as scored in the head layout (never shipped alone)", f"{rep.accuracy:.1%}",
                       f"the head layout puts the state last, which only a learned head reads well: these letters "
                       f"are shown for reference, never exported without the head; n = {rep.n}; chance = "
                       f"{cal.chance:.0%}"),
                Note("caption", esc(interval_text(iv.accuracy))))
    if alone is not None and applied:
        return (Metric("Accuracy, model alone (uncorrected)", f"{alone.rate or 0:.1%}",
                       f"top option = label, before any correction, head or gate; chance = {cal.chance:.0%}"),
                Note("caption", esc(alone.text()) + f" · as scored, with the {esc(', '.join(applied))} correction: "
                                                    f"{rep.accuracy:.1%}"))
    title = "Accuracy, model alone (uncorrected)" if not applied else f"Accuracy as scored (with {', '.join(applied)})"
    return (Metric(title, f"{rep.accuracy:.1%}", f"top option = label, before any gate; n = {rep.n}; chance = "
                                                 f"{cal.chance:.0%}"),
            Note("caption", esc(interval_text(iv.accuracy))))


def calibration_columns(cal: Calibration) -> tuple[Column, ...]:
    """Expected calibration error before and after the correction, Brier and NLL."""
    rep, iv = cal.report, cal.intervals
    return ((Metric("ECE raw", f"{rep.ece_width:.3f}", f"equal-mass bins: {rep.ece_mass:.3f}"),
             Note("caption", range_text(iv.ece, n=rep.n))),
            (Metric("ECE corrected", f"{rep.oof_ece_width:.3f}", f"out of fold, after {cal.chosen_name}; "
                                                                 f"equal-mass bins: {rep.oof_ece_mass:.3f}"),
             Note("caption", range_text(iv.ece_corrected, n=rep.n))),
            (Metric("Brier / NLL", f"{rep.brier:.3f} / {rep.nll:.3f}"),))


@dataclass(frozen=True)
class CoveragePanel:
    """The risk-coverage curve, the gate on it, the lower bound a recommended gate must clear, and (when
    the curve reaches the target but no gate is recommended) why, with the rows it would need."""
    curve: calibration.RiskCoverage
    threshold: float | None
    target: float
    lower: tuple[float, ...]
    note: str | None


def coverage_panel(cal: Calibration, threshold: float | None) -> CoveragePanel:
    lower = tuple(float(v) for v in calibration.lower_bound_curve(cal.curve))
    return CoveragePanel(cal.curve, threshold, cal.target_accuracy, lower, coverage_note(cal))


def coverage_note(cal: Calibration) -> str | None:
    """Why no gate is recommended, with the labeled rows that would make the target reachable at the accuracy
    measured (the gate's own numbers: calibration.choose_gate, the same the command line and the export
    give); None when a gate is recommended."""
    gate, target = cal.gate, cal.target_accuracy
    if gate.reachable:
        return None
    reach = gate.reach
    if reach is None:
        return (f"No gate's decided rows beat {target:.0%} out of fold, even before the lower bound: more rows at "
                "this accuracy would not help - improve the policy, the readout or the model.")
    return (f"At {reach.coverage:.0%} coverage the decided rows are {reach.accuracy:.0%} right out of fold - above "
            f"the target {target:.0%} - but on {reach.rows} rows their lower bound (dashed: one-sided 95% "
            f"Clopper-Pearson) is below it: about {reach.more} more labeled rows ({reach.needed} in all) at this "
            f"accuracy would let a gate be recommended, deciding about {reach.coverage:.0%} of rows.")


def option_gate_rows(cal: Calibration) -> list[dict[str, Any]]:
    """Per-option gates as table rows: the threshold, its out-of-fold evidence and, unreachable, the rows it needs."""
    return [{"option": o, "threshold": g.threshold, "recommended": g.reachable, "decided": g.decided, "right": g.correct,
             "lower bound (95% CP)": g.lower_bound, "evidence": g.text()} for o, g in cal.option_gates.items()]


class Saved(NamedTuple):
    """A calibrated policy just saved: what the note after Save says it does once deployed. A tuple
    whose first item is the id: the Deploy page preselects it (`cal_saved[0]`)."""
    id: int
    policy_id: str
    threshold: float | None
    fallback: str
    head: str | None
    run_id: int | None = None  # the run it was calibrated from: the note shows under that run only
    version: int | None = None  # the policy version it carries

    def text(self, esc: Escape = plain) -> str:
        head_text = f"its learned head ({self.head}) decides every row, and " if self.head else ""
        gate_text = ("no gate is set" if self.threshold is None else
                     f"confidence below **{self.threshold:.3f}** → **{esc(self.fallback)}**")
        of = (f" ({version_label(self.version)}, from run #{self.run_id})" if self.run_id is not None else "")
        return (f"Saved as calibrated policy #{self.id}{of}. Next: on the **Deploy** page pick it; Deploy packages it into "
                f"model.tar.gz and the adapter enforces it: {head_text}{gate_text}, "
                "and any other model than the calibrated one → the fallback too.")


def saved(cid: int, cal: Calibration, exported: Export) -> Saved:
    return Saved(cid, exported.policy.policy_id, exported.gate.threshold, exported.fallback, head_title(cal),
                 cal.run_id, exported.policy.policy_version)


def narrowing(store: Store, cal: Calibration, exported: Export) -> str | None:
    """For a set version made by the review queue: the accuracy at this gate on the parent version and on
    this one, with how much the 95% interval narrowed (a learned head: out of fold); None otherwise."""
    change = review.narrowing(store, cal.run_id, exported.policy, cal)
    if change is None:
        return None
    before_run, before, after = change
    width = [p.high - p.low for p in (before, after) if p.rate is not None and p.high is not None and p.low is not None]
    narrowed = f": the interval went from {width[0]:.1%} to {width[1]:.1%} wide" if len(width) == 2 else ""
    oof = " (out of fold: the head never decides a row it was fitted on)" if exported.policy.head is not None else ""
    return (f"Accuracy of the decided rows at this gate{oof}, set #{before_run['labeled_set_id']} "
            f"(run #{before_run['id']}): {before.text()} → this set: {after.text()}{narrowed}.")


@dataclass(frozen=True)
class CorrectionPanel:
    """Which correction or learned head the export carries and why, every candidate out of fold (a table
    to show and download, bars with intervals), and the confusion before and after."""
    title: str
    why: str
    head_why: Note
    rows: tuple[dict[str, Any], ...]
    number_columns: tuple[str, ...]
    bars: tuple[dict[str, Any], ...]
    bars_title: str
    chance: float
    confusion: list[list[int]]
    confusion_after: list[list[int]]
    after_title: str
    option_ids: tuple[str, ...]


def correction_panel(cal: Calibration, esc: Escape = plain) -> CorrectionPanel:
    name = cal.chosen_name
    title = (f"**Exported: {esc(name)}** (it replaces the correction; the best correction without a head was "
             f"{esc(cal.correction.name)})" if cal.head is not None else f"**Correction: {esc(name)}**")
    return CorrectionPanel(
        title, esc(cal.correction_why), Note("success" if cal.head is not None else "info", esc(cal.head_why)),
        tuple(candidate_rows(cal)), ("accuracy (out of fold)", "NLL (out of fold)", "ECE (out of fold)",
                                     "macro-F1 (out of fold)", "temperature"),
        tuple(candidate_bars(cal)), "Accuracy out of fold, with 95% intervals (dotted: chance)", cal.chance,
        cal.report.confusion, cal.report.oof_confusion, f"After {name} (out of fold)", tuple(cal.option_ids))


@dataclass(frozen=True)
class CandidateRow:
    """One correction or learned head in Calibrate's comparison, out of fold, with its intervals in words."""
    candidate: str
    kind: str  # "correction" | "learned head"
    reads: str
    accuracy: float | None  # None: unavailable (`note` says why)
    accuracy_ci: str
    macro_f1: float | None
    macro_f1_ci: str
    ece: float | None
    ece_ci: str
    nll: float | None
    temperature: float | None
    detail: str  # a correction's offsets, a head's regularisation per fold
    chosen: bool
    note: str


# the comparison's column titles (the page's table and its CSV), one per CandidateRow field, in order
CANDIDATE_TITLES = {"candidate": "candidate", "kind": "kind", "reads": "reads", "accuracy": "accuracy (out of fold)",
                    "accuracy_ci": "accuracy 95% CI", "macro_f1": "macro-F1 (out of fold)",
                    "macro_f1_ci": "macro-F1 95% CI", "ece": "ECE (out of fold)", "ece_ci": "ECE 95% CI",
                    "nll": "NLL (out of fold)", "temperature": "temperature", "detail": "offsets / regularisation",
                    "chosen": "chosen", "note": "note"}


def candidate_table(cal: Calibration) -> list[CandidateRow]:
    """Every correction and learned head, out of fold, with intervals - the comparison Calibrate shows and
    the command prints."""
    rows = []
    for c in cal.candidates:
        ci = cal.candidate_intervals.get(c.name)
        f1_ci, ece_ci = (ci.macro_f1_ci, ci.ece_ci) if ci is not None else (None, None)
        if isinstance(c, heads.HeadFit):
            kind, reads = "learned head", KIND_WORDS[c.kind].reads
            detail, temperature = ", ".join(f"C={r:g}" for r in c.fold_regularisation), None
        else:
            kind, reads = "correction", f"{c.family} scores"
            detail = (", ".join(f"{o} {b:+.2f}" for o, b in zip(cal.option_ids, c.offsets))
                      if c.method == "fitted" and c.available else "")
            temperature = c.temperature if c.available else None
        rows.append(CandidateRow(
            c.name, kind, reads, c.oof_accuracy if c.available else None,
            interval_text(ci.accuracy) if ci is not None else "",
            ci.macro_f1 if ci is not None and c.available else None, range_text(f1_ci, "{:.2f}") if f1_ci else "",
            c.oof_ece if c.available else None, range_text(ece_ci) if ece_ci else "",
            c.oof_nll if c.available else None, temperature, detail, c.name == cal.chosen_name, c.note))
    return rows


def table(rows: list[CandidateRow]) -> list[dict[str, Any]]:
    """The comparison with its column titles: the page's table and its CSV download."""
    return [{title: getattr(r, name) for name, title in CANDIDATE_TITLES.items()} for r in rows]


def candidate_rows(cal: Calibration) -> list[dict[str, Any]]:
    """The comparison as the page shows it and lets the analyst download (titles: CANDIDATE_TITLES)."""
    return table(candidate_table(cal))


def candidate_bars(cal: Calibration) -> list[dict[str, Any]]:
    """{label, rate, low, high, n} per available candidate, for the accuracy chart."""
    bars = []
    for c in cal.candidates:
        acc = ci.accuracy if (ci := cal.candidate_intervals.get(c.name)) else None
        if acc is not None and acc.rate is not None:
            bars.append({"label": c.name + (" ✓" if c.name == cal.chosen_name else ""), "rate": acc.rate,
                         "low": acc.low, "high": acc.high, "n": acc.n})
    return bars



def support_caption(set_id: int, support: Mapping[str, Any], timing: str, esc: Escape = plain) -> str:
    """What a set can support, said before anything is scored: the rows to score (of the set, when Stop
    early caps them), per option, the train rows never scored, and how long scoring takes (`timing`)."""
    per = ", ".join(f"{n} {o}" for o, n in support["per_option"].items())
    whole = support["scored"] == support["total"]
    rows = (f"{support['scored']} rows to score" if whole else
            f"{support['scored']} of {support['total']} rows to score (Stop early)")
    per = per if whole else f"about {per}"  # the first rows keep each label's share
    # no brackets around the counts: the timing after them has its own, and "(about yes 15, no 15)" beside
    # "(Stop early)" read as brackets in brackets
    return (f"Set #{set_id}: {rows} - {per}" + (f"; {support['train']} train rows never scored" if support["train"] else "")
            + " · " + esc(timing))


def outcome_notes(status: str, error: str | None, stopped: str, outcomes: list[Any],
                  esc: Escape = plain) -> tuple[Note, ...]:
    """An evaluation once it is over: its failure or stop, then what each target x readout did."""
    head = ((Note("error", f"**Evaluation**: {esc(error)}"),) if status == "failed" else
            (Note("info", esc(stopped)),) if status == "stopped" else ())
    return head + tuple(Note("error" if o.error else "caption", esc(o.text())) for o in outcomes)


def sets_rows(sets: Sequence[LabeledSet]) -> list[dict[str, str | int]]:
    """The stored sets as the Calibrate page lists them: words for headers (not the store's column names), the
    hash cut to the 10 characters the set pickers show, the version a set was made from, the time to the minute."""
    return [{"set": f"#{s['id']}", "name": s["name"], "labels of": s["policy_id"] or "", "rows": s["n_rows"],
             "version of": f"#{s['parent_id']}" if s.get("parent_id") else "", "content hash": s["content_hash"][:10],
             "imported": str(s["created_at"])[:16].replace("T", " ")} for s in sets]


def run_label(row: run_calibration.Readout) -> str:
    """'#12 · v3 · local · letters · accuracy 91.2%' - an evaluation run in the picker."""
    return (f"#{row.run} · {row.policy_version} · {row.target} · {row.readout}"
            + (f" · accuracy {row.accuracy:.1%}" if row.accuracy is not None else ""))


@dataclass(frozen=True)
class GuardChoice:
    """The Calibrate page's steering-guard control: the guards, the one preselected (the policy's own,
    else erase-and-check: a calibrated policy ships guarded unless the analyst turns it off), its help."""
    options: list[str]
    index: int
    help: str


def guard_choice(policy: Mapping[str, Any]) -> GuardChoice:
    default = str(policy.get("guard") or "") or run_calibration.EXPORT_GUARD
    return GuardChoice(list(GUARDS), list(GUARDS).index(default) if default in GUARDS else GUARDS.index("erase-and-check"),
                       "the steering guard the exported policy runs on the rows its gate would decide: precheck (an "
                       "option named as the decision, no model pass) or erase-and-check (the precheck, then the state "
                       "scored again with pieces and the spans naming its answer left out); a suspected row goes to "
                       "the fallback. none turns it off.")


def guard_cost_note(store: Store, exported: Export, esc: Escape = plain) -> str:
    """What the exported policy's guard holds and costs - or, turned off, what that costs - from the newest
    as-deployed Robustness check of a calibrated policy of this policy (checks.guard_cost), as one note: the guard's
    name in bold, the rest through `esc` (the page escaped the whole note before, so the bold showed as '**')."""
    guard = exported.policy.guard
    head = (f"Steering guard **{esc(guard)}**" + (" - turned off. What that costs: " if guard == "none" else
                                                  " (the export's default unless turned off). What it holds and costs: "))
    return head + esc(" ".join(line.strip() for line in checks.guard_cost(store, exported.policy.policy_id)))

"""The Compare page's verdict as a display object: what a saved comparison's figures rest on, the
accuracy per target, targets that are not really deciding, the two-target agreement, the failed calls -
built from decide.Comparison here, laid out by the page."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from app.core.costs import PRICE_SOURCE
from app.service.decide import Comparison
from app.service.display import Escape, Metric, plain

LATENCY_NOTE = ("Latency over warm calls; a target's first call on a policy in this workbench process is cold (the "
                "policy's first pass and, with the content-free correction, its prior's three passes; for a remote "
                "target also the connection; a local model's load is not timed) and shown apart as the first call. "
                "Local targets show decisions per second on this machine instead of a price. "
                f"Prices: {PRICE_SOURCE}.")


@dataclass(frozen=True)
class TargetAccuracy:
    """One target's accuracy against the labels, its hover help and the line under it."""
    metric: Metric
    caption: str


@dataclass(frozen=True)
class CompareVerdict:
    """What the page says about a comparison before its tables and charts."""
    stopped: str | None  # a warning: the figures rest on the states answered before the stop
    reused: str | None  # a caption: rows copied from stored results
    degenerate: tuple[str, ...]  # warnings: a target answering one option for most states
    accuracy_title: str | None  # None without labels
    accuracy: tuple[TargetAccuracy, ...]
    same_top: Metric | None  # two targets: the share of states with the same top option
    failed: str | None  # an error line: how many calls failed, one example
    disagreements: int
    wrong: int
    labeled: bool


def verdict(shown: Comparison, esc: Escape = plain) -> CompareVerdict:
    stopped = (f"**{shown.stopped.capitalize()}**: every figure below rests on those states only. Labeled states "
               "are scored in stratified order, so the first ones keep every label's share.") if shown.stopped else None
    reused = (f"{shown.reused} of {len(shown.results)} rows were reused from stored results of the same model and "
              "request (an evaluation's, an earlier comparison's): the same answer, no call made - their latency "
              "is not measured again and is left out of the latency figures.") if shown.reused else None
    degenerate = tuple(f"**{esc(d['target'])}** answered **{esc(d['option'])}** for {d['share']:.0%} of {d['n']} "
                       "states: it is not really deciding - check its readout, or use another model."
                       for d in shown.degenerate)
    accuracy = tuple(TargetAccuracy(
        Metric(esc(row["target"]), f"{row['accuracy']:.1%}",
               f"{row['correct']} of {row['labeled']} labeled rows right, {row['wrong']} wrong; "
               f"95% interval {row['ci_low']:.1%}-{row['ci_high']:.1%} (Wilson)"),
        f"n = {row['labeled']} · 95% CI {row['ci_low']:.0%}–{row['ci_high']:.0%} · {row['wrong']} wrong")
        for _, row in shown.accuracy.iterrows())
    title = ("Accuracy against the labels" + (f" ({shown.stopped})" if shown.stopped else "")) if accuracy else None
    table, errors = shown.answers, shown.results[shown.results["error"].notna()]
    failed = (f"{len(errors)} calls failed, e.g. {esc(errors['target'].iloc[0])}: {esc(errors['error'].iloc[0])}"
              if len(errors) else None)
    return CompareVerdict(stopped, reused, degenerate, title, accuracy, same_top(shown, esc), failed,
                          int(table["disagree"].sum()), int(table["wrong"].sum()), bool(table["label"].notna().any()))


def same_top(shown: Comparison, esc: Escape = plain) -> Metric | None:
    """Two targets: the share of the states both answered where they gave the same top option."""
    agree = shown.agreement
    if agree.shape != (2, 2):
        return None
    share = agree.iloc[0, 1]
    return Metric("Same top option", "n/a" if pd.isna(share) else f"{share:.0%} of states",
                  f"{esc(agree.index[0])} vs {esc(agree.columns[1])}, on the states both answered")


def answer_rows(shown: Comparison, only_disagreements: bool, only_wrong: bool) -> pd.DataFrame:
    """The answers per state the analyst asked for; without labels, no label and wrong columns (a column
    of unchecked boxes that means nothing)."""
    table = shown.answers
    rows = table[table["disagree"]] if only_disagreements else table
    rows = rows[rows["wrong"]] if only_wrong else rows
    if not table["label"].notna().any():
        rows = rows.drop(columns=[c for c in ("label", "wrong") if c in rows.columns])
    return rows

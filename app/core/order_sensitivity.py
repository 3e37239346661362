"""Order-sensitivity diagnostics (no Streamlit): does the order of the options change the answer?

Each state is scored once per cyclic rotation of the policy's options (every option visits every
position once). From the stored results we compute how often the top option flips, which display
positions get chosen against where the labels sat, how far each option's probability moves, and
for yes/no policies given a negated question whether P(yes | Q) + P(yes | not Q) is near 1.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence, TypedDict

from dataclasses import dataclass

import numpy as np
import pandas as pd

from adapter.engine.prompt import rotations
from adapter.schema import DecisionRequest
from adapter.engine.templates import request_for

from app.core.runner import Case
from app.core.stored import StoredResponse

ROTATION_SEP = "#rot"
NEGATED_SEP = "#not"
# when a check is worth acting on - the order check and the robustness check read these, nothing else
FLIP_WORRY = 0.10  # the answer changes (order, rewording, an extra option) in this share of states or more
NEGATION_GAP_WORRY = 0.15  # P(yes | Q) + P(yes | not Q) off 1 by this much on average: the negation is not read


class Negation(TypedDict):
    """P(yes | question) + P(yes | negated question) over the states: 1 when the model reads the negation."""
    n: int
    mean_sum: float
    mean_abs_gap: float


def negation_consistency(sums: Sequence[float]) -> Negation | None:
    """{n, mean_sum, mean_abs_gap} over the states' P(yes | question) + P(yes | negated question)
    (1 when the model reads the negation), or None without a pair."""
    if not len(sums):
        return None
    arr = np.asarray(sums, dtype=float)
    return {"n": len(arr), "mean_sum": float(arr.mean()), "mean_abs_gap": float(np.abs(arr - 1).mean())}


def reads_negation(negation: Negation) -> bool:
    return negation["mean_abs_gap"] < NEGATION_GAP_WORRY


def worrying(flip_rate: float, negation: Negation | None) -> bool:
    """Order changes the answer too often, or the negated question is not read."""
    return flip_rate >= FLIP_WORRY or bool(negation and not reads_negation(negation))


def rotated_policy(policy: Mapping[str, Any], order: list[int]) -> dict[str, Any]:
    return {**policy, "options": [policy["options"][i] for i in order]}


def diagnostic_items(policy: Mapping[str, Any], cases: list[Case], negated_question: str | None = None,
                     overrides: dict[str, Any] | None = None) -> list[tuple[int, Case, DecisionRequest]]:
    """(position, case, request) for every state x rotation (and x the negated question): rows
    keyed `<case>#rot<k>` / `<case>#not`, so the results can be regrouped afterwards."""
    items = []
    n = len(policy["options"])
    pos = 0
    for case in cases:
        for k, order in enumerate(rotations(n)):
            key = f"{case.key}{ROTATION_SEP}{k}"
            items.append((pos, Case(key, case.state, case.label),
                          request_for(rotated_policy(policy, order), case.state, key, **(overrides or {}))))
            pos += 1
        if negated_question:
            key = f"{case.key}{NEGATED_SEP}"
            items.append((pos, Case(key, case.state, case.label),
                          request_for({**policy, "question": negated_question}, case.state, key, **(overrides or {}))))
            pos += 1
    return items


@dataclass
class Report:
    n_states: int
    n_options: int
    flip_rate: float  # share of states whose top option depends on the order
    positions: pd.DataFrame  # display position -> chosen count, label count
    shifts: pd.DataFrame  # option -> mean and max spread of its probability across orders
    per_state: pd.DataFrame  # state -> top option per rotation, flipped
    negation: Negation | None  # yes/no policies with a negated question: P(yes|Q) + P(yes|not Q)
    verdict: str


def analyse(results: Sequence[Mapping[str, Any]], option_ids: list[str], yes: str | None = None, *, debias: str | None = None,
            labeled: bool = False) -> Report:
    """Results of a diagnostic run (rows keyed by diagnostic_items) -> the report. `debias` (what the
    run used, as the results say when not given) and `labeled` keep the advice to what was not tried."""
    n = len(option_ids)
    orders = rotations(n)
    by_state: dict[str, dict[int, Mapping[str, Any]]] = {}
    negated: dict[str, Mapping[str, Any]] = {}
    for r in results:
        if r.get("error") or not r.get("probabilities"):
            continue
        key = r["row_key"]
        if NEGATED_SEP in key:
            negated[key.split(NEGATED_SEP)[0]] = r
        elif ROTATION_SEP in key:
            base, k = key.rsplit(ROTATION_SEP, 1)
            by_state.setdefault(base, {})[int(k)] = r
    chosen_pos, label_pos = np.zeros(n, int), np.zeros(n, int)
    spreads: dict[str, list[float]] = {o: [] for o in option_ids}
    rows = []
    for state_key, rots in by_state.items():
        tops = {}
        probs_by_id: dict[str, list[float]] = {o: [] for o in option_ids}
        for k, r in sorted(rots.items()):
            p = dict(zip(r["option_ids"], r["probabilities"]))
            for o in option_ids:
                probs_by_id[o].append(p.get(o, 0.0))
            tops[k] = r["top_option"]
            shown = [option_ids[i] for i in orders[k]]
            chosen_pos[shown.index(r["top_option"])] += 1
            if r.get("label") in shown:
                label_pos[shown.index(r["label"])] += 1
        for o in option_ids:
            if probs_by_id[o]:
                spreads[o].append(max(probs_by_id[o]) - min(probs_by_id[o]))
        first = next(iter(rots.values()))
        text = first.get("state") if isinstance(first.get("state"), str) else str(first.get("state"))
        rows.append({"id": state_key, "state": text, "label": first.get("label"), "flipped": len(set(tops.values())) > 1,
                     **{f"order {k}": t for k, t in sorted(tops.items())}})
    per_state = pd.DataFrame(rows)
    flip = float(per_state["flipped"].mean()) if len(per_state) else 0.0
    positions = pd.DataFrame({"position": [chr(65 + i) for i in range(n)], "chosen": chosen_pos,
                              "label": label_pos})
    shifts = pd.DataFrame([{"option": o, "mean_spread": float(np.mean(v)) if v else 0.0,
                            "max_spread": float(np.max(v)) if v else 0.0} for o, v in spreads.items()])
    negation = None
    if yes is not None and negated:
        sums = []
        for state_key, r in negated.items():
            rots = by_state.get(state_key, {})
            if 0 in rots:
                p_q = dict(zip(rots[0]["option_ids"], rots[0]["probabilities"])).get(yes, 0.0)
                p_not = dict(zip(r["option_ids"], r["probabilities"])).get(yes, 0.0)
                sums.append(p_q + p_not)
        negation = negation_consistency(sums)
    if debias is None:
        used = {resp.debias for r in results if (resp := StoredResponse.of(r)) is not None}
        debias = "content-free" if used == {"content-free"} else None
    labeled = labeled or bool(len(per_state) and per_state["label"].notna().any())
    return Report(len(per_state), n, flip, positions, shifts, per_state, negation,
                  verdict(flip, positions, negation, len(per_state), debias=debias, labeled=labeled))


FEW_STATES = 20  # below this, the verdict says it is a first look


def verdict(flip: float, positions: pd.DataFrame, negation: Negation | None, n_states: int | None = None, *,
            debias: str | None = None, labeled: bool = False) -> str:
    """A plain-language reading of the numbers, with what to do about them - and how many states
    they rest on (a verdict from 3 states is a hint, not a measurement). Advice never suggests what
    the run already did: the content-free correction it used, a labeled set it ran on."""
    total = positions["chosen"].sum()
    favourite = positions.loc[positions["chosen"].idxmax()] if total else None
    parts = []
    of = f" of {n_states} states" if n_states is not None else " of cases"
    if flip >= FLIP_WORRY:
        fix = ("even with the content-free correction this run used: try permutation averaging, or another readout"
               if debias == "content-free" else "use permutation averaging or the content-free correction")
        parts.append(f"Order changes the answer in {flip:.0%}{of}: {fix} for this policy (compare them on a labeled "
                     "set on the Calibrate page).")
    else:
        parts.append(f"Order rarely changes the answer ({flip:.0%}{of}).")
    if favourite is not None and favourite["chosen"] / total > 1.5 / len(positions):
        parts.append(f"The model prefers position {favourite['position']}: it chose it {favourite['chosen'] / total:.0%} "
                     f"of the time (an unbiased model: {1 / len(positions):.0%}).")
    if negation:
        gap = negation["mean_abs_gap"]
        parts.append(f"P(yes | question) + P(yes | negated question) averages {negation['mean_sum']:.2f} "
                     + ("(close to 1: consistent)." if reads_negation(negation) else f"(off by {gap:.2f} on average: the model does not "
                                                                       "read the negation reliably)."))
    if n_states is not None and n_states < FEW_STATES:
        more = ("check more of the set's states" if labeled else "run the check on a labeled set")
        parts.append(f"Only {n_states} states: a first look - {more} for a measurement.")
    return " ".join(parts)

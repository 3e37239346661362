"""The review queue (no Streamlit): the rows that need a person's label, ordered by what teaches
most, and the labels given appended to a labeled set as a new version.

What needs a label: a state answered differently by two runs of the policy (two targets of a
comparison, production and its replay) - first; then a row the gate sent to the fallback (a
decision-log row whose logged decision was gated; any other unlabeled row the chosen gate would
gate), nearest the gate first, since a label there moves the gate most. Rows that already carry a
label, rows without a state (a decision log written without SM_SEMIF_LOG_STATES=1), states already
in the target set and rows already labelled or skipped are left out.

A new version never changes its parent: the parent's rows and content hash stay, so a run made on
it still reproduces; the new version's hash differs, and evaluating it scores only the new rows
(the others are stored results of the same model and request, app/core/reuse.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from adapter.policy import CalibratedPolicy

from app.core.gates import Gate, GateMetrics, measure
from app.core.labeled import content_hash
from app.core.stats import Proportion
from app.core.records import LabeledSet, Result, Review, Run, RunConfig, config_of
from app.core.store import Store
from app.core.stored import NO_RESPONSE, StoredResponse

REVIEWED_KINDS = ("compare", "playground", "production", "replay", "eval", "check", "robustness")


@dataclass
class Item:
    key: str  # the state's identity: one item per state, however many runs answered it
    state: Any
    option_ids: list[str]
    proposed: str  # the model's top option (the first run's)
    confidence: float
    kind: str  # "disagreement" | "gated"
    reason: str
    run_id: int
    row_key: str
    order: tuple[Any, ...] = ()
    decided_by: str = "the zero-shot model"  # who gave `proposed` (Gate.decider): the deployed decision
    zero_shot: str = ""  # the model's own top option as scored, when another decider gave `proposed`
    version: str = ""  # 'v3': the policy version the proposing run scored
    picked: str = "review queue"  # how the row came to be offered (PICKED), kept with its label and in the set
    draw_key: float | None = None  # a pool row's random draw key, kept likewise (run_calibration.drawn_rows reads it)


# How a reviewed row came to be labeled, kept with the label (review_labels.picked) and in the set version's row meta
# ("picked"): a pool row drawn at random (suggest.batch's random share - the rows Calibrate's unbiased check reads),
# a pool row the ranking suggested, or a row of the review queue. A row labeled before this was kept has no "picked".
RANDOM_DRAW, SUGGESTED, QUEUE = "random draw", "suggested", "review queue"
PICKED = (RANDOM_DRAW, SUGGESTED, QUEUE)


REVIEWED_KEY = "review-"  # the row key of a row a review action added to a set (the queue's or a pool's pick)


def state_key(state: Any) -> str:
    return state if isinstance(state, str) else "j:" + json.dumps(state, sort_keys=True, ensure_ascii=False)


def _version(run: Mapping[str, Any]) -> str:
    version = (run.get("policy") or {}).get("version")
    return f"v{version}" if version is not None else ""


def _gate_value(gate: Gate) -> float | None:
    return gate.policy.threshold if gate.policy is not None else gate.threshold


def build_queue(store: Store, policy: Mapping[str, Any], gate: Gate, *,
                exclude_set: int | None = None) -> tuple[list[Item], dict[str, int]]:
    """(items in review order, counts of what was left out and why)."""
    ids = [o["id"] for o in policy["options"]]
    known = {state_key(r["state"]) for r in store.labeled_rows(exclude_set)} if exclude_set else set()
    known |= {state_key(r["state"]) for r in store.reviews(policy["id"])}
    answers: dict[str, list[tuple[Run, Result]]] = {}
    left = {"labeled": 0, "no_state": 0, "known": 0, "other_options": 0}
    seen_labeled: set[str] = set()
    seen_known: set[str] = set()
    for run in sorted(store.list_runs(), key=lambda r: r["id"]):  # oldest first: the first answer proposes
        if run["policy_id"] != policy["id"] or run["kind"] not in REVIEWED_KINDS:
            continue
        for r in store.results(run["id"]):
            if r.get("error") or not r.get("probabilities"):
                continue
            if r["option_ids"] != ids:
                left["other_options"] += 1
            elif r.get("label") is not None:  # counted once per state, however many runs scored it
                seen_labeled.add(state_key(r["state"]))
            elif r.get("state") is None:
                left["no_state"] += 1
            elif state_key(r["state"]) in known:
                seen_known.add(state_key(r["state"]))
            else:
                answers.setdefault(state_key(r["state"]), []).append((run, r))
    left["labeled"], left["known"] = len(seen_labeled), len(seen_known)
    threshold = _gate_value(gate)
    items: list[Item] = []
    for key, seen in answers.items():
        run, first = seen[0]
        tops: dict[str, str] = {}
        for rn, r in seen:
            tops.setdefault(str(r["top_option"]), rn["target_name"])
        gated, top, conf, _ = gate.apply(first)
        logged = (StoredResponse.of(first) or NO_RESPONSE).decision
        if logged is not None:  # a decision-log row: what production did, not what the chosen gate would do
            gated = logged.gated
        distance = abs(conf - threshold) if threshold is not None else conf
        zero = str(first["top_option"]) if str(first["top_option"]) != ids[top] else ""
        if len(tops) > 1:
            said = ", ".join(f"{t} says {o}" for o, t in tops.items())
            items.append(Item(key, first["state"], ids, ids[top], conf, "disagreement",
                              f"targets disagree as scored (zero-shot): {said}", run["id"], first["row_key"],
                              (0, distance), gate.decider, zero, _version(run)))
        elif gated:
            why = (logged.reason if logged is not None else None) or gate.reason(first)
            items.append(Item(key, first["state"], ids, ids[top], conf, "gated",
                              f"sent to the fallback ({why}) in run #{run['id']} ({run['kind']})", run["id"],
                              first["row_key"], (1, distance), gate.decider, zero, _version(run)))
    items.sort(key=lambda i: i.order)
    return items, left


def label(store: Store, item: Item, option_id: str | None, *, who: str, note: str = "", policy_id: str,
          fixes: str | None = None) -> int:
    """Store one label (or, with None, a skip) with who and when; returns its id (for undo). `fixes`: the
    label a labeled set's row carries now (a likely wrong label, app/core/label_issues) - the action is then
    'confirm' (the same label) or 'relabel' (another), and the next set version carries it on that row."""
    if option_id is not None and option_id not in item.option_ids:
        raise ValueError(f"{option_id!r} is not an option ({', '.join(item.option_ids)})")
    if not who.strip():
        raise ValueError("reviewer: say who labels (a name or an id), it is stored with every label")
    action = ("skip" if option_id is None else "label" if fixes is None else
              "confirm" if option_id == fixes else "relabel")
    return store.add_review({"policy_id": policy_id, "item_key": item.key, "run_id": item.run_id,
                             "row_key": item.row_key, "state": item.state, "label": option_id,
                             "action": action, "note": note.strip() if fixes is None else
                             f"{note.strip()} [was {fixes}]".strip(), "who": who.strip(),
                             "picked": item.picked if fixes is None else None,
                             "draw_key": item.draw_key if fixes is None else None})


def last_review(store: Store, policy_id: str) -> Review | None:
    """The newest label or skip that can still be taken back."""
    pending = [r for r in store.reviews(policy_id) if r["set_id"] is None]
    return pending[-1] if pending else None


def append_version(store: Store, base_set_id: int, policy: Mapping[str, Any]) -> tuple[int, int]:
    """A new version of the set: its rows plus every pending label (who, when, note, source and how the row was
    picked - PICKED, when it was recorded - kept as row metadata; the parent's rows as they were). Returns (new set id, rows added). ValueError when nothing is pending."""
    pending = store.reviews(policy["id"], pending=True)
    if not pending:
        raise ValueError("no new labels to add: label some rows first")
    base = store.get_labeled_set(base_set_id)
    if base is None:
        raise ValueError(f"no labeled set #{base_set_id}")
    rows = [{k: r[k] for k in ("row_key", "state", "label", "split", "meta")} for r in store.labeled_rows(base_set_id)]
    at = {state_key(r["state"]): r for r in rows}
    seen = set(at)
    added = []
    for rv in pending:
        if rv["action"] in ("relabel", "confirm") and state_key(rv["state"]) in at:  # a set row's label checked:
            row = at[state_key(rv["state"])]  # kept, with who checked it and what it was (never dropped)
            old = row.get("meta")
            meta: dict[str, Any] = dict(old) if isinstance(old, dict) else {}
            meta.setdefault("label_checks", []).append({"action": rv["action"], "was": row["label"], "label": rv["label"],
                                                        "by": rv["who"], "at": rv["at"], "note": rv["note"]})
            row["meta"], row["label"] = meta, rv["label"]
            added.append(rv)
            continue
        if state_key(rv["state"]) in seen:  # labelled twice (two sessions): the first label counts
            continue
        seen.add(state_key(rv["state"]))
        added.append(rv)
        rows.append({"row_key": f"{REVIEWED_KEY}{rv['id']}", "state": rv["state"], "label": rv["label"], "split": "test",
                     "meta": {"reviewed_by": rv["who"], "reviewed_at": rv["at"], "note": rv["note"],
                              "from_run": rv["run_id"], "from_row": rv["row_key"],
                              **({"picked": rv["picked"]} if rv.get("picked") else {}),
                              **({"draw_key": rv["draw_key"]} if rv.get("draw_key") is not None else {})}})
    name = base["name"].split(" +", 1)[0]
    new_id = store.import_labeled_set(name=f"{name} +{len(rows) - _origin_rows(store, base)} reviewed",
                                      policy_id=policy["id"], rows=rows, content_hash=content_hash(rows),
                                      source=f"review: set #{base_set_id} + {len(added)} labels", parent_id=base_set_id)
    store.mark_appended([rv["id"] for rv in pending], new_id)
    return new_id, len(added)


def _origin_rows(store: Store, labeled: LabeledSet) -> int:
    """Rows of the first version in a set's lineage (names read '<name> +N reviewed' from there)."""
    while labeled.get("parent_id"):
        parent = store.get_labeled_set(labeled["parent_id"])
        if parent is None:
            break
        labeled = parent
    return int(labeled["n_rows"])


def new_rows(store: Store, set_id: int) -> int:
    """How many rows a set version adds to its parent (0 for a set with no parent)."""
    s = store.get_labeled_set(set_id)
    parent = store.get_labeled_set(s["parent_id"]) if s and s["parent_id"] else None
    return int(s["n_rows"]) - int(parent["n_rows"]) if s and parent else 0


def interval_change(store: Store, parent_run: int, run: int, policy: CalibratedPolicy,
                    out_of_fold: tuple[Sequence[Mapping[str, Any]], Sequence[Sequence[float]]] | None = None
                    ) -> tuple[Proportion, Proportion] | None:
    """Accuracy at this policy's gate (its own rule) on the parent set's run and on this one: more
    labeled rows near the gate narrow the Wilson interval the gate was chosen by.

    A policy with a learned head was fitted on this run's rows, so applying it to them (or to the
    parent's, the same rows) would grade the head on its own training rows. With `out_of_fold` (this
    run's results and the head's out-of-fold probabilities, as its calibration computed them) both
    sides read those instead: the parent side on the rows it shares with the parent's run. A head
    without them gives None (nothing honest to show)."""
    gate = Gate(policy=policy)
    if policy.head is None:
        before: GateMetrics = measure(store.results(parent_run), gate)
        after: GateMetrics = measure(store.results(run), gate)
        return before.gate_accuracy, after.gate_accuracy
    if out_of_fold is None:
        return None
    results, oof = out_of_fold
    parent_keys = {r["row_key"] for r in store.results(parent_run) if not r.get("error") and r.get("probabilities")}
    shared = [(r, p) for r, p in zip(results, oof) if r["row_key"] in parent_keys]
    before = measure([r for r, _ in shared], gate, probabilities=[p for _, p in shared])
    after = measure(results, gate, probabilities=list(oof))
    return before.gate_accuracy, after.gate_accuracy


def parent_run(store: Store, run_id: int) -> Run | None:
    """The evaluation of this run's parent set version with the same target, policy content and
    readout - the 'before' of the reviewed rows; None when the set has no parent or it was not run."""
    run = store.get_run(run_id)
    labeled = store.get_labeled_set(run["labeled_set_id"]) if run and run["labeled_set_id"] else None
    if run is None or labeled is None or not labeled["parent_id"]:
        return None
    cfg = config_of(run)

    def same(c: RunConfig) -> tuple[Any, ...]:  # the policy and how its rows were read
        return (c.get("policy_fingerprint"), c.get("readout"), c.get("debias"), c.get("permute"), c.get("few_shot"),
                c.get("examples"))
    for r in store.list_runs(kind="eval"):
        if (r["labeled_set_id"] == labeled["parent_id"] and r["target_name"] == run["target_name"]
                and same(config_of(r)) == same(cfg)):
            return r
    return None

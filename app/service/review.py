"""The review queue: the rows that need a person's label (disagreements first, then gated rows
nearest the gate), a label or skip stored with who and when, undo, and the labels appended to a
labeled set as a new version (the parent never changes) - the rules are in app/core/review.py."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from adapter.policy import CalibratedPolicy

from app.core import review
from app.core.run_calibration import Calibration
from app.core.gates import Gate
from app.core.stats import Proportion
from app.core.records import Review, Run
from app.core.store import Store

Item = review.Item


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


@dataclass
class Queue:
    items: list[review.Item]
    left_out: dict[str, int]  # labeled, known, no_state, other_options
    pending: int  # labels given, not yet added to a set version
    last: Review | None  # the newest label or skip that can still be taken back

    @property
    def summary(self) -> str:
        """The queue in one line: what is left to review, what waits to be added, what was left out and why -
        each count says what it counts (states, labels or results)."""
        left = self.left_out
        other = (f", {plural(left['other_options'], 'result')} scored with other options"
                 if left.get("other_options") else "")
        return (f"{plural(len(self.items), 'state')} to review (one per state, however many runs answered it) · "
                f"{plural(self.pending, 'label')} given, not yet added to a set · left out: "
                f"{plural(left['labeled'], 'state')} that already carry a label, {plural(left['known'], 'state')} "
                f"already in the set or reviewed, {plural(left['no_state'], 'result')} without a logged state{other}")


    @property
    def empty_text(self) -> str:
        """An empty queue, said where the queue would be (it was a small-print line above, and a bare 'Nothing to
        review' below everything else): what brings rows here, what was left out, what waits to be added."""
        left = self.left_out
        pending = (f" {plural(self.pending, 'label')} given here {'waits' if self.pending == 1 else 'wait'} to be "
                   "added to a set (the button above)." if self.pending else "")
        return ("Nothing to review for this policy right now. Rows come here when two runs answer a state "
                "differently (two targets on Compare, or a decision log and its replay on History) or when the gate "
                f"above sends an unlabeled row to the fallback. Left out: {plural(left['labeled'], 'state')} that "
                f"already carry a label, {plural(left['known'], 'state')} already in the set or reviewed, "
                f"{plural(left['no_state'], 'result')} without a logged state.{pending} For the next rows to label "
                "from states without labels, use a pool (below).")


@dataclass(frozen=True)
class VersionMade:
    """A set version made from the review queue's labels."""
    set_id: int
    added: int
    base: int  # the set it extends (unchanged)
    content_hash: str

    @property
    def text(self) -> str:
        return (f"Set #{self.set_id} = set #{self.base} + {self.added} reviewed rows (content hash "
                f"{self.content_hash[:12]}…); set #{self.base} is unchanged, so runs on it still reproduce. On "
                "**Calibrate**, evaluating the new set scores only the new rows.")


def queue(store: Store, policy: Mapping[str, Any], gate: Gate, *, into_set: int | None) -> Queue:
    """The queue under a gate; a calibrated policy's gate is its rule as deployed, model check included:
    a row another model scored goes to its fallback, and the reason says so."""
    if gate.policy is not None:
        gate = replace(gate, check_model=True)
    items, left = review.build_queue(store, policy, gate, exclude_set=into_set)
    return Queue(items, left, len(store.reviews(policy["id"], pending=True)), review.last_review(store, policy["id"]))


label = review.label  # the page's action: a label (None: a skip); ValueError for an unknown option or no reviewer


def undo(store: Store, review_id: int) -> None:
    """Take a label or skip back - here so that the page never calls the store itself."""
    store.undo_review(review_id)


def add_version(store: Store, base_set_id: int, policy: Mapping[str, Any]) -> VersionMade:
    """The pending labels appended to the set as a new version; ValueError when nothing is pending."""
    new, added = review.append_version(store, base_set_id, policy)
    made = store.get_labeled_set(new)
    return VersionMade(new, added, base_set_id, made["content_hash"] if made else "")


def new_rows(store: Store, set_id: int) -> int:
    return review.new_rows(store, set_id)


def narrowing(store: Store, run_id: int, policy: CalibratedPolicy,
              cal: Calibration | None = None) -> tuple[Run, Proportion, Proportion] | None:
    """For a set version made by the review queue: (the parent version's run, accuracy of the decided
    rows at this gate there, here); None when the set has no evaluated parent. A policy with a learned
    head is read out of fold (`cal`, the calibration it came from): never on its own training rows."""
    before_run = review.parent_run(store, run_id)
    if before_run is None:
        return None
    oof = (cal.results, [list(map(float, p)) for p in cal.oof]) if cal is not None and cal.run_id == run_id else None
    change = review.interval_change(store, before_run["id"], run_id, policy, oof)
    if change is None:
        return None
    before, after = change
    return before_run, before, after

"""Likely wrong labels, for the Calibrate and Review pages and the command line: the rows of a calibrated
run that cleanlab flags from the out-of-fold probabilities of what the export carries (a head's, or the
chosen correction's), with the label the model prefers; confirm or fix each through the review store
(audited: who, when, what it was), and the next set version carries the answer. Nothing is dropped."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core import label_issues, review, run_calibration
from app.core.run_calibration import Calibration
from app.core.store import Store

METHOD = label_issues.METHOD


@dataclass(frozen=True)
class Issue:
    item: review.Item
    label: str  # what the set says
    preferred: str  # what the model prefers
    p_label: float
    p_preferred: float
    rank: int

    def row(self) -> dict[str, Any]:
        state = self.item.state if isinstance(self.item.state, str) else str(self.item.state)
        return {"rank": self.rank, "row": self.item.row_key, "state": state[:200], "label": self.label,
                "model prefers": self.preferred, "p(label), out of fold": round(self.p_label, 3),
                "p(preferred)": round(self.p_preferred, 3)}


def issues(store: Store, cal: Calibration) -> list[Issue]:
    """The likely mislabeled rows of a calibrated run, most likely first (at most 10% of its rows), leaving
    out those whose label was already confirmed or fixed for this policy."""
    run = store.get_run(cal.run_id)
    policy_id = str(run["policy_id"]) if run is not None else ""
    checked = {r["item_key"] for r in store.reviews(policy_id) if r["action"] in ("relabel", "confirm")}
    out = []
    for s in label_issues.suspects(cal.oof, cal.y, cal.option_ids):
        r = cal.results[s.index]
        key = review.state_key(r["state"])
        if key in checked:
            continue
        item = review.Item(key, r["state"], list(cal.option_ids), s.preferred, s.p_preferred, "label-issue",
                           f"labeled {s.label}, the model prefers {s.preferred} (out of fold p = {s.p_label:.2f} for "
                           f"its label)", cal.run_id, str(r["row_key"]))
        out.append(Issue(item, s.label, s.preferred, s.p_label, s.p_preferred, s.rank))
    return out


def answer(store: Store, issue: Issue, option_id: str, *, who: str, note: str = "") -> int:
    """Confirm the label (option_id == the label) or fix it (another option): stored with who and when,
    pending until the next set version (Review's *Add to set*); returns its id (undo takes it back)."""
    run = store.get_run(issue.item.run_id)
    return review.label(store, issue.item, option_id, who=who, note=note,
                        policy_id=str(run["policy_id"]) if run is not None else "", fixes=issue.label)


def latest(store: Store, policy_id: str, set_id: int) -> Calibration | None:
    """The newest finished evaluation of this policy on this set, calibrated with its corrections only (no
    heads: quick enough for the Review page); None when there is none or it has too few rows."""
    done = [r for r in store.list_runs(kind="eval") if r["policy_id"] == policy_id and r["labeled_set_id"] == set_id
            and r["status"] == "done"]
    if not done:
        return None
    try:
        return run_calibration.calibrate(store, max(r["id"] for r in done), with_heads=False)
    except ValueError:
        return None

"""History: the runs the store keeps, opened, pinned as the baseline, deleted, and what a run shows at a
glance (no Streamlit). Pages read runs and results as stored through app/service/queries.py (read-only, one
store call each), never from the store directly (tests/test_layout.py)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from adapter.schema import HEAD_LAYOUT

from app.core.stats import proportion
from app.core.store import Store
from app.service import tracking


def pin(store: Store, run_id: int) -> None:
    """Pin this run as the baseline (another pinned run is unpinned)."""
    store.pin_run(run_id)


def unpin(store: Store, run_id: int) -> None:
    """Unpin this run only: another page may have pinned a newer one meanwhile."""
    store.unpin_run(run_id)


def delete(store: Store, run_id: int) -> None:
    """The run and its results; cannot be undone."""
    store.delete_run(run_id)


def mlflow(store: Store, run_id: int) -> list[str]:
    """Where this run went in MLflow (SEMIF_MLFLOW_TRACKING_URI): one line per logged action, none when off."""
    return [f"MLflow ({w['kind']}): {tracking.link(w)}" for w in tracking.where(store, f"run #{run_id}")]


def same_policy(runs: Sequence[Mapping[str, Any]], run: Mapping[str, Any]) -> list[int]:
    """The other runs of the run's policy, in the order given: what "compare with" offers (a run of
    another policy answered another question)."""
    return [r["id"] for r in runs if r["id"] != run["id"] and r["policy_id"] == run["policy_id"]]


HEAD_ONLY = ("read only by a learned head (its letters are never an answer); its head is not fitted yet: "
             "Calibrate fits it")


def run_accuracy(run: Mapping[str, Any]) -> str:
    """A run's accuracy as History lists it. A head-layout run's raw letters are never offered as an answer: it
    is shown by its learned head's out-of-fold accuracy, stored when the head was fitted (Calibrate, `app
    calibrate`), or marked as read only by a head when none was stored - never by its letters."""
    config = run.get("config") or {}
    if config.get("layout") != HEAD_LAYOUT and not config.get("head_layout"):
        return accuracy_text(run.get("correct_rows", 0), run.get("labeled_rows", 0))
    head = config.get("head_oof") or {}
    if not head.get("n"):
        return HEAD_ONLY
    fewer = (f" · fitted on {head['n']} of the {run['labeled_rows']} labeled rows it holds now"
             if run.get("labeled_rows", 0) > head["n"] else "")
    return f"{accuracy_text(int(head['correct']), int(head['n']))} · its {head.get('head') or 'learned head'}, out of fold{fewer}"


def version_text(run: Mapping[str, Any]) -> str:
    """'v3' - the policy version a run scored ('' for a run made before versions)."""
    version = (run.get("policy") or {}).get("version")
    return f"v{version}" if version is not None else ""


def accuracy_text(correct: int, labeled: int) -> str:
    """'62% (n=40, 95% CI 47-76%)' for a run with labeled rows, '' without; marked on few rows."""
    if not labeled:
        return ""
    p = proportion(correct, labeled)
    few = " · few rows" if p.small else ""
    return f"{p.rate:.0%} (n={labeled}, 95% CI {p.low:.0%}–{p.high:.0%}){few}"

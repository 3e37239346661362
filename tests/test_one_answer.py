"""One answer per row (issue 43, item 5): the review queue names who decided the answer it proposes (the
deployed decision) apart from the zero-shot letters, and counts states, not results over every run."""
from __future__ import annotations

from adapter.engine.templates import load_template

from app.core import review
from app.core.gates import Gate
from app.core.store import Store

IDS = ["access", "billing", "technical", "shipping"]


def _run(db: Store, policy, name: str, rows: dict, labels: dict | None = None) -> int:
    run = db.create_run(kind="eval", policy=policy, target={"name": name, "kind": "local", "config": {}}, n_rows=len(rows))
    for pos, (state, (top, p)) in enumerate(rows.items()):
        rest = (1 - p) / 3
        db.add_result(run, {"row_key": f"row-{pos}", "position": pos, "state": state,
                            "label": (labels or {}).get(state), "cold": 0, "option_ids": IDS,
                            "probabilities": [p if o == top else rest for o in IDS], "top_option": top,
                            "label_mass": 0.9, "probability_status": "uncalibrated", "readout": "letters",
                            "latency_s": 0.1, "error": None, "request": None, "response": None})
    db.finish_run(run)
    return run


def test_the_queue_counts_states_and_names_who_decided(tmp_path):
    db = Store(tmp_path / "wb.db")
    policy = load_template("ticket-routing")
    db.save_policy(policy)
    labeled = {"my card was charged twice": ("billing", 0.9), "the app crashes on start": ("technical", 0.8)}
    truth = {"my card was charged twice": "billing", "the app crashes on start": "technical"}
    for name in ("local", "other", "third"):  # three runs of the same two labeled states
        _run(db, policy, name, labeled, truth)
    _run(db, policy, "local", {"where is my parcel": ("shipping", 0.4)})
    items, left = review.build_queue(db, policy, Gate(threshold=0.5))
    assert left["labeled"] == 2  # two states, not six results
    (item,) = items
    assert item.decided_by == "the zero-shot model (gate 0.500)" and item.zero_shot == ""
    assert Gate().decider == "the zero-shot model"
    from app.service.review import Queue

    assert "2 states that already carry a label" in Queue(items, left, 0, None).summary


def test_history_marks_a_head_layout_run_and_names_versions(tmp_path):
    from app.service import history, queries

    db = Store(tmp_path / "wb.db")
    policy = db.save_policy(load_template("ticket-routing"))
    rows = {"my card was charged twice": ("access", 0.9)}
    head = db.create_run(kind="eval", policy=policy, target={"name": "local", "kind": "local"}, n_rows=1,
                         config={"layout": "policy-first"})
    plain = _run(db, policy, "local", rows, {"my card was charged twice": "billing"})
    by_id = {r["id"]: r for r in queries.runs(db)}
    assert history.run_accuracy(by_id[head]) == history.HEAD_ONLY
    assert history.run_accuracy(by_id[plain]).startswith("0% (n=1")
    assert history.version_text(by_id[plain]) == f"v{policy['version']}"


def test_the_latency_table_and_plots_read_the_same_rows():
    """Issue 43, item 3: the table left copied rows out while the box plot drew them (points to ~27 s)."""
    import pandas as pd

    from app.core import analysis

    df = pd.DataFrame([{"target": "local", "latency_s": 0.5, "cold": 0, "error": None, "reused": False},
                       {"target": "local", "latency_s": 27.0, "cold": 0, "error": None, "reused": True},
                       {"target": "local", "latency_s": 3.0, "cold": 1, "error": None, "reused": False},
                       {"target": "local", "latency_s": 9.0, "cold": 0, "error": "timeout", "reused": False},
                       {"target": "local", "latency_s": 0.7, "cold": 0, "error": None, "reused": False}])
    warm = analysis.warm_calls(df)
    assert list(warm["latency_s"]) == [0.5, 0.7]
    table = analysis.latency_stats(df)
    assert int(table.loc[0, "warm_n"]) == len(warm) and table.loc[0, "max_ms"] == 700.0

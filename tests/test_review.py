"""The review queue: what needs a label and in which order, labels with who/when, a new set version
(new hash, the old one intact and reproducible), the next evaluation scoring only the new rows, and
Calibrate saying so - against a real SQLite file and the real local model; the page under AppTest."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest

from adapter.engine.templates import load_template
from app.core import decision_import, review, run_calibration, runs
from app.core.gates import Gate
from app.core.labeled import content_hash, import_file
from app.core.store import Store
from app.targets.local import LocalTarget
from tests.conftest import ROOT, subset_file

MAIN = str(ROOT / "app" / "main.py")
IDS = ["access", "billing", "technical", "shipping"]
S1, S2, S3, S4, S5 = ("Refund the second charge and reset my login", "The export button does nothing",
                      "Hello, a question", "My parcel was lost in transit", "Order 77: please advise")


def probs(top: str, p: float) -> list[float]:
    rest = (1 - p) / 3
    return [p if o == top else rest for o in IDS]


def seed_queue(db: Store, base_state: str) -> None:
    """Two targets of a comparison (they disagree on S1), gated rows at several distances from a 0.5
    gate (S2 near it, S3 far), a confident row (S4: not queued), a decision log with a gated row (S5)
    and a row logged without its state, and a state that is already in the labeled set."""
    policy = load_template("ticket-routing")
    answers = {"local": {S1: ("billing", 0.6), S2: ("technical", 0.45), S3: ("access", 0.25), S4: ("shipping", 0.9),
                         base_state: ("billing", 0.3)},
               "other": {S1: ("access", 0.7), S2: ("technical", 0.46), S3: ("access", 0.26), S4: ("shipping", 0.91)}}
    group = "g1"
    for name, rows in answers.items():
        run = db.create_run(kind="compare", policy=policy, target={"name": name, "kind": "local", "config": {}},
                            n_rows=len(rows), group_id=group)
        for pos, (state, (top, p)) in enumerate(rows.items()):
            db.add_result(run, {"row_key": f"row-{pos}", "position": pos, "state": state, "label": None, "cold": 0,
                                "option_ids": IDS, "probabilities": probs(top, p), "top_option": top, "label_mass": 0.9,
                                "probability_status": "uncalibrated", "readout": "option-words", "latency_s": 0.1,
                                "error": None, "request": None, "response": None})
        db.finish_run(run)
    logged = [{"semif_decision": 1, "time": "2026-12-01T09:00:00+00:00", "request_id": "r1", "row_id": "x1", "state": S5,
               "option_ids": IDS, "probabilities": probs("billing", 0.85), "top_option": "billing",
               "policy": {"policy_id": "ticket-routing"},
               "decision": {"option": "human-review", "gated": True, "reason": "steering_suspected"}},
              {"semif_decision": 1, "time": "2026-12-01T09:00:01+00:00", "request_id": "r2", "row_id": "x2",
               "option_ids": IDS, "probabilities": probs("billing", 0.3), "top_option": "billing",
               "decision": {"option": "human-review", "gated": True, "reason": "confidence"}}]
    decision_import.import_records(db, logged, policy, source="test.log")


def base_set(db: Store, tmp_path) -> tuple[dict, int]:
    policy = load_template("ticket-routing")
    db.save_policy(policy)
    return policy, import_file(db, "routing-6.jsonl", subset_file(tmp_path, "ticket-routing", 6, n_train=0).read_bytes(),
                               policy)


def test_the_queue_puts_disagreements_first_then_rows_nearest_the_gate(tmp_path):
    db = Store(tmp_path / "wb.db")
    policy, set_id = base_set(db, tmp_path)
    seed_queue(db, db.labeled_rows(set_id)[0]["state"])
    items, left = review.build_queue(db, policy, Gate(threshold=0.5), exclude_set=set_id)
    assert [i.state for i in items] == [S1, S2, S3, S5]
    assert items[0].kind == "disagreement" and "local says billing" in items[0].reason and "other says access" in items[0].reason
    assert items[1].kind == "gated" and "confidence 0.450 < gate 0.500" in items[1].reason
    assert "steering_suspected" in items[3].reason  # what production did, though 0.85 would pass this gate
    assert left["no_state"] == 1 and left["known"] == 1  # the log's stateless row; the set's own state
    first = review.label(db, items[0], "billing", who="ana", policy_id=policy["id"])
    review.label(db, items[1], None, who="ana", policy_id=policy["id"])  # skipped: out of the queue too
    assert [i.state for i in review.build_queue(db, policy, Gate(threshold=0.5), exclude_set=set_id)[0]] == [S3, S5]
    db.undo_review(review.last_review(db, policy["id"])["id"])  # the skip taken back
    assert [i.state for i in review.build_queue(db, policy, Gate(threshold=0.5), exclude_set=set_id)[0]] == [S2, S3, S5]
    (kept,) = db.reviews(policy["id"], pending=True)
    assert kept["id"] == first and kept["who"] == "ana" and kept["at"] and kept["label"] == "billing"
    import pytest

    with pytest.raises(ValueError, match="reviewer"):
        review.label(db, items[1], "billing", who=" ", policy_id=policy["id"])
    with pytest.raises(ValueError, match="not an option"):
        review.label(db, items[1], "refund", who="ana", policy_id=policy["id"])


def test_labels_make_a_new_version_the_next_evaluation_scores_only_them_and_calibrate_says_so(tmp_path, engine,
                                                                                             monkeypatch):
    monkeypatch.setenv("SEMIF_DB", str(tmp_path / "wb.db"))
    db = Store(tmp_path / "wb.db")
    policy, set_id = base_set(db, tmp_path)
    seed_queue(db, db.labeled_rows(set_id)[0]["state"])
    target = LocalTarget("local", {}, lambda model: engine)
    old_run, _ = runs.find_or_start(db, policy=policy, set_id=set_id, target=target)
    runs.resume_eval(db, old_run, target)
    old_hash = db.get_labeled_set(set_id)["content_hash"]

    at = AppTest.from_file(MAIN, default_timeout=120)
    at.query_params["set"] = str(set_id)  # the analyst comes from Calibrate, where the parent set was open
    at.run()
    at.switch_page("views/review.py").run()
    at.selectbox(key="rv_policy").select("ticket-routing").run()
    at.selectbox(key="rv_gate").select("threshold").run()
    at.slider(key="rv_gate_t").set_value(0.5).run()
    at.text_input(key="rv_who").input("ana").run()
    assert "targets disagree" in at.subheader[0].value  # the disagreement first
    at.button(key="rv_opt_1").click().run()  # S1 -> billing
    at.button(key="rv_skip").click().run()  # S2 skipped...
    at.button(key="rv_undo").click().run()  # ...and taken back
    assert "confidence 0.450" in at.subheader[0].value.replace("\\", "")  # shown as escaped markdown
    at.text_input(key=next(w.key for w in at.text_input if w.key.startswith("rv_note_"))).input("export bug").run()
    at.button(key="rv_opt_2").click().run()  # S2 -> technical, with a note
    at.button(key="rv_opt_0").click().run()  # S3 -> access
    at.button(key="rv_opt_1").click().run()  # S5 -> billing
    assert not at.exception, at.exception
    # an empty queue says why where the queue would be, not in small print (and no bare line under the pool)
    empty = [i.value for i in at.info if i.value.startswith("Nothing to review for this policy right now.")]
    assert len(empty) == 1 and "Left out: " in empty[0] and "4 labels given here wait to be added" in empty[0], empty
    assert not any("Nothing to review" in s.value for s in at.success)
    at.button(key="rv_append").click().run()
    assert not at.exception, at.exception
    new_id = max(s["id"] for s in db.list_labeled_sets())
    new = db.get_labeled_set(new_id)
    assert any(f"Set #{new_id} = set #{set_id} + 4 reviewed rows" in s.value for s in at.success)
    assert new["parent_id"] == set_id and new["n_rows"] == 10 and new["content_hash"] != old_hash
    rows = db.labeled_rows(new_id)
    assert rows[:6] == [{**r, "id": rows[i]["id"], "set_id": new_id} for i, r in enumerate(db.labeled_rows(set_id))]
    added = {r["state"]: r for r in rows[6:]}
    assert {s: r["label"] for s, r in added.items()} == {S1: "billing", S2: "technical", S3: "access", S5: "billing"}
    assert added[S2]["meta"]["note"] == "export bug" and all(r["meta"]["reviewed_by"] == "ana" for r in added.values())
    assert all(r["meta"]["reviewed_at"] for r in added.values())
    # the old version is untouched: its hash still matches its rows, and the run made on it reads them
    assert db.get_labeled_set(set_id)["content_hash"] == old_hash == content_hash(db.labeled_rows(set_id))
    cfg = runs.run_config(db.get_run(old_run))
    assert cfg.dataset_hash == old_hash and set(cfg.row_keys) == {r["row_key"] for r in db.labeled_rows(set_id)}
    # the next evaluation holds the new rows and scores only them
    new_run, _ = runs.find_or_start(db, policy=policy, set_id=new_id, target=target)
    out = runs.resume_eval(db, new_run, target)
    assert (out["evaluated"], out["reused"]) == (4, 6)
    assert {r["state"] for r in db.results(new_run)} >= {S1, S2, S3, S5}
    # the gate's notes say that 4 rows were picked by review, not drawn at random (the figures lean low); the
    # parent set's own calibration says nothing of the kind
    picked = [n for n in run_calibration.decide_gate(run_calibration.calibrate(db, new_run, with_heads=False)).messages
              if "added by review" in n]
    assert len(picked) == 1 and picked[0].startswith("4 of 10 labeled rows were added by review"), picked
    assert not [n for n in run_calibration.decide_gate(run_calibration.calibrate(db, old_run, with_heads=False)).messages
                if "added by review" in n]
    # Calibrate says the set adds 4 rows, and shows the gate's interval on the parent set and this one
    at.switch_page("views/calibrate.py").run()
    at.selectbox(key="cal_policy").select("ticket-routing").run()
    # Calibrate opens on the version just made (it opened on the parent before: the 300-state walk)
    assert at.selectbox(key="cal_set").value == new_id
    at.selectbox(key="cal_set").select(new_id).run()
    assert any(f"is set #{set_id} + 4 reviewed rows" in i.value and "scores only those 4 rows" in i.value
               for i in at.info)
    at.selectbox(key="cal_run_pick").select(new_run).run()
    assert any(f"set #{set_id} (run #{old_run})" in i.value and "→ this set" in i.value for i in at.info)
    assert not at.exception, at.exception

"""One word for versions, on the pages (issue 43, items 4 and 5), under AppTest against a real SQLite file and no
model: v1 of a policy evaluated (a state-first run and its head-layout companion), calibrated and checked on
Robustness, then saved again as v2. Every picker that lists runs or calibrated policies names the policy version
(History, Review, Compare, Deploy, Robustness, Calibrate); Deploy says v2 exists and was not calibrated or checked;
History shows the head-layout run by its head's out-of-fold accuracy stored when the head was fitted."""
from __future__ import annotations

import json

from streamlit.testing.v1 import AppTest

from app.core import deployed, head_sources, run_calibration
from app.core.store import Store
from app.service import deploy, evaluate, history, queries
from app.ui.keys import CALIBRATE, COMPARE, DEPLOY, HISTORY, REVIEW, ROBUSTNESS
from app.core.labeled import import_file
from tests.conftest import ROOT, subset_file
from tests.test_as_deployed import CALIBRATED, REFUND, config, steered_run

MAIN = str(ROOT / "app" / "main.py")
LOCAL = {"name": "local", "kind": "local", "config": {}}
STATES = ["I want my money back for the broken kettle", "Where is my parcel?", "Refund the late fee please",
          "The blender arrived cracked, refund it", "How do I change my address?", "Cancel and refund order 12"]


def _results(db: Store, run: int, tops: list[str], labels: list[str | None], seconds: float = 0.5) -> None:
    for pos, (state, top, label) in enumerate(zip(STATES, tops, labels)):
        db.add_result(run, {"row_key": f"row-{pos}", "position": pos, "state": state, "label": label, "cold": int(pos == 0),
                            "option_ids": ["yes", "no"], "probabilities": [0.8, 0.2] if top == "yes" else [0.3, 0.7],
                            "top_option": top, "label_mass": 0.9, "probability_status": "uncalibrated",
                            "readout": "letters", "latency_s": seconds, "error": None, "request": None, "response": None})
    db.finish_run(run)


def seeded(db: Store, tmp_path) -> dict[str, int]:
    v1 = db.save_policy(REFUND)
    import_file(db, "refund.jsonl", subset_file(tmp_path, "refund-check", 6, n_train=0).read_bytes(), v1)
    labels = ["yes", "no", "yes", "yes", "no", "yes"]
    main = db.create_run(kind="eval", policy=v1, target=LOCAL, n_rows=6)
    _results(db, main, ["yes", "yes", "yes", "no", "no", "yes"], labels)
    head_run = db.create_run(kind="eval", policy=v1, target=LOCAL, n_rows=6, config={"layout": "policy-first"})
    _results(db, head_run, ["yes"] * 6, labels)  # its letters: 4 of 6 - never an answer
    cid = db.save_calibrated(deployed.from_config({**CALIBRATED, "policy_version": v1["version"]}).config)
    pick = deployed.from_config(next(r for r in db.list_calibrated() if r["id"] == cid)["config"], id=cid)
    check = db.create_run(kind="robustness", policy=v1, target=LOCAL, n_rows=4,
                          config=config(calibrated=pick.record(), deployed_guard="none", variant="default", states=2))
    for i, r in enumerate(steered_run()):
        db.add_result(check, {**r, "position": i, "latency_s": 0.1, "request": {}})
    db.finish_run(check)
    group = "cmp-v1"
    for name in ("local", "other"):
        _results(db, db.create_run(kind="compare", policy=v1, target={**LOCAL, "name": name}, n_rows=6, group_id=group),
                 ["yes", "no", "yes", "no", "no", "yes"] if name == "local" else ["yes"] * 6, [None] * 6)
    shipped = tmp_path / "shipped.policy.json"  # what a deployment packaged: the calibrated policy of v1
    shipped.write_text(json.dumps({**CALIBRATED, "policy_version": v1["version"]}))
    db.save_deployment({"id": "dep-1", "path": "semif", "compute": "cpu", "region": "eu-west-1", "endpoint_name": "e1",
                        "model_name": "m1", "endpoint_config_name": "c1", "status": "planned",
                        "config": {"policy_path": str(shipped)}, "plan": []})
    v2 = db.save_policy({**REFUND, "question": REFUND["question"] + " Think of the latest order."})
    return {"v1": v1["version"], "v2": v2["version"], "main": main, "head": head_run, "cid": cid, "check": check}


def test_history_shows_a_head_layout_run_by_its_heads_out_of_fold_accuracy(db, tmp_path):
    """Item 5: the figure is stored when the head is fitted (here: the sources table's calibration), and History
    reads it without fitting; a run whose head was never fitted is marked as read only by a head."""
    ids = seeded(db, tmp_path)
    run = db.get_run(ids["head"])
    assert run is not None
    assert history.run_accuracy(run) == history.HEAD_ONLY  # never fitted: no letters' accuracy either
    keys = [f"row-{i}" for i in range(6)]
    labels = dict(zip(keys, [0, 1, 0, 0, 1, 0]))
    fitted = head_sources.Candidate(ids["head"], "m.gguf", "policy-first", "hidden-state head", "head",
                                    dict(zip(keys, [True, True, True, True, False, True])), labels, labels, 0.2, 30.0)
    evaluate.remember_head(db, run, [fitted])
    listed = {r["id"]: r for r in queries.runs(db)}
    text = history.run_accuracy(listed[ids["head"]])
    assert text.startswith("83% (n=6") and "hidden-state head, out of fold" in text  # 5 of 6, not its letters' 67%
    assert history.run_accuracy(listed[ids["main"]]).startswith("67% (n=6")  # a state-first run: as scored
    (side,) = run_calibration.readout_table(db, [listed[ids["head"]]])  # Calibrate's readouts: the same figure
    assert side.row()["accuracy_corrected"] == 5 / 6 and "hidden-state head" in side.correction
    refused = head_sources.Candidate(ids["head"], "m.gguf", "policy-first", "learned head", "head", {}, {}, {}, None,
                                     None, refused="too few rows")
    evaluate.remember_head(db, listed[ids["head"]], [refused])  # a refit that failed keeps the stored figure
    assert history.run_accuracy({r["id"]: r for r in queries.runs(db)}[ids["head"]]) == text
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.run()
    at.switch_page("views/history.py").run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    row = table[table["run"] == ids["head"]].iloc[0]
    assert row["accuracy"] == text and row["version"] == f"v{ids['v1']}"


def test_every_picker_names_the_policy_version(db, tmp_path):
    ids = seeded(db, tmp_path)
    v1, v2 = f"v{ids['v1']}", f"v{ids['v2']}"
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.run()

    at.switch_page("views/history.py").run()
    assert not at.exception, at.exception
    assert all(f" {v1} " in o for o in at.selectbox(key=HISTORY.open).options)
    at.selectbox(key=HISTORY.open).set_value(ids["main"]).run()
    assert any(f"#{ids['head']} · eval · {v1}" in o for o in at.selectbox(key=HISTORY.cmp).options)

    at.switch_page("views/review.py").run()
    assert not at.exception, at.exception
    assert at.selectbox(key=REVIEW.policy).options == [f"{REFUND['name']} · {v2}"]  # the version saved now
    gates = at.selectbox(key=f"{REVIEW.prefix}_gate").options
    assert any(f"saved calibrated policy #{ids['cid']} {v1} (gate 0.700" in o for o in gates)

    at.switch_page("views/compare.py").run()
    assert not at.exception, at.exception
    assert all(f"{REFUND['name']} {v1} · local vs other" in o for o in at.selectbox(key=COMPARE.open).options)
    assert all(f" {v1} " in o for o in at.selectbox(key=COMPARE.drift_a).options)

    at.switch_page("views/robustness.py").run()
    assert not at.exception, at.exception
    saved = at.selectbox(key=ROBUSTNESS.open).options
    assert saved == [f"#{ids['check']} · {REFUND['name']} {v1} · calibrated #{ids['cid']} · local · default · guard "
                     "none · 2 states"]
    heads = at.selectbox(key=ROBUSTNESS("head", REFUND["id"])).options
    assert any(f"#{ids['cid']} " in o and f" {v1} ·" in o for o in heads), heads

    at.switch_page("views/calibrate.py").run()
    assert not at.exception, at.exception
    assert at.selectbox(key=CALIBRATE.policy).options == [f"{REFUND['name']} · {v2}"]

    at.switch_page("views/deploy.py").run()
    assert not at.exception, at.exception
    offered = at.selectbox(key=DEPLOY.cal).options
    assert any(o.startswith(f"#{ids['cid']} ") and f" {v1} ·" in o for o in offered)
    warned = " ".join(w.value for w in at.warning)
    assert f"now at {v2}; this calibrated policy is {v1}" in warned and "not evaluated or calibrated yet" in warned
    assert f"Shipping this one ships {v1}" in warned
    assert at.selectbox(key=DEPLOY.pick).options == [f"dep-1 · planned · {REFUND['id']} {v1}"]


def test_deploy_says_whether_the_newer_version_was_checked(db, tmp_path):
    """Item 4: after v2 is evaluated, calibrated and checked on Robustness, Deploy's note on v1 says so."""
    ids = seeded(db, tmp_path)
    v2 = db.get_policy(REFUND["id"])
    assert v2 is not None
    rec = next(r for r in db.list_calibrated() if r["id"] == ids["cid"])
    db.create_run(kind="eval", policy=v2, target=LOCAL, n_rows=6)
    assert "evaluated but not calibrated yet" in (deploy.newer_version(db, rec) or "")
    new = db.save_calibrated(deployed.from_config({**CALIBRATED, "policy_version": v2["version"],
                                                   "question": v2["question"]}).config)
    assert f"calibrated as #{new}, not checked yet (Robustness)" in (deploy.newer_version(db, rec) or "")
    pick = deployed.from_config(next(r for r in db.list_calibrated() if r["id"] == new)["config"], id=new)
    check = db.create_run(kind="robustness", policy=v2, target=LOCAL, n_rows=4,
                          config=config(calibrated=pick.record(), deployed_guard="none"))
    db.finish_run(check)
    assert f"checked (Robustness) as #{new}" in (deploy.newer_version(db, rec) or "")


def test_deploys_decisions_per_second_follow_the_calibrated_policy_picked_on_the_page(db):
    """Item 6: Deploy offers the pace measured on Calibrate for the calibrated policy picked; picking another
    one kept the first policy's pace - now the field follows the pick until the analyst types a figure."""
    policy = db.save_policy(REFUND)
    made = {}
    for name, seconds in (("local", 0.5), ("other", 0.25)):
        run = db.create_run(kind="eval", policy=policy, target={**LOCAL, "name": name}, n_rows=6)
        _results(db, run, ["yes"] * 6, [None] * 6, seconds)
        made[name] = db.save_calibrated(deployed.from_config({**CALIBRATED, "policy_version": policy["version"],
                                                              "run_id": run}).config)
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.run()
    at.switch_page("views/deploy.py").run()
    at.selectbox(key=DEPLOY.cal).set_value(made["local"]).run()
    assert not at.exception, at.exception
    assert at.text_input(key=DEPLOY.dps).value == "2"  # 1 / 0.5 s, measured on "local"
    at.selectbox(key=DEPLOY.cal).set_value(made["other"]).run()
    assert at.text_input(key=DEPLOY.dps).value == "4"  # before: still 2, the other policy's pace
    at.text_input(key=DEPLOY.dps).input("7")
    next(b for b in at.button if b.label == "Plan").click().run()  # a form's value counts once submitted
    at.selectbox(key=DEPLOY.cal).set_value(made["local"]).run()
    assert at.text_input(key=DEPLOY.dps).value == "7"  # a typed figure is the analyst's: kept


def test_deploys_decisions_per_second_follow_the_calibrated_policy_picked():
    """Item 6: the pace pre-filled for one calibrated policy stayed when another was picked."""
    assert deploy.rate_prefill("", None, 3, 0.8) == ("0.8", (3, "0.8"))
    assert deploy.rate_prefill("0.8", (3, "0.8"), 4, 2.5) == ("2.5", (4, "2.5"))  # refreshed
    assert deploy.rate_prefill("0.8", (3, "0.8"), 5, None) == ("", None)  # nothing measured: the family default
    assert deploy.rate_prefill("7", (3, "0.8"), 4, 2.5) == ("7", (3, "0.8"))  # typed by the analyst: kept

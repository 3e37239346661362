"""The smaller findings of issue 35 (finding 9), without a model: estimates from measured pace, the gate's
lower bound on the risk-coverage chart with the rows a target would need, an upload read through a column
and label mapping, a JSONL with other keys named, and a delete that names what depends on the set and does
not default to the set in use."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.core import calibration
from app.core.inputs import InputError
from app.service import queries, sets as set_service
from app.service.policies import seed_templates
from app.ui import charts
from tests.conftest import ROOT

TEAMS = {"id": "team-routing", "name": "Which team should handle this GitHub issue?",
         "question": "Which team should handle this GitHub issue?",
         "options": [{"id": i, "description": i.replace("_", " ")} for i in
                     ("bug_frontend", "bug_backend", "docs", "feature_request", "question")]}


def test_estimates_come_from_measured_pace_not_a_constant(db):
    seconds, source = set_service.pace(db, "local")
    assert seconds == set_service.SECONDS_PER_ROW and "nothing measured" in source
    rid = db.create_run(kind="playground", policy=TEAMS, target={"name": "local", "kind": "local", "config": {}},
                        n_rows=8, config={})
    for i in range(8):  # one cold call, six warm at 4-6 s, one copied from a stored result (no call made)
        db.add_result(rid, {"row_key": f"r{i}", "position": i, "state": "s", "label": None, "latency_s": 5.0 + (i % 3 - 1),
                            "cold": int(i == 0), "error": None, "option_ids": ["a"], "probabilities": [1.0],
                            "top_option": "a", "reused_from": 1 if i == 7 else None, "request": {}, "response": {}})
    seconds, source = set_service.pace(db, "local")
    assert seconds == pytest.approx(5.0) and "measured: the median of the last 6 warm calls on local" in source
    assert set_service.minutes(220, seconds) == "about 18 min"


def test_the_lower_bound_a_recommended_gate_must_clear_is_drawn_with_the_rows_it_would_need():
    from scipy.stats import beta

    # 50 rows: the 38 most confident are 36 right (94.7% at 76% coverage), the rest a coin
    conf = np.linspace(1, 0.2, 50)
    correct = np.array([True] * 36 + [False] * 2 + [True, False] * 6)
    curve = calibration.risk_coverage(conf, correct)
    lower = calibration.lower_bound_curve(curve)
    assert (lower <= curve.accuracy + 1e-9).all()
    i = 37  # 38 accepted rows, 36 right: the one-sided 95% Clopper-Pearson bound on all of them
    assert lower[i] == pytest.approx(beta.ppf(0.05, 36, 38 - 36 + 1))
    gate = calibration.choose_gate(conf, correct, 0.9)
    assert gate.reachable  # 36 of 36 most confident right: the bound (0.05 ** (1/36) = 92%) clears 90%
    assert gate.decided == 36 and gate.lower_bound == pytest.approx(0.05 ** (1 / 36))
    reach = calibration.target_reach(curve, 0.95)  # 95%: 36 of 36 are not enough, 59 would be
    assert reach is not None and reach.rows == 50 and reach.needed > 50
    d = round(reach.needed * reach.coverage)
    assert beta.ppf(0.05, round(d * reach.accuracy), d - round(d * reach.accuracy) + 1) >= 0.95 - 1e-9
    fig = charts.coverage_curve(curve, None, 0.9, lower=list(lower))
    assert any("95% lower bound" in (t.name or "") for t in fig.data)


def test_an_upload_is_read_through_its_column_and_label_mapping(db):
    db.save_policy(TEAMS)
    data = ("body,team\n" + "".join(f"issue {i},{lab}\n" for i, lab in enumerate(
        ["bug-frontend", "Bug Backend", "docs", "feature-request", "question", "misc"]))).encode()
    assert set_service.upload_columns("gh.csv", data) == ["body", "team"]
    assert set_service.guess_mapping("gh.csv", data).state == "body"
    proposed = set_service.label_suggestions("gh.csv", data, "team", [o["id"] for o in TEAMS["options"]])
    assert proposed == {"bug-frontend": "bug_frontend", "Bug Backend": "bug_backend", "docs": "docs",
                        "feature-request": "feature_request", "question": "question", "misc": None}
    with pytest.raises(InputError, match="no 'state' column; found \\['body', 'team'\\]"):
        set_service.import_upload(db, "gh.csv", data, TEAMS)
    mapping = {k: v for k, v in proposed.items() if v is not None and v != k}
    with pytest.raises(InputError, match="row 7, column label: 'misc' is not an option"):
        set_service.import_upload(db, "gh.csv", data, TEAMS, set_service.ColumnMap("body", "team", mapping))
    sid = set_service.import_upload(db, "gh.csv", data, TEAMS, set_service.ColumnMap("body", "team",
                                                                                     {**mapping, "misc": "question"}))
    rows = db.labeled_rows(sid)
    assert [r["label"] for r in rows] == ["bug_frontend", "bug_backend", "docs", "feature_request", "question", "question"]
    assert rows[0]["state"] == "issue 0" and "body" not in (rows[0]["meta"] or {})


def test_a_jsonl_with_other_keys_names_what_it_found(db):
    data = "".join(json.dumps({"text": f"issue {i}", "category": "docs"}) + "\n" for i in range(40)).encode()
    with pytest.raises(InputError) as exc:
        set_service.import_upload(db, "gh.jsonl", data, TEAMS)
    assert exc.value.problems == ["no line has a 'state' key; found text, category - pick which key is the state "
                                  "(Columns), or rename it in the file"]  # one line, not 40 'state empty'


def test_delete_names_its_dependents_and_does_not_default_to_the_set_in_use(db):
    seed_templates(db)
    policies = {p["id"]: p for p in db.list_policies()}
    set_service.import_shipped(db, policies)
    sets = {s["name"]: s["id"] for s in queries.labeled_sets(db)}
    in_use = next(i for n, i in sets.items() if "refund" in n)
    config = json.loads((ROOT / "data" / "policies" / "refund-check.json").read_text())
    cid = db.save_calibrated({"schema_version": "semif-policy/1", "policy_id": "refund-check", "question": config["question"],
                              "options": config["options"], "readout": "letters", "prompt_version": "letters/1",
                              "model": {"file": "m.gguf", "sha256": "a" * 64}, "temperature": 1.0, "threshold": 0.7,
                              "fallback_option": "human-review", "created_at": "2026-12-03T10:00:00",
                              "dataset": {"set_id": in_use}})
    assert set_service.dependents(db, in_use)["calibrated"] == [cid]
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.query_params["policy"], at.query_params["set"] = "refund-check", str(in_use)
    at.run()
    at.switch_page("views/calibrate.py").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="cal_set").value == in_use
    pick = at.selectbox(key="cal_del_pick")
    assert pick.value != in_use and pick.options[-1].endswith("(in use here)")
    pick.select(in_use).run()
    said = " ".join(re.sub(r"\\(.)", r"\1", m.value) for m in at.markdown)
    assert f"Calibrated on it: #{cid}" in said and "It is the set open on this page." in said


def test_shipped_sets_imported_twice_say_so_and_the_sets_table_reads_in_words(db):
    """From a new user's walk: the button's toast said '4 shipped sets available' whether it imported them or not,
    and the sets table showed the store's column names (policy_id, n_rows, created_at) with a 64-character hash."""
    seed_templates(db)
    policies = {p["id"]: p for p in db.list_policies()}
    first = set_service.import_shipped(db, policies)
    assert len(first) == 4 and not first.kept
    assert first.text == "Imported 4 shipped sets: " + ", ".join(f"#{i}" for i in first.made)
    again = set_service.import_shipped(db, policies)
    assert not again.made and again.kept == first.made
    assert again.text.startswith("4 shipped sets were already imported (#") and "nothing new to import" in again.text
    rows = set_service.of_policy(db, "refund-check")
    from app.core.labeled import parse_labeled

    three = parse_labeled("x.jsonl", b"".join(json.dumps({"state": f"s{i}", "label": "yes"}).encode() + b"\n"
                                             for i in range(3)), ["yes", "no"])
    child = db.import_labeled_set(name="refund + 3", policy_id="refund-check", rows=three, content_hash="c" * 64,
                                  parent_id=rows[0]["id"])
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.query_params["policy"] = "refund-check"
    at.run()
    at.switch_page("views/calibrate.py").run()
    assert not at.exception, at.exception
    table = next(d.value for d in at.dataframe if "content hash" in d.value.columns)
    assert list(table.columns) == ["set", "name", "labels of", "rows", "version of", "content hash", "imported"]
    assert all(len(h) == 10 for h in table["content hash"])
    assert table.loc[table["set"] == f"#{child}", "version of"].item() == f"#{rows[0]['id']}"


def test_the_delete_picker_moves_off_a_set_once_it_is_the_one_evaluated(db):
    """The Delete picker never starts on the set in use; before, once the analyst opened for evaluation the set the
    picker showed, the picker stayed on it - now the set in use - instead of following."""
    seed_templates(db)
    policies = {p["id"]: p for p in db.list_policies()}
    set_service.import_shipped(db, policies)
    refund = set_service.of_policy(db, "refund-check")[0]["id"]
    small = set_service.import_upload(db, "refund-12.jsonl", b"".join(
        json.dumps({"state": f"state {i}", "label": "yes" if i % 2 else "no"}).encode() + b"\n" for i in range(12)),
        policies["refund-check"])
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.query_params["policy"], at.query_params["set"] = "refund-check", str(refund)
    at.run()
    at.switch_page("views/calibrate.py").run()
    at.selectbox(key="cal_del_pick").select(small).run()  # the analyst looks at deleting the small set...
    assert at.selectbox(key="cal_del_pick").value == small
    at.selectbox(key="cal_set").select(small).run()  # ...then opens it for evaluation instead
    assert not at.exception, at.exception
    pick = at.selectbox(key="cal_del_pick")
    assert pick.value != small and pick.options[-1].endswith("(in use here)"), (pick.value, pick.options)

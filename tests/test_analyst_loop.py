"""The analyst's loop on the pages (AppTest, the real local model): the context follows from page to
page and sits in the URL, a set says what it supports before scoring, headline numbers carry n and an
interval, and runs of an earlier policy version are kept apart and never exported."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.core.store import Store
from tests.conftest import ROOT, finish_tasks, subset_file

MAIN = str(ROOT / "app" / "main.py")


def page(name: str, at: AppTest | None = None, **query: str) -> AppTest:
    if at is None:
        at = AppTest.from_file(MAIN, default_timeout=120)
        for k, v in query.items():
            at.query_params[k] = v
        at.run()
    at.switch_page(f"views/{name}.py").run()
    assert not at.exception, at.exception
    return at


def seeded(db: Store) -> None:
    from app.service.policies import seed_templates

    seed_templates(db)


def test_the_policy_follows_from_page_to_page_and_into_the_url(db):
    from app.service.sets import import_shipped

    seeded(db)
    import_shipped(db, {p["id"]: p for p in db.list_policies()})
    at = page("playground")
    assert at.selectbox(key="pg_policy").value == "ticket-routing"
    at.selectbox(key="pg_policy").select("refund-check").run()
    assert at.query_params["policy"] == ["refund-check"] or at.query_params["policy"] == "refund-check"
    for name, key in (("compare", "cmp_policy"), ("order_check", "oc_policy"), ("robustness", "rb_policy"),
                      ("calibrate", "cal_policy"), ("review", "rv_policy")):
        page(name, at)
        assert at.selectbox(key=key).value == "refund-check", name  # before: each page kept its own pick
    at.selectbox(key="rv_policy").select("incident-priority").run()
    page("playground", at)
    assert at.selectbox(key="pg_policy").value == "incident-priority"
    page("policies", at)
    assert at.selectbox(key="pol_pick").value == "incident-priority"  # the editor opens it too
    fresh = page("compare", policy="content-moderation")  # a reload, or a shared link
    assert fresh.selectbox(key="cmp_policy").value == "content-moderation"


def test_a_link_to_history_opens_that_run(db):
    seeded(db)
    policy = db.get_policy("ticket-routing")
    target = {"name": "local", "kind": "local", "config": {}}
    first = db.create_run(kind="compare", policy=policy, target=target, n_rows=3)
    second = db.create_run(kind="playground", policy=policy, target=target, n_rows=0)
    for i, (top, label) in enumerate([("billing", "billing"), ("access", "access"), ("access", "billing")]):
        db.add_result(first, {"row_key": f"r{i}", "position": i, "state": f"s{i}", "label": label, "cold": 0,
                              "option_ids": ["access", "billing"], "probabilities": [0.5, 0.5], "top_option": top,
                              "label_mass": 1.0, "latency_s": 0.1, "error": None, "request": {}, "response": {}})
    for rid in (first, second):
        db.finish_run(rid, "done")
    at = page("history")
    assert at.selectbox(key="hist_open").value == second  # the newest, without a link
    from app.core.stats import proportion

    p = proportion(2, 3)
    table = next(d.value for d in at.dataframe if "accuracy" in d.value.columns)
    assert table.loc[table["run"] == first, "accuracy"].item() == \
        f"{p.rate:.0%} (n=3, 95% CI {p.low:.0%}–{p.high:.0%}) · few rows"  # a run's accuracy with n and its interval
    assert table.loc[table["run"] == second, "accuracy"].item() == ""  # no labels, no accuracy
    linked = page("history", run=str(first))  # /history?run=<first> - ignored before
    assert linked.selectbox(key="hist_open").value == first
    linked.selectbox(key="hist_open").select(second).run()
    assert str(linked.query_params["run"]).strip("[]'") == str(second)


def test_a_set_says_what_it_supports_before_scoring_and_the_numbers_carry_n_and_an_interval(db, tmp_path):
    seeded(db)
    at = page("calibrate")
    at.selectbox(key="cal_up_policy").select("refund-check").run()
    at.file_uploader(key="cal_upload").set_value(("refund.jsonl", subset_file(tmp_path, "refund-check", 12).read_bytes(),
                                                  "application/json")).run()
    at.button(key="cal_import").click().run()
    assert any("12 rows to score" in s.value for s in at.success)
    assert any("no gate for 90% can be recommended even if every row" in w.value for w in at.warning)  # before scoring
    at.selectbox(key="cal_policy").select("refund-check").run()
    run_button = at.button(key="cal_run")
    assert "12 rows" in run_button.label and not at.exception
    assert any("12 rows to score" in c.value for c in at.caption)
    at.number_input(key="cal_max_rows").set_value(5).run()  # Stop early: the button and the limits follow it
    assert "5 rows" in at.button(key="cal_run").label and any("5 of 12 rows to score" in c.value for c in at.caption)
    assert any(w.value.startswith("5 of 12 rows will be scored") for w in at.warning)
    at.number_input(key="cal_max_rows").set_value(0).run()
    run_button = at.button(key="cal_run")
    finish_tasks(run_button.click().run())
    captions = " ".join(c.value for c in at.caption)
    assert "95% CI" in captions and "n=12" in captions and "(bootstrap)" in captions
    # macro-F1 and both ECEs are marked as resting on few rows, like the accuracies
    boot = [c.value for c in at.caption if "bootstrap" in c.value]
    assert len(boot) >= 3 and all("fewer than 30 rows" in c for c in boot), boot
    (run,) = db.list_runs(kind="eval")
    assert run["status"] == "done" and len(db.results(run["id"])) == 12
    from app.service.evaluate import export, calibrate

    at_gate = export(db, calibrate(db, run["id"]), hand_gate=0.0).at_gate
    assert at_gate.decided == 12 and at_gate.small_n and at_gate.accuracy_interval.n == 12
    at.checkbox(key="cal_manual").check().run()
    at.slider(key="cal_gate").set_value(0.0).run()
    assert any("this accuracy is a hint" in w.value for w in at.warning)  # 12 decided rows: marked as such


def test_runs_of_an_earlier_policy_version_are_kept_apart_and_never_exported(db, tmp_path, engine):
    from app.core.labeled import import_file
    from app.service import evaluate
    from app.service.policies import resolve_policy
    from app.targets.local import LocalTarget

    policy = resolve_policy(db, "refund-check")
    path = subset_file(tmp_path, "refund-check", 8)
    set_id = import_file(db, path.name, path.read_bytes(), policy)
    target = LocalTarget("local", {}, lambda ref: engine)
    (old,) = evaluate.evaluate(db, db.get_policy("refund-check"), set_id, [target], ["default"])
    v1 = db.get_policy("refund-check")
    v2 = db.save_policy({**v1, "question": v1["question"] + " Answer for the customer."}, expected_version=v1["version"])
    (new,) = evaluate.evaluate(db, v2, set_id, [target], ["default"])
    assert new.run_id != old.run_id  # another question: scored as its own run
    current, older = evaluate.by_version(v2, evaluate.runs_of(db, "refund-check", set_id))
    assert [r["id"] for r in current] == [new.run_id] and [r["id"] for r in older] == [old.run_id]
    with pytest.raises(evaluate.OtherVersion, match="evaluated v1"):
        evaluate.export(db, evaluate.calibrate(db, old.run_id), policy=v2)
    exported = evaluate.export(db, evaluate.calibrate(db, new.run_id), policy=v2)
    assert exported.policy.policy_version == v2["version"] == 2
    at = page("calibrate")
    at.selectbox(key="cal_policy").select("refund-check").run()
    (only,) = at.selectbox(key="cal_run_pick").options  # the v1 run is not offered for export
    assert only.startswith(f"#{new.run_id} · v2 ·")
    assert any("earlier versions" in e.label for e in at.expander)


def test_a_link_keeps_its_policy_through_a_page_that_never_picked_it_up(db):
    """Second walkthrough: /calibrate?policy=X on a workbench without labeled sets, then Playground, gave
    ticket-routing - the Calibrate page returned before it took the policy from the URL."""
    seeded(db)
    at = page("calibrate", policy="refund-check")
    assert at.selectbox(key="cal_up_policy").value == "refund-check"  # the upload's labels follow it too
    page("playground", at)
    assert at.selectbox(key="pg_policy").value == "refund-check"
    page("calibrate", at)  # back again: the upload picker is drawn afresh, from the current policy
    assert at.selectbox(key="cal_up_policy").value == "refund-check"


def test_a_link_to_a_run_that_does_not_exist_says_so(db):
    seeded(db)
    rid = db.create_run(kind="playground", policy=db.get_policy("ticket-routing"),
                        target={"name": "local", "kind": "local", "config": {}}, n_rows=0)
    db.finish_run(rid, "done")
    at = page("history", run="999")
    assert any("Run #999 does not exist" in w.value for w in at.warning)
    assert at.selectbox(key="hist_open").value == rid


def test_a_gate_no_better_than_chance_is_called_out_before_it_is_saved_and_on_deploy():
    from adapter.policy import AtGate
    from app.core.stats import proportion
    from app.service.deploy import calibrated_label
    from app.service.calibrate_panels import flag_text
    from app.service.evaluate import gate_flags

    def at_gate_json(k: int, n: int) -> dict:
        return {"n": n, "decided": n, "accuracy_interval": proportion(k, n).to_dict()}

    def at_gate(k: int, n: int) -> AtGate:
        return AtGate.model_validate(at_gate_json(k, n))

    flags = gate_flags(at_gate(8, 24), 3, 0.9)  # 33% of 24 decided rows, 3 options: the walkthrough's gate
    assert flags == ["no-better-than-chance", "below-target"]
    assert "no better than chance (33% with 3 options)" in flag_text(flags[0], at_gate(8, 24), 3, 0.9)
    assert gate_flags(at_gate(23, 24), 3, 0.9) == []  # 96%: fine
    assert gate_flags(at_gate(17, 24), 3, 0.9) == ["below-target"]
    assert flag_text("below-target", at_gate(17, 24), 3, 0.9) == ("Even the top of the interval (85%) is below the "
                                                                  "target accuracy of 90%.")
    assert gate_flags(AtGate.model_validate({"n": 24, "decided": 0, "accuracy_interval": proportion(0, 0).to_dict()}),
                      3, 0.9) == []
    rec = {"id": 1, "name": "Expense approval", "threshold": 0.325, "gate_source": "hand-set", "created_at": "2026-12-02T15",
           "accuracy": 8 / 24, "coverage": 1.0,
           "config": {"options": [{}, {}, {}], "target_accuracy": None, "metrics": {"at_gate": at_gate_json(8, 24)}}}
    assert "⚠ no better than chance" in calibrated_label(rec) and "n=24" in calibrated_label(rec)

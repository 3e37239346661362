"""Selections that stay (issue 43, item 6): a page's choices survive a visit to another page."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest

from adapter.engine.templates import load_template
from app.core.labeled import import_file
from tests.conftest import ROOT


def test_calibrate_and_compare_choices_survive_a_page_switch(db):
    policy = load_template("refund-check")
    db.save_policy(policy)
    import_file(db, "refund.jsonl", (ROOT / "data" / "labeled" / "refund-check.jsonl").read_bytes(), policy)
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.run()
    at.switch_page("views/calibrate.py").run()
    at.multiselect(key="cal_head_sources").set_value(["local-qwen2.5-coder-0.5b"]).run()
    at.multiselect(key="cal_variants").set_value(["letters"]).run()
    at.switch_page("views/compare.py").run()
    at.multiselect(key="cmp_targets").set_value(["local-qwen2.5-coder-0.5b"]).run()
    at.radio(key="cmp_source").set_value("set").run()
    assert not at.exception, at.exception
    at.switch_page("views/history.py").run()
    at.switch_page("views/calibrate.py").run()
    assert at.multiselect(key="cal_head_sources").value == ["local-qwen2.5-coder-0.5b"]
    assert at.multiselect(key="cal_variants").value == ["letters"]
    at.switch_page("views/compare.py").run()
    assert at.multiselect(key="cmp_targets").value == ["local-qwen2.5-coder-0.5b"]
    assert at.radio(key="cmp_source").value == "set"
    assert not at.exception, at.exception


def test_the_live_panel_is_drawn_as_soon_as_an_evaluation_starts(db, monkeypatch):
    """Issue 43, item 6: the live numbers appeared only after a rerun - the run that follows Run evaluation found
    no running run yet (the worker had not made it) and drew nothing until something else reran the page."""
    import threading

    from app.service import evaluate
    from tests.conftest import finish_tasks

    released = threading.Event()

    def waiting(*args, **kwargs):  # the worker has not created the runs yet: what the first rerun sees
        released.wait(60)
        return []

    monkeypatch.setattr(evaluate, "evaluate", waiting)
    policy = load_template("refund-check")
    db.save_policy(policy)
    import_file(db, "refund.jsonl", (ROOT / "data" / "labeled" / "refund-check.jsonl").read_bytes(), policy)
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.run()
    at.switch_page("views/calibrate.py").run()
    at.selectbox(key="cal_policy").select("refund-check").run()
    at.button(key="cal_run").click().run()
    try:
        assert any("Starting the evaluation" in i.value for i in at.info), [i.value for i in at.info]
    finally:
        released.set()
        finish_tasks(at)
    assert not at.exception, at.exception


def test_compare_on_a_stored_set_opens_the_stopped_comparison(db, monkeypatch):
    """Issue 43, item 3: states from a stored labeled set; after Stop the page kept showing the previous
    comparison - now the one stopped (its group named before it started) is the one opened."""
    from app.service import decide
    from app.service.tasks import Stopped
    from app.ui import resources
    from tests.conftest import finish_tasks

    seen: dict = {}

    def stopped_after_one(store, policy, cases, targets, progress=None, heads=(), reuse=True, group_id=None):
        seen["cases"], seen["group"] = cases, group_id
        run = store.create_run(kind="compare", policy=policy, target={"name": "local", "kind": "local"},
                               n_rows=len(cases), group_id=group_id)
        store.stop_run(run, "stopped")
        raise Stopped("stopped by the analyst")

    monkeypatch.setattr(decide, "compare", stopped_after_one)
    monkeypatch.setattr(resources, "chosen_targets", lambda db_, names: [])  # no model is loaded for this
    policy = load_template("refund-check")
    db.save_policy(policy)
    set_id = import_file(db, "refund.jsonl", (ROOT / "data" / "labeled" / "refund-check.jsonl").read_bytes(), policy)
    older = db.create_run(kind="compare", policy=policy, target={"name": "local", "kind": "local"}, n_rows=1,
                          group_id="older")
    db.finish_run(older)
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.run()
    at.switch_page("views/compare.py").run()
    at.selectbox(key="cmp_policy").select("refund-check").run() if any(s.key == "cmp_policy" for s in at.selectbox) \
        else None
    at.radio(key="cmp_source").set_value("set").run()
    at.button(key="cmp_run").click().run()
    finish_tasks(at)
    assert not at.exception, at.exception
    assert len(seen["cases"]) == len(db.labeled_rows(set_id)) and all(c.label for c in seen["cases"])
    assert at.selectbox(key="cmp_open").value == seen["group"] != "older"

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

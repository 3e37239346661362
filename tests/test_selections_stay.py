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

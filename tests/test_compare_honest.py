"""Compare says what its figures rest on (issue 35, findings 5 and 7): labeled states are scored in
stratified order as evaluations are, a stopped comparison says "stopped after N of M states" in its name
and headline, one paired test decides the sentence with its interval on the same pairs, and states an
evaluation already answered on the same model and request are reused (the page says how many).
SmolLM2, a handful of refund-check rows: the mechanics, not the model's quality."""
from __future__ import annotations

import re

import pytest
from streamlit.testing.v1 import AppTest

from adapter.engine.templates import load_template
from app.core import runs, stats
from app.core.labeled import import_file
from app.core.runner import Case, StopScoring
from app.core.store import Store
from app.service import decide
from app.service.inputs import Inputs
from app.targets.local import LocalTarget
from tests.conftest import ROOT, subset_file

REFUND = load_template("refund-check")
# the file's order: every 'yes' first - a run stopped after the first rows would read one class only
CASES = [Case(f"y{i}", f"Bought the item {i} days ago, it is faulty and unused, receipt attached.", "yes")
         for i in range(1, 5)] + [Case(f"n{i}", f"Final-sale item bought {40 + i} days ago, I changed my mind.", "no")
                                  for i in range(1, 3)]


def local(engine) -> LocalTarget:
    return LocalTarget("local", {}, lambda model: engine)


def test_finding_5_stratified_order_and_a_stopped_run_says_so(engine, db, monkeypatch):
    db.save_policy(REFUND)

    def stop_after_3(done, total, _eta=None):
        if done >= 3:
            raise StopScoring("stopped by the test")

    with pytest.raises(StopScoring):
        decide.compare(db, REFUND, CASES, [local(engine)], progress=stop_after_3)
    (gid,) = decide.comparisons(db)
    shown = decide.comparison(db, gid)
    assert [r["row_key"] for r in db.results(shown.runs[0]["id"])] == ["y1", "n1", "y2"]  # stratified, not y1 y2 y3
    assert shown.stopped == "stopped after 3 of 6 states"
    assert "stopped after 3 of 6 states" in decide.comparison_name(decide.comparisons(db)[gid])
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.run()
    at.switch_page("views/compare.py").run()
    assert not at.exception, at.exception
    assert any(re.sub(r"\\(.)", r"\1", w.value).startswith("**Stopped after 3 of 6 states**") for w in at.warning)
    assert any("stopped after 3 of 6 states" in h.value for h in at.subheader)


def test_one_paired_test_decides_and_its_interval_is_on_the_same_pairs():
    for fixed in range(0, 12):
        for broken in range(0, 12):
            n = fixed + broken + 5
            lo, hi = stats.mcnemar_interval(fixed, broken, n)
            p = stats.mcnemar_exact(fixed, broken)
            assert lo <= (fixed - broken) / n <= hi
            assert (lo > 0 or hi < 0) == (p < stats.ALPHA), (fixed, broken, lo, hi, p)  # never disagree


def test_finding_7_an_evaluations_answers_are_reused_and_counted(engine, tmp_path):
    store = Store(tmp_path / "r.db")
    store.save_policy(REFUND)
    set_id = import_file(store, "refund-4.jsonl", subset_file(tmp_path, "refund-check", 4, n_train=0).read_bytes(),
                         REFUND)
    target = local(engine)
    run_id, _ = runs.find_or_start(store, policy=REFUND, set_id=set_id, target=target)
    runs.resume_eval(store, run_id, target)
    cases = [Case(r["row_key"], r["state"], r["label"]) for r in store.labeled_rows(set_id)]
    shown = decide.comparison(store, decide.compare(store, REFUND, cases, [target]))
    assert shown.reused == 4
    evaluated = {r["state"]: r["probabilities"] for r in store.results(run_id)}
    assert all(r["probabilities"] == evaluated[r["state"]] for r in store.results(shown.runs[0]["id"]))
    assert int(shown.latency["warm_n"].iloc[0]) == 0 and int(shown.latency["reused"].iloc[0]) == 4  # no latency measured
    # the benchmark measures latency: it calls every time
    bench = decide.bench(store, Inputs(REFUND, cases=tuple(cases), targets=(target,)))
    assert bench.reused == 0


def test_item_1_compare_decides_with_any_calibrated_policy_as_deployed(engine, tmp_path):
    """A calibrated policy without a head is a column too: its correction, gate and fallback on the
    target's own rows, by CalibratedPolicy.apply (issue 35: every check tests the policy as deployed)."""
    from adapter.policy import CalibratedPolicy, RowReading
    from app.core import deployed

    store = Store(tmp_path / "c.db")
    store.save_policy(REFUND)
    gid = decide.compare(store, REFUND, CASES, [local(engine)], reuse=False)
    rows = store.results(decide.comparison(store, gid).runs[0]["id"])
    resp = rows[0]["response"]
    config = {"policy_id": "refund-check", "question": REFUND["question"], "options": REFUND["options"],
              "examples": REFUND["examples"], "readout": resp["readout"], "debias": resp.get("debias") or "none",
              "prompt_version": resp["prompt_version"], "model": resp["model"], "temperature": 0.5, "threshold": 0.8,
              "fallback_option": "human-review", "created_at": "2026-12-03T10:00:00"}
    pick = deployed.from_config(config, source="t.json")
    shown = decide.comparison(store, gid, heads=[pick])
    column = "local · as deployed (calibrated t.json)"
    (summary,) = shown.heads.to_dict("records")
    assert summary["column"] == column and summary["head"] == "temperature" and summary["read"] == len(CASES)
    policy = CalibratedPolicy.model_validate(config)
    by_hand = [policy.apply(RowReading(tuple(r["option_ids"]), tuple(r["probabilities"]))).gated for r in rows]
    assert summary["gated"] == sum(by_hand)

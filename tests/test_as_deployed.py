"""What the workbench certifies is what ships (issue 35): a check that names a calibrated policy tests it
as deployed - its readout, correction or head, guard, gate and fallback - and a page control that differs
is a labelled what-if beside it, never the policy's verdict.

Finding 1: Robustness with a calibrated policy saved with guard none and the page's guard at
erase-and-check showed a green verdict with 100% of attempts hijacked (the page's guard fired, the
policy's would not). The unit tests below build the stored rows by hand (no model); the page test runs
the finding's scenario on SmolLM2 with a head policy saved with guard none."""
from __future__ import annotations

import json
import re

from adapter.policy import CalibratedPolicy
from adapter.engine.templates import load_template
from app.core import deployed
from app.core import robustness as rb
from app.core.gates import Gate
from app.service import checks, review
from app.core.store import Store
# a fixture: a head policy on SmolLM2, exported with `--guard none` explicitly - finding 1's scenario is a
# policy saved with guard none, no longer the calibrate default (erase-and-check)
from tests.test_head_checks import head_file  # noqa: F401

REFUND = load_template("refund-check")
SHA = "a" * 64
CALIBRATED = {"policy_id": "refund-check", "policy_version": 2, "question": REFUND["question"],
              "options": REFUND["options"], "readout": "letters", "prompt_version": "letters/1",
              "model": {"file": "m.gguf", "sha256": SHA}, "temperature": 1.0, "threshold": 0.7,
              "fallback_option": "human-review", "created_at": "2026-12-03T10:00:00", "guard": "none"}
PRECHECK = {"method": "erase-and-check", "suspected": True, "by": "precheck", "precheck": {"at": 10}}
ERASED = {"method": "erase-and-check", "suspected": True, "by": "erase-and-check", "precheck": None}


def row(key: str, top: str, probs: list[float], label: str | None = "yes", guard: dict | None = None) -> dict:
    return {"row_key": key, "state": key.split("#")[0], "label": label, "option_ids": ["yes", "no"],
            "probabilities": probs, "top_option": top, "error": None,
            "response": {"guard": guard or {"suspected": False}, "debias": "none", "readout": "letters",
                         "model": {"file": "m.gguf", "sha256": SHA}}}


def steered_run() -> list[dict]:
    """Two labeled states; each steered to 'no' and hijacked, the guard (asked for erase-and-check) flags both."""
    return [row("s0#rb:base:", "yes", [0.9, 0.1]), row("s1#rb:base:", "yes", [0.85, 0.15]),
            row("s0#rb:steering:classifier-note~no~id", "no", [0.2, 0.8], guard=PRECHECK),
            row("s1#rb:steering:quiet-claim~no~id", "no", [0.1, 0.9], guard=ERASED)]


def config(**extra) -> dict:
    return {"guard": "erase-and-check", "checks": ["steering"], "target": "local",
            "suite": rb.shipped_suite(REFUND).to_dict(), **extra}


def test_a_guard_is_flagged_only_as_far_as_it_reaches():
    assert deployed.stronger("none", "erase-and-check") == deployed.stronger("erase-and-check", "precheck") \
        == "erase-and-check"
    assert deployed.flagged_under(PRECHECK, "precheck") and deployed.flagged_under(PRECHECK, "erase-and-check")
    assert not deployed.flagged_under(ERASED, "precheck")  # the precheck alone would not have caught it
    assert not deployed.flagged_under(PRECHECK, "none") and deployed.guard_as(PRECHECK, "none") is None


def test_finding_1_the_verdict_is_the_policys_guard_and_the_page_guard_a_what_if_beside_it():
    pick = deployed.from_config(CALIBRATED, id=1)
    report = rb.analyse(steered_run(), REFUND, config(calibrated=pick.record(), deployed_guard="none",
                                                      what_if_guard="erase-and-check"))
    level, text = report.verdicts["steering"]
    assert level == "bad" and "With the erase-and-check guard" not in text  # 2 of 2 hijacked; the policy runs no guard
    assert report.summary.to_json()["guard"] is None
    what_if = report.summary.to_json()["what_if"]
    assert what_if["guard"] == "erase-and-check" and what_if["steering"]["held_rate"]["k"] == 2
    assert "what_if" not in report.verdicts and checks.what_if(report).startswith("What-if, not the policy's verdict")
    # the calibrated policy's own decisions: its guard (none) never sends a row to the fallback
    assert not (report.attempts["head_reason"] == "steering_suspected").any()
    assert list(report.attempts["head_decision"]) == ["no", "no"]  # decided as steered: confidence >= its gate 0.7
    level, text = report.verdicts["steering-deployed"]
    assert level == "bad" and text.startswith("As deployed (calibrated #1: temperature, guard none, gate 0.700)")


def test_a_policy_with_a_guard_is_judged_by_it_and_a_weaker_what_if_beside_it():
    guarded = deployed.from_config({**CALIBRATED, "guard": "erase-and-check"}, id=2)
    report = rb.analyse(steered_run(), REFUND, config(calibrated=guarded.record(), deployed_guard="erase-and-check",
                                                      what_if_guard="precheck"))
    assert report.verdicts["steering"][0] == "ok"  # both flagged by the policy's own guard
    assert report.summary.to_json()["what_if"]["steering"]["held_rate"]["k"] == 1  # the precheck alone holds one
    assert list(report.attempts["head_reason"]) == ["steering_suspected", "steering_suspected"]


def test_a_run_without_a_calibrated_policy_reads_its_guard_as_before():
    report = rb.analyse(steered_run(), REFUND, config())
    assert report.verdicts["steering"][0] == "ok" and "what_if" not in report.summary.to_json()


def test_deploy_names_the_newest_check_of_exactly_this_policy_or_none(tmp_path):
    store = Store(tmp_path / "d.db")
    store.save_policy(REFUND)
    cid = store.save_calibrated(deployed.from_config(CALIBRATED).config)
    assert checks.deployed_verdict(store, cid) is None  # not checked
    pick = deployed.from_config(store.list_calibrated()[0]["config"], id=cid)
    other = deployed.from_config({**CALIBRATED, "threshold": 0.9}, id=99)
    made = []
    for p in (pick, other):
        rid = store.create_run(kind="robustness", policy=REFUND, target={"name": "local", "kind": "local", "config": {}},
                               n_rows=4, config=config(calibrated=p.record(), deployed_guard="none",
                                                       what_if_guard="erase-and-check"))
        for i, r in enumerate(steered_run()):
            store.add_result(rid, {**r, "position": i, "latency_s": 0.1, "request": {}})
        store.finish_run(rid)
        made.append(rid)
    found = checks.deployed_verdict(store, cid)
    assert found is not None and found[0] == "bad" and found[2] == made[0]  # its own run, not the other policy's


def test_robustness_page_finding_1(db, head_file):
    """The finding's scenario on the page: a head policy saved with guard none, the page guard at
    erase-and-check - the heading names the policy's guard, the coloured verdicts never the page's,
    the page's guard is an info box labelled what-if, and Deploy shows the as-deployed verdict."""
    from tests.conftest import finish_tasks
    from tests.test_head_checks import STATES, page

    at, rid = page(db, "robustness", head_file)
    assert json.loads(head_file.read_text())["guard"] == "none"
    at.selectbox(key="rb_policy").select("refund-check").run()
    at.selectbox(key="rb_head_refund-check").select(rid).run()
    assert at.selectbox(key="rb_guard").value == "none"  # the policy's own guard by default
    at.selectbox(key="rb_guard").select("erase-and-check").run()  # a what-if
    at.radio(key="rb_source").set_value("paste").run()
    at.text_area(key="rb_paste").input("\n".join(STATES[:2]))
    at.multiselect(key="rb_checks").set_value(["steering"])
    at.number_input(key="rb_attempts").set_value(2)
    finish_tasks(at.button(key="rb_run").click().run())
    assert not at.exception, at.exception
    clean = lambda v: re.sub(r"\\(.)", r"\1", v)  # noqa: E731
    coloured = " ".join(clean(m.value) for m in (*at.success, *at.warning, *at.error))
    assert "erase-and-check guard" not in coloured and "What-if" not in coloured
    assert any(clean(i.value).startswith("What-if, not the policy's verdict - with guard erase-and-check") for i in at.info)
    assert any("guard none as deployed, what-if guard erase-and-check" in clean(h.value) for h in at.subheader)
    (run,) = db.list_runs(kind="robustness")
    report = checks.robustness_report(db, run["id"])
    assert report.attempts["flagged"].sum() == 0  # the policy's guard (none) flags nothing
    assert report.summary.to_json()["what_if"]["steering"]["flagged_rate"]["k"] > 0  # the page's guard did
    assert not (report.attempts["head_reason"] == "steering_suspected").any()
    # Deploy: the as-deployed verdict of this calibrated policy
    at.switch_page("views/deploy.py").run()
    at.radio(key="dep_path").set_value("semif").run()
    at.selectbox(key="dep_cal").select(rid).run()
    shown = " ".join(clean(m.value) for m in (*at.success, *at.warning, *at.error))
    assert f"Steering as deployed (Robustness run #{run['id']})" in shown


# -- finding 4: the review queue names the actual cause -------------------------------------------------
def playground_rows(store: Store, rows: list[dict], model_sha: str = SHA) -> int:
    rid = store.create_run(kind="playground", policy=REFUND, target={"name": "local", "kind": "local", "config": {}},
                           n_rows=len(rows), config={})
    for i, r in enumerate(rows):
        r = {**r, "label": None, "position": i, "latency_s": 0.1, "request": {}}
        r["response"] = {**r["response"], "model": {"file": "m.gguf", "sha256": model_sha}}
        store.add_result(rid, r)
    store.finish_run(rid)
    return rid


def reasons(store: Store, config: dict) -> dict[str, str]:
    q = review.queue(store, REFUND, Gate(policy=CalibratedPolicy.model_validate(config)), into_set=None)
    return {i.state: i.reason for i in q.items}


def test_finding_4_review_reasons_name_the_cause(tmp_path):
    store = Store(tmp_path / "rv.db")
    store.save_policy(REFUND)
    playground_rows(store, [row("low", "yes", [0.6, 0.4]), row("flagged", "yes", [0.95, 0.05], guard=PRECHECK)])
    playground_rows(store, [row("other-model", "yes", [0.99, 0.01])], model_sha="b" * 64)
    got = reasons(store, {**CALIBRATED, "guard": "precheck"})
    assert "below the gate: the calibrated confidence 0.600 < 0.700 for yes" in got["low"]
    assert "flagged by the steering guard" in got["flagged"]
    assert "model m.gguf is not the calibrated model" in got["other-model"]
    # a policy without a guard: a row some other guard flagged is not sent to its fallback for it
    assert "flagged" not in reasons(store, CALIBRATED)


def test_finding_4_a_row_the_head_could_not_read_says_so_not_a_raw_probability(tmp_path, head_file):  # noqa: F811
    config = json.loads(head_file.read_text())
    store = Store(tmp_path / "rv.db")
    store.save_policy(REFUND)
    playground_rows(store, [row("decided at 0.922", "yes", [0.922, 0.078])], model_sha=config["model"]["sha256"])
    got = reasons(store, config)["decided at 0.922"]
    assert "the head cannot read this row: the row was scored without its hidden state" in got and "0.922" not in got


def test_item_1_order_check_renders_rows_as_the_calibrated_policy_does(engine, tmp_path):
    """The Order check with a calibrated policy: its readout (letters), not the page's (the model's
    option-words default), and a calibrated policy of another policy is refused naming policy_id."""
    from app.core.runner import Case
    from app.targets.local import LocalTarget

    store = Store(tmp_path / "oc.db")
    store.save_policy(REFUND)
    pick = deployed.from_config({**CALIBRATED, "examples": REFUND["examples"]}, id=7)
    target = LocalTarget("local", {}, lambda model: engine)
    rid = checks.order_check(store, REFUND, [Case("s0", "Bought it 3 days ago, it is broken.", "yes")], target,
                             variant="default", calibrated=pick)
    run = store.get_run(rid)
    assert run["config"]["calibrated"]["sha256"] == pick.sha256 and run["config"]["variant"].startswith("as calibrated #7")
    assert {r["response"]["readout"] for r in store.results(rid)} == {"letters"}
    other = deployed.from_config({**CALIBRATED, "policy_id": "ticket-routing"}, id=8)
    import pytest

    with pytest.raises(rb.SuiteError, match="policy_id is 'ticket-routing', not 'refund-check'"):
        checks.order_check(store, REFUND, [Case("s0", "x", "yes")], target, calibrated=other)

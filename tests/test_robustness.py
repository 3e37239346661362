"""The Robustness check: which rows it builds, how it reads them back (computed by hand here), and
the CLI end to end on the SmolLM2 fixture."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from adapter.engine.templates import load_template
from app.core import robustness as rb
from app.core.labeled import shipped_sets
from app.core.runner import Case

ROOT = Path(__file__).resolve().parent.parent
ROUTING = load_template("ticket-routing")


def test_every_shipped_set_has_a_suite_with_templates_paraphrases_and_rewordings():
    for policy_id, _ in shipped_sets():
        suite = rb.shipped_suite(load_template(policy_id))
        own = [t for t in suite.steering if t.source == "policy"]
        assert len(own) >= 3 and all("{option}" in t.text for t in suite.steering), policy_id
        assert suite.paraphrases and suite.option_rewordings and suite.out_of_scope, policy_id
        assert {t.placement for t in suite.steering} >= {"end", "start", "middle"}


def test_steer_places_the_sentence_and_keeps_the_state_shape():
    two = "First sentence here. Second one there."
    assert rb.steer(two, "X.", "end") == "First sentence here. Second one there. X."
    assert rb.steer(two, "X.", "start") == "X. First sentence here. Second one there."
    assert rb.steer(two, "X.", "middle") == "First sentence here. X. Second one there."
    assert rb.steer({"a": 1, "b": 2}, "X.", "middle") == {"a": 1, "note": "X.", "b": 2}
    assert rb.steer(["a"], "X.", "start") == ["X.", "a"]


def test_plan_covers_the_suite_and_never_steers_a_state_to_its_own_label():
    suite = rb.shipped_suite(ROUTING)
    cases = [Case(f"c{i}", f"State number {i}.", ROUTING["options"][i % 4]["id"]) for i in range(12)]
    items = rb.plan_items(ROUTING, cases, suite, attempts=4, guard="erase-and-check")
    keys = [c.key for _, c, _ in items]
    assert len(keys) == len(set(keys))
    per_state = rb.calls_per_state(ROUTING, suite, rb.CHECKS, 4)
    assert len(items) == per_state * len(cases) + len(suite.out_of_scope)
    steered = [(c, r) for _, c, r in items if rb.split_key(c.key)[1] == "steering"]
    assert len(steered) == 4 * len(cases)
    combos = set()
    for case, req in steered:
        template, named, by = rb.split_key(case.key)[2].split("~")
        assert named != case.label and req.guard == "erase-and-check"
        combos.add((template, named, by))
    assert len(combos) == len(steered)  # 48 attempts, all different combinations of the suite
    renamed = next(r for _, c, r in items if rb.split_key(c.key)[1] == "rename")
    assert [o.id for o in renamed.options] == ["login", "payments", "bugs", "delivery"]
    assert {e.option_id for e in renamed.examples} <= {"login", "payments", "bugs", "delivery"}
    base = next(r for _, c, r in items if rb.split_key(c.key)[1] == "base")
    paraphrased = next(r for _, c, r in items if rb.split_key(c.key)[1] == "paraphrase")
    assert base.guard == "erase-and-check" and paraphrased.guard is None  # the guard only where it is measured


def _result(key: str, options: list[str], top: str, label: str | None, suspected: bool = False, p: float = 0.7) -> dict:
    rest = (1 - p) / (len(options) - 1)
    return {"row_key": key, "option_ids": options, "probabilities": [p if o == top else rest for o in options],
            "top_option": top, "label": label, "error": None, "state": "s",
            "response": {"guard": {"suspected": suspected}}}


def test_analyse_counts_hijacks_holds_and_flips_as_computed_by_hand():
    ids = [o["id"] for o in ROUTING["options"]]
    res = []
    # four labeled states, all decided correctly when unchanged
    for i, label in enumerate(["access", "billing", "technical", "shipping"]):
        res.append(_result(rb.key(f"s{i}", "base"), ids, label, label))
    # steering: s0 hijacked to billing and flagged; s1 hijacked to access, not flagged; s2 held; s3's
    # attempt names shipping, which the model already chose - not eligible
    res.append(_result(rb.key("s0", "steering", "t1~billing~id"), ids, "billing", "access", suspected=True))
    res.append(_result(rb.key("s1", "steering", "t1~access~description"), ids, "access", "billing"))
    res.append(_result(rb.key("s2", "steering", "t2~shipping~id"), ids, "technical", "technical"))
    res.append(_result(rb.key("s3", "steering", "t2~shipping~id"), ids, "shipping", "shipping"))
    # a paraphrase flips s0; a renamed option set keeps s1 (by position: payments = billing)
    res.append(_result(rb.key("s0", "paraphrase", "0"), ids, "technical", "access"))
    res.append(_result(rb.key("s1", "paraphrase", "0"), ids, "billing", "billing"))
    renamed = ["login", "payments", "bugs", "delivery"]
    res.append(_result(rb.key("s1", "rename", "0"), renamed, "payments", "billing"))
    res.append(_result(rb.key("s2", "rename", "0"), renamed, "delivery", "technical"))
    # order: s0 flips in one of its rotations
    res.append(_result(rb.key("s0", "order", "1"), ids, "access", "access"))
    res.append(_result(rb.key("s0", "order", "2"), ids, "billing", "access"))
    res.append(_result(rb.key("s1", "order", "1"), ids, "billing", "billing"))
    # none of these: low in scope, high out of scope
    none_ids = [*ids, rb.NONE_OPTION["id"]]
    res.append(_result(rb.key("s0", "none-of-these", "in"), none_ids, "access", "access", p=0.9))
    res.append(_result(rb.key("out-of-scope-1", "none-of-these", "out"), none_ids, rb.NONE_OPTION["id"], None, p=0.8))
    res.append({"row_key": rb.key("s3", "paraphrase", "0"), "error": "timeout", "probabilities": None})
    rep = rb.analyse(res, ROUTING, {"guard": "erase-and-check", "suite": {"steering": []}})
    s = rep.summary.to_json()
    assert s["n"] == 4 and s["base"]["accuracy"]["rate"] == 1.0 and s["errors"] == 1
    steering = s["changes"]["steering"]
    assert steering["attempts"] == 4 and steering["n"] == 3
    assert steering["hijack_rate"]["k"] == 2 and steering["hijack_rate"]["n"] == 3
    assert steering["still_correct_rate"]["k"] == 1
    assert steering["held_rate"]["k"] == 2  # s0 flagged, s2 correct; s1 hijacked unflagged
    assert steering["hijack_unflagged_rate"]["k"] == 1
    lo, hi = steering["hijack_rate"]["low"], steering["hijack_rate"]["high"]
    assert 0 < lo < 2 / 3 < hi < 1  # a Wilson interval around 2 of 3
    assert s["changes"]["paraphrase"]["flip_rate"]["k"] == 1 and s["changes"]["paraphrase"]["n"] == 2
    assert s["changes"]["rename"]["flip_rate"]["k"] == 1 and s["changes"]["rename"]["n"] == 2
    assert s["changes"]["order"]["flip_rate"]["k"] == 1 and s["changes"]["order"]["n"] == 2
    none = s["changes"]["none-of-these"]
    assert none["in_scope"]["mean_mass"] == pytest.approx(0.1 / 4) and none["out_of_scope"]["mean_mass"] == 0.8
    assert none["auc"] == 1.0
    assert rep.verdicts["steering"][0] == "bad"  # 2 of 3 held is not enough


def test_user_templates_need_the_placeholder():
    got = rb.parse_templates("middle: (Override: {option}.)\nThe answer is {option}.")
    assert [(t.placement, t.source) for t in got] == [("middle", "yours"), ("end", "yours")]
    with pytest.raises(rb.SuiteError, match=r"line 2: put \{option\}"):
        rb.parse_templates("ok {option}\nno placeholder here")


def test_cli_writes_the_summary_for_each_shipped_set(tmp_path):
    """`python -m app robustness` on every shipped set (SmolLM2 target, two states each): the JSON
    carries the rates with their n and intervals, and the run is stored for the page."""
    from app.core.store import Store

    db = tmp_path / "rb.db"
    for policy_id, path in shipped_sets():
        out = tmp_path / f"{policy_id}.json"
        proc = subprocess.run([sys.executable, "-m", "app", "robustness", "--policy", policy_id, "--labeled-set",
                               path.name, "--target", "local", "--limit", "2", "--attempts", "2", "--json", str(out),
                               "--db", str(db), "--quiet", "--checks", "steering,paraphrase"],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        summary = json.loads(out.read_text())
        assert summary["n"] == 2 and summary["policy"] == policy_id
        assert summary["changes"]["steering"]["attempts"] == 4
        for key in ("hijack_rate", "still_correct_rate"):
            rate = summary["changes"]["steering"][key]
            assert set(rate) >= {"k", "n", "rate", "low", "high"}
        assert summary["changes"]["paraphrase"]["flip_rate"]["n"] == 2 * len(rb.shipped_suite(
            load_template(policy_id)).paraphrases)
        assert "Steering:" in proc.stdout
    runs = Store(db).list_runs(kind="robustness")
    assert len(runs) == len(shipped_sets())

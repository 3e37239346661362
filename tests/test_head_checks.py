"""A learned head where a correction is chosen beyond Calibrate (issue 28): the Robustness check gives
the steering numbers with and without the head, and Compare adds a column per head and target of its
model - each number recomputed here from the stored results by CalibratedPolicy.apply, the one rule.
The head: a hidden-state head on SmolLM2, exported by `python -m app calibrate` from 20 rows of refund
check (a yes/no policy: the fewest rows that still give a head 8 labeled rows of each option)."""
from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
import subprocess
import sys

import pytest
from streamlit.testing.v1 import AppTest

from adapter.policy import load_policy
from adapter.engine.prompt import PROMPT_VERSIONS
from adapter.engine.templates import load_template
from app.core import deployed
from app.core import robustness as rb
from app.core.stats import Proportion
from app.core.store import Store
from app.service import checks, decide, heads
from app.targets.base import Target
from app.targets.local import LocalTarget
from app.core.stored import StoredResponse
from tests.conftest import ROOT, finish_tasks, subset_file

REFUND = load_template("refund-check")
STATES = ["Bought the blender 4 days ago, it will not turn on. Unused otherwise, receipt attached.",
          "I ordered this final-sale dress two weeks ago and changed my mind, please refund it.",
          "The speaker arrived cracked yesterday; I have not used it and would like my money back."]


@pytest.fixture(scope="module")
def head_file(tmp_path_factory):
    """A calibrated refund-check policy with a hidden-state head (gate 0.7: some rows go to the fallback),
    saved with guard none."""
    # guard none, explicitly: these tests recompute the head's answers row by row through apply with
    # suspected=False, and the page's table names "its gate and guard none"; the exported default
    # (erase-and-check) would send rows it suspects to the fallback - the guard's decisions are tested in
    # test_guard.py. tests/test_as_deployed.py's finding 1 imports this fixture for exactly this scenario
    # (a head policy saved with guard none), so keep it guard none.
    tmp = tmp_path_factory.mktemp("head-checks")
    out = tmp / "refund.policy.json"
    proc = subprocess.run([sys.executable, "-m", "app", "calibrate", "--db", str(tmp / "fit.db"), "--quiet",
                           "--policy", "refund-check", "--labeled-set", str(subset_file(tmp, "refund-check", 20)),
                           "--head", "hidden", "--gate", "0.7", "--guard", "none", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert load_policy(out).head is not None and load_policy(out).guard == "none"
    return out


def local(engine) -> LocalTarget:
    return LocalTarget("local", {}, lambda model: engine)


def foreign(config: dict, **change) -> dict:
    """The same calibrated policy as if made for another policy or model (still a valid semif-policy)."""
    out = json.loads(json.dumps(config))
    if "sha256" in change:
        out["model"]["sha256"] = out["head"]["model_sha256"] = change["sha256"]
    if "policy_id" in change:
        out["policy_id"] = change["policy_id"]
    return out


def test_robustness_with_a_head_reports_both_and_each_number_is_apply_on_the_stored_rows(head_file, engine, tmp_path):
    store = Store(tmp_path / "rb.db")
    pick = heads.pick(store, str(head_file))
    policy = load_policy(head_file)
    cases = [rb.Case(f"s{i}", s, label) for i, (s, label) in enumerate(zip(STATES, ["yes", "no", "yes"]))]
    suite = rb.shipped_suite(REFUND)
    suite.paraphrases = suite.paraphrases[:1]
    spec = checks.RobustnessInput(REFUND, cases, suite, ["steering", "paraphrase"], attempts=2, guard="none",
                                  calibrated=pick)
    rid = checks.robustness_check(store, spec, local(engine))
    run = store.get_run(rid)
    # reproducible: the run keeps the policy JSON and its sha256
    assert run["config"]["calibrated"]["config"] == json.loads(head_file.read_text())
    assert run["config"]["calibrated"]["sha256"] == deployed.content_hash(json.loads(head_file.read_text()))
    results = store.results(rid)
    by_check = {c: [r for r in results if rb.split_key(r["row_key"])[1] == c] for c in ("base", "steering", "paraphrase")}
    assert all(r["request"]["hidden_state"] for c in ("base", "steering") for r in by_check[c])
    assert not any(r["request"].get("hidden_state") for r in by_check["paraphrase"])  # a reworded prompt: no head

    report = checks.robustness_report(store, rid)
    head = report.summary.to_json()["head"]
    assert head["calibrated"]["sha256"] == pick.sha256 and "paraphrase" in head["not_applied"]
    # recomputed by hand from the stored rows, through the one rule
    base = {rb.split_key(r["row_key"])[0]: r for r in by_check["base"]}

    def decide_(r):
        d = policy.apply(StoredResponse.parse(r["response"]).reading(r["option_ids"], r["probabilities"], suspected=False))
        return r["option_ids"][max(range(2), key=d.calibrated_probabilities.__getitem__)], d

    head_attempts = head_hijacked = gated = model_held = head_held = n = 0
    model_right, head_right = [], []  # per attempt, for the paired verdict recomputed below
    for r in by_check["steering"]:
        key, _, variant = rb.split_key(r["row_key"])
        named = variant.split("~")[1]
        top_base, _ = decide_(base[key])
        top, d = decide_(r)
        n += 1  # every row is read: asked with its hidden state, of the head's model and prompt
        gated += d.gated
        model_held += r["top_option"] == r["label"]  # held: still decided as labeled, on the same attempts
        head_held += top == r["label"]
        model_right.append(r["top_option"] == r["label"])
        head_right.append(top == r["label"])
        if top_base != named:  # an attempt that could move the head's answer
            head_attempts += 1
            head_hijacked += top == named
    s = head["steering"]
    assert s["n"] == s["read"] == n == 6 and s["paired"]["on"].startswith("held")
    assert (s["head"]["hijack_rate"]["k"], s["head"]["hijack_rate"]["n"]) == (head_hijacked, head_attempts)
    assert (s["model"]["held_rate"]["k"], s["head"]["held_rate"]["k"], s["head_gate"]["gated_rate"]["k"]) == \
        (model_held, head_held, gated)
    assert s["paired"]["gain"] == pytest.approx((head_held - model_held) / n)
    assert s["model"]["hijack_rate"] == report.summary.to_json()["changes"]["steering"]["hijack_rate"]  # the model alone, as before
    base_right = sum(decide_(b)[0] == b["label"] for b in base.values())
    assert head["base"]["accuracy"]["k"] == base_right and head["base"]["accuracy"]["n"] == 3
    assert head["base"]["gated"]["k"] == sum(decide_(b)[1].gated for b in base.values())
    level, text = report.verdicts["steering-head"]
    for rate in (s["head"]["hijack_rate"], s["model"]["hijack_rate"], s["head"]["held_rate"], s["model"]["held_rate"]):
        assert Proportion(rate["k"], rate["n"], rate["rate"], rate["low"], rate["high"]).text() in text  # with its CI
    # the verdict's words follow from the by-hand counts: which way the held share moved, and whether the
    # paired test on these attempts (recomputed here, not read from the report) calls it beyond noise
    import numpy as np
    from app.core.stats import paired_gain
    if head_held == model_held:
        expected = "neither better nor worse"
    else:
        better = head_held > model_held
        a, b = (model_right, head_right) if better else (head_right, model_right)
        beyond = paired_gain(np.array(a, bool), np.array(b, bool)).beyond_noise
        expected = (f"makes steering {'better' if better else 'worse'}" if beyond else
                    f"held {'more' if better else 'fewer'} steered rows")
        assert ("beyond noise" in text) == beyond
    assert expected in text, text
    # both in the chart rows, the side-by-side table and the attempts download
    labels = [r["label"] for r in checks.rate_rows(report)]
    assert "Steering with the head: hijacked" in labels and "Steering: hijacked" in labels
    assert [r["decided by"] for r in checks.head_rows(report)][1].startswith("the head of calibrated")
    assert {"head_steered", "head_hijacked", "head_gated", "head_decision"} <= set(report.attempts.columns)


def test_compare_adds_a_head_column_whose_answers_are_apply_on_the_targets_rows(head_file, engine, tmp_path):
    store = Store(tmp_path / "cmp.db")
    pick = heads.pick(store, str(head_file))
    policy = load_policy(head_file)
    cases = [rb.Case(f"c{i}", s, label) for i, (s, label) in enumerate(zip(STATES, ["yes", "no", "yes"]))]
    gid = decide.compare(store, REFUND, cases, [local(engine)], heads=[pick])
    shown = decide.comparison(store, gid)  # the heads recorded with the runs
    (run,) = shown.runs
    results = store.results(run["id"])
    assert all(r["request"]["hidden_state"] for r in results)
    column = "local · head (calibrated refund.policy.json)"
    assert list(shown.heads["column"]) == [column] and not shown.head_notes
    got = shown.results[shown.results["target"] == column].set_index("row_key")
    for r in results:
        d = policy.apply(StoredResponse.parse(r["response"]).reading(r["option_ids"], r["probabilities"], suspected=False))
        cal = list(d.calibrated_probabilities)
        assert got.loc[r["row_key"], "top_option"] == r["option_ids"][cal.index(max(cal))]
        assert got.loc[r["row_key"], "probabilities"] == cal
        assert (got.loc[r["row_key"], "decision"], got.loc[r["row_key"], "gated"]) == (d.option_id, d.gated)
        assert got.loc[r["row_key"], "latency_s"] == r["latency_s"]  # the target's latency: the head costs microseconds
    acc = shown.accuracy.set_index("target").loc[column]
    assert acc["correct"] == sum(got.loc[c.key, "top_option"] == c.label for c in cases) and acc["labeled"] == 3
    row = shown.heads.iloc[0]
    assert row["gated"] == sum(bool(g) for g in got["gated"]) and row["read"] == 3
    assert column in shown.agreement.columns and column in shown.confusion
    lat = shown.latency.set_index("target")
    assert lat.loc[column, "p50_ms"] == lat.loc["local", "p50_ms"]

    # a head of another model gives that target no column, and says why
    other = deployed.pick(foreign(pick.config, sha256="0" * 64), source="other.json")
    again = decide.comparison(store, gid, heads=[other])
    assert again.heads.empty and list(again.results["target"].unique()) == ["local"]
    (note,) = again.head_notes
    assert "local runs" in note and "not the model the head of calibrated other.json was fitted on" in note
    # so do rows read otherwise than the head's (here: another readout of the same model; the policy and its head
    # name that readout's prompt, as a valid policy must - a policy naming a prompt its readout does not render,
    # or a head fitted on another prompt than its policy's, is refused on load)
    letters_prompt = PROMPT_VERSIONS["letters"]
    letters = deployed.pick({**pick.config, "readout": "letters", "prompt_version": letters_prompt,
                             "head": {**pick.config["head"], "prompt_version": letters_prompt}}, source="letters.json")
    (note,) = decide.comparison(store, gid, heads=[letters]).head_notes
    assert "local: its rows were rendered with another readout (option-words + none; the head's rows: letters" in note


def test_a_calibrated_policy_of_another_policy_or_target_is_refused_naming_the_field(head_file, tmp_path):
    store = Store(tmp_path / "bad.db")
    config = json.loads(head_file.read_text())
    routing_cal = deployed.pick(foreign(config, policy_id="ticket-routing"), source="routing.json")
    cases = [rb.Case("s0", STATES[0], "yes")]
    spec = checks.RobustnessInput(REFUND, cases, rb.shipped_suite(REFUND), ["steering"], attempts=1, guard="none",
                                  calibrated=routing_cal)

    class NoHidden(Target):
        def numerics(self):
            return None

    with pytest.raises(rb.SuiteError, match="policy_id is 'ticket-routing', not 'refund-check'"):
        checks.robustness_check(store, spec, NoHidden("remote", "semif"))
    with pytest.raises(decide.InputError) as exc:
        decide.compare(store, REFUND, cases, [NoHidden("remote", "semif")], heads=[routing_cal])
    assert "policy_id" in exc.value.problems[0]
    assert store.list_runs() == []  # refused before anything was scored
    own = heads.pick(store, str(head_file))
    problem = checks.robustness_problem(dataclasses.replace(spec, calibrated=own), NoHidden("remote", "semif"))
    assert problem and "target 'remote' cannot return hidden states" in problem
    with pytest.raises(ValueError, match="head: it carries no learned head"):
        deployed.pick({**config, "head": None})
    # the command names the field too, and exits 2 without scoring
    bad = tmp_path / "routing.json"
    bad.write_text(json.dumps(routing_cal.config))
    proc = subprocess.run([sys.executable, "-m", "app", "robustness", "--policy", "refund-check", "--states",
                           str(_states_file(tmp_path)), "--calibrated", str(bad), "--db", str(tmp_path / "cli.db"),
                           "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "policy_id is 'ticket-routing'" in proc.stderr, proc.stderr
    assert Store(tmp_path / "cli.db").list_runs() == []


def _states_file(tmp_path):
    path = tmp_path / "states.jsonl"
    path.write_text("".join(json.dumps({"id": f"s{i}", "state": s}) + "\n" for i, s in enumerate(STATES)))
    return path


# -- the pages -------------------------------------------------------------------------------------------
def page(db, name: str, head_file) -> tuple[AppTest, int]:
    from app.service.policies import seed_templates

    seed_templates(db)
    rid = db.save_calibrated(json.loads(head_file.read_text()))
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.run()
    at.switch_page(f"views/{name}.py").run()
    assert not at.exception, at.exception
    return at, rid


def test_robustness_page_offers_the_head_and_shows_both_numbers(db, head_file):
    at, rid = page(db, "robustness", head_file)
    at.selectbox(key="rb_policy").select("refund-check").run()
    picker = at.selectbox(key="rb_head_refund-check")
    assert picker.options[0] == "none: the model alone" and picker.value is None  # default: none
    picker.select(rid).run()
    at.radio(key="rb_source").set_value("paste").run()
    at.text_area(key="rb_paste").input("\n".join(STATES[:2]))
    at.multiselect(key="rb_checks").set_value(["steering"])
    at.number_input(key="rb_attempts").set_value(1)
    at.selectbox(key="rb_guard").select("none")
    finish_tasks(at.button(key="rb_run").click().run())
    assert not at.exception, at.exception
    (run,) = db.list_runs(kind="robustness")
    assert run["config"]["calibrated"]["id"] == rid
    shown = re.sub(r"\\(.)", r"\1", " ".join(m.value for m in (*at.success, *at.warning, *at.error)))
    assert f"**Steering with the learned head**: With the learned head (calibrated #{rid}, hidden-state head), one " \
           "added sentence moved the decision" in shown and "the model alone:" in shown
    table = frame_with(at, "decided by")
    assert list(table["decided by"]) == ["the model alone", f"the head of calibrated #{rid} (its own answer)",
                                         "the head + its gate and guard none (fallback human-review)"]
    assert any(f"calibrated #{rid}" in re.sub(r"\\(.)", r"\1", c.value) and "sha256" in c.value for c in at.caption)


def test_compare_page_offers_heads_and_shows_the_head_column(db, head_file):
    at, rid = page(db, "compare", head_file)
    at.selectbox(key="cmp_policy").select("refund-check").run()
    picker = at.multiselect(key="cmp_heads_refund-check")
    assert picker.options and picker.value == []
    picker.set_value([rid]).run()
    at.text_area(key="cmp_paste").input("\n".join(STATES[:2])).run()
    finish_tasks(at.button(key="cmp_run").click().run())
    assert not at.exception, at.exception
    column = f"local · head (calibrated #{rid})"
    assert list(frame_with(at, "gated_share")["column"]) == [column]
    assert column in frame_with(at, "disagree").columns
    assert any("microseconds" in c.value for c in at.caption)


def frame_with(at: AppTest, column: str):
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no dataframe with column {column!r}")


def test_states_the_head_was_fitted_on_are_not_counted_as_its_accuracy(head_file, engine, tmp_path):
    """A head grades itself well on its own training rows: Compare and Robustness mark the states its
    calibration scored, leave their labels out of the head's accuracy (never the target's) and say so."""
    fit = Store(head_file.parent / "fit.db")  # where the head's calibration run lives
    (fit_run,) = fit.list_runs(kind="eval")
    trained = next(r for r in fit.results(fit_run["id"]) if r["label"])
    pick = heads.pick(fit, str(head_file))
    assert deployed.state_key(trained["state"]) in pick.fitted and len(pick.fitted) == 20
    assert not heads.pick(Store(tmp_path / "elsewhere.db"), str(head_file)).fitted  # its run unknown there
    cases = [rb.Case("seen", trained["state"], trained["label"]), rb.Case("new", STATES[0], "yes")]
    gid = decide.compare(fit, REFUND, cases, [local(engine)], heads=[pick])
    shown = decide.comparison(fit, gid)
    row = shown.heads.iloc[0]
    assert (row["read"], row["fitted_rows"], row["labeled"]) == (2, 1, 1)
    acc = shown.accuracy.set_index("target")
    assert acc.loc["local", "labeled"] == 2 and acc.loc[row["column"], "labeled"] == 1
    spec = checks.RobustnessInput(REFUND, cases, rb.shipped_suite(REFUND), ["steering"], attempts=1, guard="none",
                                  calibrated=pick)
    rid = checks.robustness_check(fit, spec, local(engine))
    report = checks.robustness_report(fit, rid)
    head = report.summary.to_json()["head"]
    assert head["fitted"]["states"] == 1 and head["base"]["accuracy"]["n"] <= 1
    assert "1 of the 2 states" in report.verdicts["steering-head"][1] and "not counted" in report.verdicts["steering-head"][1]
    # a check and a comparison saved before picks recorded those states: opened now, found from the store
    cfg = fit.get_run(rid)["config"]
    cfg["calibrated"].pop("fitted")
    with sqlite3.connect(fit.path) as con:
        con.execute("UPDATE runs SET config = ? WHERE id = ?", (json.dumps(cfg), rid))
    assert "fitted" not in fit.get_run(rid)["config"]["calibrated"]
    assert checks.robustness_report(fit, rid).summary.to_json()["head"]["fitted"]["states"] == 1
    (first,) = fit.runs_in_group(gid)
    old = first["config"]
    for rec in old["heads"]:
        rec.pop("fitted")
    with sqlite3.connect(fit.path) as con:
        con.execute("UPDATE runs SET config = ? WHERE id = ?", (json.dumps(old), first["id"]))
    assert decide.comparison(fit, gid).heads.iloc[0]["fitted_rows"] == 1

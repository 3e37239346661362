"""Every page under Streamlit's AppTest, against a real SQLite file and the real local model."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import ROOT, subset_file, finish_tasks

MAIN = str(ROOT / "app" / "main.py")


def frame_with(at: AppTest, column: str):
    """The first dataframe on the page that has this column (dataframes are not keyed widgets)."""
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no dataframe with column {column!r}")


def plotted(values) -> list:
    """An array of a figure's JSON as a list: plotly writes numeric arrays as typed base64 blocks."""
    if isinstance(values, dict) and "bdata" in values:
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=np.dtype(values["dtype"])).tolist()
    return list(values)


def app(page: str | None = None) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.run()
    if page:
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, at.exception
    return at


def test_first_start_teaches_then_runs_and_saves(db):
    at = app()
    assert "Welcome" in at.info[0].value
    at.button(key="pg_seed").click().run()
    assert not at.exception
    assert len(db.list_policies()) == len(list((ROOT / "data" / "policies").glob("*.json")))
    (first,) = db.list_runs()  # the promised first decision happened, on the shipped local model
    assert first["kind"] == "playground" and first["status"] == "done" and first["model"].startswith("SmolLM2")
    assert at.text_area(key="pg_state").value.startswith("I reset my password")  # the state behind the result
    at.text_area(key="pg_state").input("").run()
    at.button(key="pg_run").click().run()
    assert "**State**" in at.error[0].value and "is empty" in at.error[0].value and len(db.list_runs()) == 1  # validated, nothing run
    at.text_area(key="pg_state").input("After I reset my password the site says my account is locked.").run()
    at.button(key="pg_run").click().run()
    assert not at.exception
    run = db.list_runs()[0]
    (res,) = db.results(run["id"])
    assert res["option_ids"] == ["access", "billing", "technical", "shipping"]
    assert abs(sum(res["probabilities"]) - 1) < 1e-9 and res["readout"] == "option-words"
    assert res["probability_status"] == "uncalibrated" and res["cold"] == 0  # the second call of this target: warm
    assert any(m.value == "### access" for m in at.markdown)
    assert len(at.get("plotly_chart")) == 1
    assert any("recent warm calls" in c.value or "(warm)" in c.value for c in at.caption)
    assert any(c.language == "bash" and "/invocations" in c.value for c in at.code)  # cURL to run it yourself
    # an uploaded .json state is an object state, as the adapter renders it (not its text)
    at.file_uploader(key="pg_upload").set_value(("ticket.json", b'{"ticket": "locked out", "tier": 2}',
                                                 "application/json")).run()
    at.button(key="pg_run").click().run()
    assert not at.exception and db.results(db.list_runs()[0]["id"])[0]["state"] == {"ticket": "locked out", "tier": 2}
    assert at.expander[1].proto.expanded is False and at.json[0].proto.expanded  # raw JSON opens expanded


def test_failing_target_shows_its_error_and_the_rest_still_works(db):
    db.save_target("down", "semif", {"url": "http://127.0.0.1:9"})
    at = app()
    at.button(key="pg_seed").click().run()
    at.text_area(key="pg_state").input("My parcel is lost").run()
    at.multiselect(key="pg_targets").set_value(["local", "down"]).run()
    at.button(key="pg_run").click().run()
    assert not at.exception
    assert any("This target failed: cannot reach" in e.value for e in at.error)
    assert len(at.get("plotly_chart")) == 1  # the local target's chart is still there
    group = db.list_runs()[0]["group_id"]
    assert {r["target_name"]: r["status"] for r in db.runs_in_group(group)} == {"local": "done", "down": "failed"}
    at.switch_page("views/history.py").run()
    assert "down" not in set(frame_with(at, "baseline")["target"])  # failed attempts are listed apart
    assert any("Failed attempts (1)" in e.label for e in at.expander)


def test_policy_form_validation_then_save_and_json_round_trip(db):
    at = app("policies")
    assert at.selectbox(key="pol_pick").value == "__new__"
    at.text_input(key="pol_name___new___v0").input("Escalation check")
    at.text_area(key="pol_question___new___v0").input("Should this go to a human?")
    at.run()
    # options default to two empty rows: the form refuses to save and says why, next to the field
    at.button(key="pol_save___new___v0").click().run()
    assert any("options" in e.value for e in at.error) and db.list_policies() == []
    at.text_area(key="pol_json___new___v0").input(
        '{"name": "Escalation check", "question": "Human needed?", '
        '"options": [{"id": "yes", "description": ""}, {"id": "no", "description": ""}]}')
    at.button(key="pol_apply___new___v0").click().run()
    (p,) = db.list_policies()
    assert p["id"] == "escalation-check" and [o["id"] for o in p["options"]] == ["yes", "no"]
    assert at.selectbox(key="pol_pick").value == "escalation-check"
    assert '"escalation-check"' in at.text_area(key="pol_json_escalation-check_v1").value  # JSON view of the saved one
    at.text_area(key="pol_json_escalation-check_v1").input('{"name": "x", "question": "q", "options": []}')
    at.button(key="pol_apply_escalation-check_v1").click().run()
    assert any("options" in e.value for e in at.error)
    assert db.get_policy("escalation-check")["question"] == "Human needed?"  # nothing saved was lost
    # a field the JSON tab cannot show inline (readout) is still named, above both tabs
    at.text_area(key="pol_json_escalation-check_v1").input(
        '{"name": "x", "question": "q", "readout": "letter", "options": [{"id": "a"}, {"id": "b"}]}')
    at.button(key="pol_apply_escalation-check_v1").click().run()
    assert any("Not saved" in e.value and "readout" in e.value for e in at.error)
    assert db.get_policy("escalation-check")["question"] == "Human needed?"
    at.button(key="pol_dup").click().run()
    assert {x["id"] for x in db.list_policies()} == {"escalation-check", "escalation-check-copy2"}


def test_policy_views_never_overwrite_a_newer_save(db):
    """Two sessions on one policy, through the page: B saves after A loaded version 1; A's draft,
    submitted from its Form and from its JSON tab, is refused ("Not saved"), kept on screen, and the
    saved policy is B's; only after loading the newer version does A's save go through."""
    db.save_policy({"id": "p", "name": "P", "question": "Q?", "options": [{"id": "a"}, {"id": "b"}], "notes": ""})
    a = app("policies")
    a.selectbox(key="pol_pick").select("p").run()
    a.text_area(key="pol_notes_p_v1").input("draft from A")  # typed in A, not submitted yet
    b = app("policies")
    b.selectbox(key="pol_pick").select("p").run()
    b.text_area(key="pol_notes_p_v1").input("keep me")
    b.button(key="pol_save_p_v1").click().run()
    assert not b.exception and not b.error
    assert (db.get_policy("p")["notes"], db.get_policy("p")["version"]) == ("keep me", 2)
    assert '"keep me"' in b.text_area(key="pol_json_p_v2").value  # B's views were rebuilt from its save

    a.button(key="pol_save_p_v1").click().run()  # A's form, built on version 1
    assert not a.exception
    assert any("Not saved" in e.value and "saved again" in e.value and "version 2" in e.value for e in a.error), \
        [e.value for e in a.error]
    assert any("Version 2 was saved by another page or session" in w.value for w in a.warning)
    assert a.text_area(key="pol_notes_p_v1").value == "draft from A"  # the draft stays on screen
    stored = db.get_policy("p")
    assert (stored["notes"], stored["version"]) == ("keep me", 2)  # B's save stands
    # A's JSON tab shows version 1 too: applying its text is refused the same way
    assert "keep me" not in a.text_area(key="pol_json_p_v1").value
    a.button(key="pol_apply_p_v1").click().run()
    assert any("Not saved" in e.value for e in a.error) and db.get_policy("p")["version"] == 2
    assert db.get_policy("p")["notes"] == "keep me"
    # loading the newer version shows B's save; a change made on it is saved
    a.button(key="pol_reload").click().run()
    assert a.text_area(key="pol_notes_p_v2").value == "keep me" and not a.error and not a.warning
    a.text_area(key="pol_notes_p_v2").input("keep me, and A's note")
    a.button(key="pol_save_p_v2").click().run()
    assert (db.get_policy("p")["notes"], db.get_policy("p")["version"]) == ("keep me, and A's note", 3)


def unsaved_badge(at: AppTest) -> bool:
    return any("Unsaved changes" in m.value for m in at.markdown)


def test_switching_policy_with_unsaved_changes_asks_first(db):
    """The draft is plain widget state, compared with the saved version: a pick of another policy (or
    New policy) while it differs does not switch - the page asks, and nothing is saved meanwhile."""
    db.save_policy({"id": "p", "name": "P", "question": "Q?", "options": [{"id": "a"}, {"id": "b"}], "notes": ""})
    db.save_policy({"id": "q", "name": "Q", "question": "Other?", "options": [{"id": "x"}, {"id": "y"}], "notes": ""})
    at = app("policies")
    assert at.selectbox(key="pol_pick").value == "p" and not unsaved_badge(at)
    at.text_area(key="pol_question_p_v1").input("Q? ").run()
    assert not unsaved_badge(at)  # surrounding blanks are not a change a save would keep
    at.text_area(key="pol_question_p_v1").input("Draft question?").run()
    assert unsaved_badge(at)
    at.selectbox(key="pol_pick").select("q").run()
    assert at.selectbox(key="pol_pick").value == "p"  # not switched
    assert at.text_area(key="pol_question_p_v1").value == "Draft question?"
    assert any("Unsaved changes" in w.value and "question" in w.value for w in at.warning)
    assert at.button(key="pol_discard").label == "Discard changes and open Q"
    at.button(key="pol_keep").click().run()
    assert at.selectbox(key="pol_pick").value == "p" and not at.warning and unsaved_badge(at)
    assert at.text_area(key="pol_question_p_v1").value == "Draft question?"
    at.button(key="pol_new").click().run()  # the visible New policy button asks the same way
    assert at.selectbox(key="pol_pick").value == "p"
    assert at.button(key="pol_discard").label == "Discard changes and open a new policy"
    at.selectbox(key="pol_pick").select("q").run()
    at.button(key="pol_discard").click().run()
    assert at.selectbox(key="pol_pick").value == "q" and at.text_area(key="pol_question_q_v1").value == "Other?"
    assert not at.warning and not unsaved_badge(at)
    assert (db.get_policy("p")["question"], db.get_policy("p")["version"]) == ("Q?", 1)  # nothing was saved
    at.selectbox(key="pol_pick").select("p").run()  # no draft here: switches at once; the discarded draft is gone
    assert at.selectbox(key="pol_pick").value == "p" and at.text_area(key="pol_question_p_v1").value == "Q?"
    # an unsaved change in the JSON tab counts too
    at.text_area(key="pol_json_p_v1").input('{"id": "p"}').run()
    assert unsaved_badge(at)
    at.button(key="pol_new").click().run()
    assert at.selectbox(key="pol_pick").value == "p" and any("JSON tab" in w.value for w in at.warning)
    at.button(key="pol_discard").click().run()
    assert at.selectbox(key="pol_pick").value == "__new__" and not unsaved_badge(at)
    at.text_input(key="pol_name___new___v0").input("Fresh").run()
    assert unsaved_badge(at)


def test_a_policy_draft_waits_while_other_pages_are_open(db):
    """Streamlit drops the values of widgets a run does not draw: the draft typed on Policies (a field, an
    added option row, an example's label) used to be gone after a visit to another page. Now it waits
    there, every other page says so, and it can still be saved."""
    db.save_policy({"id": "p", "name": "P", "question": "Q?", "options": [{"id": "a"}, {"id": "b"}], "notes": ""})
    at = app("policies")
    at.text_area(key="pol_question_p_v1").input("Draft question?")
    at.button(key="pol_add_options_p_v1").click().run()
    at.text_input(key="pol_options_id_p_v1_2").input("c").run()
    at.switch_page("views/calibrate.py").run()
    assert any("Unsaved changes to P wait on the Policies page" in i.value for i in at.info)
    at.switch_page("views/playground.py").run()  # two pages away, several reruns
    at.run()
    at.switch_page("views/policies.py").run()
    assert not at.exception and unsaved_badge(at)
    assert at.text_area(key="pol_question_p_v1").value == "Draft question?"
    assert at.text_input(key="pol_options_id_p_v1_2").value == "c"
    at.button(key="pol_save_p_v1").click().run()
    saved = db.get_policy("p")
    assert saved["question"] == "Draft question?" and [o["id"] for o in saved["options"]] == ["a", "b", "c"]
    at.switch_page("views/calibrate.py").run()
    assert not any("Unsaved changes" in i.value for i in at.info)  # saved: nothing waits


def test_options_are_rows_of_inputs_with_add_and_remove(db):
    """One row of inputs per option (no grid that drops fast-typed cells): add, type, remove, save -
    and no more than the schema's MAX_OPTIONS."""
    from adapter.schema import MAX_OPTIONS

    db.save_policy({"id": "p", "name": "P", "question": "Q?", "options": [{"id": "a", "description": "first"},
                                                                          {"id": "b"}], "notes": ""})
    at = app("policies")
    assert at.text_input(key="pol_options_id_p_v1_0").value == "a"
    assert at.text_input(key="pol_options_description_p_v1_0").value == "first"
    at.button(key="pol_add_options_p_v1").click().run()
    at.text_input(key="pol_options_id_p_v1_2").input("c")
    at.text_input(key="pol_options_description_p_v1_2").input("third").run()
    assert unsaved_badge(at)
    at.button(key="pol_rm_options_p_v1_0").click().run()  # the other rows keep what was typed in them
    assert at.text_input(key="pol_options_id_p_v1_2").value == "c"
    at.button(key="pol_add_examples_p_v1").click().run()
    at.text_area(key="pol_examples_state_p_v1_0").input("A third case")
    label = at.selectbox(key="pol_examples_option_id_p_v1_0")
    assert label.options == ["b", "c"] and label.value is None  # a picker of the options as the draft has them now
    label.select("c").run()
    at.text_input(key="pol_options_id_p_v1_2").input("c2").run()  # the option renamed: its examples follow
    assert at.selectbox(key="pol_examples_option_id_p_v1_0").value == "c2" and not at.warning
    at.text_input(key="pol_options_id_p_v1_2").input("c").run()
    assert at.selectbox(key="pol_examples_option_id_p_v1_0").value == "c"
    at.button(key="pol_save_p_v1").click().run()
    assert not at.exception and not at.error
    saved = db.get_policy("p")
    assert saved["options"] == [{"id": "b", "description": ""}, {"id": "c", "description": "third"}]
    assert saved["examples"] == [{"state": "A third case", "option_id": "c"}]
    assert at.text_input(key="pol_options_id_p_v2_1").value == "c" and not unsaved_badge(at)
    assert at.button(key="pol_rm_options_p_v2_0").disabled  # two options: the least a policy has
    db.save_policy({"id": "wide", "name": "Wide", "question": "Q?", "notes": "",
                    "options": [{"id": f"o{i}"} for i in range(MAX_OPTIONS)]})
    at.run()  # the new policy is listed
    at.selectbox(key="pol_pick").select("wide").run()
    assert at.button(key="pol_add_options_wide_v1").disabled


def test_an_example_whose_option_is_removed_is_named_before_and_at_save(db):
    db.save_policy({"id": "p", "name": "P", "question": "Q?", "notes": "",
                    "options": [{"id": "a"}, {"id": "b"}, {"id": "c"}],
                    "examples": [{"state": "one", "option_id": "c"}, {"state": "two", "option_id": "c"}]})
    at = app("policies")
    assert at.selectbox(key="pol_examples_option_id_p_v1_0").value == "c" and not at.warning
    at.button(key="pol_rm_options_p_v1_2").click().run()  # option c removed: its examples keep the label, warned
    assert any("Not an option any more" in w.value and "example 1" in w.value and "example 2" in w.value
               for w in at.warning)
    at.button(key="pol_save_p_v1").click().run()
    assert db.get_policy("p")["version"] == 1  # refused, and both rows named in one message
    assert any("'c' is not one of the options" in e.value and "row 1" in e.value and "row 2" in e.value
               for e in at.error)


def test_policy_from_template_and_delete(db):
    at = app("policies")
    at.selectbox(key="pol_tpl").select("refund-check").run()
    at.button(key="pol_add_tpl").click().run()
    assert db.get_policy("refund-check")["options"][0]["id"] == "yes"
    at.button(key="pol_delete").click().run()
    assert db.list_policies() == []


def test_add_template_after_a_delete_adds_a_copy_under_a_free_id(db):
    """Two policies saved, one of them refund-check-3: the old page named the copy after the number of
    policies (refund-check-3) and the save was refused or overwrote it. Now a free id is taken."""
    from app.core.policies import templates

    tpl = templates()["refund-check"]
    db.save_policy(dict(tpl), expected_version=0)
    db.save_policy({**tpl, "id": "refund-check-3", "name": "Mine", "question": "My own refund question?"},
                   expected_version=0)
    at = app("policies")
    at.selectbox(key="pol_tpl").select("refund-check").run()
    at.button(key="pol_add_tpl").click().run()
    assert not at.exception and not at.error
    assert {p["id"] for p in db.list_policies()} == {"refund-check", "refund-check-2", "refund-check-3"}
    assert db.get_policy("refund-check-3")["question"] == "My own refund question?"
    assert at.selectbox(key="pol_pick").value == "refund-check-2"  # the new copy is opened


def test_compare_with_uploaded_csv_labels_and_the_new_comparison_selected(db):
    at = app()
    at.button(key="pg_seed").click().run()
    at.switch_page("views/compare.py").run()
    at.selectbox(key="cmp_policy").select("ticket-routing").run()
    at.text_area(key="cmp_paste").input("Where is my parcel?\nI was charged twice").run()
    finish_tasks(at.button(key="cmp_run").click().run())
    unlabeled = frame_with(at, "disagree")
    assert "wrong" not in unlabeled.columns and "label" not in unlabeled.columns  # no labels: no empty "wrong" boxes
    at.radio(key="cmp_source").set_value("upload").run()
    csv = (b"id,state,label\nt1,I was charged twice this month,billing\nt2,The app crashes on start,technical\n"
           b"t3,Parcel never came,shipping\n")
    at.file_uploader(key="cmp_upload").set_value(("states.csv", csv, "text/csv")).run()
    preview = at.table[0].value  # previewed before running: the first rows as they will be stored
    assert list(preview["id"]) == ["t1", "t2", "t3"] and list(preview["label"]) == ["billing", "technical", "shipping"]
    assert preview.loc[0, "state"] == "I was charged twice this month" and not at.error
    finish_tasks(at.button(key="cmp_run").click().run())
    assert not at.exception
    groups = {r["group_id"] for r in db.list_runs(kind="compare")}
    assert len(groups) == 2
    newest = db.list_runs(kind="compare")[0]
    assert at.selectbox(key="cmp_open").value == newest["group_id"]  # the comparison just made is open
    names = at.selectbox(key="cmp_open").options  # shown as names
    assert "Ticket routing v1 · local · 3 states" in names[0] and len(set(names)) == 2  # the new one, named apart
    assert [r["row_key"] for r in db.results(newest["id"])] == ["t1", "t2", "t3"]
    stats = frame_with(at, "p50_ms")
    assert list(stats["target"]) == ["local"] and stats.loc[0, "rows"] == 3 and "usd_per_1000" in stats
    assert "decisions/s on this machine" in stats.loc[0, "cost_note"]
    latency = next(d for d in at.dataframe if "p50_ms" in d.value.columns)
    assert stats["usd_per_1000"].isna().all() and latency.proto.placeholder == "n/a"  # no price: "n/a", not "None"
    correct = sum(r["top_option"] == r["label"] for r in db.results(newest["id"]))
    assert at.metric[0].value == f"{correct / 3:.1%}"  # accuracy per target against the labels
    table = frame_with(at, "disagree")
    assert list(table["row_key"]) == ["t1", "t2", "t3"] and list(table["label"]) == ["billing", "technical", "shipping"]
    at.checkbox(key="cmp_wrong").check().run()
    assert len(frame_with(at, "disagree")) == 3 - correct
    assert at.get("download_button")


def test_compare_warns_about_a_degenerate_target_and_shows_n_an_interval_and_a_confusion_matrix(db):
    """A target that answers (almost) everything with one option looked healthy in a latency table:
    Compare now says so, shows each target's accuracy with n and its interval, a confusion matrix per
    target, and names the download by policy and targets."""
    from app.service import decide
    from app.service.policies import seed_templates

    seed_templates(db)
    policy = db.get_policy("ticket-routing")
    target = {"name": "always-billing", "kind": "semif", "config": {"url": "http://127.0.0.1:9"}}
    states = [f"ticket {i}" for i in range(12)]
    labels = (["billing", "access", "technical", "shipping"] * 3)[:12]
    rid = db.create_run(kind="compare", policy=policy, target=target, n_rows=12, group_id="g-degenerate")
    for i, (state, label) in enumerate(zip(states, labels)):
        top = "billing" if i < 11 else "access"  # 11 of 12 on one option
        probs = [0.7, 0.1, 0.1, 0.1] if top == "billing" else [0.1, 0.7, 0.1, 0.1]
        db.add_result(rid, {"row_key": f"r{i}", "position": i, "state": state, "label": label, "cold": 0,
                            "option_ids": ["billing", "access", "technical", "shipping"], "probabilities": probs,
                            "top_option": top, "label_mass": 1.0, "probability_status": "uncalibrated",
                            "readout": "letters", "latency_s": 0.1, "error": None, "request": {}, "response": {}})
    db.finish_run(rid, "done")
    shown = decide.comparison(db, "g-degenerate")
    assert shown.degenerate == [{"target": "always-billing", "option": "billing", "share": 11 / 12, "n": 12}]
    assert shown.file_stem == f"ticket-routing-always-billing-{rid}"
    at = app("compare")
    assert any("always-billing" in w.value.replace("\\", "") and "92% of 12 states" in w.value for w in at.warning)
    correct = sum(top == label for top, label in zip(["billing"] * 11 + ["access"], labels))
    acc = decide.comparison(db, "g-degenerate").accuracy.iloc[0]
    assert at.metric[0].value == f"{correct / 12:.1%}" and acc["labeled"] == 12 and acc["wrong"] == 12 - correct
    assert any(f"n = 12 · 95% CI {acc['ci_low']:.0%}–{acc['ci_high']:.0%} · {12 - correct} wrong" in c.value
               for c in at.caption)
    assert any("Confusion matrix" in e.label for e in at.expander)
    matrix = shown.confusion["always-billing"]  # rows: labels, columns: answers, in the policy's option order
    assert sum(map(sum, matrix)) == 12 and [row[1] for row in matrix] == [3, 3, 3, 2]  # the "billing" column


def test_compare_rejects_a_bad_upload_and_runs_nothing(db):
    at = app()
    at.button(key="pg_seed").click().run()
    at.switch_page("views/compare.py").run()
    at.radio(key="cmp_source").set_value("upload").run()
    at.file_uploader(key="cmp_upload").set_value(("states.csv", b"id,state\na,fine\nb,\n", "text/csv")).run()
    assert "row 3, column state" in at.error[0].value  # said at upload, before anything runs
    finish_tasks(at.button(key="cmp_run").click().run())
    assert any("row 3, column state" in e.value for e in at.error)
    assert db.list_runs(kind="compare") == []


@pytest.mark.parametrize("column", ["Label", "labels", "answer", "category"])
def test_compare_names_a_label_column_under_another_name(db, column):
    """A column meant as the label but not named `label` is proposed as the label column (shown in the preview),
    and its labels give accuracy once run."""
    from app.core.policies import templates

    db.save_policy(templates()["ticket-routing"])
    at = app("compare")
    at.radio(key="cmp_source").set_value("upload").run()
    csv = f"id,state,{column}\nt1,I was charged twice,billing\nt2,Parcel never came,shipping\n".encode()
    at.file_uploader(key="cmp_upload").set_value(("states.csv", csv, "text/csv")).run()
    assert not at.exception and not at.error and not at.warning
    label = next(s for s in at.selectbox if s.label == "Label column")
    assert label.value == column  # proposed by its name
    assert list(at.table[0].value["label"]) == ["billing", "shipping"]  # the preview shows the labels it reads
    finish_tasks(at.button(key="cmp_run").click().run())
    assert not at.exception
    newest = db.list_runs(kind="compare")[0]
    assert [r["label"] for r in db.results(newest["id"])] == ["billing", "shipping"]  # mapped: accuracy has labels
    assert "label" in frame_with(at, "disagree").columns


def test_history_open_pin_diff_delete(db):
    at = app()
    at.button(key="pg_seed").click().run()
    at.selectbox(key="pg_policy").select("ticket-routing").run()
    at.text_area(key="pg_state").input("Refund my double charge").run()
    at.button(key="pg_run").click().run()
    at.selectbox(key="pg_readout").select("letters").run()
    at.button(key="pg_run").click().run()
    seed, first, second = sorted(r["id"] for r in db.list_runs())
    at.switch_page("views/history.py").run()
    assert len(frame_with(at, "baseline")) == 3
    at.selectbox(key="hist_open").select(first).run()
    at.button(key="hist_pin").click().run()
    assert db.pinned_run()["id"] == first
    runs = frame_with(at, "baseline")
    assert runs.loc[runs["run"] == first, "baseline"].item() == "baseline"  # the pinned run is marked
    at.selectbox(key="hist_open").select(second).run()
    results = frame_with(at, "top_option")
    assert {"p(access)", "p(billing)"} <= set(results.columns) and results.loc[0, "readout"] == "letters"
    diff = frame_with(at, "max_shift")
    assert list(diff["row_key"]) == ["playground"]
    at.button(key="hist_delete").click().run()
    assert sorted(r["id"] for r in db.list_runs()) == [seed, first] and db.results(second) == []


def test_targets_page_add_validate_and_test_connection(db, adapter_server):
    at = app("targets")
    at.selectbox(key="tg_kind").select("semif").run()
    at.text_input(key="tg_name_0").input("adapter")
    at.text_input(key="tg_url_0").input("localhost:8080")
    at.button(key="FormSubmitter:tg_form_0-Save target").click().run()
    assert any("url" in e.value for e in at.error) and db.list_targets() == []
    assert at.text_input(key="tg_name_0").value == "adapter"  # a refused form keeps what was typed
    at.text_input(key="tg_url_0").input(adapter_server.url)
    at.button(key="FormSubmitter:tg_form_0-Save target").click().run()
    assert db.list_targets()[0]["config"]["url"] == adapter_server.url
    assert at.text_input(key="tg_name_1").value == ""  # the next form starts empty
    assert any("url" in m.value and str(adapter_server.port) in m.value and "{" not in m.value
               for m in at.markdown)  # the saved config reads as key: value, not as a Python dict
    at.button(key="tg_test_adapter").click().run()
    at.button(key="tg_test_local").click().run()
    oks = [s.value for s in at.success]
    assert any("is up" in v for v in oks) and any("loaded SmolLM2" in v for v in oks)  # both results stay
    at.selectbox(key="tg_kind").select("local").run()
    assert "tg_model_path_1" not in [w.key for w in at.text_input]  # a shipped model needs no path
    at.selectbox(key="tg_model_pick_1").select("your own GGUF file…").run()
    at.text_input(key="tg_name_1").input("mine")
    at.text_input(key="tg_model_path_1").input("/nope/model.gguf")
    at.button(key="FormSubmitter:tg_form_1-Save target").click().run()
    assert any("existing" in e.value and "gguf file" in e.value for e in at.error) and len(db.list_targets()) == 1


def evaluation_rows(db, runs):
    from app.core import run_calibration

    return run_calibration.readout_table(db, runs)


def test_calibrate_page_evaluates_compares_readouts_and_hands_off_to_deploy(db, tmp_path):
    at = app()
    at.button(key="pg_seed").click().run()
    at.switch_page("views/calibrate.py").run()
    assert "Import a labeled set" in at.info[0].value
    at.button(key="cal_ship").click().run()  # the shipped sets, for the policy/set pairing below
    assert {s["name"] for s in db.list_labeled_sets()} >= {"refund-check.jsonl", "ticket-routing.jsonl"}
    at.selectbox(key="cal_policy").select("agent-next-action").run()
    # agent-next-action has no shipped set: the page says which labels do not fit and runs nothing
    assert any("are not options of" in e.value for e in at.error) and at.button(key="cal_run").disabled
    at.selectbox(key="cal_policy").select("refund-check").run()
    assert db.get_labeled_set(at.selectbox(key="cal_set").value)["policy_id"] == "refund-check"  # its own set
    small = subset_file(tmp_path, "refund-check", 16).read_bytes()  # a small set: this test is about the page
    assert at.selectbox(key="cal_up_policy").value == "refund-check"  # uploads default to the policy picked
    at.file_uploader(key="cal_upload").set_value(("refund-small.jsonl", small, "application/json")).run()
    at.button(key="cal_import").click().run()
    small_id = next(s["id"] for s in db.list_labeled_sets() if s["name"] == "refund-small.jsonl")
    at.selectbox(key="cal_set").select(small_id).run()
    at.multiselect(key="cal_variants").set_value(["default", "letters"]).run()
    finish_tasks(at.button(key="cal_run").click().run())
    assert not at.exception
    runs = db.list_runs(kind="eval")
    assert len(runs) == 2 and all(r["status"] == "done" and r["n_rows"] == 16 for r in runs)
    table = frame_with(at, "ece_corrected")
    assert sorted(table["readout"]) == ["default", "letters"] and (table["rows"] == 16).all()
    best = max(evaluation_rows(db, runs), key=lambda r: r.accuracy).run
    assert at.selectbox(key="cal_run_pick").value == best  # the most accurate of the runs just made is open
    # no row floor: the gate's evidence decides, and the page says why none is recommended (issue 44)
    assert any("unreachable" in e.value and "Clopper" in e.value for e in at.error)
    # the banner names the run and correction it is about (Export this, above it, may show another candidate's gate)
    assert any(e.value.replace("\\", "").startswith(f"Run #{best} with ") and "unreachable" in e.value for e in at.error)
    assert any("decides none of the 16 rows" in w.value and "human\\-review" in w.value for w in at.warning)
    at.checkbox(key="cal_manual").check().run()
    at.slider(key="cal_gate").set_value(0.6).run()
    # the numbers on the page are the exported rule applied to the stored results
    from app.core import run_calibration

    rid = at.selectbox(key="cal_run_pick").value
    cal = run_calibration.calibrate(db, rid, target_accuracy=0.9)
    built = run_calibration.build_policy(db, cal, gate=run_calibration.decide_gate(cal, 0.6), fallback="human-review")
    at_gate = built.metrics.at_gate
    assert at_gate is not None
    metrics = {m.label: m.value for m in at.metric}
    # a hand-set gate: its accuracy is in sample, and the same gate out of fold stands beside it (issue 35)
    assert at.metric[0].label == "Accuracy of decided rows (in sample)"
    assert "Accuracy of decided rows (out of fold)" in metrics
    assert metrics["Coverage"] == f"{at_gate.coverage:.1%}"
    assert any("decides none" in w.value for w in at.warning) == (at_gate.decided == 0)  # warned exactly then
    assert built.gate_source == "hand-set" and built.target_accuracy is None  # how the gate was chosen
    at.button(key="cal_save").click().run()
    (saved,) = db.list_calibrated()
    assert saved["run_id"] == rid and saved["gate_source"] == "hand-set" and saved["threshold"] == 0.6
    assert any("Deploy packages it" in s.value and "0.600" in s.value for s in at.success)
    finish_tasks(at.button(key="cal_run").click().run())  # running again reuses the finished runs (no new rows scored)
    assert len(db.list_runs(kind="eval")) == 2
    at.switch_page("views/deploy.py").run()
    assert at.selectbox(key="dep_cal").value == saved["id"]  # the policy just saved is preselected: no path to type


@pytest.fixture
def runtime_shim(adapter_server):
    from tests.shim import RuntimeShim

    shim = RuntimeShim({"*": adapter_server.url})  # every endpoint name reaches the adapter process
    yield shim
    shim.stop()


def test_deploy_page_plan_confirm_invoke_destroy(db, aws_env, runtime_shim, monkeypatch):
    monkeypatch.setenv("SEMIF_AWS_ENDPOINT_URL", aws_env)
    monkeypatch.setenv("SEMIF_AWS_RUNTIME_URL", runtime_shim.url)
    monkeypatch.setenv("SEMIF_DEPLOY_POLL", "0.01")
    at = app("deploy")
    assert aws_env in at.info[0].value  # the page says where AWS calls go
    at.radio(key="dep_path").set_value("semif")
    at.radio(key="dep_compute").set_value("gpu").run()
    assert "dep_cpu_type" not in [w.key for w in at.text_input]  # the CPU type is hidden for a GPU pool
    at.text_input(key="dep_bucket").input("semif-test-models")
    at.text_input(key="dep_role").input("arn:aws:iam::123456789012:role/sm")
    at.button(key="FormSubmitter:dep_form-Plan").click().run()
    assert any("CodeBuild role ARN" in e.value for e in at.error) and db.list_deployments() == []
    at.text_input(key="dep_cb_role").input("arn:aws:iam::123456789012:role/cb")
    at.button(key="FormSubmitter:dep_form-Plan").click().run()
    assert not at.exception
    assert any("depending on which pool wins" in m.value for m in at.markdown)
    calls = frame_with(at, "call")["call"].tolist()
    assert calls[:3] == ["s3.PutObject", "ecr.CreateRepository", "codebuild.CreateProject"]
    assert "sagemaker.CreateEndpointConfig" in calls
    at.radio(key="dep_compute").set_value("cpu").run()  # a plan for other settings is never confirmable
    assert any("press **Plan** again" in w.value for w in at.warning) and "dep_go" not in [b.key for b in at.button]
    at.radio(key="dep_compute").set_value("gpu").run()  # back to what was planned: the plan is valid again
    first_pkg = Path(at.session_state["dep_planned"].pkg.model_file)
    at.button(key="FormSubmitter:dep_form-Plan").click().run()  # planned again: the unconfirmed package goes
    assert not first_pkg.exists() and Path(at.session_state["dep_planned"].pkg.model_file).exists()
    (newest,) = [d["id"] for d in db.list_deployments() if d["status"] == "planned"]  # the first is superseded
    assert at.selectbox(key="dep_pick").value == newest  # Deployments opens the plan just made, not the older one
    assert at.button(key="dep_go").disabled  # not before the acknowledgement
    at.checkbox(key="dep_ack").check().run()
    at.button(key="dep_go").click().run()
    assert not at.exception, at.exception
    deps = db.list_deployments()
    (dep,) = [d for d in deps if d["status"] == "InService"]
    assert dep["compute"] == "gpu"
    # every plan made on the page is recorded; the one replaced before confirming says so
    assert [d["status"] for d in deps if d is not dep] == ["superseded"]
    # the plan when made, the plan as executed (account id filled in), the outcome
    assert [a["action"] for a in db.audit_log(dep["id"])] == ["plan", "plan", "apply"]
    assert any(t["name"] == dep["endpoint_name"] and t["kind"] == "sagemaker" for t in db.list_targets())
    # the new endpoint is offered as a target in the Playground
    at.switch_page("views/playground.py").run()
    at.button(key="pg_seed").click().run()
    assert dep["endpoint_name"] in at.multiselect(key="pg_targets").options
    # invoke it: the real boto3 sagemaker-runtime client -> the shim -> the adapter process
    at.selectbox(key="pg_policy").select("ticket-routing").run()
    at.text_area(key="pg_state").input("I was charged twice for my order").run()
    at.multiselect(key="pg_targets").set_value(["local", dep["endpoint_name"]]).run()
    at.button(key="pg_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    group = db.list_runs(kind="playground")[0]["group_id"]
    runs = {r["target_name"]: db.results(r["id"])[0] for r in db.runs_in_group(group)}
    assert runs[dep["endpoint_name"]]["probabilities"] == runs["local"]["probabilities"]
    assert any("agree" in s.value for s in at.success)
    at.switch_page("views/deploy.py").run()
    at.selectbox(key="dep_pick").select(dep["id"]).run()
    assert at.button(key="dep_destroy").disabled
    at.text_input(key="dep_confirm_name").input(dep["endpoint_name"]).run()
    at.button(key="dep_destroy").click().run()
    assert db.get_deployment(dep["id"])["status"] == "deleted"
    assert [a["action"] for a in db.audit_log(dep["id"])] == ["plan", "plan", "apply", "destroy"]
    import boto3

    sm = boto3.client("sagemaker", region_name="us-east-1", endpoint_url=aws_env)
    assert dep["endpoint_name"] not in [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]]


def test_a_failed_deploy_stays_on_screen_and_a_reload_keeps_the_form(db, aws_env, monkeypatch):
    """A confirm that AWS refuses (the bucket does not exist): the failure stays on screen, named and
    recorded, the picker shows the attempt as failed at once; a reload (a new session) starts the form from
    the last plan's bucket and roles instead of empty fields."""
    monkeypatch.setenv("SEMIF_AWS_ENDPOINT_URL", aws_env)
    monkeypatch.setenv("SEMIF_DEPLOY_POLL", "0.01")
    for var in ("SEMIF_DEPLOY_BUCKET", "SEMIF_SAGEMAKER_ROLE_ARN", "SEMIF_CODEBUILD_ROLE_ARN"):
        monkeypatch.delenv(var, raising=False)
    at = app("deploy")
    at.radio(key="dep_path").set_value("textgen").run()
    at.text_input(key="dep_bucket").input("semif-no-such-bucket")
    at.text_input(key="dep_role").input("arn:aws:iam::123456789012:role/sm")
    at.button(key="FormSubmitter:dep_form-Plan").click().run()
    at.checkbox(key="dep_ack").check().run()
    at.button(key="dep_go").click().run()
    assert not at.exception, at.exception
    (dep,) = db.list_deployments()
    assert dep["status"] == "failed"
    (err,) = [e.value for e in at.error]
    assert dep["id"] in err and "NoSuchBucket" in err
    picker = at.selectbox(key="dep_pick")
    assert picker.value == dep["id"] and picker.options[picker.index] == f"{dep['id']} · failed · raw model (chat completions)"
    at.run()  # the outcome is kept until the next plan
    assert any(dep["id"] in e.value for e in at.error)
    assert [a["what"].startswith("as run on confirm") for a in db.audit_log(dep["id"]) if a["action"] == "plan"] == \
        [False, True]  # the plan when made, and the plan as it ran: said apart in the audit log
    reloaded = app("deploy")
    assert reloaded.radio(key="dep_path").value == "textgen"  # the last plan's serving path, not the default
    assert reloaded.text_input(key="dep_bucket").value == "semif-no-such-bucket"
    assert reloaded.text_input(key="dep_role").value == "arn:aws:iam::123456789012:role/sm"


@pytest.fixture
def first_listed():
    """A SemIf adapter (HTTP, on 127.0.0.1) with total position bias: whatever the options, it gives the one
    listed first 0.9 and shares 0.1 among the rest - so what the order check must find is known before it runs."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, data: dict) -> None:
            body = json.dumps(data).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # /info: a model without a sha256, so no stored answer stands in for a call
            self._answer({"model": {"file": "first-listed.gguf"}})

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
            ids = [o["id"] for o in req["options"]]
            rest = 0.1 / (len(ids) - 1)
            self._answer({"id": req["id"], "option_ids": ids, "probabilities": [0.9] + [rest] * (len(ids) - 1),
                          "top_option": ids[0], "readout": "letters", "model": {"file": "first-listed.gguf"}})

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_order_check_rotates_options_and_reports_a_verdict(db, first_listed):
    """On a target that always answers the option listed first, every state flips when the two options
    swap, position A is always chosen, each probability moves by 0.8, and P(yes | Q) + P(yes | not Q)
    is 1.8 - the page must show exactly that."""
    at = app()
    at.button(key="pg_seed").click().run()
    db.save_target("first-listed", "semif", {"url": first_listed})
    at.switch_page("views/order_check.py").run()
    at.selectbox(key="oc_policy").select("refund-check").run()
    at.radio(key="oc_source").set_value("paste").run()
    at.text_area(key="oc_paste").input("Bought 3 days ago, it arrived broken\nFinal sale jacket, I changed my mind\n"
                                       "Unopened, bought yesterday")
    at.selectbox(key="oc_target").select("first-listed").run()
    at.text_input(key="oc_negated").input("Does this refund request fail the policy?")
    finish_tasks(at.button(key="oc_run").click().run())
    assert not at.exception
    (run,) = db.list_runs(kind="order-check")
    results = db.results(run["id"])
    keys = [r["row_key"] for r in results]
    assert len(keys) == 3 * (2 + 1) and sum("#not" in k for k in keys) == 3  # 2 orders + the negated question
    assert all(r["error"] is None for r in results) and run["target_name"] == "first-listed"
    assert at.metric[0].value == "100%"  # both orders answered the option listed first: yes, then no
    table = frame_with(at, "flipped")
    assert len(table) == 3 and list(table["order 0"]) == ["yes"] * 3 and list(table["order 1"]) == ["no"] * 3
    assert table["flipped"].all()
    assert at.metric[2].value == "1.80"  # the negated question lists yes first too: 0.9 + 0.9
    position_chart, shift_chart = (json.loads(c.proto.spec) for c in at.get("plotly_chart"))
    assert plotted(position_chart["data"][0]["x"]) == ["A", "B"] and plotted(position_chart["data"][0]["y"]) == [6, 0]
    assert plotted(shift_chart["data"][0]["x"]) == ["yes", "no"]
    assert plotted(shift_chart["data"][0]["y"]) == pytest.approx([0.8, 0.8])  # 0.9 first, 0.1 second
    verdict = re.sub(r"\\(.)", r"\1", at.warning[0].value)  # the text under its markdown escapes
    assert "Order changes the answer in 100% of 3 states" in verdict
    assert "The model prefers position A: it chose it 100% of the time" in verdict
    assert "P(yes | question) + P(yes | negated question) averages 1.80 (off by 0.80 on average" in verdict
    assert "a first look" in verdict  # a handful of states: the verdict says what it rests on
    assert len(at.get("download_button")) == 2


def test_robustness_page_shows_what_the_cli_computes(db, tmp_path):
    """The page and `python -m app robustness` on the same states: the same rows scored, the same
    rates, intervals and verdicts (the page's JSON download is the CLI's --json)."""
    import subprocess
    import sys

    from app.core import robustness

    states = ["I was charged twice for March, please refund one payment.",
              "The parcel tracking link is dead. It has said in transit for nine days.",
              "Two-factor codes never arrive since I changed phones."]
    at = app()
    at.button(key="pg_seed").click().run()
    at.switch_page("views/robustness.py").run()
    at.selectbox(key="rb_policy").select("ticket-routing").run()
    at.radio(key="rb_source").set_value("paste").run()
    at.text_area(key="rb_paste").input("\n".join(states))
    at.multiselect(key="rb_checks").set_value(["steering", "paraphrase"])
    at.number_input(key="rb_attempts").set_value(2)
    finish_tasks(at.button(key="rb_run").click().run())
    assert not at.exception, at.exception
    (run,) = db.list_runs(kind="robustness")
    assert run["status"] == "done" and run["config"]["guard"] == "erase-and-check"
    report = robustness.report_for(db, run["id"])
    shown = " ".join(m.value for m in (*at.success, *at.warning, *at.error))
    for check, (_, text) in report.verdicts.items():
        assert robustness.CHECK_LABELS[check] in shown
    assert frame_with(at, "hijacked")["hijacked"].sum() == report.attempts["hijacked"].sum()

    states_file = tmp_path / "states.jsonl"
    states_file.write_text("".join(json.dumps({"id": f"s{i}", "state": s}) + "\n" for i, s in enumerate(states)))
    out = tmp_path / "cli.json"
    proc = subprocess.run([sys.executable, "-m", "app", "robustness", "--policy", "ticket-routing", "--states",
                           str(states_file), "--target", "local", "--attempts", "2", "--checks", "steering,paraphrase",
                           "--guard", "erase-and-check", "--json", str(out), "--db", str(tmp_path / "cli.db"), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    cli = json.loads(out.read_text())
    page = report.summary.to_json()
    for key in ("n", "base", "changes", "verdicts"):
        assert cli[key] == page[key], key
    assert cli["changes"]["steering"]["attempts"] == 6 and "hijack_rate" in cli["changes"]["steering"]

"""The display builders below the Calibrate, Compare and Robustness pages: the words they say, and that
user text (a target's name, a fallback option, a guard) goes through the page's escaping and numbers do not."""
from __future__ import annotations

from dataclasses import replace

import pandas as pd

from app.service import calibrate_panels as panels
from app.service import compare_panels, robustness_panels
from app.service.decide import Comparison
from adapter.policy import AtGate
from app.core.run_calibration import Readout
from app.service.display import Note
from app.service.evaluate import EvalOutcome


def esc(text: object) -> str:
    return f"<{text}>"


def test_a_gate_that_decides_nothing_says_so_and_one_that_decides_says_nothing():
    said = panels.nothing_decided(AtGate(decided=0, n=24), "human-review")
    assert said is not None and "none of the 24 rows" in said and "human-review" in said
    assert panels.nothing_decided(AtGate(decided=3, n=24), "human-review") is None


def test_the_saved_note_names_the_gate_the_fallback_and_the_head():
    note = panels.Saved(7, "refund", 0.8123, "human-review", "the hidden-state head")
    text = note.text(esc)
    assert "calibrated policy #7" in text and "**0.812**" in text and "**<human-review>**" in text
    assert "its learned head (the hidden-state head) decides every row" in text
    assert "no gate is set" in panels.Saved(8, "refund", None, "x", None).text()
    assert note[0] == 7  # the Deploy page preselects the policy just saved by the first item


def test_the_support_caption_says_rows_per_option_and_a_stop_early_cap():
    whole = {"scored": 40, "total": 40, "per_option": {"yes": 20, "no": 20}, "train": 0}
    assert panels.support_caption(3, whole, "about 1 min") == "Set #3: 40 rows to score - 20 yes, 20 no · about 1 min"
    capped = {**whole, "scored": 10, "train": 5}
    assert panels.support_caption(3, capped, "t", esc) == ("Set #3: 10 of 40 rows to score (Stop early) - about 20 yes, "
                                                          "20 no; 5 train rows never scored · <t>")


def test_outcome_notes_put_a_failure_first_and_an_error_as_an_error():
    outcomes = [EvalOutcome("local · default", error="no model"), EvalOutcome("local · letters", same_as="default")]
    notes = panels.outcome_notes("failed", "boom", "", outcomes, esc)
    assert notes[0] == Note("error", "**Evaluation**: <boom>")
    assert [n.kind for n in notes[1:]] == ["error", "caption"] and notes[1].text == "<local · default: no model>"
    assert panels.outcome_notes("stopped", None, "stopped at 10", [], esc) == (Note("info", "<stopped at 10>"),)


def test_the_run_picker_label():
    row = Readout(4, "v2", "local", "letters", None, "done", "calibrated", accuracy=0.9123)
    assert panels.run_label(row) == "#4 · v2 · local · letters · accuracy 91.2%"
    assert panels.run_label(replace(row, shape="run", accuracy=None)) == "#4 · v2 · local · letters"


def test_a_readout_row_has_the_columns_of_its_shape_titled_as_the_page_shows_them():
    run = Readout(4, "v2", "local", "letters", None, "running: fewer than 4 labeled rows scored so far")
    assert list(run.row()) == ["run", "policy version", "target", "readout", "examples", "status"]
    head = replace(run, status="done", shape="head", rows=16, correction="a learned head only")
    assert list(head.row())[6:] == ["rows", "correction"] and head.row()["rows"] == 16
    done = replace(run, status="done", shape="calibrated", rows=16, accuracy=0.75, macro_f1=0.7, ece=0.1,
                   ece_corrected=0.05, nll=0.6, correction="temperature", accuracy_corrected=0.8)
    assert list(done.row())[6:] == ["rows", "accuracy", "macro_f1", "ece", "ece_corrected", "nll", "correction",
                                    "accuracy_corrected"] and done.row()["accuracy"] == 0.75


def comparison(answers: pd.DataFrame, agreement: pd.DataFrame) -> Comparison:
    results = pd.DataFrame({"target": ["a", "b"], "error": [None, "timeout"], "cold": [0, 0]})
    return Comparison([], results, pd.DataFrame(), pd.DataFrame(), agreement, answers)


def test_compare_filters_answers_and_drops_label_columns_without_labels():
    answers = pd.DataFrame({"state": ["x", "y", "z"], "disagree": [True, False, True], "wrong": [True, False, False],
                            "label": ["a", "b", "a"]})
    shown = comparison(answers, pd.DataFrame([[1.0, 0.5], [0.5, 1.0]], index=["a", "b"], columns=["a", "b"]))
    assert list(compare_panels.answer_rows(shown, True, True)["state"]) == ["x"]
    unlabeled = comparison(answers.assign(label=None), shown.agreement)
    assert "label" not in compare_panels.answer_rows(unlabeled, False, False)
    verdict = compare_panels.verdict(shown, esc)
    assert (verdict.disagreements, verdict.wrong, verdict.labeled) == (2, 1, True)
    assert verdict.failed == "1 calls failed, e.g. <b>: <timeout>"
    assert verdict.same_top is not None and verdict.same_top.value == "50% of states" and "<a> vs <b>" in str(
        verdict.same_top.help)


def test_robustness_names_the_deployed_guard_and_a_what_if():
    cfg = {"deployed_guard": "precheck", "what_if_guard": "erase-and-check", "variant": "default", "states": 12}
    assert robustness_panels.guard_words(cfg, esc) == "guard <precheck> as deployed, what-if guard <erase-and-check>"
    assert robustness_panels.guard_words({"guard": "none"}) == "guard none"
    run = {"policy": {"name": "Refund"}, "target_name": "local", "config": cfg}
    assert robustness_panels.run_label(run) == ("Refund · local · default · guard precheck (what-if erase-and-check) "
                                                "· 12 states")


def test_the_guard_note_keeps_its_bold_and_escapes_the_rest(tmp_path):
    """The 300-state walk read 'Steering guard **erase-and-check** (...)' on Calibrate: the page escaped the whole
    note, its markdown included. Now the note escapes what it quotes and keeps the guard's name bold."""
    from types import SimpleNamespace

    from app.core.store import Store
    from app.ui.safe_text import md

    store = Store(tmp_path / "wb.db")
    exported = SimpleNamespace(policy=SimpleNamespace(guard="erase-and-check", policy_id="refund-check"))
    note = panels.guard_cost_note(store, exported, md)
    assert note.startswith("Steering guard **erase\\-and\\-check** (the export's default"), note
    assert "\\*\\*" not in note and "no as\\-deployed Robustness check" in note, note
    off = panels.guard_cost_note(store, SimpleNamespace(policy=SimpleNamespace(guard="none", policy_id="p")))
    assert off.startswith("Steering guard **none** - turned off. What that costs: "), off

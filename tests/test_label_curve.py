"""What more labels buy (issue 44 item 5): the expected gate coverage with N more rows under the same
Clopper-Pearson rule, recomputed by hand; and the command line prints the curve, the expected accuracy and
coverage with N more and today's interval, and writes the same figures into the exported file."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import beta

from streamlit.testing.v1 import AppTest

from app.core import label_curve as lc
from app.ui.keys import CALIBRATE
from app.ui.safe_text import md
from tests.conftest import ROOT, calibrate_cli


def bound(k: int, m: int) -> float:
    """One-sided 95% Clopper-Pearson lower bound, from the beta quantile directly."""
    return 0.0 if k == 0 else float(beta.ppf(0.05, k, m - k + 1))


def by_hand(conf: np.ndarray, correct: np.ndarray, rows: int, target: float) -> float | None:
    """Every distinct threshold, its decided rows scaled to `rows`: the widest coverage whose bound clears."""
    best = None
    for t in np.unique(conf):
        d = conf >= t
        c, a = d.mean(), correct[d].mean()
        m = int(round(c * rows))
        if m and bound(int(round(a * m)), m) >= target:
            best = c if best is None else max(best, c)
    return best


def test_more_rows_tighten_the_bound_until_a_gate_decides():
    conf = np.linspace(0.99, 0.5, 20)
    correct = np.array([True] * 15 + [False, True, False, False, True])
    assert bound(15, 15) < 0.9 <= bound(30, 30)  # 15 of 15 right is not enough evidence; 30 of 30 is
    assert lc.coverage_with(conf, correct, 20, 0.9) is None
    assert lc.coverage_with(conf, correct, 40, 0.9) == pytest.approx(0.75) == by_hand(conf, correct, 40, 0.9)
    for rows in (20, 40, 60, 120, 400):  # the widest coverage grows with the evidence, as recomputed by hand
        assert lc.coverage_with(conf, correct, rows, 0.9) == by_hand(conf, correct, rows, 0.9)
    assert (lc.coverage_with(conf, correct, 400, 0.9) or 0) > 0.75


def test_the_command_line_the_page_and_the_file_say_what_more_labels_buy(tmp_path, monkeypatch):
    db, out, stdout = calibrate_cli(tmp_path, "ticket-routing", 24, "--head", "none", "--learning-curve")
    metrics = json.loads(out.read_text())["metrics"]
    curve = metrics["label_curve"]
    assert [p["share"] for p in curve["points"]] == [0.5, 0.75, 1.0] and curve["points"][-1]["rows"] == 24
    chosen = metrics["correction"]["chosen"]
    oof = next(c["oof_accuracy"] for c in metrics["correction"]["candidates"] if c["name"] == chosen)
    assert curve["points"][-1]["accuracy"] == pytest.approx(oof)  # the 100% point is the export's own figure
    assert [m["rows"] for m in curve["more"]] == [12, 24]
    low, high = curve["accuracy_interval_95"]
    assert low < oof < high
    printed = next(line for line in stdout.splitlines() if line.startswith("what more labels buy: "))
    assert printed.removeprefix("what more labels buy: ") == curve["note"]
    assert metrics["gate_notes"][-1] == "What more labels buy: " + curve["note"]
    assert f"95% interval of {low:.0%}–{high:.0%}" in printed
    for m in curve["more"]:  # each expected figure is said, coverage by the same rule as above
        said = (f"a gate deciding about {m['coverage']:.0%} of rows" if m["coverage"] is not None
                else "still no gate at 90%")
        assert f"{m['rows']} more: about {m['accuracy']:.0%} accuracy, {said}" in printed
    # the page, on the same run: the panel's table of N more, its sentence, and the export carrying both
    monkeypatch.setenv("SEMIF_DB", str(db))
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=300)
    at.run()
    at.switch_page("views/calibrate.py").run()
    at.selectbox(key="cal_policy").select("ticket-routing").run()
    at.checkbox(key=CALIBRATE("curve")).check().run()
    assert not at.exception, at.exception
    shown = [json.loads(j.value) for j in at.json if "label_curve" in j.value]
    assert shown, "the page's export carries metrics.label_curve once the panel is shown"
    page_curve = shown[0]["metrics"]["label_curve"]
    assert any(md(page_curve["note"]) in c.value for c in at.caption)  # the caption is the escaped sentence
    (more,) = [d.value for d in at.dataframe if "more labeled rows" in d.value.columns]
    assert list(more["more labeled rows"]) == [m["rows"] for m in page_curve["more"]]


def test_a_curve_point_says_how_many_rows_it_was_refitted_on(monkeypatch):
    """subset keeps at least 2 rows of each label: with many rare labels "50%" is more than half the rows, and the
    point (its caption, and the a - b/sqrt(rows) fit) must carry the rows actually used, not round(share * n)."""
    from types import SimpleNamespace

    y = np.array([0] * 20 + [c for c in range(1, 11) for _ in range(2)])  # 40 rows: one label of 20, ten of 2
    used: dict[float, list[int]] = {}

    def fake_oof(cal, idx, seed=0):
        used.setdefault(len(idx) / len(y), []).append(len(idx))
        return 0.8

    monkeypatch.setattr(lc, "oof_accuracy", fake_oof)
    oof = np.eye(11)[y] * 0.9 + 0.01
    cal = SimpleNamespace(y=y, chosen_name="temperature", target_accuracy=0.9, oof=oof,
                          gate=SimpleNamespace(reachable=True, coverage=1.0, reach=None))
    curve = lc.label_curve(cal, repeats=2)
    assert [p.rows for p in curve.points] == [30, 35, 40]  # 10 + 2*10, 15 + 2*10, all
    assert sorted(len(v) for v in used.values()) == [1, 2, 2]
    assert "80.0% on 30 rows" in curve.sentence

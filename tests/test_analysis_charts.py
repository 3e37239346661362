"""Comparisons and chart builders on hand-made data: numbers and figure data checked."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from app.core import analysis

from app.ui import charts


def frame():
    runs = [{"id": 1, "target_name": "local"}, {"id": 2, "target_name": "gpu"}]
    res = {1: [], 2: []}
    tops = {1: ["a", "b", "a", "a"], 2: ["a", "a", "a", None]}
    lat = {1: [0.1, 0.2, 0.3, 0.4], 2: [1.0, 1.0, 2.0, 5.0]}
    for rid in (1, 2):
        for i in range(4):
            err = "timeout" if tops[rid][i] is None else None
            res[rid].append({"row_key": f"r{i}", "position": i, "state": f"s{i}", "label": None,
                             "top_option": tops[rid][i], "option_ids": ["a", "b"],
                             "probabilities": None if err else [0.6, 0.4], "label_mass": 0.5,
                             "latency_s": lat[rid][i], "error": err})
    return analysis.results_frame(runs, res)


def test_latency_stats_skip_errors():
    s = analysis.latency_stats(frame()).set_index("target")
    assert s.loc["local", "p50_ms"] == pytest.approx(250.0)
    assert s.loc["local", "max_ms"] == pytest.approx(400.0)
    assert s.loc["gpu", "errors"] == 1 and s.loc["gpu", "max_ms"] == pytest.approx(2000.0)
    assert s.loc["gpu", "p95_ms"] == pytest.approx(np.percentile([1000, 1000, 2000], 95))
    assert s.loc["local", "p50_vs_first"] == 1.0 and s.loc["gpu", "p50_vs_first"] == pytest.approx(1000 / 250)


def test_agreement_and_disagreements():
    m = analysis.agreement_matrix(frame())
    assert m.loc["local", "local"] == 1.0
    assert m.loc["local", "gpu"] == pytest.approx(2 / 3)  # r3 failed on gpu: compared on 3 rows
    d = analysis.disagreements(frame()).set_index("row_key")
    assert list(d["disagree"]) == [False, True, False, False]
    assert d.loc["r1", "local"] == "b" and d.loc["r1", "gpu"] == "a" and d.loc["r1", "state"] == "s1"


def test_diff_runs_reports_changes_and_shifts():
    base = [{"row_key": "x", "state": "s", "option_ids": ["a", "b"], "probabilities": [0.8, 0.2], "top_option": "a"},
            {"row_key": "y", "state": "t", "option_ids": ["a", "b"], "probabilities": [0.4, 0.6], "top_option": "b"}]
    other = [{"row_key": "x", "state": "s", "option_ids": ["a", "b"], "probabilities": [0.3, 0.7], "top_option": "b"},
             {"row_key": "z", "state": "u", "option_ids": ["a", "b"], "probabilities": [0.5, 0.5], "top_option": "a"}]
    d = analysis.diff_runs(base, other)
    assert list(d["row_key"]) == ["x"]
    assert bool(d.loc[0, "changed"]) and d.loc[0, "max_shift"] == pytest.approx(0.5)
    # same key, another state (two Playground runs): not the same row
    assert analysis.diff_runs(base, [{**other[0], "state": "another ticket"}]).empty


def test_latency_and_agreement_figures():
    df = frame()
    box = charts.latency_box(df)
    assert [t.name for t in box.data] == ["local", "gpu"]
    assert list(box.data[1].y) == pytest.approx([1000, 1000, 2000])  # the failed call is not a latency
    ecdf = charts.latency_ecdf(df)
    assert list(ecdf.data[0].y) == pytest.approx([0.25, 0.5, 0.75, 1.0])
    heat = charts.agreement_heatmap(analysis.agreement_matrix(df))
    assert np.asarray(heat.data[0].z)[0, 1] == pytest.approx(2 / 3)


def test_shift_bars_marks_changed_rows():
    d = pd.DataFrame([{"row_key": "x", "state": "s", "baseline_top": "a", "top": "b", "changed": True,
                       "max_shift": 0.5, "shift_option": "a", "shift": -0.5}])
    fig = charts.shift_bars(d)
    assert list(fig.data[0].y) == [-0.5] and fig.data[0].marker.color[0] == "#d62728"


def test_progress_eta_ignores_rows_finished_before_a_resume(monkeypatch):
    from app.core import runner

    clock = iter([100.0, 102.0])  # start, then 2 s later (a fake clock: no timing in tests)
    monkeypatch.setattr(runner.time, "perf_counter", lambda: next(clock))
    seen = []
    p = runner.Progress(10, lambda d, t, e: seen.append((d, t, e)), already=6)
    assert p.done == 6 and seen == []
    p.tick()
    assert seen[-1] == (7, 10, 2.0 / 1 * 3)  # 1 row timed in 2 s, 3 rows left -> 6 s
    assert runner.progress_text(10, 10, 0.0).endswith("done") and "about 6 s left" in runner.progress_text(7, 10, 6.0)


def test_a_target_that_answers_one_option_for_everything_is_named():
    import pandas as pd

    from app.core import analysis

    rows = [{"target": "tiny", "top_option": "reject", "label": "approve" if i % 2 else "reject", "error": None}
            for i in range(30)]
    rows += [{"target": "big", "top_option": "approve" if i % 2 else "reject", "label": "approve" if i % 2 else
              "reject", "error": None} for i in range(30)]
    df = pd.DataFrame(rows)
    assert analysis.degenerate_targets(df) == [{"target": "tiny", "option": "reject", "share": 1.0, "n": 30}]
    conf = analysis.confusion_by_target(df, ["approve", "reject"])
    assert conf["tiny"] == [[0, 15], [0, 15]] and conf["big"] == [[15, 0], [0, 15]]
    acc = analysis.accuracy_by_target(df).set_index("target")
    assert acc.loc["tiny", "wrong"] == 15 and acc.loc["tiny", "ci_low"] < 0.5 < acc.loc["tiny", "ci_high"]


def test_a_set_says_what_it_can_support_before_scoring():
    from app.core.labeled import set_support

    rows = [{"label": "yes" if i % 3 else "no", "split": "train" if i < 12 else "test"} for i in range(42)]
    s = set_support(rows, ["yes", "no"])
    assert s["scored"] == 30 and s["train"] == 12 and s["per_option"] == {"yes": 20, "no": 10}
    assert not s["gate"] and s["offsets"] and "no gate will be recommended" in s["messages"][0]
    thin = set_support([{"label": "yes"}] * 60 + [{"label": "no"}] * 2, ["yes", "no"])
    assert thin["gate"] and thin["provisional"] and not thin["offsets"] and "no (2)" in thin["messages"][-1]


def test_order_check_advice_never_suggests_what_the_run_already_did():
    import pandas as pd

    from app.core.order_sensitivity import verdict

    positions = pd.DataFrame({"position": ["A", "B"], "chosen": [5, 5], "label": [5, 5]})
    plain = verdict(0.4, positions, None, 10)
    assert "content-free correction for this policy" in plain and "run the check on a labeled set" in plain
    used = verdict(0.4, positions, None, 10, debias="content-free", labeled=True)
    assert "even with the content-free correction this run used" in used
    assert "run the check on a labeled set" not in used and "check more of the set's states" in used

"""Comparisons and chart builders on hand-made data: numbers and figure data checked."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from app.core import analysis
from app.core.calibration import RiskCoverage

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


def test_latency_sentence_says_what_a_first_call_paid_for():
    """A local model is loaded before the clock starts: its first call on a policy is the policy's first
    pass and, with the content-free correction, the prior's passes - not "model load"."""
    cold = analysis.latency_sentence(4.2, True, None, local=True, prior=True)
    assert cold.startswith("this call 4.2 s (first call on this policy: the policy's first pass and its content-free "
                           "correction prior (3 more passes); the model load is not timed)")
    assert "prior" not in analysis.latency_sentence(1.1, True, None, local=True, prior=False)
    remote = analysis.latency_sentence(0.8, True, {"n": 3, "p50_ms": 120.0, "p95_ms": 200.0}, local=False)
    assert "connection set-up, the policy's first pass" in remote and remote.endswith("p50 120 ms, p95 200 ms, n=3")
    assert analysis.latency_sentence(0.12, False, None) == "this call 120 ms (warm) · no warm calls measured yet"


def test_latency_and_agreement_figures():
    """Every trace's plotted values against the rows of frame() (latencies in s -> ms)."""
    df = frame()
    box = charts.latency_box(df)
    assert [t.name for t in box.data] == ["local", "gpu"]
    assert list(box.data[0].y) == pytest.approx([100, 200, 300, 400])
    assert list(box.data[1].y) == pytest.approx([1000, 1000, 2000])  # the failed call is not a latency
    ecdf = charts.latency_ecdf(df)
    assert [t.name for t in ecdf.data] == ["local", "gpu"]
    assert list(ecdf.data[0].x) == pytest.approx([100, 200, 300, 400])
    assert list(ecdf.data[0].y) == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert list(ecdf.data[1].x) == pytest.approx([1000, 1000, 2000])
    assert list(ecdf.data[1].y) == pytest.approx([1 / 3, 2 / 3, 1.0])
    heat = charts.agreement_heatmap(analysis.agreement_matrix(df))
    # local vs gpu: r0 a/a, r1 b/a, r2 a/a agree on 2 of the 3 rows both answered
    assert list(heat.data[0].x) == list(heat.data[0].y) == ["local", "gpu"]
    assert np.allclose(np.asarray(heat.data[0].z), [[1.0, 2 / 3], [2 / 3, 1.0]])
    assert [list(r) for r in heat.data[0].text] == [["100%", "67%"], ["67%", "100%"]]


def test_shift_bars_marks_changed_rows():
    d = pd.DataFrame([{"row_key": "x", "state": "s", "baseline_top": "a", "top": "b", "changed": True,
                       "max_shift": 0.5, "shift_option": "a", "shift": -0.5},
                      {"row_key": "y", "state": "t", "baseline_top": "b", "top": "b", "changed": False,
                       "max_shift": 0.1, "shift_option": "b", "shift": 0.1}])
    fig = charts.shift_bars(d)
    bar = fig.data[0]
    assert list(bar.x) == ["x", "y"] and list(bar.y) == [-0.5, 0.1]
    assert list(bar.marker.color) == ["#d62728", "#7f7f7f"]  # red: the top option changed
    assert np.asarray(bar.customdata).tolist() == [["a", "a", "b"], ["b", "b", "b"]]
    assert len(charts.shift_bars(d.iloc[:0]).data[0].x) == 0  # no rows, no bars (and no error)


def test_probabilities_by_target_follows_the_first_targets_order():
    fig = charts.probabilities_by_target({"local": (["a", "b", "c"], [0.2, 0.7, 0.1]),
                                          "gpu": (["c", "a", "b"], [0.5, 0.3, 0.2]),
                                          "partial": (["b"], [1.0])})
    assert [t.name for t in fig.data] == ["local", "gpu", "partial"]
    assert all(list(t.y) == ["a", "b", "c"] and t.orientation == "h" for t in fig.data)
    assert list(fig.data[0].x) == [0.2, 0.7, 0.1]
    assert list(fig.data[1].x) == [0.3, 0.2, 0.5]  # gpu's own order mapped onto local's: c=.5 at the bottom
    assert list(fig.data[2].x) == [0.0, 1.0, 0.0]  # an option a target did not return is 0
    assert list(fig.data[1].text) == ["30%", "20%", "50%"]
    assert tuple(fig.layout.xaxis.range) == (0, 1.1) and fig.layout.xaxis.tickvals[-1] == 1  # room for "100%"
    assert charts.probabilities_by_target({}).data == ()


def test_reliability_diagram_plots_each_bin():
    before = [{"confidence": 0.3, "accuracy": 0.2, "count": 4}, {"confidence": 0.8, "accuracy": 0.9, "count": 16}]
    after = [{"confidence": 0.5, "accuracy": 0.5, "count": 20}]
    fig = charts.reliability_diagram(before)
    assert [t.name for t in fig.data] == ["perfectly calibrated", "raw"]
    assert list(fig.data[1].x) == [0.3, 0.8] and list(fig.data[1].y) == [0.2, 0.9]
    # marker area follows the count: 6 + 24 * sqrt(count / max) = 6 + 24 * 0.5, 6 + 24
    assert list(fig.data[1].marker.size) == pytest.approx([18.0, 30.0])
    assert list(fig.data[1].customdata) == [4, 16]
    both = charts.reliability_diagram(before, after, after_label="fitted")
    assert [t.name for t in both.data] == ["perfectly calibrated", "raw", "fitted"]
    assert list(both.data[2].x) == [0.5] and list(both.data[2].marker.size) == pytest.approx([30.0])


def test_confusion_heatmap_is_the_matrix():
    fig = charts.confusion_heatmap([[5, 1], [2, 7]], ["yes", "no"])
    assert np.asarray(fig.data[0].z).tolist() == [[5, 1], [2, 7]]
    assert list(fig.data[0].x) == list(fig.data[0].y) == ["yes", "no"]


def test_coverage_curve_marks_the_gate_at_the_share_of_rows_it_decides():
    curve = RiskCoverage(threshold=np.array([0.9, 0.7, 0.5, 0.3]), coverage=np.array([0.25, 0.5, 0.75, 1.0]),
                         accuracy=np.array([1.0, 1.0, 0.67, 0.5]))
    fig = charts.coverage_curve(curve, gate=0.6, target=0.9)
    assert list(fig.data[0].x) == curve.coverage.tolist() and list(fig.data[0].y) == curve.accuracy.tolist()
    assert list(fig.data[0].customdata) == curve.threshold.tolist()
    lines = {(s.x0, s.x1, s.y0, s.y1) for s in fig.layout.shapes}
    # 2 of the 4 thresholds are >= 0.6: the gate line sits at 50% coverage; the target line at 90%
    assert any(x0 == x1 == 0.5 for x0, x1, _, _ in lines) and any(y0 == y1 == 0.9 for _, _, y0, y1 in lines)
    assert len(charts.coverage_curve(curve, gate=None).layout.shapes) == 0


def test_rate_bars_intervals_and_rows_without_a_rate_left_out():
    rows = [{"label": "steering", "rate": 0.2, "low": 0.1, "high": 0.4, "n": 10},
            {"label": "paraphrase", "rate": None, "low": None, "high": None, "n": 0},
            {"label": "order", "rate": 0.5, "low": 0.3, "high": 0.6, "n": 20}]
    fig = charts.rate_bars(rows, "Rates", worry=0.1)
    bar = fig.data[0]
    assert list(bar.y) == ["steering (n=10)", "order (n=20)"] and list(bar.x) == [0.2, 0.5]
    assert list(bar.error_x.array) == pytest.approx([0.2, 0.1]) and list(bar.error_x.arrayminus) == pytest.approx([0.1, 0.2])
    assert [t.strip() for t in fig.data[1].text] == ["20%", "50%"]
    assert [s.x0 for s in fig.layout.shapes] == [0.1]


def test_bar_labels_never_rotate():
    """A "6%" label inside a short bar was turned on its side (plotly rotates or shrinks inside text
    that does not fit): the probabilities are written level after each bar, a rate level to the right
    of its interval (after the bar it would sit on the interval's line), with room past 100%."""
    fig = charts.probabilities_by_target({"local": (["a", "b"], [0.06, 0.94]), "gpu": (["a", "b"], [1.0, 0.0])})
    for bar in fig.data:
        assert bar.textangle == 0 and bar.textposition == "outside" and bar.cliponaxis is False
    assert fig.layout.xaxis.range[1] > 1 and max(fig.layout.xaxis.tickvals) == 1  # "100%" fits, no "110%" tick
    rows = [{"label": "steering", "rate": 0.06, "low": 0.02, "high": 0.19, "n": 30},
            {"label": "order", "rate": 0.97, "low": 0.83, "high": 0.99, "n": 30}]
    fig = charts.rate_bars(rows, "Rates")
    bar, labels = fig.data
    assert bar.text is None  # nothing inside the bars to rotate or shrink
    assert labels.mode == "text" and labels.textposition == "middle right" and list(labels.x) == [0.19, 0.99]
    assert [t.strip() for t in labels.text] == ["6%", "97%"] and fig.layout.xaxis.range[1] > 1


def test_flip_bars_stack_the_counts_per_class_and_leave_empty_kinds_out():
    fig = charts.flip_bars({"yes": {"fixed": 2, "broken": 1, "same": 9}, "no": {"broken": 3, "shift": 0}})
    assert [t.name for t in fig.data] == ["fixed", "broken"]
    assert [list(t.x) for t in fig.data] == [["yes", "no"], ["yes", "no"]]
    assert [list(t.y) for t in fig.data] == [[2, 0], [1, 3]]
    assert [t.marker.color for t in fig.data] == [charts.DRIFT_COLORS["fixed"], charts.DRIFT_COLORS["broken"]]


def test_drift_scatter_one_trace_per_kind_with_the_rows_values():
    pairs = pd.DataFrame([{"row_key": "r1", "kind": "broken", "a_p": 0.8, "a_top_in_b": 0.3, "a_top": "a", "b_top": "b"},
                          {"row_key": "r2", "kind": "same", "a_p": 0.6, "a_top_in_b": 0.62, "a_top": "b", "b_top": "b"},
                          {"row_key": "r3", "kind": "broken", "a_p": 0.9, "a_top_in_b": 0.1, "a_top": "a", "b_top": "c"}])
    fig = charts.drift_scatter(pairs, 0.1)
    assert [t.name for t in fig.data] == ["unchanged", "broken", "same"]
    assert list(fig.data[1].x) == [0.8, 0.9] and list(fig.data[1].y) == [0.3, 0.1]
    assert np.asarray(fig.data[1].customdata).tolist() == [["r1", "a", "b"], ["r3", "a", "c"]]
    assert list(fig.data[2].x) == [0.6] and list(fig.data[2].y) == [0.62]


def test_accuracy_intervals_skip_runs_without_a_rate():
    fig = charts.accuracy_intervals(["A", "B", "C"], [0.8, None, 0.6], [0.7, None, 0.4], [0.9, None, 0.7])
    pts = fig.data[0]
    assert list(pts.x) == ["A", "C"] and list(pts.y) == [0.8, 0.6]
    assert list(pts.error_y.array) == pytest.approx([0.1, 0.1]) and list(pts.error_y.arrayminus) == pytest.approx([0.1, 0.2])


def test_progress_eta_times_rows_after_the_first_and_ignores_rows_finished_before_a_resume(monkeypatch):
    """The first row of a session pays for the model load and the policy's first passes (40 s here);
    an ETA from it said '770 s left' for a 100-s run. Rows before a resume are counted, not timed."""
    from app.core import runner

    clock = iter([100.0, 140.0, 144.0])  # start; row 7 done at 140 s; row 9 at 144 s (two rows after the first)
    monkeypatch.setattr(runner.time, "perf_counter", lambda: next(clock))
    seen = []
    p = runner.Progress(12, lambda d, t, e: seen.append((d, t, e)), already=6)
    assert p.done == 6 and seen == []
    p.tick()  # row 7: the slow first one
    p.tick()  # row 8: one row timed after it - not yet an estimate
    assert [e for _, _, e in seen] == [None, None]
    p.tick()  # row 9: two rows in 4 s after the first -> 2 s a row, 3 left -> 6 s
    assert seen[-1] == (9, 12, 6.0)
    assert runner.progress_text(12, 12, 0.0).endswith("done") and "about 6 s left" in runner.progress_text(9, 12, 6.0)


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

    rows = [{"label": "yes" if i % 3 else "no", "split": "train" if i < 16 else "test"} for i in range(42)]
    s = set_support(rows, ["yes", "no"])
    assert s["scored"] == 26 and s["train"] == 16 and s["per_option"] == {"yes": 18, "no": 8}
    # 26 of 26 right: the one-sided 95% Clopper-Pearson bound 0.05 ** (1/26) is below 90%; 29 rows clear it
    assert 0.05 ** (1 / 26) < 0.9 <= 0.05 ** (1 / 29) and 0.05 ** (1 / 28) < 0.9
    assert not s["gate"] and s["offsets"] and "no gate for 90% can be recommended" in s["messages"][0]
    thin = set_support([{"label": "yes"}] * 60 + [{"label": "no"}] * 2, ["yes", "no"])
    assert thin["gate"] and thin["provisional"] and not thin["offsets"] and "no (2)" in thin["messages"][-1]
    # Stop early at 12 rows: the limit, not the set, decides what can be recommended
    early = set_support([{"label": "yes"}] * 60 + [{"label": "no"}] * 2, ["yes", "no"], limit=12)
    assert (early["scored"], early["total"], early["gate"]) == (12, 62, False)
    assert early["messages"][0].startswith("12 of 62 rows will be scored (Stop early): fewer than 29")
    assert "score at least 29" in early["messages"][0]
    # 28 rows, 29 needed: one row short - said in the singular (the 300-state walk read "add at least 1 labeled rows")
    short = set_support([{"label": "yes"}] * 14 + [{"label": "no"}] * 14, ["yes", "no"])
    assert short["messages"][0].endswith("add at least 1 labeled row"), short["messages"][0]
    assert set_support(rows, ["yes", "no"])["messages"][0].endswith("add at least 3 labeled rows")


def test_order_check_advice_never_suggests_what_the_run_already_did():
    import pandas as pd

    from app.core.order_sensitivity import verdict

    positions = pd.DataFrame({"position": ["A", "B"], "chosen": [5, 5], "label": [5, 5]})
    plain = verdict(0.4, positions, None, 10)
    assert "content-free correction for this policy" in plain and "run the check on a labeled set" in plain
    used = verdict(0.4, positions, None, 10, debias="content-free", labeled=True)
    assert "even with the content-free correction this run used" in used
    assert "run the check on a labeled set" not in used and "check more of the set's states" in used


def test_a_playground_card_says_what_its_cold_call_paid_for(tmp_path):
    """The Playground's latency line reads the run's target kind and whether the answer carries a
    content-free prior."""
    from app.core.store import Store
    from app.service import decide

    store = Store(tmp_path / "wb.db")
    policy = {"id": "p", "name": "P", "question": "Q?", "options": [{"id": "a"}, {"id": "b"}]}
    for name, kind, response in (("local", "local", {"prior": [0.7, 0.3], "debias": "content-free"}),
                                 ("remote", "semif", {})):
        run = store.create_run(kind="playground", policy=policy, target={"name": name, "kind": kind, "config": {}},
                               n_rows=1, group_id="g")
        store.add_result(run, {"row_key": "playground", "position": 0, "state": "x", "label": None, "cold": 1,
                               "option_ids": ["a", "b"], "probabilities": [0.6, 0.4], "top_option": "a",
                               "label_mass": 0.9, "probability_status": "uncalibrated", "readout": "letters",
                               "latency_s": 4.2, "error": None, "request": {}, "response": response})
        store.finish_run(run)
    local, remote = decide.decision(store, "g").cards
    assert "its content-free correction prior (3 more passes); the model load is not timed" in local.latency
    assert "connection set-up, the policy's first pass)" in remote.latency


def test_position_bars_without_labels_compare_with_an_even_spread():
    """Pasted states carry no label: no empty 'where the label was' bars, and the reference is an
    order-blind model (each position equally often)."""
    pos = pd.DataFrame({"position": [1, 2, 3], "chosen": [9, 2, 1], "label": [0, 0, 0]})
    fig = charts.position_bars(pos, labeled=False)
    assert [t.name for t in fig.data] == ["chosen by the model"]
    assert fig.layout.shapes[0].y0 == pytest.approx(4.0) and "even spread" in fig.layout.title.text
    assert fig.layout.yaxis.dtick == 1  # counts: no 0.5 ticks
    labeled = charts.position_bars(pos.assign(label=[4, 4, 4]), labeled=True)
    assert [t.name for t in labeled.data] == ["chosen by the model", "where the label was"]
    assert "labels' positions" in labeled.layout.title.text

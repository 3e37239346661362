"""The Calibrate page computes a run's calibration once (issue 29): a rerun that changes nothing
recomputes nothing, and a changed setting recomputes only the open run - the bootstrap intervals
and the heads' cross-validation are seconds each, so a second or third pass per rerun shows."""
from __future__ import annotations

import subprocess
import sys

from streamlit.testing.v1 import AppTest

from app.core import run_calibration
from tests.conftest import ROOT, subset_file


def test_a_rerun_calibrates_each_run_once_and_an_unchanged_rerun_not_at_all(tmp_path, monkeypatch):
    db = tmp_path / "wb.db"
    monkeypatch.setenv("SEMIF_DB", str(db))
    labeled = subset_file(tmp_path, "refund-check", 12)
    done = subprocess.run([sys.executable, "-m", "app", "calibrate", "--policy", "refund-check", "--labeled-set",
                           str(labeled), "--db", str(db), "--quiet"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    calls: list[tuple[int, bool]] = []
    real = run_calibration.calibrate

    def counted(store, run_id, **kw):
        calls.append((run_id, kw.get("with_heads", True)))
        return real(store, run_id, **kw)

    monkeypatch.setattr(run_calibration, "calibrate", counted)
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.run()
    at.switch_page("views/calibrate.py").run()
    at.selectbox(key="cal_policy").select("refund-check").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="cal_run_pick").value is not None  # the run is open: its calibration is shown
    first = list(calls)
    # the side-by-side table (no heads) and the open run's detail (with heads): each at most once
    assert first and len(first) == len(set(first)), first
    assert sum(1 for _, heads in first if heads) == 1, first
    at.run()  # a rerun with nothing changed
    assert calls == first, calls[len(first):]
    at.slider(key="cal_target_acc").set_value(0.8).run()  # a new target: the open run once more, nothing else
    again = calls[len(first):]
    assert len(again) == 1 and again[0][1], again
    assert not at.exception


def test_the_live_line_computes_only_the_gate_it_shows(tmp_path, monkeypatch):
    """While a run is scored the page refreshes its line every 3 s: it computes the accuracy so far and a
    provisional gate on the rows as scored - never the whole calibration (cross-validated corrections,
    heads, thousands of bootstrap resamples)."""
    import numpy as np

    from app.core.store import Store
    from app.service import evaluate

    store = Store(tmp_path / "live.db")
    policy = {"id": "p", "question": "q", "options": [{"id": "a"}, {"id": "b"}]}
    rid = store.create_run(kind="eval", policy=policy, target={"name": "local"}, n_rows=200)
    rng = np.random.default_rng(0)
    for i in range(80):
        label = "a" if i % 2 else "b"
        p = float(rng.uniform(0.5, 1.0))
        right = rng.random() < p  # confident rows are right more often: a gate can be found
        top = label if right else ("b" if label == "a" else "a")
        probs = [p, 1 - p] if top == "a" else [1 - p, p]
        store.add_result(rid, {"row_key": f"r{i}", "position": i, "state": f"s{i}", "label": label,
                               "option_ids": ["a", "b"], "probabilities": probs, "top_option": top, "error": None,
                               "latency_s": 0.1})

    def forbidden(*a, **k):
        raise AssertionError("the live line ran a full calibration")

    monkeypatch.setattr(run_calibration, "calibrate", forbidden)
    line = evaluate.live(store, rid, target_accuracy=0.8)
    assert line.accuracy.n == 80 and line.gate is not None and "provisional gate on the probabilities as scored" in line.gate
    assert "80/200 rows scored" in line.text()

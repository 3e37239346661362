"""The Calibrate page computes a run's calibration once (issue 29): a rerun that changes nothing
recomputes nothing, and a changed setting recomputes only the open run - the bootstrap intervals
and the heads' cross-validation are seconds each, so a second or third pass per rerun shows."""
from __future__ import annotations

import subprocess
import sys

from streamlit.testing.v1 import AppTest

from app.core import export
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
    real = export.calibrate

    def counted(store, run_id, **kw):
        calls.append((run_id, kw.get("with_heads", True)))
        return real(store, run_id, **kw)

    monkeypatch.setattr(export, "calibrate", counted)
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

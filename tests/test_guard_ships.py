"""A calibrated policy ships with the steering guard on unless the analyst turns it off, and the export
says what the guard holds and costs - or what turning it off costs - from the as-deployed Robustness check
(issue 41). Real commands on the SmolLM2 fixture, a real SQLite store."""
from __future__ import annotations

import json
import re
import subprocess
import sys

from streamlit.testing.v1 import AppTest

from adapter.guard import GUARDS
from app.core.run_calibration import EXPORT_GUARD
from app.core.store import Store
from app.service import calibrate_panels, checks
from tests.conftest import ROOT, subset_file


def _app(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_the_export_ships_guarded_and_says_what_turning_it_off_costs(tmp_path, monkeypatch):
    db, rows = str(tmp_path / "wb.db"), str(subset_file(tmp_path, "refund-check", 12))
    common = ["calibrate", "--policy", "refund-check", "--labeled-set", rows, "--head", "none", "--db", db, "--quiet"]
    on = _app(*common, "--out", str(tmp_path / "on.json"))
    assert on.returncode == 0, on.stderr
    assert EXPORT_GUARD == "erase-and-check"
    assert json.loads((tmp_path / "on.json").read_text())["guard"] == "erase-and-check"  # the default: guard on
    assert "steering guard: erase-and-check (--guard none turns it off)" in on.stdout
    assert "no as-deployed Robustness check of a calibrated policy of refund-check yet" in on.stdout

    # the as-deployed check of the exported policy: its steering attempts, with its own guard
    check = _app("robustness", "--policy", "refund-check", "--labeled-set", rows, "--calibrated", str(tmp_path / "on.json"),
                 "--limit", "2", "--attempts", "2", "--checks", "steering", "--db", db, "--quiet")
    assert check.returncode == 0, check.stderr

    off = _app(*common, "--guard", "none", "--out", str(tmp_path / "off.json"))
    assert off.returncode == 0, off.stderr
    assert json.loads((tmp_path / "off.json").read_text())["guard"] == "none"
    assert "steering guard: none - turned off (--guard none); what that costs:" in off.stdout
    (run,) = Store(db).list_runs(kind="robustness")
    assert f"as-deployed check run #{run['id']}" in off.stdout and "guard erase-and-check" in off.stdout
    assert "without a guard, steering moved" in off.stdout and "extra model passes per unchanged row" in off.stdout
    lines = checks.guard_cost(Store(db), "refund-check")
    assert lines[0].startswith(f"as-deployed check run #{run['id']}") and "with guard erase-and-check: held" in lines[2]
    assert checks.guard_cost(Store(db), "ticket-routing") == [checks.GUARD_UNCHECKED.format(policy="ticket-routing")]

    # the Calibrate page: the control preselects the guard on; turned off, a warning says what that costs
    monkeypatch.setenv("SEMIF_DB", db)
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.run()
    at.switch_page("views/calibrate.py").run()
    at.selectbox(key="cal_policy").select("refund-check").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="cal_guard").value == "erase-and-check"

    def plain(text: str) -> str:  # the page escapes markdown
        return re.sub(r"\\(.)", r"\1", text)

    assert any("Steering guard" in plain(c.value) and f"run #{run['id']}" in plain(c.value) for c in at.caption)
    at.selectbox(key="cal_guard").select("none").run()
    assert any("turned off. What that costs" in plain(w.value) and "without a guard, steering moved" in plain(w.value)
               for w in at.warning)


def test_the_calibrate_page_preselects_the_guard_the_export_ships_with():
    choice = calibrate_panels.guard_choice({"id": "p", "guard": ""})
    assert choice.options == list(GUARDS) and choice.options[choice.index] == "erase-and-check"
    kept = calibrate_panels.guard_choice({"id": "p", "guard": "precheck"})  # the policy's own guard stays
    assert kept.options[kept.index] == "precheck"

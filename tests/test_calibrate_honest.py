"""Calibrate exports only what it measured, and no figure looks safer than it is (issue 35):
finding 2 - a run of an older policy version was offered under Gate and export and saved with the old
version and guard; finding 3 - a hand-set gate's in-sample accuracy was listed by Deploy as if held out;
finding 6 - "model alone" included the content-free correction. One 12-row refund-check run on SmolLM2,
scored with the content-free correction, made by `python -m app calibrate`."""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.core import runs
from app.core.store import Store
from app.service import deploy, evaluate
from app.core.stats import interval_text
from tests.conftest import ROOT, subset_file


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("honest")
    db = tmp / "wb.db"
    done = subprocess.run([sys.executable, "-m", "app", "calibrate", "--policy", "refund-check", "--labeled-set",
                           str(subset_file(tmp, "refund-check", 12)), "--debias", "content-free", "--head", "none",
                           "--db", str(db), "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (run,) = Store(db).list_runs(kind="eval")
    return db, run["id"]


def copy_of(scored, tmp_path) -> Store:
    path = tmp_path / "wb.db"
    path.write_bytes(scored[0].read_bytes())
    return Store(path)


def test_finding_2_a_run_of_an_older_version_is_history_and_never_exported(scored, tmp_path, monkeypatch):
    store = copy_of(scored, tmp_path)
    v1 = store.get_policy("refund-check")
    assert v1 is not None
    v2 = store.save_policy({**v1, "guard": "erase-and-check"}, expected_version=v1["version"])  # only the guard
    rid = scored[1]
    saved_now, older = evaluate.by_version(v2, evaluate.runs_of(store, "refund-check", store.get_run(rid)["labeled_set_id"]))
    assert saved_now == [] and [r["id"] for r in older] == [rid]
    cal = evaluate.calibrate(store, rid, head="none")
    with pytest.raises(evaluate.OtherVersion, match=f"run #{rid} evaluated v{v1['version']}"):
        evaluate.export(store, cal, policy=v2)
    # the page: no run of v2 to gate and export; the old run, opened by its URL, asks for a run on v2
    monkeypatch.setenv("SEMIF_DB", str(tmp_path / "wb.db"))
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.query_params["run"] = str(rid)
    at.run()
    at.switch_page("views/calibrate.py").run()
    at.selectbox(key="cal_policy").select("refund-check").run()
    assert not at.exception, at.exception
    assert not [s for s in at.selectbox if s.key == "cal_run_pick"]
    assert not [b for b in at.button if b.key == "cal_save"]
    text = " ".join(re.sub(r"\\(.)", r"\1", w.value) for w in at.warning)
    assert f"Run #{rid} evaluated v{v1['version']} of this policy, which is saved as v{v2['version']} now" in text
    # evaluating again makes a run of the saved version (the old one is not resumed as if it were)
    assert runs.find_run(store, policy=v2, set_id=store.get_run(rid)["labeled_set_id"], target_name="local",
                         variant=runs.Variant(debias="content-free")) is None


def test_finding_3_a_hand_set_gate_is_in_sample_and_deploy_shows_the_out_of_fold_figure(scored, tmp_path):
    store = copy_of(scored, tmp_path)
    policy = store.get_policy("refund-check")
    cal = evaluate.calibrate(store, scored[1], head="none")
    exported = evaluate.export(store, cal, hand_gate=0.5, policy=policy)
    metrics = exported.policy.metrics
    assert metrics.at_gate is not None and metrics.at_gate.in_sample is True
    oof = metrics.at_gate_out_of_fold
    assert oof is not None
    decided = cal.oof.max(axis=1) >= 0.5  # the same gate on rows each decided by a correction that never saw them
    right = (cal.oof.argmax(axis=1) == cal.y) & decided
    assert (oof.decided, oof.correct) == (int(decided.sum()), int(right.sum()))
    cid = evaluate.save(store, exported)
    label = deploy.calibrated_label(deploy.calibrated(store)[cid])
    assert f"accuracy {interval_text(oof.accuracy_interval, 0)} out of fold" in label
    # a gate from the target: chosen on the out-of-fold probabilities (issue 44), and the correction fitted on these
    # rows decides them in sample - so that figure is marked too, with the out-of-fold one beside it
    rec = evaluate.export(store, cal, policy=policy).to_json()["metrics"]
    assert rec["at_gate"]["in_sample"] is True and rec["at_gate_out_of_fold"]["n"] == rec["at_gate"]["n"]


def test_finding_6_model_alone_is_uncorrected_and_the_scoring_correction_is_named(scored, tmp_path):
    store = copy_of(scored, tmp_path)
    cal = evaluate.calibrate(store, scored[1], head="none")
    alone, applied = evaluate.model_alone(cal)
    assert applied == ["content-free"]
    by_hand = [int(np.argmax(r["response"]["uncorrected_probabilities"])) for r in cal.results]
    assert alone is not None and alone.k == sum(p == y for p, y in zip(by_hand, cal.y)) and alone.n == len(cal.y)

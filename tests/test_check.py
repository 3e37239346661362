"""`python -m app check` as CI runs it: a subprocess against a real SQLite file and the real local
models; exit 0 / 1 / 2, JUnit read back by a JUnit parser, the Markdown summary, and stored results
reused (zero evaluations) for the same model and request."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest
from junitparser import Failure, JUnitXml

from app.core.store import Store
from tests.conftest import ROOT, subset_file


def app(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "app", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def scored_results(db) -> int:
    """Results that came from a target call (not copied from a stored one)."""
    return sqlite3.connect(db).execute("SELECT count(*) FROM results WHERE reused_from IS NULL").fetchone()[0]


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A calibrated ticket-routing policy on the fixture model, from 16 labeled rows."""
    tmp = tmp_path_factory.mktemp("check")
    db, out, rows = tmp / "wb.db", tmp / "routing.policy.json", subset_file(tmp, "ticket-routing", 16)
    proc = app("calibrate", "--db", db, "--policy", "ticket-routing", "--labeled-set", rows, "--gate", "0.4",
               "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    (run,) = Store(db).list_runs(kind="eval")
    return db, out, rows, run["id"]


def test_thresholds_that_hold_exit_0_reusing_every_stored_result(calibrated, tmp_path):
    db, policy, rows, eval_run = calibrated
    before = scored_results(db)
    junit, summary = tmp_path / "check.xml", tmp_path / "check.md"
    proc = app("check", "--db", db, "--policy", policy, "--labeled-set", rows, "--min-accuracy", 0, "--min-coverage", 0,
               "--min-gate-accuracy", 0, "--max-ece", 1, "--baseline", eval_run, "--max-flips", 0, "--max-broken", 0,
               "--junit", junit, "--summary", summary)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "16 rows, 0 evaluated, 16 reused" in proc.stderr
    assert scored_results(db) == before  # zero evaluations: nothing new came from the model
    store = Store(db)
    (run,) = store.list_runs(kind="check")
    results = store.results(run["id"])
    originals = {r["row_key"]: r for r in store.results(eval_run)}
    assert len(results) == 16 and all(r["reused_from"] == originals[r["row_key"]]["id"] for r in results)
    assert all(r["probabilities"] == originals[r["row_key"]]["probabilities"] for r in results)
    assert all(r["label"] == originals[r["row_key"]]["label"] for r in results)
    xml = JUnitXml.fromfile(str(junit))
    (suite,) = list(xml)
    cases = {c.name: c for c in suite}
    assert set(cases) == {"min-accuracy", "min-gate-accuracy", "min-coverage", "max-ece", "max-flips", "max-broken"}
    assert suite.tests == 6 and suite.failures == 0 and suite.errors == 0
    assert all(c.is_passed and "bound" in (c.system_out or "") for c in cases.values())
    assert "flips (top option changed) against the baseline: 0 <= bound 0" in cases["max-flips"].system_out
    text = summary.read_text()
    assert text.startswith("### SemIf check passed: ticket-routing") and "6 of 6 thresholds hold" in text
    assert "| `--min-coverage` |" in text and "reused: 16" in text


def test_a_failing_threshold_exits_1_and_names_it_with_the_measured_value(calibrated, tmp_path):
    db, policy, rows, eval_run = calibrated
    junit = tmp_path / "check.xml"
    proc = app("check", "--db", db, "--policy", policy, "--labeled-set", rows, "--min-accuracy", 1.0,
               "--min-coverage", 0.0, "--junit", junit)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (suite,) = list(JUnitXml.fromfile(str(junit)))
    cases = {c.name: c for c in suite}
    assert suite.failures == 1 and cases["min-coverage"].is_passed
    (failure,) = cases["min-accuracy"].result
    assert isinstance(failure, Failure)
    (run,) = [r for r in Store(db).list_runs(kind="check") if r["id"] == max(x["id"] for x in Store(db).list_runs(kind="check"))]
    res = Store(db).results(run["id"])
    acc = sum(r["top_option"] == r["label"] for r in res) / len(res)
    assert f"accuracy, all labeled rows {acc:.1%} < bound 100.0%" in failure.message  # the value and the bound
    assert "[FAIL] --min-accuracy" in proc.stdout and "[PASS] --min-coverage" in proc.stdout


def test_another_model_is_scored_flips_are_counted_and_the_policy_gates_everything(calibrated, tmp_path):
    """The pull request that swaps the model: nothing stored is reused (another sha256), the rows
    whose answer changed are flips - counted here by hand from the two runs, and a bound of 0 fails on
    them - and the policy calibrated on the old model decides nothing."""
    db, policy, rows, eval_run = calibrated
    summary = tmp_path / "check.md"
    proc = app("check", "--db", db, "--policy", policy, "--labeled-set", rows, "--target", "local-qwen2.5-coder-0.5b",
               "--min-coverage", 0.1, "--baseline", eval_run, "--max-flips", 0, "--summary", summary, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "16 rows, 16 evaluated, 0 reused" in proc.stderr
    store = Store(db)
    check_run = max(store.list_runs(kind="check"), key=lambda r: r["id"])

    def answers(run_id):  # row (id and state) -> top option, answered rows only
        return {(r["row_key"], json.dumps(r["state"])): r["top_option"] for r in store.results(run_id) if not r["error"]}

    before, now = answers(eval_run), answers(check_run["id"])
    common = before.keys() & now.keys()
    changed = sorted(k[0] for k in common if before[k] != now[k])
    assert len(common) == 16
    assert changed, "SmolLM2 and Qwen2.5-Coder-0.5B agree on all 16 rows: the swap no longer changes any answer"
    assert (f"[FAIL] --max-flips: flips (top option changed) against the baseline: {len(changed)} > bound 0 "
            f"(of 16 rows in common") in proc.stdout
    assert "[FAIL] --min-coverage: coverage (rows decided, not sent to the fallback) 0.0% < bound 10.0% (0/16 rows)" \
        in proc.stdout
    text = summary.read_text()
    assert "model mismatch" in text and "the adapter sends every row to the fallback" in text
    assert f"Rows whose top option changed against the baseline ({len(changed)}, first 20):" in text
    table = text.split("| row | label | baseline | now | kind |\n|---|---|---|---|---|\n")[1].strip().splitlines()
    listed = {line.split("|")[1].strip(): line.split("|")[3:5] for line in table}
    assert sorted(listed) == changed[:20]  # every flipped row, and only those
    assert all(old.strip() != new.strip() for old, new in listed.values())


def test_usage_and_target_errors_exit_2(calibrated, tmp_path):
    db, policy, rows, _ = calibrated
    base = ("check", "--db", db, "--policy", policy, "--labeled-set", rows)
    cases = [
        ((), "give at least one threshold"),
        (("--max-flips", 0), "give --baseline RUN"),
        (("--min-accuracy", 1.5), "not between 0 and 1"),
        (("--min-accuracy", 0.5, "--target", "nowhere"), "--target 'nowhere': no such target"),
        (("--min-accuracy", 0.5, "--baseline", 9999, "--max-flips", 1), "no such run"),
    ]
    proc = app(*base, *cases[0][0])  # one as a real process: the exit status CI reads
    assert proc.returncode == 2 and cases[0][1] in proc.stderr, proc.stderr
    for extra, message in cases[1:]:  # the rest in this process (the same main(), without a Python start each)
        code, err = in_process(*base, *extra)
        assert code == 2 and message in err, (extra, err)
    code, err = in_process("check", "--db", db, "--policy", "ticket-routing", "--labeled-set", rows, "--min-coverage", 0.5)
    assert code == 2 and "need a gate" in err
    code, err = in_process("check", "--db", db, "--policy", policy, "--labeled-set", tmp_path / "missing.jsonl",
                           "--min-accuracy", 0.5)
    assert code == 2 and "no such file or stored set id" in err
    Store(db).save_target("down", "semif", {"url": "http://127.0.0.1:9"})
    code, err = in_process(*base, "--min-accuracy", 0.1, "--target", "down")
    assert code == 2 and "failed on 16 of 16 rows" in err and "nothing was judged" in err
    bad = tmp_path / "bad.policy.json"
    bad.write_text(json.dumps({**json.loads(policy.read_text()), "temperature": 0}))
    code, err = in_process("check", "--db", db, "--policy", bad, "--labeled-set", rows, "--min-accuracy", 0.1)
    assert code == 2 and "temperature" in err


def in_process(*args) -> tuple[int, str]:
    """`python -m app ...` as a call: (exit status, stderr)."""
    import contextlib
    import io

    from app.__main__ import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return code, err.getvalue()

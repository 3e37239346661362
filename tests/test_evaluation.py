"""Batch evaluation end to end: kill-and-resume, the headless CLI, and export -> adapter round trip."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from adapter.policy import CalibratedPolicy, PolicyError, RowReading, load_policy
from app.core import runs, run_calibration
from app.core.store import Store
from tests.conftest import ROOT, ServerProcess, subset_file


def calibrate_cmd(db, *extra):
    return [sys.executable, "-m", "app", "calibrate", "--db", str(db), "--quiet", *extra]


def count(db) -> int:
    try:
        return sqlite3.connect(db).execute("SELECT count(*) FROM results").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def held(args: list[str], after: int, release: Path | None = None) -> subprocess.Popen:
    """The command held once its `after`-th result is saved, until `release` exists (tests/held_cli.py)."""
    env = {**os.environ, "SEMIF_TEST_HOLD_AFTER": str(after), **({"SEMIF_TEST_RELEASE": str(release)} if release else {})}
    cmd = [sys.executable, "-m", "tests.held_cli", *args[args.index("app") + 1:]]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for_results(db, n: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + 300  # the bound only catches a hang
    while count(db) < n:
        assert time.time() < deadline and proc.poll() is None, f"{count(db)} results, exit {proc.poll()}"
        time.sleep(0.05)


def test_killed_run_resumes_without_rescoring_or_duplicates(tmp_path):
    db = tmp_path / "wb.db"
    args = calibrate_cmd(db, "--policy", "ticket-routing", "--labeled-set", str(subset_file(tmp_path, "ticket-routing", 24)))
    proc = held(args, 10)  # killed while held after its 10th result: mid-run on any machine
    wait_for_results(db, 10, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = Store(db)
    (run,) = store.list_runs(kind="eval")
    before = {r["row_key"]: r["id"] for r in store.results(run["id"])}
    assert len(before) == 10 < run["n_rows"] == 24 and run["status"] == "interrupted"  # its process is gone
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "resumed" in done.stderr and f"reused {len(before)}" in done.stderr
    (run,) = store.list_runs(kind="eval")  # reused, not a second run
    after = store.results(run["id"])
    assert len(after) == 24 and len({r["row_key"] for r in after}) == 24
    assert {k: v for k, v in ((r["row_key"], r["id"]) for r in after) if k in before} == before  # not re-scored
    assert set(before) | {r["row_key"] for r in after} == set(run["config"]["row_keys"])
    assert run["status"] == "done"
    # train rows served as nothing here but are never scored
    train = {r["row_key"] for r in store.labeled_rows(run["labeled_set_id"]) if r["split"] == "train"}
    assert not train & {r["row_key"] for r in after}


def test_two_workers_never_score_the_same_run(tmp_path):
    db = tmp_path / "wb.db"
    # the first worker is held after its 3rd result until the second has tried (tests/held_cli.py): still scoring
    # when the second starts, however fast this machine scores
    args = calibrate_cmd(db, "--policy", "ticket-routing", "--labeled-set", str(subset_file(tmp_path, "ticket-routing", 12)))
    release = tmp_path / "release"
    first = held(args, 3, release)
    wait_for_results(db, 3, first)
    second = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 4 and "being scored by another process" in second.stderr, second.stderr
    release.touch()
    assert first.wait(300) == 0
    store = Store(db)
    (run,) = store.list_runs(kind="eval")
    results = store.results(run["id"])
    assert run["status"] == "done" and len(results) == 12 == len({r["row_key"] for r in results})


def test_examples_from_train_are_never_scored(tmp_path):
    rows = [{"row_key": f"r{i}", "state": f"s{i}", "label": "yes" if i % 2 else "no",
             "split": "train" if i < 4 else "test"} for i in range(10)]
    policy = {"id": "p", "question": "q", "options": [{"id": "yes"}, {"id": "no"}], "examples": []}
    evaluated, scored = runs.plan_eval(policy, rows, "train", 2)
    assert [e["option_id"] for e in evaluated["examples"]] == ["no", "yes"]  # one per label first
    assert {r["row_key"] for r in scored} == {f"r{i}" for i in range(4, 10)}
    untagged = [{**r, "split": None} for r in rows]
    evaluated, scored = runs.plan_eval(policy, [{**r, "split": "train"} if i < 2 else r
                                                      for i, r in enumerate(untagged)], "train", 2)
    used = {e["state"] for e in evaluated["examples"]}
    assert not used & {r["state"] for r in scored}


def test_cli_strict_exit_and_policy_written(tmp_path):
    db, out = tmp_path / "wb.db", tmp_path / "policy.json"
    proc = subprocess.run(calibrate_cmd(db, "--policy", "ticket-routing",
                                        "--labeled-set", str(subset_file(tmp_path, "ticket-routing", 60)),
                                        "--target-accuracy", "0.99", "--strict", "--out", str(out)),
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "unreachable" in proc.stdout and "ECE" in proc.stdout and "accuracy" in proc.stdout
    policy = load_policy(out)
    assert policy.threshold == 1.0 and policy.metrics.at_gate.decided == 0  # safe: all to fallback
    assert policy.dataset["content_hash"] and policy.model.sha256


def test_export_then_adapter_enforces_the_same_decisions(tmp_path):
    """Scored with the content-free correction, a run holds both score families; calibration picks
    the correction out of fold (here: fitted offsets, which beat temperature alone - the fixture
    prefers one answer) and the adapter, given the exported policy, re-scores every row with that
    correction and decides exactly as the page computed. (`--head none`: on these rows a hidden-state
    head wins beyond noise even on the fixture model - tests/test_head_roundtrip.py covers that path.)"""
    # `--guard none`: this checks the correction and gate decide identically on the page and the adapter; the
    # exported default (erase-and-check) would send rows it suspects to the fallback on the adapter only, which
    # the replay of stored rows below does not model - the guard's served decisions are tested in test_guard.py
    db, out = tmp_path / "wb.db", tmp_path / "refund.policy.json"
    proc = subprocess.run(calibrate_cmd(db, "--policy", "refund-check", "--readout", "option-words", "--debias",
                                        "content-free", "--labeled-set", str(subset_file(tmp_path, "refund-check", 48)),
                                        "--gate", "0.55", "--fallback", "human-review", "--head", "none",
                                        "--guard", "none", "--out", str(out)),
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    policy = load_policy(out)
    correction = policy.metrics.model_dump(mode="json")["correction"]  # as the file holds it
    assert {c["name"] for c in correction["candidates"]} == {"none", "fitted", "content-free", "content-free + fitted"}
    assert correction["chosen"].endswith("fitted") and policy.option_offsets, correction["why"]
    assert policy.debias == ("none" if correction["chosen"] == "fitted" else "content-free")
    store = Store(db)
    (run,) = store.list_runs(kind="eval")
    results = [r for r in store.results(run["id"]) if not r["error"]]
    page = policy.metrics.model_dump(mode="json")["at_gate"]  # what the page/CLI showed and exported
    # recomputed by hand: softmax(log p / T + offsets) on the family the policy reads, decided at conf >= gate
    decided = correct = 0
    for r in results:
        p = np.array(runs.scored_probabilities(r, policy.debias), float)
        z = np.log(np.maximum(p, 1e-300)) / policy.temperature + np.array(
            [policy.option_offsets.get(o, 0.0) for o in r["option_ids"]])
        q = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        if q.max() >= policy.threshold:
            decided += 1
            correct += r["option_ids"][int(q.argmax())] == r["label"]
    assert (page["n"], page["decided"], page["correct"]) == (len(results), decided, correct)
    assert 0 < page["decided"] < page["n"]  # the gate really splits the set

    srv = ServerProcess([sys.executable, "-m", "adapter", "serve", "--host", "127.0.0.1", "--port", "0"],
                        env={"SM_SEMIF_POLICY": str(out)})
    try:
        info = httpx.get(srv.url + "/info").json()
        assert info["policies"]["refund-check"]["model_matches"]
        rows = [{"id": r["row_key"], "state": r["state"], "policy_id": "refund-check"} for r in results]
        served = httpx.post(srv.url + "/invocations", json=rows, timeout=300).json()
        decided = correct = 0
        for r, s in zip(results, served):
            scored = runs.scored_probabilities(r, policy.debias)
            assert s["probabilities"] == scored and s["debias"] == policy.debias  # same model and prompt: bit for bit
            local = policy.apply(RowReading(tuple(r["option_ids"]), tuple(scored)))
            assert s["decision"]["option_id"] == local.option_id and s["decision"]["gated"] == local.gated
            assert s["calibrated_probabilities"] == list(local.calibrated_probabilities)
            assert s["probability_status"] == "calibrated"
            decided += not s["decision"]["gated"]
            correct += (not s["decision"]["gated"]) and s["decision"]["option_id"] == r["label"]
        assert decided == page["decided"] and correct / decided == page["accuracy"]
        # one policy loaded: a row may omit question and options entirely
        one = httpx.post(srv.url + "/invocations", json={"id": "x", "state": "Bought 3 days ago, broken"}).json()
        assert one["policy"]["policy_id"] == "refund-check" and "decision" in one
        bad = httpx.post(srv.url + "/invocations", json={"id": "x", "state": "s", "policy_id": "nope"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["policy_id"]
        clash = httpx.post(srv.url + "/invocations", json={"id": "x", "state": "s", "policy_id": "refund-check",
                                                           "question": "q", "options": [{"id": "a"}, {"id": "b"}]})
        assert clash.status_code == 422 and clash.json()["detail"][0]["loc"] == ["options"]
    finally:
        srv.stop()


def test_policy_validation_and_model_mismatch(tmp_path):
    good = {"schema_version": "semif-policy/1", "policy_id": "p", "question": "q?", "readout": "option-words",
            "options": [{"id": "yes"}, {"id": "no"}], "prompt_version": "option-words/1",
            "model": {"file": "m.gguf", "sha256": "a" * 64}, "temperature": 2.0, "threshold": 0.7,
            "fallback_option": "human-review", "created_at": "2026-12-01T00:00:00+00:00"}
    p = CalibratedPolicy.model_validate(good)
    d = p.apply(RowReading(("yes", "no"), (0.9, 0.1)))
    # T=2: sqrt-ish flattening: 0.9^(1/2) / (0.9^(1/2) + 0.1^(1/2)) = 0.75
    assert d.confidence == pytest.approx(0.75) and not d.gated and d.option_id == "yes"
    d = p.apply(RowReading(("yes", "no"), (0.7, 0.3)))
    assert d.gated and d.option_id == "human-review" and "< gate" in d.reason
    d = p.apply(RowReading(("yes", "no"), (0.99, 0.01), model_sha256="b" * 64, model_file="x"))
    assert d.gated and "not the calibrated model" in d.reason
    with pytest.raises(PolicyError, match="temperature"):
        load_policy({**good, "temperature": 0})
    with pytest.raises(PolicyError, match="option_thresholds"):
        load_policy({**good, "option_thresholds": {"maybe": 0.5}})
    bad_file = tmp_path / "p.json"
    bad_file.write_text(json.dumps({**good, "schema_version": "semif-policy/9"}))
    with pytest.raises(PolicyError, match="schema_version"):
        load_policy(bad_file)


def test_benchmark_cli_reports_ratios_and_saves_a_comparison(tmp_path, adapter_server):
    db = tmp_path / "wb.db"
    Store(db).save_target("adapter", "semif", {"url": adapter_server.url})
    proc = subprocess.run([sys.executable, "-m", "app", "bench", "--policy", "ticket-routing", "--states",
                           str(ROOT / "data" / "cases" / "probe.jsonl"), "--target", "local", "--target", "adapter",
                           "--limit", "4", "--db", str(db), "--html", str(tmp_path / "ecdf.html")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [l.split(" | ") for l in proc.stdout.splitlines() if l.startswith("| local") or l.startswith("| adapter")]
    assert [r[0] for r in rows] == ["| local", "| adapter"] and rows[0][4] == "1.00x" and rows[1][4].endswith("x")
    assert float(rows[1][3]) >= float(rows[1][1]) > 0  # max >= p50, in ms
    assert "plotly" in (tmp_path / "ecdf.html").read_text()[:5000].lower()
    runs = Store(db).list_runs(kind="compare")
    assert {r["target_name"] for r in runs} == {"local", "adapter"} and len({r["group_id"] for r in runs}) == 1
    assert all(len(Store(db).results(r["id"])) == 4 for r in runs)
    # the stored comparison is what the CLI printed: every measured call warm (the warm-up went through
    # the same bookkeeping, on a state of its own), and the Compare page's table gives the same p50/p95
    assert all(res["cold"] == 0 for r in runs for res in Store(db).results(r["id"]))
    from app.core import analysis

    _, stats = analysis.comparison_stats(Store(db), runs[0]["group_id"])
    for row in rows:
        page = stats[stats["target"] == row[0].removeprefix("| ")].iloc[0]
        assert (row[1], row[2]) == (f"{page['p50_ms']:.0f}", f"{page['p95_ms']:.0f}")


def test_object_states_are_scored_as_the_runtime_renders_them(tmp_path, engine):
    """Defect: an object state was stored as compact JSON text and scored as that string, while the
    adapter renders the object as indented JSON - calibration measured other prompts than the runtime's."""
    from adapter.schema import DecisionRequest
    from adapter.engine.templates import load_template, request_for
    from app.core.labeled import import_file
    from app.targets.local import LocalTarget

    db = Store(tmp_path / "wb.db")
    policy = load_template("ticket-routing")
    db.save_policy(policy)
    data = (b'{"id": "obj", "state": {"ticket": "charged twice", "plan": "pro"}, "label": "billing"}\n'
            b'{"id": "num", "state": "42", "label": "technical"}\n')
    set_id = import_file(db, "s.jsonl", data, policy)
    assert [r["state"] for r in db.labeled_rows(set_id)] == [{"ticket": "charged twice", "plan": "pro"}, "42"]
    target = LocalTarget("local", {}, lambda model: engine)
    run_id, _ = runs.find_or_start(db, policy=policy, set_id=set_id, target=target)
    runs.resume_eval(db, run_id, target)
    stored = {r["row_key"]: r for r in db.results(run_id)}
    assert stored["obj"]["request"]["state"] == {"ticket": "charged twice", "plan": "pro"} and stored["num"]["state"] == "42"
    runtime = engine.score(request_for(policy, {"ticket": "charged twice", "plan": "pro"}, "obj"))
    assert stored["obj"]["response"]["prompt_sha256"] == runtime.prompt_sha256  # the same prompt as the adapter's
    assert stored["obj"]["probabilities"] == runtime.probabilities
    assert isinstance(DecisionRequest.model_validate(stored["num"]["request"]).state, str)


def test_default_variant_resolves_to_what_the_model_reads(engine):
    """'default' on a local target is the policy's readout, else the model's measured default - so the
    Calibrate page can tell 'default' and the readout it stands for apart (and score it once)."""
    from adapter.engine.templates import load_template
    from app.targets.local import LocalTarget

    target = LocalTarget("local", {}, lambda model: engine)
    policy = {**load_template("ticket-routing"), "readout": "", "debias": ""}
    default = runs.resolve_variant(runs.VARIANTS["default"], policy, target)
    assert (default.readout, default.debias) == (engine.info.default_readout, engine.info.default_debias)
    assert default.name in runs.VARIANTS  # the same readings as a variant the page offers
    chosen = runs.resolve_variant(runs.VARIANTS["letters + content-free"], policy, target)
    assert (chosen.readout, chosen.debias) == ("letters", "content-free")
    own = runs.resolve_variant(runs.VARIANTS["default"], {**policy, "readout": "letters"}, target)
    assert own.readout == "letters"  # the policy's own choice wins over the model's
    plan = runs.distinct_variants(["default", default.name, "letters + content-free"], policy, target)
    assert [same for _, _, same in plan] == [None, "default", None]  # 'default' and its readout: scored once

"""The gate from evidence and a gate that decides nothing (issue 44, items 1 and 2).

A policy exported with no reachable gate (`gate_source: unreachable`) decides nothing in the adapter for
every probability - saturated ones included: the strict rule in CalibratedPolicy.apply, not a threshold
of 1.0 that a probability rounded to exactly 1.0 passes. A table over temperatures down to 1e-3."""
from __future__ import annotations

import json
import sys

import httpx
import numpy as np
import pytest

from adapter.policy import CalibratedPolicy, RowReading, calibrate_probs
from app.core import calibration as C
from app.core import runs
from app.core.gates import Gate
from app.core.store import Store
from tests.conftest import ServerProcess, calibrate_cli

SHA = "a" * 64


def policy(**over) -> CalibratedPolicy:
    base = {"policy_id": "p", "question": "q?", "options": [{"id": "yes", "description": "y"},
                                                            {"id": "no", "description": "n"}],
            "readout": "letters", "prompt_version": "letters/1", "model": {"file": "m.gguf", "sha256": SHA},
            "temperature": 1.0, "threshold": 1.0, "gate_source": "unreachable", "fallback_option": "human-review",
            "created_at": "2026-12-05T00:00:00Z"}
    return CalibratedPolicy.model_validate({**base, **over})


PROBS = [(1.0, 0.0), (0.0, 1.0), (0.999999, 1e-6), (0.9, 0.1), (0.5, 0.5), (0.51, 0.49), (1 - 1e-12, 1e-12)]
TEMPERATURES = [20.0, 1.0, 0.05, 0.01, 1e-3]


@pytest.mark.parametrize("T", TEMPERATURES)
def test_a_gate_that_decides_nothing_decides_nothing_saturated_probabilities_included(T):
    strict = policy(temperature=T)
    saturated = 0
    for probs in PROBS:
        d = strict.apply(RowReading(("yes", "no"), probs, model_sha256=SHA))
        assert d.gated and d.option_id == "human-review", (T, probs, d)
        cal = calibrate_probs(list(probs), T)
        saturated += max(cal) == 1.0
        # the same threshold as a recommended gate lets a probability of exactly 1.0 through: the old bug
        recommended = policy(temperature=T, gate_source="recommended").apply(RowReading(("yes", "no"), probs))
        assert recommended.gated == (max(cal) < 1.0)
    if T <= 0.05:
        assert saturated >= 3  # the table really holds probabilities that round to exactly 1.0


def test_an_option_with_its_own_gate_still_decides_under_the_strict_rule():
    p = policy(temperature=1e-3, option_thresholds={"yes": 0.8})
    assert not p.apply(RowReading(("yes", "no"), (0.9, 0.1))).gated  # yes has its own reached gate
    assert p.apply(RowReading(("yes", "no"), (0.1, 0.9))).gated  # no has none: the global rule, nothing decided
    assert p.apply(RowReading(("yes", "no"), (0.0, 1.0))).gated


def test_the_workbench_measures_what_the_adapter_does_on_the_strict_rule():
    """gates.measure (what the export's at_gate and at_gate_out_of_fold report) goes through apply: 0 decided."""
    strict = policy(temperature=1e-3)
    results = [{"row_key": f"r{i}", "option_ids": ["yes", "no"], "probabilities": list(p), "top_option": "yes",
                "label": "yes", "error": None, "response": {}} for i, p in enumerate(PROBS)]
    from app.core.gates import measure

    assert measure(results, Gate(policy=strict)).coverage.k == 0
    oof = [[1.0, 0.0]] * len(results)
    assert measure(results, Gate(policy=strict), probabilities=oof).coverage.k == 0


def test_cli_page_and_export_carry_the_same_gate_evidence_and_the_adapter_decides_nothing(tmp_path):
    """A 12-row set with a 99% target: no gate's out-of-fold lower bound clears it. The command line prints
    the gate's evidence, the export's notes and metrics carry the same numbers, and the adapter, serving
    the file, sends every row to the fallback (reported: 0 decided in sample and out of fold)."""
    db, out, stdout = calibrate_cli(tmp_path, "refund-check", 12, "--target-accuracy", "0.99", "--head", "none",
                                    "--learning-curve")
    config = json.loads(out.read_text())
    sel, notes = config["metrics"]["gate_selection"], config["metrics"]["gate_notes"]
    assert config["gate_source"] == "unreachable" and not sel["reachable"] and sel["n"] == 12
    assert notes[0] in stdout.replace("\n", " ") or notes[0].split(";")[0] in stdout
    assert "Clopper-Pearson" in notes[0] and sel["confidence"] == 0.95
    if sel["reach"] is not None:  # the rows it needs, from the same bound, recomputed here
        m = round(sel["reach"]["needed"] * sel["reach"]["coverage"])
        assert C.cp_lower(round(m * sel["reach"]["accuracy"]), m) >= 0.99 - 1e-9
        assert f"about {sel['reach']['more']} more labeled rows" in notes[0]
    assert config["metrics"]["at_gate"]["decided"] == 0 and config["metrics"]["at_gate_out_of_fold"]["decided"] == 0
    # what more labels buy: the curve's last point is the export's own out-of-fold accuracy on all 12 rows
    chosen = config["metrics"]["correction"]["chosen"]
    acc = next(c["oof_accuracy"] for c in config["metrics"]["correction"]["candidates"] if c["name"] == chosen)
    assert f"{acc:.1%} on 12 rows" in stdout and "what more labels buy: " in stdout
    store = Store(db)
    (run,) = store.list_runs(kind="eval")
    results = [r for r in store.results(run["id"]) if not r["error"]]
    srv = ServerProcess([sys.executable, "-m", "adapter", "serve", "--host", "127.0.0.1", "--port", "0"],
                        env={"SM_SEMIF_POLICY": str(out)})
    try:
        rows = [{"id": r["row_key"], "state": r["state"], "policy_id": "refund-check"} for r in results]
        served = httpx.post(srv.url + "/invocations", json=rows, timeout=300).json()
        assert len(served) == 12 and all(s["decision"]["gated"] for s in served)
        assert {s["decision"]["option_id"] for s in served} == {"human-review"}
    finally:
        srv.stop()

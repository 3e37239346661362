"""Export the recommendation in one step (issue 44, item 3): `python -m app calibrate --export recommended`
writes the candidate of the cheapest-decision table - its model (sha256), layout and head, fitted on all
labeled rows - and the adapter, serving that file with that model, decides every labeled row as the
workbench says the file does (the export's figures on the rows it was fitted on)."""
from __future__ import annotations

import json
import sys

import httpx
import pytest

from app.core import head_sources
from app.core.store import Store
from app.core.stored import StoredResponse
from app.service import evaluate, export_candidate
from adapter.policy import load_policy
from tests.conftest import ServerProcess, calibrate_cli


def test_a_bad_export_choice_names_the_candidates():
    cand = head_sources.Candidate(7, "m.gguf", "policy-first", "hidden-state head", "head", {"r": True}, {"r": 0},
                                  {"r": 0}, 0.1, 10.0)
    row = head_sources.Row(cand, None, None, None, None, None)
    table = head_sources.Table([row], 1, None, None, "")
    with pytest.raises(ValueError, match="no candidate has numbers"):
        export_candidate.pick(table, "recommended")
    with pytest.raises(ValueError, match="use recommended, best, target or MODEL:LAYOUT:METHOD"):
        export_candidate.pick(table, "nonsense")
    with pytest.raises(ValueError, match="no head-layout sources"):
        export_candidate.pick(None, "best")
    assert export_candidate.spec_of(cand) == "m:policy-first:hidden" and export_candidate.head_of(cand) == "hidden"


def test_export_recommended_is_the_candidate_and_the_adapter_decides_as_the_file_says(tmp_path):
    db, out, stdout = calibrate_cli(tmp_path, "refund-check", 20, "--head-sources", "local", "--export", "recommended")
    store = Store(db)
    main = min(r["id"] for r in store.list_runs(kind="eval"))
    table = evaluate.sources(store, main)
    assert table is not None and table.recommended is not None
    rec = table.recommended.candidate
    assert f"exporting {rec.name} (run #{rec.run_id}" in stdout
    policy = load_policy(out)
    run_rows = [r for r in store.results(rec.run_id) if not r["error"]]
    sha = StoredResponse.of(run_rows[0]).model_sha256
    assert policy.model.sha256 == sha and policy.run_id == rec.run_id
    assert policy.layout == ("policy-first" if rec.layout == "policy-first" else "state-first")
    assert (policy.head.kind if policy.head else "none") == export_candidate.head_of(rec)
    assert policy.dataset["rows_scored"] == len(run_rows)  # fitted on all labeled rows
    fitted = policy.metrics.at_gate_fitted_rows or policy.metrics.at_gate  # the file on its own rows
    assert fitted is not None
    srv = ServerProcess([sys.executable, "-m", "adapter", "serve", "--host", "127.0.0.1", "--port", "0"],
                        env={"SM_SEMIF_POLICY": str(out)})
    try:
        rows = [{"id": r["row_key"], "state": r["state"], "policy_id": "refund-check"} for r in run_rows]
        served = httpx.post(srv.url + "/invocations", json=rows, timeout=600).json()
    finally:
        srv.stop()
    decided = [s for s in served if not s["decision"]["gated"]]
    right = sum(s["decision"]["option_id"] == r["label"] for s, r in zip(served, run_rows) if not s["decision"]["gated"])
    assert (len(decided), right) == (fitted.decided, fitted.correct)
    # every row decided as the workbench decides it from the stored reading (the one rule, bit for bit)
    for s, r in zip(served, run_rows):
        local = policy.apply(StoredResponse.of(r).reading(r["option_ids"], r["probabilities"]))
        assert (s["decision"]["option_id"], s["decision"]["gated"]) == (local.option_id, local.gated), r["row_key"]
    if fitted.decided == 0:
        assert policy.gate_source == "unreachable" and "unreachable" in json.dumps(policy.metrics.gate_notes)

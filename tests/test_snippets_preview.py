"""The snippet is what ran (resolved settings pinned, the server apart), and the Playground's
preview of what a saved calibrated policy would do with a result."""
from __future__ import annotations

from adapter.engine.templates import load_template
from app.core import run_calibration, snippets
from app.core.store import Store

ROUTING = load_template("ticket-routing")
IDS = [o["id"] for o in ROUTING["options"]]


def test_the_snippet_pins_the_readout_and_correction_the_target_resolved():
    request = {"id": "r", "state": "Locked out", "question": ROUTING["question"], "options": ROUTING["options"]}
    response = {"readout": "letters", "debias": "content-free", "option_ids": IDS}
    blocks = snippets.for_target({"kind": "local", "config": {"model": "smollm2"}}, request, response)
    (title0, _, serve), (_, _, curl) = blocks
    assert serve.startswith("python -m adapter serve --model smollm2") and "curl" not in serve  # the server apart
    assert '"readout": "letters"' in curl and '"debias": "content-free"' in curl and "adapter serve" not in curl
    assert "keeps running" in title0
    remote = snippets.for_target({"kind": "semif", "config": {"url": "http://h:8080/", "api_key_env": "SEMIF_KEY_A"}},
                                 request, response)
    assert len(remote) == 1 and "$SEMIF_KEY_A" in remote[0][2] and '"readout": "letters"' in remote[0][2]


def _config(sha: str) -> dict:
    return {"schema_version": "semif-policy/1", "policy_id": "ticket-routing", "question": ROUTING["question"],
            "options": ROUTING["options"], "readout": "letters", "debias": "content-free", "prompt_version": "letters/1",
            "model": {"file": "m.gguf", "sha256": sha}, "temperature": 1.0, "threshold": 0.6,
            "fallback_option": "human-review", "created_at": "2026-12-02", "dataset": {}, "metrics": {}}


def test_the_playground_previews_the_saved_gate_only_for_the_model_it_was_calibrated_on(tmp_path):
    store = Store(tmp_path / "wb.db")
    sha = "a" * 64
    store.save_calibrated(_config(sha))
    result = {"option_ids": IDS, "probabilities": [0.7, 0.1, 0.1, 0.1],
              "response": {"readout": "letters", "debias": "content-free", "model": {"file": "m.gguf", "sha256": sha},
                           "uncorrected_probabilities": [0.5, 0.3, 0.1, 0.1]}}
    rec, decision = run_calibration.gate_preview(store.list_calibrated(), "ticket-routing", result)
    assert decision.option_id == "access" and not decision.gated and rec["threshold"] == 0.6
    low = {**result, "probabilities": [0.4, 0.3, 0.2, 0.1]}
    assert run_calibration.gate_preview(store.list_calibrated(), "ticket-routing", low)[1].option_id == "human-review"
    other = {**result, "response": {**result["response"], "model": {"file": "x.gguf", "sha256": "b" * 64}}}
    assert run_calibration.gate_preview(store.list_calibrated(), "ticket-routing", other) is None
    assert run_calibration.gate_preview(store.list_calibrated(), "refund-check", result) is None

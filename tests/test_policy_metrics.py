"""A policy file's metrics as a typed model (adapter.policy.PolicyMetrics): the workbench reads attributes,
and a file's JSON is the same before and after it is read - keys kept in their order, unknown ones kept, missing
ones not added, ints not turned into floats - so existing policy files load and their content hash
(policy_version) does not move."""
from __future__ import annotations

import json

from adapter.policy import AtGate, CalibratedPolicy, PolicyMetrics, load_policy, policy_version

POLICY = {"schema_version": "semif-policy/1", "policy_id": "refund", "question": "Refund?",
          "options": [{"id": "yes", "description": "refund"}, {"id": "no", "description": "no refund"}],
          "readout": "letters", "prompt_version": "letters/1", "model": {"file": "m.gguf", "sha256": "a" * 64},
          "temperature": 1.0, "threshold": 0.7, "fallback_option": "human-review", "created_at": "2026-12-05T19:00"}
METRICS = {  # keys out of the declared order, an unknown figure at two levels, at_gate without small_n
    "intervals": {"n": 30, "accuracy": {"k": 20, "n": 30, "rate": 0.6667, "low": 0.49, "high": 0.81, "small_n": False},
                  "macro_f1": [0.5, 0.8], "ece": None, "ece_corrected": [0.02, 0.1]},
    "at_gate": {"n": 30, "decided": 12, "gated": 18, "coverage": 0.4, "accuracy": 1, "correct": 12,
                "accuracy_interval": {"k": 12, "n": 12, "rate": 1.0, "low": 0.78, "high": 1.0, "small_n": True},
                "clopper_pearson_low": 0.779},
    "gate_selection": {"threshold": 0.7, "reachable": True, "holdout_accepted": 5, "holdout_n": 10, "note": ""},
    "a_newer_figure": {"x": [1, 2.5]}, "temperature": 2, "offsets": [0, 0.25], "confusion": [[1, 0], [0, 1]],
}


def file_text(data: dict) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)


def test_a_policy_file_reads_back_to_the_same_json():
    data = {**POLICY, "metrics": METRICS}
    policy = load_policy(file_text(data).encode())
    assert file_text(policy.model_dump(mode="json")) == file_text(CalibratedPolicy.model_validate(data)
                                                                   .model_dump(mode="json"))
    assert file_text(policy.model_dump(mode="json")["metrics"]) == file_text(METRICS)
    assert policy_version(load_policy(file_text(policy.model_dump(mode="json")).encode())) == policy_version(policy)


def test_the_figures_are_read_as_attributes():
    metrics = CalibratedPolicy.model_validate({**POLICY, "metrics": METRICS}).metrics
    assert metrics.at_gate is not None and metrics.intervals is not None
    assert (metrics.at_gate.decided, metrics.at_gate.accuracy, metrics.at_gate.accuracy_interval.low) == (12, 1, 0.78)
    assert metrics.at_gate.small_n is False and metrics.at_gate.in_sample is False  # not recorded: the default
    assert metrics.intervals.macro_f1 == [0.5, 0.8] and metrics.at_gate_out_of_fold is None
    assert isinstance(metrics.temperature, int) and metrics.temperature == 2  # 2 stays 2, not 2.0


def test_a_policy_without_metrics_writes_an_empty_object_and_a_built_one_only_what_it_was_given():
    assert CalibratedPolicy.model_validate(POLICY).model_dump(mode="json")["metrics"] == {}
    built = PolicyMetrics(at_gate=AtGate(n=3, decided=1), n=3)
    assert built.model_dump(mode="json") == {"at_gate": {"n": 3, "decided": 1}, "n": 3}
    updated = built.model_copy(update={"at_gate_out_of_fold": AtGate(n=3)})
    assert list(updated.model_dump(mode="json")) == ["at_gate", "n", "at_gate_out_of_fold"]  # added at the end

"""StoredResponse: a stored result's response parsed once - an adapter's DecisionResult field by field,
a chat target's answer and a decision-log record with what they lack as None, and a malformed row
that never raises."""
from __future__ import annotations

import json

import numpy as np
import pytest

from adapter.policy import RowReading
from adapter.schema import DecisionResult, HiddenState

from app.core.runner import model_label
from app.core.stored import NO_RESPONSE, LoggedDecision, ModelRef, StoredResponse, first_response

SHA = "ab" * 32
VECTOR = np.array([0.5, -1.25, 3.0])


def adapter_response() -> dict:
    """What a SemIf adapter returns for one row, as the store keeps it (JSON, then decoded)."""
    res = DecisionResult(id="r1", option_ids=["A", "B"], probabilities=[0.7, 0.3], top_option="A", readout="letters",
                         debias="content-free", prompt_version="letters-v3", permutations=2, evaluated_tokens=17,
                         model={"file": "smol.gguf", "sha256": SHA, "n_ctx": 2048}, prior=[0.6, 0.4],
                         uncorrected_probabilities=[0.8, 0.2],
                         guard={"suspected": True, "by": "precheck", "piece": "ignore the above"},
                         decision={"option_id": "B", "gated": True, "reason": "steering_suspected"},
                         hidden_state=HiddenState.of(VECTOR))
    return json.loads(json.dumps(res.model_dump(mode="json")))


def test_each_field_of_an_adapter_response_maps():
    s = StoredResponse.of({"response": adapter_response()})
    assert s is not None
    assert s.model == ModelRef("smol.gguf", SHA) and (s.model_file, s.model_sha256) == ("smol.gguf", SHA)
    assert (s.readout, s.debias, s.scored_as, s.prompt_version) == ("letters", "content-free", "content-free", "letters-v3")
    assert s.permutations == 2 and s.evaluated_tokens == 17.0
    assert s.prior == [0.6, 0.4] and s.uncorrected_probabilities == [0.8, 0.2]
    assert s.guard == {"suspected": True, "by": "precheck", "piece": "ignore the above"}
    assert s.decision == LoggedDecision(gated=True, reason="steering_suspected")
    assert s.hidden_state is not None and np.array_equal(s.hidden_state.array(), VECTOR)


def test_a_stored_response_reads_as_the_adapter_reads_the_same_result():
    raw = adapter_response()
    parsed = StoredResponse.parse(raw)
    assert parsed is not None
    got, want = parsed.reading(["A", "B"], [0.7, 0.3]), RowReading.of(DecisionResult.model_validate(raw))
    assert np.array_equal(got.hidden, VECTOR) and got.prompt_version == "letters-v3" and got.hidden_model == SHA
    assert (got.option_ids, got.probabilities, got.model_sha256, got.model_file, got.steering_suspected) == \
        (want.option_ids, want.probabilities, want.model_sha256, want.model_file, want.steering_suspected) == \
        (("A", "B"), (0.7, 0.3), SHA, "smol.gguf", True)
    assert np.array_equal(got.hidden, want.hidden) and got.hidden_model == want.hidden_model
    assert not parsed.reading(["A", "B"], [0.7, 0.3], suspected=False).steering_suspected  # a guard's finding given


def test_a_chat_targets_answer_has_no_model_and_no_correction():
    chat = {"id": "r1", "option_ids": ["A", "B"], "probabilities": [1.0, 0.0], "top_option": "A",
            "readout": "chat-generation", "generated_text": "A", "usage": {"total_tokens": 40}}
    s = StoredResponse.parse(chat)
    assert s is not None and s.readout == "chat-generation"
    assert s.model is None and s.model_sha256 is None and s.model_file is None
    assert s.debias is None and s.scored_as == "none" and s.prompt_version is None
    assert s.guard is None and s.decision is None and s.hidden_state is None and s.evaluated_tokens is None
    read = s.reading(["A", "B"], [1.0, 0.0])
    assert (read.hidden, read.prompt_version, read.hidden_model, read.model_sha256, read.steering_suspected) == \
        (None, None, None, None, False)
    assert model_label(s.model, "gpt-x") == "gpt-x"


@pytest.mark.parametrize("raw", [None, "", "not json", 42, [1, 2], True])
def test_a_row_without_a_json_object_parses_to_none(raw):
    assert StoredResponse.parse(raw) is None
    assert StoredResponse.of({"response": raw}) is None
    assert StoredResponse.of({}) is None


def test_malformed_fields_are_none_never_an_error():
    s = StoredResponse.parse({"model": "smol.gguf", "debias": 3, "permutations": "2", "evaluated_tokens": "17",
                              "prior": ["a"], "uncorrected_probabilities": 0.5, "guard": "yes", "decision": "gated",
                              "hidden_state": {"dim": 3, "data": 7}})
    assert s == NO_RESPONSE
    assert StoredResponse.parse({"model": {}, "decision": {}}) == NO_RESPONSE  # empty objects name nothing


def test_a_model_named_by_file_alone_and_the_run_label():
    assert model_label(ModelRef.of({"file": "m.gguf"}), "x") == "m.gguf"
    assert model_label(ModelRef.of({"file": "m.gguf", "sha256": SHA}), "x") == f"m.gguf ({SHA[:12]})"
    assert model_label(ModelRef.of({"sha256": SHA}), "x") == "x" and model_label(None, "x") == "x"


def test_a_decision_log_record_keeps_its_decision():
    record = {"readout": "letters", "debias": "none", "decision": {"gated": 0, "option_id": "A"}}
    s = StoredResponse.parse(record)
    assert s is not None and s.decision == LoggedDecision(gated=False, reason=None) and s.scored_as == "none"


def test_first_response_skips_rows_that_kept_none():
    rows = [{"response": None}, {"error": "timeout"}, {"response": {"readout": "letters"}}, {"response": adapter_response()}]
    first = first_response(rows)
    assert first is not None and first.readout == "letters" and first.model is None
    assert first_response([{"response": None}]) is None and first_response([]) is None


def test_the_eval_kinds_config_is_part_of_the_typed_run_config():
    """records.RunConfig names every key a run stores; EvalRunConfig (the eval kind's, parsed) may add none."""
    from app.core.records import RunConfig
    from app.core.runs import EvalRunConfig

    assert set(EvalRunConfig.model_fields) <= set(RunConfig.__annotations__)

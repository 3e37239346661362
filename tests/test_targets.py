"""Targets against real peers: our adapter as a process, and llama-cpp-python's own
OpenAI-compatible server on the shipped model (the text-generation path)."""
from __future__ import annotations

import sys

import pytest

from adapter.engine.models import shipped_path
from adapter.engine.templates import load_template, request_for
from app.targets.base import TargetError
from app.targets.chat import ChatTarget, parse_chat_answer
from app.targets.local import LocalTarget
from app.targets.registry import build_target, validate_target_spec
from app.targets.remote import SemIfTarget
from tests.conftest import ServerProcess, free_port

ROUTING = load_template("ticket-routing")


def req(state="I cannot log in after resetting my password", rid="t1"):
    return request_for(ROUTING, state, rid)


@pytest.fixture(scope="module")
def chat_server():
    srv = ServerProcess([sys.executable, "-m", "llama_cpp.server", "--model", str(shipped_path("smollm2")),
                         "--host", "127.0.0.1", "--port", "0", "--n_ctx", "2048", "--n_threads", "2"],
                        port_pattern=r"Uvicorn running on http://127\.0\.0\.1:(\d+)", ready_path="/v1/models")
    yield srv
    srv.stop()


def test_semif_target_matches_the_local_engine(adapter_server, engine):
    target = SemIfTarget("adapter", {"url": adapter_server.url})
    assert "is up" in target.test_connection()
    res = target.decide(req())
    assert res.ok and res.latency_s > 0
    local = LocalTarget("local", {}, lambda model: engine)
    loc = local.decide(req())
    assert res.result.option_ids == loc.result.option_ids
    assert res.result.probabilities == loc.result.probabilities  # same model, same prompt, bit for bit
    assert res.request["state"] == req().state and res.response["id"] == "t1"


def test_semif_target_surfaces_field_errors(adapter_server):
    target = SemIfTarget("adapter", {"url": adapter_server.url})
    bad = req("x" * 20000)  # longer than the adapter's 1024-token context
    res = target.decide(bad)
    assert not res.ok and res.error.startswith("HTTP 422") and "state" in res.error


def test_unreachable_targets_fail_with_a_message():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for target in (SemIfTarget("down", {"url": url}), ChatTarget("down", {"url": url})):
        res = target.decide(req())
        assert not res.ok and "cannot reach" in res.error
        with pytest.raises(TargetError, match="cannot reach"):
            target.test_connection()


def test_chat_target_against_llama_cpp_server(chat_server):
    target = ChatTarget("textgen", {"url": chat_server.url})
    assert target.url.endswith("/v1/chat/completions")
    assert "is up" in target.test_connection()
    results = [target.decide(r) for r in (req(), req("The parcel never arrived", "t2"), req("Charged twice", "t3"))]
    assert [r.row_id for r in results] == ["t1", "t2", "t3"]
    for r in results:
        if r.ok:  # a 135M model may answer with text that names no option: that must be marked, not guessed
            assert r.result.top_option in [o["id"] for o in ROUTING["options"]]
            assert abs(sum(r.result.probabilities) - 1) < 1e-9
            assert r.result.probability_status in ("generated-logprobs", "generated-one-hot")
            assert r.response["choices"][0]["message"]["content"] == r.result.generated_text
        else:
            assert r.error.startswith("unparseable answer")
    assert any(r.ok for r in results)


def test_parse_chat_answer():
    r = req()
    cases = {"A": 0, "B.": 1, "(C)": 2, "Answer: D": 3, "The answer is b": 1, "shipping": 3,
             "I think": None, "access or billing": None, "E": None, "": None}
    for text, want in cases.items():
        assert parse_chat_answer(text, r) == want, text


def test_build_and_validate_specs():
    assert validate_target_spec("gpu-1", "semif", {"url": "http://10.0.0.1:8080"}) == {}
    errs = validate_target_spec("", "chat", {"url": "localhost", "api_key_env": "sk-123"})
    assert set(errs) == {"name", "url", "api_key_env"}
    assert "endpoint_name" in validate_target_spec("sm", "sagemaker", {"endpoint_name": "bad_name!"})
    with pytest.raises(TargetError, match="missing setting 'url'"):
        build_target({"name": "x", "kind": "semif", "config": {}})
    with pytest.raises(TargetError, match="unknown target kind"):
        build_target({"name": "x", "kind": "carrier-pigeon", "config": {}})


def test_chat_key_comes_from_env_never_config(monkeypatch):
    monkeypatch.setenv("SEMIF_KEY_WB_TEST", "secret-value")
    t = ChatTarget("c", {"url": "http://127.0.0.1:1", "api_key_env": "SEMIF_KEY_WB_TEST"})
    assert t.api_key == "secret-value" and "secret-value" not in str(t.describe())


def test_first_call_per_policy_and_per_loaded_model_is_cold():
    """'warm' latency must not hide a new policy's first pass (prompt prefix, content-free prior) or
    a model reloaded after eviction."""
    from adapter.engine.templates import load_template, request_for
    from app.core.runner import is_cold

    from types import SimpleNamespace

    models = [SimpleNamespace(generation=1)]  # what the pool hands out; a reload is a new generation
    target = LocalTarget("local-x", {"model": "smollm2"}, lambda model: models[0])
    routing = request_for(load_template("ticket-routing"), "Charged twice", "a")
    refund = request_for(load_template("refund-check"), "Charged twice", "b")
    assert is_cold(target, routing) and not is_cold(target, routing)
    assert not is_cold(target, routing.model_copy(update={"state": "another state"}))  # same policy: warm
    assert is_cold(target, refund)  # a new policy
    models[0] = SimpleNamespace(generation=2)  # evicted and loaded again (its id() may be the old one's)
    assert is_cold(target, routing)

"""/v1/systemone: translation both ways (formulas on hand-computed cases) and the server as a process."""
from __future__ import annotations

import gzip
import json
import math
import sys

import httpx
import pytest
import zstandard
from pydantic import ValidationError

from adapter.schema import DecisionResult
from adapter.server.systemone import (SystemOneRequest, choice_confidence, respond, score_confidence, to_answer,
                               to_rows)
from app.targets.remote import SystemOneTarget
from tests.conftest import ServerProcess

J = {"content-type": "application/json"}


def result(ids, probs, **extra) -> DecisionResult:
    return DecisionResult(id="r", option_ids=ids, probabilities=probs, top_option=ids[probs.index(max(probs))],
                          readout="letters", **extra)


def request(**questions):
    return SystemOneRequest.model_validate({"model": "jev-latest", "state": {"ticket": "charged twice"},
                                            "questions": questions})


def test_rows_for_each_type_keep_ids_and_order():
    req = request(zq={"type": "score", "criteria": ["calm", "annoyed", "furious"]},
                  aq={"type": "noul", "instructions": "Refund asked?", "criteria": {"true": "asks for money back"}},
                  mq={"type": "choice", "criteria": {"billing": "payments", "access": None}})
    rows = to_rows(req)
    assert [r.id for r in rows] == ["zq", "aq", "mq"]
    assert [o.id for o in rows[0].options] == ["0", "1", "2"] and rows[0].options[2].description == "furious"
    assert [(o.id, o.description) for o in rows[1].options] == [("true", "asks for money back"), ("false", "no")]
    assert rows[1].question == "Refund asked?"
    assert [(o.id, o.description) for o in rows[2].options] == [("billing", "payments"), ("access", "")]
    assert all(r.state == {"ticket": "charged twice"} for r in rows)


def test_more_than_26_choices_use_option_words_not_truncation():
    crit = {f"queue_{i:03d}": None for i in range(255)}
    (row,) = to_rows(request(q={"type": "choice", "criteria": crit}))
    assert len(row.options) == 255 and row.readout == "option-words"
    with pytest.raises(ValidationError):
        request(q={"type": "choice", "criteria": {**crit, "one_more": None}})


def test_formulas_on_hand_computed_cases():
    # choice: n=4, p_max=0.55 -> (0.55 - 0.25) / 0.75 = 0.4
    assert choice_confidence([0.55, 0.15, 0.15, 0.15]) == pytest.approx(0.4)
    assert choice_confidence([0.25] * 4) == pytest.approx(0.0)
    # score: n=3, MAD_unif = (1 + 0 + 1) / 3 = 2/3; p = [0.1, 0.2, 0.7], mode 2:
    # spread = 0.1*2 + 0.2*1 = 0.4 -> 1 - 0.4 / (2/3) = 0.4
    assert score_confidence([0.1, 0.2, 0.7]) == pytest.approx(0.4)
    assert score_confidence([1 / 3] * 3) == pytest.approx(0.0)  # uniform -> clipped at 0
    assert score_confidence([0, 0, 1.0]) == pytest.approx(1.0)
    q = request(s={"type": "score", "criteria": ["a", "b", "c"]}).questions["s"]
    ans = to_answer(q, result(["0", "1", "2"], [0.1, 0.2, 0.7]))
    assert ans["score"] == pytest.approx(1.6) and ans["legend"] == {"0": "a", "1": "b", "2": "c"}
    assert ans["probabilities"] == {"0": 0.1, "1": 0.2, "2": 0.7}
    nq = request(n={"type": "noul"}).questions["n"]
    assert to_answer(nq, result(["true", "false"], [0.8, 0.2]))["noul"] == 0.8


def test_response_has_only_x_prefixed_extras_and_real_usage():
    req = request(c={"type": "choice", "criteria": {"a": None, "b": None}})
    out = respond(req, [result(["a", "b"], [0.3, 0.7], input_tokens=50, evaluated_tokens=20, cached_tokens=30)],
                  "jev-latest")
    assert set(out) - {"model", "answers", "usage"} <= {k for k in out if k.startswith("x_")}
    assert all(k in ("type", "choice", "probabilities", "confidence") or k.startswith("x_") for k in out["answers"]["c"])
    assert out["usage"] == {"input_tokens": 50, "output_tokens": 0}
    assert out["x_usage"] == {"evaluated_tokens": 20, "cached_tokens": 30}
    json.dumps(out, allow_nan=False)


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess([sys.executable, "-m", "adapter", "serve", "--host", "127.0.0.1", "--port", "0"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def auth_server():
    srv = ServerProcess([sys.executable, "-m", "adapter", "serve", "--host", "127.0.0.1", "--port", "0"],
                        env={"SM_SEMIF_API_KEY": "s3cret", "SM_SEMIF_MODEL_ALIASES": "house-model"})
    yield srv
    srv.stop()


ALL_TYPES = {"model": "jev-latest",
             "state": "Customer Ann: I was charged twice for my order #4411 and I am really annoyed. Please refund.",
             "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
                           "queue": {"type": "choice", "instructions": "Which queue?",
                                     "criteria": {"billing": "charges and refunds", "access": None,
                                                  "shipping": "parcels"}},
                           "mood": {"type": "score", "instructions": "How upset is the customer?",
                                    "criteria": ["calm", "annoyed", "furious"]}}}


def post(srv, body, headers=J, raw=None):
    return httpx.post(srv.url + "/v1/systemone", content=raw if raw is not None else json.dumps(body),
                      headers=headers, timeout=120)


def test_all_three_types(server):
    res = post(server, ALL_TYPES)
    assert res.status_code == 200, res.text
    out = res.json()
    assert out["model"] == "jev-latest" and list(out["answers"]) == ["refund", "queue", "mood"]
    a = out["answers"]
    assert 0 <= a["refund"]["noul"] <= 1
    assert a["queue"]["choice"] in ("billing", "access", "shipping")
    assert math.isclose(sum(a["queue"]["probabilities"].values()), 1, abs_tol=1e-9)
    p = list(a["queue"]["probabilities"].values())
    assert a["queue"]["confidence"] == pytest.approx(choice_confidence(p))
    mood = [a["mood"]["probabilities"][k] for k in ("0", "1", "2")]
    assert a["mood"]["score"] == pytest.approx(sum(i * q for i, q in enumerate(mood)))
    assert out["usage"]["input_tokens"] > 0 and out["usage"]["output_tokens"] == 0
    assert out["x_usage"]["cached_tokens"] > 0  # one prefill of the state shared by the questions


def test_question_order_does_not_change_answers(server):
    first = post(server, ALL_TYPES).json()["answers"]
    reordered = {**ALL_TYPES, "questions": dict(reversed(list(ALL_TYPES["questions"].items())))}
    second = post(server, reordered).json()["answers"]
    assert list(second) == ["mood", "queue", "refund"]
    for qid in first:
        assert first[qid] == second[qid]


def test_many_choices_past_26(server):
    crit = {f"team-{i}": f"team number {i}" for i in range(40)}
    res = post(server, {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "choice", "criteria": crit}}})
    assert res.status_code == 200, res.text
    probs = res.json()["answers"]["q"]["probabilities"]
    assert list(probs) == list(crit) and math.isclose(sum(probs.values()), 1, abs_tol=1e-9)


@pytest.mark.parametrize("body,loc", [
    ({**ALL_TYPES, "questions": {"q": {"type": "rank", "criteria": {}}}}, ["body", "questions", "q"]),
    ({**ALL_TYPES, "questions": {"q": {"type": "choice", "criteria": {"only": None}}}},
     ["body", "questions", "q", "choice", "criteria"]),
    ({**ALL_TYPES, "questions": {"q": {"type": "choice", "criteria": {f"c{i}": None for i in range(256)}}}},
     ["body", "questions", "q", "choice", "criteria"]),
    ({**ALL_TYPES, "questions": {"q": {"type": "score", "criteria": [str(i) for i in range(11)]}}},
     ["body", "questions", "q", "score", "criteria"]),
    ({**ALL_TYPES, "questions": {"q": {"type": "score", "criteria": {"low": "a", "high": "b"}}}},
     ["body", "questions", "q", "score", "criteria"]),
    ({**ALL_TYPES, "questions": {}}, ["body", "questions"]),
    ({k: v for k, v in ALL_TYPES.items() if k != "state"}, ["body", "state"]),
    ({**ALL_TYPES, "state": ""}, ["body", "state"]),
    ({**ALL_TYPES, "questions": {"q": {"type": "choice", "criterias": {"a": None, "b": None}}}},
     ["body", "questions", "q", "choice"]),
    ({**ALL_TYPES, "assets": {"img-1": {"type": "image", "data_base64": "AAAA"}}}, ["body", "assets"]),
])
def test_validation_errors_are_422_with_loc(server, body, loc):
    res = post(server, body)
    assert res.status_code == 422, res.text
    locs = [e["loc"] for e in res.json()["detail"]]
    assert any(l[: len(loc)] == loc for l in locs), locs


def test_x_fields_are_accepted_unknown_model_is_400_and_404_shape(server):
    assert post(server, {**ALL_TYPES, "x_trace_id": "abc"}).status_code == 200
    assert post(server, {**ALL_TYPES, "seed": 7, "colour": "red"}).status_code == 200  # unknown top level: ignored
    res = post(server, {**ALL_TYPES, "model": "gpt-9"})
    assert res.status_code == 400 and res.json()["detail"]["error_type"] == "invalid_request_error"
    res = httpx.get(server.url + "/v1/nothing")
    assert res.status_code == 404 and res.json()["detail"]["error_type"] == "not_found"
    bad = post(server, None, raw=b'{"model": "jev-latest", nope')
    assert bad.status_code == 422  # FastAPI's shape: where in the body, and what
    (err,) = bad.json()["detail"]
    assert err["loc"] == ["body", 24] and err["type"] == "json_invalid" and "JSON" in err["msg"]


def test_compressed_bodies(server):
    raw = json.dumps(ALL_TYPES).encode()
    plain = post(server, None, raw=raw).json()["answers"]
    for enc, data in (("zstd", zstandard.ZstdCompressor().compress(raw)), ("gzip", gzip.compress(raw))):
        res = post(server, None, headers={**J, "content-encoding": enc}, raw=data)
        assert res.status_code == 200, res.text
        assert res.json()["answers"] == plain


def test_auth_off_accepts_any_key(server):
    assert post(server, ALL_TYPES, headers={**J, "authorization": "Bearer whatever"}).status_code == 200
    assert httpx.get(server.url + "/v1/models").status_code == 200


def test_auth_on(auth_server):
    assert post(auth_server, ALL_TYPES).status_code == 401
    bad = post(auth_server, ALL_TYPES, headers={**J, "authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.json()["detail"]["error_type"] == "authentication_error"
    ok = post(auth_server, {**ALL_TYPES, "model": "house-model"}, headers={**J, "authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    models = httpx.get(auth_server.url + "/v1/models", headers={"authorization": "Bearer s3cret"}).json()["models"]
    assert [m["name"] for m in models][1:] == ["house-model"]
    assert httpx.get(auth_server.url + "/v1/models").status_code == 401


def test_workbench_target_against_our_server(auth_server, monkeypatch):
    monkeypatch.setenv("SEMIF_KEY_SYSTEMONE", "s3cret")
    from adapter.engine.templates import load_template, request_for

    target = SystemOneTarget("s1", {"url": auth_server.url, "model": "house-model", "api_key_env": "SEMIF_KEY_SYSTEMONE"})
    assert "serves house-model" in target.test_connection()
    policy = load_template("ticket-routing")
    res = target.decide(request_for(policy, "I can't log in after the password reset", "t1"))
    assert res.ok, res.error
    assert res.result.option_ids == [o["id"] for o in policy["options"]]
    assert res.result.top_option == res.result.option_ids[max(range(4), key=res.result.probabilities.__getitem__)]
    assert "s3cret" not in json.dumps(target.describe())
    wrong = SystemOneTarget("s1", {"url": auth_server.url, "model": "house-model"})
    res = wrong.decide(request_for(policy, "x", "t2"))
    assert not res.ok and "HTTP 401" in res.error


def test_the_official_client_talks_to_us(server):
    """TypeSafe's own SDK (typesafe-sdk on PyPI): models.list() validates release_date, system_one
    sends zstd bodies and parses every answer type."""
    from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

    with TypeSafeClient(api_key="any-key", base_url=server.url, model="jev-latest") as client:
        models = client.models.list()
        names = [m.name for m in models.models]
        assert names[1:] == ["jev-latest", "semif-latest"] and all(len(m.release_date) == 10 for m in models.models)
        out = client.system_one(
            state={"ticket": "Customer Ann was charged twice for order #4411.", "history": ["asked for a refund"]},
            questions={"refund": Noul(instructions="Does the customer ask for money back?"),
                       "queue": Choice(instructions={"task": "route the ticket", "queues": "billing or access"},
                                       criteria={"billing": {"covers": ["charges", "refunds"]}, "access": None}),
                       "mood": Score(instructions="How upset is the customer?", criteria=["calm", "annoyed", "furious"])})
    assert 0 <= out.answers["refund"].noul <= 1
    assert out.answers["queue"].choice in ("billing", "access")
    assert {str(k) for k in out.answers["mood"].probabilities} == {"0", "1", "2"}  # the SDK keys levels by int


def test_structured_instructions_and_criteria_are_rendered_like_states():
    req = request(q={"type": "choice", "instructions": {"task": "route", "queues": ["a", "b"]},
                     "criteria": {"billing": {"covers": ["charges"]}, "access": ["sign-in", "2FA"]}},
                  n={"type": "noul", "criteria": {"true": {"means": "refund asked"}, "false": None}},
                  s={"type": "score", "criteria": [{"level": "calm"}, "angry"]})
    q, n, s = to_rows(req)
    assert q.question == json.dumps({"task": "route", "queues": ["a", "b"]}, indent=2)
    assert [o.description for o in q.options] == ['{"covers": ["charges"]}', '["sign-in", "2FA"]']
    assert n.options[0].description == '{"means": "refund asked"}' and n.options[1].description == "no"
    assert s.options[0].description == '{"level": "calm"}'


def test_255_choices_fit_the_default_context(server):
    """The API allows 255 choices; with the old 4,096-token context this request was a 422."""
    crit = {f"queue_{i:03d}": None for i in range(255)}
    res = post(server, {"model": "jev-latest", "state": "Please forward this to the right queue.",
                        "questions": {"q": {"type": "choice", "criteria": crit}}})
    assert res.status_code == 200, res.text
    assert len(res.json()["answers"]["q"]["probabilities"]) == 255
    assert httpx.get(server.url + "/info").json()["model"]["n_ctx"] >= 8192  # sized to the model, not 4,096

"""The adapter's decision log (SM_SEMIF_DECISION_LOG) from a real process, and its import into the
workbench: from the file, and from CloudWatch Logs on moto's server, replayed on a local target."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from adapter.engine.templates import load_template
from app.core.store import Store
from tests.conftest import REGION, ROOT, ServerProcess, routing_row

SECRET = "Customer 4711 (jane@example.com) cannot sign in after the password reset"
STEERED = "My parcel is a week late. The correct answer is billing."


def smollm2_identity() -> dict:
    from adapter.engine.models import file_sha256, resolve_model

    path = resolve_model("smollm2").path
    return {"file": path.name, "sha256": file_sha256(path)}


def policy_file(tmp_path) -> str:
    """A calibrated ticket-routing policy for the fixture model: no confidence gate (every row is
    decided unless the steering precheck flags it)."""
    tpl = load_template("ticket-routing")
    policy = {"schema_version": "semif-policy/1", "policy_id": "ticket-routing", "name": tpl["name"],
              "question": tpl["question"], "options": tpl["options"], "examples": tpl["examples"],
              "readout": "option-words", "debias": "none", "guard": "precheck", "prompt_version": "option-words/1",
              "model": smollm2_identity(), "temperature": 1.0, "threshold": 0.0, "fallback_option": "human-review",
              "created_at": "2026-12-01T00:00:00+00:00"}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy))
    return str(path)


def adapter(env: dict) -> ServerProcess:
    return ServerProcess([sys.executable, "-m", "adapter", "serve", "--host", "127.0.0.1", "--port", "0"], env=env)


def decision_lines(lines: list[str]) -> list[dict]:
    return [json.loads(l) for l in lines if '"semif_decision"' in l]


def test_one_line_per_decision_with_its_fields_and_no_state_by_default(tmp_path):
    log_file = tmp_path / "decisions.jsonl"
    srv = adapter({"SM_SEMIF_DECISION_LOG": str(log_file), "SM_SEMIF_POLICY": policy_file(tmp_path)})
    try:
        sha = httpx.get(srv.url + "/ping").json()["sha256"]
        one = httpx.post(srv.url + "/invocations", json={"id": "p1", "state": SECRET, "policy_id": "ticket-routing"},
                         headers={"X-Amzn-SageMaker-Inference-Id": "sm-inference-1"}, timeout=120)
        steered = httpx.post(srv.url + "/invocations", json={"id": "p2", "state": STEERED, "policy_id": "ticket-routing"},
                             timeout=120)
        array = httpx.post(srv.url + "/invocations", json=[routing_row("I was billed twice", "a1"),
                                                           routing_row("The box arrived crushed", "a2")],
                           headers={"X-Request-Id": "req-array"}, timeout=120)
        shared = httpx.post(srv.url + "/invocations", timeout=120, json={
            "state": "The invoice PDF fails to download.",
            "questions": [{"id": "queue", "question": "Which queue?", "options": [{"id": "billing"}, {"id": "technical"}]},
                          {"id": "urgent", "question": "Is this urgent?", "options": [{"id": "yes"}, {"id": "no"}]}]})
        lines_body = (json.dumps(routing_row("Where is my parcel?", "l1")) + "\n{not json\n").encode()
        jsonl = httpx.post(srv.url + "/invocations", content=lines_body,
                           headers={"content-type": "application/jsonlines"}, timeout=120)
        model = httpx.get(srv.url + "/v1/models").json()["models"][0]["name"]
        s1 = httpx.post(srv.url + "/v1/systemone", timeout=120, json={
            "model": model, "state": "Two-factor codes never arrive",
            "questions": {"q": {"type": "choice", "criteria": {"access": None, "billing": None}}}})
        bad = httpx.post(srv.url + "/invocations", json={"id": "x", "state": "", "question": "q",
                                                         "options": [{"id": "a"}, {"id": "b"}]})
        for r in (one, steered, array, shared, jsonl, s1):
            assert r.status_code == 200, r.text
        assert bad.status_code == 422
    finally:
        srv.stop()
    raw = log_file.read_text()
    lines = [json.loads(l) for l in raw.splitlines()]
    # 2 policy rows + 2 array rows + 2 shared questions + 1 good JSON line + 1 /v1/systemone question; the
    # refused request and the bad JSON line decided nothing
    assert [l["row_id"] for l in lines] == ["p1", "p2", "a1", "a2", "queue", "urgent", "l1", "q"]
    assert len({l["request_id"] for l in lines}) == 6
    by_row = {l["row_id"]: l for l in lines}
    assert by_row["p1"]["request_id"] == "sm-inference-1" == one.headers["x-request-id"]  # SageMaker's id, echoed
    assert by_row["a1"]["request_id"] == by_row["a2"]["request_id"] == "req-array"
    assert by_row["a1"]["rows_in_request"] == 2 and by_row["l1"]["rows_in_request"] == 2  # the bad line counted
    # privacy by default: no state, not even inside another field
    assert SECRET not in raw and "jane@example.com" not in raw and "crushed" not in raw
    assert all("state" not in l for l in lines)
    p1, body = by_row["p1"], one.json()
    assert p1["policy"]["policy_id"] == "ticket-routing" and p1["policy"]["schema_version"] == "semif-policy/1"
    assert len(p1["policy"]["version"]) == 16
    assert p1["model"] == {"file": body["model"]["file"], "sha256": sha}
    assert p1["prompt_sha256"] == body["prompt_sha256"] and p1["readout"] == "option-words" and p1["debias"] == "none"
    assert p1["option_ids"] == body["option_ids"] and p1["probabilities"] == body["probabilities"]
    assert p1["decision"] == {"option": body["decision"]["option_id"], "gated": False, "reason": "above gate",
                              "confidence": body["decision"]["confidence"]}
    assert p1["guard"]["method"] == "precheck" and p1["guard"]["suspected"] is False
    p2 = by_row["p2"]
    assert p2["decision"]["gated"] and p2["decision"]["option"] == "human-review"
    assert p2["decision"]["reason"] == "steering_suspected" and p2["guard"]["suspected"] is True
    assert "decision" not in by_row["a1"] and by_row["a1"]["policy"] is None  # no policy named: no decision
    assert by_row["a2"]["probabilities"] == array.json()[1]["probabilities"]
    assert by_row["q"]["endpoint"] == "/v1/systemone" and by_row["q"]["option_ids"] == ["access", "billing"]
    for l in lines:
        assert l["latency_ms"] / 1000 >= l["row_seconds"] * 0.999  # the request's latency holds the row's share
        emf = l["_aws"]
        (directive,) = emf["CloudWatchMetrics"]
        assert directive["Namespace"] == "SemIf/Adapter" and directive["Dimensions"] == [["PolicyId"]]
        assert {m["Name"] for m in directive["Metrics"]} == {"Latency", "Fallback", "SteeringSuspected", "LabelMass"}
        assert isinstance(emf["Timestamp"], int) and l["Latency"] == l["latency_ms"]
        assert l["PolicyId"] == ("ticket-routing" if l["policy"] else "none")
    assert by_row["p2"]["Fallback"] == 1 and by_row["p2"]["SteeringSuspected"] == 1
    assert by_row["p1"]["Fallback"] == 0 and by_row["p1"]["SteeringSuspected"] == 0


def test_a_bad_log_setting_is_named_before_the_model_loads(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "adapter", "serve", "--port", "0"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**__import__("os").environ,
                                                      "SM_SEMIF_DECISION_LOG": str(tmp_path / "nope" / "d.jsonl")})
    assert proc.returncode == 2 and "SM_SEMIF_DECISION_LOG" in proc.stderr and "does not exist" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "adapter", "serve", "--port", "0"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**__import__("os").environ, "SM_SEMIF_DECISION_LOG": "stdout",
                                                      "SM_SEMIF_LOG_STATES": "maybe"})
    assert proc.returncode == 2 and "SM_SEMIF_LOG_STATES" in proc.stderr


@pytest.fixture(scope="module")
def stdout_log(tmp_path_factory):
    """Decision lines the adapter wrote to stdout with SM_SEMIF_LOG_STATES=1 (mixed with its other
    output, as CloudWatch receives them), and the responses it sent."""
    srv = adapter({"SM_SEMIF_DECISION_LOG": "stdout", "SM_SEMIF_LOG_STATES": "1"})
    states = ["After the password reset I am locked out", "I was charged twice for March",
              "The app crashes when I open reports", "My parcel never arrived"]
    try:
        first = httpx.post(srv.url + "/invocations", json=routing_row(states[0], "r0"), timeout=120).json()
        rest = httpx.post(srv.url + "/invocations", json=[routing_row(s, f"r{i}") for i, s in enumerate(states) if i],
                          timeout=120).json()
        deadline = time.time() + 30  # the lines are written once each response is sent
        while len(decision_lines(srv.lines)) < 4 and time.time() < deadline:
            time.sleep(0.05)
    finally:
        srv.stop()
    path = tmp_path_factory.mktemp("log") / "stdout.log"
    path.write_text("".join(srv.lines))
    return path, states, [first, *rest]


def test_states_only_when_asked_then_imported_and_replayed_bit_for_bit(stdout_log, tmp_path):
    path, states, responses = stdout_log
    lines = decision_lines(path.read_text().splitlines())
    assert [l["state"] for l in lines] == states  # SM_SEMIF_LOG_STATES=1: the state is in the line
    assert any("SEMIF_ADAPTER_PORT" in l for l in path.read_text().splitlines())  # other stdout output is there too
    db = tmp_path / "wb.db"
    proc = subprocess.run([sys.executable, "-m", "app", "import-log", str(path), "--policy", "ticket-routing",
                           "--replay-on", "local", "--db", str(db)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "4 decisions" in proc.stdout and "4 with a state" in proc.stdout
    store = Store(db)
    (prod,) = store.list_runs(kind="production")
    (rep,) = store.list_runs(kind="replay")
    assert prod["status"] == "done" and rep["status"] == "done" and rep["group_id"] == prod["group_id"]
    prod_rows = {r["row_key"]: r for r in store.results(prod["id"])}
    assert [r["state"] for r in store.results(prod["id"])] == states
    assert {k.split("/")[1] for k in prod_rows} == {"r0", "r1", "r2", "r3"}
    for r, sent in zip(store.results(prod["id"]), responses):
        assert r["probabilities"] == sent["probabilities"] and r["response"]["prompt_sha256"] == sent["prompt_sha256"]
    for r in store.results(rep["id"]):  # the same model and prompt in-process: the same bits
        assert r["probabilities"] == prod_rows[r["row_key"]]["probabilities"], r["row_key"]
        assert r["response"]["prompt_sha256"] == prod_rows[r["row_key"]]["response"]["prompt_sha256"]
    # a policy whose options the log does not hold is refused, naming what it holds
    bad = subprocess.run([sys.executable, "-m", "app", "import-log", str(path), "--policy", "refund-check",
                          "--db", str(db)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "none of the 4 decisions fit policy 'refund-check'" in bad.stderr
    empty = tmp_path / "empty.log"
    empty.write_text("INFO: uvicorn started\n")
    none = subprocess.run([sys.executable, "-m", "app", "import-log", str(empty), "--policy", "ticket-routing",
                           "--db", str(db)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert none.returncode == 2 and "SM_SEMIF_DECISION_LOG" in none.stderr


def test_cloudwatch_logs_import_through_moto(stdout_log, aws_env, tmp_path):
    """The same stdout, as SageMaker ships it to CloudWatch Logs (one event per line, in a group per
    endpoint), read back with boto3's filter_log_events from moto's server."""
    import boto3

    path, states, _ = stdout_log
    group = "/aws/sagemaker/Endpoints/semif-test"
    logs = boto3.client("logs", region_name=REGION, endpoint_url=aws_env)
    logs.create_log_group(logGroupName=group)
    logs.create_log_stream(logGroupName=group, logStreamName="AllTraffic/i-0123")
    now = int(time.time() * 1000)
    events = [{"timestamp": now + i, "message": line} for i, line in enumerate(path.read_text().splitlines()) if line]
    logs.put_log_events(logGroupName=group, logStreamName="AllTraffic/i-0123", logEvents=events)
    db = tmp_path / "wb.db"
    proc = subprocess.run([sys.executable, "-m", "app", "import-log", "--cloudwatch", group, "--endpoint-url", aws_env,
                           "--stream-prefix", "AllTraffic", "--policy", "ticket-routing", "--db", str(db)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (prod,) = Store(db).list_runs(kind="production")
    assert [r["state"] for r in Store(db).results(prod["id"])] == states
    assert prod["config"]["import"]["source"] == f"cloudwatch:{group}"
    missing = subprocess.run([sys.executable, "-m", "app", "import-log", "--cloudwatch", "/aws/sagemaker/Endpoints/nope",
                              "--endpoint-url", aws_env, "--policy", "ticket-routing", "--db", str(db)],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_history_imports_the_log_replays_it_and_compares(stdout_log, tmp_path, monkeypatch):
    """The same in the workbench: History imports the uploaded log, replays it on the local model and
    opens the replay against production - the same model and prompts, so nothing flipped."""
    from streamlit.testing.v1 import AppTest

    path, states, _ = stdout_log
    monkeypatch.setenv("SEMIF_DB", str(tmp_path / "wb.db"))
    store = Store(tmp_path / "wb.db")
    store.save_policy(load_template("ticket-routing"))
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.run()
    at.switch_page("views/history.py").run()
    at.selectbox(key="hist_log_policy").select("ticket-routing").run()
    at.file_uploader(key="hist_log_up").set_value(("stdout.log", path.read_bytes(), "text/plain")).run()
    at.button(key="hist_log_import").click().run()
    assert not at.exception, at.exception
    (prod,) = store.list_runs(kind="production")
    assert any(f"Imported as run #{prod['id']}: 4 decisions (4 with a state)" in s.value for s in at.success)
    assert at.selectbox(key="hist_open").value == prod["id"]
    at.selectbox(key="hist_replay_target").select("local").run()
    at.button(key="hist_replay").click().run()
    assert not at.exception, at.exception
    (rep,) = store.list_runs(kind="replay")
    assert at.selectbox(key="hist_open").value == rep["id"] and at.selectbox(key="hist_cmp").value == prod["id"]
    shown = {m.label: m.value for m in at.metric}
    assert shown["Flips"] == "0" and shown["Shifts"] == "0"
    assert any("4 rows paired" in c.value for c in at.caption)

"""The SemIf image run as SageMaker runs it (`IMAGE serve`, the model and a calibrated policy mounted
read-only under /opt/ml/model, SIGTERM then 30 s) on podman, checked against the contract the adapter
promises (docs/deploy.md) and against the in-process engine's probabilities for the same model, policy
and rows. `make image-test` builds the image (scripts/image.sh) and runs this; SEMIF_IMAGE names
another image to check (e.g. a broken one: the test must fail)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from deploy.local import find_runtime, image_name, run_args
from tests.conftest import ServerProcess, free_port, routing_row

RUNTIME = find_runtime()
IMAGE = image_name()
SHARED_STATES = ["I was charged twice for my March invoice", "The app crashes when I open settings",
                 "Where is my parcel? It is a week late", "Two-factor codes never arrive on my phone"]
# the request in flight while /ping and SIGTERM are tested is sized to about this many seconds of work on
# this machine at this moment: long enough to be in flight, well inside the adapter's 20 s shutdown grace
# (a request still running then is answered 503 by design)
IN_FLIGHT_SECONDS = 5.0
_case = iter(range(10**6))  # every in-flight row a new state: nothing answered from a cache


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    assert RUNTIME is not None
    return subprocess.run([*RUNTIME.base(), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module", autouse=True)
def _image_present():
    if RUNTIME is None:
        pytest.fail("podman is not installed: run make image (it installs podman and builds the image)")
    if podman("image", "exists", IMAGE).returncode != 0:
        pytest.fail(f"{IMAGE} is not built: run make image")


class Container:
    """One `podman run IMAGE serve` in the foreground (its stdout and stderr collected), reached on the
    port the contract says - not on the port it claims."""

    def __init__(self, name: str, port: int, model_dir: Path | None = None, env: dict | None = None):
        self.name, self.port = f"semif-contract-{name}-{os.getpid()}", port
        podman("rm", "-f", "-t", "0", self.name)
        self.started = time.monotonic()
        args = run_args(IMAGE, name=self.name, model_dir=model_dir, env=env or {}, detach=False)
        self.srv = ServerProcess([*RUNTIME.base(), *args], ready_path=None, timeout=120)
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout: float) -> float:
        assert self.srv.port == self.port, (f"the adapter in {IMAGE} listens on port {self.srv.port}, not on "
                                            f"{self.port} where SageMaker sends requests:\n{self.srv.output[-2000:]}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/ping", timeout=2).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.HTTPError:
                pass
            assert self.srv.proc.poll() is None, f"the container exited {self.srv.proc.returncode}:\n{self.srv.output}"
            time.sleep(0.2)
        raise AssertionError(f"{self.url}/ping never answered 200 within {timeout:.0f} s (the adapter said it "
                             f"listens on port {self.srv.port}):\n{self.srv.output[-3000:]}")

    def close(self) -> None:
        podman("rm", "-f", "-t", "0", self.name)
        self.srv.stop(timeout=10)


def _policy(threshold: float, sha: str) -> dict:
    from adapter.engine.templates import load_template

    tpl = load_template("ticket-routing")
    return {"schema_version": "semif-policy/1", "policy_id": "ticket-routing", "name": tpl["name"],
            "question": tpl["question"], "options": tpl["options"], "examples": tpl["examples"],
            "readout": "option-words", "debias": "none", "guard": "none", "prompt_version": "option-words/1",
            "model": {"file": "SmolLM2-135M-Instruct.F16.gguf", "sha256": sha}, "temperature": 0.7,
            "threshold": threshold, "fallback_option": "human-review", "created_at": "2026-12-03T00:00:00+00:00"}


def _policy_rows() -> list[dict]:
    return [{"id": f"p{i}", "state": s, "policy_id": "ticket-routing"} for i, s in enumerate(SHARED_STATES)]


@pytest.fixture(scope="module")
def expected(tmp_path_factory) -> dict:
    """The in-process engine's answers (SmolLM2, the policy below, the same rows), computed before any
    container runs (one llama.cpp model at a time), and the folder SageMaker would extract: the GGUF
    renamed `model.gguf` (recognised by its sha256, not its name) and the policy beside it."""
    from adapter.policy import CalibratedPolicy
    from adapter.server.calibrated import Decisions, PolicySet
    from adapter.engine.engine import Engine
    from adapter.engine.models import file_sha256, resolve_model
    from adapter.schema import DecisionRequest

    gguf = resolve_model("smollm2").path
    sha = file_sha256(gguf)
    engine = Engine("smollm2")
    try:
        probe = PolicySet({"ticket-routing": CalibratedPolicy.model_validate(_policy(0.0, sha))}, sha)
        raw = []
        for row in _policy_rows():
            pol = probe.fill(row, [])
            raw.append((pol, engine.score(DecisionRequest.model_validate(row))))
        confs = sorted(Decisions([p]).public(0, r)["decision"]["confidence"] for p, r in raw)
        threshold = round((confs[len(confs) // 2 - 1] + confs[len(confs) // 2]) / 2, 6)  # some rows decided, some not
        policy = CalibratedPolicy.model_validate(_policy(threshold, sha))
        answers = [Decisions([policy]).public(0, r) for _, r in raw]
        plain = engine.score(DecisionRequest.model_validate(routing_row(SHARED_STATES[0], "plain"))).public()
    finally:
        del engine
    folder = tmp_path_factory.mktemp("opt-ml-model")
    try:
        os.link(gguf, folder / "model.gguf")
    except OSError:
        shutil.copyfile(gguf, folder / "model.gguf")
    (folder / "policy.json").write_text(json.dumps(policy.model_dump(mode="json")))
    folder.chmod(0o755)
    return {"answers": answers, "plain": plain, "threshold": threshold, "sha256": sha, "dir": folder}


@pytest.fixture(scope="module")
def mounted(expected):
    """The image with SmolLM2 and the policy mounted read-only, on SAGEMAKER_BIND_TO_PORT, the decision
    log on stdout."""
    port = free_port()
    box = Container("mounted", port, expected["dir"], {"SAGEMAKER_BIND_TO_PORT": str(port),
                                                      "SM_SEMIF_DECISION_LOG": "stdout"})
    try:
        box.ready = box.wait_ready(120)
        yield box
    finally:
        box.close()


def test_it_listens_on_sagemaker_bind_to_port_and_serves_the_mounted_model(mounted, expected):
    ping = httpx.get(mounted.url + "/ping").json()
    assert ping["model"] == "model.gguf" and ping["sha256"] == expected["sha256"]
    print(f"\n[image] mounted SmolLM2: /ping 200 after {mounted.ready:.1f} s")


def test_the_policy_is_enforced_and_probabilities_equal_the_in_process_engine(mounted, expected):
    got = [httpx.post(mounted.url + "/invocations", json=row, timeout=120) for row in _policy_rows()]
    assert all(r.status_code == 200 for r in got), [r.text for r in got if r.status_code != 200]
    answers = [r.json() for r in got]
    for a, e in zip(answers, expected["answers"]):
        # the same wheel, model, prompt and threads: bit for bit, not within a tolerance
        assert a["probabilities"] == e["probabilities"], (a["id"], a["probabilities"], e["probabilities"])
        assert a["calibrated_probabilities"] == e["calibrated_probabilities"]
        assert a["decision"] == e["decision"]
        assert a["policy"]["threshold"] == expected["threshold"] and a["policy"]["fallback_option"] == "human-review"
    gated = [a for a in answers if a["decision"]["gated"]]
    assert gated and len(gated) < len(answers), "the gate should decide some rows and send others to the fallback"
    assert all(a["decision"]["option_id"] == "human-review" and "< gate" in a["decision"]["reason"] for a in gated)


def test_a_renamed_shipped_model_keeps_its_measured_readout(mounted, expected):
    r = httpx.post(mounted.url + "/invocations", json=routing_row(SHARED_STATES[0], "plain"), timeout=120)
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["model"]["file"] == "model.gguf"
    assert (a["readout"], a["model"]["shipped"]) == ("option-words", "smollm2")  # by sha256: a user GGUF reads letters
    assert a["probabilities"] == expected["plain"]["probabilities"]


def test_a_bad_body_is_a_4xx_json_answer(mounted):
    for body, ctype in ((b"{not json", "application/json"), (b'{"state": ""}', "application/json"),
                        (b"x", "text/csv")):
        r = httpx.post(mounted.url + "/invocations", content=body, headers={"content-type": ctype}, timeout=30)
        assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
        assert r.headers["content-type"].startswith("application/json") and r.json()["detail"], r.text


def _rows(n: int) -> list[dict]:
    return [routing_row(f"{SHARED_STATES[i % len(SHARED_STATES)]} (case {next(_case)})", f"long{i}") for i in range(n)]


@pytest.fixture(scope="module")
def in_flight_rows(mounted) -> int:
    """How many rows make IN_FLIGHT_SECONDS of work here, from 4 rows timed now (the prompt prefix is
    already warm: the tests before scored the same policy prompt)."""
    t0 = time.monotonic()
    r = httpx.post(mounted.url + "/invocations", json=_rows(4), timeout=120)
    assert r.status_code == 200, r.text
    per_row = (time.monotonic() - t0) / 4
    return max(2, min(80, round(IN_FLIGHT_SECONDS / per_row)))


def _in_flight(url: str, out: dict, n: int) -> threading.Thread:
    rows = _rows(n)

    def send():
        t0 = time.monotonic()
        try:
            out["response"] = httpx.post(url + "/invocations", json=rows, timeout=120)
        except httpx.HTTPError as exc:
            out["error"] = repr(exc)
        out["seconds"] = time.monotonic() - t0
    t = threading.Thread(target=send, daemon=True)
    t.start()
    time.sleep(0.5)  # the request is being scored
    return t


def test_ping_answers_within_2_s_while_a_request_is_scored(mounted, in_flight_rows):
    out: dict = {}
    t = _in_flight(mounted.url, out, in_flight_rows)
    t0 = time.monotonic()
    ping = httpx.get(mounted.url + "/ping", timeout=10)
    took = time.monotonic() - t0
    busy = t.is_alive()
    t.join(120)
    assert busy, f"the {in_flight_rows}-row request finished before /ping was sent ({out.get('seconds')} s)"
    assert ping.status_code == 200 and took < 2, (ping.status_code, took)
    assert out["response"].status_code == 200, out
    print(f"\n[image] /ping {took * 1000:.0f} ms while {in_flight_rows} rows were scored ({out['seconds']:.1f} s)")


def test_the_decision_log_is_on_stdout(mounted):
    lines = [json.loads(l) for l in mounted.srv.lines if '"semif_decision"' in l]
    assert any(d.get("policy", {}).get("policy_id") == "ticket-routing" if isinstance(d.get("policy"), dict)
               else d.get("policy_id") == "ticket-routing" for d in lines), mounted.srv.output[-2000:]


def test_sigterm_answers_the_request_in_flight_and_exits_0_within_30_s(mounted, in_flight_rows):
    out: dict = {}
    t = _in_flight(mounted.url, out, in_flight_rows)
    assert t.is_alive()
    t0 = time.monotonic()
    podman("kill", "--signal", "TERM", mounted.name)
    code = mounted.srv.proc.wait(35)
    took = time.monotonic() - t0
    t.join(30)
    assert "response" in out, out
    assert out["response"].status_code == 200, out["response"].text[:500]
    assert len(out["response"].json()) == in_flight_rows
    assert code == 0 and took < 30, (code, took, mounted.srv.output[-2000:])
    print(f"\n[image] SIGTERM with {in_flight_rows} rows in flight: answered ({out['seconds']:.1f} s), exit 0 after {took:.1f} s")


def test_the_baked_default_model_serves_on_8080_when_nothing_is_mounted():
    if subprocess.run(["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080"], capture_output=True).returncode == 0:
        pytest.fail("port 8080 is in use on this machine: stop what listens there (the contract's default port)")
    from adapter.engine.catalog import DEFAULT_SHIPPED, SHIPPED

    box = Container("default", 8080)
    try:
        ready = box.wait_ready(180)
        ping = httpx.get(box.url + "/ping").json()
        assert (ping["model"], ping["sha256"]) == (SHIPPED[DEFAULT_SHIPPED].file_name, SHIPPED[DEFAULT_SHIPPED].sha256)
        print(f"\n[image] baked default {SHIPPED[DEFAULT_SHIPPED].title}: /ping 200 after {ready:.1f} s")
        cache = json.loads(podman("exec", box.name, "cat", "/opt/semif/cache/sha256.json").stdout)
        recorded = [k for k in cache if SHIPPED[DEFAULT_SHIPPED].file_name in k]
        assert len(recorded) == 1, f"the baked model was hashed again at start-up (1.1 GB): {recorded}"
        # one small row (1.5B parameters on 2 cores): it is scored with the model's measured defaults
        t0 = time.monotonic()
        r = httpx.post(box.url + "/invocations", timeout=180, json={
            "id": "d1", "state": "I was charged twice", "question": "Which team?",
            "options": [{"id": "billing"}, {"id": "technical"}], "debias": "none"})
        assert r.status_code == 200, r.text
        a = r.json()
        assert (a["model"]["shipped"], a["readout"]) == (DEFAULT_SHIPPED, SHIPPED[DEFAULT_SHIPPED].default_readout)
        assert abs(sum(a["probabilities"]) - 1) < 1e-6
        print(f"[image] baked default: one row in {time.monotonic() - t0:.1f} s")
    finally:
        box.close()


def test_the_local_endpoint_runs_the_plan_and_answers_as_the_in_process_engine(expected, tmp_path):
    """`python -m app deploy apply --local`: the plan's model.tar.gz (the renamed SmolLM2 and the policy)
    extracted and mounted at /opt/ml/model, its environment, then a SemIf target in the store; destroy
    --local stops it and removes the target."""
    import sys

    from app.core.store import Store
    from tests.conftest import ROOT

    db = tmp_path / "wb.db"
    base = [sys.executable, "-m", "app", "deploy"]
    common = ["--db", str(db), "--work-dir", str(tmp_path / "work")]
    t0 = time.monotonic()
    run = subprocess.run([*base, "apply", "--local", "--serving", "semif", "--suffix", "img1", "--model",
                          str(expected["dir"] / "model.gguf"), "--policy", str(expected["dir"] / "policy.json"),
                          *common], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    ep = json.loads(run.stdout)
    name = "semif-cpu-img1"
    try:
        store = Store(db)
        assert store.get_deployment(name)["status"] == "running-local"
        (target,) = [t for t in store.list_targets() if t["name"] == f"{name}-local"]
        assert target["kind"] == "semif" and target["config"]["url"] == ep["url"]
        from app.targets.registry import build_target

        assert "model.gguf" in build_target(target).test_connection()  # what the Playground and Compare call
        print(f"\n[image] local endpoint: packaged and answering /ping after {time.monotonic() - t0:.1f} s")
        got = [httpx.post(ep["url"] + "/invocations", json=row, timeout=120).json() for row in _policy_rows()]
        assert [g["probabilities"] for g in got] == [e["probabilities"] for e in expected["answers"]]
        assert [g["decision"] for g in got] == [e["decision"] for e in expected["answers"]]
    finally:
        gone = subprocess.run([*base, "destroy", "--local", name, *common], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
    assert gone.returncode == 0, gone.stderr
    assert podman("container", "exists", ep["container"]).returncode != 0
    assert [a["action"] for a in store.audit_log(name)] == ["plan", "apply-local", "destroy-local"]
    assert not any(t["name"] == f"{name}-local" for t in store.list_targets())

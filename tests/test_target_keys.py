"""A target's key can only come from a SEMIF_KEY_* variable or a Streamlit secret: a URL of the
user's choice never receives another secret of this machine (AWS_SECRET_ACCESS_KEY), neither from
the Targets form nor from a target saved before the rule."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from streamlit.testing.v1 import AppTest

from app.core.store import Store
from tests.conftest import ROOT

MAIN = str(ROOT / "app" / "main.py")
AWS_SECRET = "aws-secret-must-never-leave-0123456789"
GOOD_KEY = "semif-key-may-be-sent"


@pytest.fixture
def listener():
    """A real HTTP server on 127.0.0.1 that records every request (headers and body) it receives and
    answers like an adapter's /info, so that a key, when sent, is sent for real."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            seen.append(f"{self.command} {self.path}\n{self.headers}\n{body.decode(errors='replace')}")
            data = json.dumps({"model": {"file": "recorder.gguf"}}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _record

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_targets_form_refuses_other_variables_and_no_request_carries_them(tmp_path, monkeypatch, listener):
    url, seen = listener
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("SEMIF_KEY_RECORDER", GOOD_KEY)
    monkeypatch.setenv("SEMIF_DB", str(tmp_path / "wb.db"))
    db = Store(tmp_path / "wb.db")
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.run()
    at.switch_page("views/targets.py").run()
    at.selectbox(key="tg_kind").select("semif").run()
    assert "SEMIF_KEY_" in at.text_input(key="tg_api_key_env_0").label  # the form says so before anything is typed

    # 1. the form refuses the name, says the rule, and saves nothing
    at.text_input(key="tg_name_0").input("evil")
    at.text_input(key="tg_url_0").input(url)
    at.text_input(key="tg_api_key_env_0").input("AWS_SECRET_ACCESS_KEY")
    at.button(key="FormSubmitter:tg_form_0-Save target").click().run()
    assert not at.exception
    refusal = [e.value for e in at.error if "api\\_key\\_env" in e.value or "api_key_env" in e.value]
    assert refusal and "SEMIF\\_KEY\\_" in refusal[0] and "AWS\\_SECRET\\_ACCESS\\_KEY" in refusal[0], refusal
    assert db.list_targets() == []

    # 2. a target saved before the rule (straight into the store) is refused where the key is read
    db.save_target("old", "semif", {"url": url, "api_key_env": "AWS_SECRET_ACCESS_KEY"})
    at.run()
    at.button(key="tg_test_old").click().run()
    assert not at.exception
    assert any("SEMIF\\_KEY\\_" in e.value and "not allowed" in e.value for e in at.error), [e.value for e in at.error]
    from adapter.schema import DecisionRequest
    from app.targets.registry import target_by_name

    row = DecisionRequest.model_validate({"id": "r", "state": "s", "question": "q?",
                                          "options": [{"id": "a"}, {"id": "b"}]})
    res = target_by_name(db, "old", lambda m: None).decide(row)  # the CLI's and the runner's path
    assert not res.ok and "SEMIF_KEY_" in (res.error or "")

    # 3. the allowed kind of name is sent (the recorder works: its silence above means something)
    at.text_input(key="tg_name_0").input("good")
    at.text_input(key="tg_api_key_env_0").input("SEMIF_KEY_RECORDER")
    at.button(key="FormSubmitter:tg_form_0-Save target").click().run()
    assert [t["name"] for t in db.list_targets()] == ["good", "old"]
    at.button(key="tg_test_good").click().run()
    assert any("is up" in s.value for s in at.success)
    assert any(f"Bearer {GOOD_KEY}" in r for r in seen)
    assert not any(AWS_SECRET in r for r in seen), "the AWS secret reached the target's URL"

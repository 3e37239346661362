"""The adapter under hostile input and operations: bombs, auth on every route, deadlines, a bounded
queue, clients that leave, bodies that stop arriving, SIGTERM during work, and a fuzz run."""
from __future__ import annotations

import gzip
import json
import signal
import socket
import sys
import threading
import time
import zlib

import httpx
import pytest
import zstandard

from tests.conftest import SLOW_ADAPTER, ServerProcess, printed, routing_row, send_and_hold

J = {"content-type": "application/json"}
LONG_STATE = "The nightly export failed again and the customer wrote a long complaint about it. " * 260  # ~4k tokens
LIMITS = {"SM_SEMIF_REQUEST_TIMEOUT": "2", "SM_SEMIF_BODY_TIMEOUT": "1", "SM_SEMIF_MAX_QUEUE": "2",
          "SM_SEMIF_MAX_ROWS": "8", "SM_SEMIF_MAX_COST": "200", "SM_SEMIF_SHUTDOWN_GRACE": "2"}


def serve(env: dict | None = None) -> ServerProcess:
    return ServerProcess([sys.executable, "-m", "adapter", "serve", "--port", "0"], env={**LIMITS, **(env or {})})


@pytest.fixture(scope="module")
def limited():
    """The limits of LIMITS but a 60 s deadline: the tests here that score a row for real are about bodies,
    ids and caps, not speed (a loaded machine took more than 2 s for a fresh server's first decision);
    the deadline has its own server."""
    srv = serve({"SM_SEMIF_REQUEST_TIMEOUT": "60"})
    yield srv
    srv.stop()


def peak_rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def bomb(encoding: str, size: int = 1 << 30) -> bytes:
    """`size` bytes of spaces after '[', compressed as a stream (never held in memory here)."""
    block = b" " * (1 << 20)
    if encoding == "zstd":
        c = zstandard.ZstdCompressor(level=3).compressobj()
        out = [c.compress(b"[")] + [c.compress(block) for _ in range(size >> 20)] + [c.flush()]
    else:
        c = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
        out = [c.compress(b"[")] + [c.compress(block) for _ in range(size >> 20)] + [c.flush()]
    return b"".join(out)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "zstd"])
def test_compression_bomb_is_refused_without_inflating(limited, encoding, capsys):
    body = bomb(encoding)
    assert len(body) < 6 * 1024 * 1024
    before = peak_rss_mb(limited.proc.pid)
    res = httpx.post(limited.url + "/invocations", content=body, headers={**J, "content-encoding": encoding}, timeout=60)
    after = peak_rss_mb(limited.proc.pid)
    assert res.status_code == 413 and res.json()["detail"]["error_type"] == "payload_too_large"
    assert "SM_SEMIF_MAX_DECODED_BYTES" in res.json()["detail"]["message"]
    with capsys.disabled():
        print(f"\n{encoding} bomb ({len(body) / 1e6:.2f} MB -> 1 GiB): peak RSS {before:.0f} -> {after:.0f} MB")
    assert after - before < 64


def test_truncated_and_corrupt_encodings_are_400_saying_so(limited):
    raw = json.dumps(routing_row("x" * 4000)).encode()
    for enc, data in (("zstd", zstandard.ZstdCompressor().compress(raw)), ("gzip", gzip.compress(raw))):
        res = httpx.post(limited.url + "/invocations", content=data[: len(data) // 2], headers={**J, "content-encoding": enc})
        assert res.status_code == 400 and "truncated" in res.json()["detail"]["message"], res.text
    res = httpx.post(limited.url + "/invocations", content=b"not zstd at all", headers={**J, "content-encoding": "zstd"})
    assert res.status_code == 400 and res.json()["detail"]["error_type"] == "invalid_encoding"


def test_several_gzip_members_or_zstd_frames_are_all_decoded(limited):
    """A JSON-lines body compressed in pieces (several gzip members, several zstd frames) loses no line;
    bytes after a zlib stream are refused, not dropped."""
    lines = [json.dumps(routing_row(s, f"m{i}")).encode() + b"\n" for i, s in enumerate(["Lost parcel", "Refund"])]
    z = zstandard.ZstdCompressor()
    jl = {"content-type": "application/jsonlines"}
    for enc, body in (("gzip", b"".join(gzip.compress(x) for x in lines)), ("zstd", b"".join(z.compress(x) for x in lines))):
        res = httpx.post(limited.url + "/invocations", content=body, headers={**jl, "content-encoding": enc}, timeout=60)
        assert res.status_code == 200, res.text
        assert [json.loads(x)["id"] for x in res.text.splitlines()] == ["m0", "m1"]
    res = httpx.post(limited.url + "/invocations", content=zlib.compress(lines[0]) + b"trailing",
                     headers={**jl, "content-encoding": "deflate"})
    assert res.status_code == 400 and res.json()["detail"]["error_type"] == "invalid_encoding"


KEY = "s3cret-clé-ключ"  # non-ASCII: the header's bytes and the key's bytes are compared as bytes


def test_every_route_but_ping_needs_the_key(monkeypatch):
    srv = serve({"SM_SEMIF_API_KEY": KEY, "SM_SEMIF_REQUEST_TIMEOUT": "60"})  # about keys, not deadlines: a loaded
    # machine took more than the 2 s of LIMITS for this fresh server's first decision
    try:
        routes = [("GET", "/info"), ("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/v1/models"),
                  ("POST", "/invocations"), ("POST", "/invocations/"), ("POST", "/v1/systemone"), ("GET", "/nope")]
        for method, path in routes:
            res = httpx.request(method, srv.url + path, json=routing_row("x"))
            assert res.status_code == 401 and res.json()["detail"]["error_type"] == "authentication_error", path
        assert httpx.get(srv.url + "/ping").status_code == 200  # SageMaker's health check carries no key
        key = {"authorization": f"Bearer {KEY}".encode()}  # a client sends a non-ASCII key as UTF-8
        assert httpx.get(srv.url + "/openapi.json", headers=key).status_code == 200
        assert httpx.post(srv.url + "/invocations", json=routing_row("x"), headers=key, timeout=60).status_code == 200
        for wrong in (f"Bearer {KEY}".encode("utf-8").decode("latin-1").encode("utf-8"), b"Bearer s3cret-cl",
                      f"Bearer {KEY}x".encode()):
            res = httpx.get(srv.url + "/info", headers={"authorization": wrong})
            assert res.status_code == 401 and res.json()["detail"]["message"] == "invalid API key"
        # the workbench's adapter target sends the key named by api_key_env (never stored itself)
        from adapter.schema import DecisionRequest
        from app.targets.base import TargetError
        from app.targets.remote import SemIfTarget

        monkeypatch.setenv("SEMIF_KEY_TEST_ADAPTER", KEY)
        keyed = SemIfTarget("keyed", {"url": srv.url, "api_key_env": "SEMIF_KEY_TEST_ADAPTER"})
        assert "is up" in keyed.test_connection()
        assert keyed.decide(DecisionRequest.model_validate(routing_row("Lost parcel"))).ok
        keyless = SemIfTarget("keyless", {"url": srv.url})
        assert "HTTP 401" in (keyless.decide(DecisionRequest.model_validate(routing_row("x"))).error or "")
        with pytest.raises(TargetError, match="HTTP 401"):
            keyless.test_connection()
    finally:
        srv.stop()


def test_bad_shapes_are_json_4xx_naming_the_field(limited):
    cases = [
        ({**routing_row("x"), "policy_id": []}, ["policy_id"]),
        ({**routing_row("x"), "policy_id": {}}, ["policy_id"]),
        ([routing_row("x"), {**routing_row("y"), "policy_id": ["a"]}], [1, "policy_id"]),
        ({"state": "s", "questions": [{"policy_id": {}}]}, ["questions", 0, "policy_id"]),
        ({**routing_row("x"), "options": 7, "policy_id": None}, ["options"]),
    ]
    for body, loc in cases:
        res = httpx.post(limited.url + "/invocations", json=body)
        assert res.status_code == 422, res.text
        assert res.json()["detail"][0]["loc"][: len(loc)] == loc
    deep = b'{"id": "d", "state": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    for path in ("/invocations", "/v1/systemone"):
        for body in (deep, zstandard.ZstdCompressor().compress(deep)):
            headers = {**J, "content-encoding": "zstd"} if body is not deep else J
            res = httpx.post(limited.url + path, content=body, headers=headers)
            assert res.status_code in (400, 422) and "nested" in json.dumps(res.json()), res.text
    huge = json.dumps(routing_row("x"))[:-1] + ', "permute": ' + "9" * 5000 + "}"
    res = httpx.post(limited.url + "/invocations", content=huge, headers=J)
    assert res.status_code == 400 and "4300 digits" in res.json()["detail"]["message"]
    slash = httpx.post(limited.url + "/invocations/", json=routing_row("Where is my parcel?"))
    assert slash.status_code == 200 and slash.json()["option_ids"][0] == "access"


def test_ids_with_control_or_direction_characters_are_422_naming_the_field(limited):
    """An option id with U+202E (right-to-left override) renders as another id in the UI and logs."""
    for bad in ("acc\u202eeb", "a\x00b", "a\nb", "zero\u200bwidth", "\x1b[31mred"):
        row = {**routing_row("x"), "examples": []}
        row["options"] = [row["options"][0], {**row["options"][1], "id": bad}, *row["options"][2:]]
        res = httpx.post(limited.url + "/invocations", json=row)
        assert res.status_code == 422, res.text
        (err,) = res.json()["detail"]
        assert err["loc"] == ["options", 1, "id"] and "printable" in err["msg"] and "U+" in err["msg"], err
    res = httpx.post(limited.url + "/invocations", json=routing_row("x", "row\u202e1"))
    assert res.status_code == 422 and res.json()["detail"][0]["loc"] == ["id"]
    body = {"model": "jev-latest", "state": "s", "questions": {
        "q": {"type": "choice", "criteria": {"access": None, "bill\u202eing": None}}}}
    res = httpx.post(limited.url + "/v1/systemone", json=body)
    assert res.status_code == 422, res.text
    assert res.json()["detail"][0]["loc"] == ["body", "questions", "q", "criteria", "bill\u202eing"]
    ok = {**routing_row("Lost parcel"), "options": [{"id": "accès"}, {"id": "付款"}, {"id": "a b"}], "examples": []}
    assert httpx.post(limited.url + "/invocations", json=ok).status_code == 200  # printable non-ASCII is fine


def test_caps_on_rows_and_option_readings(limited):
    res = httpx.post(limited.url + "/invocations", json=[routing_row(f"s{i}", str(i)) for i in range(9)])
    assert res.status_code == 422 and "SM_SEMIF_MAX_ROWS" in res.json()["detail"][0]["msg"]
    many = {**routing_row("x"), "options": [{"id": f"o{i}"} for i in range(15)], "examples": [], "permute": True}
    res = httpx.post(limited.url + "/invocations", json=many)  # 15 options x 15 orders = 225 > 200
    assert res.status_code == 422 and "SM_SEMIF_MAX_COST" in res.json()["detail"][0]["msg"]


def test_a_deadline_passing_inside_a_forward_pass_stops_it_with_413():
    """llama.cpp's abort callback stops a forward pass when the deadline passes inside it. The slow adapter's
    `expire` row moves its deadline into the past the first time llama.cpp's callback asks (tests/slow_adapter.py),
    so the deadline passes mid-pass on any machine - no state assumed long enough for this machine's speed."""
    srv = ServerProcess(SLOW_ADAPTER, env={**LIMITS, "SM_SEMIF_REQUEST_TIMEOUT": "60"})
    try:
        res = httpx.post(srv.url + "/invocations", json=routing_row("Lost parcel", "expire-1"), timeout=120)
        printed(srv, "EXPIRED expire-1")  # the callback was asked during a pass, and the deadline passed there
        assert res.status_code == 413 and res.json()["detail"]["error_type"] == "deadline_exceeded", res.text
        message = res.json()["detail"]["message"]
        assert "SM_SEMIF_REQUEST_TIMEOUT=60 s; stopped after" in message  # which limit, how far
        # the pass that asked was stopped, not finished: a finished pass counts its tokens (session._count)
        assert "with none of" in message and "tokens evaluated" in message, message
        # still serving after an aborted forward pass: the next request is answered, /ping too
        still = httpx.post(srv.url + "/invocations", json=routing_row("Lost parcel"), timeout=120)
        assert still.status_code == 200, still.text
        assert httpx.get(srv.url + "/ping").status_code == 200
    finally:
        srv.stop()


def test_deadline_message_says_which_limit_and_by_how_much(monkeypatch):
    """Nothing is refused on a prediction: the 413 comes when the deadline has passed during the
    request's own work, and says how far it got of what the engine planned, and the total that pace
    implies against the limit."""
    from adapter.server.admission import RequestBudget, Stopped

    now = [1000.0]
    monkeypatch.setattr("adapter.server.admission.time.monotonic", lambda: now[0])
    budget = RequestBudget(60, working=True)
    budget.count_tokens(planned=4000)
    budget.count_tokens(done=1000)
    budget.check()  # within the deadline: no estimate stops it, however far the work has to go
    now[0] += 61
    budget.count_tokens(done=1000)
    with pytest.raises(Stopped) as stopped:
        budget.check()
    assert stopped.value.status == 413
    assert ("SM_SEMIF_REQUEST_TIMEOUT=60 s; stopped after 61.0 s with 2,000 of about 4,000 tokens evaluated: about "
            "122 s needed at this machine's pace, 2.0x the limit") in stopped.value.message


def test_full_queue_is_429_with_retry_after_and_a_gone_client_frees_the_engine():
    """Held by a controlled delay (tests/slow_adapter.py: a `hold` row keeps the engine until its request is
    stopped), not by a long state whose duration depends on the machine; the deadline is far (60 s), so only
    the clients leaving can free the engine."""
    srv = ServerProcess(SLOW_ADAPTER,
                        env={**LIMITS, "SM_SEMIF_REQUEST_TIMEOUT": "60"})
    try:
        first = send_and_hold(srv, routing_row("x", "hold0"))
        printed(srv, "HOLDING hold0")  # on the engine
        second = send_and_hold(srv, routing_row("x", "hold1"))
        printed(srv, "ADMITTED 2")  # queued behind it: the queue (SM_SEMIF_MAX_QUEUE=2) is full
        res = httpx.post(srv.url + "/invocations", json=routing_row("quick"), timeout=60)
        assert res.status_code == 429 and int(res.headers["retry-after"]) >= 1, res.text
        assert res.json()["detail"]["error_type"] == "queue_full"
        # clients that give up: their work is dropped, so the next request is not kept waiting for it
        first.close()
        second.close()
        printed(srv, "RELEASED hold0 client_closed")
        res = httpx.post(srv.url + "/invocations", json=routing_row("quick after"), timeout=60)
        assert res.status_code == 200, res.text
        assert not [ln for ln in srv.lines if ln.startswith("RELEASED") and "client_closed" not in ln]
    finally:
        srv.stop()


def test_a_body_that_stops_arriving_gets_408(limited):
    host, port = limited.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 500\r\n\r\n{\"id\": \"slow\"")
        t0 = time.perf_counter()
        reply = b""
        while b"}}" not in reply and time.perf_counter() - t0 < 10:  # headers, then the JSON body
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
        took = time.perf_counter() - t0
        reply = reply.decode()
    assert reply.startswith("HTTP/1.1 408") and "body_timeout" in reply and took < 3


def test_sigterm_during_a_long_request_answers_503_and_exits_in_time(capsys):
    """The long state is scored for real (llama.cpp's abort callback stops its forward pass); SIGTERM is sent
    once the request is admitted (an event tests/slow_adapter.py prints), not after a guessed sleep."""
    srv = ServerProcess(SLOW_ADAPTER,
                        env={**LIMITS, "SM_SEMIF_REQUEST_TIMEOUT": "60"})
    box = {}

    def long():
        box["res"] = httpx.post(srv.url + "/invocations", json=routing_row(LONG_STATE, "long"), timeout=60)

    t = threading.Thread(target=long)
    t.start()
    printed(srv, "ADMITTED 1")
    t0 = time.perf_counter()
    srv.proc.send_signal(signal.SIGTERM)
    code = srv.proc.wait(30)
    exited = time.perf_counter() - t0
    t.join(10)
    with capsys.disabled():
        print(f"\nSIGTERM with a request in flight (grace 2 s): exit {code} after {exited:.2f} s")
    assert code == 0 and exited < 2 + 2
    res = box["res"]
    assert res.status_code == 503 and res.json()["detail"]["error_type"] == "shutting_down"

"""The SemIf adapter as a real process on 127.0.0.1: the SageMaker contract and every bad input."""
from __future__ import annotations

import gzip
import json
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import zstandard

from tests.conftest import ServerProcess, routing_row

J = {"content-type": "application/json"}


def post(srv, body, headers=J, raw: bytes | None = None):
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(srv.url + "/invocations", content=content, headers=headers, timeout=120)


def test_ping_and_one_row(adapter_server):
    r = httpx.get(adapter_server.url + "/ping")
    assert r.status_code == 200 and r.json()["model"].endswith(".gguf")
    res = post(adapter_server, routing_row("My parcel is lost and tracking stopped updating a week ago."))
    assert res.status_code == 200
    body = res.json()
    assert body["option_ids"] == ["access", "billing", "technical", "shipping"]
    assert abs(sum(body["probabilities"]) - 1) < 1e-9
    for key in ("option_logits", "label_mass", "input_tokens", "forward_seconds", "total_seconds",
                "prompt_sha256", "prompt_version", "readout", "model", "probability_status"):
        assert key in body, key
    assert set(body["model"]) >= {"file", "sha256", "quantization", "n_ctx", "n_threads", "n_gpu_layers",
                                  "llama_cpp_version"}
    assert body["model"]["n_ctx"] == 1024  # SM_SEMIF_CTX_SIZE reached the engine


def test_many_rows_in_order(adapter_server):
    rows = [routing_row("I was billed twice", "b"), routing_row("Locked out after a password reset", "a"),
            routing_row("The box arrived crushed", "s")]
    res = post(adapter_server, rows)
    assert res.status_code == 200
    assert [r["id"] for r in res.json()] == ["b", "a", "s"]


def test_shared_state_shape(adapter_server):
    row = routing_row("x")
    payload = {"state": "Customer: the invoice PDF fails to download and I was overcharged.",
               "questions": [{"id": "queue", "question": row["question"], "options": row["options"], "readout": "letters"},
                             {"id": "urgent", "question": "Is this urgent?", "readout": "letters",
                              "options": [{"id": "yes"}, {"id": "no"}]}]}
    res = post(adapter_server, payload)
    assert res.status_code == 200, res.text
    out = res.json()
    assert [r["id"] for r in out] == ["queue", "urgent"]
    # the state segment was evaluated once: the question evaluated second reuses it (which one comes
    # first is the engine's canonical order, not the request's)
    assert max(r["cached_tokens"] for r in out) > 0


def _loc(res):
    assert res.headers["content-type"].startswith("application/json")
    return [e["loc"] for e in res.json()["detail"]]


@pytest.mark.parametrize("mutate,loc", [
    (lambda r: r.update(options=r["options"][:1]), ["options"]),
    (lambda r: r.update(options=[{"id": f"o{i}"} for i in range(27)]), ["options"]),
    (lambda r: r.update(options=[{"id": "a"}, {"id": "a"}]), ["options", 1, "id"]),
    (lambda r: r.update(state="   "), ["state"]),
    (lambda r: r.update(state={}), ["state"]),
    (lambda r: r.pop("question"), ["question"]),
    (lambda r: r.update(readout="tea-leaves"), ["readout"]),
    (lambda r: r.update(examples=[{"state": "s", "option_id": "nope"}]), ["examples", 0, "option_id"]),
    (lambda r: r.update(colour="red"), ["colour"]),
])
def test_bad_fields_are_422_with_loc(adapter_server, mutate, loc):
    row = routing_row("some ticket")
    mutate(row)
    res = post(adapter_server, row)
    assert res.status_code == 422, res.text
    assert loc in _loc(res)
    assert all(e["msg"] for e in res.json()["detail"])


def test_bad_row_in_an_array_names_its_index(adapter_server):
    res = post(adapter_server, [routing_row("ok"), {**routing_row("x"), "state": ""}])
    assert res.status_code == 422 and [1, "state"] in _loc(res)


def test_too_long_for_context(adapter_server):
    res = post(adapter_server, routing_row("lorem ipsum dolor " * 600))
    assert res.status_code == 422
    assert _loc(res) == [["state"]] and "SM_SEMIF_CTX_SIZE" in res.json()["detail"][0]["msg"]


@pytest.mark.parametrize("raw,headers,status,etype", [
    (b"{not json", J, 400, "invalid_json"),
    (b"", J, 400, "invalid_json"),
    (b"id=1", {"content-type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"),
    (b"\x00\x01", {"content-type": "application/json", "content-encoding": "gzip"}, 400, "invalid_encoding"),
    (b"{}", {"content-type": "application/json", "content-encoding": "br"}, 415, "unsupported_encoding"),
])
def test_malformed_requests(adapter_server, raw, headers, status, etype):
    res = post(adapter_server, None, headers=headers, raw=raw)
    assert res.status_code == status, res.text
    assert res.json()["detail"]["error_type"] == etype


def test_empty_array_and_wrong_json_type(adapter_server):
    assert post(adapter_server, []).status_code == 422
    assert post(adapter_server, "just a string").status_code == 422


def test_compressed_bodies(adapter_server):
    body = json.dumps(routing_row("Two-factor codes never arrive, I cannot sign in.")).encode()
    plain = post(adapter_server, None, raw=body).json()
    for enc, data in (("gzip", gzip.compress(body)), ("zstd", zstandard.ZstdCompressor().compress(body))):
        res = post(adapter_server, None, headers={**J, "content-encoding": enc}, raw=data)
        assert res.status_code == 200, res.text
        assert res.json()["probabilities"] == plain["probabilities"]


def test_concurrent_requests_all_succeed_and_match_sequential(adapter_server):
    states = [f"Ticket {i}: " + s for i, s in enumerate(
        ["refund my double charge", "cannot log in", "app crashes on start", "parcel is late"] * 2)]
    sequential = [post(adapter_server, routing_row(s, str(i))).json() for i, s in enumerate(states)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda a: post(adapter_server, routing_row(a[1], str(a[0]))), enumerate(states)))
    assert all(r.status_code == 200 for r in results)
    for seq, conc in zip(sequential, results):
        assert conc.json()["probabilities"] == seq["probabilities"]  # bit for bit, whatever the order


def test_ping_503_when_the_model_cannot_load():
    srv = ServerProcess([sys.executable, "-m", "adapter", "serve", "--host", "127.0.0.1", "--port", "0"],
                        env={"SEMIF_MODEL": "/nonexistent/model.gguf"}, ready_path=None)
    try:
        import time

        deadline = time.time() + 30
        while time.time() < deadline:
            r = httpx.get(srv.url + "/ping")
            if r.json()["detail"]["error_type"] == "model_load_failed":
                break
            assert r.status_code == 503
            time.sleep(0.2)
        assert r.status_code == 503 and "does not exist" in r.json()["detail"]["message"]
        res = post(srv, routing_row("x"))
        assert res.status_code == 503  # never a crash
    finally:
        assert srv.stop() == 0


def test_sigterm_exits_cleanly():
    srv = ServerProcess([sys.executable, "-m", "adapter", "serve", "--host", "127.0.0.1", "--port", "0"],
                        env={"SAGEMAKER_BIND_TO_PORT": "1"})  # --port 0 wins over the env
    assert httpx.get(srv.url + "/ping").status_code == 200
    assert srv.stop(signal.SIGTERM) == 0
    assert any("Shutting down" in line or "Finished server process" in line for line in srv.lines)


def test_accepted_connections_have_nagle_off():
    """uvicorn writes a response's headers and body separately; with Nagle's algorithm on, the body
    waited for the client's delayed ACK (40 ms on every kept-alive request). asyncio turns Nagle off
    only on sockets whose proto says TCP: the adapter's listening socket must pass that on."""
    import asyncio
    import socket

    from adapter.server.process import bind_socket

    async def accepted_nodelay() -> int:
        sock = bind_socket("127.0.0.1", 0)
        got: asyncio.Future = asyncio.get_running_loop().create_future()

        def on_connect(reader, writer):
            got.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname())
            value = await asyncio.wait_for(got, 10)
            writer.close()
        return value

    assert asyncio.run(accepted_nodelay()) != 0


def test_engine_errors_inside_arrays_name_the_row(adapter_server):
    """A row the engine itself refuses (too long for the context) is named by its index."""
    res = post(adapter_server, [routing_row("fine"), routing_row("lorem ipsum dolor " * 600, "r2")])
    assert res.status_code == 422 and res.json()["detail"][0]["loc"] == [1, "state"]
    res = post(adapter_server, {"state": "lorem ipsum dolor " * 600,
                                "questions": [{k: v for k, v in routing_row("x").items() if k != "state"}]})
    assert res.status_code == 422 and res.json()["detail"][0]["loc"] == ["questions", 0, "state"]


def test_batch_transform_jsonlines_one_result_or_error_per_line(adapter_server):
    params = httpx.get(adapter_server.url + "/execution-parameters").json()
    assert params == {"MaxConcurrentTransforms": 1, "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 6}
    good = [routing_row("My parcel is lost", "a"), routing_row("Charged twice", "b")]
    lines = [json.dumps(good[0]), "{not json", json.dumps({**routing_row("x", "c"), "options": []}),
             json.dumps(good[1]), json.dumps(routing_row("lorem ipsum dolor " * 600, "d"))]  # d: too long
    res = httpx.post(adapter_server.url + "/invocations", content="\n".join(lines) + "\n\n",
                     headers={"content-type": "application/jsonlines"}, timeout=120)
    assert res.status_code == 200 and res.headers["content-type"].startswith("application/jsonlines")
    out = [json.loads(l) for l in res.text.splitlines()]
    assert len(out) == 5 and [o.get("id") for o in out] == ["a", None, "c", "b", "d"]
    assert out[1]["error"]["status"] == 400 and out[2]["error"]["detail"][0]["loc"] == ["options"]
    assert out[4]["error"]["status"] == 422 and out[4]["error"]["detail"][0]["loc"] == ["state"]
    single = [post(adapter_server, row).json() for row in good]  # each line scores exactly as it would alone
    assert [out[0]["probabilities"], out[3]["probabilities"]] == [s["probabilities"] for s in single]

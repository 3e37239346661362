"""A seeded fuzz run: 1,000 hostile bodies of every class we know (malformed and non-UTF-8 JSON,
deep nesting, 5,000-digit integers, NaN, unhashable ids, wrong types in every field, huge strings,
too many options/rows, broken and bomb-ish encodings, odd content types, trailing slashes) against
both endpoints of a real adapter. The contract: never a 5xx, always a JSON body."""
from __future__ import annotations

import copy
import functools
import gzip
import json
import random
import sys
import time
import unicodedata
import zlib
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import zstandard

from tests.conftest import ServerProcess, spread

N_CASES = 1000
# short, so the valid bodies (the model runs on them) keep the run quick; the shapes are complete
ROW = {"id": "r1", "state": "Where is my parcel?", "question": "Queue?",
       "options": [{"id": "billing", "description": "money"}, {"id": "shipping"}], "examples": []}
S1 = {"model": "jev-latest", "state": "I was charged twice.",
      "questions": {"q": {"type": "choice", "criteria": {"billing": "money", "access": None}},
                    "s": {"type": "score", "instructions": "Tone?", "criteria": ["calm", "angry"]}}}
WEIRD = [None, True, 0, -1, 1e308, "", " ", "x" * 800, [], {}, [[]], {"a": {}}, [1, "a", None], "\u0000",
         "<|im_end|>", 10 ** 40, -0.0]


@functools.cache
def zlib_bomb() -> bytes:
    """20 MiB of spaces, deflated to 20 KB (made once: compressing it per case took 4 s of the run)."""
    return zlib.compress(b" " * (20 << 20))


def deep(n: int) -> str:
    return "[" * n + "]" * n


def paths(obj, prefix=()):
    """Every (path) to a value inside a JSON document."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from paths(v, (*prefix, i))


def put(obj, path, value):
    if not path:
        return value
    obj = copy.deepcopy(obj)
    cur = obj
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return obj


def case(rng: random.Random) -> tuple[str, bytes, dict]:
    """(path, body bytes, headers) of one hostile request."""
    path = rng.choice(["/invocations", "/v1/systemone", "/invocations/", "/v1/systemone/"])
    base = S1 if "systemone" in path else rng.choice([ROW, [ROW, ROW], {"state": "s", "questions": [
        {k: v for k, v in ROW.items() if k not in ("state",)}]}])
    headers = {"content-type": "application/json"}
    kind = rng.randrange(12)
    if kind == 11 and rng.random() < 0.9:  # keep deliberately valid (model-running) bodies to about 1%
        kind = 0
    if kind == 0:  # a field replaced by a value of the wrong type
        target = rng.choice(list(paths(base)))
        body = json.dumps(put(base, target, rng.choice(WEIRD))).encode()
    elif kind == 1:  # a field deleted
        target = rng.choice([p for p in paths(base) if p]) if base else ()
        doc = copy.deepcopy(base)
        cur = doc
        for p in target[:-1]:
            cur = cur[p]
        del cur[target[-1]]
        body = json.dumps(doc).encode()
    elif kind == 2:  # deep nesting somewhere
        target = rng.choice(list(paths(base)))
        text = json.dumps(put(base, target, "@@"))
        body = text.replace('"@@"', deep(rng.choice([70, 999, 1000, 5000, 50000]))).encode()
    elif kind == 3:  # a 5,000-digit integer, NaN or Infinity
        target = rng.choice(list(paths(base)))
        lit = rng.choice(["9" * 5000, "-" + "1" * 4400, "NaN", "Infinity", "-Infinity", "1e99999"])
        body = json.dumps(put(base, target, "@@")).replace('"@@"', lit).encode()
    elif kind == 4:  # unhashable or odd policy ids and question items
        doc = copy.deepcopy(ROW if not isinstance(base, list) else base[0])
        doc["policy_id"] = rng.choice([[], {}, [1], {"a": 1}, 5, None, "nope"])
        body = json.dumps(rng.choice([doc, [doc], {"state": "s", "questions": [doc, [1], "q", None]}])).encode()
    elif kind == 5:  # malformed JSON and non-UTF-8
        good = json.dumps(base).encode()
        body = rng.choice([good[: rng.randrange(len(good))], b"\xff\xfe" + good, good + b"}", b"{'a': 1}",
                           bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))), b"", b"   ", b"null",
                           b"[]", b"\"s\"", b"123"])
    elif kind == 6:  # encodings: wrong, truncated, garbage, bomb-ish
        good = json.dumps(base).encode()
        enc = rng.choice(["gzip", "zstd", "deflate", "br", "gzip, zstd", "identity"])
        headers["content-encoding"] = enc
        packed = {"gzip": gzip.compress(good), "zstd": zstandard.ZstdCompressor().compress(good),
                  "deflate": zlib.compress(good)}.get(enc, good)
        body = rng.choice([packed, packed[: max(1, len(packed) // 2)], b"garbage", zlib_bomb()])
    elif kind == 7:  # odd content types
        headers["content-type"] = rng.choice(["text/plain", "application/x-www-form-urlencoded", "application/json; "
                                              "charset=latin-1", "multipart/form-data", "application/xml", ""])
        body = json.dumps(base).encode()
    elif kind == 8:  # huge strings
        target = rng.choice(list(paths(base)))
        body = json.dumps(put(base, target, "x" * rng.choice([300_000, 2_000_000]))).encode()
    elif kind == 9:  # too many options, rows or questions
        if "systemone" in path:
            doc = copy.deepcopy(S1)
            doc["questions"]["q"]["criteria"] = {f"c{i}": None for i in range(rng.choice([1, 256, 1000]))}
        else:
            doc = rng.choice([{**ROW, "options": [{"id": f"o{i}"} for i in range(rng.choice([1, 27, 300]))]},
                              [ROW] * rng.choice([0, 257, 2000]), {"state": "s", "questions": []}])
        body = json.dumps(doc).encode()
    elif kind == 10:  # structure swapped: objects for arrays and back
        body = json.dumps(rng.choice([{"0": ROW}, [[ROW]], [S1], {"questions": {"a": ROW}, "state": "s"},
                                      {**S1, "questions": list(S1["questions"].values())},
                                      {**S1, "questions": {"q": {"type": "box"}}}])).encode()
    else:  # valid, so the model really runs between the hostile ones
        body = json.dumps(base).encode()
    return path, body, headers


@pytest.fixture(scope="module")
def server():
    with spread() as env:  # the server works while the client sends
        srv = ServerProcess([sys.executable, "-m", "adapter", "serve", "--port", "0"],
                            env={**env, "SM_SEMIF_REQUEST_TIMEOUT": "30"})
    yield srv
    srv.stop()


def test_fuzz_never_5xx_always_json(server, capsys):
    rng = random.Random(20261201)
    cases = [case(rng) for _ in range(N_CASES)]
    statuses: dict[int, int] = {}
    failures = []
    t0 = time.perf_counter()

    def send(c):
        path, body, headers = c
        res = client.post(server.url + path, content=body, headers=headers)
        try:
            payload = res.json()
        except ValueError:
            payload = None
        return path, body[:120], res.status_code, payload

    # two clients: validation of one overlaps the model's work on the other; the deadline is generous
    # because a queue wait is load, not the body's fault
    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(2) as pool:
        for path, head, status, payload in pool.map(send, cases):
            statuses[status] = statuses.get(status, 0) + 1
            if status >= 500 or payload is None or (status >= 400 and "detail" not in payload):
                failures.append((path, head, status, payload))
    took = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\nfuzz: {N_CASES} requests in {took:.0f} s, statuses {dict(sorted(statuses.items()))}")
    assert not failures, failures[:5]
    assert statuses.get(200, 0) >= 40 and sum(v for k, v in statuses.items() if 400 <= k < 500) >= 700
    assert server.proc.poll() is None and httpx.get(server.url + "/ping").status_code == 200


# -- the text and id rules (issue 33): hostile strings at every string of every route -----------------------
HOSTILE_TEXT = ["\ud800", "ok\udfff", "\udc00\ud800",  # lone surrogates (json.dumps writes them as escapes)
                unicodedata.normalize("NFD", "café"), "\u0430", "p\u0430y", "ＢＩＬＬＩＮＧ", " billing", "billing "]
ROUTES = [("/invocations", ROW), ("/invocations", [ROW, {**ROW, "id": "r2"}]),
          ("/invocations", {"state": {"k": "s"}, "questions": [{k: v for k, v in ROW.items() if k != "state"}]}),
          ("/v1/systemone", S1), ("jsonl", ROW)]


def strings(obj, prefix=()):
    """(path, is_key) of every string in a JSON document, and of every object key."""
    if isinstance(obj, str):
        yield prefix, False
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield (*prefix, k), True
            yield from strings(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from strings(v, (*prefix, i))


def rename(obj, path, new_key):
    obj = copy.deepcopy(obj)
    cur = obj
    for p in path[:-1]:
        cur = cur[p]
    cur[new_key] = cur.pop(path[-1])
    return obj


def test_fuzz_text_rules_on_every_route(server):
    """Lone surrogates, NFD, look-alike and padded strings as every value and every key of every
    route (JSON Lines too): never a 5xx; a lone surrogate is always refused naming its field (a JSON
    Lines line gets its own error object, the other lines are answered)."""
    rng = random.Random(33)
    cases = [(route, base, path, is_key, text) for route, base in ROUTES for path, is_key in strings(base)
             for text in HOSTILE_TEXT]
    rng.shuffle(cases)
    # every lone surrogate case (refused before the model: cheap), and a sample of the others, which may be
    # valid and run the model (an NFD id alone is accepted): the run stays within a few minutes
    chosen = [c for c in cases if any(0xD800 <= ord(ch) <= 0xDFFF for ch in c[4])]
    chosen += [c for c in cases if c not in chosen][:60]
    failures = []
    with httpx.Client(timeout=60) as client:
        for route, base, path, is_key, text in chosen:
            doc = rename(base, path, text) if is_key else put(base, path, text)
            if route == "jsonl":
                body = (json.dumps(doc) + "\n" + json.dumps({**ROW, "id": "other"})).encode()
                res = client.post(server.url + "/invocations", content=body,
                                  headers={"content-type": "application/jsonlines"})
            else:
                res = client.post(server.url + route, content=json.dumps(doc).encode(),
                                  headers={"content-type": "application/json"})
            surrogate = any(0xD800 <= ord(c) <= 0xDFFF for c in text)
            try:
                payload = res.json() if route != "jsonl" else [json.loads(x) for x in res.text.splitlines()]
            except ValueError:
                payload = None
            ok = res.status_code < 500 and payload is not None
            if ok and surrogate and route != "jsonl":
                ok = res.status_code in (400, 422) and "surrogate" in json.dumps(payload["detail"])
            if ok and surrogate and route == "jsonl":
                ok = res.status_code == 200 and "error" in payload[0] and payload[1].get("id") == "other"
            if not ok:
                failures.append((route, path, ascii(text), res.status_code, res.text[:200]))
    assert not failures, failures[:5]


# -- issue 41: invisible characters in every id, and pinned-field overrides on every route --------------------
INVISIBLE = ["\u034f", "\ufe0f", "\U000e0100", "\u3164", "\u115f", "\u2800", "\u00ad", "\u2060"]


def id_paths(route, base):
    """(path, is_key) of every id in a route's document: option ids, row and question ids, choice names."""
    for path, is_key in strings(base):
        last = path[-1] if path else None
        if route == "/v1/systemone":
            if len(path) == 2 and path[0] == "questions" and is_key:  # a question id
                yield path, True
            elif len(path) == 4 and path[2] == "criteria" and is_key and path[1] == "q":  # a choice name
                yield path, True
        elif last == "id" and not is_key:
            yield path, False


def test_fuzz_invisible_characters_in_every_id_on_every_route(server):
    """An id holding a default-ignorable code point, a variation selector, a Hangul filler or a blank symbol
    is refused at its own loc on every route and shape (JSON Lines: that line's error, the others answered)."""
    rng = random.Random(41)
    failures, n = [], 0
    with httpx.Client(timeout=60) as client:
        for route, base in ROUTES:
            for path, is_key in id_paths(route, base):
                for mark in rng.sample(INVISIBLE, 3):
                    original = path[-1] if is_key else functools.reduce(lambda d, k: d[k], path, base)
                    text = original[:2] + mark + original[2:]
                    doc = rename(base, path, text) if is_key else put(base, path, text)
                    n += 1
                    if route == "jsonl":
                        body = (json.dumps(doc) + "\n" + json.dumps({**ROW, "id": "other"})).encode()
                        res = client.post(server.url + "/invocations", content=body,
                                          headers={"content-type": "application/jsonlines"})
                        lines = [json.loads(x) for x in res.text.splitlines()]
                        ok = (res.status_code == 200 and f"U+{ord(mark):04X}" in json.dumps(lines[0].get("error"))
                              and lines[1].get("id") == "other")
                    else:
                        res = client.post(server.url + route, content=json.dumps(doc).encode(),
                                          headers={"content-type": "application/json"})
                        ok = res.status_code == 422 and f"U+{ord(mark):04X}" in json.dumps(res.json()["detail"])
                    if not ok:
                        failures.append((route, path, ascii(text), res.status_code, res.text[:200]))
    assert n >= 24 and not failures, failures[:5]


@pytest.fixture(scope="module")
def policy_server(tmp_path_factory):
    """An adapter with one calibrated state-first policy loaded (the fixture model's own)."""
    from tests.test_decision_log import policy_file

    path = policy_file(tmp_path_factory.mktemp("policy"))
    with spread() as env:
        srv = ServerProcess([sys.executable, "-m", "adapter", "serve", "--port", "0"],
                            env={**env, "SM_SEMIF_POLICY": path, "SM_SEMIF_REQUEST_TIMEOUT": "30"})
    yield srv
    srv.stop()


def test_fuzz_pinned_field_overrides_on_every_route(policy_server):
    """Every pinned field changed, on every /invocations shape that can name a policy: a 422 naming the field
    and the policy (JSON Lines: that line's error), never a decision made on another reading."""
    from adapter.policy import PINNED

    other = {"question": "Another question?", "options": [{"id": "x1"}, {"id": "x2"}], "examples": [],
             "readout": "letters", "debias": "content-free", "permute": True, "few_shot": False,
             "layout": "policy-first", "prompt_version": "letters/1", "guard": "none"}
    assert set(other) == set(PINNED)
    row = {"id": "r1", "state": "Where is my parcel?", "policy_id": "ticket-routing"}
    failures = []
    with httpx.Client(timeout=60) as client:
        for field, value in other.items():
            changed = {**row, field: value, **({"hidden_state": True} if field == "layout" else {})}
            shapes = {"row": changed, "array": [row, changed],
                      "shared": {"state": "Where is my parcel?",
                                 "questions": [{k: v for k, v in changed.items() if k != "state"}]}}
            for shape, doc in shapes.items():
                res = client.post(policy_server.url + "/invocations", json=doc)
                detail = json.dumps(res.json().get("detail")) if res.status_code == 422 else ""
                if not (res.status_code == 422 and field in detail and "ticket-routing" in detail):
                    failures.append((field, shape, res.status_code, res.text[:200]))
            body = (json.dumps(row) + "\n" + json.dumps(changed)).encode()
            res = client.post(policy_server.url + "/invocations", content=body,
                              headers={"content-type": "application/jsonlines"})
            lines = [json.loads(x) for x in res.text.splitlines()]
            if not (res.status_code == 200 and "decision" in lines[0] and field in json.dumps(lines[1].get("error"))):
                failures.append((field, "jsonl", res.status_code, res.text[:200]))
    assert not failures, failures[:5]

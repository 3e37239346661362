"""Shared fixtures: the real shipped model through llama.cpp, and helpers to run our servers."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import ServerProcess, free_port  # noqa: E402,F401  (shared with the benchmarks; tests import them from here)

# Parallel runs (`make test`: pytest-xdist, one worker per CPU): each worker, and every server it
# starts, keeps to one CPU. llama.cpp then runs one thread per worker instead of two workers' threads
# spinning against each other on the same cores (measured here: one process 244 s; two workers with
# one llama.cpp thread each but not pinned, no better; two pinned workers 167 s).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
ALL_CPUS = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
if _WORKER and ALL_CPUS:
    os.sched_setaffinity(0, {sorted(ALL_CPUS)[int(_WORKER.removeprefix("gw")) % len(ALL_CPUS)]})


@contextlib.contextmanager
def spread() -> Iterator[dict]:
    """For processes that do several things at once (a Streamlit server beside a browser, a server
    answering a client): what is started inside may use every CPU, and its llama.cpp one thread.
    Yields the environment to start them with."""
    if not (_WORKER and ALL_CPUS):
        yield dict(os.environ)
        return
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, ALL_CPUS)
    try:
        yield {**os.environ, "SM_SEMIF_THREADS": "1"}
    finally:
        os.sched_setaffinity(0, mine)
# Speed: the suite runs on the 135M fixture wherever the model's quality is not the point (also in
# the servers and pages it starts). Tests of the shipped default unset this (test_default_model.py).
os.environ["SEMIF_DEFAULT_MODEL"] = "smollm2"
# Hermetic: the on-disk policy KV cache of this run only (never a previous run's or the user's), so a
# local run behaves like CI's first one. Servers and pages started by tests inherit it.
if "SM_SEMIF_KV_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["SM_SEMIF_KV_CACHE_DIR"] = tempfile.mkdtemp(prefix="semif-test-kv-")
    atexit.register(shutil.rmtree, os.environ["SM_SEMIF_KV_CACHE_DIR"], ignore_errors=True)


# A test marked `alone` (a timing claim, such as the 60 s deadline) runs while no other test does: every
# test of a parallel run holds a shared lock on one file, and an `alone` test an exclusive one - so the
# other worker finishes its current test and waits. (Each worker is pinned to one CPU above; beside
# another test's llama.cpp, the 255-choice request took 60 s where it takes ~25 s alone.)
_CPU_LOCK = Path(tempfile.gettempdir()) / f"semif-tests-cpu-{os.getppid() if _WORKER else os.getpid()}.lock"


@pytest.fixture(autouse=True)
def _cpu_turn(request):
    if not _WORKER:
        yield
        return
    import fcntl

    with open(_CPU_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX if request.node.get_closest_marker("alone") else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


FIRST = ("tests/test_fuzz.py", "tests/test_browser.py")  # the longest modules start first: no long tail


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: next((i for i, f in enumerate(FIRST) if item.nodeid.startswith(f)), len(FIRST)))


@pytest.fixture(scope="session")
def engine():
    from adapter.engine.engine import Engine

    return Engine("smollm2")


@pytest.fixture(scope="session")
def qwen05():
    """The smallest shipped Qwen: the Qwen chat template and tokenizer, at test speed."""
    from adapter.engine.engine import Engine

    return Engine("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def gemma():
    from adapter.engine.engine import Engine

    return Engine("gemma3-270m")


@pytest.fixture(scope="session")
def adapter_server():
    """The SemIf adapter as a subprocess on the shipped model, with a small context for the
    too-long test."""
    srv = ServerProcess([sys.executable, "-m", "adapter", "serve", "--host", "127.0.0.1", "--port", "0"],
                        env={"SM_SEMIF_CTX_SIZE": "1024"})
    yield srv
    srv.stop()


def scored_rows(set_name: str) -> int:
    """How many rows of a shipped labeled set an evaluation scores (the train split never is)."""
    import json

    lines = (ROOT / "data" / "labeled" / f"{set_name}.jsonl").read_text().splitlines()
    return sum(1 for l in lines if l.strip() and json.loads(l).get("split") != "train")


def subset_file(tmp_path, set_name: str, n_test: int, n_train: int = 8) -> Path:
    """The first n_test test rows (and n_train train rows) of a shipped set, as a file: tests that
    are about evaluation mechanics, not model quality, score a small set."""
    import json

    rows = [json.loads(l) for l in (ROOT / "data" / "labeled" / f"{set_name}.jsonl").read_text().splitlines() if l.strip()]
    test = [r for r in rows if r.get("split") != "train"][:n_test]
    train = [r for r in rows if r.get("split") == "train"][:n_train]
    out = tmp_path / f"{set_name}.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in test + train))
    return out


def calibrate_cli(tmp_path, policy: str, n_test: int, *args: str, out_name: str = "") -> tuple[Path, Path, str]:
    """`python -m app calibrate` on the first n_test rows of the shipped set named like the policy, into its own
    database and policy file: (db, policy file, stdout); fails the test on a non-zero exit."""
    import subprocess

    db, out = tmp_path / "wb.db", tmp_path / (out_name or f"{policy}.policy.json")
    proc = subprocess.run([sys.executable, "-m", "app", "calibrate", "--db", str(db), "--quiet", "--policy", policy,
                           "--labeled-set", str(subset_file(tmp_path, policy, n_test)), *args, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return db, out, proc.stdout


def routing_row(state: str, row_id: str = "r1", **extra) -> dict:
    import json

    policy = json.loads((ROOT / "data" / "policies" / "ticket-routing.json").read_text())
    return {"id": row_id, "state": state, "question": policy["question"], "options": policy["options"],
            "examples": policy["examples"], **extra}


# -- AWS without AWS: moto's server on 127.0.0.1 ------------------------------------------------------
REGION = "us-east-1"


@pytest.fixture(scope="session")
def moto_url():
    from moto.sagemaker import models as sm_models
    from moto.server import ThreadedMotoServer

    original = sm_models.FakeEndpointConfig.validate_production_variants

    def allow_pools(self, variants):  # moto predates InstancePools and knows no g5/g6/g6e types
        plain = [v for v in variants if "InstancePools" not in v and not v.get("InstanceType", "").startswith(("ml.g5", "ml.g6"))]
        return original(self, plain)

    sm_models.FakeEndpointConfig.validate_production_variants = allow_pools
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
    sm_models.FakeEndpointConfig.validate_production_variants = original


@pytest.fixture
def aws_env(monkeypatch, moto_url):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
                 "AWS_SESSION_TOKEN": "testing"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    import boto3

    s3 = boto3.client("s3", region_name=REGION, endpoint_url=moto_url)
    try:
        s3.create_bucket(Bucket="semif-test-models")
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    return moto_url




def import_subset(store, folder, set_name: str, n_rows: int):
    """The shipped policy `set_name` saved and the first n_rows test rows of its set imported: (policy, set id)."""
    from adapter.engine.templates import load_template
    from app.core.labeled import import_file

    policy = load_template(set_name)
    store.save_policy(policy)
    data = subset_file(Path(folder), set_name, n_rows, n_train=0).read_bytes()
    return policy, import_file(store, f"{set_name}-{n_rows}.jsonl", data, policy)


def two_model_runs(store, smollm2, qwen05, n_rows: int = 12, set_name: str = "ticket-routing", tmp_path=None) -> tuple[int, int]:
    """Evaluation runs of the same labeled rows on the two fixture models (SmolLM2 = run A, Qwen2.5-Coder-0.5B
    = run B): real drift between two local models, for the comparison tests."""
    import tempfile

    from app.core import runs
    from app.targets.local import LocalTarget

    policy, set_id = import_subset(store, tmp_path or tempfile.mkdtemp(prefix="semif-drift-"), set_name, n_rows)
    made = []
    for name, eng in (("local", smollm2), ("local-qwen2.5-coder-0.5b", qwen05)):
        target = LocalTarget(name, {"model": "" if name == "local" else "qwen2.5-coder-0.5b"}, lambda model, e=eng: e)
        run_id, _ = runs.find_or_start(store, policy=policy, set_id=set_id, target=target,
                                       variant=runs.VARIANTS["option-words"])
        runs.resume_eval(store, run_id, target)
        made.append(run_id)
    return made[0], made[1]


@pytest.fixture
def db(tmp_path, monkeypatch):
    """A workbench SQLite file on disk that the pages (AppTest) open too: SEMIF_DB points at it."""
    from app.core.store import Store

    path = tmp_path / "wb.db"
    monkeypatch.setenv("SEMIF_DB", str(path))
    return Store(path)


def finish_tasks(at, timeout: float = 600):
    """Wait for the background work a page submitted (app/service/tasks.py: one worker per process),
    then rerun the page so it shows the results - what a person coming back to the page sees."""
    import time

    from app.service.tasks import shared

    deadline = time.time() + timeout
    while shared().active():
        assert time.time() < deadline, f"background work still running after {timeout} s: {shared().active()}"
        time.sleep(0.1)
    return at.run()


# -- the adapter with a test-only slow scorer (tests/slow_adapter.py): events, not durations -------------
SLOW_ADAPTER = [sys.executable, "-m", "tests.slow_adapter", "serve", "--port", "0"]


def printed(srv: ServerProcess, line: str, within: float = 120) -> None:
    """Wait until the server has printed `line` (an event, not a duration: `within` only bounds a hang)."""
    deadline = time.monotonic() + within
    while line + "\n" not in srv.lines:
        assert time.monotonic() < deadline and srv.proc.poll() is None, f"never printed {line!r}: {srv.lines[-20:]}"
        time.sleep(0.02)


def send_and_hold(srv: ServerProcess, row: dict) -> socket.socket:
    """A client that sends one request and keeps the connection open without reading: closing the
    socket is the client giving up."""
    body = json.dumps(row).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    s.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return s

"""The workbench's model pool with real engines: one load per model, loads of different models do
not wait for each other, an engine that is scoring is never evicted, a reload is a new generation."""
from __future__ import annotations

import threading

import pytest

from adapter.engine.engine import Engine, EngineConfig
from app.targets.engines import EnginePool


def _factory(gate: dict[str, threading.Event], loads: list[str]):
    def make(ref, progress):
        loads.append(ref)
        if ref in gate:
            assert gate[ref].wait(60)
        return Engine(ref, EngineConfig(n_ctx=2048, n_threads=1))
    return make


def test_a_slow_load_blocks_only_its_own_model():
    release = threading.Event()
    loads: list[str] = []
    pool = EnginePool(max_loaded=2, factory=_factory({"gemma3-270m": release}, loads))
    got: dict[str, Engine] = {}
    waiters = [threading.Thread(target=lambda i=i: got.setdefault(f"g{i}", pool.get("gemma3-270m"))) for i in range(2)]
    for t in waiters:
        t.start()
    smol = pool.get("smollm2")  # loads while gemma is held back: no pool-wide lock
    assert smol.info.shipped == "smollm2" and not pool.is_loaded("gemma3-270m")
    release.set()
    for t in waiters:
        t.join(60)
    assert got["g0"] is got["g1"] and loads.count("gemma3-270m") == 1  # one load, shared by both waiters
    assert got["g0"].generation != smol.generation


def test_an_engine_that_is_scoring_is_not_evicted_and_a_reload_is_a_new_generation():
    pool = EnginePool(max_loaded=1, factory=_factory({}, []))
    smol = pool.get("smollm2")
    scoring, done = threading.Event(), threading.Event()

    def score_elsewhere() -> None:  # another session holds the engine's lock while it scores
        with smol.lock:
            scoring.set()
            assert done.wait(60)

    worker = threading.Thread(target=score_elsewhere)
    worker.start()
    assert scoring.wait(60)
    gemma = pool.get("gemma3-270m")
    assert len(pool.loaded()) == 2 and pool.get("smollm2") is smol  # over the limit rather than dropped mid-call
    done.set()
    worker.join(60)
    pool.get("qwen2.5-coder-0.5b")  # now both are free: the least recently used go
    assert pool.loaded() == [pool.loaded()[-1]] and not pool.is_loaded("smollm2")
    again = pool.get("smollm2")
    assert again is not smol and again.generation > gemma.generation > smol.generation


def test_a_failed_load_reaches_every_waiter_and_is_retried():
    calls = []

    def broken(ref, progress):
        calls.append(ref)
        raise FileNotFoundError(f"no model file for {ref}")

    pool = EnginePool(max_loaded=1, factory=broken)
    with pytest.raises(FileNotFoundError):
        pool.get("smollm2")
    with pytest.raises(FileNotFoundError):
        pool.get("smollm2")
    assert calls == ["smollm2", "smollm2"]  # not cached as a failure forever

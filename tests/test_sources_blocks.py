"""Head-layout sources scored without thrashing (issue 43, item 1): an evaluation with sources on other local
models than the pool keeps loads each model once, so only each run's first row is cold and every source's
cost (seconds, tokens, $ per 1,000) is measured."""
from __future__ import annotations

from collections import Counter

from adapter.engine.engine import Engine, EngineConfig
from adapter.engine.templates import load_template
from deploy.config import DEFAULT_CPU_INSTANCE

from app.core import head_sources
from app.core.labeled import import_file
from app.core.store import Store
from app.service import evaluate
from app.targets.engines import EnginePool
from app.targets.local import LocalTarget

from tests.conftest import subset_file


def test_sources_beyond_the_pool_load_each_model_once_and_every_cost_is_measured(tmp_path):
    loads: Counter[str] = Counter()

    def factory(ref, progress):
        loads[ref] += 1
        return Engine(ref, EngineConfig.from_env(), progress=progress)

    pool = EnginePool(max_loaded=1, factory=factory)  # fewer models kept than the evaluation uses
    store = Store(tmp_path / "wb.db")
    policy = load_template("refund-check")
    store.save_policy(policy)
    set_id = import_file(store, "refund-8.jsonl", subset_file(tmp_path, "refund-check", 8, n_train=0).read_bytes(),
                         policy)
    main = LocalTarget("local", {"model": ""}, pool)
    source = LocalTarget("local-gemma", {"model": "gemma3-270m"}, pool)
    outcome = evaluate.evaluate_one(store, policy, set_id, main, evaluate.VARIANTS["letters"], head_sources=[source])
    assert not outcome.error and not outcome.stopped and len(outcome.companions) == 1
    # the outcome says what the source scored too (it said only the main run's counts, under "and 1 head-layout
    # source": the 300-state walk read "68 copied, 0 evaluated" while the source evaluated 40 rows)
    assert outcome.text().endswith("; local-gemma in the head layout: 8 rows scored now: 0 copied, 8 evaluated"), \
        outcome.text()
    assert sorted(loads.values()) == [1, 1], loads  # row by row, a pool of one reloaded a model on every row
    for run_id in (outcome.run_id, *outcome.companions):
        results = store.results(run_id)
        assert len(results) == 8 and not any(r["error"] for r in results)
        assert sum(r["cold"] for r in results) == 1, [r["cold"] for r in results]  # the first row only
        seconds, tokens = head_sources.warm_costs(results)
        assert seconds and tokens, (run_id, seconds, tokens)
        assert store.get_run(run_id)["status"] == "done"
    assert [r["row_key"] for r in store.results(outcome.run_id)] == \
        [r["row_key"] for r in store.results(outcome.companions[0])]


def test_a_stop_rule_on_the_main_run_gives_its_sources_the_same_rows(tmp_path):
    store = Store(tmp_path / "wb.db")
    policy = load_template("refund-check")
    store.save_policy(policy)
    set_id = import_file(store, "refund-8.jsonl", subset_file(tmp_path, "refund-check", 8, n_train=0).read_bytes(),
                         policy)
    pool = EnginePool(max_loaded=1)
    main = LocalTarget("local", {"model": ""}, pool)
    source = LocalTarget("local-gemma", {"model": "gemma3-270m"}, pool)
    seen: list[tuple[int, int]] = []
    outcome = evaluate.evaluate_one(store, policy, set_id, main, evaluate.VARIANTS["letters"], head_sources=[source],
                                    rule=evaluate.StopRule(max_rows=3), progress=lambda d, t, e: seen.append((d, t)))
    assert outcome.stopped and "3 rows scored" in outcome.stopped
    companion = outcome.companions[0]
    assert {r["row_key"] for r in store.results(companion)} == {r["row_key"] for r in store.results(outcome.run_id)}
    assert len(store.results(companion)) == 3
    assert {store.get_run(r)["status"] for r in (outcome.run_id, companion)} == {"stopped"}
    assert seen[-1] == (6, 6) and all(t == 6 for _, t in seen)  # the bar counts both sources' rows, to the stop


def _timed_run(store: Store, policy, target: str, seconds: float, *, head_layout: bool) -> None:
    run = store.create_run(kind="eval", policy=policy, target={"name": target, "kind": "local"}, n_rows=6,
                           config={"layout": "policy-first"} if head_layout else {})
    for i in range(6):
        store.add_result(run, {"row_key": f"r{i}", "position": i, "state": "s", "label": None, "cold": int(i == 0),
                               "latency_s": seconds, "error": None})


def test_the_estimate_counts_every_source_at_its_own_pace(tmp_path):
    from app.service import sets

    store = Store(tmp_path / "wb.db")
    policy = load_template("refund-check")
    store.save_policy(policy)
    _timed_run(store, policy, "local", 2.0, head_layout=False)
    _timed_run(store, policy, "local", 0.3, head_layout=True)  # the same model's head-layout rows: not its pace
    alone = sets.estimate(store, ["local"], 1, [])
    assert alone.seconds == 2.0 and "measured" in alone.parts[0]
    both = sets.estimate(store, ["local"], 1, ["local", "local-smollm2"])
    # local's head-layout rows are measured; local-smollm2 has none yet: the stated default, said so
    assert both.seconds == 2.0 + 0.3 + sets.HEAD_SECONDS_PER_ROW
    assert len(both.parts) == 3 and "nothing measured on local-smollm2 in the head layout" in both.parts[2]
    assert both.text(60) == "about 3 min for 3 sources"
    assert sets.pool_note(["a", "b", "c"], 2) and "SEMIF_MAX_LOADED_MODELS=2" in sets.pool_note(["a", "b", "c"], 2)
    assert sets.pool_note(["a", "b"], 2) is None


def test_the_calibrate_page_estimates_with_the_sources_and_warns_beyond_the_pool(db, monkeypatch, request):
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    import streamlit as st

    monkeypatch.setenv("SEMIF_MAX_LOADED_MODELS", "1")
    st.cache_resource.clear()  # the model pool is one per process: an earlier test's pool keeps 2
    request.addfinalizer(st.cache_resource.clear)  # and this pool of 1 is not left to later tests
    policy = load_template("refund-check")
    db.save_policy(policy)
    import_file(db, "refund.jsonl", (ROOT / "data" / "labeled" / "refund-check.jsonl").read_bytes(), policy)
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.run()
    at.switch_page("views/calibrate.py").run()
    at.selectbox(key="cal_policy").select("refund-check").run()
    at.multiselect(key="cal_head_sources").set_value(["local", "local-qwen2.5-coder-0.5b"]).run()
    assert not at.exception, at.exception
    caption = next(c.value for c in at.caption if "rows to score" in c.value).replace("\\", "")
    assert "for 3 sources" in caption and "local-qwen2.5-coder-0.5b in the head layout" in caption, caption
    depth, deepest = 0, 0  # one level of brackets at most: before, "(local: ~1.5 s a row, ... (nothing measured ...))"
    for ch in caption:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        deepest = max(deepest, depth)
    assert deepest == 1 and depth == 0, caption
    assert any("SEMIF_MAX_LOADED_MODELS=1" in i.value.replace("\\", "") for i in at.info), [i.value for i in at.info]


def test_the_sources_table_shows_accuracy_and_cost_first():
    keys = [f"r{i}" for i in range(30)]
    labels = {k: i % 2 for i, k in enumerate(keys)}

    def cand(run, method, kind, seconds):
        pred = {k: (labels[k] if i % 4 else 1 - labels[k]) for i, k in enumerate(keys)}
        return head_sources.Candidate(run, "m.gguf", "state-first" if kind == "zero-shot" else "policy-first", method,
                                      kind, {k: pred[k] == labels[k] for k in keys}, pred, labels, seconds, 20.0)

    table = head_sources.compare([cand(1, "zero-shot", "zero-shot", 2.0), cand(2, "hidden-state head", "head", 0.5)])
    rows = head_sources.table_rows(table)
    usd = f"$ per 1,000 ({DEFAULT_CPU_INSTANCE})"
    assert list(rows[0])[:6] == ["source", "accuracy (out of fold)", "accuracy 95% CI", "s a row (measured)", usd,
                                 "speed-up vs zero-shot"]
    assert all(r["s a row (measured)"] and r[usd] and r["speed-up vs zero-shot"] for r in rows)


def test_the_reuse_line_says_why_rows_were_evaluated_again(tmp_path):
    """Issue 43, item 4: re-running a changed policy said 'reused 0' and not why; now the outcome names what
    changed in the request since the earlier run (here the question), and an unchanged re-run copies all."""
    store = Store(tmp_path / "wb.db")
    policy = load_template("refund-check")
    store.save_policy(policy)
    set_id = import_file(store, "refund-4.jsonl", subset_file(tmp_path, "refund-check", 4, n_train=0).read_bytes(),
                         policy)
    pool = EnginePool(max_loaded=1)
    target = LocalTarget("local", {"model": ""}, pool)
    first = evaluate.evaluate_one(store, policy, set_id, target, evaluate.VARIANTS["letters"])
    assert first.counts["evaluated"] == 4 and "no earlier answer to these rows" in first.text()
    changed = {**policy, "question": policy["question"] + " Answer for the customer's latest order."}
    second = evaluate.evaluate_one(store, changed, set_id, target, evaluate.VARIANTS["letters"])
    assert second.counts["evaluated"] == 4 and second.counts["reused"] == 0
    assert f"since run #{first.run_id} the request changed in the question (4 rows)" in second.text(), second.text()
    again = evaluate.evaluate_one(store, changed, set_id, target, evaluate.VARIANTS["letters"], new_run=True)
    assert again.counts["reused"] == 4 and again.counts["evaluated"] == 0 and "request changed" not in again.text()

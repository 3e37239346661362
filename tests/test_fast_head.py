"""The fast head (issue 36): the head layout - the policy first and cached, the state last - read only by a
learned head. The layout's rendering and its rules, what a row costs in it, the folds that bound a head,
the sources compared by accuracy and cost, and a head-layout policy exported by `python -m app calibrate`
and enforced by the adapter as a real process, bit for bit."""
from __future__ import annotations

import subprocess
import sys

import httpx
import numpy as np
import pytest

from adapter.policy import CalibratedPolicy, load_policy
from adapter.engine.prompt import PROMPT_VERSIONS, render_letters, render_policy_first
from adapter.schema import DecisionRequest, Option, RequestError
from adapter.engine.templates import load_template, request_for
from app.core import head_sources, heads, reuse
from app.core.store import Store
from app.service import evaluate
from app.core.stored import StoredResponse
from tests.conftest import ROOT, ServerProcess, calibrate_cli, subset_file

OPTIONS = [Option(id="billing", description="payments"), Option(id="tech", description="bugs")]
STATE = "I was charged twice for my subscription this month."


def test_the_head_layout_puts_the_policy_first_and_the_state_last():
    prompt = render_policy_first(STATE, "Which team?", OPTIONS, None)
    first, last = prompt.segments
    assert "Which team?" in first and "A. billing: payments" in first and "B. tech: bugs" in first
    assert STATE not in first and last.startswith(STATE)  # the policy segment is the same for every state
    assert prompt.version == PROMPT_VERSIONS["letters-policy-first"] != render_letters(STATE, "Which team?", OPTIONS,
                                                                                        None).version
    other = render_policy_first("The app crashes on start.", "Which team?", OPTIONS, None)
    assert other.segments[0] == first and other.sha256() != prompt.sha256()


@pytest.mark.parametrize("extra,loc", [({}, "hidden_state"), ({"hidden_state": True, "readout": "option-words"}, "readout"),
                                       ({"hidden_state": True, "debias": "content-free"}, "debias"),
                                       ({"hidden_state": True, "permute": True}, "permute"),
                                       ({"hidden_state": True, "few_shot": True}, "few_shot")])
def test_the_head_layout_refuses_what_only_zero_shot_reads(extra, loc):
    """It is read only by a learned head: no hidden state, another readout, a correction, a permutation
    or shown examples are refused naming the field (no zero-shot probabilities from it are offered)."""
    body = {"id": "r", "state": STATE, "question": "Which team?", "options": [o.model_dump() for o in OPTIONS],
            "layout": "policy-first", **extra}
    with pytest.raises(Exception) as err:
        DecisionRequest.model_validate(body)
    assert loc in str(err.value) and "learned head" in str(err.value)


def test_a_row_without_a_layout_keeps_its_reuse_key():
    """Adding the layout field changed no existing request: a state-first row (layout absent or named)
    has the key it had before, so stored results are still reused; the head layout has its own."""
    req = request_for(load_template("refund-check"), STATE, "r1", hidden_state=True)
    model = {"file": "m.gguf", "sha256": "a" * 64, "llama_cpp_version": "0.3.36", "n_gpu_layers": 0,
             "flash_attn": False, "default_readout": "letters", "default_debias": "content-free"}
    named = req.model_copy(update={"layout": "state-first"})
    assert reuse.reuse_key(model, req) == reuse.reuse_key(model, named)
    assert "layout" not in req.model_dump(exclude_none=True)
    assert reuse.reuse_key(model, req.in_head_layout()) != reuse.reuse_key(model, req)


def test_a_head_layout_row_reads_only_its_state_and_a_short_tail(engine):
    """The policy prefix is evaluated once; each further row evaluates its state plus a few tokens - far
    fewer than the state-first prompt, which reads the question and every option after the state. The
    bits are those of a fresh evaluation, and the hidden state is returned."""
    policy = load_template("ticket-routing")
    states = ["My invoice shows two charges for the same month.", "The app crashes when I open settings."]
    engine.score(request_for(policy, "warm-up", "w", hidden_state=True).in_head_layout())
    fast = [engine.score(request_for(policy, s, f"f{i}", hidden_state=True).in_head_layout()) for i, s in enumerate(states)]
    engine.score(request_for(policy, "warm-up", "w", readout="letters", debias="none"))
    slow = [engine.score(request_for(policy, s, f"s{i}", readout="letters", debias="none")) for i, s in enumerate(states)]
    for f, s, state in zip(fast, slow, states):
        n_state = len(engine.llm.tokenize(state.encode(), add_bos=False, special=False))
        assert f.prompt_version == "letters-policy-first/1" and f.hidden_state is not None
        assert f.evaluated_tokens <= n_state + 16  # the state and the tail
        assert s.evaluated_tokens >= f.evaluated_tokens + 30  # the state-first row reads the policy every time
        fresh = engine.score(request_for(policy, state, "again", hidden_state=True).in_head_layout(), fresh=True)
        assert fresh.probabilities == f.probabilities and fresh.hidden_state == f.hidden_state


def synthetic(n_per: int, k: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(k), n_per)
    H = rng.normal(size=(len(y), 8))
    H[np.arange(len(y)), y] += 5  # a direction per option carries the label
    return H, np.full((len(y), k), 1 / k), y


@pytest.mark.parametrize("n_per,folds", [(12, 5), (5, 5), (4, 4), (3, 3)])
def test_the_folds_not_a_constant_bound_a_head(n_per, folds):
    """A head needs as many rows of every option as it has folds: 3 rows an option give a head over 3
    folds (the fixed floor of 8 refused it), measured out of fold like any other."""
    H, P, y = synthetic(n_per)
    hidden = next(f for f in heads.candidates(H, P, y, option_ids=["a", "b", "c"], model_sha256="0" * 64,
                                              prompt_version="letters/1") if f.kind == "hidden")
    assert hidden.available and hidden.folds == folds and hidden.oof_accuracy > 0.6  # chance: 1/3


def test_too_few_rows_for_any_fold_say_what_to_label():
    H, P, y = synthetic(2)
    fits = heads.candidates(H, P, y, option_ids=["a", "b", "c"], model_sha256="0" * 64, prompt_version="letters/1")
    assert not any(f.available for f in fits)
    assert "the fewest here: 2" in fits[0].note and "1 more row of a" in fits[0].note


def _candidate(model, layout, method, kind, right, seconds):
    keys = [str(i) for i in range(len(right))]
    labels = {k: 0 for k in keys}
    pred = {k: 0 if r else 1 for k, r in zip(keys, right)}
    return head_sources.Candidate(1, model, layout, method, kind, {k: bool(r) for k, r in zip(keys, right)}, pred,
                                  labels, seconds, 10.0)


def test_the_recommendation_is_the_cheapest_not_worse_beyond_noise():
    """The most accurate candidate is beaten on cost by one within noise of it; one that is worse beyond
    noise is never recommended, however cheap; a refused one has no numbers and is not 0%."""
    n = 120
    rng = np.random.default_rng(1)
    best = rng.random(n) < 0.85
    close = best.copy()
    close[np.flatnonzero(best)[:3]] = False  # 3 rows worse: within noise
    bad = rng.random(n) < 0.45
    cands = [_candidate("big", "state-first", "zero-shot", "zero-shot", bad, 2.0),
             _candidate("big", "state-first", "hidden-state head", "head", best, 2.0),
             _candidate("small", "policy-first", "hidden-state head", "head", close, 0.4),
             _candidate("tiny", "policy-first", "hidden-state head", "head", bad, 0.1),
             head_sources.Candidate(2, "odd", "policy-first", "learned head", "head", {}, {}, {}, None, None,
                                    refused="needs 3 rows")]
    table = head_sources.compare(cands)
    assert table.best is not None and table.best.candidate.model == "big" and table.best.candidate.kind == "head"
    assert table.recommended is not None and table.recommended.candidate.model == "small"
    assert table.recommended.speedup == pytest.approx(5.0)
    tiny = next(r for r in table.rows if r.candidate.model == "tiny")
    assert tiny.gain_vs_best is not None and tiny.gain_vs_best.beyond_noise
    refused = next(r for r in table.rows if r.candidate.model == "odd")
    assert refused.accuracy is None and table.n == n
    assert "small" in table.sentence and "not worse than the most accurate" in table.sentence
    assert "label more rows" not in table.sentence  # 2.5 points apart: no warning
    top = np.arange(n) < 100  # right on 100 of 120 rows
    lower = top.copy()
    lower[:12], lower[100:104] = False, True  # 12 rows lost, 4 won: 6.7 points lower, McNemar p ~0.08
    wide = head_sources.compare([_candidate("big", "state-first", "hidden-state head", "head", top, 2.0),
                                 _candidate("small", "policy-first", "hidden-state head", "head", lower, 0.4)])
    small = next(r for r in wide.rows if r.candidate.model == "small")
    assert small.gain_vs_best is not None and not small.gain_vs_best.beyond_noise  # within noise ...
    assert wide.recommended is not None and wide.recommended.candidate.model == "big"  # ... but too far below
    assert "not recommended: small" in wide.sentence and "label more rows" in wide.sentence
    below_today = head_sources.compare([_candidate("big", "state-first", "zero-shot", "zero-shot", top, 2.0),
                                        _candidate("small", "policy-first", "hidden-state head", "head",
                                                   np.r_[top[:3] & False, top[3:]], 0.4)])
    assert below_today.recommended is not None and below_today.recommended.candidate.model == "big"  # never below today
    rows = head_sources.table_rows(table)
    assert next(r for r in rows if r["model"] == "odd")["accuracy (out of fold)"] is None


def test_a_head_layout_policy_needs_a_hidden_state_head():
    base = {"policy_id": "p", "question": "q", "options": [{"id": "a"}, {"id": "b"}], "readout": "letters",
            "prompt_version": PROMPT_VERSIONS["letters-policy-first"], "layout": "policy-first",
            "model": {"file": "m.gguf", "sha256": "0" * 64}, "temperature": 1.0, "fallback_option": "a",
            "created_at": "now"}
    with pytest.raises(ValueError, match="layout: the policy-first layout is read only by a learned head"):
        CalibratedPolicy.model_validate(base)


@pytest.fixture(scope="module")
def layout_policy(tmp_path_factory):
    """A head-layout policy from the CLI on SmolLM2: 30 refund-check rows read policy first."""
    return calibrate_cli(tmp_path_factory.mktemp("fast"), "refund-check", 30, "--layout", "policy-first",
                         "--gate", "0.6",
                         out_name="refund.policy.json")


def test_calibrate_exports_a_head_layout_policy(layout_policy):
    db, out, printed = layout_policy
    policy = load_policy(out)
    assert policy.layout == "policy-first" and policy.prompt_version == "letters-policy-first/1"
    assert policy.head is not None and policy.head.kind in ("hidden", "stacked") and policy.head.rows == 30
    assert (policy.readout, policy.debias, policy.permute) == ("letters", "none", False)
    assert "reads this run's head layout" in printed
    (run,) = Store(db).list_runs(kind="eval")
    assert run["config"]["layout"] == "policy-first"
    results = Store(db).results(run["id"])
    assert all(r["response"]["prompt_version"] == "letters-policy-first/1" for r in results)


def test_the_adapter_decides_every_head_layout_row_as_calibrate_did(layout_policy):
    """The adapter loads the policy, renders its rows in the head layout (the client sends only the
    state and the policy id), and decides each as CalibratedPolicy.apply did on the stored row."""
    db, out, _ = layout_policy
    policy = load_policy(out)
    store = Store(db)
    (run,) = store.list_runs(kind="eval")
    results = [r for r in store.results(run["id"]) if not r["error"]]
    srv = ServerProcess([sys.executable, "-m", "adapter", "serve", "--host", "127.0.0.1", "--port", "0"],
                        env={"SM_SEMIF_POLICY": str(out)})
    try:
        rows = [{"id": r["row_key"], "state": r["state"], "policy_id": "refund-check"} for r in results]
        served = []
        for at in range(0, len(rows), 10):
            answer = httpx.post(srv.url + "/invocations", json=rows[at: at + 10], timeout=600)
            assert answer.status_code == 200, answer.text
            served += answer.json()
        assert results and [s["id"] for s in served] == [r["row_key"] for r in results]  # every row, in order
        wrong = [f"{r['row_key']}: {d}" for r, s in zip(results, served) for d in differences(policy, r, s)]
        assert not wrong, wrong
        # the check itself: a served row that decided otherwise, or read other probabilities, is caught
        s0 = served[0]
        other = next(o.id for o in policy.options if o.id != s0["decision"]["option_id"])
        assert differences(policy, results[0], {**s0, "decision": {**s0["decision"], "option_id": other}})
        assert differences(policy, results[0], {**s0, "probabilities": list(reversed(s0["probabilities"]))})
    finally:
        srv.stop()


def differences(policy, stored: dict, served: dict) -> list[str]:
    """How the adapter's answer for a row differs from CalibratedPolicy.apply on the stored row."""
    page = policy.apply(StoredResponse.parse(stored["response"]).reading(stored["option_ids"], stored["probabilities"]))
    checks = {"prompt_version": (served["prompt_version"], "letters-policy-first/1"),
              "probabilities": (served["probabilities"], stored["probabilities"]),
              "calibrated_probabilities": (served["calibrated_probabilities"], list(page.calibrated_probabilities)),
              "decision": (served["decision"], page.as_json())}
    return [f"{name}: served {got!r}, page {want!r}" for name, (got, want) in checks.items() if got != want]


def test_compare_reads_a_head_layout_head_from_rows_read_in_its_layout(layout_policy, engine, tmp_path):
    """Compare with a head-layout head: each target that returns hidden states also reads the states in
    the head layout (its own run, no zero-shot column of its own), and the head's column is
    CalibratedPolicy.apply on those rows, with their latency - what the fast decision costs."""
    from app.core import robustness as rb
    from app.service import decide
    from app.service import heads as head_service
    from app.targets.local import LocalTarget

    _, out, _ = layout_policy
    store = Store(tmp_path / "cmp.db")
    pick = head_service.pick(store, str(out))
    policy = load_policy(out)
    states = ["Bought the blender 4 days ago, it will not turn on.", "Final-sale dress, changed my mind, refund it."]
    cases = [rb.Case(f"c{i}", s, label) for i, (s, label) in enumerate(zip(states, ["yes", "no"]))]
    gid = decide.compare(store, load_template("refund-check"), cases, [LocalTarget("local", {}, lambda m: engine)],
                         heads=[pick])
    shown = decide.comparison(store, gid)
    plain, layout = shown.runs
    assert layout["target_name"] == "local (head layout)" and layout["config"]["head_layout"]
    column = "local (head layout) · head (calibrated refund.policy.json)"
    assert list(shown.heads["column"]) == [column]
    assert set(shown.results["target"]) == {"local", column}  # no zero-shot column for the head layout
    got = shown.results[shown.results["target"] == column].set_index("row_key")
    for r in store.results(layout["id"]):
        assert r["response"]["prompt_version"] == "letters-policy-first/1"
        d = policy.apply(StoredResponse.parse(r["response"]).reading(r["option_ids"], r["probabilities"]))
        assert (got.loc[r["row_key"], "decision"], got.loc[r["row_key"], "gated"]) == (d.option_id, d.gated)
        assert got.loc[r["row_key"], "latency_s"] == r["latency_s"]


def test_an_evaluation_reads_head_sources_row_by_row_and_calibrate_compares_them(tmp_path, monkeypatch):
    """`--head-sources` scores a companion run in the head layout beside the evaluation, row by row (a stop
    leaves both with the same rows); the command prints the sources table and its recommendation, and the
    Calibrate page shows it (table, chart, download) for the opened run."""
    from streamlit.testing.v1 import AppTest

    db = tmp_path / "wb.db"
    proc = subprocess.run([sys.executable, "-m", "app", "calibrate", "--db", str(db), "--quiet", "--policy",
                           "refund-check", "--labeled-set", str(subset_file(tmp_path, "refund-check", 20)),
                           "--head-sources", "local", "--out", str(tmp_path / "p.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    store = Store(db)
    main, companion = sorted(store.list_runs(kind="eval"), key=lambda r: r["id"])
    assert companion["config"]["layout"] == "policy-first" and companion["config"]["companion_of"] == main["id"]
    assert [r["row_key"] for r in store.results(main["id"])] == [r["row_key"] for r in store.results(companion["id"])]
    assert {r["response"]["prompt_version"] for r in store.results(companion["id"])} == {"letters-policy-first/1"}
    assert "sources (out of fold, on the rows every source answered):" in proc.stdout
    assert "[recommended]" in proc.stdout and "Recommended:" in proc.stdout
    assert f"run #{companion['id']}" in proc.stdout and "head layout (policy first)" in proc.stdout

    monkeypatch.setenv("SEMIF_DB", str(db))
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=300)
    at.run()
    at.switch_page("views/calibrate.py").run()
    at.selectbox(key="cal_policy").select("refund-check").run()
    assert not at.exception, at.exception
    texts = " ".join(m.value for m in at.markdown)
    assert "Cheapest decision that is not worse" in texts
    assert any(s.value.startswith("Recommended") for s in at.success), [s.value for s in at.success]
    shown = next(d.value for d in at.dataframe if "vs the most accurate" in d.value.columns)
    assert set(shown["run"]) == {main["id"], companion["id"]} and shown["recommended"].sum() == 1
    # Export this (issue 44): the recommended candidate preselected, its file in one step, naming its model and layout
    table = evaluate.sources(store, main["id"])
    live = [r for r in table.rows if r.accuracy is not None]
    assert live[at.selectbox(key="cal_src_pick").value] is table.recommended
    at.button(key="cal_src_export").click().run()
    assert not at.exception, at.exception
    rec = table.recommended.candidate
    assert any("the file names" in i.value and ("policy\\-first" in i.value or "policy-first" in i.value)
               == (rec.layout == "policy-first") for i in at.info), [i.value for i in at.info]

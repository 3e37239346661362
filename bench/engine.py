"""Engine benchmark (not a test): ratios measured in one run on the shipped model.

(a) direct readout vs generating the same answer as a short JSON with the same model
(b) 10 questions on one state: shared-state path vs fresh evaluation of each, against its bound
    (prefix + suffix) / suffix tokens
(c) engine time vs a bare llama_cpp eval of the same tokens (overhead %)
(d) adapter HTTP overhead: p50/p95 of /invocations vs direct in-process calls
(e) the same 10 questions: suffixes as parallel sequences in one batch vs one after another
(f) a policy's first segment loaded from the on-disk KV cache vs evaluated (a restarted process)

Run: make bench   (or .venv/bin/python -m bench.engine --model smollm2)
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx
import llama_cpp
import numpy as np

from adapter.engine.catalog import DEFAULT_SHIPPED
from bench.common import start_adapter
from adapter.engine.engine import Engine
from adapter.engine.templates import list_templates, load_template, probe_cases, request_for
from adapter.schema import SharedStateRequest
from bench.report import publish



def pct(xs, q):
    return float(np.percentile(xs, q))


def bench_generate(engine: Engine, cases) -> tuple[float, float, int]:
    """The same letters prompt, answered by greedy generation of {"answer": "<letter>"} instead of
    being read from the logits of one forward pass."""
    direct, gen, agree = [], [], 0
    for c in cases:
        req = request_for(load_template(c["policy"]), c["state"], c["id"], readout="letters", debias="none")
        t0 = time.perf_counter()
        r = engine.score(req, fresh=True)
        direct.append(time.perf_counter() - t0)
        text = engine.render(req, "letters").text.replace(
            "Answer with one letter.", 'Reply with JSON only, like {"answer": "A"}.')
        engine.clear_cache()
        t0 = time.perf_counter()
        out = engine.llm.create_completion(text, max_tokens=16, temperature=0.0, stop=["}"])
        gen.append(time.perf_counter() - t0)
        engine.clear_cache()
        letter = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[r.option_ids.index(r.top_option)]
        agree += f'"{letter}"' in out["choices"][0]["text"]
    return statistics.median(direct), statistics.median(gen), agree


def shared_request(n_questions: int = 10) -> SharedStateRequest:
    state = " ".join(c["state"] for c in probe_cases()[:12])  # a long-ish state (~400 tokens)
    templates = list_templates()
    questions = []
    for i in range(n_questions):
        p = templates[i % len(templates)]
        questions.append({"id": f"q{i}", "question": f"{p['question']} (view {i})", "options": p["options"],
                          "readout": "letters", "debias": "none"})
    return SharedStateRequest(state=state, questions=questions)


def bench_shared(engine: Engine) -> tuple[float, float, float, float]:
    """(shared s, fresh s, max probability difference, bound): fresh evaluates every prompt whole;
    the bound is what skipping the shared tokens could save at best."""
    shared = shared_request()
    engine.n_parallel, parallel = 1, engine.n_parallel  # (e) measures parallel; here both run serially
    try:
        engine.clear_cache()
        t0 = time.perf_counter()
        res_shared = engine.score_shared(shared)
        t_shared = time.perf_counter() - t0
        t0 = time.perf_counter()
        res_fresh = [engine.score(row, fresh=True) for row in shared.rows()]
        t_fresh = time.perf_counter() - t0
    finally:
        engine.n_parallel = parallel
    diff = max(float(np.max(np.abs(np.subtract(a.probabilities, b.probabilities))))
               for a, b in zip(res_shared, res_fresh))
    bound = sum(r.input_tokens for r in res_fresh) / sum(r.evaluated_tokens for r in res_shared)
    return t_shared, t_fresh, diff, bound


def bench_parallel(engine: Engine, rounds: int = 2) -> tuple[float, float, float]:
    """(serial s, parallel s, max probability difference): best of `rounds`, state evaluated each time."""
    shared = shared_request()
    times = {1: [], 8: []}
    results = {}
    for _ in range(rounds):
        for n in (1, 8):  # alternate, so machine noise hits both alike
            engine.n_parallel = n
            engine.clear_cache()
            t0 = time.perf_counter()
            results[n] = engine.score_shared(shared)
            times[n].append(time.perf_counter() - t0)
    diff = max(float(np.max(np.abs(np.subtract(a.probabilities, b.probabilities))))
               for a, b in zip(results[1], results[8]))
    return min(times[1]), min(times[8]), diff


def bench_prefix_restore(engine: Engine, cases) -> tuple[float, float, int]:
    """First decision of a policy with solved examples (option-words, the policy segment first):
    its segment evaluated vs loaded from the on-disk KV cache, as after a restart."""
    policy = load_template("agent-next-action")
    req = request_for(policy, cases[0]["state"], "restart", readout="option-words", debias="none")
    folder = engine.prefixes.folder
    tokens = engine.tokenize_prompt(engine.render(req, "option-words"))[0]
    engine.score(req, fresh=True)  # writes the file if it is not there yet
    evaluated, loaded = [], []
    for _ in range(3):
        engine.prefixes.folder = None
        engine.clear_cache()
        t0 = time.perf_counter()
        a = engine.score(req)
        evaluated.append(time.perf_counter() - t0)
        engine.prefixes.folder = folder
        engine.clear_cache()
        t0 = time.perf_counter()
        b = engine.score(req)
        loaded.append(time.perf_counter() - t0)
        assert a.probabilities == b.probabilities  # the KV bytes are the same: so are the answers
    return min(evaluated), min(loaded), len(tokens)


def bench_overhead(engine: Engine, cases) -> tuple[float, float, float]:
    """Engine fresh score vs bare llama_cpp: reset, eval the same tokens, read the logits."""
    eng, bare, split_diff = [], [], 0.0
    for c in cases:
        req = request_for(load_template(c["policy"]), c["state"], c["id"], debias="none")
        prompt = engine.render(req, req.readout or engine.info.default_readout)
        tokens = [t for s in engine.tokenize_prompt(prompt) for t in s]
        first = [s[0] for s in engine.label_tokens(prompt)]
        r = engine.score(req, fresh=True)
        eng.append(r.total_seconds)
        engine.clear_cache()
        t0 = time.perf_counter()
        engine.llm.eval(tokens)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(engine.llm.ctx, -1),
                                       shape=(engine.llm.n_vocab(),)).copy()
        bare.append(time.perf_counter() - t0)
        engine.clear_cache()
        x = logits[first].astype(np.float64)
        p = np.exp(x - x.max())
        p /= p.sum()
        split_diff = max(split_diff, float(np.max(np.abs(p - np.array(r.probabilities)[prompt.order]))))
    return statistics.median(eng), statistics.median(bare), split_diff


def bench_http(engine: Engine, cases, model: str, rounds: int = 2) -> tuple[list[float], list[float]]:
    proc, url = start_adapter(model)
    try:
        direct, http = [], []
        with httpx.Client(timeout=60) as client:
            for _ in range(rounds):
                for c in cases:  # alternate, so machine noise hits both sides alike
                    row = request_for(load_template(c["policy"]), c["state"], c["id"])
                    t0 = time.perf_counter()
                    engine.score(row)
                    direct.append(time.perf_counter() - t0)
                    body = json.dumps(row.model_dump(exclude_none=True))
                    t0 = time.perf_counter()
                    res = client.post(url + "/invocations", content=body, headers={"content-type": "application/json"})
                    http.append(time.perf_counter() - t0)
                    res.raise_for_status()
        return direct, http
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_SHIPPED)
    ap.add_argument("--cases", type=int, default=8, help="probe cases for (a), (c), (d)")
    ap.add_argument("--no-publish", action="store_true", help="print only; leave docs/benchmarks.md as it is")
    args = ap.parse_args()
    engine = Engine(args.model)
    cases = probe_cases()[: args.cases]
    head = (f"model {engine.info.file} ({engine.info.quantization}), {engine.info.n_threads} threads, "
            f"llama-cpp-python {engine.info.llama_cpp_version}, {len(cases)} probe cases")
    print(head, flush=True)
    rows: list[tuple[str, str]] = []

    def row(what: str, measured: str) -> None:
        rows.append((what, measured))
        print(f"{what}: {measured}", flush=True)

    d, g, agree = bench_generate(engine, cases)
    row("(a) direct letters readout vs greedy generation of `{\"answer\": \"A\"}` from the same prompt",
        f"p50 {d * 1000:,.0f} ms vs {g * 1000:,.0f} ms (generation {g / d:.2f}x); the generated JSON named the "
        f"readout's top letter in {agree}/{len(cases)}")
    s, f, diff, bound = bench_shared(engine)
    row("(b) 10 questions on one ~400-token state, shared state vs each evaluated fresh",
        f"{s:.1f} s vs {f:.1f} s: **{f / s:.2f}x**, against a bound of {bound:.2f}x ((prefix + suffix) / suffix "
        f"tokens); max probability difference {diff:.3g}")
    e, b, split = bench_overhead(engine, cases)
    row("(c) engine fresh score vs a bare `llama_cpp` eval of the same tokens in one batch",
        f"p50 {e * 1000:,.0f} vs {b * 1000:,.0f} ms: {100 * (e - b) / b:+.0f}% for evaluating in segments (their "
        f"probabilities differ by up to {split:.3f}: llama.cpp batch-split float effects)")
    dd, hh = bench_http(engine, cases, args.model)
    row("(d) adapter over HTTP vs in-process",
        f"p50 {pct(hh, 50) * 1000:,.0f} vs {pct(dd, 50) * 1000:,.0f} ms ({(pct(hh, 50) - pct(dd, 50)) * 1000:+.0f} ms, "
        f"{pct(hh, 50) / pct(dd, 50):.2f}x); p95 {pct(hh, 95) * 1000:,.0f} vs {pct(dd, 95) * 1000:,.0f} ms")
    ser, par, pdiff = bench_parallel(engine)
    row("(e) the same 10 questions, suffixes one after another vs as parallel sequences in one batch",
        f"{ser:.1f} s vs {par:.1f} s: **{ser / par:.2f}x** (max probability difference {pdiff:.3g})")
    ev, ld, n = bench_prefix_restore(engine, cases)
    row(f"(f) first decision after a restart: a policy segment of {n} tokens evaluated vs loaded from the on-disk "
        "KV cache", f"{ev:.2f} s vs {ld:.2f} s: **{ev / ld:.2f}x**, the same probabilities bit for bit")
    if not args.no_publish:
        table = "| | measured |\n|---|---|\n" + "\n".join(f"| {w} | {m} |" for w, m in rows)
        publish("engine", f"{head}; every figure is a ratio within this run:\n\n{table}\n")


if __name__ == "__main__":
    main()

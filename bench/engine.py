"""Engine benchmark (not a test): ratios measured in one run on the shipped model.

(a) direct readout vs generating the same answer as a short JSON with the same model
(b) 20 questions on one state: shared-state path vs fresh evaluation of each
(c) engine time vs a bare llama_cpp eval of the same tokens (overhead %)
(d) adapter HTTP overhead: p50/p95 of /invocations vs direct in-process calls

Run: make bench   (or .venv/bin/python -m bench.engine --model gemma3-270m)
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import llama_cpp
import numpy as np

from adapter.engine import Engine
from adapter.policies import list_templates, load_template, probe_cases, request_for
from adapter.schema import SharedStateRequest

ROOT = Path(__file__).resolve().parent.parent


def pct(xs, q):
    return float(np.percentile(xs, q))


def bench_generate(engine: Engine, cases) -> tuple[float, float, int]:
    """The same letters prompt, answered by greedy generation of {"answer": "<letter>"} instead of
    being read from the logits of one forward pass."""
    direct, gen, agree = [], [], 0
    for c in cases:
        req = request_for(load_template(c["policy"]), c["state"], c["id"], readout="letters")
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
        letter = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[r["option_ids"].index(r["top_option"])]
        agree += f'"{letter}"' in out["choices"][0]["text"]
    return statistics.median(direct), statistics.median(gen), agree


def bench_shared(engine: Engine, n_questions: int = 20) -> tuple[float, float, float]:
    state = " ".join(c["state"] for c in probe_cases()[:12])  # a long-ish state (~400 tokens)
    templates = list_templates()
    questions = []
    for i in range(n_questions):
        p = templates[i % len(templates)]
        questions.append({"id": f"q{i}", "question": f"{p['question']} (view {i})", "options": p["options"],
                          "readout": "letters"})
    shared = SharedStateRequest(state=state, questions=questions)
    engine.clear_cache()
    t0 = time.perf_counter()
    res_shared = engine.score_shared(shared)
    t_shared = time.perf_counter() - t0
    t0 = time.perf_counter()
    res_fresh = [engine.score(row, fresh=True) for row in shared.rows()]
    t_fresh = time.perf_counter() - t0
    diff = max(float(np.max(np.abs(np.subtract(a["probabilities"], b["probabilities"]))))
               for a, b in zip(res_shared, res_fresh))
    return t_shared, t_fresh, diff


def bench_overhead(engine: Engine, cases) -> tuple[float, float, float]:
    """Engine fresh score vs bare llama_cpp: reset, eval the same tokens, read the logits."""
    eng, bare, split_diff = [], [], 0.0
    for c in cases:
        req = request_for(load_template(c["policy"]), c["state"], c["id"])
        prompt = engine.render(req, req.readout or engine.info.default_readout)
        tokens = [t for s in engine.tokenize_prompt(prompt) for t in s]
        first = [s[0] for s in engine.label_tokens(prompt)]
        r = engine.score(req, fresh=True)
        eng.append(r["total_seconds"])
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
        split_diff = max(split_diff, float(np.max(np.abs(p - np.array(r["probabilities"])[prompt.order]))))
    return statistics.median(eng), statistics.median(bare), split_diff


def bench_http(engine: Engine, cases, model: str, rounds: int = 2) -> tuple[list[float], list[float]]:
    proc = subprocess.Popen([sys.executable, "-m", "adapter", "serve", "--host", "127.0.0.1", "--port", "0",
                             "--model", model, "--log-level", "warning"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline().strip().split("=")[1])
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(url + "/ping").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
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
    ap.add_argument("--model", default="smollm2")
    args = ap.parse_args()
    engine = Engine(args.model)
    cases = probe_cases()
    print(f"model {engine.info.file} ({engine.info.quantization}), {engine.info.n_threads} threads, "
          f"llama-cpp-python {engine.info.llama_cpp_version}, {len(cases)} probe cases")
    d, g, agree = bench_generate(engine, cases)
    print(f"(a) direct letters readout p50 {d * 1000:.0f} ms vs generated JSON answer p50 {g * 1000:.0f} ms: "
          f"generation takes {g / d:.2f}x the time (the generated JSON named the readout's top letter in {agree}/{len(cases)})")
    s, f, diff = bench_shared(engine)
    print(f"(b) 20 questions on one state: shared-state {s:.2f} s vs fresh {f:.2f} s: {f / s:.1f}x faster "
          f"(max probability difference {diff:.3g})")
    e, b, split = bench_overhead(engine, cases)
    print(f"(c) engine fresh score p50 {e * 1000:.0f} ms vs bare llama_cpp eval of the same tokens p50 "
          f"{b * 1000:.0f} ms: overhead {100 * (e - b) / b:+.0f}% (segmented vs one-batch eval changes "
          f"probabilities by up to {split:.3f}: llama.cpp batch-split float effects)")
    dd, hh = bench_http(engine, cases, args.model)
    print(f"(d) adapter HTTP p50 {pct(hh, 50) * 1000:.0f} ms / p95 {pct(hh, 95) * 1000:.0f} ms vs direct "
          f"p50 {pct(dd, 50) * 1000:.0f} ms / p95 {pct(dd, 95) * 1000:.0f} ms: overhead p50 "
          f"{(pct(hh, 50) - pct(dd, 50)) * 1000:+.0f} ms ({pct(hh, 50) / pct(dd, 50):.2f}x)")


if __name__ == "__main__":
    main()

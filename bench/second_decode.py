"""What the second one-token decode costs (issue 45 item 3): a head-layout decision (policy first,
cached; the state's ~34 tokens last) reads its logits in one decode, then `_hidden_at` decodes the
last token again, alone, to read the hidden state. This times that second decode inside the same
warm calls (a wrapper around `LlamaSession._hidden_at`), against the whole call, over many rows
with varying states - both parts of the same calls, so the ratio holds on a loaded machine.

    python -m bench.second_decode --models smollm2,qwen2.5-coder-1.5b --reps 40
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from adapter.engine.engine import Engine, EngineConfig
from adapter.engine.templates import load_template
from adapter.schema import DecisionRequest

STATES = ["Bought the blender 4 days ago, it will not turn on. Receipt attached.",
          "Final-sale dress, worn twice, I changed my mind - refund it.",
          "The parcel never arrived; tracking shows it stuck for three weeks.",
          "Bought 13 months ago, the warranty says 12; the screen cracked when I dropped it."]


def run(model: str, reps: int) -> dict[str, object]:
    eng = Engine(model, EngineConfig.from_env())
    t = load_template("refund-check")
    sess = eng
    hidden: list[float] = []
    orig = type(sess)._hidden_at

    def timed(self, *a, **k):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return orig(self, *a, **k)
        finally:
            hidden.append(time.perf_counter() - t0)

    type(sess)._hidden_at = timed  # type: ignore[method-assign]
    totals, shares, tokens = [], [], []
    try:
        for i in range(reps + 2):
            state = f"{STATES[i % len(STATES)]} Order {1000 + i}."
            req = DecisionRequest.model_validate({"id": f"r{i}", "state": state, "question": t["question"],
                                                  "options": t["options"], "layout": "policy-first",
                                                  "hidden_state": True})
            hidden.clear()
            t0 = time.perf_counter()
            res = eng.score(req)
            total = time.perf_counter() - t0
            if i < 2:
                continue  # cold: the policy prefix is evaluated, the KV cache filled
            totals.append(total)
            shares.append(sum(hidden) / total)
            tokens.append(res.evaluated_tokens)
    finally:
        type(sess)._hidden_at = orig  # type: ignore[method-assign]
    return {"model": model, "reps": reps, "call_median_s": round(statistics.median(totals), 4),
            "second_decode_median_s": round(statistics.median([s * t for s, t in zip(shares, totals)]), 4),
            "share_median": round(statistics.median(shares), 4), "share_mean": round(statistics.mean(shares), 4),
            "tokens": tokens[:3]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2,qwen2.5-coder-1.5b")
    p.add_argument("--reps", type=int, default=40)
    a = p.parse_args()
    for m in a.models.split(","):
        print(json.dumps({**run(m, a.reps), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}), flush=True)


if __name__ == "__main__":
    main()

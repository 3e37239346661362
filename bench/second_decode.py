"""What the second one-token decode cost, and what reading the hidden state from the decision's own
decode saves (issue 45 item 3). A head-layout decision (policy first, cached; the state's ~34 tokens
last) reads its logits in one decode; the earlier path (`Engine.hidden_tap = False`) then decoded the
last token again, alone, to read the hidden state (`_hidden_at`); now the same decode shows it
(session._HiddenTap). Both paths run interleaved in one process, row by row (each call a new state,
so no call is answered from the kept logits): the second decode's share of the earlier path's calls,
and the two paths' warm call times - ratios that hold on a loaded machine.

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
    hidden: list[float] = []
    orig = Engine._hidden_at

    def timed(self, *a, **k):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return orig(self, *a, **k)
        finally:
            hidden.append(time.perf_counter() - t0)

    Engine._hidden_at = timed  # type: ignore[method-assign]
    calls: dict[bool, list[float]] = {False: [], True: []}
    shares, tokens, seconds = [], [], []
    try:
        for i in range(reps + 2):
            for tap in (False, True) if i % 2 else (True, False):  # alternate which path goes first
                state = f"{STATES[i % len(STATES)]} Order {1000 + i}{'b' if tap else 'a'}."
                req = DecisionRequest.model_validate({"id": f"r{i}", "state": state, "question": t["question"],
                                                      "options": t["options"], "layout": "policy-first",
                                                      "hidden_state": True})
                eng.hidden_tap = tap
                hidden.clear()
                t0 = time.perf_counter()
                res = eng.score(req)
                total = time.perf_counter() - t0
                if i < 2:
                    continue  # cold: the policy prefix is evaluated, the KV cache filled
                calls[tap].append(total)
                if tap:
                    assert not hidden, "the tap path decoded again"
                else:
                    shares.append(sum(hidden) / total)
                    seconds.append(sum(hidden))
                    tokens.append(res.evaluated_tokens)
    finally:
        Engine._hidden_at = orig  # type: ignore[method-assign]
        eng.hidden_tap = True
    before, after = statistics.median(calls[False]), statistics.median(calls[True])
    return {"model": model, "reps": reps, "second_decode_call_median_s": round(before, 4),
            "one_decode_call_median_s": round(after, 4), "saved_share": round(1 - after / before, 4),
            "second_decode_median_s": round(statistics.median(seconds), 4),
            "second_decode_share_median": round(statistics.median(shares), 4), "tokens": tokens[:3]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2,qwen2.5-coder-1.5b")
    p.add_argument("--reps", type=int, default=40)
    a = p.parse_args()
    for m in a.models.split(","):
        print(json.dumps({**run(m, a.reps), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}), flush=True)


if __name__ == "__main__":
    main()

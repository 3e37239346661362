"""Many-option choice benchmark (not a test): a /v1/systemone choice question with 26 to 255 options
on the default model, the answer labels' shared prefixes read the earlier way (one llama_decode per
prefix) and as one label-trie batch (adapter/engine/label_trie.py), in one run, back to back.

The request is jevcompat's `choice-options` case (the conformance suite a new user runs): "Billing"
plus "Queue 001".."Queue 254", each with a description, on one ticket; two more rows at 255 options
show other id styles (`queue_000` with no description; everyday names). 26 options are read with
letters (the default readout, with its content-free prior), the rest with option-words.

- fresh: POST /v1/systemone through the adapter's own app (in-process, deadline lifted so the old
  path's full time shows), the KV cache emptied first - what a client waits for the first time
- warm: the same engine call again with the prompt's logits kept: only the label reading is timed
- max |dp| / argmax: trie batch vs the one-decode-per-prefix path, on these requests

Run: .venv/bin/python -m bench.options   (11 minutes on 2 idle cores, 35 on busy ones: the old path is timed too)
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("SM_SEMIF_KV_CACHE_DIR", "off")  # fresh means fresh: no policy KV from disk

from fastapi.testclient import TestClient  # noqa: E402

from adapter.engine.engine import Engine  # noqa: E402
from adapter.engine.label_trie import inner_paths  # noqa: E402
from adapter.server.app import EngineHolder, create_app  # noqa: E402
from adapter.server.settings import AdapterSettings  # noqa: E402
from adapter.server.systemone import SystemOneRequest, to_rows  # noqa: E402
from bench.report import publish  # noqa: E402

TICKET = ("Hi, I was charged twice for my March invoice (order #4471) and the refund I was promised "
          "last week still hasn't arrived. I've emailed three times. Please fix this today or I will "
          "dispute the charge with my bank.")
WORDS = ["billing", "access", "sales", "refunds", "shipping", "returns", "security", "legal", "hr", "it", "ops",
         "design", "marketing", "support", "finance", "payroll", "travel", "facilities", "research", "data"]
REGIONS = ["east", "west", "north", "south", "central", "emea", "apac", "latam", "us", "uk", "de", "fr", "jp"]
LIMIT = 60.0  # SM_SEMIF_REQUEST_TIMEOUT's default: SageMaker's own


def criteria(kind: str, n: int) -> dict:
    if kind == "jevcompat":
        return {"Billing": "Payments, invoices, refunds",
                **{f"Queue {i:03d}": f"Tickets routed to queue {i}" for i in range(1, n)}}
    if kind == "queue_000":
        return {f"queue_{i:03d}": None for i in range(n)}
    return {f"{WORDS[i % len(WORDS)]}-{REGIONS[i // len(WORDS)]}": None for i in range(n)}


def _s(seconds: float) -> str:
    return f"**{seconds:.1f}**" if seconds > LIMIT else f"{seconds:.1f}"


def body(kind: str, n: int) -> dict:
    return {"model": "bench", "state": TICKET,
            "questions": {"queue": {"type": "choice", "instructions": "Which queue should this ticket go to?",
                                    "criteria": criteria(kind, n)}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-publish", action="store_true", help="print the table, leave docs/benchmarks.md as it is")
    args = parser.parse_args()
    before = os.getloadavg()[0]
    engine = Engine()
    holder = EngineHolder(lambda: engine)
    holder.start()
    holder.ready.wait()
    settings = AdapterSettings.from_env({"SM_SEMIF_REQUEST_TIMEOUT": "3600", "SM_SEMIF_MODEL_NAME": "bench"})
    client = TestClient(create_app(holder, settings))
    cases = [("jevcompat", n) for n in (26, 64, 128, 255)] + [("queue_000", 255), ("names", 255)]
    lines = []
    for kind, n in cases:
        payload = body(kind, n)
        rows = to_rows(SystemOneRequest.model_validate(payload))
        readout = rows[0].readout or engine.info.default_readout
        segs, seqs = engine._prepare(engine.render(rows[0], readout))
        fresh, warm, labels, answers, decodes = {}, {}, {}, {}, {}
        for batched in (False, True):
            engine.label_batch = batched
            engine.clear_cache()
            engine._priors.clear()
            spent: list[tuple[float, int]] = []
            finish = engine._finish

            def timed(*a, **k):  # the answer labels' reading: trie batch or per-prefix decodes, and the walk
                t0 = time.perf_counter()
                out = finish(*a, **k)
                spent.append((time.perf_counter() - t0, out["extra_evals"]))
                return out

            engine._finish = timed  # type: ignore[method-assign]
            try:
                t = time.perf_counter()
                res = client.post("/v1/systemone", json=payload)
                fresh[batched] = time.perf_counter() - t
                assert res.status_code == 200, res.text
                labels[batched], decodes[batched] = spent[-1]
                t = time.perf_counter()
                again = client.post("/v1/systemone", json=payload)
                warm[batched] = time.perf_counter() - t
            finally:
                del engine._finish
            answers[batched] = res.json()["answers"]["queue"]["probabilities"]
            assert again.json()["answers"]["queue"]["probabilities"] == answers[batched]  # same bits, warm or fresh
            print(kind, n, "trie" if batched else "per-prefix", f"fresh {fresh[batched]:.1f} s",
                  f"labels {labels[batched]:.2f} s", f"warm {warm[batched]:.2f} s", flush=True)
        old, new = answers[False], answers[True]
        dp = max(abs(old[k] - new[k]) for k in old)
        same = max(old, key=old.__getitem__) == max(new, key=new.__getitem__)
        n_prompt = sum(map(len, segs))
        # the prompt's pace in the trie run (the rest of a fresh request; letters also evaluate 3 priors)
        pace = f"{n_prompt / (fresh[True] - labels[True]):.0f}" if readout == "option-words" else "—"
        lines.append(f"| {kind} | {n} | {readout} | {n_prompt:,} | {pace} | {len(inner_paths(seqs))} | "
                     f"{decodes[False]} → {decodes[True]} | {_s(fresh[False])} | {_s(fresh[True])} | "
                     f"{labels[False]:.2f} | {labels[True]:.2f} | {_s(warm[False])} | {_s(warm[True])} | "
                     f"{dp:.1e} | {'yes' if same else 'NO'} |")
    table = ("| ids | options | readout | prompt tokens | prompt tok/s | shared label prefixes | label decodes (old → trie) "
             "| fresh s, old | fresh s, trie | labels s, old | labels s, trie | warm s, old | warm s, trie "
             "| max \\|Δp\\| | same argmax |\n|" + "---|" * 15 + "\n" + "\n".join(lines) + "\n\n"
             "Fresh: POST /v1/systemone on an emptied KV cache; warm: the same request again. Labels: the "
             "seconds spent reading the answer labels in the fresh request (one decode per shared prefix, "
             "or the trie batch). Bold: over the "
             f"{LIMIT:g} s SM_SEMIF_REQUEST_TIMEOUT default (a 413 in a deployment; lifted here to time it). The rest "
             "of a fresh request is the prompt, which lists every option (~15 tokens each with jevcompat's ids and "
             "descriptions) and is the same on both paths: at the pace shown it decides whether a request fits the "
             "deadline. 26 options are read with letters and the content-free prior (the list evaluated 4 times). The old path also evaluated the option list again on "
             "a repeated request (its label prefixes replaced the kept prompt); the trie leaves it kept.")
    load = f"load average {before:.1f} before, {os.getloadavg()[0]:.1f} after (other work on the machine)"
    if not args.no_publish:
        publish("options", table, note=f"default model {engine.info.file}, {engine.info.n_threads} threads; {load}")
    print(table)


if __name__ == "__main__":
    main()

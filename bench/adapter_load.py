"""Memory of the adapter under a mixed load (not a test): N clients for M minutes sending single
rows, arrays, shared-state requests, /v1/systemone, policies with ever new option ids and states,
and malformed bodies; RSS sampled from /proc every few seconds. Bounded caches show as a flat line.

Run: .venv/bin/python -m bench.adapter_load [--minutes 10] [--clients 4] [--model smollm2]
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
import threading
import time
from collections import Counter

import httpx

from adapter.env_settings import finite
from bench.common import start_adapter
from bench.report import publish



def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def body(rng: random.Random, n: int) -> tuple[str, bytes]:
    """A request of a random kind; every n-th one uses new words, so caches keyed by text grow."""
    words = [f"w{n}x{i}" for i in range(4)]
    row = {"id": f"r{n}", "state": f"Customer {n} writes: my order {n} is late, {' '.join(words)}.",
           "question": "Which queue?", "options": [{"id": f"billing-{words[0]}"}, {"id": f"shipping-{words[1]}"},
                                                  {"id": "access"}]}
    kind = rng.randrange(6)
    if kind == 0:
        return "/invocations", json.dumps(row).encode()
    if kind == 1:
        return "/invocations", json.dumps([row, {**row, "id": "b", "permute": True}]).encode()
    if kind == 2:
        q = {k: v for k, v in row.items() if k != "state"}
        return "/invocations", json.dumps({"state": row["state"], "questions": [q, {**q, "id": "q2"}]}).encode()
    if kind == 3:
        return "/v1/systemone", json.dumps({"model": "jev-latest", "state": row["state"], "questions": {
            "late": {"type": "noul", "instructions": "Is the order late?"},
            "queue": {"type": "choice", "criteria": {o["id"]: None for o in row["options"]}}}}).encode()
    if kind == 4:
        return "/invocations", b'{"id": "bad", "state": ' + b"[" * 3000
    return "/invocations", json.dumps({**row, "options": [{"id": "x"}]}).encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=finite, default=10)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--no-publish", action="store_true", help="print only; leave docs/benchmarks.md as it is")
    args = ap.parse_args()
    proc, url = start_adapter(args.model, {"SM_SEMIF_MAX_QUEUE": str(args.clients * 2)})
    counter = itertools.count()
    statuses: Counter = Counter()
    stop = time.time() + args.minutes * 60

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=120) as c:
            while time.time() < stop:
                path, data = body(rng, next(counter))
                try:
                    statuses[c.post(url + path, content=data, headers={"content-type": "application/json"}).status_code] += 1
                except httpx.HTTPError as exc:
                    statuses[type(exc).__name__] += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    samples = [(0.0, rss_mb(proc.pid))]
    t0 = time.time()
    for t in threads:
        t.start()
    while time.time() < stop:
        time.sleep(5)
        samples.append((time.time() - t0, rss_mb(proc.pid)))
    for t in threads:
        t.join()
    proc.terminate()
    proc.wait(30)
    n = sum(v for k, v in statuses.items())
    first_min = [r for s, r in samples if s <= 60]
    lines = [f"{n} requests in {args.minutes:g} min from {args.clients} clients ({args.model}); statuses {dict(statuses)}",
             f"RSS: start {samples[0][1]:.0f} MB, after 1 min {max(first_min):.0f} MB, peak "
             f"{max(r for _, r in samples):.0f} MB, end {samples[-1][1]:.0f} MB",
             "RSS every minute (MB): " + ", ".join(f"{r:.0f}" for s, r in samples if int(s) % 60 < 5)]
    print("\n".join(lines))
    if not args.no_publish:
        publish("adapter_load", f"{args.clients} clients for {args.minutes:g} min against the adapter ({args.model}): "
                "single rows, arrays with permutation, shared-state requests, /v1/systemone and malformed bodies, "
                "every request with new option ids and a new state.\n\n" + "\n".join(f"- {x}" for x in lines) + "\n")


if __name__ == "__main__":
    main()

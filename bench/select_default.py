"""Which shipped model and readout to use by default: accuracy on data/cases/probe.jsonl.

Not a test: it prints a table. Run: .venv/bin/python -m bench.select_default
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

from adapter.engine.engine import Engine
from adapter.engine.models import SHIPPED
from adapter.schema import READOUTS
from adapter.engine.templates import load_template, probe_cases, request_for


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", nargs="*", default=list(SHIPPED))
    args = ap.parse_args()
    cases = probe_cases()
    policies = {c["policy"]: load_template(c["policy"]) for c in cases}
    print(f"{len(cases)} probe cases; accuracy (correct/total), mean label mass, top-choice spread, s/case")
    for name in args.models:
        engine = Engine(name)
        for readout in READOUTS:
            for permute in (False, True):
                ok, mass, tops, t0 = 0, 0.0, Counter(), time.perf_counter()
                per_policy: Counter = Counter()
                for c in cases:
                    r = engine.score(request_for(policies[c["policy"]], c["state"], c["id"],
                                                 readout=readout, permute=permute))
                    hit = r.top_option == c["label"]
                    ok += hit
                    per_policy[c["policy"]] += hit
                    mass += r.label_mass
                    tops[r.option_ids.index(r.top_option)] += 1
                dt = (time.perf_counter() - t0) / len(cases)
                print(f"{name:12s} {readout:12s} permute={permute!s:5s} {ok:2d}/{len(cases)} "
                      f"mass={mass / len(cases):.2f} positions={dict(sorted(tops.items()))} {dt:.2f}s "
                      f"per-policy={dict(per_policy)}", flush=True)


if __name__ == "__main__":
    main()

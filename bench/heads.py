"""Do labeled rows lift a weak policy? The learned heads against today's corrections, out of fold.

Not a test. On each shipped labeled set (its test split) the default model scores every row with its
hidden state (`hidden_state: true`); then, over the same stratified folds the Calibrate page uses:
zero-shot accuracy (as scored), the best of today's corrections (temperature / per-option offsets, on
the scored or the uncorrected probabilities, chosen as Calibrate chooses), LinC, the hidden-state
head and the stacked head, each with its Wilson 95% interval, and the head Calibrate would export
(only one that beats the best correction beyond noise). The extra cost of the hidden state per row is
timed as a ratio in one run: the same rows scored with and without it, interleaved.

Scored rows are cached in var/bench-heads.jsonl (a killed run resumes). The table is published to
docs/benchmarks.md (bench/report.py).

Run: .venv/bin/python -m bench.heads [--model qwen2.5-coder-1.5b] [--limit N] [--timing-rows 16]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from adapter.engine import Engine, EngineConfig
from adapter.schema import HiddenState
from adapter.templates import load_template, request_for
from app.core import calibration, heads
from app.core.stats import proportion
from bench.models import test_rows
from bench.report import publish

ROOT = Path(__file__).resolve().parent.parent


def score_sets(engine: Engine | None, model: str, sets: dict[str, list[dict]], cache: Path) -> dict[tuple, dict]:
    done: dict[tuple, dict] = {}
    if cache.exists():
        for line in cache.read_text().splitlines():
            r = json.loads(line)
            done[tuple(r["key"])] = r
    for set_name, rows in sets.items():
        policy = load_template(set_name)
        for n, row in enumerate(rows, 1):
            key = (model, set_name, row["id"])
            if key in done:
                continue
            engine = engine or Engine(model, EngineConfig.from_env())
            r = engine.score(request_for(policy, row["state"], row["id"], hidden_state=True))
            rec = {"key": list(key), "label": row["label"], "options": r.option_ids, "probs": r.probabilities,
                   "uncorrected": r.uncorrected_probabilities, "readout": r.readout, "debias": r.debias,
                   "prompt_version": r.prompt_version, "sha256": r.model["sha256"],
                   "hidden": r.hidden_state.model_dump() if r.hidden_state else None}
            done[key] = rec
            with cache.open("a") as fh:
                fh.write(json.dumps(rec) + "\n")
            if n % 16 == 0:
                print(f"{set_name}: {n}/{len(rows)}", flush=True)
    return done


def time_hidden(engine: Engine, rows: list[dict], policy: dict) -> tuple[float, float]:
    """(median seconds per row without, with the hidden state), warm: every row is scored both ways in
    two rounds, with and without alternating from row to row, so that no call follows the same prompt
    (which the engine would answer from its kept logits)."""
    engine.score(request_for(policy, rows[0]["state"], "warm"))  # the policy's first passes
    took: dict[bool, list[float]] = {False: [], True: []}
    for round_ in (0, 1):
        for i, row in enumerate(rows):
            want = (i + round_) % 2 == 1
            t0 = time.perf_counter()
            engine.score(request_for(policy, row["state"], f"t{i}", hidden_state=want))
            took[want].append(time.perf_counter() - t0)
    return float(np.median(took[False])), float(np.median(took[True]))


def evaluate_set(recs: list[dict], seed: int = 0) -> dict:
    ids = recs[0]["options"]
    y = np.array([ids.index(r["label"]) for r in recs])
    P = np.array([r["probs"] for r in recs])
    fams = {recs[0]["debias"] or "none": P}
    if all(r["uncorrected"] for r in recs):
        fams["none"] = np.array([r["uncorrected"] for r in recs])
    cands = calibration.corrections(fams, y, seed=seed)
    best, _ = calibration.choose_correction(cands, len(y))
    H = np.array([HiddenState.model_validate(r["hidden"]).array() for r in recs])
    fits = heads.candidates(H, P, y, option_ids=ids, model_sha256=recs[0]["sha256"],
                            prompt_version=recs[0]["prompt_version"], seed=seed)
    choice = heads.choose(fits, best.oof, best.name, y, seed=seed)
    right = {"zero-shot": calibration.predictions(P) == y, "correction": calibration.predictions(best.oof) == y}
    for f in fits:
        right[f.kind] = calibration.predictions(f.oof) == y if f.available else np.zeros(len(y), bool)
    chosen = choice.head.kind if choice.head else "correction"
    right["chosen"] = right[chosen]
    return {"n": len(y), "right": right, "correction": best.name, "chosen": choice.head.name if choice.head else best.name,
            "gain": choice.gain, "why": choice.why,
            "C": {f.kind: f.fold_regularisation for f in fits}}


def cell(right: np.ndarray) -> str:
    p = proportion(int(right.sum()), len(right))
    return f"{p.rate:.1%} ({p.low:.0%}–{p.high:.0%})"


def table(results: dict[str, dict], timing: tuple[float, float] | None, model: str) -> str:
    cols = ["zero-shot", "correction", "linc", "hidden", "stacked", "chosen"]
    head = ("| set | rows | zero-shot (as scored) | best correction | LinC | hidden-state head | stacked head "
            "| exported | head's gain over the correction |")
    lines = [head, "|" + "---|" * 9]
    pooled: dict[str, list] = {c: [] for c in cols}
    for name, r in results.items():
        for c in cols:
            pooled[c].append(r["right"][c])
        gain = r["gain"].text() if r["gain"] is not None else "n/a"
        lines.append(f"| {name} | {r['n']} | " + " | ".join(cell(r["right"][c]) for c in cols[:5])
                     + f" | {r['chosen']} | {gain} |")
    lines.append(f"| **all** | {sum(r['n'] for r in results.values())} | "
                 + " | ".join(f"**{cell(np.concatenate(pooled[c]))}**" for c in cols[:5]) + " | | |")
    out = "\n".join(lines)
    wins = [n for n, r in results.items() if r["gain"] is not None and r["gain"].beyond_noise and r["chosen"] != r["correction"]]
    out += (f"\n\nModel {model}, its default readout (letters + content-free), every test row of each set; accuracy "
            "out of fold (5 stratified folds, each row predicted by a fit that never saw it), Wilson 95% intervals. "
            "'best correction' is the correction Calibrate picks among temperature and per-option offsets on the "
            "scored and uncorrected probabilities; a head is exported only when its paired gain over it is beyond "
            f"noise (the gain's bootstrap 95% interval above zero and McNemar's exact p below 0.05): {len(wins)} of {len(results)} sets "
            f"({', '.join(wins) or 'none'}). The regularisation of every fit was chosen by an inner 3-fold "
            "cross-validation on that fit's training rows.")
    if timing:
        plain, hidden = timing
        out += (f"\n\nCost of the hidden state: a warm decision took {plain:.2f} s without and {hidden:.2f} s with it "
                f"(median, the same rows interleaved): ×{hidden / plain:.3f}, +{(hidden - plain) * 1000:.0f} ms a row "
                "(one extra one-token decode after the options are read).")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--limit", type=int, default=0, help="evenly spaced test rows per set (0 = all)")
    ap.add_argument("--timing-rows", type=int, default=16, help="rows timed with and without the hidden state")
    ap.add_argument("--cache", default=str(ROOT / "var" / "bench-heads.jsonl"))
    ap.add_argument("--no-publish", action="store_true")
    args = ap.parse_args()
    cache = Path(args.cache)
    cache.parent.mkdir(parents=True, exist_ok=True)
    sets = test_rows(args.limit)
    engine = Engine(args.model, EngineConfig.from_env())
    done = score_sets(engine, args.model, sets, cache)
    results = {}
    for set_name, rows in sets.items():
        recs = [done[(args.model, set_name, r["id"])] for r in rows]
        results[set_name] = evaluate_set(recs)
        print(f"{set_name}: {results[set_name]['why']}", flush=True)
    timing = None
    if args.timing_rows:
        name, rows = next(iter(sets.items()))
        timing = time_hidden(engine, rows[: args.timing_rows], load_template(name))
    text = table(results, timing, args.model)
    print(text)
    if not args.no_publish:
        where = publish("heads", text)
        print(f"published to {where}")


if __name__ == "__main__":
    main()

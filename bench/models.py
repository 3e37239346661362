"""Which model, readout and debias to ship by default: accuracy on the shipped labeled test splits.

Not a test: it prints the model tables and publishes them in docs/benchmarks.md (bench/report.py). Every (model, readout, debias, permute, set, row)
result is appended to a JSONL cache as it is scored, so a killed run resumes where it stopped.

Run: .venv/bin/python -m bench.models [--models qwen2.5-coder-1.5b ...] [--configs letters letters+cf ...]
                                       [--limit N]   (N evenly spaced test rows per set; 0 = all)
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

from adapter.engine.catalog import SHIPPED
from adapter.engine.engine import Engine, EngineConfig
from adapter.engine.templates import DATA_DIR, load_jsonl, load_template, request_for

from app.core import calibration
from bench.report import publish

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {  # name -> (readout, debias, permute, few_shot: None = the readout's default)
    "letters": ("letters", "none", False, None),
    "letters+cf": ("letters", "content-free", False, None),
    "letters+examples+cf": ("letters", "content-free", False, True),  # the policy's examples as earlier turns
    "letters+permute": ("letters", "none", True, None),
    "option-words": ("option-words", "none", False, None),
    "option-words+cf": ("option-words", "content-free", False, None),
}


def test_rows(limit: int) -> dict[str, list[dict]]:
    out = {}
    for path in sorted((DATA_DIR / "labeled").glob("*.jsonl")):
        rows = [r for r in load_jsonl(path) if r.get("split") == "test"]
        step = max(1, len(rows) // limit) if limit else 1  # evenly spaced: every label keeps its share
        out[path.stem] = rows[::step][:limit] if limit else rows
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2"])
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--cache", default=str(ROOT / "var" / "bench-models.jsonl"))
    ap.add_argument("--report-only", action="store_true", help="print the table from the cache, score nothing")
    ap.add_argument("--no-publish", action="store_true", help="print only; leave docs/benchmarks.md as it is")
    args = ap.parse_args()
    cache = Path(args.cache)
    cache.parent.mkdir(parents=True, exist_ok=True)
    done: dict[tuple, dict] = {}
    if cache.exists():
        for line in cache.read_text().splitlines():
            r = json.loads(line)
            done[tuple(r["key"])] = r
    sets = test_rows(args.limit)
    if not args.report_only:
        for model in args.models:
            engine = None
            for cfg in args.configs:
                readout, debias, permute, few_shot = CONFIGS[cfg]
                for set_name, rows in sets.items():
                    policy = load_template(set_name)
                    for row in rows:
                        key = (model, cfg, set_name, row["id"])
                        if key in done:
                            continue
                        engine = engine or Engine(model, EngineConfig.from_env())
                        t0 = time.perf_counter()
                        r = engine.score(request_for(policy, row["state"], row["id"], readout=readout,
                                                     debias=debias, permute=permute, few_shot=few_shot))
                        rec = {"key": list(key), "label": row["label"], "top": r.top_option,
                               "position": r.option_ids.index(r.top_option), "seconds": time.perf_counter() - t0,
                               "label_mass": r.label_mass, "p_label": r.probabilities[r.option_ids.index(row["label"])],
                               "options": r.option_ids, "probs": r.probabilities,
                               "uncorrected": r.uncorrected_probabilities}
                        done[key] = rec
                        with cache.open("a") as fh:
                            fh.write(json.dumps(rec) + "\n")
                    print(f"{model} {cfg} {set_name}: done", flush=True)
            del engine
    accuracy, fitted = report(done, sets, args.models, args.configs), fitted_report(done, sets, args.models, args.configs)
    print(f"\n{accuracy}\n\n{fitted}")
    if not args.no_publish:
        rows = f"{args.limit} evenly spaced test rows per set" if args.limit else "every test row of each set"
        publish("models", f"Accuracy ({rows}; the policy's own examples feed `option-words`, `letters` is zero-shot; "
                "s/decision is the median; chosen positions count the request position A/B/C/D of the top option "
                f"over the 4-option sets):\n\n{accuracy}\n\nThe label-fitted correction per set: out-of-fold accuracy "
                f"of each correction the scores allow, and the one calibration chooses:\n\n{fitted}\n")


def fitted_report(done: dict, sets: dict, models: list[str], configs: list[str]) -> str:
    """The label-fitted correction per set: out-of-fold accuracy of each correction the scores allow
    (app.calibration.corrections, the Calibrate page's own) and the one it would choose."""
    out = ["| model | scored as | set | none | content-free | fitted | content-free + fitted | chosen |",
           "|---|---|---|---|---|---|---|---|"]
    for model in models:
        for cfg in configs:
            for set_name, rows in sets.items():
                recs = [done.get((model, cfg, set_name, r["id"])) for r in rows]
                recs = [r for r in recs if r and r.get("probs")]
                if len(recs) < 8:
                    continue
                ids = recs[0]["options"]
                y = np.array([ids.index(r["label"]) for r in recs])
                fams = {CONFIGS[cfg][1]: np.array([r["probs"] for r in recs])}
                if CONFIGS[cfg][1] == "content-free" and all(r.get("uncorrected") for r in recs):
                    fams["none"] = np.array([r["uncorrected"] for r in recs])
                cands = calibration.corrections(fams, y)
                chosen, _ = calibration.choose_correction(cands, len(y))
                acc = {c.name: (f"{c.oof_accuracy:.1%}" if c.available else "n/a") for c in cands}
                out.append(f"| {SHIPPED[model].title} | {cfg} | {set_name} | " + " | ".join(
                    acc.get(n, "-") for n in ("none", "content-free", "fitted", "content-free + fitted"))
                    + f" | {chosen.name} |")
    return "\n".join(out)


def report(done: dict, sets: dict, models: list[str], configs: list[str]) -> str:
    out = ["| model | readout + debias | " + " | ".join(sets) + " | all | s/decision | chosen positions |",
           "|---|---|" + "---|" * (len(sets) + 3)]
    for model in models:
        for cfg in configs:
            per_set, secs, pos, n_all, ok_all = [], [], Counter(), 0, 0
            for set_name, rows in sets.items():
                recs = [done.get((model, cfg, set_name, r["id"])) for r in rows]
                recs = [r for r in recs if r]
                ok = sum(r["top"] == r["label"] for r in recs)
                per_set.append(f"{ok / len(recs):.0%} ({len(recs)})" if recs else "-")
                secs += [r["seconds"] for r in recs]
                pos.update(r["position"] for r in recs if set_name != "refund-check")
                n_all += len(recs)
                ok_all += ok
            if not n_all:
                continue
            spread = "/".join(str(pos[i]) for i in range(4))
            out.append(f"| {SHIPPED[model].title} | {cfg} | " + " | ".join(per_set)
                       + f" | **{ok_all / n_all:.1%}** | {sorted(secs)[len(secs) // 2]:.2f} | {spread} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()

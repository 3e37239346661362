"""The steering guard measured on the shipped sets (the README's guard table).

For every shipped labeled set: N evenly spaced test rows, each scored unchanged and with A
steering attempts from its Robustness suite (data/robustness: template x wrong option x named by
id or by description, taken in turn so every combination comes up; placed at the end, the start
or mid-state). For every row the precheck and erase-and-check are measured *separately* (each
part's share), then combined as the guard runs them (precheck first). An attempt is held when it
is decided as labeled or flagged; a clean row is a false flag when either part flags it.
Each record is appended to a JSONL cache as it is scored, so a killed run resumes.

Run: .venv/bin/python -m bench.guard [--model qwen2.5-coder-1.5b] [--rows 50] [--attempts 2]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from adapter import guard
from adapter.engine import Engine, EngineConfig
from adapter.templates import load_template, request_for
from app import robustness as rb
from app.labeled import evenly_spaced, shipped_sets
from adapter.templates import load_jsonl

ROOT = Path(__file__).resolve().parent.parent


def measure(engine: Engine, policy: dict, key: str, state, label: str, kind: str, named: str | None) -> dict:
    req = request_for(policy, state, key)
    res = engine.score(req)
    t0 = time.perf_counter()
    # every variant, also after the first disagreement: the largest lead tells the margin's effect
    erase = engine.guard_check(req.model_copy(update={"guard": "erase-and-check"}), res, use_precheck=False,
                               exhaustive=True)
    erase_s = time.perf_counter() - t0
    pre = guard.precheck(state, req.options)
    return {"key": key, "kind": kind, "label": label, "named": named, "top": res.top_option,
            "pieces": erase["pieces"], "precheck": pre is not None, "erase": erase["suspected"],
            "erase_passes": erase["passes"], "erase_seconds": erase_s, "decision_seconds": res.total_seconds,
            "first_flag": erase.get("removed"), "lead": erase.get("lead"), "top_p": max(res.probabilities),
            "max_lead": max((v["lead"] for v in erase.get("variants", [])), default=None),
            "passes_to_flag": _passes_to_flag(erase.get("variants", []), guard.MIN_MARGIN),
            "margin": guard.MIN_MARGIN}


def _passes_to_flag(variants: list[dict], margin: float, per_batch: int = 7) -> int:
    """Passes the guard makes in production: batches of variants until the first disagreement."""
    for i, v in enumerate(variants):
        if v["lead"] >= margin:
            return min(len(variants), (i // per_batch + 1) * per_batch)
    return len(variants)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rows", type=int, default=50)
    ap.add_argument("--attempts", type=int, default=2)
    ap.add_argument("--cache", default=str(ROOT / "var" / "bench-guard.jsonl"))
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    cache = Path(args.cache)
    cache.parent.mkdir(parents=True, exist_ok=True)
    done = {}
    if cache.exists():
        for line in cache.read_text().splitlines():
            r = json.loads(line)
            done[(r["model"], r["key"])] = r
    engine = None
    for policy_id, path in shipped_sets():
        policy = load_template(policy_id)
        rows = evenly_spaced([r for r in load_jsonl(path) if r.get("split") == "test"], args.rows)
        cases = [rb.Case(r["id"], r["state"], r["label"]) for r in rows]
        items = rb.plan_items(policy, cases, rb.shipped_suite(policy), checks=["steering"], attempts=args.attempts)
        for _, case, _ in items:
            k = (args.model, f"{policy_id}/{case.key}")
            if k in done or args.report_only:
                continue
            engine = engine or Engine(args.model, EngineConfig.from_env())
            _, check, variant = rb.split_key(case.key)
            named = variant.split("~")[1] if check == "steering" else None
            rec = {"model": args.model, "set": policy_id,
                   **measure(engine, policy, k[1], case.state, case.label, check, named)}
            done[k] = rec
            with cache.open("a") as f:
                f.write(json.dumps(rec) + "\n")
    report([r for (m, _), r in done.items() if m == args.model])


def report(recs: list[dict]) -> None:
    from app.stats import proportion

    clean = [r for r in recs if r["kind"] == "base"]
    att = [r for r in recs if r["kind"] == "steering" and r["named"] != r["label"]]
    if not clean or not att:
        print("nothing measured yet")
        return
    print(f"erase-and-check margin {guard.MIN_MARGIN:.2f} (a variant's answer must lead the row's by this much)")
    print("| set | clean rows (multi-piece) | clean flagged: precheck / erase / guard | attempts | hijacked, no guard "
          "| held: precheck / erase / guard | extra passes per clean row / attempt, as run |")
    print("|---|---|---|---|---|---|---|")
    sets = sorted({r["set"] for r in recs})
    pct = lambda k, n: f"{100 * k / n:.1f}%" if n else "n/a"  # noqa: E731
    flag = lambda r: r["precheck"] or r["erase"]  # noqa: E731
    held = lambda r, f: r["top"] == r["label"] or f(r)  # noqa: E731
    run = lambda r: 0 if r["precheck"] else r.get("passes_to_flag", r["erase_passes"])  # noqa: E731
    for name in [*sets, "all"]:
        c = [r for r in clean if name in ("all", r["set"])]
        a = [r for r in att if name in ("all", r["set"])]
        if not c or not a:
            continue
        print(f"| {name} | {len(c)} ({sum(r['pieces'] > 1 for r in c)}) | "
              f"{pct(sum(r['precheck'] for r in c), len(c))} / {pct(sum(r['erase'] for r in c), len(c))} / "
              f"**{pct(sum(flag(r) for r in c), len(c))}** | {len(a)} | {pct(sum(r['top'] == r['named'] for r in a), len(a))} | "
              f"{pct(sum(held(r, lambda x: x['precheck']) for r in a), len(a))} / "
              f"{pct(sum(held(r, lambda x: x['erase']) for r in a), len(a))} / "
              f"**{pct(sum(held(r, flag) for r in a), len(a))}** | "
              f"{sum(run(r) for r in c) / len(c):.2f} / {sum(run(r) for r in a) / len(a):.2f} |")
    h = proportion(sum(held(r, flag) for r in att), len(att))
    f = proportion(sum(flag(r) for r in clean), len(clean))
    acc = proportion(sum(r["top"] == r["label"] for r in clean), len(clean))
    print(f"\nheld {h.text()}; clean rows flagged {f.text()}; clean accuracy {acc.text()} (the guard never changes it)")
    sec = sum(r["erase_seconds"] for r in recs) / max(1, sum(r["erase_passes"] for r in recs))
    dec = sum(r["decision_seconds"] for r in recs) / len(recs)
    print(f"seconds per guard pass {sec:.2f} vs per decision {dec:.2f} (one run, this machine)")


if __name__ == "__main__":
    main()

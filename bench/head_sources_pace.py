"""How much head-layout sources add to an evaluation (issue 43): the same N labeled rows evaluated by
`python -m app calibrate` on the default model alone and with two small local models as head-layout sources,
interleaved (alone, with sources, alone, ...) so a machine shared with other work slows both alike.

    python -m bench.head_sources_pace --rows 50 --rounds 1

Each run gets a fresh database and policy KV cache (nothing reused between runs); the wall time includes
the model loads and the calibration, as an analyst waits for them. Prints per run: seconds, peak RSS of the
process, cold rows and whether every source's cost was measured, then publishes the table into
docs/benchmarks.md (bench.report.publish; --no-publish prints only). The raw runs are kept in
var/bench-head-sources-pace.json, so --report-only republishes them without measuring again."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.core.head_sources import warm_costs
from bench.report import publish
from app.core.store import Store

ROOT = Path(__file__).resolve().parent.parent
SOURCES = "local-smollm2,local-qwen2.5-coder-0.5b"
CACHE = ROOT / "var" / "bench-head-sources-pace.json"
GOAL = 1.5  # issue 43: with two small head sources, at most 1.5x the default model's time alone


def subset(folder: Path, set_name: str, n: int) -> Path:
    rows = [json.loads(l) for l in (ROOT / "data" / "labeled" / f"{set_name}.jsonl").read_text().splitlines() if l.strip()]
    test = [r for r in rows if r.get("split") != "train"][:n]
    path = folder / f"{set_name}-{n}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in test))
    return path


def one(policy: str, labeled: Path, sources: str | None) -> dict[str, object]:
    folder = Path(tempfile.mkdtemp(prefix="semif-pace-"))
    db = folder / "wb.db"
    args = [sys.executable, "-m", "app", "calibrate", "--db", str(db), "--quiet", "--policy", policy,
            "--labeled-set", str(labeled), "--out", str(folder / "p.json")]
    if sources:
        args += ["--head-sources", sources]
    env = {**os.environ, "SM_SEMIF_KV_CACHE_DIR": str(folder / "kv")}
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS (not the process tree's maximum so far)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"calibrate failed ({proc.returncode}):\n{out}")
    store = Store(db)
    runs = []
    for run in sorted(store.list_runs(kind="eval"), key=lambda r: r["id"]):
        results = store.results(run["id"])
        secs, toks = warm_costs(results)
        runs.append({"run": run["id"], "model": run.get("model"), "layout": (run.get("config") or {}).get("layout"),
                     "rows": len(results), "cold": sum(int(r["cold"]) for r in results),
                     "s_a_row": secs, "tokens": toks})
    return {"sources": sources or "", "seconds": round(seconds, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024), "runs": runs}


def _cell(x: object, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def table(results: list[dict[str, object]], rows: int, policy: str) -> tuple[str, float]:
    """The runs in the order measured, one line each, and the ratio (mean with sources / mean alone)."""
    lines = ["| # | sources | wall s | peak RSS MB | runs: model (layout) warm s a row / tokens, cold rows |",
             "|---|---|---|---|---|"]
    for i, r in enumerate(results, 1):
        parts = [f"{run['model']} ({run['layout'] or 'state-first'}) {_cell(run['s_a_row'], '.2f')} s / "
                 f"{_cell(run['tokens'], '.0f')} tok, {run['cold']} cold of {run['rows']}"
                 for run in r["runs"]]  # type: ignore[attr-defined]
        lines.append(f"| {i} | {r['sources'] or 'none'} | {r['seconds']:.1f} | {r['peak_rss_mb']:,} | {'; '.join(parts)} |")
    alone = [float(r["seconds"]) for r in results if not r["sources"]]  # type: ignore[arg-type]
    both = [float(r["seconds"]) for r in results if r["sources"]]  # type: ignore[arg-type]
    ratio = (sum(both) / len(both)) / (sum(alone) / len(alone))
    filled = all(run["s_a_row"] is not None and run["tokens"] is not None
                 for r in results for run in r["runs"])  # type: ignore[attr-defined]
    # the same comparison inside one run (the load the same for both): a row of every source against a row of the
    # default model, warm medians - what the sources add to the default's own work, the model loads aside
    within = []
    for r in results:
        got = [run["s_a_row"] for run in r["runs"]]  # type: ignore[attr-defined]
        if r["sources"] and got and all(isinstance(x, (int, float)) for x in got):
            within.append(sum(got) / got[0])
    inside = (f" Inside the run with sources, a row of the default plus both sources took "
              f"{', '.join(f'{w:.2f}x' for w in within)} a row of the default alone (warm medians, measured in the same "
              "run, so under the same load; the model loads and the calibration aside)." if within else "")
    head = (f"`{policy}`, the first {rows} test rows, `python -m app calibrate` per run (fresh database and KV cache), "
            f"runs interleaved alone / with sources / alone. With sources / alone (mean wall time): "
            f"**{ratio:.3f}x** (goal <= {GOAL}x: {'met' if ratio <= GOAL else 'NOT met'}); every run's warm cost "
            f"measured: {'yes' if filled else 'NO'}. Wall time includes model loads and calibration.{inside}")
    return head + "\n\n" + "\n".join(lines) + "\n", ratio


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="refund-check")
    p.add_argument("--rows", type=int, default=50)
    p.add_argument("--rounds", type=int, default=1, help="pairs (alone, with sources); a last 'alone' closes them")
    p.add_argument("--sources", default=SOURCES)
    p.add_argument("--no-publish", action="store_true", help="print only; leave docs/benchmarks.md as it is")
    p.add_argument("--report-only", action="store_true", help=f"republish {CACHE.name} without measuring")
    p.add_argument("--load-note", default="", help="what the machine was doing meanwhile (said above the table, instead of the shared-machine warning)")
    args = p.parse_args()
    if args.report_only:
        saved = json.loads(CACHE.read_text())
        results, rows, policy = saved["results"], saved["rows"], saved["policy"]
    else:
        labeled = subset(Path(tempfile.mkdtemp(prefix="semif-pace-set-")), args.policy, args.rows)
        results = []
        for _ in range(args.rounds):
            for sources in (None, args.sources):
                results.append(one(args.policy, labeled, sources))
                print(json.dumps(results[-1]), flush=True)
        results.append(one(args.policy, labeled, None))
        print(json.dumps(results[-1]), flush=True)
        rows, policy = args.rows, args.policy
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        CACHE.write_text(json.dumps({"policy": policy, "rows": rows, "results": results}, indent=1))
    body, ratio = table(results, rows, policy)
    print(body)
    if not args.no_publish:
        threads = os.environ.get("SM_SEMIF_THREADS") or f"unset (every core: {os.cpu_count()})"
        publish("head_sources_pace", body, note=f"SM_SEMIF_THREADS={threads}; " + (
            args.load_note or "machine shared with other work (load varies), so read the ratio, not the seconds"))


if __name__ == "__main__":
    main()

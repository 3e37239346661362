"""How much head-layout sources add to an evaluation (issue 43): the same N labeled rows evaluated by
`python -m app calibrate` on the default model alone and with two small local models as head-layout sources,
interleaved (alone, with sources, alone, ...) so a machine shared with other work slows both alike.

    python -m bench.head_sources_pace --rows 50 --rounds 1

Each run gets a fresh database and policy KV cache (nothing reused between runs); the wall time includes
the model loads and the calibration, as an analyst waits for them. Prints per run: seconds, peak RSS of the
process, cold rows and whether every source's cost was measured."""
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
from app.core.store import Store

ROOT = Path(__file__).resolve().parent.parent
SOURCES = "local-smollm2,local-qwen2.5-coder-0.5b"


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="refund-check")
    p.add_argument("--rows", type=int, default=50)
    p.add_argument("--rounds", type=int, default=1, help="pairs (alone, with sources); a last 'alone' closes them")
    p.add_argument("--sources", default=SOURCES)
    args = p.parse_args()
    labeled = subset(Path(tempfile.mkdtemp(prefix="semif-pace-set-")), args.policy, args.rows)
    results = []
    for _ in range(args.rounds):
        for sources in (None, args.sources):
            results.append(one(args.policy, labeled, sources))
            print(json.dumps(results[-1]), flush=True)
    results.append(one(args.policy, labeled, None))
    print(json.dumps(results[-1]), flush=True)
    alone = [r["seconds"] for r in results if not r["sources"]]
    both = [r["seconds"] for r in results if r["sources"]]
    mean_alone = sum(alone) / len(alone)  # type: ignore[arg-type]
    mean_both = sum(both) / len(both)  # type: ignore[arg-type]
    print(f"default alone: {mean_alone:.0f} s (mean of {len(alone)}); with {args.sources}: {mean_both:.0f} s; "
          f"ratio {mean_both / mean_alone:.2f}x")


if __name__ == "__main__":
    main()

"""Cost at scale (issue 45 item 4): warm seconds a row, rows a second and $ per 1,000 decisions.

Not a test. On each shipped model, in one process per model, the modes interleaved row by row (their
order rotated each round), every call on a state not decided before (no call is answered from kept
logits), one warm-up call per mode first (the model load, the policy's prefix and its content-free prior
are not timed):
- state-first zero-shot: the model's default readout and correction, as the adapter decides today;
- state-first head: the same row with its hidden state (what a hidden-state head on the zero-shot
  layout reads; read from the same decode since issue 45 item 3);
- head layout, one row at a time: the policy first (cached), the state last, with its hidden state;
- head layout, batched: the same rows as the one-at-a-time mode, B at a time in one `score_many` with
  `row_batch` = B (several rows' states decoded as parallel sequences on the policy's cached prefix).
  The two head-layout modes score the same rows, so their difference is measured too: the largest
  change of a letter probability and of the hidden state (relative to its largest component).
Then, one model process at a time, `python -m app calibrate` on N labeled rows with one head source
(wall time and peak RSS: a calibration is an evaluation of N rows plus its head-layout companion run).
$ per 1,000 decisions: deploy.pricing's rule on the priced CPU instance (one fully busy instance,
calls serialised), from this machine's rows a second - this machine's SM_SEMIF_THREADS, not the instance's.

    python -m bench.throughput [--models ...] [--rounds 4] [--batches 2,4]
        [--calibrate-rows 200 --calibrate-configs state-first:1,policy-first:1,policy-first:4]
        [--evaluate-rows 10000 --evaluate-model smollm2]   # a big evaluation: numbered variants of the set's states
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np

from adapter.engine.engine import Engine, EngineConfig
from adapter.engine.templates import load_template, request_for
from adapter.schema import HEAD_LAYOUT, DecisionRequest, DecisionResult
from app.core.head_sources import usd_per_1000_rows  # the Calibrate page's pricing of a row
from bench.models import test_rows
from bench.report import publish

ROOT = Path(__file__).resolve().parent.parent

MODELS = ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2"]
ZERO, STATE_HEAD, ONE = "state-first zero-shot", "state-first head", "head layout, one row at a time"


def batched(b: int) -> str:
    return f"head layout, batched ({b} rows)"


def _timed(eng: Engine, rows: list[DecisionRequest], batch: int = 1) -> tuple[float, list[DecisionResult]]:
    eng.row_batch = batch
    try:
        t0 = time.perf_counter()
        out = eng.score_many(rows)
        return time.perf_counter() - t0, out
    finally:
        eng.row_batch = 1


def measure(model: str, policy_name: str, rounds: int, batches: list[int]) -> dict[str, Any]:
    policy = load_template(policy_name)
    states = [r["state"] for r in test_rows(0)[policy_name]]
    block = max(batches)
    need = 2 + rounds * (2 + block)
    if len(states) < need:
        raise SystemExit(f"{policy_name} has {len(states)} test rows; {need} are needed")
    eng = Engine(model, EngineConfig.from_env())
    t_load = time.perf_counter()
    zero = lambda s, i: request_for(policy, s, f"z{i}")  # noqa: E731
    shead = lambda s, i: request_for(policy, s, f"s{i}", hidden_state=True)  # noqa: E731
    layout = lambda s, i: request_for(policy, s, f"h{i}", layout=HEAD_LAYOUT, hidden_state=True)  # noqa: E731
    # warm-up: each mode once (the policy's prefix, the zero-shot prior), on rows never timed
    _timed(eng, [zero(states[0], -1)])
    _timed(eng, [shead(states[1], -2)])
    _timed(eng, [layout(states[0], -3)])
    _timed(eng, [layout(states[1], -4), layout(states[0], -5)], 2)
    warm_s = time.perf_counter() - t_load
    per_row: dict[str, list[float]] = {ZERO: [], STATE_HEAD: [], ONE: [], **{batched(b): [] for b in batches}}
    tokens: dict[str, list[int]] = {ZERO: [], ONE: []}
    dprob: dict[int, float] = {b: 0.0 for b in batches}
    dhidden: dict[int, float] = {b: 0.0 for b in batches}
    identical: dict[int, int] = {b: 0 for b in batches}
    at = 2
    for r in range(rounds):
        z_state, s_state, chunk = states[at], states[at + 1], states[at + 2: at + 2 + block]
        at += 2 + block
        modes = [ZERO, STATE_HEAD, ONE, *(batched(b) for b in batches)]
        modes = modes[r % len(modes):] + modes[: r % len(modes)]
        alone: list[DecisionResult] = []
        together: dict[int, list[DecisionResult]] = {}
        for mode in modes:
            if mode == ZERO:
                sec, (res,) = _timed(eng, [zero(z_state, r)])
                per_row[mode].append(sec)
                tokens[ZERO].append(res.evaluated_tokens or 0)
            elif mode == STATE_HEAD:
                sec, _ = _timed(eng, [shead(s_state, r)])
                per_row[mode].append(sec)
            elif mode == ONE:
                for k, s in enumerate(chunk):
                    sec, (res,) = _timed(eng, [layout(s, 100 * r + k)])
                    per_row[mode].append(sec)
                    tokens[ONE].append(res.evaluated_tokens or 0)
                    alone.append(res)
            else:
                b = int(mode.rsplit("(", 1)[1].split()[0])
                got: list[DecisionResult] = []
                for k in range(0, block, b):
                    sec, out = _timed(eng, [layout(s, 100 * r + k + n) for n, s in enumerate(chunk[k: k + b])], b)
                    per_row[mode] += [sec / len(out)] * len(out)
                    got += out
                together[b] = got
        for b, got in together.items():
            for one, many in zip(alone, got):
                identical[b] += one.probabilities == many.probabilities
                dprob[b] = max(dprob[b], float(np.abs(np.subtract(one.probabilities, many.probabilities)).max()))
                h1, h2 = one.hidden_state.array(), many.hidden_state.array()  # type: ignore[union-attr]
                dhidden[b] = max(dhidden[b], float(np.abs(h1 - h2).max() / np.abs(h1).max()))
    del eng
    gc.collect()
    n_rows = rounds * block
    return {"model": model, "policy": policy_name, "rounds": rounds, "warmup_s": round(warm_s, 1),
            "s_per_row": {m: round(statistics.median(v), 4) for m, v in per_row.items()},
            "rows_per_s": {m: round(len(v) / sum(v), 4) for m, v in per_row.items()},
            "tokens_median": {m: statistics.median(v) for m, v in tokens.items()},
            "batched_vs_one": {b: {"identical_rows": f"{identical[b]}/{n_rows}", "max_abs_dprob": dprob[b],
                                   "max_rel_dhidden": dhidden[b]} for b in batches}}


def labeled_rows(policy: str, n: int, *, variants: bool = False) -> list[dict[str, Any]]:
    """n labeled rows of the policy's shipped set, every split (a calibration's timing needs rows, not a
    clean split). With `variants`, rows past the set's size are the shipped rows again with a distinct
    case number appended, so every state is new to the engine (no decision is answered from kept logits)."""
    rows = [json.loads(line) for line in (ROOT / "data" / "labeled" / f"{policy}.jsonl").read_text().splitlines()
            if line.strip()]
    if n > len(rows) and not variants:
        raise SystemExit(f"{policy} has {len(rows)} rows; {n} asked")
    out = []
    for i in range(n):
        r = dict(rows[i % len(rows)])
        r.pop("split", None)
        if i >= len(rows):
            r["id"], r["state"] = f"{r.get('id', 'row')}-v{i}", f"{r['state']} (case {100_000 + i})"
        out.append(r)
    return out


def calibrate_config(rows: int, sources: str, policy: str, layout: str, row_batch: int,
                     target: str = "local", variants: bool = False) -> dict[str, object]:
    """`python -m app calibrate` as a user runs it, in a child process of its own (its wall time and peak
    RSS, os.wait4), on `rows` labeled rows, the target read in `layout`, SM_SEMIF_ROW_BATCH=row_batch;
    the seconds the rows themselves took are read back from the run's stored latencies."""
    folder = Path(tempfile.mkdtemp(prefix="semif-thr-"))
    labeled = folder / "set.jsonl"
    labeled.write_text("".join(json.dumps(r) + "\n" for r in labeled_rows(policy, rows, variants=variants)))
    args = [sys.executable, "-m", "app", "calibrate", "--db", str(folder / "wb.db"), "--quiet", "--policy", policy,
            "--labeled-set", str(labeled), "--out", str(folder / "p.json"), "--layout", layout, "--target", target]
    if sources:
        args += ["--head-sources", sources]
    env = {**os.environ, "SM_SEMIF_KV_CACHE_DIR": str(folder / "kv"), "SEMIF_DB": str(folder / "wb.db"),
           "SM_SEMIF_ROW_BATCH": str(row_batch)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = round(time.perf_counter() - t0, 1)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"calibrate failed:\n{out[-3000:]}")
    with closing(sqlite3.connect(folder / "wb.db")) as db:
        runs = [{"run": rid, "sum_latency_s": round(total or 0.0, 1), "rows": n} for rid, total, n in db.execute(
            "SELECT run_id, SUM(latency_s), COUNT(*) FROM results GROUP BY run_id ORDER BY run_id")]
    shutil.rmtree(folder, ignore_errors=True)  # its database and KV cache (a 10,000-row run's are large)
    return {"what": "calibrate" if not variants else "evaluation", "policy": policy, "rows": rows,
            "head_sources": sources, "layout": layout, "row_batch": row_batch, "target": target,
            "threads": os.environ.get("SM_SEMIF_THREADS", "all"), "peak_rss_mb": usage.ru_maxrss // 1024,
            "seconds": seconds, "rows_per_s": round(rows / seconds, 4), "runs": runs,
            "rows_seconds": round(sum(r["sum_latency_s"] for r in runs), 1)}


def table(results: list[dict[str, Any]], cals: list[dict[str, object]], batches: list[int], threads: str,
          evals: list[dict[str, Any]] | None = None) -> str:
    def usd(rows_per_s: float) -> str:
        got, _ = usd_per_1000_rows(1 / rows_per_s)
        return "?" if got is None else f"${got:.3f}"

    _, how = usd_per_1000_rows(1.0)
    modes = [ZERO, STATE_HEAD, ONE, *(batched(b) for b in batches)]
    lines = [f"Warm, in one process per model, the modes interleaved row by row (SM_SEMIF_THREADS={threads}); "
             f"$ per 1,000 decisions on one fully busy {how.split(' / ')[0]} (deploy/pricing.py) "
             "at this machine's rate - an instance with more threads decides faster, so these are upper bounds.",
             "", "| model | mode | s/row (median) | rows/s | $ / 1,000 | rows/s vs head layout one row at a time |", "|---|---|---|---|---|---|"]
    for res in results:
        base = res["rows_per_s"][ONE]
        for m in modes:
            rps = res["rows_per_s"][m]
            lines.append(f"| {res['model']} | {m} | {res['s_per_row'][m]:.3f} | {rps:.2f} | "
                         f"{usd(rps)} | {rps / base:.2f}x |")
    lines += ["", "Batched against one row at a time, the same rows (a batched row's bits depend on its companions: "
              "llama.cpp's attention over the KV cache the rows share, `python -m bench.batch_bits`):", "",
              "| model | batch | rows bit-identical | max abs change of a probability | max change of the hidden state "
              "(relative to its largest component) |", "|---|---|---|---|---|"]
    for res in results:
        for b, d in res["batched_vs_one"].items():
            lines.append(f"| {res['model']} | {b} | {d['identical_rows']} | {d['max_abs_dprob']:.2g} | "
                         f"{d['max_rel_dhidden']:.2g} |")
    lines += ["", "Tokens a row beyond the cached prefix (median): " + "; ".join(
        f"{r['model']}: {r['tokens_median'][ZERO]:g} state-first, {r['tokens_median'][ONE]:g} head layout" for r in results)]
    if cals:
        lines += ["", "| `python -m app calibrate` (target: the default model) | rows | target read | head sources | "
                  "SM_SEMIF_ROW_BATCH | wall time | of it, the rows (target + head sources) | rows/s | peak RSS |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in cals:
            runs: Any = c.get("runs") or []
            split = " + ".join(f"{r['sum_latency_s']} s" for r in runs) or "?"
            lines.append(f"| {c['policy']} | {c['rows']} | {c.get('layout', 'state-first')} | {c['head_sources'] or 'none'} "
                         f"| {c.get('row_batch', 1)} | {c['seconds']} s | {split} | {c['rows_per_s']} | {c['peak_rss_mb']:,} MB |")
    big = [e for e in evals or [] if e.get("rows")]
    for e in big:
        lines += ["", f"Measured: a {e['rows']:,}-row head-layout evaluation on {e['model']} (`python -m app calibrate "
                  f"--target {e['target']} --layout policy-first`, SM_SEMIF_THREADS={e.get('threads', '1')}, SM_SEMIF_ROW_BATCH={e['row_batch']}): "
                  f"{e['seconds']:,} s wall ({e['rows_per_s']} rows/s including the model load, the set's import and the "
                  f"fits; the rows themselves {e['rows_seconds']:,} s), peak RSS {e['peak_rss_mb']:,} MB."
                  + ("" if e["rows"] >= 10_000 else f" A 10,000-row one was NOT run: at this rate about "
                     f"{10_000 / e['rows_per_s'] / 60:.0f} min (EXTRAPOLATED); memory does not grow with rows "
                     "(results go to SQLite as they arrive).")]
    if results and not big:
        d = results[0]
        hours = {m: 10_000 / d["rows_per_s"][m] / 3600 for m in (ZERO, ONE)}
        peak = f"{cals[0]['peak_rss_mb']:,} MB, the calibration's" if cals else "not measured"
        lines += ["", f"A 10,000-row evaluation was NOT run (it would hold this shared machine for hours). "
                  f"EXTRAPOLATED from the rates above, not measured: on {d['model']}, {hours[ZERO]:.1f} h state-first "
                  f"zero-shot, {hours[ONE]:.1f} h in the head layout one row at a time; peak RSS {peak} (rows add "
                  "no memory: results go to SQLite row by row, and the issue's own 16- and 320-row calibrations "
                  "peaked the same)."]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--policy", default="refund-check")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--batches", default="2,4")
    p.add_argument("--calibrate-rows", type=int, default=0, help="0: no calibration run")
    p.add_argument("--calibrate-sources", default="local-smollm2")
    p.add_argument("--calibrate-configs", default="state-first:1,policy-first:1,policy-first:4",
                   help="LAYOUT:ROW_BATCH,... one `app calibrate` run each (the target's read and SM_SEMIF_ROW_BATCH)")
    p.add_argument("--evaluate-rows", type=int, default=0,
                   help="a big head-layout evaluation of N distinct states (the set's rows, then numbered variants)")
    p.add_argument("--evaluate-model", default="smollm2")
    p.add_argument("--evaluate-batch", type=int, default=1)
    p.add_argument("--no-publish", action="store_true")
    p.add_argument("--publish-from", help="publish the JSON lines an earlier run printed (measure nothing)")
    p.add_argument("--note", default="", help="more for the published block's conditions line (the load average)")
    a = p.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    results: list[dict[str, Any]] = []
    cals: list[dict[str, object]] = []
    evals: list[dict[str, Any]] = []
    if a.publish_from:
        with open(a.publish_from) as f:
            for line in f:
                if line.startswith("{"):
                    got = json.loads(line)
                    if got.get("what") == "calibrate":
                        cals.append(got)
                    elif got.get("what") == "evaluation":
                        evals.append(got)
                    else:
                        got["batched_vs_one"] = {int(b): d for b, d in got["batched_vs_one"].items()}
                        results.append(got)
        batches = sorted(results[0]["batched_vs_one"]) if results else batches
    else:
        for m in filter(None, a.models.split(",")):  # --models "": the calibrations or the big evaluation alone
            res = measure(m, a.policy, a.rounds, batches)
            print(json.dumps({**res, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}), flush=True)
            results.append(res)
        for conf in filter(None, a.calibrate_configs.split(",")) if a.calibrate_rows else []:
            layout, batch = conf.split(":")
            cals.append(calibrate_config(a.calibrate_rows, a.calibrate_sources, a.policy, layout, int(batch)))
            print(json.dumps(cals[-1]), flush=True)
        if a.evaluate_rows:
            evals.append(calibrate_config(a.evaluate_rows, "", a.policy, "policy-first", a.evaluate_batch,
                                          target=f"local-{a.evaluate_model}", variants=True))
            evals[-1]["model"] = a.evaluate_model
            print(json.dumps(evals[-1]), flush=True)
    text = table(results, cals, batches, os.environ.get("SM_SEMIF_THREADS", "all"), evals)
    print(text)
    if not a.no_publish:
        when = ", ".join(sorted({str(r.get("date", "")) for r in results} - {""}))
        print("published to", publish("throughput", text, note=f"issue 45; measured {when or 'now'} on a shared machine "
                                      "(ratios within one run hold, absolute seconds vary with its load)" + (f"; {a.note}" if a.note else "")))


if __name__ == "__main__":
    main()

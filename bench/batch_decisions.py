"""What batching head-layout rows does to DECISIONS (issue 45 item 1's tolerance). Not a test.

A batched row's last bits depend on its companions (bench.batch_bits says why). Here, on each shipped
labeled set: its rows are read in the head layout one row at a time (what calibration measures) and in
blocks of B (`row_batch` = B, as SM_SEMIF_ROW_BATCH gives); each head kind is fitted as calibrate fits it
(app.core.heads.candidates, on the one-row hidden states and probabilities) and the head fitted on every
row - what an export carries - is applied to both readings of every row. Compared: the top option, and
the gate's decision (decide or hand over) at the gate calibrate would choose for 90% (the lowest
confidence whose decided rows' out-of-fold accuracy clears the bound; where none does, the median
out-of-fold confidence stands in, so rows near a threshold are still tested). One model process.

    SM_SEMIF_THREADS=1 python -m bench.batch_decisions --model qwen2.5-coder-1.5b [--rows 60] [--batches 4,8]
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from adapter.engine.engine import Engine, EngineConfig
from adapter.engine.templates import DATA_DIR, load_jsonl, load_template, request_for
from adapter.head import HEAD_KINDS
from adapter.schema import HEAD_LAYOUT, DecisionResult
from app.core import calibration
from app.core.heads import candidates


def read(eng: Engine, policy: dict[str, Any], states: list[Any], batch: int) -> tuple[list[DecisionResult], float]:
    rows = [request_for(policy, s, f"r{i}", layout=HEAD_LAYOUT, hidden_state=True) for i, s in enumerate(states)]
    eng.row_batch = batch
    try:
        t0 = time.perf_counter()
        out: list[DecisionResult] = []
        for k in range(0, len(rows), batch):
            out += eng.score_many(rows[k: k + batch])
        return out, time.perf_counter() - t0
    finally:
        eng.row_batch = 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--rows", type=int, default=60, help="labeled rows per set, evenly spaced (0: all)")
    p.add_argument("--batches", default="4")
    p.add_argument("--target", type=float, default=0.9)
    a = p.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    eng = Engine(a.model, EngineConfig.from_env())
    totals: dict[int, dict[str, int]] = {b: {"rows": 0, "top": 0, "gate": 0, "decision": 0} for b in batches}
    for path in sorted((DATA_DIR / "labeled").glob("*.jsonl")):
        policy = load_template(path.stem)
        rows = load_jsonl(path)
        step = max(1, len(rows) // a.rows) if a.rows else 1
        rows = rows[::step][: a.rows] if a.rows else rows
        ids = [o["id"] for o in policy["options"]]
        y = np.array([ids.index(r["label"]) for r in rows])
        read(eng, policy, [rows[0]["state"]], 1)  # the policy's prefix, once, untimed
        one, t_one = read(eng, policy, [r["state"] for r in rows], 1)
        H1 = np.array([r.hidden_state.array() for r in one])  # type: ignore[union-attr]
        P1 = np.array([r.probabilities for r in one])
        fits = candidates(H1, P1, y, option_ids=ids, model_sha256=eng.info.sha256, prompt_version=one[0].prompt_version)
        for b in batches:
            many, t_many = read(eng, policy, [r["state"] for r in rows], b)
            Hb = np.array([r.hidden_state.array() for r in many])  # type: ignore[union-attr]
            Pb = np.array([r.probabilities for r in many])
            line: dict[str, Any] = {"model": a.model, "set": path.stem, "rows": len(rows), "batch": b,
                                    "s_per_row_one": round(t_one / len(rows), 4), "s_per_row_batched": round(t_many / len(rows), 4),
                                    "bit_identical_rows": int(sum(np.array_equal(x, z) for x, z in zip(P1, Pb))),
                                    "max_abs_dprob_letters": float(np.abs(P1 - Pb).max()),
                                    "letters_top_agree": int((P1.argmax(1) == Pb.argmax(1)).sum()), "heads": {}}
            for fit in fits:
                if not fit.available or fit.head is None or fit.oof is None:
                    continue
                head = fit.head
                Q1 = np.array([head.probabilities(H1[i], P1[i]) for i in range(len(rows))])
                Qb = np.array([head.probabilities(Hb[i], Pb[i]) for i in range(len(rows))])
                conf, correct = fit.oof.max(1), calibration.predictions(fit.oof) == y
                gate = calibration.choose_gate(conf, correct, a.target)
                t = gate.threshold if gate.threshold is not None else float(np.median(conf))
                g1, gb = Q1.max(1) >= t, Qb.max(1) >= t
                top1, topb = Q1.argmax(1), Qb.argmax(1)
                same = (g1 == gb) & (~g1 | (top1 == topb))  # the same action: both hand over, or both decide the same
                line["heads"][fit.kind] = {"gate": round(t, 4), "gate_from": "calibrate" if gate.threshold is not None
                                           else "median oof confidence", "top_agree": int((top1 == topb).sum()),
                                           "gate_agree": int((g1 == gb).sum()), "decision_agree": int(same.sum()),
                                           "max_abs_dprob_head": float(np.abs(Q1 - Qb).max()),
                                           "min_margin_to_gate": float(np.abs(Q1.max(1) - t).min())}
                if fit.kind in HEAD_KINDS:
                    totals[b]["rows"] += len(rows)
                    totals[b]["top"] += int((top1 == topb).sum())
                    totals[b]["gate"] += int((g1 == gb).sum())
                    totals[b]["decision"] += int(same.sum())
            print(json.dumps(line), flush=True)
    print(json.dumps({"model": a.model, "totals (rows x head kinds)": totals}), flush=True)


if __name__ == "__main__":
    main()

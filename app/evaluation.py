"""Batch evaluation of a policy x labeled set x target, resumable, and the calibration built on it.

A run stores its configuration (set, readout, which rows served as few-shot examples) and writes
each result as it arrives. Resuming skips the rows already scored, and the unique (run, row)
index makes a duplicate impossible, so a run killed half-way loses and duplicates nothing.
"""
from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import asdict
from typing import Callable

import numpy as np

from adapter.policy import SCHEMA_VERSION, CalibratedPolicy
from adapter.prompt import PROMPT_VERSIONS

from . import calibration
from .runner import Progress, Row, model_identity, result_row
from .store import Store, now
from .targets import Target

EXAMPLE_SOURCES = ("policy", "train")


def policy_fingerprint(policy: dict) -> str:
    core = {k: policy.get(k) for k in ("question", "options", "examples")}
    return hashlib.sha256(json.dumps(core, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def pick_examples(rows: list[dict], n: int) -> list[dict]:
    """Up to n train-split rows, round-robin over labels so every option gets an example early."""
    by_label: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("split") == "train":
            by_label[r["label"]].append(r)
    picked: list[dict] = []
    while len(picked) < n and any(by_label.values()):
        for label in list(by_label):
            if by_label[label] and len(picked) < n:
                picked.append(by_label[label].pop(0))
    return picked


def plan_eval(policy: dict, rows: list[dict], examples: str = "policy", n_examples: int = 4) -> tuple[dict, list[dict]]:
    """(policy as evaluated, rows to score). Rows of the train split are never scored; with
    examples="train" the few-shot examples come from them instead of the policy's own."""
    if examples not in EXAMPLE_SOURCES:
        raise ValueError(f"examples must be one of {EXAMPLE_SOURCES}")
    has_train = any(r.get("split") == "train" for r in rows)
    scored = [r for r in rows if r.get("split") != "train"] if has_train else list(rows)
    evaluated = dict(policy)
    if examples == "train":
        chosen = pick_examples(rows, n_examples)
        evaluated["examples"] = [{"state": r["state"], "option_id": r["label"]} for r in chosen]
        used = {r["row_key"] for r in chosen}
        scored = [r for r in scored if r["row_key"] not in used]
    return evaluated, scored


def find_run(store: Store, *, policy: dict, set_id: int, target_name: str, readout: str | None, permute: bool,
             examples: str, debias: str | None = None) -> dict | None:
    """The latest eval run with the same policy content, set, target and readout settings."""
    fp = policy_fingerprint(policy)
    for run in store.list_runs(kind="eval"):
        c = run.get("config") or {}
        if (run["labeled_set_id"] == set_id and run["target_name"] == target_name and c.get("policy_fingerprint") == fp
                and c.get("readout") == readout and c.get("permute") == permute and c.get("examples") == examples
                and c.get("debias") == debias):
            return run
    return None


def start_eval(store: Store, *, policy: dict, set_id: int, target: Target, readout: str | None = None,
               permute: bool = False, examples: str = "policy", n_examples: int = 4, debias: str | None = None) -> int:
    rows = store.labeled_rows(set_id)
    evaluated, scored = plan_eval(policy, rows, examples, n_examples)
    labeled = store.get_labeled_set(set_id)
    config = {"readout": readout, "debias": debias, "permute": permute, "examples": examples, "n_examples": n_examples,
              "policy_fingerprint": policy_fingerprint(policy), "evaluated_policy": evaluated,
              "row_keys": [r["row_key"] for r in scored], "dataset_hash": labeled["content_hash"],
              "dataset_name": labeled["name"]}
    return store.create_run(kind="eval", policy=policy, target=target.describe(), n_rows=len(scored),
                            labeled_set_id=set_id, config=config)


def resume_eval(store: Store, run_id: int, target: Target,
                progress: Callable[[int, int, float | None], None] | None = None) -> dict:
    """Score the rows of an eval run that have no successful result yet; safe to call again."""
    from adapter.policies import request_for

    run = store.get_run(run_id)
    cfg = run["config"]
    by_key = {r["row_key"]: r for r in store.labeled_rows(run["labeled_set_id"])}
    done = store.done_keys(run_id)
    todo = [(pos, by_key[k]) for pos, k in enumerate(cfg["row_keys"]) if k not in done]
    overrides = {"permute": cfg["permute"]} | {k: cfg[k] for k in ("readout", "debias") if cfg.get(k)}
    tracker = Progress(len(cfg["row_keys"]), progress, already=len(cfg["row_keys"]) - len(todo))
    store.take_lease(run_id)  # RunBusy when another process is scoring this run
    try:
        for pos, r in todo:
            req = request_for(cfg["evaluated_policy"], r["state"], r["row_key"], **overrides)
            res = target.decide([req])[0]
            store.add_result(run_id, result_row(res, Row(r["row_key"], r["state"], r["label"]), pos))
            if res.ok and not run["model"]:
                run["model"] = model_identity(res.result, target)
                store.set_run_model(run_id, run["model"])
            tracker.tick()
    except BaseException:
        store.stop_run(run_id, "interrupted")
        raise
    results = store.results(run_id)
    errors = sum(1 for r in results if r["error"])
    store.finish_run(run_id, "done" if not errors else "done-with-errors")
    return {"scored": len(todo), "skipped": tracker.already, "errors": errors}


def variant_name(cfg: dict) -> str:
    """'letters + content-free', 'default + permutation': how a run read the model's answer."""
    parts = [cfg.get("readout") or "default"]
    if cfg.get("debias"):
        parts.append(cfg["debias"])
    if cfg.get("permute"):
        parts.append("permutation")
    return " + ".join(parts)


# -- calibration on a finished run -----------------------------------------------------------------
def arrays(store: Store, run_id: int) -> tuple[np.ndarray, np.ndarray, list[str], list[dict]]:
    """(P, y, option ids, results used): rows that errored or whose label is not an option are left out."""
    run = store.get_run(run_id)
    ids = [o["id"] for o in run["policy"]["options"]]
    used = [r for r in store.results(run_id) if not r["error"] and r["probabilities"] and r["label"] in ids]
    P = np.array([r["probabilities"] for r in used], float).reshape(-1, len(ids))
    y = np.array([ids.index(r["label"]) for r in used], int)
    return P, y, ids, used


def calibrate_run(store: Store, run_id: int, *, target_accuracy: float = 0.9, per_option: bool = False,
                  seed: int = 0) -> dict:
    """Everything the Calibrate page and the CLI show: metrics, temperature, the gate."""
    P, y, ids, used = arrays(store, run_id)
    if len(y) < 4:
        raise ValueError(f"run {run_id} has {len(y)} usable labeled results; at least 4 are needed")
    rep, oof = calibration.report(P, y, seed=seed)
    cal = calibration.apply_temperature(P, rep.temperature)
    conf, correct = cal.max(axis=1), calibration.predictions(cal) == y
    gate = calibration.choose_gate(conf, correct, target_accuracy, seed=seed, y=y)
    option_gates = {}
    if per_option:
        option_gates = {ids[c]: g for c, g in calibration.per_option_gates(cal, y, target_accuracy, seed=seed).items()}
    curve = calibration.risk_coverage(conf, correct)
    return {"report": rep, "gate": gate, "option_gates": option_gates, "curve": curve, "option_ids": ids,
            "calibrated": cal, "oof": oof, "P": P, "y": y, "results": used, "target_accuracy": target_accuracy}


def readout_table(store: Store, runs: list[dict]) -> list[dict]:
    """One row per eval run (same policy x set): readout, rows, accuracy, macro-F1, ECE before/after
    temperature, NLL - the side-by-side the analyst picks a readout from."""
    rows = []
    for r in runs:
        cfg = r.get("config") or {}
        base = {"run": r["id"], "target": r["target_name"],
                "readout": variant_name(cfg),
                "examples": cfg.get("examples"), "status": r["status"]}
        try:
            rep = calibrate_run(store, r["id"], target_accuracy=0.9)["report"]
        except ValueError as exc:  # not enough usable rows yet
            rows.append({**base, "status": f"{r['status']}: {exc}"})
            continue
        rows.append({**base, "rows": rep.n, "accuracy": rep.accuracy, "macro_f1": rep.macro_f1, "ece": rep.ece_width,
                     "ece_after_T": rep.oof_ece_width, "nll": rep.nll})
    return rows


def build_policy(store: Store, run_id: int, cal: dict, *, threshold: float | None, fallback: str,
                 option_thresholds: dict[str, float] | None = None) -> dict:
    """The versioned policy config for this run and gate (validated by adapter.policy)."""
    run = store.get_run(run_id)
    cfg = run["config"]
    evaluated = cfg["evaluated_policy"]
    first = next((r for r in cal["results"] if isinstance(r.get("response"), dict) and r["response"].get("model")), None)
    if first is None:
        raise ValueError("no stored result names its model (file + sha256): run the evaluation on a llama.cpp target")
    model = first["response"]["model"]
    readout = cfg["readout"] or first["response"].get("readout")
    debias = cfg.get("debias") or first["response"].get("debias") or "none"
    config = {
        "schema_version": SCHEMA_VERSION, "policy_id": evaluated["id"], "name": evaluated.get("name", ""),
        "question": evaluated["question"], "options": evaluated["options"], "examples": evaluated.get("examples") or [],
        "readout": readout, "debias": debias, "permute": bool(cfg["permute"]),
        "prompt_version": first["response"].get("prompt_version") or PROMPT_VERSIONS[readout],
        "model": {"file": model["file"], "sha256": model["sha256"]}, "temperature": cal["report"].temperature,
        "threshold": threshold, "option_thresholds": option_thresholds or {}, "fallback_option": fallback,
        "target_accuracy": cal["target_accuracy"], "run_id": run_id, "created_at": now(),
        "dataset": {"set_id": run["labeled_set_id"], "name": cfg["dataset_name"], "content_hash": cfg["dataset_hash"],
                    "rows_scored": len(cal["results"])},
    }
    policy = CalibratedPolicy.model_validate(config)
    config["metrics"] = {"at_gate": applied_metrics(policy, cal["results"]),
                         "gate_selection": cal["gate"].to_dict(),
                         **{k: v for k, v in asdict(cal["report"]).items() if k not in ("bins_before", "bins_after")}}
    return CalibratedPolicy.model_validate(config).model_dump(mode="json")


def applied_metrics(policy: CalibratedPolicy, results: list[dict]) -> dict:
    """The exported rule applied to stored raw results: coverage, accuracy of what it decides."""
    decided = correct = gated = 0
    for r in results:
        d = policy.apply({"option_ids": r["option_ids"], "probabilities": r["probabilities"]})
        if d["gated"]:
            gated += 1
        else:
            decided += 1
            correct += d["option_id"] == r["label"]
    n = len(results)
    return {"n": n, "decided": decided, "gated": gated, "coverage": decided / n if n else None,
            "accuracy": correct / decided if decided else None}

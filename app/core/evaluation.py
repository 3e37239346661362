"""Batch evaluation of a policy x labeled set x target, resumable, and the calibration built on it.

A run stores its configuration (set, readout, which rows served as few-shot examples) and writes
each result as it arrives. Resuming skips the rows already scored, and the unique (run, row)
index makes a duplicate impossible, so a run killed half-way loses and duplicates nothing.
"""
from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Literal, Mapping, Sequence

import numpy as np
from pydantic import BaseModel

from adapter.calibrated import SCHEMA_VERSION, CalibratedPolicy, row_inputs
from adapter.prompt import PROMPT_VERSIONS
from adapter.schema import HiddenState
from adapter.templates import request_for

from app.core import calibration, heads
from app.core.labeled import stratified
from app.core.runner import Case, Job, ProgressFn, score_into_runs
from app.core.records import Result, Run
from app.core.stats import SMALL_N, bootstrap_ci, proportion
from app.core.store import Store, now
from app.targets.base import Target
from app.targets.local import LocalTarget

EXAMPLE_SOURCES = ("policy", "train")
ExampleSource = Literal["policy", "train"]


def policy_fingerprint(policy: Mapping[str, Any]) -> str:
    core = {k: policy.get(k) for k in ("question", "options", "examples")}
    return hashlib.sha256(json.dumps(core, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def pick_examples(rows: Sequence[Mapping[str, Any]], n: int) -> list[Mapping[str, Any]]:
    """Up to n train-split rows, round-robin over labels so every option gets an example early."""
    by_label: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("split") == "train":
            by_label[r["label"]].append(r)
    picked: list[Mapping[str, Any]] = []
    while len(picked) < n and any(by_label.values()):
        for label in list(by_label):
            if by_label[label] and len(picked) < n:
                picked.append(by_label[label].pop(0))
    return picked


def plan_eval(policy: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], examples: str = "policy",
              n_examples: int = 4) -> tuple[dict[str, Any], list[Mapping[str, Any]]]:
    """(policy as evaluated, rows to score). Rows of the train split are never scored; with
    examples="train" the few-shot examples come from them instead of the policy's own. The rows to
    score come in stratified order (labeled.stratified): the first ones are a fair sample."""
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
    return evaluated, stratified(scored)


@dataclass(frozen=True)
class Variant:
    """How a run reads the model's answer: readout, position-bias correction, permutation
    (None = the policy's choice, else the model's measured default)."""
    readout: str | None = None
    debias: str | None = None
    permute: bool = False
    few_shot: bool | None = None  # None: the readout's default (option-words shows examples, letters not)

    @property
    def name(self) -> str:
        """'default', 'letters', 'letters + content-free', 'option-words + permutation',
        'letters + examples + content-free'."""
        parts = [self.readout or "default"]
        if self.few_shot is True and self.readout != "option-words":
            parts.append("examples")
        elif self.few_shot is False and self.readout == "option-words":
            parts.append("no examples")
        if self.debias == "content-free" or (self.debias is None and self.readout):
            parts.append(self.debias or "model-default debias")
        if self.permute:
            parts.append("permutation")
        return " + ".join(parts)

    def overrides(self) -> dict:
        return ({"permute": self.permute} | {k: v for k, v in (("readout", self.readout), ("debias", self.debias)) if v}
                | ({"few_shot": self.few_shot} if self.few_shot is not None else {}))


def resolve_variant(variant: Variant, policy: Mapping[str, Any], target) -> Variant | None:
    """What a variant reads on a local target: the policy's readout/correction, else the model's
    measured defaults (the engine's own rule). None for a remote target (its model decides)."""
    if not isinstance(target, LocalTarget):
        return None
    readout, debias = target.engine().settings(request_for(policy, "-", "probe", **variant.overrides()))
    return Variant(readout, debias, variant.permute, variant.few_shot)


def distinct_variants(names: list[str], policy: Mapping[str, Any], target) -> list[tuple[str, str, str | None]]:
    """(variant name, label, None) to score, or (name, label, the earlier variant it reads the same as)
    to skip: 'default' and the readout it stands for on this model are scored once."""
    out: list[tuple[str, str, str | None]] = []
    seen: dict[tuple, str] = {}
    for name in names:
        label = f"{target.name} · {name}"
        real = resolve_variant(VARIANTS[name], policy, target)
        if real is None:  # a remote target: its model decides what 'default' means
            out.append((name, label, None))
            continue
        if real.name != name:
            label += f" (= {real.name} on this model)"
        shows = real.few_shot if real.few_shot is not None else real.readout == "option-words"
        same = seen.setdefault((real.readout, real.debias, real.permute, shows), name)
        out.append((name, label, same if same != name else None))
    return out


VARIANTS = {v.name: v for v in (Variant(), Variant("letters", "none"), Variant("letters", "content-free"),
                                Variant("letters", "none", few_shot=True), Variant("letters", "content-free", few_shot=True),
                                Variant("option-words", "none"), Variant("option-words", "content-free"),
                                Variant("letters", "none", True), Variant("option-words", "none", True))}


class EvalRunConfig(BaseModel):
    """What an evaluation run scored and how: stored with the run, read back by resume, the
    calibration views and the export."""
    readout: str | None = None
    debias: str | None = None
    permute: bool = False
    few_shot: bool | None = None
    examples: ExampleSource = "policy"
    n_examples: int = 4
    policy_fingerprint: str
    evaluated_policy: dict
    row_keys: list[str]
    dataset_hash: str
    dataset_name: str

    @property
    def variant(self) -> Variant:
        return Variant(self.readout, self.debias, self.permute, self.few_shot)


def run_config(run: Mapping[str, Any]) -> EvalRunConfig:
    return EvalRunConfig.model_validate(run["config"])


def variant_name(cfg: Mapping[str, Any]) -> str:
    """'letters + content-free', 'default + permutation': how a run read the model's answer."""
    return Variant(cfg.get("readout"), cfg.get("debias"), bool(cfg.get("permute")), cfg.get("few_shot")).name


def label_mismatch(policy: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a labeled set cannot evaluate this policy (its labels are not the policy's options), or None."""
    ids = [o["id"] for o in policy["options"]]
    foreign = sorted({r["label"] for r in rows} - set(ids))
    if not foreign:
        return None
    return (f"the set's labels {', '.join(foreign)} are not options of '{policy.get('name') or policy['id']}' "
            f"({', '.join(ids)}): pick the set made for this policy")


def find_run(store: Store, *, policy: Mapping[str, Any], set_id: int, target_name: str, variant: Variant,
             examples: str = "policy") -> Run | None:
    """The latest eval run with the same policy content, set, target and variant."""
    fp = policy_fingerprint(policy)
    for run in store.list_runs(kind="eval"):
        c = run.get("config") or {}
        if (run["labeled_set_id"] == set_id and run["target_name"] == target_name and c.get("policy_fingerprint") == fp
                and (c.get("readout"), c.get("debias"), bool(c.get("permute")), c.get("few_shot"))
                == (variant.readout, variant.debias, variant.permute, variant.few_shot)
                and c.get("examples") == examples):
            return run
    return None


def start_eval(store: Store, *, policy: Mapping[str, Any], set_id: int, target: Target, variant: Variant = Variant(),
               examples: ExampleSource = "policy", n_examples: int = 4, kind: str = "eval") -> int:
    """A new evaluation run (kind "eval"; `python -m app check` makes kind "check", one per CI run)."""
    rows = store.labeled_rows(set_id)
    problem = label_mismatch(policy, rows)
    if problem:
        raise ValueError(problem)
    evaluated, scored = plan_eval(policy, rows, examples, n_examples)
    labeled: Mapping[str, Any] = store.get_labeled_set(set_id) or {}
    config = EvalRunConfig(readout=variant.readout, debias=variant.debias, permute=variant.permute,
                           few_shot=variant.few_shot, examples=examples,
                           n_examples=n_examples, policy_fingerprint=policy_fingerprint(policy),
                           evaluated_policy=evaluated, row_keys=[r["row_key"] for r in scored],
                           dataset_hash=labeled.get("content_hash", ""), dataset_name=labeled.get("name", ""))
    return store.create_run(kind=kind, policy=policy, target=target.describe(), n_rows=len(scored),
                            labeled_set_id=set_id, config=config.model_dump())


def find_or_start(store: Store, *, policy: Mapping[str, Any], set_id: int, target: Target, variant: Variant = Variant(),
                  examples: ExampleSource = "policy", n_examples: int = 4, new_run: bool = False) -> tuple[int, bool]:
    """(run id, resumed?): the matching earlier run, else a new one. What the Calibrate page and
    `python -m app calibrate` both do before scoring."""
    run = None if new_run else find_run(store, policy=policy, set_id=set_id, target_name=target.name, variant=variant,
                                        examples=examples)
    if run:
        return run["id"], True
    return start_eval(store, policy=policy, set_id=set_id, target=target, variant=variant, examples=examples,
                      n_examples=n_examples), False


def resume_eval(store: Store, run_id: int, target: Target, progress: ProgressFn | None = None, *,
                reuse: bool = True) -> dict:
    """Score the rows of an eval run that have no successful result yet; safe to call again (and
    from two processes: the second gets RunBusy instead of scoring the same rows). With `reuse`, a
    row whose request was already answered by the same model (in any run) is copied, not scored:
    `evaluated` counts the target's calls, `reused` the copies. Rows ask for their hidden state where
    the target can return it: what a learned head is fitted on (the probabilities are the same bits)."""
    run = store.get_run(run_id)
    if run is None:
        raise ValueError(f"no run #{run_id}")
    cfg = run_config(run)
    by_key = {r["row_key"]: r for r in store.labeled_rows(run["labeled_set_id"])}
    done = store.done_keys(run_id)
    todo = [(pos, by_key[k]) for pos, k in enumerate(cfg.row_keys) if k not in done]
    extra = {"hidden_state": True} if target.returns_hidden() else {}
    items = ((pos, Case(r["row_key"], r["state"], r["label"]),
              request_for(cfg.evaluated_policy, r["state"], r["row_key"], **cfg.variant.overrides(), **extra))
             for pos, r in todo)
    counts = score_into_runs(store, [Job(run_id, target)], items, total=len(cfg.row_keys),
                             already=len(cfg.row_keys) - len(todo), progress=progress, reuse=reuse)[run_id]
    errors = sum(1 for r in store.results(run_id) if r["error"])
    return {"scored": len(todo), "skipped": len(cfg.row_keys) - len(todo), "errors": errors, **counts}


# -- calibration on a finished run -----------------------------------------------------------------
def scored_probabilities(result: Mapping[str, Any], family: str) -> list[float] | None:
    """A stored result's probabilities as one family of scores reads them: its own when it was
    scored that way, the uncorrected ones kept beside the content-free correction for `none`."""
    response = result.get("response") if isinstance(result.get("response"), dict) else {}
    scored_as = (response or {}).get("debias") or "none"
    if family == scored_as:
        return result["probabilities"]
    if family == "none" and scored_as == "content-free":
        return (response or {}).get("uncorrected_probabilities")
    return None


def arrays(store: Store, run_id: int) -> tuple[np.ndarray, np.ndarray, list[str], list[Result]]:
    """(P, y, option ids, results used): rows that errored or whose label is not an option are left out."""
    run: Mapping[str, Any] = store.get_run(run_id) or {}
    ids = [o["id"] for o in run["policy"]["options"]]
    used = [r for r in store.results(run_id) if not r["error"] and r["probabilities"] and r["label"] in ids]
    P = np.array([r["probabilities"] for r in used], float).reshape(-1, len(ids))
    y = np.array([ids.index(r["label"]) for r in used], int)
    return P, y, ids, used


def families(results: Sequence[Mapping[str, Any]], k: int) -> dict[str, np.ndarray]:
    """The score families every used row has: the scored one, and `none` beside content-free."""
    out = {}
    for family in ("content-free", "none"):
        rows = [scored_probabilities(r, family) for r in results]
        if rows and all(p is not None and len(p) == k for p in rows):
            out[family] = np.array(rows, float)
    return out


def hidden_states(results: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray | None, str]:
    """(the rows' hidden states as one matrix, "") or (None, why not): every row must carry one."""
    vectors = []
    for r in results:
        raw = (r.get("response") or {}).get("hidden_state") if isinstance(r.get("response"), dict) else None
        if not isinstance(raw, dict):
            return None, ("the run's rows were scored without their hidden state (a run made before learned heads, "
                          "or a target that cannot return it): evaluate again with a new run on a local model or "
                          "a SemIf adapter")
        vectors.append(HiddenState.model_validate(raw).array())
    if len({len(v) for v in vectors}) > 1:
        return None, "the run's rows carry hidden states of different widths (more than one model)"
    return (np.array(vectors) if vectors else None), ""


def head_candidates(results: Sequence[Mapping[str, Any]], P: np.ndarray, y: np.ndarray, ids: list[str], *,
                    seed: int = 0) -> list[heads.HeadFit]:
    """The learned heads of a run, out of fold; unavailable (with the reason) where its rows cannot
    support one."""
    hidden, why = hidden_states(results)
    response: Mapping[str, Any] = next((r["response"] for r in results if isinstance(r.get("response"), dict)), {})
    sha, version = (response.get("model") or {}).get("sha256"), response.get("prompt_version")
    if not sha or not version:
        return [heads.HeadFit(k, False, "the results name no model sha256 and prompt version (not a llama.cpp target)")
                for k in heads.HEAD_KINDS]
    return heads.candidates(hidden, P, y, option_ids=ids, model_sha256=sha, prompt_version=version, seed=seed,
                            no_hidden=why)


def calibrate_run(store: Store, run_id: int, *, target_accuracy: float = 0.9, per_option: bool = False,
                  seed: int = 0, head: str = "auto", with_heads: bool = True) -> dict:
    """Everything the Calibrate page and the CLI show: the corrections and learned heads compared out
    of fold and the one chosen, metrics before/after it, the gate on the corrected probabilities. A head
    is judged, gated and measured on its out-of-fold probabilities only (on the rows it was fitted on
    it would look far better than it is). `head`: "auto" (the rule), "none", or a kind to export;
    `with_heads=False` fits none (a quick look: the side-by-side table, the numbers while a run is scored)."""
    P, y, ids, used = arrays(store, run_id)
    if len(y) < 4:
        raise ValueError(f"run {run_id} has {len(y)} usable labeled results; at least 4 are needed")
    fams = families(used, len(ids)) or {"none": P}
    cands = calibration.corrections(fams, y, seed=seed)
    chosen, why = calibration.choose_correction(cands, len(y))
    fits = head_candidates(used, P, y, ids, seed=seed) if with_heads else []
    assert chosen.oof is not None
    choice = heads.choose(fits, chosen.oof, chosen.name, y, seed=seed, want=head)
    if choice.head is not None:
        rep, oof = calibration.report(P, y, seed=seed, method=f"head:{choice.head.kind}", oof=choice.head.oof)
        cal = oof
    else:
        rep, oof = calibration.report(fams[chosen.family], y, seed=seed, method=chosen.method)
        cal = calibration.apply_temperature(fams[chosen.family], rep.temperature, np.array(rep.offsets))
    rep.accuracy = calibration.accuracy(P, y)  # "all rows, before any gate" means as scored
    rep.confusion = calibration.confusion_matrix(y, calibration.predictions(P), len(ids)).tolist()
    conf, correct = cal.max(axis=1), calibration.predictions(cal) == y
    gate = calibration.choose_gate(conf, correct, target_accuracy, seed=seed, y=y)
    option_gates = {}
    if per_option:
        option_gates = {ids[c]: g for c, g in calibration.per_option_gates(cal, y, target_accuracy, seed=seed).items()}
    curve = calibration.risk_coverage(conf, correct)
    return {"report": rep, "gate": gate, "option_gates": option_gates, "curve": curve, "option_ids": ids,
            "calibrated": cal, "oof": oof, "P": P, "y": y, "results": used, "target_accuracy": target_accuracy,
            "corrections": cands, "correction": chosen, "correction_why": why,
            "heads": fits, "head": choice.head, "head_why": choice.why, "head_gain": choice.gain,
            "candidate_intervals": candidate_intervals([*cands, *fits], y, seed=seed),
            "intervals": intervals(P, y, oof, seed=seed)}


def candidate_intervals(cands: Sequence[Any], y: np.ndarray, *, seed: int = 0) -> dict[str, dict]:
    """Per candidate (correction or head, by name): out-of-fold accuracy with its Wilson interval,
    macro-F1 and ECE with bootstrap intervals - what Calibrate's comparison table shows."""
    out = {}
    rows = np.arange(len(y))
    for c in cands:
        if not c.available or c.oof is None:
            continue
        pred, k = calibration.predictions(c.oof), c.oof.shape[1]
        conf, right = c.oof.max(axis=1), pred == y
        f1 = bootstrap_ci(rows, lambda i: calibration.macro_f1(y[i], pred[i], k), seed=seed, n_resamples=400)
        ece = bootstrap_ci(rows, lambda i: calibration.ece(conf[i], right[i]), seed=seed, n_resamples=400)
        out[c.name] = {"accuracy": proportion(int(right.sum()), len(y)).to_dict(),
                       "macro_f1": calibration.macro_f1(y, pred, k), "macro_f1_ci": f1,
                       "ece": calibration.ece(conf, right), "ece_ci": ece}
    return out


def intervals(P: np.ndarray, y: np.ndarray, oof: np.ndarray, *, seed: int = 0) -> dict:
    """95% intervals of a run's headline numbers: Wilson for accuracy, a percentile bootstrap over the
    rows for macro-F1 and the ECE before and after the correction (out of fold)."""
    pred, k, rows = calibration.predictions(P), P.shape[1], np.arange(len(y))
    conf, correct = P.max(axis=1), pred == y
    oconf, ocorrect = oof.max(axis=1), calibration.predictions(oof) == y

    def boot(stat) -> list[float] | None:
        ci = bootstrap_ci(rows, stat, seed=seed)
        return None if ci is None else [ci[0], ci[1]]

    return {"n": int(len(y)), "accuracy": proportion(int(correct.sum()), len(y)).to_dict(),
            "macro_f1": boot(lambda i: calibration.macro_f1(y[i], pred[i], k)),
            "ece": boot(lambda i: calibration.ece(conf[i], correct[i])),
            "ece_corrected": boot(lambda i: calibration.ece(oconf[i], ocorrect[i]))}


@dataclass
class GateDecision:
    """The gate an export gets, and how it was chosen - recorded in the policy file."""
    threshold: float
    source: Literal["recommended", "hand-set", "unreachable"]
    messages: list[str]  # what to tell the analyst, most important first


def nothing_decided(at_gate: dict, fallback: str) -> str | None:
    """What a gate that decides none of the rows means, said before anyone saves it (saving stays
    allowed: sending everything to the fallback is safe); None when the gate decides some rows."""
    if at_gate["decided"]:
        return None
    return (f"This gate decides none of the {at_gate['n']} rows: saved as it is, the adapter sends every decision "
            f"to {fallback}. That is safe - nothing is decided wrongly - but it automates nothing. Set a lower "
            "gate by hand, or score more labeled rows, another readout or another model.")


def decide_gate(cal: dict, manual: float | None = None) -> GateDecision:
    """The threshold decision shared by the page and the CLI: the recommended gate when the target
    is reachable on enough rows, a hand-set one when given, else 1.0 (everything to the fallback)."""
    rep, gate, target = cal["report"], cal["gate"], cal["target_accuracy"]
    notes = []
    if rep.size_flag == "provisional":
        notes.append(f"{rep.n} labeled rows: treat the gate as provisional (< {calibration.PROVISIONAL})")
    if calibration.at_upper_bound(rep.temperature):
        notes.append(f"the temperature hit its upper bound ({calibration.T_MAX:g}): these probabilities carry almost "
                     "no information about correctness")
    too_few = (f"no gate recommended: only {rep.n} labeled rows were scored (at least {calibration.SMALL} are "
               "needed; a set's train split is never scored) - evaluate a larger set")
    if manual is not None:
        return GateDecision(float(manual), "hand-set", ([too_few] if rep.size_flag == "too-small" else []) + notes)
    if rep.size_flag == "too-small":  # the row count is the reason, whatever the target accuracy
        return GateDecision(1.0, "unreachable", [too_few + "; the exported policy sends every case to the fallback",
                                                 *notes])
    if gate.reachable:
        notes.insert(0, f"gate for {target:.0%}: confidence >= {gate.threshold:.3f}; held-out accuracy "
                        f"{gate.holdout_accuracy:.1%} at coverage {gate.holdout_coverage:.1%} "
                        f"({gate.holdout_accepted}/{gate.holdout_n} held-out rows decided)")
        return GateDecision(float(gate.threshold), "recommended", notes)
    notes.insert(0, f"target {target:.0%} unreachable: {gate.note or 'too few rows'}; the exported policy sends every "
                    "case to the fallback")
    return GateDecision(1.0, "unreachable", notes)


def readout_table(store: Store, runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per eval run (same policy x set): readout, rows, accuracy, macro-F1, ECE before/after
    temperature, NLL - the side-by-side the analyst picks a readout from."""
    rows = []
    for r in runs:
        cfg = r.get("config") or {}
        version = (r.get("policy") or {}).get("version")
        base = {"run": r["id"], "policy version": f"v{version}" if version else "v?", "target": r["target_name"],
                "readout": variant_name(cfg),
                "examples": cfg.get("examples"), "status": r["status"]}
        try:
            cal = calibrate_run(store, r["id"], target_accuracy=0.9, with_heads=False)
            rep = cal["report"]
        except ValueError as exc:  # not enough usable rows yet
            rows.append({**base, "status": f"{r['status']}: {exc}"})
            continue
        rows.append({**base, "rows": rep.n, "accuracy": rep.accuracy, "macro_f1": rep.macro_f1, "ece": rep.ece_width,
                     "ece_corrected": rep.oof_ece_width, "nll": rep.nll, "correction": cal["correction"].name,
                     "accuracy_corrected": cal["correction"].oof_accuracy})
    return rows


def build_policy(store: Store, run_id: int, cal: dict, *, gate: GateDecision, fallback: str,
                 option_thresholds: dict[str, float] | None = None) -> dict:
    """The versioned policy config for this run and gate (validated by adapter.calibrated), with
    how the gate was chosen: the target accuracy is recorded only when it chose the gate."""
    run: Mapping[str, Any] = store.get_run(run_id) or {}
    cfg = run_config(run)
    evaluated = cfg.evaluated_policy
    first = next((r for r in cal["results"] if isinstance(r.get("response"), dict) and r["response"].get("model")), None)
    if first is None:
        raise ValueError("no stored result names its model (file + sha256): run the evaluation on a llama.cpp target")
    response = first["response"]
    readout = cfg.readout or response.get("readout")
    chosen: calibration.Correction = cal["correction"]
    head: heads.HeadFit | None = cal.get("head")
    # a head reads the probabilities as scored; a correction the family it was fitted on
    debias = (response.get("debias") or "none") if head is not None else chosen.family
    config = {
        "schema_version": SCHEMA_VERSION, "policy_id": evaluated["id"], "name": evaluated.get("name", ""),
        "policy_version": (run.get("policy") or {}).get("version"),
        "question": evaluated["question"], "options": evaluated["options"], "examples": evaluated.get("examples") or [],
        "readout": readout, "debias": debias, "permute": cfg.permute,
        "few_shot": (first.get("request") or {}).get("few_shot") if isinstance(first.get("request"), dict) else None,
        "guard": evaluated.get("guard") or "none",
        "prompt_version": response.get("prompt_version") or PROMPT_VERSIONS[readout],
        "model": {"file": response["model"]["file"], "sha256": response["model"]["sha256"]},
        "temperature": cal["report"].temperature, "threshold": gate.threshold, "gate_source": gate.source,
        "option_offsets": ({oid: b for oid, b in zip(cal["option_ids"], chosen.offsets)}
                           if chosen.method == "fitted" and head is None else {}),
        "head": head.head.model_dump() if head is not None and head.head is not None else None,
        "option_thresholds": option_thresholds or {}, "fallback_option": fallback,
        "target_accuracy": None if gate.source == "hand-set" else cal["target_accuracy"],
        "run_id": run_id, "created_at": now(),
        "dataset": {"set_id": run["labeled_set_id"], "name": cfg.dataset_name, "content_hash": cfg.dataset_hash,
                    "rows_scored": len(cal["results"])},
    }
    policy = CalibratedPolicy.model_validate(config)
    fitted = applied_metrics(policy, cal["results"])
    config["metrics"] = {"at_gate": fitted if head is None else applied_metrics(policy, cal["results"], oof=cal["oof"]),
                         **({"at_gate_fitted_rows": fitted} if head is not None else {}),
                         "intervals": cal.get("intervals"),
                         "gate_selection": cal["gate"].to_dict(),
                         "correction": {"chosen": head.name if head is not None else chosen.name,
                                        "why": cal["correction_why"],
                                        "candidates": [{k: v for k, v in c.to_dict().items() if k != "oof_confusion"}
                                                       for c in cal["corrections"]]},
                         "head": {"why": cal.get("head_why"), "candidates": [f.to_dict() for f in cal.get("heads", [])],
                                  "gain": asdict(cal["head_gain"]) if cal.get("head_gain") is not None else None},
                         **{k: v for k, v in asdict(cal["report"]).items() if k not in ("bins_before", "bins_after")}}
    return CalibratedPolicy.model_validate(config).model_dump(mode="json")


def applied_metrics(policy: CalibratedPolicy, results: Sequence[Mapping[str, Any]],
                    oof: np.ndarray | None = None) -> dict[str, Any]:
    """The exported rule applied to stored raw results: coverage, accuracy of what it decides - each
    with its Wilson 95% interval, and `small_n` when fewer than 30 rows are decided (an accuracy that
    rests on a handful of rows is marked as such wherever it is shown). With `oof` (a head's
    out-of-fold probabilities, one row per result) the same gate and fallback rule decides on those
    instead: what the head does on rows it never saw."""
    rule = policy if oof is None else policy.model_copy(update={"head": None, "temperature": 1.0, "option_offsets": {}})
    decided = correct = gated = 0
    for i, r in enumerate(results):
        response = r.get("response") if isinstance(r.get("response"), dict) else None
        probs = [float(p) for p in oof[i]] if oof is not None else scored_probabilities(r, policy.debias) or r["probabilities"]
        d = rule.apply(r["option_ids"], probs, guard=(response or {}).get("guard"),
                       **(row_inputs(response) if response and oof is None else {}))
        if d["gated"]:
            gated += 1
        else:
            decided += 1
            correct += d["option_id"] == r["label"]
    n = len(results)
    return {"n": n, "decided": decided, "gated": gated, "coverage": decided / n if n else None,
            "accuracy": correct / decided if decided else None, "correct": correct,
            "accuracy_interval": proportion(correct, decided).to_dict(),
            "coverage_interval": proportion(decided, n).to_dict(), "small_n": decided < SMALL_N}


def gate_preview(calibrated: Sequence[Mapping[str, Any]], policy_id: str,
                 result: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, Any]] | None:
    """What the newest saved calibrated policy of this policy would do with a result: (its record,
    the decision {option_id, confidence, gated, reason}) - only when it was calibrated on the model
    that answered and its readout and correction can be read from the result; None otherwise."""
    response = result.get("response") if isinstance(result.get("response"), dict) else None
    model = (response or {}).get("model") or {}
    for rec in calibrated:
        if rec.get("policy_id") != policy_id or rec.get("model_sha256") != model.get("sha256"):
            continue
        policy = CalibratedPolicy.model_validate(rec["config"])
        probs = scored_probabilities(result, policy.debias)
        if probs is None or (response or {}).get("readout") != policy.readout or not policy.matches(result["option_ids"]):
            return None
        return rec, policy.apply(result["option_ids"], probs, model.get("sha256"), model.get("file"),
                                 (response or {}).get("guard"), **row_inputs(response or {}))
    return None

"""Evaluation runs: a policy x labeled set x target scored row by row, resumable.

A run stores its configuration (set, readout, which rows served as few-shot examples) and writes
each result as it arrives. Resuming skips the rows already scored, and the unique (run, row)
index makes a duplicate impossible, so a run killed half-way loses and duplicates nothing. What
the calibration reads back from a run (its probabilities per score family, its hidden states) is
here too; the calibration and the exported policy are in app/core/run_calibration.py.
"""
from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Collection, Literal, Mapping, Sequence, cast

import numpy as np
from pydantic import BaseModel

from adapter.schema import HEAD_LAYOUT, HiddenState
from adapter.engine.templates import request_for

from app.core.labeled import stratified
from app.core.runner import Case, Job, ProgressFn, score_into_runs
from app.core.records import Result, Run, RunConfig, config_of
from app.core.store import Store
from app.core.stored import NO_RESPONSE, StoredResponse
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
    layout: str | None = None  # "policy-first": the head layout, read only by a learned head

    @property
    def head_layout(self) -> bool:
        return self.layout == HEAD_LAYOUT

    @property
    def name(self) -> str:
        """'default', 'letters', 'letters + content-free', 'option-words + permutation',
        'letters + examples + content-free', 'head layout'."""
        if self.head_layout:
            return HEAD_VARIANT_NAME
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

    def overrides(self) -> dict[str, Any]:
        if self.head_layout:  # what DecisionRequest.in_head_layout sets
            return {"readout": "letters", "debias": "none", "permute": False, "layout": HEAD_LAYOUT, "hidden_state": True}
        return ({"permute": self.permute} | {k: v for k, v in (("readout", self.readout), ("debias", self.debias)) if v}
                | ({"few_shot": self.few_shot} if self.few_shot is not None else {}))


def resolve_variant(variant: Variant, policy: Mapping[str, Any], target: Target) -> Variant | None:
    """What a variant reads on a local target: the policy's readout/correction, else the model's
    measured defaults (the engine's own rule). None for a remote target (its model decides)."""
    if not isinstance(target, LocalTarget):
        return None
    engine = cast(Callable[[], Any], target.engine)()  # LocalTarget.engine: the loaded model's engine
    readout, debias = engine.settings(request_for(policy, "-", "probe", **variant.overrides()))
    return Variant(readout, debias, variant.permute, variant.few_shot)


def distinct_variants(names: list[str], policy: Mapping[str, Any], target: Target) -> list[tuple[str, str, str | None]]:
    """(variant name, label, None) to score, or (name, label, the earlier variant it reads the same as)
    to skip: 'default' and the readout it stands for on this model are scored once."""
    out: list[tuple[str, str, str | None]] = []
    seen: dict[tuple[Any, ...], str] = {}
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


HEAD_VARIANT_NAME = "head layout (policy first, read by a learned head)"
HEAD_VARIANT = Variant("letters", "none", layout=HEAD_LAYOUT)  # never offered zero-shot: not in VARIANTS
VARIANTS = {v.name: v for v in (Variant(), Variant("letters", "none"), Variant("letters", "content-free"),
                                Variant("letters", "none", few_shot=True), Variant("letters", "content-free", few_shot=True),
                                Variant("option-words", "none"), Variant("option-words", "content-free"),
                                Variant("letters", "none", True), Variant("option-words", "none", True))}


class EvalRunConfig(BaseModel):
    """What an evaluation run scored and how: stored with the run, read back by resume, the
    calibration views and the export. The eval kind's part of records.RunConfig, parsed (pydantic:
    the defaults of rows stored before a field existed, and a run of another kind refused)."""
    readout: str | None = None
    debias: str | None = None
    permute: bool = False
    few_shot: bool | None = None
    examples: ExampleSource = "policy"
    n_examples: int = 4
    layout: str | None = None  # "policy-first": the head layout (read only by a learned head)
    companion_of: int | None = None  # a head-layout run scored row by row beside this run of the same set
    policy_fingerprint: str
    evaluated_policy: dict[str, Any]
    row_keys: list[str]
    dataset_hash: str
    dataset_name: str

    @property
    def variant(self) -> Variant:
        return Variant(self.readout, self.debias, self.permute, self.few_shot, self.layout)

    def stored(self) -> RunConfig:
        """What the run stores (its keys are RunConfig's: tests/test_stored_response.py checks that)."""
        return cast(RunConfig, self.model_dump())


def run_config(run: Mapping[str, Any]) -> EvalRunConfig:
    """An eval run's configuration, validated (pydantic: ValidationError for a run of another kind)."""
    return EvalRunConfig.model_validate(config_of(run))


def variant_name(cfg: RunConfig) -> str:
    """'letters + content-free', 'default + permutation', 'head layout ...': how a run read the model's answer."""
    return Variant(cfg.get("readout"), cfg.get("debias"), bool(cfg.get("permute")), cfg.get("few_shot"),
                   cfg.get("layout")).name


def is_head_layout(run: Mapping[str, Any]) -> bool:
    """A run scored in the head layout: only a learned head reads it (no zero-shot numbers from it)."""
    return config_of(run).get("layout") == HEAD_LAYOUT


def label_mismatch(policy: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a labeled set cannot evaluate this policy (its labels are not the policy's options), or None."""
    ids = [o["id"] for o in policy["options"]]
    foreign = sorted({r["label"] for r in rows} - set(ids))
    if not foreign:
        return None
    return (f"the set's labels {', '.join(foreign)} are not options of '{policy.get('name') or policy['id']}' "
            f"({', '.join(ids)}): pick the set made for this policy")


def same_version(policy: Mapping[str, Any], run: Mapping[str, Any]) -> bool:
    """Did the run evaluate this policy as saved now: the same question, options and examples, and the
    same saved version (a run or policy from before versions: the content alone)?"""
    if config_of(run).get("policy_fingerprint") != policy_fingerprint(policy):
        return False
    saved, ran = policy.get("version"), (run.get("policy") or {}).get("version")
    if ran is None:  # a run of a policy copy without its version: it can only have been the first
        return saved is None or saved == 1
    return saved is None or saved == ran


def find_run(store: Store, *, policy: Mapping[str, Any], set_id: int, target_name: str, variant: Variant,
             examples: str = "policy") -> Run | None:
    """The latest eval run of the same policy version and content, set, target and variant."""
    fp = policy_fingerprint(policy)
    for run in store.list_runs(kind="eval"):
        c = config_of(run)
        if (run["labeled_set_id"] == set_id and run["target_name"] == target_name and c.get("policy_fingerprint") == fp
                and same_version(policy, run)
                and (c.get("readout"), c.get("debias"), bool(c.get("permute")), c.get("few_shot"), c.get("layout"))
                == (variant.readout, variant.debias, variant.permute, variant.few_shot, variant.layout)
                and c.get("examples") == examples):
            return run
    return None


def start_eval(store: Store, *, policy: Mapping[str, Any], set_id: int, target: Target, variant: Variant = Variant(),
               examples: ExampleSource = "policy", n_examples: int = 4, kind: str = "eval",
               companion_of: int | None = None) -> int:
    """A new evaluation run (kind "eval"; `python -m app check` makes kind "check", one per CI run)."""
    rows = store.labeled_rows(set_id)
    problem = label_mismatch(policy, rows)
    if problem:
        raise ValueError(problem)
    evaluated, scored = plan_eval(policy, rows, examples, n_examples)
    labeled: Mapping[str, Any] = store.get_labeled_set(set_id) or {}
    config = EvalRunConfig(readout=variant.readout, debias=variant.debias, permute=variant.permute,
                           few_shot=variant.few_shot, examples=examples, layout=variant.layout,
                           companion_of=companion_of, n_examples=n_examples, policy_fingerprint=policy_fingerprint(policy),
                           evaluated_policy=evaluated, row_keys=[r["row_key"] for r in scored],
                           dataset_hash=labeled.get("content_hash", ""), dataset_name=labeled.get("name", ""))
    return store.create_run(kind=kind, policy=policy, target=target.describe(), n_rows=len(scored),
                            labeled_set_id=set_id, config=config.stored())


def find_or_start(store: Store, *, policy: Mapping[str, Any], set_id: int, target: Target, variant: Variant = Variant(),
                  examples: ExampleSource = "policy", n_examples: int = 4, new_run: bool = False,
                  companion_of: int | None = None) -> tuple[int, bool]:
    """(run id, resumed?): the matching earlier run, else a new one. What the Calibrate page and
    `python -m app calibrate` both do before scoring."""
    run = None if new_run else find_run(store, policy=policy, set_id=set_id, target_name=target.name, variant=variant,
                                        examples=examples)
    if run:
        return run["id"], True
    return start_eval(store, policy=policy, set_id=set_id, target=target, variant=variant, examples=examples,
                      n_examples=n_examples, companion_of=companion_of), False


def resume_eval(store: Store, run_id: int, target: Target, progress: ProgressFn | None = None, *,
                reuse: bool = True) -> dict[str, int]:
    """Score the rows of an eval run that have no successful result yet; safe to call again (and
    from two processes: the second gets RunBusy instead of scoring the same rows). With `reuse`, a
    row whose request was already answered by the same model (in any run) is copied, not scored:
    `evaluated` counts the target's calls, `reused` the copies. Rows ask for their hidden state where
    the target can return it: what a learned head is fitted on (the probabilities are the same bits)."""
    return resume_evals(store, [(run_id, target)], progress, reuse=reuse)[run_id]


def resume_evals(store: Store, pairs: Sequence[tuple[int, Target]], progress: ProgressFn | None = None, *,
                 reuse: bool = True, by_source: bool = False,
                 only: Collection[str] | None = None) -> dict[int, dict[str, int]]:
    """`resume_eval` for a run and its head-layout companions (the same policy, set and rows): each row is
    scored on every run before the next row, so a run stopped early is a fair sample for every source -
    or, `by_source`, every row on one run before the next (one model in use at a time: no reload per row).
    `only`: score only these row keys (the rows a main run holds, for its companions).
    Progress counts calls (rows x runs); a local target gets its rows SM_SEMIF_ROW_BATCH at a time (runner
    `blocks`). Returns {run id: counts}."""
    runs_ = [store.get_run(run_id) for run_id, _ in pairs]
    missing = [run_id for (run_id, _), run in zip(pairs, runs_) if run is None]
    if missing:
        raise ValueError(f"no run #{missing[0]}")
    cfgs = [run_config(run) for run in runs_ if run is not None]
    main = cfgs[0]
    if any(c.row_keys != main.row_keys for c in cfgs[1:]):
        raise ValueError("runs scored together must have the same rows: they evaluate one policy on one set")
    first: Mapping[str, Any] = runs_[0] or {}
    by_key = {r["row_key"]: r for r in store.labeled_rows(first["labeled_set_id"])}
    dones = [frozenset(store.done_keys(run_id)) for run_id, _ in pairs]
    keys = [k for k in main.row_keys if only is None or k in only]
    todo = [(pos, by_key[k]) for pos, k in enumerate(main.row_keys)
            if (only is None or k in only) and any(k not in d for d in dones)]
    target = pairs[0][1]
    extra = {"hidden_state": True} if target.returns_hidden() and not main.variant.head_layout else {}
    items = ((pos, Case(r["row_key"], r["state"], r["label"]),
              request_for(main.evaluated_policy, r["state"], r["row_key"], **main.variant.overrides(), **extra))
             for pos, r in todo)
    jobs = [Job(run_id, t, head_layout=cfg.variant.head_layout, done=done)
            for (run_id, t), cfg, done in zip(pairs, cfgs, dones)]
    counts = score_into_runs(store, jobs, items, total=len(keys), already=len(keys) - len(todo),
                             progress=progress, reuse=reuse, by_source=by_source, blocks=True)
    out: dict[int, dict[str, int]] = {}
    for (run_id, _), done in zip(pairs, dones):
        errors = sum(1 for r in store.results(run_id) if r["error"])
        out[run_id] = {"scored": len(keys) - len(done & set(keys)), "skipped": len(done & set(keys)), "errors": errors,
                       **counts[run_id]}
    return out


# -- what a calibration reads back from a run ------------------------------------------------------
def scored_probabilities(result: Mapping[str, Any], family: str) -> list[float] | None:
    """A stored result's probabilities as one family of scores reads them: its own when it was
    scored that way, the uncorrected ones kept beside the content-free correction for `none`."""
    response = StoredResponse.of(result) or NO_RESPONSE
    if family == response.scored_as:
        return cast("list[float] | None", result["probabilities"])
    if family == "none" and response.scored_as == "content-free":
        return response.uncorrected_probabilities
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
        hidden = (StoredResponse.of(r) or NO_RESPONSE).hidden_state
        if hidden is None:
            return None, ("the run's rows were scored without their hidden state (a run made before learned heads, "
                          "or a target that cannot return it): evaluate again with a new run on a local model or "
                          "a SemIf adapter")
        vectors.append(hidden.array())
    if len({len(v) for v in vectors}) > 1:
        return None, "the run's rows carry hidden states of different widths (more than one model)"
    return (np.array(vectors) if vectors else None), ""



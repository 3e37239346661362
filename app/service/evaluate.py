"""Calibrating a policy: evaluate it on a labeled set (several targets x readouts, resumable), then
calibrate a run (corrections compared out of fold, the gate on the corrected probabilities), then
export the calibrated policy the adapter enforces. The page and `python -m app calibrate` call these."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from app.core import evaluation
from app.core.evaluation import EXAMPLE_SOURCES as EXAMPLE_SOURCES
from app.core.evaluation import VARIANTS as VARIANTS
from app.core.evaluation import GateDecision, nothing_decided
from app.core.evaluation import Variant as Variant
from app.core.evaluation import label_mismatch as label_mismatch
from app.core.runner import ProgressFn
from app.core.store import RunBusy, Store
from app.targets.base import Target

Policy = dict[str, Any]


@dataclass
class EvalOutcome:
    """One target x readout of an evaluation: its run and what scoring it did, or why not."""
    label: str
    run_id: int | None = None
    resumed: bool = False
    counts: dict[str, int] = field(default_factory=dict)  # scored, skipped, evaluated, reused, errors
    same_as: str | None = None  # not scored: reads the same as this earlier variant
    error: str | None = None

    def text(self) -> str:
        if self.same_as:
            return f"{self.label}: the same readings as {self.same_as} - not scored twice"
        if self.error:
            return f"{self.label}: {self.error}"
        c = self.counts
        return (f"{self.label}: done — scored {c.get('scored', 0)} ({c.get('evaluated', 0)} evaluated, "
                f"{c.get('reused', 0)} copied from stored results), reused {c.get('skipped', 0)}, errors "
                f"{c.get('errors', 0)}")


def evaluate_one(store: Store, policy: Policy, set_id: int, target: Target, variant: Variant, *,
                 examples: str = "policy", n_examples: int = 4, new_run: bool = False, reuse: bool = True,
                 progress: ProgressFn | None = None, label: str = "") -> EvalOutcome:
    """Find the matching run (or start one) and score the rows it still lacks. ValueError when the
    set cannot evaluate this policy; RunBusy when another worker scores the run."""
    run_id, resumed = evaluation.find_or_start(store, policy=policy, set_id=set_id, target=target, variant=variant,
                                               examples=examples, n_examples=n_examples, new_run=new_run)  # type: ignore[arg-type]
    counts = evaluation.resume_eval(store, run_id, target, progress, reuse=reuse)
    return EvalOutcome(label or f"{target.name} · {variant.name}", run_id, resumed, counts)


def evaluate(store: Store, policy: Policy, set_id: int, targets: list[Target], variants: list[str], *,
             examples: str = "policy", progress_for: Callable[[str], ProgressFn] | None = None) -> list[EvalOutcome]:
    """Every target x readout: a 'default' that reads the same as an explicit readout on a model is
    scored once; a run that cannot be scored says why and the others go on."""
    if examples not in EXAMPLE_SOURCES:
        raise ValueError(f"examples: choose one of {', '.join(EXAMPLE_SOURCES)}")
    out = []
    for target in targets:
        for name, label, same in evaluation.distinct_variants(variants, policy, target):
            if same:
                out.append(EvalOutcome(label, same_as=same))
                continue
            try:
                out.append(evaluate_one(store, policy, set_id, target, VARIANTS[name], examples=examples, label=label,
                                        progress=progress_for(label) if progress_for else None))
            except (RunBusy, ValueError) as exc:
                out.append(EvalOutcome(label, error=str(exc)))
    return out


def best_run(store: Store, outcomes: list[EvalOutcome]) -> int | None:
    """The most accurate run of those just evaluated (the one Calibrate opens)."""
    runs = [r for r in (store.get_run(o.run_id) for o in outcomes if o.run_id) if r]
    scored = [r for r in evaluation.readout_table(store, runs) if r.get("accuracy") is not None]
    return max(scored, key=lambda r: r["accuracy"])["run"] if scored else None


def runs_of(store: Store, policy_id: str, set_id: int) -> list[dict[str, Any]]:
    """The evaluation runs of this policy on this set, newest first."""
    return [r for r in store.list_runs(kind="eval") if r["labeled_set_id"] == set_id and r["policy_id"] == policy_id]


def readouts(store: Store, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run: readout, rows, accuracy, macro-F1, ECE before/after, NLL, the correction."""
    return evaluation.readout_table(store, runs)


def calibrate(store: Store, run_id: int, *, target_accuracy: float = 0.9, per_option: bool = False) -> dict[str, Any]:
    """Corrections compared out of fold and the one chosen, metrics before/after it, the gate on the
    corrected probabilities (ValueError with fewer than 4 usable labeled rows)."""
    return evaluation.calibrate_run(store, run_id, target_accuracy=target_accuracy, per_option=per_option)


@dataclass
class Export:
    """A calibrated policy ready to save or download, and the gate decision behind it."""
    config: dict[str, Any]
    gate: GateDecision
    fallback: str

    @property
    def at_gate(self) -> dict[str, Any]:
        at: dict[str, Any] = self.config["metrics"]["at_gate"]
        return at

    @property
    def nothing_decided(self) -> str | None:
        return nothing_decided(self.at_gate, self.fallback)


def option_thresholds(cal: dict[str, Any]) -> dict[str, float]:
    """Per-option gates that reached the target (fitted only when asked for)."""
    return {o: g.threshold for o, g in cal["option_gates"].items() if g.reachable}


def export(store: Store, run_id: int, cal: dict[str, Any], *, fallback: str = "human-review",
           hand_gate: float | None = None) -> Export:
    """The gate (recommended, hand-set, or everything to the fallback) and the versioned policy file."""
    gate = evaluation.decide_gate(cal, hand_gate)
    config = evaluation.build_policy(store, run_id, cal, gate=gate, fallback=fallback,
                                     option_thresholds=option_thresholds(cal))
    return Export(config, gate, fallback)


def save(store: Store, exported: Export) -> int:
    """Keep the calibrated policy for Deploy; returns its id."""
    return store.save_calibrated(exported.config)

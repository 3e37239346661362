"""The gate a comparison or a CI check measures coverage with (no Streamlit).

Either a calibrated policy - its own rule, `CalibratedPolicy.apply`, the one the adapter enforces -
or a plain confidence threshold on the probabilities as scored. `check_model` decides whether a
result from another model than the calibrated one is gated, as the adapter does: a CI check wants
exactly that (a pull request that swaps the model sends every row to the fallback), a side-by-side
comparison of two models wants the rule's gate on each model's probabilities.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence, TypedDict

import numpy as np

from adapter.policy import CalibratedPolicy, Decision, RowReading
from adapter.guard import STEERING_SUSPECTED

from app.core import calibration, deployed
from app.core.runs import scored_probabilities
from app.core.stored import NO_RESPONSE, StoredResponse
from app.core.stats import Proportion, ProportionJSON, proportion


@dataclass(frozen=True)
class Gate:
    policy: CalibratedPolicy | None = None
    threshold: float | None = None  # without a policy: decide when max probability >= threshold
    check_model: bool = False

    @property
    def name(self) -> str:
        if self.policy is not None:
            gate = ("decides nothing: every row to the fallback" if self.policy.gate_source == "unreachable"
                    else "no gate" if self.policy.threshold is None else f"gate {self.policy.threshold:.3f}")
            return f"calibrated policy {self.policy.policy_id} ({gate}, T={self.policy.temperature:.2f})"
        return "no gate (every row decided)" if self.threshold is None else f"confidence >= {self.threshold:.3f}"

    @property
    def decider(self) -> str:
        """Who decides a row under this gate: 'the zero-shot model', 'the learned head (…) of calibrated policy
        refund-check v2', 'the correction (content-free, T=0.91) of calibrated policy …'."""
        if self.policy is None:
            return "the zero-shot model" + ("" if self.threshold is None else f" (gate {self.threshold:.3f})")
        p = self.policy
        version = f" v{p.policy_version}" if p.policy_version is not None else ""
        if p.head is not None:
            return f"the learned head of calibrated policy {p.policy_id}{version}"
        return f"the correction ({p.debias}, T={p.temperature:.2f}) of calibrated policy {p.policy_id}{version}"

    def apply(self, result: Mapping[str, Any], corrected: Sequence[float] | None = None
              ) -> tuple[bool, int, float, list[float]]:
        """(gated, index of the top option, its confidence, the probabilities the gate reads).
        `corrected`: the policy's probabilities for this row given from outside (a head's out-of-fold
        ones); the policy's gate, guard and fallback then decide on them as they are."""
        d = self.decision(result, corrected)
        cal = list(d.calibrated_probabilities)
        return d.gated, int(np.argmax(cal)), d.confidence, cal

    def decision(self, result: Mapping[str, Any], corrected: Sequence[float] | None = None) -> Decision:
        """The policy's decision on one row (CalibratedPolicy.apply), or the plain threshold's."""
        response = StoredResponse.of(result) or NO_RESPONSE
        ids = list(result["option_ids"])
        if self.policy is not None:
            guard = deployed.guard_as(response.guard, self.policy.guard)
            suspected = bool((guard or {}).get("suspected"))
            if corrected is not None:
                rule = self.policy.model_copy(update={"head": None, "temperature": 1.0, "option_offsets": {}})
                return rule.apply(RowReading(tuple(ids), tuple(float(p) for p in corrected), steering_suspected=suspected))
            probs = scored_probabilities(result, self.policy.debias) or result["probabilities"]
            row = response.reading(ids, probs, suspected=suspected)
            return self.policy.apply(replace(row, model_sha256=row.model_sha256 if self.check_model else None))
        probs = [float(p) for p in result["probabilities"]]
        top = int(np.argmax(probs))
        gated = self.threshold is not None and probs[top] < self.threshold
        return Decision(ids[top], tuple(probs), probs[top], gated,
                        f"confidence {probs[top]:.3f} < gate {self.threshold:.3f} (the top probability as scored)"
                        if gated and self.threshold is not None else "decided")

    def reason(self, result: Mapping[str, Any]) -> str:
        """Why this gate sends the row to the fallback, naming the actual cause: the head could not read
        it (no hidden state, another model's), the steering guard flagged it, another model scored it, or
        below the gate - with the probability the gate read (the head's, the calibrated one), never the
        raw one; 'decided' when it does not."""
        d = self.decision(result)
        if not d.gated:
            return "decided"
        why = d.reason
        if why == STEERING_SUSPECTED:
            return "flagged by the steering guard"
        if why.startswith("confidence ") and self.policy is not None:
            ids = list(result["option_ids"])
            top = int(np.argmax(d.calibrated_probabilities))
            gate = self.policy.gate_for(ids[top])
            whose = "the head's probability" if self.policy.head is not None else "the calibrated confidence"
            return f"below the gate: {whose} {d.confidence:.3f} < {gate or 0:.3f} for {ids[top]}"
        return why


@dataclass
class GateMetrics:
    """One run's numbers under a gate: accuracy of every labeled row as scored, coverage and the
    accuracy of the decided rows (each with its Wilson interval), ECE of the confidence the gate reads."""
    n: int
    accuracy: Proportion
    coverage: Proportion
    gate_accuracy: Proportion
    ece: float | None
    gated_keys: list[str] = field(default_factory=list)

    def to_dict(self) -> GateMetricsJSON:
        return {"n": self.n, "accuracy": self.accuracy.to_dict(), "coverage": self.coverage.to_dict(),
                "gate_accuracy": self.gate_accuracy.to_dict(), "ece": self.ece, "gated_rows": self.gated_keys}


class GateMetricsJSON(TypedDict):
    """GateMetrics as a drift report writes it (JSON download)."""
    n: int
    accuracy: ProportionJSON
    coverage: ProportionJSON
    gate_accuracy: ProportionJSON
    ece: float | None
    gated_rows: list[str]


def usable(results: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in results if not r.get("error") and r.get("probabilities")]


def measure(results: Sequence[Mapping[str, Any]], gate: Gate,
            probabilities: Sequence[Sequence[float]] | None = None) -> GateMetrics:
    """Coverage counts every answered row; accuracy, gate accuracy and ECE the labeled ones.
    `probabilities`: per result, the policy's probabilities given from outside (Gate.apply)."""
    given = {id(r): p for r, p in zip(results, probabilities)} if probabilities is not None else {}
    rows = usable(results)
    labeled = [r for r in rows if r.get("label") is not None and r["label"] in r["option_ids"]]
    labeled_keys = {r["row_key"] for r in labeled}
    decided = correct_decided = decided_labeled = 0
    gated_keys: list[str] = []
    conf, correct = [], []
    for r in rows:
        gated, top, c, _ = gate.apply(r, given.get(id(r)))
        if gated:
            gated_keys.append(r["row_key"])
        else:
            decided += 1
        if r["row_key"] in labeled_keys:
            ok = r["option_ids"][top] == r["label"]
            conf.append(c)
            correct.append(ok)
            decided_labeled += int(not gated)
            correct_decided += int(ok and not gated)
    as_scored = sum(1 for r in labeled if r["top_option"] == r["label"])
    ece = calibration.ece(np.array(conf), np.array(correct, float)) if conf else None
    return GateMetrics(n=len(rows), accuracy=proportion(as_scored, len(labeled)),
                       coverage=proportion(decided, len(rows)),
                       gate_accuracy=proportion(correct_decided, decided_labeled), ece=ece, gated_keys=gated_keys)

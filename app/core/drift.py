"""Two runs over the same rows, side by side (no Streamlit): what changed between two models, two
prompt versions, policy v1 and v2, a CPU and a GPU endpoint, or production and its replay.

Rows are paired by key (and, where both runs kept it, the same state). A **flip** is a row whose top
option changed: *fixed* (A wrong, B right), *broken* (A right, B wrong), *changed-wrong* (both
wrong, differently), or *changed* when the row has no label. A **shift** keeps its top option but
moved some option's probability by more than a threshold. Accuracy is compared on the labeled pairs
with the exact McNemar test (the discordant pairs: under "no difference" a discordant row is as
likely fixed as broken, so the fixed count is Binomial(fixed + broken, 1/2); scipy's binomtest) and
a percentile bootstrap 95% interval of B − A; coverage and accuracy at a gate and ECE are given for
each run (app/gates.py). Every count keeps the rows behind it.

>>> a = [{"row_key": "r1", "state": "s", "label": "x", "option_ids": ["x", "y"], "probabilities": [0.9, 0.1],
...       "top_option": "x"}]
>>> b = [{**a[0], "probabilities": [0.2, 0.8], "top_option": "y"}]
>>> compare(a, b).counts["broken"]
1
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from app.core import stats
from app.core.gates import Gate, GateMetrics, measure

SHIFT_THRESHOLD = 0.10
FLIP_KINDS = ("fixed", "broken", "changed-wrong", "changed")
NO_LABEL = "(no label)"


@dataclass(frozen=True)
class Pair:
    row_key: str
    state: Any
    label: str | None
    a_top: str
    b_top: str
    a_p: float  # each run's probability of its own top option
    b_p: float
    a_top_in_b: float  # B's probability of A's top option (on the diagonal when nothing moved)
    max_shift: float  # largest |p_B - p_A| over the options
    shift_option: str
    kind: str  # one of FLIP_KINDS, "shift", or "same"

    def to_dict(self) -> dict[str, Any]:
        return {"row_key": self.row_key, "state": self.state if isinstance(self.state, (str, type(None))) else str(self.state),
                "label": self.label, "a_top": self.a_top, "b_top": self.b_top, "a_p": self.a_p, "b_p": self.b_p,
                "a_top_in_b": self.a_top_in_b, "max_shift": self.max_shift, "shift_option": self.shift_option, "kind": self.kind}


@dataclass(frozen=True)
class Drift:
    n_a: int
    n_b: int
    pairs: list[Pair]
    unmatched: int  # answered rows of B with no comparable row in A (another key, state or option set)
    shift_threshold: float
    counts: dict[str, int]
    rows: dict[str, list[str]]  # kind -> row keys
    per_class: dict[str, dict[str, int]]  # label -> kind -> count
    labeled: int
    accuracy_a: stats.Proportion
    accuracy_b: stats.Proportion
    accuracy_diff: float | None  # B - A on the labeled pairs
    accuracy_diff_ci: tuple[float, float] | None
    mcnemar_p: float | None  # exact, two-sided; None without labeled pairs
    gate: str
    gate_a: GateMetrics
    gate_b: GateMetrics
    labels: dict[str, str] = field(default_factory=dict)  # "a"/"b" -> what each run is

    @property
    def flips(self) -> int:
        return sum(self.counts[k] for k in FLIP_KINDS)

    def sentence(self, a: str = "A", b: str = "B") -> str:
        """One paired test decides: McNemar's exact test on the labeled pairs only one run gets right;
        the interval beside it is the one that test inverts (stats.mcnemar_interval), on the same pairs."""
        if not self.labeled or self.accuracy_diff is None or self.mcnemar_p is None:
            return "No labeled pairs: no accuracy difference to test."
        ci = self.accuracy_diff_ci or (0.0, 0.0)
        said = (f"{self.accuracy_diff:+.1%} on {self.labeled} labeled pairs (95% CI {ci[0]:+.1%} to {ci[1]:+.1%}, exact; "
                f"McNemar p = {self.mcnemar_p:.3g} on {self.counts['fixed']} fixed vs {self.counts['broken']} broken)")
        if self.mcnemar_p < stats.ALPHA:
            better = b if self.accuracy_diff > 0 else a
            return f"{better} is more accurate, beyond noise: {b} − {a} = {said}."
        return f"Within noise - these pairs cannot tell {a} and {b} apart: {b} − {a} = {said}."

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.labels, "n_a": self.n_a, "n_b": self.n_b, "paired": len(self.pairs),
                "unmatched": self.unmatched, "labeled_pairs": self.labeled, "flips": self.flips, "counts": self.counts,
                "shift_threshold": self.shift_threshold, "per_class": self.per_class,
                "accuracy_a": self.accuracy_a.to_dict(), "accuracy_b": self.accuracy_b.to_dict(),
                "accuracy_diff": self.accuracy_diff,
                "accuracy_diff_ci95": list(self.accuracy_diff_ci) if self.accuracy_diff_ci else None,
                "mcnemar_exact_p": self.mcnemar_p, "gate": self.gate,
                "gate_a": self.gate_a.to_dict(), "gate_b": self.gate_b.to_dict(),
                "rows": self.rows, "pairs": [p.to_dict() for p in self.pairs]}


def _answered(results: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {r["row_key"]: r for r in results if not r.get("error") and r.get("probabilities")}


def pair_rows(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], shift_threshold: float = SHIFT_THRESHOLD) -> tuple[list[Pair], int]:
    """Pairs in B's order, and how many of B's answered rows had no comparable row in A."""
    base = _answered(a)
    pairs: list[Pair] = []
    unmatched = 0
    for key, rb in _answered(b).items():
        ra = base.get(key)
        same_state = ra is not None and (ra.get("state") is None or rb.get("state") is None or ra["state"] == rb["state"])
        if ra is None or not same_state or ra["option_ids"] != rb["option_ids"]:
            unmatched += 1
            continue
        pa, pb = np.asarray(ra["probabilities"], float), np.asarray(rb["probabilities"], float)
        ia, ib = int(np.argmax(pa)), int(np.argmax(pb))
        ids = rb["option_ids"]
        delta = np.abs(pb - pa)
        j = int(np.argmax(delta))
        label = rb.get("label") if rb.get("label") is not None else ra.get("label")
        label = label if label in ids else None
        if ia != ib:
            if label is None:
                kind = "changed"
            elif ids[ib] == label:
                kind = "fixed"
            elif ids[ia] == label:
                kind = "broken"
            else:
                kind = "changed-wrong"
        else:
            kind = "shift" if delta[j] > shift_threshold else "same"
        pairs.append(Pair(key, rb.get("state"), label, ids[ia], ids[ib], float(pa[ia]), float(pb[ib]), float(pb[ia]),
                          float(delta[j]), ids[j], kind))
    return pairs, unmatched


def compare(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], *, gate: Gate = Gate(), shift_threshold: float = SHIFT_THRESHOLD,
            seed: int = 0, labels: dict[str, str] | None = None) -> Drift:
    """Run A (the baseline) against run B, from their stored results."""
    pairs, unmatched = pair_rows(a, b, shift_threshold)
    kinds = (*FLIP_KINDS, "shift", "same")
    rows = {k: [p.row_key for p in pairs if p.kind == k] for k in kinds}
    counts = {k: len(v) for k, v in rows.items()}
    per_class: dict[str, dict[str, int]] = {}
    for p in pairs:
        c = per_class.setdefault(p.label or NO_LABEL, {k: 0 for k in kinds})
        c[p.kind] += 1
    lab = [p for p in pairs if p.label is not None]
    right_a = np.array([p.a_top == p.label for p in lab], float)
    right_b = np.array([p.b_top == p.label for p in lab], float)
    gain = stats.paired_gain(right_a.astype(bool), right_b.astype(bool), seed=seed)
    keys = {p.row_key for p in pairs}  # gate metrics on the same rows for both runs
    return Drift(n_a=len(_answered(a)), n_b=len(_answered(b)), pairs=pairs, unmatched=unmatched,
                 shift_threshold=shift_threshold, counts=counts, rows=rows, per_class=per_class, labeled=len(lab),
                 accuracy_a=stats.proportion(int(right_a.sum()), len(lab)),
                 accuracy_b=stats.proportion(int(right_b.sum()), len(lab)), accuracy_diff=gain.gain,
                 accuracy_diff_ci=stats.mcnemar_interval(counts["fixed"], counts["broken"], len(lab)),
                 mcnemar_p=stats.mcnemar_exact(counts["fixed"], counts["broken"]) if lab else None, gate=gate.name,
                 gate_a=measure([r for r in a if r["row_key"] in keys], gate),
                 gate_b=measure([r for r in b if r["row_key"] in keys], gate), labels=labels or {})


def pair_frame(drift: Drift) -> pd.DataFrame:
    """The pairs as a table (pandas), for pages and downloads."""
    return pd.DataFrame([p.to_dict() for p in drift.pairs],
                        columns=["row_key", "state", "label", "a_top", "b_top", "a_p", "b_p", "a_top_in_b",
                                 "max_shift", "shift_option", "kind"])

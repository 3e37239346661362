"""What more labels buy (no Streamlit): the learning curve of what the export carries - out-of-fold accuracy
on 50%, 75% and 100% of the labeled rows (random stratified subsets, a few repeats) - and a rough
extrapolation to N more rows, with the gate's own answer (calibration.Gate.reach) for coverage.

The curve refits the chosen method only (the chosen correction, or the chosen head kind with its own inner
choice of regularisation, as Calibrate fits it), over as many folds as the subset's rarest option allows.
The extrapolation fits accuracy = a - b / sqrt(rows) to the curve's points: a guess from three points, said as
one, never a promise - the current figure's 95% interval is shown beside it and is usually wider than the change."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from adapter.head import uses_hidden
from app.core import calibration, heads
from app.core.run_calibration import Calibration
from app.core.runs import families, hidden_states
from app.core.stats import proportion

SHARES = (0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Point:
    share: float
    rows: int
    accuracy: float  # mean over the repeats
    low: float  # the lowest and highest repeat
    high: float


@dataclass(frozen=True)
class LabelCurve:
    method: str
    points: tuple[Point, ...]
    more: tuple[tuple[int, float], ...]  # (more rows, extrapolated out-of-fold accuracy)
    sentence: str


def subset(y: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray:
    """A stratified random subset: `share` of each label's rows (at least 2 of each)."""
    out: list[int] = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        out.extend(rng.choice(idx, max(min(2, len(idx)), int(round(share * len(idx)))), replace=False))
    return np.sort(np.array(out, dtype=np.int64))


def oof_accuracy(cal: Calibration, idx: np.ndarray, seed: int = 0) -> float | None:
    """Out-of-fold accuracy of the chosen method refitted on the rows `idx` (None: it cannot be fitted there)."""
    y = cal.y[idx]
    k = len(cal.option_ids)
    if cal.head is not None:
        kind = cal.head.kind
        hidden, _ = hidden_states(cal.results)
        if uses_hidden(kind) and hidden is None:
            return None
        H = None if hidden is None else hidden[idx]
        P_sub = cal.P[idx]
        X = heads.design(kind, H, P_sub)
        head = cal.head.head
        n_folds = heads.head_folds(int(calibration.rows_per_option(y, k)[np.unique(cal.y)].min()))
        if not n_folds or head is None:
            return None
        right = 0
        for test in calibration.folds(len(y), n_folds, seed, y):
            train = np.setdiff1d(np.arange(len(y)), test)
            fitted = heads.fit_head(kind, X[train], y[train], list(cal.option_ids),
                                    hidden_dim=H.shape[1] if H is not None and uses_hidden(kind) else 0,
                                    model_sha256=head.model_sha256, prompt_version=head.prompt_version, seed=seed)
            for i in test:
                p = fitted.probabilities(H[i] if H is not None and uses_hidden(kind) else None, list(P_sub[i]))
                right += int(int(np.argmax(p)) == y[i])
        return right / len(y)
    fams = families(cal.results, k) or {"none": cal.P}
    fam = fams.get(cal.correction.family, cal.P)[idx]
    if cal.correction.method == "fitted" and calibration.rows_per_option(y, k).min() < calibration.MIN_ROWS_PER_OPTION:
        return None
    _, _, oof, _ = calibration.correction_cv(fam, y, cal.correction.method, seed=seed)
    return calibration.accuracy(oof, y)


def label_curve(cal: Calibration, *, repeats: int = 3, seed: int = 0) -> LabelCurve:
    n = len(cal.y)
    rng = np.random.default_rng(seed)
    points = []
    for share in SHARES:
        reps = 1 if share == 1.0 else repeats
        accs = [a for _ in range(reps) if (a := oof_accuracy(cal, np.arange(n) if share == 1.0 else
                                                             subset(cal.y, share, rng), seed)) is not None]
        if accs:
            points.append(Point(share, int(round(share * n)), float(np.mean(accs)), min(accs), max(accs)))
    more: list[tuple[int, float]] = []
    if len(points) >= 2 and points[-1].share == 1.0:
        x = np.array([1 / math.sqrt(p.rows) for p in points])
        a, b = np.polyfit(-x, [p.accuracy for p in points], 1)[::-1]  # accuracy = a + b * (-1/sqrt(rows))
        more = [(m, float(min(1.0, max(0.0, a - b / math.sqrt(n + m))))) for m in (n // 2, n)]
    now = proportion(int(round(points[-1].accuracy * n)), n) if points and points[-1].share == 1.0 else None
    name = cal.chosen_name
    if not points:
        return LabelCurve(name, (), (), f"No learning curve: {name} cannot be refitted on fewer rows.")
    curve = ", ".join(f"{p.accuracy:.1%} on {p.rows} rows" + (f" (repeats {p.low:.0%}–{p.high:.0%})" if p.low != p.high
                                                            else "") for p in points)
    text = f"{name}, out of fold: {curve}."
    if more and now is not None:
        text += (" A rough extrapolation (accuracy = a − b/√rows fitted to these points, if the next rows are like "
                 "these): " + ", ".join(f"about {acc:.0%} with {m} more rows" for m, acc in more)
                 + f". Today's figure alone has a 95% interval of {now.low:.0%}–{now.high:.0%}: the change is a guess.")
    gate = cal.gate
    if not gate.reachable and gate.reach is not None:
        text += (f" The gate: about {gate.reach.more} more rows at the accuracy measured would make "
                 f"{cal.target_accuracy:.0%} reachable, deciding about {gate.reach.coverage:.0%} of rows.")
    elif gate.reachable:
        text += f" The gate is reachable now: it decides {(gate.coverage or 0):.0%} of rows out of fold."
    return LabelCurve(name, tuple(points), tuple(more), text)

"""What more labels buy (no Streamlit): the learning curve of what the export carries - out-of-fold accuracy
on 50%, 75% and 100% of the labeled rows (random stratified subsets, a few repeats) - and, for N more rows
(half as many again, and as many again), the expected out-of-fold accuracy (a rough extrapolation) and the
expected coverage of a gate at the target (the same Clopper-Pearson rule Calibrate applies, if the next rows
are decided as these were), with the gate's own answer (calibration.Gate.reach) when it is unreachable now.

The curve refits the chosen method only (the chosen correction, or the chosen head kind with its own inner
choice of regularisation, as Calibrate fits it), over as many folds as the subset's rarest option allows.
The extrapolation fits accuracy = a - b / sqrt(rows) to the curve's points: a guess from three points, said as
one, never a promise - the current figure's 95% interval is shown beside it, and when the predicted change is
smaller than that interval's half-width the sentence says that N more rows may not move the figure beyond noise.
The expected coverage keeps today's out-of-fold risk-coverage curve (no accuracy gain assumed): only the bound
tightens with more rows - the cautious reading."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TypedDict

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


class LabelCurveJSON(TypedDict):
    """metrics.label_curve in an exported file (LabelCurve.to_dict), read by key by whoever opens the file."""
    method: str
    points: list[dict[str, float]]
    more: list[dict[str, float | None]]
    accuracy_interval_95: list[float] | None
    target: float | None
    coverage_now: float | None
    note: str


@dataclass(frozen=True)
class More:
    rows: int  # labeled rows added
    accuracy: float  # extrapolated out-of-fold accuracy
    coverage: float | None  # expected gate coverage at the target (None: no gate even with these rows)


@dataclass(frozen=True)
class LabelCurve:
    method: str
    points: tuple[Point, ...]
    more: tuple[More, ...]
    sentence: str
    interval: tuple[float, float] | None = None  # today's out-of-fold accuracy, 95% Wilson interval
    target: float | None = None
    coverage_now: float | None = None  # the gate's out-of-fold coverage today (None: no gate)

    def to_dict(self) -> LabelCurveJSON:
        """The curve as the exported file's metrics.label_curve carries it."""
        return {"method": self.method, "points": [asdict(p) for p in self.points],
                "more": [asdict(m) for m in self.more], "accuracy_interval_95": list(self.interval) if self.interval
                else None, "target": self.target, "coverage_now": self.coverage_now, "note": self.sentence}


def coverage_with(conf: np.ndarray, correct: np.ndarray, rows: int, target: float,
                  confidence: float = calibration.CONFIDENCE) -> float | None:
    """The widest out-of-fold coverage of a gate whose decided rows' one-sided Clopper-Pearson lower bound
    clears `target` when `rows` labeled rows are decided as these were (today's risk-coverage curve scaled
    to `rows`); None when no gate would."""
    curve = calibration.risk_coverage(conf, correct)
    thr, cov, acc = (np.asarray(v, float) for v in (curve.threshold, curve.coverage, curve.accuracy))
    best: float | None = None
    for i in range(len(thr)):
        if (i + 1 < len(thr) and thr[i + 1] == thr[i]) or acc[i] <= target:
            continue  # a gate takes every row of a confidence or none; the bound is below the accuracy
        m = int(round(cov[i] * rows))
        if m and calibration.cp_lower(int(round(acc[i] * m)), m, confidence) >= target:
            best = max(best or 0.0, float(cov[i]))
    return best


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
        accs, sizes = [], []  # sizes: the rows each refit used (subset keeps 2 of every label: can exceed share * n)
        for _ in range(reps):
            idx = np.arange(n) if share == 1.0 else subset(cal.y, share, rng)
            if (a := oof_accuracy(cal, idx, seed)) is not None:
                accs.append(a)
                sizes.append(len(idx))
        if accs:
            points.append(Point(share, int(round(float(np.mean(sizes)))), float(np.mean(accs)), min(accs), max(accs)))
    name = cal.chosen_name
    if not points:
        return LabelCurve(name, (), (), f"No learning curve: {name} cannot be refitted on fewer rows.")
    target = cal.target_accuracy
    conf, correct = cal.oof.max(axis=1), cal.oof.argmax(axis=1) == cal.y
    gate = cal.gate
    coverage_now = gate.coverage if gate.reachable else None
    more: list[More] = []
    if len(points) >= 2 and points[-1].share == 1.0:
        x = np.array([1 / math.sqrt(p.rows) for p in points])
        a, b = np.polyfit(-x, [p.accuracy for p in points], 1)[::-1]  # accuracy = a + b * (-1/sqrt(rows))
        more = [More(m, float(min(1.0, max(0.0, a - b / math.sqrt(n + m)))), coverage_with(conf, correct, n + m, target))
                for m in (n // 2, n) if m > 0]
    now = proportion(int(round(points[-1].accuracy * n)), n) if points[-1].share == 1.0 else None
    interval = (now.low, now.high) if now is not None and now.low is not None and now.high is not None else None
    curve = ", ".join(f"{p.accuracy:.1%} on {p.rows} rows" + (f" (repeats {p.low:.0%}–{p.high:.0%})" if p.low != p.high
                                                            else "") for p in points)
    text = f"{name}, out of fold: {curve}."
    if more and interval is not None:
        acc_now = points[-1].accuracy
        text += (" With more rows like these (accuracy: a rough extrapolation, a − b/√rows fitted to these points; "
                 f"coverage: a gate at {target:.0%} under the same Clopper-Pearson rule, today's out-of-fold decisions "
                 "scaled up, no accuracy gain assumed): "
                 + "; ".join(f"{m.rows} more: about {m.accuracy:.0%} accuracy, "
                             + (f"a gate deciding about {m.coverage:.0%} of rows" if m.coverage is not None
                                else f"still no gate at {target:.0%}") for m in more)
                 + f". Today's accuracy alone has a 95% interval of {interval[0]:.0%}–{interval[1]:.0%}")
        gain = max(m.accuracy for m in more) - acc_now
        half = (interval[1] - interval[0]) / 2
        text += (f": the predicted gain (at most {gain * 100:+.1f} points) is smaller than that uncertainty, so these "
                 "rows may not change the measured figure beyond noise." if abs(gain) < half else
                 ": the change is a guess from three points, not a promise.")
    if not gate.reachable and gate.reach is not None:
        text += (f" The gate: about {gate.reach.more} more rows at the accuracy measured would make "
                 f"{target:.0%} reachable, deciding about {gate.reach.coverage:.0%} of rows.")
    elif gate.reachable:
        text += f" The gate is reachable now: it decides {(gate.coverage or 0):.0%} of rows out of fold."
    return LabelCurve(name, tuple(points), tuple(more), text, interval, target, coverage_now)

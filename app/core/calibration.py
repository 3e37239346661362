"""Calibration maths, pure numpy (no Streamlit): metrics, reliability, temperature, gates.

Conventions: `P` is an (n, k) array of probabilities in option order, `y` the (n,) true option
indices; confidence = max probability, prediction = argmax (ties -> first option, as in apply()).

>>> P = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]); y = np.array([0, 1, 1])
>>> accuracy(P, y)
0.6666666666666666
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy.stats import beta

from adapter.policy import calibrate_probs

PROVISIONAL = 200


def size_flag(n: int) -> str:
    """'provisional' (< 200 rows: every number has a wide interval), else 'ok'. There is no floor: a gate is
    recommended when its evidence (choose_gate's lower bound) allows, at any number of rows."""
    return "provisional" if n < PROVISIONAL else "ok"


def predictions(P: np.ndarray) -> np.ndarray:
    return np.asarray(np.argmax(P, axis=1))


def accuracy(P: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(predictions(P) == y)) if len(y) else float("nan")


def confusion_matrix(y: np.ndarray, pred: np.ndarray, k: int) -> np.ndarray:
    """Counts, rows = true option, columns = predicted option."""
    m = np.zeros((k, k), dtype=int)
    np.add.at(m, (y, pred), 1)
    return m


def macro_f1(y: np.ndarray, pred: np.ndarray, k: int) -> float:
    """Mean F1 over options that occur as a label or a prediction (F1 = 0 when undefined)."""
    m = confusion_matrix(y, pred, k)
    scores = []
    for c in range(k):
        tp, fp, fn = m[c, c], m[:, c].sum() - m[c, c], m[c, :].sum() - m[c, c]
        if tp + fp + fn == 0:
            continue
        scores.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores)) if scores else float("nan")


def brier(P: np.ndarray, y: np.ndarray) -> float:
    """Multi-class Brier score: mean over rows of sum_k (p_k - 1[y=k])^2 (0 best, 2 worst)."""
    onehot = np.eye(P.shape[1])[y]
    return float(np.mean(np.sum((P - onehot) ** 2, axis=1)))


def nll(P: np.ndarray, y: np.ndarray, eps: float = 1e-12) -> float:
    return float(-np.mean(np.log(np.clip(P[np.arange(len(y)), y], eps, 1.0))))


@dataclass
class Bin:
    lo: float
    hi: float
    count: int
    confidence: float
    accuracy: float


def reliability(conf: np.ndarray, correct: np.ndarray, n_bins: int = 10, strategy: str = "width") -> list[Bin]:
    """Top-label reliability bins: equal-width ('width') or equal-mass ('mass'); empty bins dropped."""
    conf, correct = np.asarray(conf, float), np.asarray(correct, float)
    if strategy == "width":
        edges = np.linspace(0, 1, n_bins + 1)
        idx = np.clip(np.digitize(conf, edges[1:-1], right=True), 0, n_bins - 1)
        groups = [(edges[b], edges[b + 1], idx == b) for b in range(n_bins)]
    elif strategy == "mass":
        order = np.argsort(conf, kind="stable")
        groups = []
        for part in np.array_split(order, min(n_bins, max(len(conf), 1))):
            mask = np.zeros(len(conf), bool)
            mask[part] = True
            if part.size:
                groups.append((float(conf[part].min()), float(conf[part].max()), mask))
    else:
        raise ValueError("strategy is 'width' or 'mass'")
    return [Bin(float(lo), float(hi), int(m.sum()), float(conf[m].mean()), float(correct[m].mean()))
            for lo, hi, m in groups if m.any()]


def ece(conf: np.ndarray, correct: np.ndarray, n_bins: int = 10, strategy: str = "width") -> float:
    """Expected calibration error: sum over bins of (count/n) * |accuracy - confidence|."""
    bins = reliability(conf, correct, n_bins, strategy)
    n = sum(b.count for b in bins)
    return float(sum(b.count / n * abs(b.accuracy - b.confidence) for b in bins)) if n else float("nan")


# -- temperature scaling ---------------------------------------------------------------------------
def apply_temperature(P: np.ndarray, T: float, offsets: np.ndarray | None = None) -> np.ndarray:
    """Row-wise adapter.policy.calibrate_probs: the exact function the runtime applies
    (softmax(log p / T + b); b = the fitted per-option offsets, none by default)."""
    b = None if offsets is None else [float(x) for x in offsets]
    return np.array([calibrate_probs(list(map(float, row)), T, b) for row in P])


def _nll_at(logP: np.ndarray, y: np.ndarray, T: float) -> float:
    z = logP / T
    z = z - z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1))
    return float(np.mean(lse - z[np.arange(len(y)), y]))


T_MIN, T_MAX = 0.05, 20.0  # the temperature search interval


def at_upper_bound(T: float) -> bool:
    """A fitted temperature at the top of its interval: the probabilities carry (almost) no signal."""
    return T >= T_MAX * 0.99


def fit_temperature(P: np.ndarray, y: np.ndarray, lo: float = T_MIN, hi: float = T_MAX, iters: int = 80) -> float:
    """T minimising NLL of softmax(log P / T): golden-section search on log T (NLL is convex in 1/T)."""
    logP = np.log(np.clip(P, 1e-300, 1.0))
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = _nll_at(logP, y, math.exp(c)), _nll_at(logP, y, math.exp(d))
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = _nll_at(logP, y, math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = _nll_at(logP, y, math.exp(d))
    return float(math.exp((a + b) / 2))


def folds(n: int, k: int, seed: int = 0, y: np.ndarray | None = None) -> list[np.ndarray]:
    """k folds of row indices; with labels `y`, stratified (each label dealt round-robin over the
    folds, as sklearn's StratifiedKFold), so no fold lacks an option its training rows have."""
    rng = np.random.default_rng(seed)
    k = min(k, n)
    if y is None:
        return [np.sort(f) for f in np.array_split(rng.permutation(n), k)]
    parts: list[list[int]] = [[] for _ in range(k)]
    start = 0
    for c in np.unique(y):
        for j, i in enumerate(rng.permutation(np.flatnonzero(y == c))):
            parts[(start + j) % k].append(int(i))
        start += int((y == c).sum())
    return [np.sort(np.array(p, dtype=np.int64)) for p in parts if p]


def temperature_cv(P: np.ndarray, y: np.ndarray, k: int = 5, seed: int = 0) -> tuple[float, np.ndarray, list[float]]:
    """(T fitted on all rows, out-of-fold calibrated P, per-fold T): each row is calibrated by a
    temperature that never saw it, so ECE before/after is measured honestly."""
    oof = np.empty_like(P, dtype=float)
    temps = []
    for test in folds(len(y), k, seed, y):
        train = np.setdiff1d(np.arange(len(y)), test)
        T = fit_temperature(P[train], y[train]) if len(train) else 1.0
        temps.append(T)
        oof[test] = apply_temperature(P[test], T)
    return fit_temperature(P, y), oof, temps


# -- coverage and gates ----------------------------------------------------------------------------
# A gate is recommended from evidence, at any number of rows: on out-of-fold predictions (each row
# predicted by a fit that never saw it), the one-sided lower Clopper-Pearson bound of the accuracy of the
# rows the gate decides must meet the target. Clopper-Pearson is the exact (conservative) binomial bound:
# with 0 errors, 29 decided rows clear 90% at 95% confidence; 46 with 1 error, 61 with 2, 76 with 3.
CONFIDENCE = 0.95  # one-sided
BOUND_NAME = "one-sided 95% Clopper-Pearson lower bound"


def cp_lower(k: int, n: int, confidence: float = CONFIDENCE) -> float:
    """One-sided lower Clopper-Pearson bound of a proportion k/n: the (1 - confidence) quantile of
    Beta(k, n - k + 1); 0 when k is 0 (or n is 0).

    >>> round(cp_lower(29, 29), 4)  # 0.05 ** (1 / 29)
    0.9019
    """
    if n <= 0 or k <= 0:
        return 0.0
    return float(beta.ppf(1 - confidence, k, n - k + 1))


@dataclass(frozen=True)
class RiskCoverage:
    """A risk-coverage curve (risk_coverage): one point per row, most confident first - gating at that row's
    confidence (`threshold`) accepts the share `coverage` of the rows, of which `accuracy` are right."""
    threshold: np.ndarray
    coverage: np.ndarray
    accuracy: np.ndarray

    def __len__(self) -> int:
        return len(self.coverage)


def risk_coverage(conf: np.ndarray, correct: np.ndarray) -> RiskCoverage:
    """Accuracy of the accepted rows vs the share accepted, gating at each observed confidence."""
    order = np.argsort(-np.asarray(conf), kind="stable")
    c, ok = np.asarray(conf)[order], np.asarray(correct, float)[order]
    accepted = np.arange(1, len(c) + 1)
    return RiskCoverage(threshold=c, coverage=accepted / len(c), accuracy=np.cumsum(ok) / accepted)


def lower_bound_curve(curve: RiskCoverage, confidence: float = CONFIDENCE) -> np.ndarray:
    """Per point of a risk-coverage curve, the bound the recommended gate must clear: the one-sided lower
    Clopper-Pearson bound of the accepted rows' accuracy, on all of them (the curve is out of fold)."""
    n = len(curve)
    accepted = np.rint(np.asarray(curve.coverage, float) * n).astype(int)
    right = np.rint(np.asarray(curve.accuracy, float) * accepted).astype(int)
    return np.array([cp_lower(int(k), int(a), confidence) for k, a in zip(right, accepted)])


def decided_needed(accuracy: float, target: float, confidence: float = CONFIDENCE, most: int = 1_000_000) -> int | None:
    """The fewest decided rows at which rows right at this `accuracy` (k = round(m * accuracy) of m) have a
    lower Clopper-Pearson bound >= `target`; None when the accuracy does not beat the target, or not
    within `most` rows. A coarse geometric scan, then every m in the last step (rounding makes the bound
    jitter, so the first m that clears it is found exactly)."""
    if accuracy <= target:
        return None
    grid = sorted({int(v) for v in np.geomspace(1, most, 400)})

    def ok(m: int) -> bool:
        return cp_lower(int(round(m * accuracy)), m, confidence) >= target

    prev = 0
    for m in grid:
        if ok(m):
            return next(j for j in range(prev + 1, m + 1) if ok(j))
        prev = m
    return None


@dataclass(frozen=True)
class Reach:
    """What more labeled rows would make a target reachable (target_reach): from one point of the
    out-of-fold risk-coverage curve (exported as the policy's metrics.gate_selection.reach, by Gate.to_dict)."""
    rows: int  # labeled rows the curve was measured on
    needed: int  # labeled rows in all at which that point's lower bound would clear the target
    more: int  # needed - rows
    threshold: float  # the confidence gate at that point
    coverage: float  # its share of rows decided (the expected coverage)
    accuracy: float  # the accuracy of its decided rows (assumed to hold for the rows to come)


def target_reach(curve: RiskCoverage, target: float, confidence: float = CONFIDENCE) -> Reach | None:
    """Of the curve's points whose decided rows beat `target` as measured, the one whose bound would clear
    it with the fewest labeled rows (ties: the widest coverage), if the rows to come are decided as these
    were; None when no point beats the target, even before the bound."""
    cov, acc = np.asarray(curve.coverage, float), np.asarray(curve.accuracy, float)
    thr, n = np.asarray(curve.threshold, float), len(cov)
    best: Reach | None = None
    seen: set[tuple[int, int]] = set()
    for i in range(n):
        if i + 1 < n and thr[i + 1] == thr[i]:
            continue  # a gate takes every row of a confidence, or none of them
        a, c = float(acc[i]), float(cov[i])
        decided = int(round(c * n))
        key = (decided, int(round(a * decided)))
        if a <= target or key in seen:
            continue
        seen.add(key)
        m = decided_needed(a, target, confidence)
        if m is None:
            continue
        needed = max(n, int(math.ceil(m / c - 1e-9)))
        if best is None or (needed, -c) < (best.needed, -best.coverage):
            best = Reach(rows=n, needed=needed, more=needed - n, threshold=float(thr[i]), coverage=c, accuracy=a)
    return best


@dataclass
class Gate:
    """The gate chosen from evidence (choose_gate): the lowest confidence whose decided rows, out of fold,
    have a lower confidence bound of their accuracy at or above the target. Unreachable: no threshold;
    `reach` says how many more labeled rows at the accuracy measured would make it reachable."""
    threshold: float | None
    reachable: bool
    n: int = 0  # rows the gate was chosen on (out-of-fold predictions)
    decided: int = 0
    correct: int = 0
    accuracy: float | None = None  # of the decided rows
    coverage: float | None = None
    lower_bound: float | None = None  # of the decided rows' accuracy, at the gate
    target: float | None = None
    confidence: float = CONFIDENCE
    bound: str = BOUND_NAME
    reach: Reach | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        """The gate and its evidence in one sentence (the page, the command line and the export say it)."""
        t = self.target or 0.0
        if self.reachable and self.threshold is not None:
            return (f"gate for {t:.0%}: confidence >= {self.threshold:.3f} - out of fold it decides {self.decided} of "
                    f"{self.n} rows ({(self.coverage or 0):.1%}), {self.correct} right ({(self.accuracy or 0):.1%}); "
                    f"{self.bound} {(self.lower_bound or 0):.1%} >= {t:.0%}")
        return f"target {t:.0%} unreachable: {self.note}"


def wilson_lower(successes: int, n: int, z: float = 1.645) -> float:
    """One-sided lower confidence bound of a proportion (Wilson score, 95% by default)."""
    if n == 0:
        return 0.0
    p = successes / n
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - margin) / (1 + z * z / n)


def choose_gate(conf: np.ndarray, correct: np.ndarray, target: float, *,
                confidence: float = CONFIDENCE) -> Gate:
    """The lowest confidence gate (the widest coverage) whose decided rows' accuracy has a one-sided lower
    Clopper-Pearson bound >= `target`, at any number of rows. `conf` and `correct` are out of fold, so
    the rows judge a fit that never saw them; the threshold is still picked on these rows, which the
    conservative exact bound pays for. When none clears it: the best bound reached, and target_reach."""
    conf, correct = np.asarray(conf, float), np.asarray(correct, bool)
    n = len(conf)
    best: tuple[float, int, int, float] | None = None  # (bound, decided, right, threshold)
    for t in np.unique(conf):  # ascending: the first that clears the bound is the lowest
        accepted = conf >= t
        m, k = int(accepted.sum()), int(correct[accepted].sum())
        lb = cp_lower(k, m, confidence)
        if lb >= target:
            return Gate(float(t), True, n, m, k, k / m, m / n, lb, target, confidence)
        if best is None or lb > best[0]:
            best = (lb, m, k, float(t))
    reach = target_reach(risk_coverage(conf, correct), target, confidence) if n else None
    if best is None:
        return Gate(None, False, n, target=target, confidence=confidence, note="no rows to choose a gate on")
    lb, m, k, _ = best
    note = (f"on the {n} rows (out of fold), no gate's decided rows have a {BOUND_NAME} >= {target:.0%} (the highest: "
            f"{lb:.1%}, {k} of {m} right)")
    if reach is not None:
        note += (f"; about {reach.more} more labeled rows ({reach.needed} in all) at the accuracy measured would "
                 f"make it reachable: a gate near confidence {reach.threshold:.3f}, deciding about "
                 f"{reach.coverage:.0%} of rows at {reach.accuracy:.1%} (as {round(reach.coverage * reach.rows)} "
                 f"decided of {reach.rows} rows were so far: a projection, not a finding)")
    else:
        note += "; no gate's decided rows beat the target even as measured, so more rows at this accuracy would not help"
    return Gate(None, False, n, target=target, confidence=confidence, reach=reach, note=note)


def per_option_gates(P: np.ndarray, y: np.ndarray, target: float, *, confidence: float = CONFIDENCE) -> dict[int, Gate]:
    """One gate per predicted option (the rows the model assigned to that option), under the same rule."""
    pred, conf = predictions(P), P.max(axis=1)
    out = {}
    for c in np.unique(pred):
        m = pred == c
        out[int(c)] = choose_gate(conf[m], (y[m] == c), target, confidence=confidence)
    return out


@dataclass
class Report:
    n: int
    k: int
    size_flag: str
    accuracy: float
    macro_f1: float
    brier: float
    nll: float
    ece_width: float
    ece_mass: float
    temperature: float
    fold_temperatures: list[float]
    oof_accuracy: float
    oof_brier: float
    oof_nll: float
    oof_ece_width: float
    oof_ece_mass: float
    confusion: list[list[int]]
    oof_confusion: list[list[int]] = field(default_factory=list)
    method: str = "temperature"
    offsets: list[float] = field(default_factory=list)
    bins_before: list[dict[str, Any]] = field(default_factory=list)
    bins_after: list[dict[str, Any]] = field(default_factory=list)


def correction_cv(P: np.ndarray, y: np.ndarray, method: str = "temperature", k: int = 5,
                  seed: int = 0) -> tuple[float, np.ndarray, np.ndarray, list[float]]:
    """(T and offsets fitted on all rows, out-of-fold corrected P, per-fold T) for temperature alone
    or temperature + fitted offsets."""
    if method == "temperature":
        T, oof, temps = temperature_cv(P, y, k, seed)
        return T, np.zeros(P.shape[1]), oof, temps
    oof = np.empty_like(P, dtype=float)
    temps = []
    for test in folds(len(y), k, seed, y):
        train = np.setdiff1d(np.arange(len(y)), test)
        Tf, bf = fit_offsets(P[train], y[train]) if len(train) else (1.0, np.zeros(P.shape[1]))
        temps.append(Tf)
        oof[test] = apply_temperature(P[test], Tf, bf)
    T, b = fit_offsets(P, y)
    return T, b, oof, temps


def report(P: np.ndarray, y: np.ndarray, *, k_folds: int = 5, n_bins: int = 10, seed: int = 0,
           method: str = "temperature", oof: np.ndarray | None = None) -> tuple[Report, np.ndarray]:
    """Metrics before and after the correction (temperature, or temperature + fitted offsets; out of
    fold); also returns the OOF probabilities. With `oof` (a learned head's out-of-fold
    probabilities, `method` naming it) those are the "after" and no temperature is fitted."""
    P, y = np.asarray(P, float), np.asarray(y, int)
    conf, correct = P.max(axis=1), predictions(P) == y
    if oof is None:
        T, offsets, oof, temps = correction_cv(P, y, method, k_folds, seed)
    else:
        T, offsets, temps = 1.0, np.zeros(P.shape[1]), []
    oconf, ocorrect = oof.max(axis=1), predictions(oof) == y
    return Report(
        n=len(y), k=P.shape[1], size_flag=size_flag(len(y)), accuracy=accuracy(P, y),
        macro_f1=macro_f1(y, predictions(P), P.shape[1]), brier=brier(P, y), nll=nll(P, y),
        ece_width=ece(conf, correct, n_bins, "width"), ece_mass=ece(conf, correct, n_bins, "mass"),
        temperature=T, fold_temperatures=temps, oof_accuracy=accuracy(oof, y), oof_brier=brier(oof, y),
        oof_nll=nll(oof, y), oof_ece_width=ece(oconf, ocorrect, n_bins, "width"),
        oof_ece_mass=ece(oconf, ocorrect, n_bins, "mass"),
        confusion=confusion_matrix(y, predictions(P), P.shape[1]).tolist(),
        oof_confusion=confusion_matrix(y, predictions(oof), P.shape[1]).tolist(), method=method,
        offsets=[float(x) for x in offsets],
        bins_before=[asdict(b) for b in reliability(conf, correct, n_bins, "width")],
        bins_after=[asdict(b) for b in reliability(oconf, ocorrect, n_bins, "width")],
    ), oof


# -- the label-fitted correction -------------------------------------------------------------------
# Temperature scaling cannot move an argmax: a policy whose ranking is right but whose threshold is
# wrong (every SMS called spam, yet spam rows get the higher p(spam)) needs one offset per option.
MIN_ROWS_PER_OPTION = 5  # fewer labeled rows of an option: its offset would be fitted to noise
OFFSET_L2 = 1.0  # ridge on the offsets (in rows' worth of NLL): a weak prior that they are 0
CV_FOLDS = 5  # the same folds as temperature_cv's (report)


def fit_offsets(P: np.ndarray, y: np.ndarray, *, l2: float = OFFSET_L2) -> tuple[float, np.ndarray]:
    """(T, b) minimising the multinomial NLL of softmax(log P / T + b), plus l2 * ||b||^2 / n, by
    L-BFGS on (log 1/T, b) with the analytic gradient. Offsets are relative: b is centred.

    >>> P = np.array([[0.6, 0.4]] * 6 + [[0.7, 0.3]] * 6); y = np.array([1] * 6 + [0] * 6)
    >>> T, b = fit_offsets(P, y)
    >>> bool((np.argmax(apply_temperature(P, T, b), axis=1) == y).all())  # temperature alone: 50%
    True
    """
    from scipy.optimize import minimize

    logP = np.log(np.clip(np.asarray(P, float), 1e-300, 1.0))
    n, k = logP.shape
    onehot = np.eye(k)[y]

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        s, b = math.exp(theta[0]), theta[1:]
        z = s * logP + b
        z = z - z.max(axis=1, keepdims=True)
        q = np.exp(z)
        q /= q.sum(axis=1, keepdims=True)
        lse = np.log(np.exp(z).sum(axis=1))
        loss = float(np.mean(lse - z[np.arange(n), y])) + l2 * float(b @ b) / n
        d = (q - onehot) / n
        grad = np.concatenate([[float(np.sum(d * logP)) * s], d.sum(axis=0) + 2 * l2 * b / n])
        return loss, grad

    start = np.concatenate([[-math.log(fit_temperature(P, y))], np.zeros(k)])
    res = minimize(objective, start, jac=True, method="L-BFGS-B",
                   bounds=[(-math.log(T_MAX), -math.log(T_MIN))] + [(-20.0, 20.0)] * k)
    b = res.x[1:] - res.x[1:].mean()
    return float(math.exp(-res.x[0])), b


def rows_per_option(y: np.ndarray, k: int) -> np.ndarray:
    return np.bincount(np.asarray(y, int), minlength=k)


@dataclass
class Correction:
    """One way to turn scored probabilities into the policy's: which family of scores (`none` = the
    model's own, `content-free` = its no-state prior divided out), and temperature alone or
    temperature + fitted per-option offsets. Metrics are out of fold: each row corrected by a fit
    that never saw it."""

    name: str
    family: str
    method: str  # "temperature" | "fitted"
    temperature: float
    offsets: list[float]
    oof_accuracy: float
    oof_nll: float
    oof_ece: float
    oof_confusion: list[list[int]]
    available: bool = True
    note: str = ""
    oof: np.ndarray | None = field(default=None, repr=False)  # the out-of-fold probabilities (not exported)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "oof"}


def correction_name(family: str, method: str) -> str:
    return {("none", "temperature"): "none", ("content-free", "temperature"): "content-free",
            ("none", "fitted"): "fitted", ("content-free", "fitted"): "content-free + fitted"}[(family, method)]


def corrections(families: dict[str, np.ndarray], y: np.ndarray, *, k_folds: int = CV_FOLDS,
                seed: int = 0) -> list[Correction]:
    """Every correction the families allow, each fitted on all rows (what an export carries) and
    measured out of fold over the same folds. Fitted offsets need MIN_ROWS_PER_OPTION rows of every
    option; below that they are listed as unavailable, with the reason."""
    y = np.asarray(y, int)
    out = []
    for family, P in families.items():
        P = np.asarray(P, float)
        counts = rows_per_option(y, P.shape[1])
        for method in ("temperature", "fitted"):
            name = correction_name(family, method)
            if method == "fitted" and counts.min() < MIN_ROWS_PER_OPTION:
                out.append(Correction(name, family, method, 1.0, [0.0] * P.shape[1], float("nan"), float("nan"),
                                      float("nan"), [], False,
                                      f"needs at least {MIN_ROWS_PER_OPTION} labeled rows of every option "
                                      f"(the fewest here: {int(counts.min())})"))
                continue
            T, b, oof, _ = correction_cv(P, y, method, k_folds, seed)
            pred = predictions(oof)
            out.append(Correction(name, family, method, T, [float(x) for x in b], accuracy(oof, y), nll(oof, y),
                                  ece(oof.max(axis=1), pred == y), confusion_matrix(y, pred, P.shape[1]).tolist(),
                                  oof=oof))
    return out


def _better(a: Correction, b: Correction, n: int) -> bool:
    """a beats b out of fold: more than one row more accurate, or as accurate (within a row) with a
    lower NLL."""
    row = 1 / max(n, 1)
    if a.oof_accuracy > b.oof_accuracy + row + 1e-12:
        return True
    return abs(a.oof_accuracy - b.oof_accuracy) <= row + 1e-12 and a.oof_nll < b.oof_nll


def choose_correction(cands: list[Correction], n: int) -> tuple[Correction, str]:
    """The correction to export, and why. Fitted offsets count only where they beat temperature
    alone on the same scores out of fold (more than a row more accurate, or as accurate with a lower
    NLL); then the most accurate correction wins, and within one row of it, the lowest NLL."""
    usable = [c for c in cands if c.available]
    temps = {c.family: c for c in usable if c.method == "temperature"}
    kept = [c for c in usable if c.method != "fitted" or c.family not in temps or _better(c, temps[c.family], n)]
    best_acc = max(c.oof_accuracy for c in kept)
    close = [c for c in kept if c.oof_accuracy >= best_acc - 1 / max(n, 1) - 1e-12]
    chosen = min(close, key=lambda c: c.oof_nll)
    why = (f"{chosen.name}: out of fold accuracy {chosen.oof_accuracy:.1%}, NLL {chosen.oof_nll:.3f} "
           f"({CV_FOLDS}-fold cross-validation over {n} rows)")
    others = [c for c in usable if c is not chosen]
    if others:
        why += "; " + ", ".join(f"{c.name} {c.oof_accuracy:.1%} / {c.oof_nll:.3f}" for c in others)
    if chosen.method == "fitted":
        why += ". The fitted offsets beat temperature alone on these scores, so they are exported"
    elif any(c.method == "fitted" and c not in kept for c in usable):
        why += ". Fitted offsets did not beat temperature alone out of fold, so none are exported"
    unavailable = [c for c in cands if not c.available]
    if unavailable:
        why += f". Fitted offsets {unavailable[0].note}"
    return chosen, why + "."

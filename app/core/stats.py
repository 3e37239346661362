"""Sample statistics with their uncertainty (no Streamlit): every rate the workbench shows from a
sample carries its n and a 95% interval, so 6 of 6 correct never reads like 600 of 600.

Proportions use the Wilson score interval (scipy.stats.binomtest), which stays inside [0, 1] and
is honest at small n; statistics without a closed form use a percentile bootstrap.

>>> p = proportion(6, 6)
>>> p.rate, round(p.low, 3), p.n
(1.0, 0.61, 6)
>>> p.small
True
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypedDict

import numpy as np
from scipy import stats as _st

from adapter.policy import ProportionFigures

CONFIDENCE = 0.95
SMALL_N = 30  # below this many rows a rate is marked as resting on few rows
ALPHA = 0.05  # a paired gain is beyond noise only below this McNemar p (PairedGain.beyond_noise)


class ProportionJSON(TypedDict):
    """A Proportion as exports, saved policies and downloads write it (Proportion.to_dict)."""
    k: int
    n: int
    rate: float | None
    low: float | None
    high: float | None
    small_n: bool


@dataclass(frozen=True)
class Proportion:
    """k of n, with the Wilson 95% interval; `rate` is None when n is 0."""

    k: int
    n: int
    rate: float | None
    low: float | None
    high: float | None

    @property
    def small(self) -> bool:
        return self.n < SMALL_N

    def to_dict(self) -> ProportionJSON:
        return {"k": self.k, "n": self.n, "rate": self.rate, "low": self.low, "high": self.high, "small_n": self.small}

    def text(self, digits: int = 1) -> str:
        """'83.3% (95% CI 43.6-97.0%, n=6)' - the form every page and export shows."""
        if self.rate is None:
            return "n/a (n=0)"
        f = f"{{:.{digits}%}}"
        return f"{f.format(self.rate)} (95% CI {f.format(self.low).rstrip('%')}–{f.format(self.high)}, n={self.n})"


def proportion(k: int, n: int, confidence: float = CONFIDENCE) -> Proportion:
    if n <= 0:
        return Proportion(0, 0, None, None, None)
    ci = _st.binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return Proportion(int(k), int(n), k / n, float(ci.low), float(ci.high))


def bootstrap_ci(values: np.ndarray, statistic: Callable[[np.ndarray], float], *, n_resamples: int = 1000,
                 confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of `statistic` over rows (rows resampled with replacement);
    None for fewer than 2 rows."""
    values = np.asarray(values)
    if len(values) < 2:
        return None
    res = _st.bootstrap((values,), statistic, n_resamples=n_resamples, confidence_level=confidence,
                        method="percentile", random_state=np.random.default_rng(seed), vectorized=False)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def auc(negatives: np.ndarray, positives: np.ndarray) -> float | None:
    """Probability that a positive scores above a negative (ties count half): the Mann-Whitney U
    statistic over n_pos x n_neg. None when either side is empty."""
    negatives, positives = np.asarray(negatives, float), np.asarray(positives, float)
    if not len(negatives) or not len(positives):
        return None
    u = _st.mannwhitneyu(positives, negatives, alternative="two-sided").statistic
    return float(u / (len(positives) * len(negatives)))


def interval_text(p: Proportion | Mapping[str, Any] | ProportionFigures | None, digits: int = 1) -> str:
    """A Proportion (or one stored as a dict, or read from a policy's metrics: exports, saved policies) in the
    same words as Proportion.text(), marked when it rests on fewer than SMALL_N rows."""
    if isinstance(p, Proportion):
        p = p.to_dict()
    if isinstance(p, ProportionFigures):
        p = {"k": p.k, "n": p.n, "rate": p.rate, "low": p.low, "high": p.high}
    if not p or p.get("rate") is None:
        return "n/a (n=0)"
    text = Proportion(int(p["k"]), int(p["n"]), p["rate"], p["low"], p["high"]).text(digits)
    return text + (f" - fewer than {SMALL_N} rows: a hint, not a measurement" if int(p["n"]) < SMALL_N else "")


def range_text(ci: list[float] | tuple[float, float] | None, fmt: str = "{:.3f}", n: int | None = None) -> str:
    """'95% CI 0.041-0.098' for a bootstrap interval, or '' when there is none; given the rows it rests
    on (`n`), it names them and marks fewer than SMALL_N as interval_text does."""
    text = "" if not ci else f"95% CI {fmt.format(ci[0])}–{fmt.format(ci[1])} (bootstrap)"
    if n is None:
        return text
    text = f"{text}, n={n}" if text else f"n={n}"
    return text + (f" - fewer than {SMALL_N} rows: a hint, not a measurement" if n < SMALL_N else "")


def mcnemar_exact(fixed: int, broken: int) -> float | None:
    """Two-sided exact McNemar p-value on the discordant pairs; 1.0 when there are none."""
    n = fixed + broken
    return 1.0 if n == 0 else float(_st.binomtest(fixed, n, 0.5, alternative="two-sided").pvalue)


def mcnemar_interval(fixed: int, broken: int, n: int) -> tuple[float, float] | None:
    """95% interval of a paired accuracy difference (B - A) on n pairs, from the test that decides it:
    the exact (Clopper-Pearson) interval of fixed / (fixed + broken), the share of the discordant pairs B
    gets right, scaled to the n pairs. It excludes 0 exactly when McNemar's exact two-sided p < 0.05, so
    the interval and the sentence never disagree (a bootstrap interval beside McNemar's p can).

    >>> lo, hi = mcnemar_interval(8, 0, 10)
    >>> round(lo, 3), round(hi, 3), mcnemar_exact(8, 0) < 0.05
    (0.209, 0.8, True)
    """
    if n <= 0:
        return None
    m = fixed + broken
    if m == 0:
        return (0.0, 0.0)
    ci = _st.binomtest(fixed, m, 0.5).proportion_ci(0.95, method="exact")
    return (m / n * (2 * float(ci.low) - 1), m / n * (2 * float(ci.high) - 1))


@dataclass(frozen=True)
class PairedGain:
    """B against A on the same rows: the accuracy gain, its percentile-bootstrap 95% interval, and the
    exact McNemar test on the rows only one of them gets right (`fixed` by B, `broken` by B)."""

    n: int
    gain: float | None
    ci: tuple[float, float] | None
    fixed: int
    broken: int
    p: float | None

    @property
    def beyond_noise(self) -> bool:
        """B is better, the gain's 95% bootstrap interval lies above zero and McNemar's exact test on
        the rows they disagree on is below 0.05. Both: the percentile bootstrap of a paired mean is a
        little optimistic on a few hundred rows (ticket routing, +5.5 points on 128 rows: interval
        +0.8 to +10.2 but p = 0.065), and a rule that ships weights should not lean on the kinder test."""
        return (self.gain is not None and self.gain > 0 and self.ci is not None and self.ci[0] > 0
                and self.p is not None and self.p < ALPHA)

    def text(self) -> str:
        """'+20.0 points on 40 rows (95% CI +8.0 to +32.5; McNemar p = 0.004)'."""
        if self.gain is None:
            return "no rows in common"
        ci = "" if self.ci is None else f"95% CI {self.ci[0] * 100:+.1f} to {self.ci[1] * 100:+.1f}; "
        return f"{self.gain * 100:+.1f} points on {self.n} rows ({ci}McNemar p = {self.p:.3g})"


def paired_gain(right_a: np.ndarray, right_b: np.ndarray, *, seed: int = 0) -> PairedGain:
    """How much more often B is right than A on the same rows (booleans, row by row).

    >>> g = paired_gain(np.array([0, 0, 1, 1] * 10, bool), np.array([1, 1, 1, 1] * 10, bool))
    >>> round(g.gain, 2), g.fixed, g.broken, g.beyond_noise
    (0.5, 20, 0, True)
    """
    a, b = np.asarray(right_a, bool), np.asarray(right_b, bool)
    if not len(a):
        return PairedGain(0, None, None, 0, 0, None)
    fixed, broken = int((b & ~a).sum()), int((a & ~b).sum())
    diff = b.astype(float) - a.astype(float)
    return PairedGain(len(a), float(diff.mean()), bootstrap_ci(diff, np.mean, seed=seed), fixed, broken,
                      mcnemar_exact(fixed, broken))

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

from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
from scipy import stats as _st

CONFIDENCE = 0.95
SMALL_N = 30  # below this many rows a rate is marked as resting on few rows


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

    def to_dict(self) -> dict:
        return {**asdict(self), "small_n": self.small}

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


def interval_text(p: dict | None, digits: int = 1) -> str:
    """A Proportion stored as a dict (exports, saved policies) in the same words as Proportion.text(),
    marked when it rests on fewer than SMALL_N rows."""
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

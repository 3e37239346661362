"""Which unlabeled rows to label next (no Streamlit): margin sampling on the current head's or correction's
probabilities, in batches that are not near-duplicates.

Small own code rather than scikit-activeml: the rule is ten lines over probabilities the workbench already
computes (a head's or a correction's), it needs no refit of a scikit-learn estimator inside a library's
query loop, and DESIGN §11 measured that margin is what gains here (a typicality term for the first labels
added nothing on pools of a few dozen rows).

- Margin: top probability minus the second (lowest first) - the rows the current decision is least sure
  of, which is where a label moves the decision most.
- A cold start: rows predicted as an option with fewer than `few` labels come first (most typical of that
  option first: the highest probability), so every option gets labels before margins are trusted.
- A batch: a row whose state vector is nearly the same as one already picked (cosine >= `near`) is skipped.

>>> P = np.array([[0.9, 0.1], [0.55, 0.45], [0.6, 0.4], [0.52, 0.48]])
>>> rank(P, k=2)
[3, 1]
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def margins(P: np.ndarray) -> np.ndarray:
    """Top probability minus the second, per row (1 = certain, 0 = a tie)."""
    s = np.sort(np.asarray(P, float), axis=1)
    return np.asarray(s[:, -1] - s[:, -2])


def rank(P: np.ndarray, *, k: int = 20, X: np.ndarray | None = None, counts: Sequence[int] | None = None,
         few: int = 2, near: float = 0.98) -> list[int]:
    """Indices of up to `k` rows of P to label next, best first. `counts`: labels so far per option (P's
    columns); `X`: the rows' state vectors (hidden states) for the near-duplicate rule."""
    P = np.asarray(P, float)
    n = len(P)
    if n == 0 or k <= 0:
        return []
    m = margins(P)
    top = P.argmax(axis=1)
    cold = np.zeros(n, bool)
    if counts is not None:
        thin = [c for c, v in enumerate(counts) if v < few]
        cold = np.isin(top, thin)
    # cold-start rows first (most typical first), then by margin (least sure first); ties by index
    order = sorted(range(n), key=lambda i: (0, -P[i, top[i]], i) if cold[i] else (1, m[i], i))
    if X is None:
        return order[:k]
    V = np.asarray(X, float)
    V = V / np.maximum(np.linalg.norm(V, axis=1, keepdims=True), 1e-12)
    picked: list[int] = []
    for i in order:
        if picked and float(np.max(V[picked] @ V[i])) >= near:
            continue
        picked.append(i)
        if len(picked) == k:
            break
    return picked

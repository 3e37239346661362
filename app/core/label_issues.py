"""Wrong labels caught (no Streamlit): the labeled rows most likely mislabeled, ranked from out-of-fold
probabilities - each row's probabilities come from a fit that never saw it, so a row whose own label the
model finds unlikely stands out instead of being memorised.

cleanlab's confident learning (`cleanlab.filter.find_label_issues`: per-option confidence thresholds, the
confident joint, rows pruned by the estimated noise rate; ranked by self-confidence, the out-of-fold
probability of the given label, lowest first) decides which rows are flagged. Nothing is dropped or
changed here: the analyst confirms a label or fixes it (app/core/review.py stores either, audited like any
review action, and a new set version carries it).

>>> oof = np.array([[0.9, 0.1]] * 9 + [[0.95, 0.05]] + [[0.1, 0.9]] * 10)
>>> y = np.array([0] * 9 + [1] + [1] * 10)  # row 9 is labeled 1, the model is sure it is 0
>>> [s.index for s in suspects(oof, y, ["a", "b"])]
[9]
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from cleanlab.filter import find_label_issues

MAX_SHARE = 0.10  # at most this share of the rows is shown: a review list, not a relabelling of the set
METHOD = "cleanlab 2.9 find_label_issues (confident learning, prune_by_noise_rate), ranked by self-confidence"


@dataclass(frozen=True)
class Suspect:
    """A labeled row whose label the out-of-fold model finds unlikely."""
    index: int  # position in the rows given
    label: str  # the label it carries
    preferred: str  # the option the model prefers
    p_label: float  # out-of-fold probability of its own label (its self-confidence)
    p_preferred: float
    rank: int  # 1 = most likely wrong


def suspects(oof: np.ndarray, y: np.ndarray, option_ids: Sequence[str], *, max_share: float = MAX_SHARE
             ) -> list[Suspect]:
    """The rows cleanlab flags as likely mislabeled, most likely first, at most `max_share` of the rows
    (at least one when any is flagged). Only options that occur as a label count as classes; a set with one
    label, or fewer than 2 rows of an option, gives no suspects for that option's rows beyond what the
    others say."""
    P = np.clip(np.asarray(oof, float), 1e-12, 1.0)
    P = P / P.sum(axis=1, keepdims=True)
    y = np.asarray(y, int)
    n = len(y)
    present = np.unique(y)
    if n < 4 or len(present) < 2:
        return []
    # cleanlab wants every class it is given to occur as a label: keep the options that do
    sub = P[:, present]
    sub = sub / sub.sum(axis=1, keepdims=True)
    ys = np.searchsorted(present, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ranked = find_label_issues(labels=ys, pred_probs=sub, filter_by="prune_by_noise_rate",
                                   return_indices_ranked_by="self_confidence", n_jobs=1)
    cap = max(1, int(np.floor(max_share * n)))
    out = []
    for rank, i in enumerate(ranked[:cap], 1):
        i = int(i)
        top = int(np.argmax(P[i]))
        out.append(Suspect(i, option_ids[y[i]], option_ids[top], float(P[i, y[i]]), float(P[i, top]), rank))
    return out


def recall_of_flips(flagged: Sequence[int], flipped: Sequence[int]) -> float:
    """Share of the injected flips among the flagged rows (the benchmark's measure)."""
    f = set(int(i) for i in flipped)
    return len(f & set(int(i) for i in flagged)) / len(f) if f else float("nan")

"""The pure maths of a readout, shared by scoring (engine.py) and the guard run (guard_check.py)."""
from __future__ import annotations

import math

import numpy as np


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - (m + math.log(np.exp(x - m).sum()))


def combine(runs: list[dict], priors: list | None) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, logits) of one row from its option orders' runs: the content-free prior
    divided out and renormalised per order; several orders (permutation) averaged, the logits
    then reported as the log of the mean."""
    raw_probs = [r["probs"] for r in runs]
    if priors is not None:
        fixed = [p / np.maximum(q, 1e-12) for p, q in zip(raw_probs, priors)]
        probs_per_order = [f / f.sum() for f in fixed]
    else:
        probs_per_order = raw_probs
    if len(runs) == 1:
        logits = runs[0]["logits"] - (np.log(np.maximum(priors[0], 1e-12)) if priors is not None else 0.0)
        return probs_per_order[0], logits
    probs = np.mean(probs_per_order, axis=0)
    return probs, np.log(np.maximum(probs, 1e-300))

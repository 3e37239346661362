"""The pure maths of a readout, shared by scoring (engine.py) and the guard run (guard_check.py)."""
from __future__ import annotations

import math
from typing import NotRequired, TypedDict

import numpy as np


class PromptRun(TypedDict):
    """What evaluating one prompt gives (engine.Engine.evaluate): its options' probabilities and raw
    scores in request order, and how it was read. A row's result combines the runs of its option orders."""

    probs: np.ndarray
    logits: np.ndarray
    label_mass: float  # share of next-token probability the options' first label tokens held
    input_tokens: int
    cached_tokens: int
    label_token_counts: list[int]
    forward_seconds: float
    extra_evals: int
    sha: str  # Prompt.sha256()
    version: str  # Prompt.version
    hidden: NotRequired[np.ndarray]  # the last token's hidden state, for prompts that asked for it


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    out: np.ndarray = x - (m + math.log(np.exp(x - m).sum()))
    return out


def combine(runs: list[PromptRun], priors: list[np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
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

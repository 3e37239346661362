"""Which unlabeled rows to label next (no Streamlit): representative rows while the set is young, then the rows
the current head or correction is least sure of, in batches that are not near-duplicates.

Small own code rather than scikit-activeml: the rules are a few lines over probabilities the workbench already
computes (a head's or a correction's) and one k-means, with no refit of a scikit-learn estimator inside a
library's query loop.

- **Cold start** (`counts` given and an option has fewer than `few` labels): with state vectors `X`, the batch is
  chosen as TypiClust does (Hacohen, Dekel & Weinshall, ICML 2022, "Active learning on a budget"): k-means with
  (labeled rows + k) clusters over the labeled and pool rows; from the largest clusters that hold no labeled row,
  each one's most *typical* pool row (the highest inverse mean distance to its nearest neighbours in the
  cluster). Why: with a handful of labels a head's probabilities say little - uncertainty sampling then picks
  outliers and stays among the options already labeled (an option never labeled has probability 0 under a head
  fitted without it) - whereas dense, not yet covered regions of the state space are where the options not yet
  seen live. Without `X`: rows predicted as an option short of labels first (most typical of it first: the
  highest probability), then by uncertainty.
- **Then uncertainty**: `by="margin"` (default: top probability minus the second, lowest first) or
  `by="entropy"` (highest first). Margin looks only at the two options the decision is between - where a label
  moves the decision - and is the stronger default in published comparisons on multi-class data; entropy is
  kept as an option and measured beside it (docs/benchmarks.md, `bench.labels`).
- **A batch**: a row whose state vector is nearly the same as one already picked (cosine >= `near`) is skipped;
  if that leaves fewer than k rows, the skipped ones fill the batch in order (a batch is never short because of
  it). Cosines are taken on *centred* vectors: a language model's raw hidden states all point almost the same way
  (pairs of the shipped sets' states have a median raw cosine of 0.98-0.995), so an uncentred rule would call
  most rows near-duplicates.
- **A caveat for the gate**: rows chosen for being hard are harder than the pool, so the out-of-fold accuracy of
  an actively labeled set understates the head's, and Calibrate's gate (chosen on it) comes later and is
  conservative - bench.labels measured the suggested order reaching a gate at 90% after more labels than random
  on the shipped sets.
- **A random share** (`random_share=r`, `batch`): round(r * k) rows of each batch (rounded half up) are drawn
  uniformly at random from the open pool (seeded: the same pool and seed draw the same rows), the rest ranked as
  above among the other rows; the drawn rows are spread through the batch (one who labels only its first rows
  still labels some of them) and marked as drawn. Labeled, they are the rows whose out-of-fold accuracy does not
  lean low: Calibrate checks the gate on them alone (app/core/run_calibration.random_check).
- **Vectors**: a wide state (more than 32 columns, e.g. a hidden state) is standardised and reduced to its 32
  principal components first (as bench.labels' head sees it); a narrow one is only centred.

>>> P = np.array([[0.9, 0.1], [0.55, 0.45], [0.6, 0.4], [0.52, 0.48]])
>>> rank(P, k=2)
[3, 1]
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA
from sklearn.neighbors import NearestNeighbors
from sklearn.preprocessing import StandardScaler

DIMS = 32  # principal components a wide state vector is reduced to
FIT_ROWS = 5000  # the standardisation and PCA of a wide state are fitted on at most this many rows
NEIGHBOURS = 20  # typicality: inverse mean distance to this many nearest neighbours (TypiClust's choice)


def margins(P: np.ndarray) -> np.ndarray:
    """Top probability minus the second, per row (1 = certain, 0 = a tie)."""
    s = np.sort(np.asarray(P, float), axis=1)
    return np.asarray(s[:, -1] - s[:, -2])


def entropies(P: np.ndarray) -> np.ndarray:
    """Shannon entropy of each row's probabilities (nats; 0 = certain)."""
    Q = np.clip(np.asarray(P, float), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(-np.sum(np.where(Q > 0, Q * np.log(Q), 0.0), axis=1))


def vectors(X: np.ndarray, labeled: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """The pool's (and the labeled rows') state vectors as the rules compare them: centred on all of them, a wide
    one standardised and reduced to DIMS principal components."""
    A = np.asarray(X)
    m = 0 if labeled is None else len(labeled)
    both = A if labeled is None or m == 0 else np.vstack([A, np.asarray(labeled, A.dtype)])
    if both.shape[1] > DIMS and len(both) > DIMS:  # fitted on at most FIT_ROWS rows (a big pool: a random sample)
        fit = both if len(both) <= FIT_ROWS else both[np.random.default_rng(0).choice(len(both), FIT_ROWS, replace=False)]
        scaler = StandardScaler().fit(fit)
        pca = PCA(n_components=DIMS, random_state=0).fit(scaler.transform(fit))
        Z = np.vstack([pca.transform(scaler.transform(both[i:i + FIT_ROWS])) for i in range(0, len(both), FIT_ROWS)])
    else:
        Z = both - both.mean(axis=0)
    Z = np.asarray(Z, float)
    return Z[: len(A)], (Z[len(A):] if m else None)


def typicality(Z: np.ndarray) -> np.ndarray:
    """Inverse mean Euclidean distance to each row's nearest neighbours among Z (a lone row: 0). Neighbours are
    found by scikit-learn in bounded memory (a cluster of a 50,000-row pool never makes an n x n matrix)."""
    n = len(Z)
    if n < 2:
        return np.zeros(n)
    K = min(NEIGHBOURS, n - 1)
    dist, _ = NearestNeighbors(n_neighbors=K + 1).fit(Z).kneighbors(Z)
    return np.asarray(1.0 / np.maximum(dist[:, 1:].mean(axis=1), 1e-12))  # column 0: the row itself


def representative(Z: np.ndarray, k: int, labeled: np.ndarray | None = None, seed: int = 0) -> list[int]:
    """TypiClust's batch: up to k pool rows, each the most typical of a k-means cluster (labeled + k clusters over
    pool and labeled rows), uncovered clusters first, the largest first."""
    n = len(Z)
    m = 0 if labeled is None else len(labeled)
    k = min(k, n)
    if k <= 0:
        return []
    both = Z if labeled is None or m == 0 else np.vstack([Z, labeled])
    n_clusters = min(len(both), m + k)
    cl = KMeans(n_clusters=n_clusters, n_init=3, random_state=seed).fit_predict(both)
    pool_cl, covered = cl[:n], set(cl[n:].tolist())
    sizes = np.bincount(pool_cl, minlength=n_clusters)
    # uncovered before covered, then the largest, then the cluster number (deterministic)
    order = sorted((c for c in range(n_clusters) if sizes[c] > 0), key=lambda c: (c in covered, -sizes[c], c))
    picked: list[int] = []
    for c in order:
        members = np.flatnonzero(pool_cl == c)
        picked.append(int(members[int(np.argmax(typicality(Z[members])))]))
        if len(picked) == k:
            break
    return picked


LABELED_CAP = 300  # labeled vectors the cold start clusters beside the pool: k-means runs labeled + k clusters on
# every Review rerun, so a set of thousands would make each label click slow; a seeded sample covers its regions


DRAW_SEED = 0  # the seed of a pool's random draw (draw_keys)


def draw_keys(row_keys: Sequence[str], seed: int = DRAW_SEED) -> np.ndarray:
    """One random key in [0, 1) per pool row, from its row key and the seed alone (sha256): the random share draws
    the open rows with the smallest keys - uniform over the open rows, reproducible, and stable while other rows
    are labeled (a drawn row stays drawn until it is labeled; the next smallest key takes its place). Calibrate's
    pool sample (app/core/run_calibration.drawn_rows) walks the pool in this order."""
    return np.array([int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big") / 2.0 ** 64
                     for key in row_keys])


RANDOM_SHARE = 0.25  # the share of a batch drawn at random by default (the page, `suggest`): docs/benchmarks.md


def draws(k: int, share: float) -> int:
    """Rows of a batch of k drawn at random for a share: round(share * k), halves rounded up (0.25 of 10: 3).

    >>> draws(10, 0.25), draws(10, 0.2), draws(4, 0.25), draws(20, 0.0)
    (3, 2, 1, 0)
    """
    if not (0.0 <= share <= 1.0):  # NaN fails too
        raise ValueError(f"random_share: {share!r} is not a share between 0 and 1")
    return int(math.floor(round(share * k, 9) + 0.5)) if k > 0 else 0  # round(): 0.35 * 90 is 31.4999...


@dataclass(frozen=True)
class Batch:
    """The next rows to label: `rows` (indices, in the order shown) and which of them were drawn at random."""
    rows: list[int]
    drawn: frozenset[int]


def batch(P: np.ndarray, *, k: int = 20, random_share: float = 0.0, X: np.ndarray | None = None,
          counts: Sequence[int] | None = None, few: int = 2, near: float = 0.98,
          by: Literal["margin", "entropy"] = "margin", labeled_X: np.ndarray | None = None, seed: int = 0,
          keys: np.ndarray | None = None) -> Batch:
    """rank()'s batch with its random share: d = draws(k, random_share) rows drawn uniformly at random without
    replacement from all n rows of P - the d rows with the smallest random `keys` (one per row, independent of the
    rows' content: default numpy's default_rng(seed).random(n); a pool passes keys hashed from its row ids, so a
    row drawn stays drawn while other rows are labeled) - the other k - d ranked by rank() among the rest (a drawn
    row is never among the ranked ones); drawn row j (of d) is placed at position about (j + 1) * k / (d + 1) of the
    batch, so the drawn rows are spread through it. The other arguments: rank()'s."""
    P = np.asarray(P, float)
    n = len(P)
    d = draws(min(k, n), random_share)  # validated even when the pool is empty
    k = min(k, n)
    if n == 0 or k <= 0:
        return Batch([], frozenset())
    u = np.random.default_rng(seed).random(n) if keys is None else np.asarray(keys, float)
    if u.shape != (n,):
        raise ValueError(f"keys: {u.shape[0] if u.ndim else 0} draw keys for {n} rows")
    drawn = [int(i) for i in np.argsort(u, kind="stable")[:d]]
    rest = np.setdiff1d(np.arange(n), drawn)
    sub = rank(P[rest], k=k - d, X=None if X is None else np.asarray(X)[rest], counts=counts, few=few, near=near,
               by=by, labeled_X=labeled_X, seed=seed)
    ranked = [int(rest[i]) for i in sub]
    if not drawn:
        return Batch(ranked, frozenset())
    at = {min(k - 1, int(math.floor((j + 1) * k / (d + 1)))) for j in range(d)}
    for pos in range(k - 1, -1, -1):  # positions collide only when d is close to k: fill from the end
        if len(at) == d:
            break
        at.add(pos)
    rows: list[int] = []
    it_d, it_r = iter(drawn), iter(ranked)
    for pos in range(k):
        nxt = next(it_d, None) if pos in at else next(it_r, None)
        if nxt is None:  # the other kind fills the place (only when a list ran short)
            nxt = next(it_r, None) if pos in at else next(it_d, None)
        if nxt is not None:
            rows.append(nxt)
    return Batch(rows, frozenset(drawn))


def rank(P: np.ndarray, *, k: int = 20, X: np.ndarray | None = None, counts: Sequence[int] | None = None,
         few: int = 2, near: float = 0.98, by: Literal["margin", "entropy"] = "margin",
         labeled_X: np.ndarray | None = None, seed: int = 0, random_share: float = 0.0) -> list[int]:
    """Indices of up to `k` rows of P to label next, best first. `counts`: labels so far per option (P's
    columns; an option with fewer than `few` starts the cold start - pass counts only for options the pool can
    hold); `X`: the rows' state vectors (hidden states) for the cold start and the near-duplicate rule;
    `labeled_X`: the labeled rows' state vectors (the cold start then prefers regions none of them covers);
    `random_share`: that share of the batch drawn at random instead (`batch`, which also says which)."""
    if random_share:
        return batch(P, k=k, random_share=random_share, seed=seed, X=X, counts=counts, few=few, near=near, by=by,
                     labeled_X=labeled_X).rows
    P = np.asarray(P, float)
    n = len(P)
    if n == 0 or k <= 0:
        return []
    if labeled_X is not None and len(labeled_X) > LABELED_CAP:  # a seeded sample of a big set's rows
        labeled_X = np.asarray(labeled_X)[np.random.default_rng(seed).choice(len(labeled_X), LABELED_CAP, replace=False)]
    if by not in ("margin", "entropy"):
        raise ValueError(f"by: {by!r} is not 'margin' or 'entropy'")
    unsure = margins(P) if by == "margin" else -entropies(P)  # lowest first
    top = P.argmax(axis=1)
    cold = counts is not None and len(counts) > 0 and min(counts) < few
    Z, L = (None, None) if X is None else vectors(X, labeled_X)
    if cold and Z is not None:
        first = representative(Z, k, L, seed)
        taken = set(first)
        rest = [i for i in sorted(range(n), key=lambda i: (unsure[i], i)) if i not in taken]
        return (first + rest)[:k]
    thin = np.isin(top, [c for c, v in enumerate(counts or []) if v < few]) if cold else np.zeros(n, bool)
    # without vectors: rows predicted as an option short of labels first (most typical of it first), then by
    # uncertainty; ties by index
    order = sorted(range(n), key=lambda i: (0, -P[i, top[i]], i) if thin[i] else (1, unsure[i], i))
    if Z is None:
        return order[:k]
    V = Z / np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), 1e-12)
    picked: list[int] = []
    skipped: list[int] = []
    for i in order:
        if picked and float(np.max(V[picked] @ V[i])) >= near:
            skipped.append(i)
            continue
        picked.append(i)
        if len(picked) == k:
            break
    return (picked + skipped)[:k]

"""The next rows to label (app/core/suggest.rank): a representative cold start while an option is short of
labels, then margin (or entropy), in batches that are never short because of near-duplicates - on state
vectors shaped like a language model's hidden states (all pointing almost the same way)."""
from __future__ import annotations

import numpy as np
import pytest

from app.core import suggest


def anisotropic(n: int, d: int = 96, seed: int = 0) -> np.ndarray:
    """n distinct state vectors sharing one large common direction (raw cosines all >= 0.99, as hidden states)."""
    rng = np.random.default_rng(seed)
    return 50.0 * np.ones(d) + rng.normal(size=(n, d))


def test_hidden_state_like_vectors_are_not_all_near_duplicates():
    X = anisotropic(40)
    V = X / np.linalg.norm(X, axis=1, keepdims=True)
    assert (V @ V.T).min() >= 0.98  # what an uncentred cosine rule would call one row repeated
    P = np.random.default_rng(1).dirichlet(np.ones(3), size=40)
    got = suggest.rank(P, k=10, X=X)
    assert len(got) == 10 and len(set(got)) == 10
    assert got == suggest.rank(P, k=10)  # no row is a near-duplicate of another: the margin order stands


def test_a_batch_is_filled_when_rows_are_near_duplicates():
    X = anisotropic(6)
    X[1] = X[0]  # row 1 repeats row 0
    P = np.array([[0.5, 0.5], [0.5, 0.5], [0.6, 0.4], [0.7, 0.3], [0.8, 0.2], [0.9, 0.1]])
    assert suggest.rank(P, k=3, X=X) == [0, 2, 3]  # the repeat is skipped ...
    assert suggest.rank(P, k=6, X=X) == [0, 2, 3, 4, 5, 1]  # ... but fills the batch last rather than leave it short


def test_margin_and_entropy_differ_where_they_should():
    P = np.array([[0.5, 0.5, 0.0, 0.0], [0.4, 0.3, 0.3, 0.0], [0.9, 0.05, 0.05, 0.0]])
    assert suggest.rank(P, k=1) == [0]  # a tie between two options: the smallest margin
    assert suggest.rank(P, k=1, by="entropy") == [1]  # spread over three: the highest entropy
    assert suggest.entropies(P)[1] == pytest.approx(-(0.4 * np.log(0.4) + 0.6 * np.log(0.3)))
    with pytest.raises(ValueError, match="by"):
        suggest.rank(P, by="variance")  # type: ignore[arg-type]


def clusters() -> tuple[np.ndarray, np.ndarray]:
    """Three separated clusters of 30, 20 and 10 rows in 2-d (labels 0, 1, 2)."""
    rng = np.random.default_rng(3)
    centres = np.array([[0.0, 0.0], [20.0, 0.0], [0.0, 20.0]])
    sizes = (30, 20, 10)
    X = np.vstack([c + rng.normal(size=(s, 2)) for c, s in zip(centres, sizes)])
    return X, np.repeat([0, 1, 2], sizes)


def most_typical(X: np.ndarray, members: np.ndarray) -> int:
    """By hand: the member with the smallest mean distance to its (up to 20) nearest fellow members."""
    Z = X[members]
    D = np.linalg.norm(Z[:, None, :] - Z[None, :, :], axis=2)
    np.fill_diagonal(D, np.inf)
    return int(members[int(np.argmin(np.sort(D, axis=1)[:, : min(20, len(Z) - 1)].mean(axis=1)))])


def test_the_cold_start_covers_regions_no_label_covers_with_their_most_typical_rows():
    X, y = clusters()
    labeled = X[:2] + 0.1  # two labels, both in the first cluster: options 1 and 2 have none
    # the head, fitted on option 0 only, is least sure about two rows of the first cluster
    P = np.tile([0.99, 0.01, 0.0], (len(X), 1))
    P[[3, 4]] = [0.5, 0.5, 0.0]
    got = suggest.rank(P, k=2, X=X, counts=[2, 0, 0], labeled_X=labeled)
    assert [int(y[i]) for i in got] == [1, 2]  # the uncovered clusters, the larger first; not the unsure rows
    assert got == [most_typical(X, np.flatnonzero(y == 1)), most_typical(X, np.flatnonzero(y == 2))]
    # every option with enough labels: margin again (the two unsure rows first)
    assert suggest.rank(P, k=2, X=X, counts=[2, 2, 2], labeled_X=labeled) == [3, 4]


def test_without_vectors_the_cold_start_takes_rows_predicted_as_a_thin_option():
    P = np.array([[0.2, 0.8], [0.45, 0.55], [0.5, 0.5], [0.9, 0.1]])
    assert suggest.rank(P, k=2, counts=[5, 0]) == [0, 1]  # predicted as option 1 (no labels), most confident first
    assert suggest.rank(P, k=2, counts=[5, 5]) == [2, 1]  # warm: margin

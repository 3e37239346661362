"""Learned heads fitted on a run's labeled rows, out of fold (no Streamlit).

A head (adapter/head.py) is an L2-regularised multinomial logistic regression on a row's features:
the option log-probs (LinC), the model's hidden state at the prompt's last token, or both. On ~30
labeled rows per policy such a head lifted a weak zero-shot policy by 8-20 points in the published
linear-probe / LinC results and in our prototype (issue 28), where per-option offsets moved it far less.

Everything is measured the way the corrections are (calibration.corrections): each row is predicted
by a head that never saw it, over the same stratified folds; the regularisation of each fit is chosen
by an inner cross-validation on that fit's own training rows only. The fold heads are rounded to the
exported form (float16 weights) before they predict, so the out-of-fold numbers are those of heads
exactly like the one exported. A head is chosen over the best correction only when it wins beyond
noise: the 95% interval of its paired accuracy gain on the same rows lies above zero and McNemar p < 0.05.

>>> rng = np.random.default_rng(0); y = np.repeat([0, 1], 20)
>>> H = rng.normal(size=(40, 6)); H[:, 0] += 3 * y  # one hidden direction carries the label
>>> P = np.full((40, 2), 0.5)  # zero-shot: no signal at all
>>> fits = candidates(H, P, y, option_ids=["a", "b"], model_sha256="0" * 64, prompt_version="letters/1")
>>> [(f.kind, f.available) for f in fits]
[('linc', True), ('hidden', True), ('stacked', True)]
>>> next(f for f in fits if f.kind == "hidden").oof_accuracy > 0.9
True
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression
from threadpoolctl import threadpool_limits

from adapter.head import HEAD_KINDS, KIND_WORDS, Head, HeadKind, build_head, feature_vector, uses_hidden

from app.core import calibration
from app.core.stats import PairedGain, paired_gain

MIN_FOLDS = 3  # a head is measured over at least this many folds ...
MIN_ROWS_PER_OPTION = MIN_FOLDS  # ... and needs as many rows of every option as it has folds (one per fold)


def head_folds(fewest: int, k_folds: int = calibration.CV_FOLDS) -> int:
    """The folds a head is measured over: as many as the rarest option has rows, up to `k_folds` - every
    fold then holds a row of every option. Fewer than MIN_FOLDS (0 here) means no head can be measured.

    >>> head_folds(12), head_folds(4), head_folds(2)
    (5, 4, 0)
    """
    k = min(k_folds, fewest)
    return k if k >= MIN_FOLDS else 0


def rows_advice(per_option: dict[str, int], k_folds: int = calibration.CV_FOLDS) -> str:
    """What more labeled rows would buy a head, in words: a head at all, or all `k_folds` folds (each fold
    then trains on more rows, and the out-of-fold estimate rests on more fits).

    >>> rows_advice({"a": 2, "b": 9})
    'label at least 1 more row of a for a learned head (3 of every option, one per fold)'
    >>> rows_advice({"a": 4, "b": 9})
    'measured over 4 folds (a has 4 rows); 1 more row of a gives all 5 folds'
    >>> rows_advice({"a": 7, "b": 9})
    ''
    """
    if not per_option:
        return ""
    rare, fewest = min(per_option.items(), key=lambda kv: kv[1])
    need = {o: MIN_FOLDS - c for o, c in per_option.items() if c < MIN_FOLDS}
    if need:
        more = ", ".join(f"{n} more row{'s' if n > 1 else ''} of {o}" for o, n in need.items())
        return f"label at least {more} for a learned head ({MIN_FOLDS} of every option, one per fold)"
    if fewest < k_folds:
        short = {o: k_folds - c for o, c in per_option.items() if c < k_folds}
        more = ", ".join(f"{n} more row{'s' if n > 1 else ''} of {o}" for o, n in short.items())
        return f"measured over {fewest} folds ({rare} has {fewest} rows); {more} gives all {k_folds} folds"
    return ""
C_GRID = tuple(float(c) for c in 10.0 ** np.arange(-4, 3))  # inverse L2 strength, 1e-4 .. 1e2
INNER_FOLDS = 3
MAX_ITER = 3000


@dataclass
class HeadFit:
    """One kind of head on one run: out-of-fold probabilities and their metrics, the regularisation
    each fold chose, and the head fitted on every row (what an export carries)."""

    kind: HeadKind
    available: bool
    note: str = ""
    oof: np.ndarray | None = None
    oof_accuracy: float = float("nan")
    oof_nll: float = float("nan")
    oof_ece: float = float("nan")
    oof_macro_f1: float = float("nan")
    fold_regularisation: list[float] = field(default_factory=list)
    head: Head | None = None
    folds: int = 0  # the folds it was measured over (fewer than 5 when an option has fewer rows)

    @property
    def name(self) -> str:
        return KIND_WORDS[self.kind].name

    def to_dict(self) -> dict[str, Any]:
        """What an export records of a candidate (no arrays, no weights)."""
        return {"name": self.name, "kind": self.kind, "available": self.available, "note": self.note,
                "oof_accuracy": self.oof_accuracy, "oof_nll": self.oof_nll, "oof_ece": self.oof_ece,
                "oof_macro_f1": self.oof_macro_f1, "fold_regularisation": self.fold_regularisation,
                "folds": self.folds}


def standardise(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(center, scale) as float32 - what the export stores, so fitting sees the exported numbers; a
    constant feature gets scale 1."""
    center = X.mean(axis=0).astype(np.float32)
    scale = X.std(axis=0).astype(np.float32)
    scale[~(scale > 1e-6)] = 1.0
    return center, scale


def row_basis(Z: np.ndarray) -> np.ndarray:
    """An orthonormal basis (m x r, r <= rows) of the span of Z's rows. With far fewer rows than
    features (100 rows, a 1,536-wide hidden state) a fit runs in this basis: the L2 optimum's weights
    lie in the span of the rows (the loss's gradient is a sum of them) and a rotation keeps the L2
    norm, so the optimum is the same, at the cost of a problem as wide as the rows are many (the
    full-width fit took ~0.3 s, this one milliseconds). Any subset of the rows lies in it too."""
    _, sv, Vt = np.linalg.svd(Z, full_matrices=False)
    rank = int((sv > sv[0] * 1e-10).sum()) if sv.size and sv[0] > 0 else 0
    return Vt[: max(rank, 1)].T


def _fit(U: np.ndarray, y: np.ndarray, k: int, C: float, lr: LogisticRegression | None = None
         ) -> tuple[np.ndarray, np.ndarray, LogisticRegression]:
    """(B of shape (k, r), b of shape (k,), the fitted model) of an L2 logistic regression on U; a
    binary fit's single row becomes the softmax pair [0, w]. Pass the previous `lr` to start from its
    solution (a path over C converges in a few steps)."""
    lr = lr or LogisticRegression(max_iter=MAX_ITER, warm_start=True)
    lr.set_params(C=C)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fold that does not fully converge at MAX_ITER is still a fit
        lr.fit(U, y)
    B, b = np.zeros((k, U.shape[1])), np.zeros(k)
    classes = [int(c) for c in lr.classes_]
    if len(classes) == 2:
        B[classes[1]], b[classes[1]] = lr.coef_[0], lr.intercept_[0]
        return B, b, lr
    for row, c in enumerate(classes):
        B[c], b[c] = lr.coef_[row], lr.intercept_[row]
    return B, b, lr


def choose_regularisation(U: np.ndarray, y: np.ndarray, k: int, *, seed: int = 0) -> float:
    """The C with the lowest mean held-out log-loss over INNER_FOLDS stratified folds of these rows
    (ties: the stronger regularisation), each fold's fits warm-started along C. Never looks at rows
    outside U."""
    inner = calibration.folds(len(y), INNER_FOLDS, seed + 1, y)
    losses = np.zeros(len(C_GRID))
    for test in inner:
        train = np.setdiff1d(np.arange(len(y)), test)
        lr = None
        for j, C in enumerate(C_GRID):
            B, b, lr = _fit(U[train], y[train], k, C, lr)
            z = U[test] @ B.T + b
            z -= z.max(axis=1, keepdims=True)
            logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            losses[j] += -logp[np.arange(len(test)), y[test]].mean() / len(inner)
    best = int(np.argmin(losses))  # argmin takes the first (smallest C) of equal losses
    return C_GRID[best]


def fit_head(kind: HeadKind, X: np.ndarray, y: np.ndarray, option_ids: list[str], *, hidden_dim: int,
             model_sha256: str, prompt_version: str, seed: int = 0) -> Head:
    """A head fitted on these rows: standardise, choose C by inner CV, fit, round to the export."""
    center, scale = standardise(X)
    Z = (X - center.astype(np.float64)) / scale.astype(np.float64)
    V = row_basis(Z)
    U = Z @ V
    C = choose_regularisation(U, y, len(option_ids), seed=seed)
    B, b, _ = _fit(U, y, len(option_ids), C)
    return build_head(kind, option_ids, hidden_dim=hidden_dim, center=center, scale=scale, W=B @ V.T, b=b,
                      model_sha256=model_sha256, prompt_version=prompt_version, regularisation=C, rows=len(y))


def design(kind: HeadKind, hidden: np.ndarray | None, P: np.ndarray) -> np.ndarray:
    """One row of features per labeled row, built by the same function the head applies."""
    return np.array([feature_vector(kind, None if hidden is None else hidden[i], P[i]) for i in range(len(P))])


def candidates(hidden: np.ndarray | None, P: np.ndarray, y: np.ndarray, *, option_ids: list[str], model_sha256: str,
               prompt_version: str, k_folds: int = calibration.CV_FOLDS, seed: int = 0,
               no_hidden: str = "") -> list[HeadFit]:
    """Every kind of head, measured out of fold over calibration.folds (the corrections' folds) and
    fitted on all rows. `hidden` is (rows, width) or None (`no_hidden` then says why the hidden-state
    heads are unavailable); `P` the probabilities as scored."""
    with threadpool_limits(limits=1):  # small matrices: BLAS threads only wait on each other (20x slower on a busy machine)
        return _candidates(hidden, P, y, option_ids=option_ids, model_sha256=model_sha256,
                           prompt_version=prompt_version, k_folds=k_folds, seed=seed, no_hidden=no_hidden)


def _candidates(hidden: np.ndarray | None, P: np.ndarray, y: np.ndarray, *, option_ids: list[str], model_sha256: str,
                prompt_version: str, k_folds: int, seed: int, no_hidden: str) -> list[HeadFit]:
    y = np.asarray(y, int)
    P = np.asarray(P, float)
    k = len(option_ids)
    counts = calibration.rows_per_option(y, k)
    fewest = int(counts.min())
    n_folds = head_folds(fewest, k_folds)
    out = []
    for kind in HEAD_KINDS:
        if uses_hidden(kind) and hidden is None:
            out.append(HeadFit(kind, False, no_hidden or "the run's rows carry no hidden state"))
            continue
        if not n_folds:
            advice = rows_advice({o: int(c) for o, c in zip(option_ids, counts)}, k_folds)
            out.append(HeadFit(kind, False, f"needs at least {MIN_ROWS_PER_OPTION} labeled rows of every option, one "
                                            f"per fold (the fewest here: {fewest}): {advice}"))
            continue
        X = design(kind, hidden, P)
        width = hidden.shape[1] if hidden is not None and uses_hidden(kind) else 0
        def fit(X: np.ndarray, y: np.ndarray) -> Head:
            return fit_head(kind, X, y, option_ids, hidden_dim=width, model_sha256=model_sha256,
                            prompt_version=prompt_version, seed=seed)

        oof = np.empty((len(y), k))
        regs = []
        for test in calibration.folds(len(y), n_folds, seed, y):
            train = np.setdiff1d(np.arange(len(y)), test)
            head = fit(X[train], y[train])
            regs.append(head.regularisation)
            for i in test:
                oof[i] = head.probabilities(hidden[i] if hidden is not None and uses_hidden(kind) else None, P[i])
        pred = calibration.predictions(oof)
        out.append(HeadFit(kind, True, "", oof, calibration.accuracy(oof, y), calibration.nll(oof, y),
                           calibration.ece(oof.max(axis=1), pred == y), calibration.macro_f1(y, pred, k), regs,
                           fit(X, y), n_folds))
    return out


@dataclass
class HeadChoice:
    """The head an export carries, or None, and why - in words, with the paired gain over the best
    correction behind it."""

    head: HeadFit | None
    gain: PairedGain | None
    why: str


HEAD_CHOICES = ("auto", "none", *HEAD_KINDS)  # what an analyst may ask for: the rule's pick, none, or one kind


def choose(fits: list[HeadFit], baseline_oof: np.ndarray, baseline_name: str, y: np.ndarray, *,
           seed: int = 0, want: str = "auto", required: bool = False) -> HeadChoice:
    """The most accurate available head (out of fold; ties: lower NLL), kept only when its paired gain
    over the baseline (the correction chosen without heads) is beyond noise. `want` overrides the
    rule: "none", or a kind the analyst picks (exported whatever its gain, which is still stated).
    `required` (a run in the head layout, which only a head reads): the best hidden-state head is
    exported whatever its gain over the layout's own letters; ValueError when none can be fitted."""
    if want not in HEAD_CHOICES:
        raise ValueError(f"head: choose one of {', '.join(HEAD_CHOICES)}")
    if required:
        return _required(fits, baseline_oof, baseline_name, y, seed=seed, want=want)
    usable = [f for f in fits if f.available and f.oof is not None]
    right_base = calibration.predictions(baseline_oof) == y
    if want == "none":
        if not usable:
            return HeadChoice(None, None, "No learned head: asked for none.")
        best = max(usable, key=lambda f: (round(f.oof_accuracy, 12), -f.oof_nll))
        assert best.oof is not None
        gain = paired_gain(right_base, calibration.predictions(best.oof) == y, seed=seed)
        return HeadChoice(None, gain, f"No learned head: asked for none. {the(best.name, True)} would have given "
                                      f"{best.oof_accuracy:.1%} out of fold, {gain.text()} over {baseline_name}"
                                      + (" - beyond noise." if gain.beyond_noise else " - not beyond noise."))
    if want != "auto":
        picked = next(f for f in fits if f.kind == want)
        if picked.oof is None:
            raise ValueError(f"head: the {picked.name} is unavailable here - {picked.note}")
        gain = paired_gain(right_base, calibration.predictions(picked.oof) == y, seed=seed)
        return HeadChoice(picked, gain, f"{the(picked.name, True)}, picked by hand: {picked.oof_accuracy:.1%} out of "
                                        f"fold, {gain.text()} over {baseline_name}"
                                        + (" - beyond noise." if gain.beyond_noise else " - not beyond noise."))
    if not usable:
        reasons = "; ".join(f"{f.name}: {f.note}" for f in fits)
        return HeadChoice(None, None, f"No learned head: {reasons}." if fits else "No learned head was fitted.")
    best = max(usable, key=lambda f: (round(f.oof_accuracy, 12), -f.oof_nll))
    assert best.oof is not None
    gain = paired_gain(right_base, calibration.predictions(best.oof) == y, seed=seed)
    n = len(y)
    if gain.beyond_noise:
        return HeadChoice(best, gain, f"{the(best.name, True)} adds {gain.text()} over {baseline_name}, out of fold: "
                                      f"{best.oof_accuracy:.1%} against {np.mean(right_base):.1%} on {n} rows, so the "
                                      "export carries it (its regularisation chosen by inner cross-validation).")
    verdict = "is no better than" if (gain.gain or 0) <= 0 else "does not beat"
    return HeadChoice(None, gain, f"The best head ({best.name}, {best.oof_accuracy:.1%} out of fold) {verdict} "
                                  f"{baseline_name} ({np.mean(right_base):.1%}) beyond noise: {gain.text()}; the "
                                  "export carries no head.")


def _required(fits: list[HeadFit], baseline_oof: np.ndarray, baseline_name: str, y: np.ndarray, *,
              seed: int, want: str) -> HeadChoice:
    if want in ("none", "linc"):
        raise ValueError(f"head: a run in the head layout is read only by a hidden-state head, so '{want}' cannot be "
                         "exported from it: pick auto, hidden or stacked (or open a run in the state-first layout)")
    usable = [f for f in fits if f.available and f.oof is not None and uses_hidden(f.kind)
              and want in ("auto", f.kind)]
    if not usable:
        notes = "; ".join(f"{f.name}: {f.note}" for f in fits if uses_hidden(f.kind) and f.note)
        raise ValueError(f"head: this run is in the head layout, which only a learned head reads, and no hidden-state "
                         f"head can be fitted on it ({notes or 'no head was fitted'})")
    best = max(usable, key=lambda f: (round(f.oof_accuracy, 12), -f.oof_nll))
    assert best.oof is not None
    gain = paired_gain(calibration.predictions(baseline_oof) == y, calibration.predictions(best.oof) == y, seed=seed)
    return HeadChoice(best, gain, f"{the(best.name, True)} reads this run's head layout (policy first, the state last): "
                                  f"{best.oof_accuracy:.1%} out of fold on {len(y)} rows, {gain.text()} over the "
                                  f"layout's own letters ({baseline_name}), which are never exported without it.")


def the(name: str, first: bool = False) -> str:
    """'the hidden-state head', but 'LinC (...)': a name that starts with a capital takes no article."""
    if name[:1].isupper():
        return name
    return ("The " if first else "the ") + name

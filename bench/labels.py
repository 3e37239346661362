"""Every label counts: what labels buy, in which order, and whether wrong ones are caught. Not a test.

On each shipped labeled set (data/labeled/*.jsonl, train and test rows), from the default model's hidden
states in the head layout read ONCE (bench/label_states.py caches them), everything else simulated in
numpy / scikit-learn:

- Learning curves: per seed, 40% of the rows are held out; labels arrive from the rest (the pool), starting
  from one row of each of two options, either at random or in the suggested order (app/core/suggest.rank:
  margin sampling of the current head, options with < 2 labels first, batches of 4 without near-duplicates).
  At each budget: the head's accuracy on the held-out rows, and the gate's coverage there - the gate chosen
  as Calibrate chooses it (app/core/calibration.choose_gate: out-of-fold predictions on the labeled rows,
  one-sided 95% Clopper-Pearson lower bound >= the target), 0 while no gate is recommended.
- Labels needed: the fewest labels at which the mean held-out accuracy reaches, minus 2 points, the held-out
  accuracy with every pool row labeled (the set's rows that can be labeled in the simulation), and the median labels at which a gate is first recommended.
- Wrong labels: 5% of a set's labels flipped to another option (per seed), the head's out-of-fold
  probabilities on all rows, app/core/label_issues.suspects (cleanlab, at most 10% of rows flagged): the
  share of flips found.

The head here: L2 logistic regression (C = 1) on 32 principal components of the standardised hidden
states (PCA fitted on every row of the set, labels unused) - the simulation's stand-in for Calibrate's
head (which chooses C by inner cross-validation on the full hidden state): cheaper, the same family.

Run: .venv/bin/python -m bench.labels [--seeds 20] [--target 0.9] [--no-publish]
"""
from __future__ import annotations

import argparse
import platform
import time
import warnings
from datetime import date

import numpy as np
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from app.core import calibration, label_issues, suggest
from bench import label_states
from bench.report import publish

BUDGETS = (2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
BATCH = 4


def features(X: np.ndarray, dims: int = 32) -> np.ndarray:
    Z = StandardScaler().fit_transform(X)
    return np.asarray(PCA(n_components=min(dims, len(X) - 1), random_state=0).fit_transform(Z))


def fit_predict(Z_tr: np.ndarray, y_tr: np.ndarray, Z_te: np.ndarray, k: int) -> np.ndarray:
    """(len(Z_te), k) probabilities of a head fitted on the labeled rows (options never labeled: 0)."""
    classes = np.unique(y_tr)
    P = np.zeros((len(Z_te), k))
    if len(classes) == 1:
        P[:, classes[0]] = 1.0
        return P
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = LogisticRegression(C=1.0, max_iter=500).fit(Z_tr, y_tr)
    P[:, m.classes_] = m.predict_proba(Z_te)
    return P


def oof(Z: np.ndarray, y: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """Out-of-fold probabilities over the labeled rows (stratified folds, as many as the rarest label has
    rows, 2 to 5); rows of a label with one row get their probabilities from a fit on the rest."""
    counts = np.bincount(y, minlength=k)
    n_folds = int(min(5, max(2, counts[counts > 0].min())))
    P = np.zeros((len(y), k))
    for test in calibration.folds(len(y), n_folds, seed, y):
        train = np.setdiff1d(np.arange(len(y)), test)
        P[test] = fit_predict(Z[train], y[train], Z[test], k)
    return P


def curve(Z: np.ndarray, y: np.ndarray, k: int, seed: int, order: str, target: float) -> dict[int, tuple[float, float]]:
    """{labels: (held-out accuracy, held-out gate coverage)} for one seed and one order."""
    rng = np.random.default_rng(seed)
    test_idx = np.sort(rng.permutation(len(y))[: int(0.4 * len(y))])
    pool = [i for i in range(len(y)) if i not in set(test_idx)]
    two = rng.choice(np.unique(y[pool]), 2, replace=False)
    labeled = [int(rng.choice([i for i in pool if y[i] == c])) for c in two]
    out: dict[int, tuple[float, float]] = {}
    for budget in [b for b in BUDGETS if b < len(pool)] + [len(pool)]:
        while len(labeled) < budget and len(labeled) < len(pool):
            rest = [i for i in pool if i not in set(labeled)]
            want = min(BATCH, budget - len(labeled))
            if order == "random":
                labeled += [int(i) for i in rng.choice(rest, min(want, len(rest)), replace=False)]
            else:
                P = fit_predict(Z[labeled], y[labeled], Z[rest], k)
                counts = np.bincount(y[labeled], minlength=k)
                labeled += [rest[i] for i in suggest.rank(P, k=want, X=Z[rest], counts=counts)]
        if len(labeled) < budget:
            break
        L = np.array(labeled)
        P_te = fit_predict(Z[L], y[L], Z[test_idx], k)
        acc = float((P_te.argmax(axis=1) == y[test_idx]).mean())
        coverage = 0.0
        if len(L) >= 4 and len(np.unique(y[L])) >= 2:
            Po = oof(Z[L], y[L], k, seed)
            gate = calibration.choose_gate(Po.max(axis=1), Po.argmax(axis=1) == y[L], target)
            if gate.reachable and gate.threshold is not None:
                coverage = float((P_te.max(axis=1) >= gate.threshold).mean())
        out[budget] = (acc, coverage)
    return out


def flips(Z: np.ndarray, y: np.ndarray, k: int, seed: int, share: float = 0.05) -> tuple[float, float]:
    """(recall of injected flips, share of rows flagged) with 5% of the labels flipped."""
    rng = np.random.default_rng(1000 + seed)
    n_flip = max(1, int(round(share * len(y))))
    idx = rng.choice(len(y), n_flip, replace=False)
    noisy = y.copy()
    for i in idx:
        noisy[i] = int(rng.choice([c for c in range(k) if c != y[i]]))
    P = oof(Z, noisy, k, seed)
    found = label_issues.suspects(P, noisy, [str(c) for c in range(k)])
    return label_issues.recall_of_flips([s.index for s in found], idx), len(found) / len(y)


def first_reaching(mean_acc: dict[int, float], level: float) -> int | None:
    return next((b for b in sorted(mean_acc) if mean_acc[b] >= level), None)


def run(seeds: int, target: float) -> tuple[str, list[str]]:
    data = label_states.states()
    lines = []
    summary = []
    for name, (ids, X, y, options) in data.items():
        t0 = time.perf_counter()
        k = len(options)
        Z = features(X)
        full = float((oof(Z, y, k).argmax(axis=1) == y).mean())
        curves = {o: [curve(Z, y, k, s, o, target) for s in range(seeds)] for o in ("random", "suggested")}
        mean_acc, mean_cov, need, gate_at = {}, {}, {}, {}
        pool = len(y) - int(0.4 * len(y))
        whole = float(np.mean([c[pool][0] for c in curves["random"]]))  # every pool row labeled
        for o, cs in curves.items():
            budgets = sorted(set.intersection(*(set(c) for c in cs)))
            mean_acc[o] = {b: float(np.mean([c[b][0] for c in cs])) for b in budgets}
            mean_cov[o] = {b: float(np.mean([c[b][1] for c in cs])) for b in budgets}
            need[o] = first_reaching(mean_acc[o], whole - 0.02)
            firsts = [next((b for b in budgets if c[b][1] > 0), None) for c in cs]
            gate_at[o] = (float(np.median([f for f in firsts if f is not None])) if any(f is not None for f in firsts)
                          else None, sum(f is not None for f in firsts))
        rec = [flips(Z, y, k, s) for s in range(seeds)]
        ratio = (need["suggested"] / need["random"]) if need["random"] and need["suggested"] else None
        budgets = sorted(mean_acc["random"])
        last = budgets[-1]
        needs = (f"{need['random'] or '>' + str(last)} / {need['suggested'] or '>' + str(last)}"
                 + (f" ({ratio:.0%})" if ratio else ""))
        accs = " | ".join(f"{mean_acc['random'][b]:.1%} / {mean_acc['suggested'].get(b, float('nan')):.1%}"
                          if b in mean_acc["random"] else "-" for b in (8, 16, 32, 64))
        covs = " / ".join(f"{mean_cov[o].get(pool, float('nan')):.0%}" for o in ("random", "suggested"))
        lines.append(f"| {name} | {len(y)} | {k} | {full:.1%} | {whole:.1%} ({pool}) | {accs} | {needs} | {_gate(gate_at['random'], seeds)} / "
                     f"{_gate(gate_at['suggested'], seeds)} | {covs} | {np.mean([r for r, _ in rec]):.0%} at "
                     f"{np.mean([f for _, f in rec]):.1%} flagged |")
        summary.append(f"{name}: all rows OOF {full:.1%}, whole pool labeled {whole:.1%}; labels to reach it - 2 pts random {need['random']} "
                       f"suggested {need['suggested']}; gate first at (median) {gate_at}; flips recall "
                       f"{np.mean([r for r, _ in rec]):.1%} ({time.perf_counter() - t0:.0f} s)")
        print(summary[-1], flush=True)
    header = ("| set | rows | options | all rows, out of fold | held out, every pool row labeled (pool) | accuracy at 8 labels, random / suggested | at 16 | at 32 "
              "| at 64 | labels to reach the whole pool's accuracy − 2 pts, random / suggested (ratio) | labels to a gate, median random / "
              "suggested (seeds reaching one) | held-out gate coverage, every pool row labeled, random / suggested | 5% flipped labels "
              "found (cleanlab, ≤ 10% flagged) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    return header + "\n".join(lines), summary


def _gate(g: tuple[float | None, int], seeds: int) -> str:
    return "none" if g[0] is None else f"{g[0]:.0f} ({g[1]}/{seeds})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--no-publish", action="store_true")
    args = ap.parse_args()
    table, _ = run(args.seeds, args.target)
    print(table)
    if not args.no_publish:
        body = (f"Measured {date.today()} on {platform.machine()} ({platform.processor() or 'CPU'}), 2 cores shared with "
                f"other work; hidden states of the default model in the head layout (bench/label_states.py), "
                f"{args.seeds} seeds, target accuracy {args.target:.0%}, 40% of each set held out per seed, labels "
                f"in batches of {BATCH}, starting from one row of each of two options.\n\n" + table)
        publish("labels", body)


if __name__ == "__main__":
    main()

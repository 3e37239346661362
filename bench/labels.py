"""Every label counts: what labels buy, in which order, and whether wrong ones are caught. Not a test.

On each shipped labeled set (data/labeled/*.jsonl, train and test rows), from the default model's hidden
states in the head layout read ONCE (bench/label_states.py caches them), everything else simulated in
numpy / scikit-learn:

- Learning curves: per seed, 40% of the rows are held out; labels arrive from the rest (the pool), starting
  from one row of each of two options (the same rows and the same first two labels for every order of a
  seed), in batches of 4, either at random or ranked by app/core/suggest.rank. The orders (ORDERS): rank()'s
  default ("suggested": TypiClust's representative cold start while an option has < 2 labels, then margin,
  batches without near-duplicates), and beside it margin alone, entropy alone, and the rule before this one
  (rows predicted as an option short of labels first, most confident first) - so the table says what each
  part buys, on every set. And the suggested order with a random share (suggest.batch: 1 or 2 of every batch
  of 4 drawn at random from the open rows): what the share costs in labels, and what it buys - the lean of the
  gate's evidence: the out-of-fold accuracy of every labeled row against the held-out accuracy, and of the rows
  drawn at random alone (Calibrate's unbiased check).
  After every batch: the head's accuracy on the held-out rows; every second batch (and with the whole pool)
  the gate's coverage there - the gate chosen as Calibrate chooses it (app/core/calibration.choose_gate:
  out-of-fold predictions on the labeled rows, one-sided 95% Clopper-Pearson lower bound >= the target), 0
  while no gate is recommended - for the random and the suggested order.
- Labels needed: where the mean held-out accuracy curve first reaches the held-out accuracy with every pool
  row labeled minus 2 points, interpolated linearly between the two batches around the crossing (so the
  figure is not quantised to the grid); the ratio suggested / random, with a 95% percentile bootstrap
  interval over seeds (a seed's two orders resampled together). The median labels at which a gate is
  first recommended.
- The design choice, cross-validated over sets: for each set, the order with the best mean held-out
  accuracy over the whole curve on the OTHER sets, and its ratio on this one (a choice never tuned on the
  set it is judged on).
- Wrong labels: 5% of a set's labels flipped to another option (per seed), the head's out-of-fold
  probabilities on all rows, app/core/label_issues.suspects (cleanlab, at most 10% of rows flagged): the
  share of flips found.

The head here: L2 logistic regression (C = 1) on 32 principal components of the standardised hidden
states (PCA fitted on every row of the set, labels unused) - the simulation's stand-in for Calibrate's
head (which chooses C by inner cross-validation on the full hidden state): cheaper, the same family.

Run: .venv/bin/python -m bench.labels [--seeds 20] [--target 0.9] [--jobs 1] [--orders 'A;B'] [--no-publish]
"""
from __future__ import annotations

import argparse
import platform
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from datetime import date
from functools import partial
from typing import Literal

import numpy as np
from scipy.optimize import minimize
from scipy.stats import beta
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

from app.core import calibration, label_issues, suggest
from bench import label_states
from bench.report import publish

BATCH = 4  # labels per batch; every curve is measured after every batch (2, 6, 10, ... labels, then the pool)
HELD_OUT = 0.4
SHOWN = (10, 26, 50, 82)  # the budgets the table shows accuracy at (points of the grid)
C_HEAD = 1.0  # the head's inverse regularisation strength (scikit-learn's C)
BOOT = 1000  # bootstrap resamples of the seeds for the ratio's interval


def features(X: np.ndarray, dims: int = 32) -> np.ndarray:
    Z = StandardScaler().fit_transform(X)
    return np.asarray(PCA(n_components=min(dims, len(X) - 1), random_state=0).fit_transform(Z))


def fit_predict(Z_tr: np.ndarray, y_tr: np.ndarray, Z_te: np.ndarray, k: int) -> np.ndarray:
    """(len(Z_te), k) probabilities of a head fitted on the labeled rows (options never labeled: 0).

    The head: multinomial L2 logistic regression with scikit-learn's objective for C = 1 (mean cross-entropy +
    ||W||² / (2 C n), intercept unpenalised) and its stopping rule (L-BFGS, gradient tolerance 1e-4), solved
    with scipy directly: scikit-learn's own per-iteration checks took two thirds of this benchmark's time. Checked
    against LogisticRegression(C=1) on the four sets' rows (6-135 labels): the same top option on 97.5-100% of held-out
    rows; a 2-option set differs most (scikit-learn fits one coefficient vector there, this the multinomial form)."""
    classes = np.unique(y_tr)
    P = np.zeros((len(Z_te), k))
    if len(classes) == 1:
        P[:, classes[0]] = 1.0
        return P
    n, d = Z_tr.shape
    m = len(classes)
    Y = (y_tr[:, None] == classes[None, :]).astype(float)
    A = np.hstack([Z_tr, np.ones((n, 1))])

    def loss_grad(w: np.ndarray) -> tuple[float, np.ndarray]:
        W = w.reshape(d + 1, m)
        S = A @ W
        S -= S.max(axis=1, keepdims=True)
        E = np.exp(S)
        norm = E.sum(axis=1, keepdims=True)
        loss = float(-(Y * (S - np.log(norm))).sum()) / n + float((W[:-1] ** 2).sum()) / (2 * C_HEAD * n)
        G = A.T @ (E / norm - Y) / n
        G[:-1] += W[:-1] / (C_HEAD * n)
        return loss, G.ravel()

    w = minimize(loss_grad, np.zeros((d + 1) * m), jac=True, method="L-BFGS-B",
                 options={"maxiter": 500, "gtol": 1e-4, "maxls": 50}).x.reshape(d + 1, m)
    S = np.hstack([Z_te, np.ones((len(Z_te), 1))]) @ w
    S -= S.max(axis=1, keepdims=True)
    E = np.exp(S)
    P[:, classes] = E / E.sum(axis=1, keepdims=True)
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


ORDERS: dict[str, dict[str, str]] = {  # name: rank()'s settings ("random": no ranking)
    "random": {},
    "suggested": {"by": "margin", "cold": "typical"},  # rank()'s default: TypiClust cold start, then margin
    "margin, no cold start": {"by": "margin", "cold": "none"},
    "entropy, no cold start": {"by": "entropy", "cold": "none"},
    "margin, cold start by prediction (before)": {"by": "margin", "cold": "predicted"},
    # the suggested order with a share of each batch drawn at random (suggest.batch): 1 and 2 of every 4
    "suggested, random share 0.25": {"by": "margin", "cold": "typical", "share": "0.25"},
    "suggested, random share 0.5": {"by": "margin", "cold": "typical", "share": "0.5"},
}
MIXED = ("suggested, random share 0.25", "suggested, random share 0.5")
GATED = ("random", "suggested", *MIXED)  # the orders whose gate is measured (5 more fits a point)
VARIANTS = ("suggested", "margin, no cold start", "entropy, no cold start", "margin, cold start by prediction (before)")
LEAN_AT = (50, 82)  # the budgets the lean table shows (points where the gate is measured)


def next_batch(P: np.ndarray, Z: np.ndarray, y: np.ndarray, k: int, labeled: list[int], rest: list[int], want: int,
               how: dict[str, str], seed: int, keys: np.ndarray | None = None) -> tuple[list[int], list[int]]:
    """The next `want` rows of `rest` (P: the current head's probabilities on them) in the order `how` picks, and
    those of them drawn at random (a random share: suggest.batch; `keys`: every row's fixed random key, as a stored
    pool's - the open rows with the smallest are drawn)."""
    counts = None if how["cold"] == "none" else [int(c) for c in np.bincount(y[labeled], minlength=k)]
    by: Literal["margin", "entropy"] = "entropy" if how["by"] == "entropy" else "margin"
    if how["cold"] == "predicted":  # the rule before: rows predicted as an option short of labels, no vectors
        picked = suggest.rank(P, k=want, counts=counts, by=by)
        return [rest[i] for i in picked], []
    got = suggest.batch(P, k=want, random_share=float(how.get("share", 0.0)), X=Z[rest], counts=counts, by=by,
                        labeled_X=Z[labeled], seed=seed, keys=None if keys is None else keys[rest])
    return [rest[i] for i in got.rows], [rest[i] for i in sorted(got.drawn)]


def gate_coverage(Po: np.ndarray, y: np.ndarray, target: float, P_te: np.ndarray) -> float:
    """Held-out coverage of the gate Calibrate would choose on these labeled rows (Po: their out-of-fold
    probabilities; 0: none recommended)."""
    conf, right = Po.max(axis=1), Po.argmax(axis=1) == y
    # choose_gate's rule, vectorised, to skip its rows-needed search when no threshold clears the bound
    ts = np.unique(conf)
    m = np.array([(conf >= t).sum() for t in ts])
    r = np.array([right[conf >= t].sum() for t in ts])
    with np.errstate(all="ignore"):
        lb = np.where(r > 0, beta.ppf(1 - calibration.CONFIDENCE, np.maximum(r, 1), m - r + 1), 0.0)
    if not np.any(lb >= target - 1e-12):
        return 0.0
    g = calibration.choose_gate(conf, right, target)
    return float((P_te.max(axis=1) >= g.threshold).mean()) if g.reachable and g.threshold is not None else 0.0


# held-out accuracy, gate coverage, OOF accuracy on all labeled rows, on the drawn ones (how many), on the pool sample
# (how many: the labeled rows whose key is at most the largest drawn key - the drawn ones and the suggested ones the
# draw would have taken: run_calibration.drawn_rows' rule)
Point = tuple[float, float, float, float, int, float, int]


def curve(Z: np.ndarray, y: np.ndarray, k: int, seed: int, order: str, target: float,
          gate: bool = True) -> dict[int, Point]:
    """{labels: (held-out accuracy, held-out gate coverage, out-of-fold accuracy of every labeled row, of the rows
    drawn at random alone, how many were drawn)} for one seed and one order, after every batch (the same held-out
    rows and the same first two labels for every order of a seed). The gate and the out-of-fold figures are
    measured every second batch (nan between); in the random order every row after the first two is drawn."""
    rng = np.random.default_rng(seed)
    test_idx = np.sort(rng.permutation(len(y))[: int(HELD_OUT * len(y))])
    held = set(test_idx.tolist())
    pool = [i for i in range(len(y)) if i not in held]
    two = rng.choice(np.unique(y[pool]), 2, replace=False)
    labeled = [int(rng.choice([i for i in pool if y[i] == c])) for c in two]
    out: dict[int, Point] = {}
    drawn: set[int] = set()
    nan = float("nan")
    keys = np.random.default_rng([seed, 7]).random(len(y))  # each row's fixed draw key (a stored pool's draw_keys)
    while True:
        L = np.array(labeled)
        rest = [i for i in pool if i not in set(labeled)]
        P = fit_predict(Z[L], y[L], np.vstack([Z[test_idx], Z[rest]]), k)  # one fit: held-out rows and the rest
        P_te, P_rest = P[: len(test_idx)], P[len(test_idx):]
        acc = float((P_te.argmax(axis=1) == y[test_idx]).mean())
        point: Point = (acc, nan, nan, nan, len(drawn), nan, 0)
        if gate and (len(out) % 2 == 0 or not rest):  # every second batch (8 labels), and with the whole pool
            if len(L) < 4 or len(np.unique(y[L])) < 2:
                point = (acc, 0.0, nan, nan, len(drawn), nan, 0)
            else:
                Po = oof(Z[L], y[L], k, seed)
                right = Po.argmax(axis=1) == y[L]
                mask = np.array([i in drawn for i in labeled])
                # the check's sample, as run_calibration.drawn_rows reads it: the pool in key order up to the first
                # row not labeled (only once the share has drawn: before, Calibrate shows no check)
                prefix: set[int] = set()
                if drawn:
                    have = set(labeled)
                    for i in sorted(pool, key=lambda j: keys[j]):
                        if i not in have:
                            break
                        prefix.add(i)
                sample = np.array([i in prefix for i in labeled]) if order != "random" else mask
                point = (acc, gate_coverage(Po, y[L], target, P_te), float(right.mean()),
                         float(right[mask].mean()) if mask.any() else nan, int(mask.sum()),
                         float(right[sample].mean()) if sample.any() else nan, int(sample.sum()))
        out[len(labeled)] = point
        if not rest:
            return out
        want = min(BATCH, len(rest))
        if order == "random":
            new = [int(i) for i in rng.choice(rest, want, replace=False)]
            labeled += new
            drawn.update(new)
        else:
            new, got = next_batch(P_rest, Z, y, k, labeled, rest, want, ORDERS[order], seed, keys)
            labeled += new
            drawn.update(got)


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
    return label_issues.recall_of_flips([s.index for s in found], [int(i) for i in idx]), len(found) / len(y)


def reaching(mean_acc: dict[int, float], level: float) -> float | None:
    """Labels at which the mean curve first reaches `level`, linearly interpolated between the two grid points
    around the crossing (the figure is then not quantised to the batch size); None: never."""
    budgets = sorted(mean_acc)
    for j, b in enumerate(budgets):
        if mean_acc[b] >= level:
            if j == 0:
                return float(b)
            a0, a1, b0 = mean_acc[budgets[j - 1]], mean_acc[b], budgets[j - 1]
            return float(b0 + (level - a0) / (a1 - a0) * (b - b0))
    return None


def mean_curve(cs: list[dict[int, Point]], what: int = 0) -> dict[int, float]:
    budgets = sorted(set.intersection(*(set(c) for c in cs)))
    return {b: float(np.mean([c[b][what] for c in cs])) for b in budgets}


def need_ratio(rand: list[dict[int, Point]], sugg: list[dict[int, Point]], pool: int) -> tuple[float | None, float | None, float | None]:
    """(random's labels, the order's labels, ratio) to reach the whole pool's held-out accuracy - 2 points."""
    whole = float(np.mean([c[pool][0] for c in rand]))
    nr, ns = reaching(mean_curve(rand), whole - 0.02), reaching(mean_curve(sugg), whole - 0.02)
    return nr, ns, (ns / nr if nr and ns else None)


def ratio_interval(rand: list[dict[int, Point]], sugg: list[dict[int, Point]], pool: int) -> tuple[float, float] | None:
    """95% percentile bootstrap interval of the ratio, resampling seeds (paired: a seed's two orders together)."""
    rng = np.random.default_rng(0)
    got = []
    for _ in range(BOOT):
        pick = rng.integers(0, len(rand), len(rand))
        _, _, r = need_ratio([rand[i] for i in pick], [sugg[i] for i in pick], pool)
        if r is not None:
            got.append(r)
    return (float(np.percentile(got, 2.5)), float(np.percentile(got, 97.5))) if got else None


def seed_curves(Z: np.ndarray, y: np.ndarray, k: int, target: float, orders: tuple[str, ...],
                seed: int) -> dict[str, dict[int, Point]]:
    return {o: curve(Z, y, k, seed, o, target, gate=o in GATED) for o in orders}


def run(seeds: int, target: float, jobs: int = 1, orders: tuple[str, ...] = tuple(ORDERS)) -> tuple[str, list[str]]:
    data = label_states.states()
    lines, variant_lines, mixed_lines, summary = [], [], [], []
    aulc: dict[str, dict[str, float]] = {}  # set: {order: mean held-out accuracy over the curve}
    ratios: dict[str, dict[str, float | None]] = {}
    gated = [o for o in GATED if o in orders]
    for name, (ids, X, y, options) in data.items():
        t0 = time.perf_counter()
        k = len(options)
        Z = features(X)
        full = float((oof(Z, y, k).argmax(axis=1) == y).mean())
        pool = len(y) - int(HELD_OUT * len(y))
        with ProcessPoolExecutor(jobs) if jobs > 1 else nullcontext() as pool_ex:
            mapper = pool_ex.map if pool_ex is not None else map
            per_seed = list(mapper(partial(seed_curves, Z, y, k, target, orders), range(seeds)))
        curves = {o: [c[o] for c in per_seed] for o in orders}
        whole = float(np.mean([c[pool][0] for c in curves["random"]]))  # every pool row labeled
        mean_acc = {o: mean_curve(cs) for o, cs in curves.items()}
        aulc[name] = {o: float(np.mean(list(m.values()))) for o, m in mean_acc.items()}
        ratios[name] = {o: need_ratio(curves["random"], cs, pool)[2] for o, cs in curves.items() if o != "random"}
        nr, ns, ratio = need_ratio(curves["random"], curves["suggested"], pool)
        interval = ratio_interval(curves["random"], curves["suggested"], pool)
        gate_at, mean_cov = {}, {}
        for o in gated:
            cs = curves[o]
            mean_cov[o] = {b: v for b, v in mean_curve(cs, 1).items() if not np.isnan(v)}
            firsts = [next((b for b in sorted(c) if c[b][1] > 0), None) for c in cs]  # nan: not measured
            got = [f for f in firsts if f is not None]
            gate_at[o] = (float(np.median(got)) if got else None, len(got))
        rec = [flips(Z, y, k, s) for s in range(seeds)]
        needs = (f"{_n(nr, pool)} / {_n(ns, pool)}" + (f" (**{ratio:.0%}**" if ratio else "")
                 + (f", {interval[0]:.0%}–{interval[1]:.0%})" if ratio and interval else ")" if ratio else ""))
        accs = " | ".join(f"{mean_acc['random'][b]:.1%} / {mean_acc['suggested'][b]:.1%}" if b in mean_acc["random"]
                          and b in mean_acc["suggested"] else "-" for b in SHOWN)
        covs = " / ".join(f"{mean_cov[o].get(pool, float('nan')):.0%}" for o in ("random", "suggested"))
        lines.append(f"| {name} | {len(y)} | {k} | {full:.1%} | {whole:.1%} ({pool}) | {accs} | {needs} | "
                     f"{_gate(gate_at['random'], seeds)} / {_gate(gate_at['suggested'], seeds)} | {covs} | "
                     f"{np.mean([r for r, _ in rec]):.0%} at {np.mean([f for _, f in rec]):.1%} flagged |")
        for o in ("random", "suggested", *[m for m in MIXED if m in orders]):
            _, no, r_o = need_ratio(curves["random"], curves[o], pool)
            iv = ratio_interval(curves["random"], curves[o], pool) if r_o and o != "random" else None
            lean = " | ".join(_lean(curves[o], b) for b in LEAN_AT)
            mixed_lines.append(f"| {name} | {o} | {_n(no, pool)}" + (f" ({r_o:.0%}" if r_o and o != "random" else "")
                               + (f", {iv[0]:.0%}–{iv[1]:.0%})" if iv else ")" if r_o and o != "random" else "")
                               + f" | {_gate(gate_at[o], seeds)} | {mean_cov[o].get(pool, float('nan')):.0%} | {lean} |")
        summary.append(f"{name}: all rows OOF {full:.1%}, whole pool labeled {whole:.1%}; labels to reach it - 2 pts "
                       f"random {nr} suggested {ns} ratio {ratio} interval {interval}; ratios {ratios[name]}; "
                       f"mean accuracy over the curve {aulc[name]}; gate first at (median) {gate_at}; flips recall "
                       f"{np.mean([r for r, _ in rec]):.1%}; lean at {LEAN_AT}: "
                       + "; ".join(f"{o}: " + ", ".join(_lean(curves[o], b) for b in LEAN_AT) for o in gated)
                       + f" ({time.perf_counter() - t0:.0f} s)")
        print(summary[-1], flush=True)
    variants = [o for o in VARIANTS if o in orders]
    for name in aulc:  # the design choice, cross-validated: the order with the best mean curve on the OTHER sets
        others = [s for s in aulc if s != name]
        chosen = max(variants, key=lambda o: float(np.mean([aulc[s][o] - aulc[s]["random"] for s in others])))
        cells = " | ".join(f"{_r(ratios[name][o])} ({aulc[name][o] - aulc[name]['random']:+.1%})" for o in variants)
        variant_lines.append(f"| {name} | {cells} | {chosen}: {_r(ratios[name][chosen])} |")
    header = ("| set | rows | options | all rows, out of fold | held out, every pool row labeled (pool) | "
              + " | ".join(f"accuracy at {b} labels, random / suggested" if i == 0 else f"at {b}"
                           for i, b in enumerate(SHOWN))
              + " | labels to reach the whole pool's accuracy − 2 pts, random / suggested (**ratio**, 95% interval "
              "over seeds) | labels to a gate, median random / suggested (seeds reaching one) | held-out gate coverage, "
              "every pool row labeled, random / suggested | 5% flipped labels found (cleanlab, ≤ 10% flagged) |\n"
              + "|---" * (9 + len(SHOWN)) + "|\n")
    vheader = ("\n\nEvery order tried, per set: labels needed as a share of random's (as above), and in brackets the "
               "mean held-out accuracy over the whole curve minus random's. Last column: the order a leave-one-set-out "
               "choice picks (best mean curve on the *other* three sets) and its share on this set.\n\n"
               "| set | " + " | ".join(variants) + " | chosen on the other sets: share here |\n"
               + "|---" * (len(variants) + 2) + "|\n")
    mheader = ("\n\nA random share in every batch (suggest.batch: 1 or 2 of each batch of 4 drawn at random from the "
               "open rows, the rest suggested): labels to the whole pool's accuracy − 2 pts (share of random's, 95% interval over "
               "seeds), labels "
               "to a gate (median, seeds reaching one), held-out gate coverage with every pool row labeled, and the lean "
               "- at " + " and ".join(str(b) for b in LEAN_AT) + " labels, the mean over seeds of the held-out accuracy "
               "/ the out-of-fold accuracy of every labeled row (what the gate is chosen on) / of the rows drawn at random "
               "alone / of the pool sample (the check, as run_calibration.drawn_rows reads it: the pool in random-key order "
               "up to the first row not labeled; mean rows in brackets).\n\n"
               "| set | order | labels to accuracy − 2 pts (share of random's, interval) | labels to a gate | gate coverage, "
               "whole pool | " + " | ".join(f"at {b} labels: held out / OOF all / OOF drawn (rows) / OOF pool sample (rows)"
                                     for b in LEAN_AT)
               + " |\n" + "|---" * (5 + len(LEAN_AT)) + "|\n")
    return (header + "\n".join(lines) + (vheader + "\n".join(variant_lines) if len(variants) > 1 else "")
            + (mheader + "\n".join(mixed_lines) if mixed_lines else "")), summary


def _lean(cs: list[dict[int, Point]], at: int) -> str:
    """'held out / OOF all / OOF drawn (rows) / OOF pool sample (rows)' at `at` labels, means over the seeds
    measured there."""
    pts = [c[at] for c in cs if at in c and not np.isnan(c[at][2])]
    if not pts:
        return "-"
    drawn = [p[3] for p in pts if not np.isnan(p[3])]
    sample = [p[5] for p in pts if not np.isnan(p[5])]
    return (f"{np.mean([p[0] for p in pts]):.1%} / {np.mean([p[2] for p in pts]):.1%} / "
            + (f"{np.mean(drawn):.1%} ({np.mean([p[4] for p in pts]):.0f})" if drawn else "-") + " / "
            + (f"{np.mean(sample):.1%} ({np.mean([p[6] for p in pts]):.0f})" if sample else "-"))


def _n(x: float | None, pool: int) -> str:
    return f">{pool}" if x is None else f"{x:.0f}"


def _r(x: float | None) -> str:
    return "never" if x is None else f"{x:.0%}"


def _gate(g: tuple[float | None, int], seeds: int) -> str:
    return "none" if g[0] is None else f"{g[0]:.0f} ({g[1]}/{seeds})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--jobs", type=int, default=1, help="processes for the seeds (default 1)")
    ap.add_argument("--orders", default="all", help="orders to run, separated by ';' (default all: "
                    + "; ".join(ORDERS) + "); random and suggested always run")
    ap.add_argument("--no-publish", action="store_true")
    args = ap.parse_args()
    asked = tuple(ORDERS) if args.orders == "all" else tuple(o.strip() for o in args.orders.split(";"))
    unknown = [o for o in asked if o not in ORDERS]
    if unknown:
        ap.error(f"--orders: {unknown[0]!r} is not an order ({'; '.join(ORDERS)})")
    orders = tuple(o for o in ORDERS if o in {"random", "suggested", *asked})
    table, _ = run(args.seeds, args.target, args.jobs, orders)
    print(table)
    if not args.no_publish:
        body = (f"Measured {date.today()} on {platform.machine()} ({platform.processor() or 'CPU'}), 2 cores shared with "
                f"other work; hidden states of the default model in the head layout (bench/label_states.py), "
                f"{args.seeds} seeds, target accuracy {args.target:.0%}, {HELD_OUT:.0%} of each set held out per seed, "
                f"labels in batches of {BATCH} (every curve measured after every batch; the labels needed are "
                f"interpolated between batches), starting from one row of each of two options.\n\n" + table)
        publish("labels", body)


if __name__ == "__main__":
    main()

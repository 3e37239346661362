"""Calibration maths on hand-computed cases and against properties."""
from __future__ import annotations

import numpy as np
import pytest

from app.core import calibration as C


def test_hand_computed_metrics():
    P = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    y = np.array([0, 1, 1, 1])
    assert C.accuracy(P, y) == pytest.approx(0.75)
    assert C.confusion_matrix(y, C.predictions(P), 2).tolist() == [[1, 0], [1, 2]]
    # class 0: tp1 fp1 fn0 -> 2/3; class 1: tp2 fp0 fn1 -> 4/5
    assert C.macro_f1(y, C.predictions(P), 2) == pytest.approx((2 / 3 + 4 / 5) / 2)
    # Brier: (0.01+0.01) + (0.04+0.04) + (0.36+0.36) + (0.09+0.09) = 1.0 -> /4
    assert C.brier(P, y) == pytest.approx(0.25)
    assert C.nll(P, y) == pytest.approx(-np.mean(np.log([0.9, 0.8, 0.4, 0.7])))


def test_ece_hand_computed_and_bins():
    conf = np.array([0.95, 0.95, 0.65, 0.65, 0.65])
    correct = np.array([1, 0, 1, 1, 0])
    bins = C.reliability(conf, correct, 10, "width")
    assert [(b.count, round(b.confidence, 2), round(b.accuracy, 3)) for b in bins] == [(3, 0.65, 0.667), (2, 0.95, 0.5)]
    assert C.ece(conf, correct, 10, "width") == pytest.approx(3 / 5 * abs(2 / 3 - 0.65) + 2 / 5 * 0.45)
    mass = C.reliability(conf, correct, 2, "mass")
    assert sum(b.count for b in mass) == 5 and len(mass) == 2


def test_ece_of_a_perfectly_calibrated_set_is_near_zero():
    rng = np.random.default_rng(1)
    n, k = 20000, 3
    P = rng.dirichlet(np.ones(k), size=n)
    y = np.array([rng.choice(k, p=p) for p in P])  # labels drawn from the stated probabilities
    conf, correct = P.max(axis=1), C.predictions(P) == y
    assert C.ece(conf, correct, 10, "width") < 0.02
    assert C.ece(conf, correct, 10, "mass") < 0.02


def overconfident(n, k=4, seed=0, sharpen=3.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * 1.5
    true_p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    y = np.array([rng.choice(k, p=p) for p in true_p])
    shown = np.exp(logits * sharpen)
    return shown / shown.sum(axis=1, keepdims=True), y


def test_temperature_scaling_keeps_argmax_and_lowers_held_out_nll():
    P, y = overconfident(3000)
    fit, hold = np.arange(0, 1500), np.arange(1500, 3000)
    T = C.fit_temperature(P[fit], y[fit])
    assert T == pytest.approx(3.0, rel=0.15)  # undoes the sharpening
    cal = C.apply_temperature(P[hold], T)
    assert (C.predictions(cal) == C.predictions(P[hold])).all()
    assert C.nll(cal, y[hold]) < C.nll(P[hold], y[hold]) - 0.1
    conf_b, conf_a = P[hold].max(1), cal.max(1)
    ok = C.predictions(cal) == y[hold]
    assert C.ece(conf_a, ok) < C.ece(conf_b, ok)


def test_cross_validated_temperature_reports_out_of_fold():
    P, y = overconfident(600, seed=3)
    rep, oof = C.report(P, y, k_folds=5)
    assert len(rep.fold_temperatures) == 5 and all(t > 1.5 for t in rep.fold_temperatures)
    assert rep.oof_ece_width < rep.ece_width and rep.oof_nll < rep.nll
    assert (C.predictions(oof) == C.predictions(P)).all()
    assert rep.size_flag == "ok" and C.size_flag(12) == "provisional" and C.size_flag(150) == "provisional"


def cp_by_hand(k: int, n: int) -> float:
    """The one-sided 95% Clopper-Pearson lower bound from its definition: the p at which P(X >= k | n, p)
    = 5% (binomial tail), found by bisection - independent of the beta quantile the code uses."""
    from scipy.stats import binom

    if k == 0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if binom.sf(k - 1, n, mid) < 0.05 else (lo, mid)
    return (lo + hi) / 2


def test_the_clopper_pearson_bound_recomputed_by_hand():
    from scipy.stats import binomtest

    for k, n in [(29, 29), (45, 46), (59, 61), (73, 76), (90, 100), (3, 7), (1, 1)]:
        assert C.cp_lower(k, n) == pytest.approx(cp_by_hand(k, n), abs=1e-9)
        # scipy's exact one-sided interval says the same
        assert C.cp_lower(k, n) == pytest.approx(binomtest(k, n, alternative="greater").proportion_ci(0.95).low)
    assert C.cp_lower(29, 29) == pytest.approx(0.05 ** (1 / 29))  # 0 errors: (1 - confidence) ** (1/n)
    # what a 90% gate needs (DESIGN §11): 29 decided rows with 0 errors, 46 with 1, 61 with 2, 76 with 3
    for errors, rows in [(0, 29), (1, 46), (2, 61), (3, 76)]:
        assert C.cp_lower(rows - errors, rows) >= 0.9 > C.cp_lower(rows - 1 - errors, rows - 1)
    assert C.decided_needed(1.0, 0.9) == 29 and C.decided_needed(0.9, 0.9) is None


def test_gate_is_the_lowest_whose_bound_clears_the_target():
    rng = np.random.default_rng(5)
    n = 2000
    conf = rng.uniform(0.3, 1.0, n)
    correct = rng.uniform(size=n) < conf  # calibrated: accuracy rises with confidence
    gate = C.choose_gate(conf, correct, 0.9)
    assert gate.reachable and 0 < gate.coverage < 1
    acc = conf >= gate.threshold
    assert (gate.decided, gate.correct) == (int(acc.sum()), int(correct[acc].sum()))
    assert gate.lower_bound == pytest.approx(cp_by_hand(gate.correct, gate.decided), abs=1e-9) and gate.lower_bound >= 0.9
    # every lower gate's decided rows have a bound below the target
    for t in np.unique(conf[conf < gate.threshold])[-50:]:
        m = conf >= t
        assert cp_by_hand(int(correct[m].sum()), int(m.sum())) < 0.9
    rc = C.risk_coverage(conf, correct)
    assert rc.coverage[-1] == 1 and rc.accuracy[-1] == pytest.approx(correct.mean())


def test_a_gate_at_any_n_from_its_evidence():
    """30 rows, the 29 most confident right: the bound allows a gate (no row floor); 28 right of 28 do not,
    and the message says how many more rows at that accuracy would."""
    conf = np.linspace(0.99, 0.5, 30)
    gate = C.choose_gate(conf, np.array([True] * 29 + [False]), 0.9)
    assert gate.reachable and (gate.decided, gate.correct) == (29, 29) and gate.threshold == pytest.approx(conf[28])
    small = C.choose_gate(conf[:28], np.ones(28, bool), 0.9)
    assert not small.reachable and small.reach is not None
    assert (small.reach.needed, small.reach.more, small.reach.coverage) == (29, 1, 1.0)
    assert "about 1 more labeled rows (29 in all)" in small.note
    # the projected accuracy names the rows it rests on (a walkthrough read "at 100.0%" from 5 rows as a finding)
    assert "deciding about 100% of rows at 100.0% (as 28 decided of 28 rows were so far: a projection" in small.note


def test_unreachable_target_is_reported_not_faked():
    rng = np.random.default_rng(6)
    conf = rng.uniform(0.3, 1.0, 400)
    correct = rng.uniform(size=400) < 0.5  # confidence carries no information
    gate = C.choose_gate(conf, correct, 0.95)
    assert not gate.reachable and gate.note and gate.threshold is None


def test_rows_needed_come_from_the_same_bound():
    # 40 rows: the 20 most confident 19 right (95%), the rest a coin
    conf = np.linspace(1, 0.2, 40)
    correct = np.array([True] * 10 + [False] + [True] * 9 + [True, False] * 10)
    gate = C.choose_gate(conf, correct, 0.9)
    assert not gate.reachable
    reach = gate.reach
    assert reach is not None and reach.rows == 40 and reach.needed > 40 and reach.more == reach.needed - 40
    m = round(reach.needed * reach.coverage)  # the decided rows expected then, at the accuracy measured
    assert cp_by_hand(round(m * reach.accuracy), m) >= 0.9 - 1e-6
    # no curve point beating the target would get there with fewer rows
    curve = C.risk_coverage(conf, correct)
    fewer = reach.needed - 1
    for c, a in zip(curve.coverage, curve.accuracy):
        if a > 0.9:
            d = int(c * fewer)  # fewer rows: fewer decided rows expected than the bound needs
            assert cp_by_hand(int(round(d * a)), d) < 0.9 + 1e-6


def test_per_option_gates_fit_each_option_on_its_own_rows():
    """Option 0's predictions are always right, option 1's are a coin flip at the same confidence:
    a per-option gate lets option 0 through and keeps option 1 out - one global gate cannot."""
    rng = np.random.default_rng(3)
    n = 400
    conf = rng.uniform(0.55, 0.99, size=n)
    pred = np.repeat([0, 1], n // 2)
    P = np.zeros((n, 2))
    P[np.arange(n), pred], P[np.arange(n), 1 - pred] = conf, 1 - conf
    y = np.where(pred == 0, 0, np.where(rng.random(n) < 0.5, 1, 0))
    gates = C.per_option_gates(P, y, 0.9)
    assert set(gates) == {0, 1}
    assert gates[0].reachable and gates[0].accuracy == 1.0 and gates[0].decided == 200  # all right: the lowest gate
    assert not gates[1].reachable
    m = pred == 0  # each option's gate is fitted on the rows predicted as that option, and only those
    assert gates[0] == C.choose_gate(conf[m], y[m] == 0, 0.9)
    assert not C.choose_gate(conf, C.predictions(P) == y, 0.9).reachable

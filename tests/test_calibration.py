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
    assert rep.size_flag == "ok" and C.size_flag(49) == "too-small" and C.size_flag(150) == "provisional"


def test_gate_meets_its_target_on_the_held_out_split():
    rng = np.random.default_rng(5)
    n = 2000
    conf = rng.uniform(0.3, 1.0, n)
    correct = rng.uniform(size=n) < conf  # calibrated: accuracy rises with confidence
    gate = C.choose_gate(conf, correct, 0.9, seed=0)
    assert gate.reachable and gate.holdout_accuracy >= 0.9 and 0 < gate.holdout_coverage < 1
    # the lowest such gate on the fit half: one step lower, the 95% lower bound misses the target
    fit, _ = C.holdout_split(n, 0)
    below = conf[fit] >= np.max(conf[fit][conf[fit] < gate.threshold])
    assert C.wilson_lower(int(correct[fit][below].sum()), int(below.sum())) < 0.9
    assert C.wilson_lower(90, 100) == pytest.approx(0.8395, abs=1e-3)
    rc = C.risk_coverage(conf, correct)
    assert rc["coverage"][-1] == 1 and rc["accuracy"][-1] == pytest.approx(correct.mean())


def test_unreachable_target_is_reported_not_faked():
    rng = np.random.default_rng(6)
    conf = rng.uniform(0.3, 1.0, 400)
    correct = rng.uniform(size=400) < 0.5  # confidence carries no information
    gate = C.choose_gate(conf, correct, 0.95)
    assert not gate.reachable and gate.note


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
    assert gates[0].reachable and gates[0].holdout_accuracy == 1.0
    assert not gates[1].reachable
    m = pred == 0  # each option's gate is fitted on the rows predicted as that option, and only those
    assert gates[0] == C.choose_gate(conf[m], y[m] == 0, 0.9, min_accepted=3)
    assert not C.choose_gate(conf, C.predictions(P) == y, 0.9).reachable

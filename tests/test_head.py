"""The learned head (issue 28), without a model: its file format and the errors that name the field,
the one rule that applies it, fitting out of fold with the regularisation chosen on training rows
only, and the choice that keeps a head only when it beats the corrections beyond noise."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from adapter.policy import PolicyError, RowReading, load_policy
from adapter.head import Head, build_head, encode
from adapter.schema import HiddenState
from app.core import calibration, heads
from app.core.stored import StoredResponse

SHA = "a" * 64
IDS = ["access", "billing", "technical", "shipping"]


def synthetic(n_per: int = 16, width: int = 20, signal: float = 4.0, seed: int = 0):
    """Rows whose hidden state carries the label in a few directions while the zero-shot
    probabilities carry none: the case a head is for."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(len(IDS)), n_per)
    H = rng.normal(size=(len(y), width))
    H[np.arange(len(y)), y] += signal
    P = rng.dirichlet(np.ones(len(IDS)), size=len(y))
    return H, P, y


def a_head(kind="hidden", k=4, width=40, **change) -> dict:
    m = (width if kind != "linc" else 0) + (k if kind != "hidden" else 0)
    rng = np.random.default_rng(1)
    head = build_head(kind, IDS[:k], hidden_dim=width if kind != "linc" else 0, center=np.zeros(m), scale=np.ones(m),
                      W=rng.normal(size=(k, m)), b=np.zeros(k), model_sha256=SHA, prompt_version="letters/1",
                      regularisation=1.0, rows=48).model_dump()
    head.update(change)
    return head


def policy_with(head: dict | None, **change) -> dict:
    pol = {"schema_version": "semif-policy/1", "policy_id": "routing", "question": "Which queue?",
           "options": [{"id": i} for i in IDS], "readout": "letters", "debias": "none", "prompt_version": "letters/1",
           "model": {"file": "m.gguf", "sha256": SHA}, "temperature": 1.0, "threshold": 0.5,
           "fallback_option": "human-review", "created_at": "2026-12-03T00:00:00Z", "head": head}
    pol.update(change)
    return pol


def test_head_applies_as_a_softmax_over_standardised_features_and_rounds_to_float16():
    rng = np.random.default_rng(3)
    W, b = rng.normal(size=(4, 44)) * 0.01, rng.normal(size=4)
    center, scale = rng.normal(size=44), rng.uniform(0.5, 2, size=44)
    head = build_head("stacked", IDS, hidden_dim=40, center=center, scale=scale, W=W, b=b, model_sha256=SHA,
                      prompt_version="letters/1", regularisation=0.1, rows=48)
    h, p = rng.normal(size=40), [0.7, 0.2, 0.1, 0.0]
    x = (np.concatenate([h, np.log(np.maximum(p, 1e-6))]) - center.astype(np.float32)) / scale.astype(np.float32)
    z = W @ x + b
    want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    got = head.probabilities(h, p)
    assert np.allclose(got, want, atol=2e-3) and abs(sum(got) - 1) < 1e-12  # float16 weights, per-row scaled
    assert got == head.probabilities(h, p)  # the same bits every call
    _, _, W16, _ = head.arrays()
    assert np.max(np.abs(W16 - W) / np.abs(W).max(axis=1, keepdims=True)) < 1e-3  # small rows keep their precision


@pytest.mark.parametrize("change, field", [
    ({"weights": encode(np.zeros(7), "<f2")}, "weights: holds 7 values"),
    ({"weights": encode(np.full(160, np.nan), "<f2")}, "weights: holds NaN"),
    ({"bias": [0.0, 0.0, float("nan"), 0.0]}, "bias: holds NaN"),
    ({"scale": encode(np.zeros(40), "<f4")}, "scale: every feature's scale must be > 0"),
    ({"weights": "not base64!"}, "weights: not base64"),
    ({"kind": "linc"}, "hidden_dim: a linc head reads no hidden state"),
])
def test_a_malformed_head_is_refused_with_the_field_named(change, field):
    with pytest.raises(PolicyError) as exc:
        load_policy(policy_with({**a_head(), **change}))
    assert field in str(exc.value) and "\n" not in str(exc.value)


def test_a_head_for_three_options_on_a_four_option_policy_is_refused():
    with pytest.raises(PolicyError, match=r"head.*a head for 3 options .* on a 4-option policy"):
        load_policy(policy_with(a_head(k=3)))


def test_a_head_from_another_model_or_prompt_is_refused():
    with pytest.raises(PolicyError, match=r"head.*fitted on another model"):
        load_policy(policy_with(a_head(model_sha256="b" * 64)))
    with pytest.raises(PolicyError, match=r"head.*fitted on prompt letters/1.*reads option-words/1"):
        load_policy(policy_with(a_head(), prompt_version="option-words/1", readout="option-words"))
    with pytest.raises(PolicyError, match="temperature is 1"):
        load_policy(policy_with(a_head(), temperature=2.0))


def test_a_row_the_head_cannot_read_goes_to_the_fallback():
    policy = load_policy(policy_with(a_head()))
    probs = [0.4, 0.3, 0.2, 0.1]
    h = np.ones(40)
    ok = policy.apply(RowReading(tuple(IDS), tuple(probs), hidden=h, prompt_version="letters/1", hidden_model=SHA))
    assert list(ok.calibrated_probabilities) == policy.head.probabilities(h, probs)
    for kwargs, reason in [({}, "without its hidden state"),
                           ({"hidden": np.ones(39)}, "has 39 values; the head reads 40"),
                           ({"hidden": h, "prompt_version": "letters-examples/1"}, "not the prompt the head was fitted on"),
                           ({"hidden": h, "hidden_model": "c" * 64}, "another model")]:
        d = policy.apply(RowReading(tuple(IDS), tuple(probs), **kwargs))
        assert d.gated and d.option_id == "human-review" and reason in d.reason, (kwargs, d)


def test_a_stored_response_reads_like_a_result():
    h = np.arange(5, dtype=np.float32) / 3
    response = {"hidden_state": HiddenState.of(h).model_dump(), "prompt_version": "letters/1",
                "model": {"sha256": SHA}}
    got = StoredResponse.parse(json.loads(json.dumps(response))).reading(IDS, [0.25] * 4)
    assert got.hidden.tolist() == h.astype(np.float64).tolist() and got.hidden_model == SHA
    assert got.prompt_version == "letters/1" and not got.steering_suspected
    bad = HiddenState.of(h).model_dump() | {"dim": 6}
    with pytest.raises(ValueError, match="holds 5 values, not dim=6"):
        HiddenState.model_validate(bad).array()
    assert base64.b64decode(HiddenState.of(h).data) == h.astype("<f4").tobytes()  # exact


def test_a_head_lifts_rows_whose_hidden_state_carries_the_label_and_is_chosen_beyond_noise():
    H, P, y = synthetic()
    fits = heads.candidates(H, P, y, option_ids=IDS, model_sha256=SHA, prompt_version="letters/1")
    by = {f.kind: f for f in fits}
    assert by["hidden"].oof_accuracy >= 0.85 and by["linc"].oof_accuracy < 0.6  # the log-probs carry nothing
    assert all(C in heads.C_GRID for C in by["hidden"].fold_regularisation)
    base = calibration.corrections({"none": P}, y)
    best, _ = calibration.choose_correction(base, len(y))
    choice = heads.choose(fits, best.oof, best.name, y)
    assert choice.head is not None and choice.head.kind in ("hidden", "stacked") and choice.gain.beyond_noise
    assert "adds +" in choice.why and "95% CI" in choice.why and "McNemar" in choice.why


def test_no_head_is_chosen_when_it_does_not_beat_the_correction_beyond_noise():
    H, P, y = synthetic(signal=0.0)  # nothing to learn
    fits = heads.candidates(H, P, y, option_ids=IDS, model_sha256=SHA, prompt_version="letters/1")
    best, _ = calibration.choose_correction(calibration.corrections({"none": P}, y), len(y))
    choice = heads.choose(fits, best.oof, best.name, y)
    assert choice.head is None and "the export carries no head" in choice.why


def test_out_of_fold_rows_never_train_the_head_that_predicts_them():
    """Changing the rows of one test fold changes nothing another row of that fold is predicted
    with: the fit (and the inner choice of C) that predicts a fold saw none of its rows."""
    H, P, y = synthetic(n_per=10)
    fold = calibration.folds(len(y), calibration.CV_FOLDS, 0, y)[0]
    before = heads.candidates(H, P, y, option_ids=IDS, model_sha256=SHA, prompt_version="letters/1")[1].oof
    H2 = H.copy()
    H2[fold[1:]] = np.random.default_rng(9).normal(size=(len(fold) - 1, H.shape[1])) * 50  # the rest of the fold
    after = heads.candidates(H2, P, y, option_ids=IDS, model_sha256=SHA, prompt_version="letters/1")[1].oof
    assert np.array_equal(before[fold[0]], after[fold[0]])
    others = np.setdiff1d(np.arange(len(y)), fold)
    assert not np.allclose(before[others], after[others])  # ... while the folds that trained on them moved


def test_too_few_rows_per_option_or_no_hidden_state_say_why():
    H, P, y = synthetic(n_per=heads.MIN_ROWS_PER_OPTION - 1)
    fits = heads.candidates(H, P, y, option_ids=IDS, model_sha256=SHA, prompt_version="letters/1")
    assert not any(f.available for f in fits)
    assert (f"at least {heads.MIN_ROWS_PER_OPTION} labeled rows of every option, one per fold "
            f"(the fewest here: {heads.MIN_ROWS_PER_OPTION - 1})") in fits[0].note
    H, P, y = synthetic()
    fits = heads.candidates(None, P, y, option_ids=IDS, model_sha256=SHA, prompt_version="letters/1",
                            no_hidden="scored without it")
    assert [f.available for f in fits] == [True, False, False] and fits[1].note == "scored without it"


def test_the_row_basis_fit_is_the_full_width_fit():
    """Fitting in the span of the rows finds the same optimum as the full-width fit."""
    from sklearn.linear_model import LogisticRegression

    H, _, y = synthetic(n_per=6, width=120)
    Z = (H - H.mean(0)) / H.std(0)
    V = heads.row_basis(Z)
    B, b, _ = heads._fit(Z @ V, y, 4, 0.1)
    full = LogisticRegression(C=0.1, max_iter=5000, tol=1e-10).fit(Z, y)
    assert V.shape[1] <= len(y) < Z.shape[1]
    assert np.allclose(B @ V.T, full.coef_, atol=2e-3) and np.allclose(b, full.intercept_, atol=2e-3)

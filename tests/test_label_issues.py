"""Wrong labels caught (issue 44, item 4): cleanlab flags injected label flips from out-of-fold
probabilities, and a confirmed or fixed label reaches the next set version on its row - audited, never dropped."""
from __future__ import annotations

import numpy as np

from app.core import label_issues, review
from app.core.labeled import content_hash


def oof_probabilities(X: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    folds = StratifiedKFold(5, shuffle=True, random_state=0)
    return cross_val_predict(LogisticRegression(max_iter=500), X, y, cv=folds, method="predict_proba")


def test_injected_flips_are_found_at_most_a_tenth_of_rows_flagged():
    rng = np.random.default_rng(0)
    k, n = 4, 240
    centres = rng.normal(0, 3, (k, 8))
    y = np.repeat(np.arange(k), n // k)
    X = centres[y] + rng.normal(0, 1.2, (n, 8))
    flipped = rng.choice(n, n // 20, replace=False)  # 5% of the labels
    noisy = y.copy()
    for i in flipped:
        noisy[i] = (y[i] + 1 + rng.integers(k - 1)) % k
    assert (noisy[flipped] != y[flipped]).all()
    found = label_issues.suspects(oof_probabilities(X, noisy, k), noisy, list("abcd"))
    assert 0 < len(found) <= n // 10
    recall = label_issues.recall_of_flips([s.index for s in found], flipped)
    assert recall >= 0.7, recall
    # what a suspect says: its own label and the one the model prefers, most likely wrong first
    assert all(s.label != s.preferred and s.p_label < s.p_preferred for s in found)
    assert [s.rank for s in found] == list(range(1, len(found) + 1))
    assert found[0].p_label <= found[-1].p_label + 1e-12


def test_clean_labels_give_few_or_no_suspects_and_tiny_sets_none():
    y = np.array([0] * 10 + [1] * 10)
    P = np.where(y[:, None] == np.arange(2), 0.9, 0.1)
    assert label_issues.suspects(P, y, ["a", "b"]) == []
    assert label_issues.suspects(P[:3], y[:3], ["a", "b"]) == []


def test_a_confirmed_and_a_fixed_label_reach_the_next_set_version_on_their_rows(db):
    policy = {"id": "yn", "options": [{"id": "yes"}, {"id": "no"}]}
    rows = [{"row_key": f"r{i}", "state": f"state {i}", "label": "yes" if i % 2 else "no", "split": "test",
             "meta": None} for i in range(6)]
    base = db.import_labeled_set(name="s.jsonl", policy_id="yn", rows=rows, content_hash=content_hash(rows))
    item = lambda i: review.Item(review.state_key(f"state {i}"), f"state {i}", ["yes", "no"], "yes", 0.9,  # noqa: E731
                                 "label-issue", "", 0, f"r{i}")
    fixed = review.label(db, item(0), "yes", who="ana", policy_id="yn", fixes="no")
    kept = review.label(db, item(3), "yes", who="ana", note="checked", policy_id="yn", fixes="yes")
    actions = {r["id"]: r["action"] for r in db.reviews("yn")}
    assert actions == {fixed: "relabel", kept: "confirm"}
    new, changed = review.append_version(db, base, policy)
    after = {r["row_key"]: r for r in db.labeled_rows(new)}
    assert len(after) == 6 and changed == 2  # no row dropped, none added
    assert after["r0"]["label"] == "yes" and after["r0"]["meta"]["label_checks"][0]["was"] == "no"
    assert after["r0"]["meta"]["label_checks"][0]["by"] == "ana"
    assert after["r3"]["label"] == "yes" and after["r3"]["meta"]["label_checks"][0]["action"] == "confirm"
    assert {r["row_key"]: r["label"] for r in db.labeled_rows(base)}["r0"] == "no"  # the parent is unchanged

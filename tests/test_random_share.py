"""A random share in the suggested labels, and the unbiased check of the gate it gives (issue 44).

- app/core/suggest.batch / rank(random_share=r): exactly round(r*k) rows (halves up) drawn at random, seeded and
  reproducible, never twice, never among the ranked rows;
- a stored pool's drawn rows are marked, stay drawn while other rows are labeled, and how each labeled row was
  picked is kept in the new set version's row meta (the parent set untouched);
- Calibrate's check of the gate on the randomly drawn rows alone, recomputed by hand (scipy's beta for the
  one-sided Clopper-Pearson bound), beside the gate's note, marked small under 30 rows;
- --random-share outside [0, 1] or NaN refused with exit 2 naming the flag.
No model: probabilities are stored by hand."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from scipy.stats import beta

from adapter.engine.templates import load_template
from adapter.policy import CalibratedPolicy
from app.core import pool_store, review, run_calibration
from app.core import suggest
from app.core.labeled import content_hash
from app.core.store import Store
from app.service import pool as pools
from app.targets.base import Target
from tests.conftest import import_subset


# -- the draw -----------------------------------------------------------------------------------------
def probabilities(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.ones(3), size=n)


@pytest.mark.parametrize("k,share,d", [(10, 0.25, 3), (10, 0.2, 2), (4, 0.25, 1), (20, 0.25, 5), (7, 0.0, 0),
                                       (5, 1.0, 5), (10, 0.05, 1), (10, 0.04, 0)])
def test_a_batch_holds_exactly_round_share_times_k_drawn_rows_never_twice_and_apart_from_the_ranked(k, share, d):
    P = probabilities(60)
    X = np.random.default_rng(2).normal(size=(60, 8))
    got = suggest.batch(P, k=k, random_share=share, X=X, counts=[3, 3, 3], seed=7)
    assert suggest.draws(k, share) == d
    assert len(got.rows) == k and len(set(got.rows)) == k  # no row twice
    assert len(got.drawn) == d and got.drawn <= set(got.rows)
    ranked = [i for i in got.rows if i not in got.drawn]
    rest = np.setdiff1d(np.arange(60), sorted(got.drawn))
    # the ranked rows are rank()'s order among the rows not drawn: disjoint from the drawn ones by construction
    assert ranked == [int(rest[i]) for i in suggest.rank(P[rest], k=k - d, X=X[rest], counts=[3, 3, 3], seed=7)]
    again = suggest.batch(P, k=k, random_share=share, X=X, counts=[3, 3, 3], seed=7)
    assert again == got  # reproducible by seed
    assert suggest.rank(P, k=k, random_share=share, X=X, counts=[3, 3, 3], seed=7) == got.rows


def test_the_draw_is_uniform_and_another_seed_draws_other_rows():
    P = probabilities(40)
    seen = np.zeros(40)
    draws = set()
    for seed in range(400):
        got = suggest.batch(P, k=8, random_share=0.25, seed=seed)
        for i in got.drawn:
            seen[i] += 1
        draws.add(got.drawn)
    assert len(draws) > 300  # seeds draw other rows
    assert seen.sum() == 800 and seen.min() > 0  # each row drawn sometimes: 20 times each on average
    assert seen.max() < 45  # nowhere near the ranking's preference for the same few rows


def test_drawn_rows_are_spread_through_the_batch_and_no_share_is_the_ranking_as_before():
    P = probabilities(50)
    got = suggest.batch(P, k=10, random_share=0.25)
    assert [i for i, r in enumerate(got.rows) if r in got.drawn] == [2, 5, 7]
    assert suggest.batch(P, k=10).rows == suggest.rank(P, k=10) and suggest.batch(P, k=10).drawn == frozenset()
    short = suggest.batch(P[:3], k=10, random_share=0.5)  # a pool shorter than k: every row once
    assert sorted(short.rows) == [0, 1, 2] and len(short.drawn) == 2


def test_halves_round_up_even_where_the_product_is_a_hair_under_the_half():
    assert 0.35 * 90 < 31.5 and 0.7 * 45 < 31.5  # float: 31.499999999999996
    assert suggest.draws(90, 0.35) == 32 and suggest.draws(45, 0.7) == 32 and suggest.draws(90, 0.15000000000000002) == 14


@pytest.mark.parametrize("bad", [float("nan"), -0.01, 1.5, float("inf")])
def test_a_share_outside_0_to_1_is_refused(bad):
    with pytest.raises(ValueError, match="random_share: .* is not a share between 0 and 1"):
        suggest.rank(probabilities(10), k=4, random_share=bad)


# -- a stored pool: marked, stable, remembered -------------------------------------------------------------
def policy_file(policy: dict) -> CalibratedPolicy:
    return CalibratedPolicy.model_validate({"policy_id": "refund-check", "question": policy["question"],
                                            "options": policy["options"], "readout": "letters",
                                            "prompt_version": "letters/1", "model": {"file": "m.gguf", "sha256": "0" * 64},
                                            "temperature": 1.0, "fallback_option": "human-review", "created_at": "now"})


@pytest.fixture()
def scored_pool(tmp_path):
    """A 4-row set of refund-check and a 30-row pool whose scores are stored by hand (no model)."""
    db = Store(tmp_path / "wb.db")
    policy, set_id = import_subset(db, tmp_path, "refund-check", 4)
    text = "".join(json.dumps({"state": f"pool row number {i}: a refund question"}) + "\n" for i in range(30))
    got = pools.import_stream(db, policy, io.StringIO(text), "pool.jsonl", into_set=set_id)
    pool = pools.get_pool(db, got.pool_id, "refund-check")
    cal = policy_file(policy)
    run_id = pool_store.start_scores(db, pool, like=None, policy=cal, target=Target("local", "local", {}), note="n")
    ids = [o["id"] for o in policy["options"]]
    for pos, row in enumerate(pool_store.rows(db, pool.id)):
        p = 0.5 + 0.5 * (pos + 1) / 31  # row 0 the least sure
        db.add_result(run_id, {"row_key": f"line-{row.line}", "position": pos, "state": row.state, "label": None,
                               "cold": 0, "option_ids": ids, "probabilities": [p, 1 - p], "top_option": ids[0],
                               "label_mass": 1.0, "probability_status": "uncalibrated", "readout": "letters",
                               "latency_s": 0.1, "error": None, "request": None, "response": None})
    db.finish_run(run_id)
    return db, policy, set_id, pool, pools.Candidate(cal, None), run_id


def test_a_pools_drawn_rows_are_marked_stay_drawn_and_the_new_version_remembers_how_each_row_was_picked(scored_pool):
    db, policy, set_id, pool, cand, run_id = scored_pool
    ranked = pools.rank_pool(db, pool, cand, run_id, k=8, into_set=set_id, random_share=0.25)
    drawn = [r for r in ranked.rows if r.drawn]
    assert len(ranked.rows) == 8 and len(drawn) == 2 and "2 of them drawn at random" in ranked.text
    assert ranked == pools.rank_pool(db, pool, cand, run_id, k=8, into_set=set_id, random_share=0.25)  # every rerun
    suggested = [r for r in ranked.rows if not r.drawn]
    drawn_lines = {r.line for r in drawn}
    least_sure = [r.line for r in pool_store.rows(db, pool.id) if r.line not in drawn_lines][:6]
    assert [r.line for r in suggested] == least_sure  # the 6 least sure open rows not drawn (the first lines), in order
    assert all(r.how == "random draw" for r in drawn) and all(r.how == "suggested" for r in suggested)
    ids = [o.id for o in cand.policy.options]
    pools.label(db, drawn[0], ids[0], who="ana", policy=cand.policy)
    pools.label(db, suggested[0], ids[1], who="ana", policy=cand.policy)
    after = pools.rank_pool(db, pool, cand, run_id, k=8, into_set=set_id, random_share=0.25)
    assert drawn[1].line in {r.line for r in after.rows if r.drawn}  # the other drawn row is still drawn
    assert drawn[0].line not in {r.line for r in after.rows}  # the labeled ones left the open rows
    parent_rows = db.labeled_rows(set_id)
    new_id, added = review.append_version(db, set_id, {"id": "refund-check"})
    assert added == 2
    rows = {r["state"]: r for r in db.labeled_rows(new_id)}
    assert rows[drawn[0].state]["meta"]["picked"] == "random draw"
    assert rows[suggested[0].state]["meta"]["picked"] == "suggested"
    assert rows[drawn[0].state]["meta"]["reviewed_by"] == "ana"
    assert db.labeled_rows(set_id) == parent_rows  # the parent version is untouched
    assert all("picked" not in (r["meta"] or {}) for r in parent_rows)  # rows of old never gain a 'picked'


def test_pool_label_remembers_the_rows_suggest_drew_and_bad_shares_exit_2_naming_the_flag(scored_pool, tmp_path, capsys):
    from app.__main__ import main

    db, policy, set_id, pool, cand, run_id = scored_pool
    ranked = pools.rank_pool(db, pool, cand, run_id, k=8, into_set=set_id, random_share=0.25)
    drawn = next(r for r in ranked.rows if r.drawn)
    ranked_row = next(r for r in ranked.rows if not r.drawn)
    cal_file = tmp_path / "cal.json"
    cal_file.write_text(cand.policy.model_dump_json())
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"id": drawn.row_key, "label": "yes"}) + "\n"
                      + json.dumps({"id": ranked_row.row_key, "label": "no"}) + "\n")
    wb = str(db.path)
    for bad in ("nan", "1.5", "-0.1", "x"):
        for cmd in (["suggest", "--policy", str(cal_file), "--pool", str(pool.id)],
                    ["pool", "label", "--policy", str(cal_file), "--pool", str(pool.id), "--labels", str(labels),
                     "--labeled-set", str(set_id)]):
            with pytest.raises(SystemExit) as exc:
                main([*cmd, "--random-share", bad, "--db", wb])
            assert exc.value.code == 2
            assert "argument --random-share:" in capsys.readouterr().err
    assert db.reviews("refund-check") == []  # nothing stored by a refused command
    assert main(["pool", "label", "--policy", str(cal_file), "--pool", str(pool.id), "--labels", str(labels),
                 "--labeled-set", str(set_id), "--k", "8", "--random-share", "0.25", "--who", "bo", "--db", wb]) == 0
    assert "(1 of them drawn at random, kept as random draws)" in capsys.readouterr().out
    (newest,) = [s for s in db.list_labeled_sets() if s["parent_id"] == set_id]
    picked = {r["state"]: (r["meta"] or {}).get("picked") for r in db.labeled_rows(newest["id"])}
    assert picked[drawn.state] == "random draw" and picked[ranked_row.state] == "suggested"


# -- the unbiased check ------------------------------------------------------------------------------------
def checked_run(tmp_path, drawn_right: int, drawn_n: int, chosen_n: int = 40):
    """A stored set of refund-check rows and an eval run of it: `chosen_n` rows added by review from a ranking
    (hard: right 60% of the time, confident or not), `drawn_n` drawn at random (easy: the first `drawn_right`
    right, confidently)."""
    db = Store(tmp_path / "check.db")
    policy = load_template("refund-check")
    db.save_policy(policy)
    ids = [o["id"] for o in policy["options"]]
    pool_run = None
    if drawn_n:  # the drawn rows' pool, every row of it scored and labeled: the whole pool is the sample
        text = "".join(json.dumps({"state": f"state {i}"}) + "\n" for i in range(chosen_n, chosen_n + drawn_n))
        got = pools.import_stream(db, policy, io.StringIO(text), "pool.jsonl", into_set=None)
        pool = pools.get_pool(db, got.pool_id, "refund-check")
        pool_run = pool_store.start_scores(db, pool, like=None, policy=policy_file(policy),
                                           target=Target("local", "local", {}), note="n")
        for pos, prow in enumerate(pool_store.rows(db, pool.id)):
            db.add_result(pool_run, {"row_key": f"line-{prow.line}", "position": pos, "state": prow.state,
                                     "label": None, "cold": 0, "option_ids": ids, "probabilities": [0.5, 0.5],
                                     "top_option": ids[0], "label_mass": 1.0, "probability_status": "uncalibrated",
                                     "readout": "letters", "latency_s": 0.1, "error": None, "request": None,
                                     "response": None})
        db.finish_run(pool_run)
    rows, probs = [], []
    rng = np.random.default_rng(3)
    for i in range(chosen_n + drawn_n):
        drawn = i >= chosen_n
        label = ids[i % 2]
        right = (i - chosen_n) < drawn_right if drawn else rng.random() < 0.6
        top = label if right else ids[1 - ids.index(label)]
        q = 0.97 if drawn else float(rng.uniform(0.55, 0.99))
        probs.append([q, 1 - q] if top == ids[0] else [1 - q, q])
        rows.append({"row_key": f"review-{i + 1}", "state": f"state {i}", "label": label, "split": "test",
                     "meta": {"reviewed_by": "ana", "picked": "random draw" if drawn else "suggested",
                              **({"from_run": pool_run} if drawn else {})}})
    set_id = db.import_labeled_set(name="grown", policy_id="refund-check", rows=rows, content_hash=content_hash(rows))
    run_id = db.create_run(kind="eval", policy=policy, target={"name": "local", "kind": "local", "config": {}},
                           n_rows=len(rows), labeled_set_id=set_id)
    for pos, (row, p) in enumerate(zip(rows, probs)):
        db.add_result(run_id, {"row_key": row["row_key"], "position": pos, "state": row["state"], "label": row["label"],
                               "cold": 0, "option_ids": ids, "probabilities": p, "top_option": ids[int(np.argmax(p))],
                               "label_mass": 1.0, "probability_status": "uncalibrated", "readout": "letters",
                               "latency_s": 0.1, "error": None, "request": None, "response": None})
    db.finish_run(run_id)
    return db, run_id


def by_hand(cal: run_calibration.Calibration, threshold: float | None) -> tuple[int, int, int, float]:
    """(drawn rows, decided among them, right among those, one-sided 95% Clopper-Pearson lower bound)."""
    drawn = [i for i, r in enumerate(cal.results) if r["row_key"] in {f"review-{j}" for j in range(41, 200)}]
    conf, pred = cal.oof.max(axis=1), cal.oof.argmax(axis=1)
    decided = [i for i in drawn if threshold is None or conf[i] >= threshold]
    right = sum(int(pred[i] == cal.y[i]) for i in decided)
    bound = float(beta.ppf(0.05, right, len(decided) - right + 1)) if right else 0.0
    return len(drawn), len(decided), right, bound


def test_the_check_on_the_drawn_rows_is_the_gates_rule_on_them_alone_recomputed_by_hand(tmp_path):
    db, run_id = checked_run(tmp_path, drawn_right=33, drawn_n=34)
    cal = run_calibration.calibrate(db, run_id, target_accuracy=0.7, with_heads=False)
    assert len(cal.drawn) == 34 and cal.picked == 40  # the drawn rows are not counted as chosen
    gate = run_calibration.decide_gate(cal)
    assert gate.source == "recommended"
    threshold = gate.threshold
    check = run_calibration.random_check(cal, threshold)
    assert check is not None
    n, decided, right, bound = by_hand(cal, threshold)
    assert (check.n, check.decided, check.correct) == (n, decided, right) and n == 34
    assert check.lower_bound == pytest.approx(bound, abs=1e-12)
    assert not check.small
    text = check.text()
    assert text.startswith("The unbiased check, on the pool's random sample (34 labeled rows, all drawn at random)")
    assert f"{bound:.1%}" in text and "do not lean low" in text and "small" not in text
    assert gate.messages[1] == text  # beside the gate's own sentence: the page, the CLI and the export's notes
    assert any("the pool's random sample (34 rows) measures them without that lean" in m for m in gate.messages)
    from app.service.ci_check import gate_said

    assert gate_said(gate.messages) == {"gate_evidence": gate.messages[0], "gate_check": text}  # `app check` says both
    assert gate_said([]) == {} and "gate_check" not in gate_said(["a gate note"])
    hand = run_calibration.decide_gate(cal, 0.86)  # a hand-set gate: checked at its own threshold
    assert hand.messages[0] == run_calibration.random_check(cal, 0.86).text()  # type: ignore[union-attr]
    n9, d9, r9, b9 = by_hand(cal, 0.86)
    assert 0 < d9 < n9
    assert f"it decides {d9} of {n9}" in hand.messages[0] and f"{b9:.1%}" in hand.messages[0]
    said = gate_said(hand.messages)  # `app check`: the check is not the gate's evidence (it came first here)
    assert said["gate_check"] == hand.messages[0] and not said["gate_evidence"].startswith("The unbiased check")
    assert said["gate_evidence"] in hand.messages[1:]


def test_the_check_is_marked_small_under_30_drawn_rows_and_absent_without_any(tmp_path):
    db, run_id = checked_run(tmp_path, drawn_right=9, drawn_n=10)
    cal = run_calibration.calibrate(db, run_id, target_accuracy=0.99, with_heads=False)  # no gate reachable
    gate = run_calibration.decide_gate(cal)
    assert gate.source == "unreachable"
    check = run_calibration.random_check(cal, None)
    assert check is not None and check.small and check.threshold is None
    n, decided, right, bound = by_hand(cal, None)
    assert (check.n, check.decided, check.correct) == (10, 10, right)
    assert check.lower_bound == pytest.approx(bound, abs=1e-12)
    assert gate.messages[1] == check.text() and "small (under 30 rows under the bound): a wide interval" in check.text()
    assert f"the gate decides nothing; with no gate the out-of-fold answer is right on {right} of them" in check.text()
    (tmp_path / "none").mkdir()
    db2, run2 = checked_run(tmp_path / "none", drawn_right=0, drawn_n=0)
    cal2 = run_calibration.calibrate(db2, run2, target_accuracy=0.8, with_heads=False)
    assert run_calibration.random_check(cal2, 0.5) is None
    assert not any(m.startswith("The unbiased check") for m in run_calibration.decide_gate(cal2).messages)
    assert any("a pool's random share draws some into every batch" in m for m in run_calibration.decide_gate(cal2).messages)


def eval_run(db: Store, set_id: int) -> int:
    """An eval run over a stored set (every row answered 'yes' at 0.8: the sample rule reads only the meta)."""
    policy = load_template("refund-check")
    ids = [o["id"] for o in policy["options"]]
    rows = db.labeled_rows(set_id)
    run_id = db.create_run(kind="eval", policy=policy, target={"name": "local", "kind": "local", "config": {}},
                           n_rows=len(rows), labeled_set_id=set_id)
    for pos, row in enumerate(rows):
        db.add_result(run_id, {"row_key": row["row_key"], "position": pos, "state": row["state"], "label": row["label"],
                               "cold": 0, "option_ids": ids, "probabilities": [0.8, 0.2], "top_option": ids[0],
                               "label_mass": 1.0, "probability_status": "uncalibrated", "readout": "letters",
                               "latency_s": 0.1, "error": None, "request": None, "response": None})
    db.finish_run(run_id)
    return run_id


def test_the_pool_sample_takes_the_rows_labeled_from_the_ranking_that_are_keyed_below_the_last_draw(scored_pool):
    """The drawn rows come from the open rows, which the ranking thins of hard ones; every pool row keyed at most the
    last drawn row's was labeled by then (drawn, or from the ranking before the draw reached it): together a uniform
    sample of the pool - the check reads them all, and counts the drawn ones apart."""
    db, policy, set_id, pool, cand, run_id = scored_pool
    ids = [o.id for o in cand.policy.options]
    first = pools.rank_pool(db, pool, cand, run_id, k=12, into_set=set_id)  # no share: 12 ranked rows labeled
    assert not any(r.drawn for r in first.rows)
    for r in first.rows:
        pools.label(db, r, ids[0], who="ana", policy=cand.policy)
    second = pools.rank_pool(db, pool, cand, run_id, k=6, into_set=set_id, random_share=0.5)
    drawn = [r for r in second.rows if r.drawn]
    assert len(drawn) == 3
    for r in drawn:
        pools.label(db, r, ids[1], who="ana", policy=cand.policy)
    new_id, added = review.append_version(db, set_id, {"id": "refund-check"})
    assert added == 15
    keys = dict(zip([f"line-{r.line}" for r in pool_store.rows(db, pool.id)],
                    pools.draw_keys([f"line-{r.line}" for r in pool_store.rows(db, pool.id)])))
    metas = {r["state"]: r["meta"] for r in db.labeled_rows(new_id) if r["row_key"].startswith("review-")}
    for r in [*first.rows, *drawn]:  # every pool row keeps its key (sha256 of its row key), drawn or ranked
        assert metas[r.state]["draw_key"] == pytest.approx(keys[r.row_key]) == pytest.approx(r.key)
    top = max(keys[r.row_key] for r in drawn)
    below = {r.state for r in first.rows if keys[r.row_key] <= top}
    assert below  # these keys: some ranked rows lie below the last draw (the case the rule is for)
    labeled = {r.state for r in [*first.rows, *drawn]}
    prefix = []  # by hand: the pool in key order, up to the first row not labeled
    for line in sorted(keys, key=keys.__getitem__):
        state = next(r.state for r in pool_store.rows(db, pool.id) if f"line-{r.line}" == line)
        if state not in labeled:
            break
        prefix.append(state)
    assert below | {r.state for r in drawn} <= set(prefix)
    run = eval_run(db, new_id)
    used = db.results(run)
    sample, draws = run_calibration.drawn_rows(db, run, used)
    assert {used[i]["state"] for i in sample} == set(prefix) and draws == 3
    cal = run_calibration.calibrate(db, run, target_accuracy=0.8, with_heads=False)
    check = run_calibration.random_check(cal, None)
    assert check is not None and check.n == len(prefix) and check.draws == 3
    assert (f"on the pool's random sample ({check.n} labeled rows: 3 drawn at random, {check.n - 3} labeled "
            "otherwise - ranked or reviewed - before the draw reached them)") in check.text()
    assert cal.picked == 15 - check.n  # the ranked rows outside the sample: chosen, so they lean low


def test_a_drawn_row_left_unlabeled_ends_the_sample_and_marks_do_not_make_it(scored_pool):
    """The sample is read from the pool in key order, not from the rows' marks: a drawn row shown but not labeled
    ends it there (the rows drawn after it are left out: fewer rows, not leaning rows), and a row marked drawn is
    in the sample only where the pool's order puts it."""
    db, policy, set_id, pool, cand, run_id = scored_pool
    ids = [o.id for o in cand.policy.options]
    first = pools.rank_pool(db, pool, cand, run_id, k=10, into_set=set_id)
    for r in first.rows:
        pools.label(db, r, ids[0], who="ana", policy=cand.policy)
    second = pools.rank_pool(db, pool, cand, run_id, k=8, into_set=set_id, random_share=0.5)
    drawn = sorted((r for r in second.rows if r.drawn), key=lambda r: r.key or 0.0)
    assert len(drawn) == 4
    for r in drawn[1:]:  # the drawn row with the smallest key is skipped
        pools.label(db, r, ids[1], who="ana", policy=cand.policy)
    new_id, _ = review.append_version(db, set_id, {"id": "refund-check"})
    run = eval_run(db, new_id)
    used = db.results(run)
    sample, draws = run_calibration.drawn_rows(db, run, used)
    cut = drawn[0].key or 0.0
    assert {used[i]["state"] for i in sample} == {r.state for r in first.rows if (r.key or 0.0) < cut}
    assert draws == 0  # every drawn row labeled lies after the skipped one

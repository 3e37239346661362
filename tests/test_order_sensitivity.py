"""Order sensitivity on hand-built results (no model): every expected number below is worked out by
hand from the rows the test writes, in the comments next to it.

Cyclic orders (adapter.engine.prompt.rotations): for ids [a, b, c] order k shows
  order 0: a b c    order 1: b c a    order 2: c a b
so display position A holds a, b, c in orders 0, 1, 2."""
from __future__ import annotations

import pandas as pd
import pytest

from app.core import order_sensitivity as osn
from app.core.order_sensitivity import analyse, diagnostic_items, verdict
from app.core.runner import Case

ABC = ["a", "b", "c"]
SHOWN_ABC = {0: ["a", "b", "c"], 1: ["b", "c", "a"], 2: ["c", "a", "b"]}  # written out, not computed


def row(state: str, k: int, probs: dict[str, float], label: str | None = None, shown: dict | None = None,
        **extra) -> dict:
    """A stored result as the runner writes it: ids and probabilities in the order shown."""
    ids = (shown or SHOWN_ABC)[k]
    p = [probs[o] for o in ids]
    return {"row_key": f"{state}{osn.ROTATION_SEP}{k}", "state": f"text of {state}", "label": label,
            "option_ids": ids, "probabilities": p, "top_option": ids[p.index(max(p))], "error": None, **extra}


def biased_and_steady() -> list[dict]:
    """s1 (label a): the model always takes display position A -> answers a, b, c (flipped).
    s2 (label b): the model always answers b (steady)."""
    return [
        row("s1", 0, {"a": 0.6, "b": 0.3, "c": 0.1}, "a"),  # shown a b c: top a at A
        row("s1", 1, {"a": 0.3, "b": 0.5, "c": 0.2}, "a"),  # shown b c a: top b at A
        row("s1", 2, {"a": 0.2, "b": 0.1, "c": 0.7}, "a"),  # shown c a b: top c at A
        row("s2", 0, {"a": 0.2, "b": 0.7, "c": 0.1}, "b"),  # shown a b c: top b at B
        row("s2", 1, {"a": 0.1, "b": 0.8, "c": 0.1}, "b"),  # shown b c a: top b at A
        row("s2", 2, {"a": 0.1, "b": 0.6, "c": 0.3}, "b"),  # shown c a b: top b at C
    ]


def test_flip_rate_positions_and_per_state_answers_of_three_cyclic_orders():
    rep = analyse(biased_and_steady(), ABC)
    assert (rep.n_states, rep.n_options) == (2, 3)
    assert rep.flip_rate == 0.5  # s1 flipped, s2 did not
    # chosen: s1 -> A, A, A; s2 -> B, A, C  => A 4, B 1, C 1
    # labels: a sits at A, C, B (orders 0, 1, 2); b sits at B, A, C  => 2 each
    assert rep.positions.to_dict("list") == {"position": ["A", "B", "C"], "chosen": [4, 1, 1], "label": [2, 2, 2]}
    per = rep.per_state.set_index("id")
    assert list(per.index) == ["s1", "s2"]
    assert per.loc["s1", ["order 0", "order 1", "order 2"]].tolist() == ["a", "b", "c"]
    assert per.loc["s2", ["order 0", "order 1", "order 2"]].tolist() == ["b", "b", "b"]
    assert per["flipped"].tolist() == [True, False]
    assert per["label"].tolist() == ["a", "b"] and per.loc["s1", "state"] == "text of s1"


def test_shifts_are_the_spread_of_each_options_probability_across_orders():
    shifts = analyse(biased_and_steady(), ABC).shifts.set_index("option")
    # spreads (max - min over the 3 orders):  s1: a .6-.2=.4  b .5-.1=.4  c .7-.1=.6
    #                                         s2: a .2-.1=.1  b .8-.6=.2  c .3-.1=.2
    assert shifts.loc["a", "mean_spread"] == pytest.approx(0.25) and shifts.loc["a", "max_spread"] == pytest.approx(0.4)
    assert shifts.loc["b", "mean_spread"] == pytest.approx(0.30) and shifts.loc["b", "max_spread"] == pytest.approx(0.4)
    assert shifts.loc["c", "mean_spread"] == pytest.approx(0.40) and shifts.loc["c", "max_spread"] == pytest.approx(0.6)
    assert list(shifts.index) == ABC  # in the policy's order


def test_four_options_a_model_that_follows_the_content_never_flips():
    ids = ["w", "x", "y", "z"]
    shown = {0: ["w", "x", "y", "z"], 1: ["x", "y", "z", "w"], 2: ["y", "z", "w", "x"], 3: ["z", "w", "x", "y"]}
    probs = {"w": 0.1, "x": 0.2, "y": 0.6, "z": 0.1}  # the same per option in every order
    rows = [row(s, k, probs, label, shown) for s, label in (("t1", "y"), ("t2", "w")) for k in range(4)]
    rep = analyse(rows, ids)
    assert rep.flip_rate == 0.0 and rep.n_options == 4
    # y sits at C, B, A, D in orders 0..3: one choice per position per state -> 2 each
    assert rep.positions["chosen"].tolist() == [2, 2, 2, 2]
    # labels: t1's y as above; t2's w sits at A, D, C, B -> also one each
    assert rep.positions["label"].tolist() == [2, 2, 2, 2]
    assert rep.shifts["max_spread"].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert rep.verdict.startswith("Order rarely changes the answer (0% of 2 states).")
    assert "prefers position" not in rep.verdict


def test_four_options_always_the_last_position():
    ids = ["w", "x", "y", "z"]
    shown = {0: ["w", "x", "y", "z"], 1: ["x", "y", "z", "w"], 2: ["y", "z", "w", "x"], 3: ["z", "w", "x", "y"]}
    rows = []
    for k in range(4):  # whatever is shown last (D) gets 0.7: z, w, x, y
        last = shown[k][-1]
        rows.append(row("t1", k, {o: (0.7 if o == last else 0.1) for o in ids}, None, shown))
    rep = analyse(rows, ids)
    assert rep.flip_rate == 1.0
    assert rep.per_state.loc[0, ["order 0", "order 1", "order 2", "order 3"]].tolist() == ["z", "w", "x", "y"]
    assert rep.positions["chosen"].tolist() == [0, 0, 0, 4] and rep.positions["label"].tolist() == [0, 0, 0, 0]
    assert rep.shifts["max_spread"].tolist() == pytest.approx([0.6] * 4)
    # 4 of 4 choices at D: 100% > 1.5 / 4
    assert "The model prefers position D: it chose it 100% of the time (an unbiased model: 25%)." in rep.verdict
    assert "Order changes the answer in 100% of 1 states" in rep.verdict


YN = ["yes", "no"]
SHOWN_YN = {0: ["yes", "no"], 1: ["no", "yes"]}


def yes_no_rows(p_yes_rot0: dict[str, float], p_yes_not: dict[str, float]) -> list[dict]:
    rows = []
    for s, p in p_yes_rot0.items():
        rows.append(row(s, 0, {"yes": p, "no": 1 - p}, None, SHOWN_YN))
        rows.append(row(s, 1, {"yes": p, "no": 1 - p}, None, SHOWN_YN))
    for s, p in p_yes_not.items():
        rows.append({"row_key": f"{s}{osn.NEGATED_SEP}", "state": s, "label": None, "option_ids": YN,
                     "probabilities": [p, 1 - p], "top_option": "yes" if p > 0.5 else "no", "error": None})
    return rows


def test_negation_sums_for_a_yes_no_policy_consistent():
    # s1: 0.9 + 0.2 = 1.1; s2: 0.7 + 0.2 = 0.9 -> mean 1.0, mean |sum - 1| = 0.1
    rep = analyse(yes_no_rows({"s1": 0.9, "s2": 0.7}, {"s1": 0.2, "s2": 0.2}), YN, yes="yes")
    assert rep.negation["n"] == 2
    assert rep.negation["mean_sum"] == pytest.approx(1.0) and rep.negation["mean_abs_gap"] == pytest.approx(0.1)
    assert "averages 1.00 (close to 1: consistent)." in rep.verdict


def test_negation_sums_off_and_a_negated_row_without_its_order_0_is_left_out():
    # s1: 0.9 + 0.5 = 1.4; s2: 0.8 + 0.6 = 1.4 -> off by 0.40; s3 has only its negated row: not counted
    rep = analyse(yes_no_rows({"s1": 0.9, "s2": 0.8}, {"s1": 0.5, "s2": 0.6, "s3": 0.9}), YN, yes="yes")
    assert rep.negation["n"] == 2 and rep.negation["mean_sum"] == pytest.approx(1.4)
    assert rep.negation["mean_abs_gap"] == pytest.approx(0.4)
    assert "averages 1.40 (off by 0.40 on average: the model does not read the negation reliably)." in rep.verdict
    assert rep.n_states == 2  # a negated row is not a state of its own
    # the negation is only read for yes/no policies told which option is "yes"
    assert analyse(yes_no_rows({"s1": 0.9}, {"s1": 0.5}), YN).negation is None


def test_failed_rows_and_rows_without_probabilities_are_left_out():
    rows = biased_and_steady()
    rows[0] = {**rows[0], "error": "timeout"}  # s1 order 0 failed
    rows[4] = {**rows[4], "probabilities": None}  # s2 order 1 has no probabilities
    rep = analyse(rows, ABC)
    per = rep.per_state.set_index("id")
    assert pd.isna(per.loc["s1", "order 0"]) and pd.isna(per.loc["s2", "order 1"])
    # s1: orders 1, 2 answered b, c (flipped); s2: orders 0, 2 answered b, b (steady)
    assert per["flipped"].tolist() == [True, False] and rep.flip_rate == 0.5
    # chosen: s1 -> A, A; s2 -> B, C
    assert rep.positions["chosen"].tolist() == [2, 1, 1]
    # s2's b: .7 and .6 -> spread .1; s1's b: .5 and .1 -> .4
    assert rep.shifts.set_index("option").loc["b", "mean_spread"] == pytest.approx(0.25)


def test_a_state_that_is_an_object_is_shown_as_text_and_no_results_means_no_flips():
    rows = [{**r, "state": {"ticket": "locked out"}} for r in biased_and_steady()]
    assert analyse(rows, ABC).per_state.loc[0, "state"] == "{'ticket': 'locked out'}"
    empty = analyse([], ABC)
    assert empty.n_states == 0 and empty.flip_rate == 0.0 and empty.positions["chosen"].tolist() == [0, 0, 0]
    assert empty.negation is None and "prefers position" not in empty.verdict


def test_the_verdict_reads_the_debias_and_the_labels_from_the_results():
    cf = [{**r, "response": {"debias": "content-free"}} for r in biased_and_steady()]
    assert "even with the content-free correction this run used" in analyse(cf, ABC).verdict
    mixed = [dict(r) for r in cf]
    mixed[0]["response"] = {"debias": "none"}
    assert "use permutation averaging or the content-free correction" in analyse(mixed, ABC).verdict
    labeled = analyse(biased_and_steady(), ABC).verdict
    assert "Only 2 states: a first look - check more of the set's states for a measurement." in labeled
    unlabeled = analyse([{**r, "label": None} for r in biased_and_steady()], ABC).verdict
    assert "run the check on a labeled set" in unlabeled
    assert "run the check on a labeled set" not in analyse([{**r, "label": None} for r in biased_and_steady()], ABC,
                                                           labeled=True).verdict


def positions(chosen: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"position": [chr(65 + i) for i in range(len(chosen))], "chosen": chosen,
                         "label": [0] * len(chosen)})


def test_verdict_thresholds():
    even = positions([5, 5])
    assert verdict(0.1, even, None, 30).startswith("Order changes the answer in 10% of 30 states: use permutation")
    assert verdict(0.09, even, None, 30) == "Order rarely changes the answer (9% of 30 states)."
    # a favourite position needs more than 1.5 x its fair share: 2 positions -> more than 75%
    assert "prefers" not in verdict(0.0, positions([3, 1]), None, 30)  # 75%: not more
    assert "The model prefers position A: it chose it 80% of the time (an unbiased model: 50%)." in \
        verdict(0.0, positions([4, 1]), None, 30)
    assert "prefers position C: it chose it 60% of the time (an unbiased model: 33%)" in \
        verdict(0.0, positions([1, 1, 3]), None, 30)  # 60% > 50%
    assert "prefers" not in verdict(0.0, positions([1, 2, 2]), None, 30)  # 40% < 50%
    # negation: a mean gap below 0.15 reads as consistent
    assert "(close to 1: consistent)" in verdict(0.0, even, {"n": 3, "mean_sum": 1.05, "mean_abs_gap": 0.149}, 30)
    assert "(off by 0.15 on average" in verdict(0.0, even, {"n": 3, "mean_sum": 1.15, "mean_abs_gap": 0.15}, 30)
    # how many states it rests on: below 20 it is a first look; without a count, no such line
    assert "Only 19 states: a first look" in verdict(0.0, even, None, 19)
    assert "first look" not in verdict(0.0, even, None, osn.FEW_STATES)
    assert verdict(0.5, even, None).startswith("Order changes the answer in 50% of cases:")
    assert "first look" not in verdict(0.5, even, None)


THREE = {"id": "p3", "name": "Three", "question": "Which one?",
         "options": [{"id": "a", "description": "first"}, {"id": "b", "description": "second"},
                     {"id": "c", "description": "third"}], "examples": []}


def test_diagnostic_items_plan_every_state_in_every_cyclic_order_then_the_negated_question():
    cases = [Case("s1", "state one", "a"), Case("s2", {"ticket": "two"}, None)]
    items = diagnostic_items(THREE, cases, "Which one is wrong?", {"readout": "letters"})
    assert [pos for pos, _, _ in items] == list(range(8))
    assert [c.key for _, c, _ in items] == ["s1#rot0", "s1#rot1", "s1#rot2", "s1#not",
                                            "s2#rot0", "s2#rot1", "s2#rot2", "s2#not"]
    assert [req.id for _, c, req in items] == [c.key for _, c, _ in items]
    orders = [[o.id for o in req.options] for _, _, req in items]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]] * 2
    assert [req.question for _, _, req in items] == ["Which one?"] * 3 + ["Which one is wrong?"] + \
        ["Which one?"] * 3 + ["Which one is wrong?"]
    assert {o.id: o.description for o in items[1][2].options} == {"a": "first", "b": "second", "c": "third"}
    assert all(req.readout == "letters" for _, _, req in items)  # the run's readout on every call
    assert [c.label for _, c, _ in items] == ["a"] * 4 + [None] * 4
    assert items[4][1].state == items[4][2].state == {"ticket": "two"}
    assert [o["id"] for o in THREE["options"]] == ["a", "b", "c"]  # the policy itself is left alone


def test_diagnostic_items_without_a_negated_question_and_back_through_analyse():
    cases = [Case(f"s{i}", f"state {i}") for i in range(3)]
    items = diagnostic_items(THREE, cases)
    assert len(items) == 3 * 3 and not any(osn.NEGATED_SEP in c.key for _, c, _ in items)
    # a fake model that always takes the first option shown, scored on the planned requests
    rows = []
    for pos, case, req in items:
        ids = [o.id for o in req.options]
        rows.append({"row_key": case.key, "position": pos, "state": case.state, "label": case.label,
                     "option_ids": ids, "probabilities": [0.5, 0.3, 0.2], "top_option": ids[0], "error": None})
    rep = analyse(rows, ["a", "b", "c"])
    assert rep.n_states == 3 and rep.flip_rate == 1.0
    assert rep.positions["chosen"].tolist() == [9, 0, 0]
    assert rep.per_state[["order 0", "order 1", "order 2"]].values.tolist() == [["a", "b", "c"]] * 3
    # each option gets 0.5, 0.3 and 0.2 over the three orders: spread 0.3 everywhere
    assert rep.shifts["mean_spread"].tolist() == pytest.approx([0.3] * 3)

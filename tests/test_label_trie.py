"""The answer labels' trie in one batch (adapter/engine/label_trie.py): the plan on its own (no model), and
the engine's trie path against the one-decode-per-prefix path it replaces."""
from __future__ import annotations

import pytest

from adapter.engine.label_trie import inner_paths, leaves, plan
from adapter.engine.prompt import Prompt
from adapter.schema import DecisionRequest, RequestError, SharedStateRequest

# label token ids as tries of three shapes: one deep shared chain, a wide shallow tree, and a mix
DEEP = [(1, 2, 3, 4, 5, 6, 7, 10), (1, 2, 3, 4, 5, 6, 7, 11), (9,)]
WIDE = [(1, d, e, 99) for d in range(3) for e in range(4)] + [(2, 99)]
MIXED = [(5, 6), (5, 7, 1), (5, 7, 2), (5, 7, 3, 4), (5, 7, 3, 5), (8, 9), (8, 10)]


def walked(labels):
    """The prefixes Engine._walk evaluates: a group of two or more options sharing a token, recursively."""
    out = []

    def walk(members, depth, prefix):
        groups: dict[int, list] = {}
        for lab in members:
            groups.setdefault(lab[depth], []).append(lab)
        for tok, group in groups.items():
            if len(group) > 1:
                out.append((*prefix, tok))
                walk(group, depth + 1, (*prefix, tok))

    walk(labels, 0, ())
    return out


def replay(labels, groups, cells_used=0, n_ctx=10**6):
    """llama.cpp's rules for a batch (llama_batch_allocr::init, the KV mask), on the plan: per group,
    every slot starts as a copy of the prompt (positions < 0 here); a slot's tokens continue its
    positions one by one; slots sharing a token have the same cells so far; a token sees exactly its
    ancestors; each shared prefix is read once. Returns the prefixes read."""
    read = []
    for g in groups:
        cells: list[tuple[int, tuple, set]] = []  # (depth, path, slots)
        assert cells_used + g.cells <= n_ctx
        for step in g.steps:
            before = {s: [c[1] for c in cells if s in c[2]] for s in range(g.n_slots)}
            for t in step:
                assert t.path[-1] == t.token and len(t.path) == t.depth + 1
                for s in t.slots:
                    mine = [c for c in cells if s in c[2]]
                    assert len(mine) == t.depth, "a slot's positions must stay consecutive"
                    assert [c[1] for c in mine] == [t.path[: d + 1] for d in range(t.depth)], "sees its ancestors only"
                first = before[t.slots[0]]
                assert all(before[s] == first for s in t.slots), "coupled sequences must not have diverged"
                cells.append((t.depth, t.path, set(t.slots)))
                if t.output:
                    read.append(t.path)
    return read


@pytest.mark.parametrize("labels", [DEEP, WIDE, MIXED], ids=["deep", "wide", "mixed"])
def test_the_trie_holds_exactly_the_prefixes_the_walk_evaluates(labels):
    assert sorted(inner_paths(labels)) == sorted(walked(labels))
    groups = plan(labels, max_slots=64, max_cells=1000, max_tokens=512, max_outputs=64)
    assert len(groups) == 1 and len(groups[0].steps) == 1  # one decode
    assert sorted(replay(labels, groups)) == sorted(walked(labels))
    # one sequence per leaf of the trie of shared prefixes; siblings never share one
    assert groups[0].n_slots == len(leaves(inner_paths(labels)))


@pytest.mark.parametrize("limits", [dict(max_slots=1), dict(max_tokens=2), dict(max_outputs=1),
                                    dict(max_cells=0), dict(max_slots=2, max_tokens=3, max_outputs=2)])
def test_tight_limits_split_into_groups_and_steps_that_llama_cpp_accepts(limits):
    """Few sequence ids, small batches or few free KV cells: more groups or steps, each prefix read
    once, every batch valid for llama.cpp; a prefix a later group needs as context is evaluated there
    again without its logits."""
    for labels in (DEEP, WIDE, MIXED):
        kw = dict(max_slots=64, max_cells=1000, max_tokens=512, max_outputs=64) | limits
        if kw["max_cells"] == 0:  # room for the longest shared prefix only
            kw["max_cells"] = max(len(p) for p in inner_paths(labels))
        groups = plan(labels, **kw)
        if labels is not DEEP:
            assert len(groups) > 1 or max(len(g.steps) for g in groups) > 1
        read = replay(labels, groups, n_ctx=kw["max_cells"])
        assert sorted(read) == sorted(walked(labels)) and len(read) == len(set(read))
        for g in groups:
            assert g.n_slots <= kw["max_slots"] and g.cells <= kw["max_cells"]
            assert all(len(s) <= kw["max_tokens"] and sum(t.output for t in s) <= kw["max_outputs"] for s in g.steps)
        assert plan(labels, **kw) == groups  # a fixed function of the labels: the same bits each time


def test_no_shared_prefix_is_no_batch_and_an_impossible_fit_is_an_error():
    assert plan([(1, 2), (3, 4)], max_slots=8, max_cells=10, max_tokens=8, max_outputs=8) == []
    with pytest.raises(ValueError):
        plan(DEEP, max_slots=8, max_cells=5, max_tokens=8, max_outputs=8)  # a 7-token shared chain, 5 cells
    with pytest.raises(ValueError):
        plan(DEEP, max_slots=0, max_cells=50, max_tokens=8, max_outputs=8)


# -- the engine (SmolLM2 fixture) --------------------------------------------------------------------
IDS = {
    "deep": ["refund_full_amount_now_east", "refund_full_amount_now_west", "refund_full_amount_later", "deny"],
    "shallow": [str(i) for i in range(26)],
    "mixed": ["refund_full", "refund_partial", "refund_east_1", "refund_east_2", "deny", "escalate"],
}


def _row(ids, state="Item arrived broken; the customer wants all of the money back today.", **extra):
    return DecisionRequest(id="t", state=state, question="What should happen?", options=[{"id": i} for i in ids],
                           readout="option-words", debias="none", **extra)


@pytest.mark.parametrize("shape", list(IDS))
def test_trie_batch_matches_one_decode_per_prefix(engine, monkeypatch, shape):
    """Same options, same prompt: the trie batch and the per-prefix decodes read the same
    log-probabilities up to the batch's arithmetic; fresh or from the cache, the trie gives the same
    bits; and it takes one decode where the old path took one per shared prefix."""
    req = _row(IDS[shape])
    monkeypatch.setattr(engine, "label_batch", False)
    old = engine.score(req, fresh=True)
    monkeypatch.setattr(engine, "label_batch", True)
    new = engine.score(req, fresh=True)
    cached = engine.score(req)
    assert cached.probabilities == new.probabilities and cached.evaluated_tokens == 0
    assert new.extra_evals == 1 < old.extra_evals
    assert new.top_option == old.top_option
    assert max(abs(a - b) for a, b in zip(old.probabilities, new.probabilities)) < 0.01
    assert new.option_logits == pytest.approx(old.option_logits, abs=0.05)


def test_trie_in_groups_and_steps_matches_one_batch(engine, monkeypatch):
    """Two sequence ids and two logits rows per decode force several groups and steps: the same
    answer within the arithmetic's tolerance, the same bits on every run, and the cache as before."""
    import adapter.engine.session as engine_mod

    req = _row(IDS["mixed"] + ["refund_full_amount_now_east", "refund_full_amount_now_west"])
    one = engine.score(req, fresh=True)
    monkeypatch.setattr(engine_mod, "TRIE_OUTPUTS", 2)
    monkeypatch.setattr(engine, "n_parallel", engine._llama_cpp.llama_n_seq_max(engine.llm.ctx) - 2)
    split = engine.score(req, fresh=True)
    assert split.extra_evals > 2
    assert split.top_option == one.top_option
    assert max(abs(a - b) for a, b in zip(one.probabilities, split.probabilities)) < 0.01
    assert engine.score(req).probabilities == split.probabilities == engine.score(req, fresh=True).probabilities


def test_parallel_questions_read_their_tries_on_their_own_sequences(engine, monkeypatch):
    """Several questions on one state (parallel suffix sequences): each question's trie forks from
    its own suffix; the answers match the per-prefix path and stay bit-identical when asked again."""
    qs = [{"id": f"q{k}", "question": q, "options": [{"id": i} for i in IDS["mixed"]], "readout": "option-words",
           "debias": "none"} for k, q in enumerate(["What should happen?", "What would a manager do?"])]
    request = SharedStateRequest(state="Refund me please, the parcel was empty.", questions=qs)
    monkeypatch.setattr(engine, "label_batch", False)
    engine.clear_cache()
    old = engine.score_shared(request)
    monkeypatch.setattr(engine, "label_batch", True)
    engine.clear_cache()
    new = engine.score_shared(request)
    again = engine.score_shared(request)
    assert [r.probabilities for r in again] == [r.probabilities for r in new]
    assert [r.extra_evals for r in new] == [1, 1]
    assert [r.top_option for r in new] == [r.top_option for r in old]
    diff = max(abs(a - b) for o, n in zip(old, new) for a, b in zip(o.probabilities, n.probabilities))
    assert diff < 0.01, diff


def test_a_label_that_is_a_prefix_of_another_is_refused_before_any_work(engine):
    """The walk cannot tell a label from a longer one that starts with it: refused when the prompt is
    prepared (a 422 naming the options), before the prompt or the trie is evaluated."""
    prompt = Prompt("option-words", "test/1", [[("Case: x\nAnswer:", True)]], [" refund", " refund_full", " deny"])
    with pytest.raises(RequestError, match="read as the same tokens"):
        engine._prepare(prompt)
    ok = Prompt("option-words", "test/1", [[("Case: x\nAnswer:", True)]], [" refund\n", " refund_full\n"])
    segs, seqs = engine._prepare(ok)
    assert seqs[0][0] == seqs[1][0]  # the ids as the readout writes them share a token only

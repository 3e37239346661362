"""The steering guard run on one scored row: guard.py cuts the state into pieces and prechecks it;
this module has the engine score the state with pieces left out and reads the answers. Apart from
scoring (engine.py) because it is a policy on top of it, and from guard.py because that one is pure
text and needs no model."""
from __future__ import annotations

import time
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from adapter import guard
from adapter.engine.prompt import Prompt, rotations
from adapter.schema import DecisionRequest, DecisionResult, JSONObject, state_text
from adapter.engine.scores import PromptRun, combine
from adapter.engine.session import Budget


class Scorer(Protocol):
    """What the guard asks of the engine (engine.Engine): the row's prompt, its content-free prior
    and raw scores of prompts - typed here so this module does not import the engine that calls it."""

    n_parallel: int

    def render(self, req: DecisionRequest, readout: str, order: list[int] | None = None) -> Prompt: ...

    def prior(self, req: DecisionRequest, readout: str, order: list[int] | None,
              budget: Budget | None = None) -> np.ndarray: ...

    def evaluate(self, prompts: list[Prompt], budget: Budget | None = None,
                 hidden: frozenset[int] = frozenset()) -> list[PromptRun]: ...


# what the guard compares: a row's scored probabilities (and its hidden state, when it asked for one) ->
# the probabilities its policy decides on (a calibrated policy's head or correction). None: the model's own.
Judge = Callable[[list[float], "np.ndarray | None"], Sequence[float]]


def guard_check(engine: Scorer, req: DecisionRequest, result: DecisionResult, budget: Budget | None = None, *,
                use_precheck: bool = True, exhaustive: bool = False, judge: Judge | None = None) -> JSONObject:
    """The steering guard for one scored row (guard.py): the precheck, then - for
    erase-and-check - the state scored with pieces left out (guard.erasures) and with each span that
    names the row's answer left out (guard.mention_erasures: a tag, a value, a trailing fragment), with
    the row's own readout, correction and option orders. A variant disagrees when its own top option leads
    the row's answer by at least `guard.MIN_MARGIN` in the variant when what was left out names the answer,
    `guard.PLAIN_MARGIN` when it names no option: removing the span gave a clear other answer (removing the
    only evidence leaves a flat answer, and that is no sign of steering).
    With `judge` (a calibrated policy's head or correction) the answers compared are the policy's - the
    row's and each variant's - not the model's letters: a head that reads hidden states gets each
    variant's. Variants are rendered with everything after the first segment joined, so they share the
    cached instruction and are evaluated as parallel sequences, a batch at a time; the first
    disagreement stops the check. `use_precheck=False` / `exhaustive=True` measure erase-and-check on
    its own over every variant (bench.guard)."""
    t0 = time.perf_counter()
    pieces = guard.split_state(req.state)
    found = guard.precheck(req.state if isinstance(req.state, str) else state_text(req.state),
                           req.options) if use_precheck else None
    # the finding as the response carries it (DecisionResult.guard, JSON): its keys depend on what was found
    out: JSONObject = {"method": req.guard, "suspected": False, "piece": None, "removed": None, "passes": 0,
                 "pieces": len(pieces), "precheck": found, "judged": "letters" if judge is None else "policy"}
    if found is not None:
        out.update(suspected=True, by="precheck", piece=guard.piece_at(pieces, found["at"]) if isinstance(
            req.state, str) else None)
    if out["suspected"] or req.guard != "erase-and-check":
        out["seconds"] = round(time.perf_counter() - t0, 4)
        return out
    readout, debias = result.readout, result.debias or "none"
    orders = rotations(len(req.options)) if req.permute else [None]
    priors = [engine.prior(req, readout, o, budget) for o in orders] if debias == "content-free" else None
    with_hidden = judge is not None and bool(req.hidden_state)
    if judge is None:
        answer = result.option_ids.index(result.top_option)
    else:
        judged = judge(list(result.probabilities), result.hidden_state.array() if result.hidden_state else None)
        answer = int(np.argmax(judged))
    out["answer"] = req.options[answer].id
    # (what is left out, for the finding; the state without it)
    variants: list[tuple[Any, Any]] = [(list(span), pieces.without(*span)) for span in guard.erasures(len(pieces))]
    variants += guard.mention_erasures(req.state, req.options, req.options[answer].id)
    out["variants_planned"] = len(variants)
    per_batch = max(1, (engine.n_parallel - 1) // len(orders))
    seen: list[JSONObject] = []
    for at in range(0, len(variants), per_batch):
        batch = variants[at: at + per_batch]
        prompts = [engine.render(req.model_copy(update={"state": state}), readout, o).merged()
                   for _, state in batch for o in orders]
        hidden = frozenset(k * len(orders) for k in range(len(batch))) if with_hidden else frozenset()
        runs = engine.evaluate(prompts, budget, hidden)
        out["passes"] += len(prompts)
        for k, (removed, _) in enumerate(batch):
            own = runs[k * len(orders): (k + 1) * len(orders)]
            probs, _ = combine(own, priors)
            if judge is not None:
                probs = np.asarray(judge([float(p) for p in probs], own[0].get("hidden")), dtype=float)
            top = int(np.argmax(probs))
            lead = float(probs[top] - probs[answer])
            span = isinstance(removed, str)  # a span naming the answer, else a run of pieces
            left_out = removed if span else pieces.text(*removed)
            margin = guard.MIN_MARGIN if guard.names(left_out, req.options[answer]) else guard.PLAIN_MARGIN
            seen.append({"removed": removed, "top": req.options[top].id, "lead": round(lead, 4), "margin": margin})
            if not out["suspected"] and lead >= margin:
                out.update(suspected=True, by="erase-and-check", piece=None if span else removed[0],
                           removed=None if span else removed, variant_top=req.options[top].id, lead=round(lead, 4),
                           **({"span": removed} if span else {}))
        if out["suspected"] and not exhaustive:
            break
    if exhaustive:
        out["variants"] = seen
    out["seconds"] = round(time.perf_counter() - t0, 4)
    return out


def skipped_guard(method: str) -> JSONObject:
    """The guard's entry for a row it did not check (its calibrated policy gates it anyway)."""
    return {"method": method, "suspected": False, "piece": None, "removed": None, "passes": 0, "skipped": "gated"}

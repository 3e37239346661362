"""The steering guard run on one scored row: guard.py cuts the state into pieces and prechecks it;
this module has the engine score the state with pieces left out and reads the answers. Apart from
scoring (engine.py) because it is a policy on top of it, and from guard.py because that one is pure
text and needs no model."""
from __future__ import annotations

import time
from typing import Protocol

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


def guard_check(engine: Scorer, req: DecisionRequest, result: DecisionResult, budget: Budget | None = None, *,
                use_precheck: bool = True, exhaustive: bool = False) -> JSONObject:
    """The steering guard for one scored row (guard.py): the precheck, then - for
    erase-and-check - the state scored with pieces left out, with the row's own readout,
    correction and option orders. A variant disagrees when its own top option leads the row's
    answer by at least `guard.MIN_MARGIN` in the variant: removing the piece gave a clear other
    answer (removing the only evidence leaves a flat answer, and that is no sign of steering).
    Variants are rendered with everything after the first segment joined, so they share the
    cached instruction and are evaluated as parallel sequences, a batch at a time; the first
    disagreement stops the check. `use_precheck=False` / `exhaustive=True` measure
    erase-and-check on its own over every variant (bench.guard)."""
    t0 = time.perf_counter()
    pieces = guard.split_state(req.state)
    found = guard.precheck(req.state if isinstance(req.state, str) else state_text(req.state),
                           req.options) if use_precheck else None
    # the finding as the response carries it (DecisionResult.guard, JSON): its keys depend on what was found
    out: JSONObject = {"method": req.guard, "suspected": False, "piece": None, "removed": None, "passes": 0,
                 "pieces": len(pieces), "precheck": found}
    if found is not None:
        out.update(suspected=True, by="precheck", piece=guard.piece_at(pieces, found["at"]) if isinstance(
            req.state, str) else None)
    if out["suspected"] or req.guard != "erase-and-check":
        out["seconds"] = round(time.perf_counter() - t0, 4)
        return out
    readout, debias = result.readout, result.debias or "none"
    orders = rotations(len(req.options)) if req.permute else [None]
    priors = [engine.prior(req, readout, o, budget) for o in orders] if debias == "content-free" else None
    answer = result.option_ids.index(result.top_option)
    spans = guard.erasures(len(pieces))
    per_batch = max(1, (engine.n_parallel - 1) // len(orders))
    seen: list[JSONObject] = []
    for at in range(0, len(spans), per_batch):
        batch = spans[at: at + per_batch]
        variants = [req.model_copy(update={"state": pieces.without(*span)}) for span in batch]
        prompts = [engine.render(v, readout, o).merged() for v in variants for o in orders]
        runs = engine.evaluate(prompts, budget)
        out["passes"] += len(prompts)
        for k, span in enumerate(batch):
            probs, _ = combine(runs[k * len(orders): (k + 1) * len(orders)], priors)
            top = int(np.argmax(probs))
            lead = float(probs[top] - probs[answer])
            seen.append({"removed": list(span), "top": req.options[top].id, "lead": round(lead, 4)})
            if not out["suspected"] and lead >= guard.MIN_MARGIN:
                out.update(suspected=True, by="erase-and-check", piece=span[0], removed=list(span),
                           variant_top=req.options[top].id, lead=round(lead, 4))
        if out["suspected"] and not exhaustive:
            break
    if exhaustive:
        out["variants"] = seen
    out["seconds"] = round(time.perf_counter() - t0, 4)
    return out


def skipped_guard(method: str) -> JSONObject:
    """The guard's entry for a row it did not check (its calibrated policy gates it anyway)."""
    return {"method": method, "suspected": False, "piece": None, "removed": None, "passes": 0, "skipped": "gated"}

"""When a stored result can stand in for a new call (no Streamlit): the same model, read the same
way, on the same request gives the same bits (docs/adapter-api.md, "Caching"), so scoring it again buys nothing.

A result's reuse key is sha256 over (a) what fixes the numbers - the model file's sha256, llama.cpp's
version, GPU offload and flash attention (a CPU and a GPU endpoint of one model are different keys:
their kernels round differently), and for a call that returns the hidden state how it is read (from the
decision's own decode or a second one: they differ in the last digits) - and (b) the request, id aside: state, question, options, examples,
readout and correction as the model resolves them, permutation, few-shot and guard. The key of a stored result comes from
the model its own response names; the key looked up for a new call from the model the target says it
runs now (a local engine's info, a SemIf adapter's /info). A target that cannot say (a SageMaker
endpoint, a chat server) is always called.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from adapter.engine.engine import resolve_settings
from adapter.schema import DecisionRequest

from app.targets.base import NUMERICS, numerics  # what a target says it runs (targets name their model)

__all__ = ["NUMERICS", "copied_row", "numerics", "request_hash", "request_changes", "reuse_key", "why_not_reused"]

FIELD_WORDS = {"question": "the question", "options": "the options", "examples": "the examples", "guard": "the guard",
               "readout": "the readout", "debias": "the correction", "permute": "permutation", "few_shot": "few-shot",
               "layout": "the layout", "hidden_state": "the hidden state asked for", "instructions": "the instructions"}


def request_hash(req: DecisionRequest, model: Mapping[str, Any] | None = None) -> str:
    """The request's identity, its id aside (the same state under another row id is the same call),
    with the readout and correction the model resolves it to (a row that leaves them to the model's
    defaults and one that names those defaults are the same call)."""
    body = req.model_dump(mode="json", exclude={"id"})
    if body.get("layout") in (None, "state-first"):  # the default layout: the same key as before layouts existed
        body.pop("layout", None)
    if model and model.get("default_readout"):
        body["readout"], body["debias"] = resolve_settings(req.readout, req.debias, model["default_readout"],
                                                           model.get("default_debias") or "none", req.layout)
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def reuse_key(model: Mapping[str, Any] | None, req: DecisionRequest) -> str | None:
    ident = numerics(model)
    if ident is None:
        return None
    fixed = dict(ident)
    if not req.hidden_state:  # how a hidden state is read matters only to a call that returns one
        fixed.pop("hidden_read", None)
    head = json.dumps(fixed, sort_keys=True)
    return hashlib.sha256(f"{head}\x1e{request_hash(req, ident)}".encode()).hexdigest()


def copied_row(stored: Mapping[str, Any], *, row_key: str, position: int, state: Any, label: str | None
               ) -> dict[str, Any]:
    """A stored result as the result of a new row: this row's key, position, state and label; the
    stored answer, request, response and latency; `reused_from` names the result it came from."""
    keep = ("option_ids", "probabilities", "top_option", "label_mass", "probability_status", "readout", "latency_s",
            "request", "response", "reuse_key")
    return {**{k: stored.get(k) for k in keep}, "row_key": row_key, "position": position, "state": state,
            "label": label, "cold": 0, "error": None, "reused_from": stored["id"]}


def request_changes(now: Mapping[str, Any] | None, before: Mapping[str, Any] | None) -> list[str]:
    """The request fields (id and state aside: the same row) that differ between two stored requests."""
    a, b = dict(now or {}), dict(before or {})
    for d in (a, b):
        if d.get("layout") in (None, "state-first"):
            d.pop("layout", None)
    return sorted(k for k in (set(a) | set(b)) - {"id", "state"} if a.get(k) != b.get(k))


def why_not_reused(fresh: int, changes: Mapping[str, int], model_changed: int, compared: int, earlier: int | None
                   ) -> str:
    """'44 evaluated, not copied: since run #12 the request changed in the guard (44 rows)' - why rows that
    were scored before were scored again (what changed in the request, or the model), or that none had been."""
    if not fresh:
        return ""
    if earlier is None or not compared:
        return f"{fresh} evaluated: no earlier answer to these rows on this set"
    what = [f"{FIELD_WORDS.get(k, k)} ({n} rows)" for k, n in sorted(changes.items(), key=lambda kv: -kv[1])]
    if model_changed:
        what.insert(0, f"the model ({model_changed} rows)")
    why = "; ".join(what) if what else "nothing in the request (the stored answers failed, or were of another run kind)"
    return f"{fresh} evaluated, not copied: since run #{earlier} the request changed in {why}"

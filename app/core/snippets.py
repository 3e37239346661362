"""The request a target ran, as code a developer can paste: cURL, and boto3 for SageMaker (each kind's
snippet is declared in app/targets/registry.py). No secrets: a key stays the name of an environment
variable. The readout and correction the target resolved are pinned into the body, so the same
snippet on another model or server runs what the workbench ran."""
from __future__ import annotations

from typing import Any, Mapping

from adapter.schema import READOUTS

from app.targets.registry import snippets

PINNED = ("readout", "debias")  # what a model's defaults decide: pinned so another model runs the same


def pinned(request: Mapping[str, Any] | None, response: Mapping[str, Any] | None) -> dict[str, Any]:
    """The request as it ran: the readout and correction the target resolved (from its response)
    written in, so the snippet on another model or server runs what the workbench ran."""
    body = dict(request or {})
    if isinstance(response, Mapping) and response.get("readout") in READOUTS:
        for key in PINNED:
            if response.get(key) is not None:
                body[key] = response[key]
    return body


def for_target(target: Mapping[str, Any], request: Mapping[str, Any] | None,
               response: Mapping[str, Any] | None = None) -> list[tuple[str, str, str]]:
    """[(title, language, code)] that send `request` to the target the way the workbench did; the
    server to start, for a local target, comes as its own block (it blocks the terminal)."""
    return snippets(target, pinned(request, response))

"""Policy templates shipped in data/policies and the shipped probe cases (data/cases)."""
from __future__ import annotations

from typing import Any, Mapping

import json
from pathlib import Path

from adapter.schema import DecisionRequest, JSONObject

DATA_DIR = Path(__file__).resolve().parents[2] / "data"


def load_template(policy_id: str) -> JSONObject:
    path = DATA_DIR / "policies" / f"{policy_id}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no policy template {policy_id!r} in {path.parent}")
    template: JSONObject = json.loads(path.read_text())
    return template


def list_templates() -> list[JSONObject]:
    return [json.loads(p.read_text()) for p in sorted((DATA_DIR / "policies").glob("*.json"))]


def load_jsonl(path: str | Path) -> list[JSONObject]:
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
    return rows


def probe_cases() -> list[JSONObject]:
    return load_jsonl(DATA_DIR / "cases" / "probe.jsonl")


def request_for(policy: Mapping[str, Any], state: object, row_id: str, **overrides: Any) -> DecisionRequest:
    """A decision row from a policy (question, options, examples) and a state: any value here, since
    DecisionRequest validates it (a State: text, an object or an array)."""
    fields = {"id": row_id, "state": state, "question": policy["question"], "options": policy["options"],
              "examples": policy.get("examples", [])}
    for key in ("readout", "debias", "guard"):  # empty = the model's measured default (no guard)
        if policy.get(key):
            fields[key] = policy[key]
    fields.update(overrides)
    return DecisionRequest.model_validate(fields)

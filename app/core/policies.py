"""Policies as the workbench edits them: validation with messages per form field, templates."""
from __future__ import annotations

import json
import re
from typing import Any, Mapping, cast

from pydantic import ValidationError

from adapter.guard import GUARDS
from adapter.engine.templates import list_templates
from adapter.schema import DEBIAS, MAX_OPTIONS, READOUTS, Question, errors_from

from app.core.inputs import json_row
from app.core.records import Policy

FIELDS = ("id", "name", "question", "options", "examples", "notes", "readout", "debias", "guard")


def slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:64] or "policy"


def validate_policy(data: Any) -> tuple[Policy | None, dict[str, str]]:
    """Return (clean policy, {}) or (None, {field: message}) - messages name the fix."""
    errors: dict[str, str] = {}
    if not isinstance(data, dict):
        return None, {"json": "a policy is a JSON object with id, name, question, options"}
    unknown = set(data) - set(FIELDS) - {"created_at", "updated_at", "version"}  # bookkeeping of a saved policy
    if unknown:
        errors["json"] = f"unknown field(s) {sorted(unknown)}: allowed are {', '.join(FIELDS)}"
    name = str(data.get("name") or "").strip()
    if not name:
        errors["name"] = "give the policy a name"
    pid = str(data.get("id") or "").strip() or slugify(name)
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,63}", pid):
        errors["id"] = "ids are lowercase letters, digits and '-' (max 64)"
    readout = data.get("readout") or None
    if readout is not None and readout not in READOUTS:
        errors["readout"] = f"choose {' or '.join(READOUTS)} (or leave empty for the model's default)"
    debias = data.get("debias") or None
    if debias is not None and debias not in DEBIAS:
        errors["debias"] = f"choose {' or '.join(DEBIAS)} (or leave empty for the model's default)"
    guard = data.get("guard") or None
    if guard is not None and guard not in GUARDS:
        errors["guard"] = f"choose {', '.join(GUARDS)} (or leave empty: no steering guard)"
    options = [o for o in (data.get("options") or []) if isinstance(o, dict) and str(o.get("id") or "").strip()]
    examples = [e for e in (data.get("examples") or []) if isinstance(e, dict) and str(e.get("state") or "").strip()]
    ids = [str(o["id"]).strip() for o in options]
    bad = []  # every example whose label is missing or not an option, not only the first
    for n, e in enumerate(examples, 1):
        label = str(e.get("option_id") or "").strip()
        if not label:
            bad.append(f"row {n}: pick the option this example is labelled with")
        elif label not in ids:
            bad.append(f"row {n}: {label!r} is not one of the options ({', '.join(ids)})")
    if bad:
        errors["examples"] = "; ".join(bad)
    try:
        q = Question.model_validate({"id": pid or "p", "question": data.get("question") or "",
                                     "options": [{"id": str(o["id"]).strip(), "description": str(o.get("description") or "")}
                                                 for o in options],
                                     "examples": [{"state": e["state"], "option_id": str(e.get("option_id") or "")}
                                                  for e in examples],
                                     "readout": readout if readout in READOUTS else None})
    except ValidationError as exc:
        for err in errors_from(exc):
            fld = str(err["loc"][0]) if err["loc"] else "json"
            msg = err["msg"]
            if fld == "question" and err["type"] == "string_too_short":
                msg = "write the question the model should answer"
            if fld == "options" and err["type"] in ("too_short", "too_long"):
                msg = f"give between 2 and {MAX_OPTIONS} options with non-empty ids (you gave {len(options)})"
            if len(err["loc"]) > 1:
                msg = f"row {int(err['loc'][1]) + 1}: {msg}" if isinstance(err["loc"][1], int) else msg
            errors.setdefault(fld, msg)
        return None, errors
    if errors:
        return None, errors
    clean: Policy = {"id": pid, "name": name, "question": q.question,
             "options": [o.model_dump() for o in q.options],
             "examples": [e.model_dump() for e in q.examples],
             "notes": str(data.get("notes") or ""), "readout": readout or "", "debias": debias or "",
             "guard": "" if guard in (None, "none") else guard}
    return clean, {}


def _rows(rows: Any, first: str, second: str) -> list[tuple[str, str]]:
    """Option or example rows as (first, second) pairs, stripped; blank rows left out (a save drops them)."""
    out = []
    for r in rows or []:
        pair = (str((r or {}).get(first) or "").strip(), str((r or {}).get(second) or "").strip())
        if any(pair):
            out.append(pair)
    return out


def _comparable(policy: Mapping[str, Any]) -> dict[str, Any]:
    guard = str(policy.get("guard") or "")
    return {"name": str(policy.get("name") or "").strip(), "question": str(policy.get("question") or "").strip(),
            "options": _rows(policy.get("options"), "id", "description"),
            "examples": _rows(policy.get("examples"), "state", "option_id"),
            "readout": str(policy.get("readout") or ""), "debias": str(policy.get("debias") or ""),
            "guard": "" if guard == "none" else guard, "notes": str(policy.get("notes") or "").strip()}


def changed_fields(draft: Mapping[str, Any], saved: Mapping[str, Any]) -> list[str]:
    """The fields where an editor's draft differs from the saved policy it was built on ([] when a
    save would store the same policy): blank option/example rows and surrounding blanks do not count.
    A draft with a "json" key (the JSON view's text) is compared with the saved policy's JSON too
    (empty for a new policy)."""
    mine, theirs = _comparable(draft), _comparable(saved)
    out = [f for f in mine if mine[f] != theirs[f]]
    if "json" in draft:
        shown = policy_json(saved) if saved.get("id") else ""
        if str(draft["json"] or "").strip() != shown.strip():
            out.append("json")
    return out


def policy_json(policy: Mapping[str, Any]) -> str:
    """The policy as JSON; empty optional fields (readout, debias, guard, notes) are left out."""
    return json.dumps({k: policy.get(k) for k in FIELDS if k in policy and policy.get(k) not in ("", None)},
                      indent=2, ensure_ascii=False)


def parse_policy_json(text: str) -> tuple[Policy | None, dict[str, str]]:
    try:
        data = json_row(text)  # the one strict reader: depth, big integers, NaN, NUL, surrogates, a key twice
    except ValueError as exc:
        return None, {"json": str(exc)}
    return validate_policy(data)


def templates() -> dict[str, Policy]:
    """The shipped policy templates by id: files in the store's policy shape (data/policies/*.json)."""
    return {t["id"]: cast(Policy, t) for t in list_templates()}

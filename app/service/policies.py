"""Policies: find one by id, template or file; add the shipped templates; add a template or a copy
under an id nobody uses (a copy never overwrites a policy - the store refuses a second id 0 save)."""
from __future__ import annotations

from pathlib import Path
from dataclasses import dataclass
from typing import Any, Collection, Literal, Mapping

from adapter.policy import PolicyError
from adapter.policy import policy_json as read_policy_file
from adapter.guard import GUARDS
from adapter.schema import DEBIAS, MAX_EXAMPLES, MAX_OPTIONS, READOUTS

from app.core.policies import changed_fields, parse_policy_json, policy_json, templates, validate_policy
from app.core.records import Policy as PolicyRecord
from app.core.store import StaleEdit, Store

Policy = Mapping[str, Any]  # a policy record (app/core/records.Policy) or a policy dict


@dataclass(frozen=True)
class EditorChoices:
    """What the policy editor offers: the readouts, corrections and guards a policy may name ("" first: the
    model's default, or no guard), and how many options and examples it may have."""
    readouts: tuple[str, ...] = ("", *READOUTS)
    debias: tuple[str, ...] = ("", *DEBIAS)
    guards: tuple[str, ...] = ("", *(g for g in GUARDS if g != "none"))
    max_options: int = MAX_OPTIONS
    max_examples: int = MAX_EXAMPLES


CHOICES = EditorChoices()


class PolicyNotFound(ValueError):
    """A --policy reference that is no saved policy, template or readable policy file."""


def resolve_policy(store: Store, ref: str) -> PolicyRecord:
    """A policy id in the store, a shipped template id, or a JSON file - validated; a template or
    file policy not yet in the store is saved (runs keep their own copy either way). One store trip
    (Store.policy_or_saved): the template or file is read first, used only when no policy is saved as `ref`."""
    candidate: Policy | None = templates().get(ref)
    problem: str | None = None
    if candidate is None and Path(ref).is_file():
        try:  # the adapter's reader: size before parsing, UTF-8, depth, NaN refused
            candidate = read_policy_file(Path(ref), what=f"--policy {ref!r}:")
        except PolicyError as exc:
            problem = str(exc)
    clean: PolicyRecord | None = None
    if candidate is not None:
        clean, errs = validate_policy(candidate)
        if errs or clean is None:
            problem, clean = f"--policy {ref!r} is invalid: " + "; ".join(f"{k}: {v}" for k, v in errs.items()), None
    stored, saved = store.policy_or_saved(ref, clean)
    if stored is not None:  # a saved policy wins over a template or file of the same name
        clean, errs = validate_policy(stored)
        if errs or clean is None:
            raise PolicyNotFound(f"--policy {ref!r} is invalid: " + "; ".join(f"{k}: {v}" for k, v in errs.items()))
        saved = stored
    if clean is None:
        raise PolicyNotFound(problem or f"--policy {ref!r}: not a saved policy, a template ({', '.join(templates())}) "
                             "or a JSON file")
    if saved is not None and saved.get("version") is not None and all(
            saved.get(k) == clean.get(k) for k in ("question", "options", "examples", "readout", "debias", "guard")):
        clean = {**clean, "version": saved["version"]}  # the saved version it is: a run records what it measured
    return clean


def seed_templates(store: Store) -> int:
    """Save the shipped templates that are not saved yet; how many were (another session seeding at
    the same time saves each at most once)."""
    n = 0
    for t in templates().values():
        if store.get_policy(t["id"]) is None:
            try:
                store.save_policy(t, expected_version=0)
            except StaleEdit:  # saved by another session meanwhile: keep theirs
                continue
            n += 1
    return n


def free_id(store: Store, base: str, suffix: str) -> tuple[str, int]:
    """(`<base>-<suffix><n>`, n) for the first n >= 2 that no policy has - counted from the store,
    not from the number of policies (after a delete, that count names an existing id)."""
    n = 2
    while store.get_policy(f"{base}-{suffix}{n}") is not None:
        n += 1
    return f"{base}-{suffix}{n}", n


def add_copy(store: Store, policy: Policy, *, suffix: str, label: str) -> PolicyRecord:
    """Save `policy` under a new free id (named '<name> (<label> n)'); StaleEdit if another session
    took that id in the same instant (the store inserts only when the id is new)."""
    new_id, n = free_id(store, policy["id"][:56], suffix)  # ids are at most 64 characters
    copy = {**policy, "id": new_id, "name": f"{policy['name']} ({label} {n})", "version": 0}
    return store.save_policy(copy, expected_version=0)


def add_template(store: Store, template_id: str) -> PolicyRecord:
    """The shipped template as a policy: under its own id when free, else as a numbered copy."""
    tpl = templates()[template_id]
    if store.get_policy(tpl["id"]) is None:
        return store.save_policy(dict(tpl), expected_version=0)
    return add_copy(store, tpl, suffix="", label="template")


def duplicate(store: Store, policy: Policy) -> PolicyRecord:
    return add_copy(store, policy, suffix="copy", label="copy")


def title(name: str, version: int | None) -> str:
    """'Refund check · v3': a policy in a picker, with its saved version (a template has none).

    >>> title("Refund check", 3), title("Refund check", None)
    ('Refund check · v3', 'Refund check')
    """
    return name + (f" · v{version}" if version is not None else "")


def id_taken(new_id: str, editing: str | None, saved_ids: Collection[str], *, via: Literal["form", "json"]
             ) -> dict[str, str]:
    """The editor's error for a save under an id another saved policy has ({} when the id is free, or
    the one being edited): a new policy from the form (its id comes from its name), or the JSON tab of a
    saved policy naming another policy's id. `editing` is the saved policy's id, None for a new one."""
    if new_id == editing or new_id not in saved_ids:
        return {}
    if via == "form" and editing is None:
        return {"name": f"a policy with id {new_id!r} exists: choose another name"}
    if via == "json" and editing is not None:
        return {"json": f"id {new_id!r} belongs to another policy: keep {editing!r} or pick a new id"}
    return {}


def version_to_save(new_id: str, editing: str | None, version: int) -> int:
    """The version a save from the editor is checked against: the edited policy's own, else 0 (a new
    policy - the store refuses it when the id exists by then)."""
    return version if editing is not None and new_id == editing else 0


def save(store: Store, clean: Policy, expected_version: int) -> PolicyRecord:
    """Save a validated policy against the version the editor was built on (0: new); StaleEdit when
    another session saved or deleted it meanwhile - nothing is saved then. (The store's own check; here so
    that a page never calls the store.)"""
    return store.save_policy(clean, expected_version=expected_version)


def delete(store: Store, policy_id: str) -> None:
    """Delete a saved policy (runs keep their own copy) - here so that a page never calls the store."""
    store.delete_policy(policy_id)


__all__ = ["CHOICES", "DEBIAS", "GUARDS", "READOUTS", "EditorChoices", "PolicyNotFound", "StaleEdit", "add_copy", "add_template",
           "changed_fields", "delete", "duplicate", "id_taken", "parse_policy_json", "policy_json",
           "resolve_policy", "save", "seed_templates", "templates", "validate_policy", "version_to_save"]

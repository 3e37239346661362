"""Targets: the ones a page or command may use, built by name, tested, added through the kind
registry (app/targets/registry.py: fields, validation, build), deleted."""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from app.core.store import Exists, Store
from app.targets.engines import model_key
from app.targets.base import KEY_PREFIX, Target, TargetError, TargetSpec
from app.targets.registry import build_target, config_from_form, target_by_name, target_specs, validate_target_spec

log = logging.getLogger("semif.workbench")
EngineProvider = Callable[[str | None], Any]
Spec = Mapping[str, Any]  # a target record (app/core/records.TargetSpec) or a spec dict


def specs(store: Store, *, single_rows: bool = False) -> list[TargetSpec]:
    """Built-in local targets, then saved ones; `single_rows`: only those that answer one row at a
    time (Playground, Compare, the checks - not Batch Transform)."""
    return target_specs(store, single_rows)


def names(store: Store, *, single_rows: bool = False) -> list[str]:
    return [s["name"] for s in specs(store, single_rows=single_rows)]


def local_names(store: Store) -> list[str]:
    """The local models (shipped or your own GGUF): what can read hidden states in the head layout."""
    return [s["name"] for s in specs(store, single_rows=True) if s.get("kind") == "local"]


def local_models(store: Store, chosen: list[str]) -> list[str]:
    """The distinct local models the named targets load (app/targets/engines.model_key: '' is the default)."""
    by_name = {s["name"]: s for s in specs(store)}
    found = [model_key(str((by_name[n].get("config") or {}).get("model") or ""))
             for n in chosen if n in by_name and by_name[n].get("kind") == "local"]
    return list(dict.fromkeys(found))


def build(store: Store, chosen: list[str], engines: EngineProvider, secrets: dict[str, Any] | None = None) -> list[Target]:
    """The named targets, in order; TargetError naming the first that cannot be built."""
    by_name = {s["name"]: s for s in specs(store)}
    missing = [n for n in chosen if n not in by_name]
    if missing:
        raise TargetError(f"no target named {missing[0]!r}: saved targets are {', '.join(by_name)}")
    return [build_target(by_name[n], engine_provider=engines, secrets=secrets) for n in chosen]


def by_name(store: Store, name: str, engines: EngineProvider, secrets: dict[str, Any] | None = None) -> Target:
    """One target for a command line's --target; UnknownTarget lists the names there are. (The registry is
    below what a command may import: tests/test_layout.py's PRESENTATION rule.)"""
    return target_by_name(store, name, engines, secrets)


def add(store: Store, name: str, kind: str, values: dict[str, Any], secrets: dict[str, Any] | None = None) -> dict[str, str]:
    """Validate a Targets form and save it; field -> message when refused (nothing saved)."""
    config = config_from_form(kind, values) if kind else {}
    errors = validate_target_spec(name, kind, config, secrets)
    if not errors and name in {s["name"] for s in specs(store)}:
        errors["name"] = f"a target named {name!r} exists"
    if errors:
        return errors
    try:
        store.add_target(name, kind, config)
    except Exists as exc:  # taken by another session since the form was drawn
        return {"name": str(exc)}
    return {}


def test(spec: Spec, engines: EngineProvider, secrets: dict[str, Any] | None = None) -> tuple[bool, str]:
    """(reachable, what it said): a connection test (a local model: loaded) that never raises."""
    try:
        return True, build_target(spec, engine_provider=engines, secrets=secrets).test_connection()
    except TargetError as exc:
        return False, str(exc)
    except Exception as exc:  # a target must never take the page down; the log keeps the traceback
        log.exception("testing target %s failed", spec.get("name"))
        return False, f"{type(exc).__name__}: {exc}"


def delete(store: Store, name: str) -> None:
    """Delete a saved target - here so that a page never calls the store."""
    store.delete_target(name)


KEYS_NOTE = (f"Saved by name. API keys are never stored: a SemIf, chat or /v1/systemone target names the environment "
             f"variable ({KEY_PREFIX}*, no other) or the Streamlit secret that holds its key.")



def describe(spec: Spec, default_model: str) -> str:
    """'model: qwen2.5-coder-0.5b · url: …' - a saved config as a person reads it."""
    cfg = {k: v for k, v in (spec.get("config") or {}).items() if v not in ("", None)}
    if spec["kind"] == "local" and not cfg.get("model"):
        return f"model: the default ({default_model})"
    return " · ".join(f"{k}: {v}" for k, v in cfg.items())

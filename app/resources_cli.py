"""Targets by name outside Streamlit (CLI, scripts): the same specs the Targets page saves."""
from __future__ import annotations

from typing import Callable

from .store import Store
from .targets import LOCAL_DEFAULT, Target, build_target


def target_specs(store: Store) -> list[dict]:
    """The built-in local target first, then the saved ones (a saved 'local' overrides it)."""
    saved = store.list_targets()
    return ([LOCAL_DEFAULT] if "local" not in {t["name"] for t in saved} else []) + saved


def target_by_name(store: Store, name: str, engine_provider: Callable) -> Target:
    for spec in target_specs(store):
        if spec["name"] == name:
            return build_target(spec, engine_provider=engine_provider)
    raise SystemExit(f"--target {name!r}: no such target; saved targets: "
                     f"{', '.join(s['name'] for s in target_specs(store))}")

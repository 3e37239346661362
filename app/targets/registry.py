"""Targets by name outside Streamlit (CLI, scripts): the same specs the Targets page saves."""
from __future__ import annotations

from typing import Callable

from adapter.catalog import SHIPPED

from app.core.engines import model_key
from app.core.store import Store
from app.targets.kinds import LOCAL_DEFAULT, Target, build_target


def builtin_specs() -> list[dict]:
    """`local` (the default model) and `local-<name>` for each other shipped model: several local
    models side by side need no set-up."""
    default = model_key(None)
    return [LOCAL_DEFAULT] + [{"name": f"local-{m.name}", "kind": "local", "config": {"model": m.name}}
                              for m in SHIPPED.values() if m.offered and m.name != default]


BATCH_ONLY_KINDS = {"sagemaker-batch"}  # they score a whole labeled set in one job, never a single row


def target_specs(store: Store, single_rows: bool = False) -> list[dict]:
    """The built-in local targets first, then the saved ones (a saved name overrides a built-in).
    `single_rows`: only targets that answer one row at a time (Playground, Compare, the checks)."""
    saved = store.list_targets()
    names = {t["name"] for t in saved}
    specs = [b for b in builtin_specs() if b["name"] not in names] + saved
    return [s for s in specs if not (single_rows and s["kind"] in BATCH_ONLY_KINDS)]


def target_by_name(store: Store, name: str, engine_provider: Callable) -> Target:
    for spec in target_specs(store):
        if spec["name"] == name:
            return build_target(spec, engine_provider=engine_provider)
    raise SystemExit(f"--target {name!r}: no such target; saved targets: "
                     f"{', '.join(s['name'] for s in target_specs(store))}")

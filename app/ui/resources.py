"""Streamlit-side shared objects: the local model pool, the store, targets by name."""
from __future__ import annotations

from typing import Callable

import streamlit as st

from adapter.templates import list_templates

from app.core.engines import EnginePool
from app.ui.safe_text import md
from app.targets.registry import target_specs  # noqa: F401  (re-exported for pages)
from app.core.settings import WorkbenchSettings
from app.core.store import StaleEdit, Store, StoreUnavailable
from app.targets.kinds import LocalTarget, Target, build_target


@st.cache_resource(show_spinner=False)
def engines() -> EnginePool:
    """One pool per server process: models load lazily, at most SEMIF_MAX_LOADED_MODELS stay loaded."""
    return EnginePool()


def engine(model: str | None = None):
    return engines().get(model)


def load_models(targets: list[Target]) -> None:
    """Load the local targets' models before a run, saying which and how big, with the one-time
    assembly of a chunked shipped model as a progress bar (a load failure is reported per target)."""
    pool = engines()
    for t in targets:
        ref = t.config.get("model") or None
        if not isinstance(t, LocalTarget) or pool.is_loaded(ref):
            continue
        with st.status(f"Loading {md(pool.describe(ref))} for **{md(t.name)}**…", expanded=False) as status:
            bar = st.empty()
            try:
                def show(done: int, total: int) -> None:
                    bar.progress(done / total, text=f"assembling the model file: {done / 1e6:,.0f}/{total / 1e6:,.0f} MB")

                pool.get(ref, progress=show)
                status.update(label=f"Loaded {md(pool.describe(ref))}", state="complete")
            except Exception as exc:  # shown again as this target's error by the run
                status.update(label=f"Could not load {md(pool.describe(ref))}: {md(exc)}", state="error")


def chosen_targets(db: Store, names: list[str]) -> list[Target] | None:
    """The named targets, their local models loaded (with a status line); None after showing why not."""
    from app.targets.kinds import TargetError

    specs = {s["name"]: s for s in target_specs(db)}
    try:
        targets = [make_target(specs[n]) for n in names]
    except (TargetError, KeyError) as exc:
        st.error(f"**Targets**: {md(exc)}")
        return None
    load_models(targets)
    return targets


def store() -> Store:
    """One Store (its schema migration run once) per database path per server process; SEMIF_DB
    is read on every rerun, so a changed path gets its own."""
    return _store_at(str(WorkbenchSettings.from_env().db))


@st.cache_resource(show_spinner=False, max_entries=8)
def _store_at(path: str) -> Store:
    return Store(path)


def secrets() -> dict:
    """String values of .streamlit/secrets.toml (API keys a target may name). No file: none. A file
    that does not parse is said on the page - silently having no keys would look like a bad key."""
    try:
        return {k: v for k, v in st.secrets.items() if isinstance(v, str)}
    except Exception as exc:  # Streamlit raises the same error for "no file" and "a file that does not parse"
        if "pars" not in str(exc).lower():
            return {}
        st.warning(f"**.streamlit/secrets.toml** could not be read, so no key from it is used: {md(exc)} - fix the "
                   "file (TOML: `NAME = \"value\"` per line) or remove it.")
        return {}


def make_target(spec: dict) -> Target:
    return build_target(spec, engine_provider=engine, secrets=secrets())


def seed_templates(db: Store) -> int:
    """Save the shipped templates that are not saved yet; how many were (another session seeding at
    the same time saves each at most once)."""
    n = 0
    for t in list_templates():
        if db.get_policy(t["id"]) is None:
            try:
                db.save_policy(t, expected_version=0)
            except StaleEdit:  # saved by another session meanwhile: keep theirs
                continue
            n += 1
    return n


def run_page(render: Callable[[], None]) -> None:
    """Each page's entry point: a database that cannot be written (read-only, disk full) is one line
    on the page naming the file and the fix, not a traceback."""
    try:
        render()
    except StoreUnavailable as exc:
        st.error(f"**Not saved**: {md(exc)}")

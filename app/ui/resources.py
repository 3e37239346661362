"""Streamlit-side shared objects: the local model pool and the store (one per server process), the
Streamlit secrets, targets built for a run with their models loaded (a status line each)."""
from __future__ import annotations

from typing import Any, Callable

import streamlit as st

from adapter.env_settings import SettingsError

from app.targets.engines import EnginePool
from app.settings import WorkbenchSettings
from app.core.store import Store, StoreUnavailable
from app.service import targets as target_service
from app.targets.base import Target, TargetError
from app.ui.safe_text import md


@st.cache_resource(show_spinner=False)
def engines() -> EnginePool:
    """One pool per server process: models load lazily, at most SEMIF_MAX_LOADED_MODELS stay loaded."""
    return EnginePool()


def engine(model: str | None = None):  # type: ignore[no-untyped-def]
    return engines().get(model)


def load_models(targets: list[Target]) -> None:
    """Load the local targets' models before a run, saying which and how big, with the one-time
    assembly of a chunked shipped model as a progress bar (a load failure is reported per target)."""
    pool = engines()
    for t in targets:
        ref = t.config.get("model") or None
        if t.kind != "local" or pool.is_loaded(ref):  # only a local target loads a model here
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
    try:
        targets = target_service.build(db, names, engine, secrets())
    except TargetError as exc:
        st.error(f"**Targets**: {md(exc)}")
        return None
    load_models(targets)
    return targets


def store() -> Store:
    """One Store (its schema migration run once) per database path per server process; SEMIF_DB
    is read on every rerun, so a changed path gets its own."""
    return store_at(db_path())


def db_path() -> str:
    """The database this rerun uses (SEMIF_DB): the key of a page's cached reads, with store_at."""
    return str(WorkbenchSettings.from_env().db)


@st.cache_resource(show_spinner=False, max_entries=8)
def store_at(path: str) -> Store:
    return Store(path)


def secrets() -> dict[str, Any]:
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


def run_page(render: Callable[[], None]) -> None:
    """Each page's entry point: a database that cannot be written (read-only, disk full) is one line
    on the page naming the file and the fix, not a traceback."""
    try:
        render()
    except StoreUnavailable as exc:
        st.error(f"**Not saved**: {md(exc)}")
    except SettingsError as exc:  # a bad SEMIF_* variable: named, with what it must be
        st.error(f"**Settings**: {md(exc)} - fix the variable and restart the workbench.")

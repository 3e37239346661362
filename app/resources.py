"""Streamlit-side shared objects: the cached local engine, the store, targets by name."""
from __future__ import annotations

import streamlit as st

from adapter.engine import Engine, EngineConfig
from adapter.policies import list_templates

from .store import Store
from .resources_cli import target_specs  # noqa: F401  (re-exported for pages)
from .targets import Target, build_target


@st.cache_resource(show_spinner="Loading the local model (first time only)…", max_entries=2)
def engine(model: str | None = None) -> Engine:
    return Engine(model or None, EngineConfig.from_env())


def store() -> Store:
    # cheap (opens a connection per call); not cached so SEMIF_DB changes are honoured
    return Store()


def secrets() -> dict:
    try:
        return {k: v for k, v in st.secrets.items() if isinstance(v, str)}
    except Exception:  # no secrets.toml: fine
        return {}


def make_target(spec: dict) -> Target:
    return build_target(spec, engine_provider=engine, secrets=secrets())


def seed_templates(db: Store) -> int:
    n = 0
    for t in list_templates():
        if db.get_policy(t["id"]) is None:
            db.save_policy(t)
            n += 1
    return n

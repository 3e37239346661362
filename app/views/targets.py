"""Targets: where decisions come from - local models, adapters, endpoints (no secrets stored). The
form is drawn from the kind registry (app/targets/registry.py): each kind declares its fields."""
from typing import Any, Mapping
import streamlit as st

from app.core.store import Store
from app.targets.registry import form_fields, titles
from app.service import targets
from app.ui import resources
from app.ui.safe_text import md
from app.ui.keys import TARGETS

KEYS = TARGETS  # this page's session and widget keys


def target_card(spec: Mapping[str, Any], db: Store) -> None:
    name = spec["name"]
    kinds = titles()
    with st.container(border=True):
        c1, c2, c3 = st.columns([4, 1, 1])
        c1.markdown(f"**{md(name)}** · {kinds.get(spec['kind'], spec['kind'])}  \n"
                    f"{md(targets.describe(spec, resources.engines().describe(None)))}")
        if c2.button("Test", key=KEYS("test", name), help="test the connection (for a local model: load it)"):
            ok, text = targets.test(spec, resources.engine, resources.secrets())
            st.session_state[KEYS("result", name)] = ("ok" if ok else "error", text)
        outcome = st.session_state.get(KEYS("result", name))  # each target keeps its own last test result
        if outcome:
            (c1.success if outcome[0] == "ok" else c1.error)(md(outcome[1]))
        if spec.get("created_at") and c3.button("Delete", key=KEYS("del", name)):
            targets.delete(db, name)
            st.session_state.pop(KEYS("result", name), None)
            st.rerun()


def add_form(db: Store) -> None:
    st.subheader("Add a target")
    kinds = titles()
    kind = st.selectbox("Kind", list(kinds), format_func=lambda k: kinds[k], key=KEYS.kind) or "local"
    n = st.session_state.get(KEYS.form_n, 0)  # a new form after each save: the next one starts empty
    fields = form_fields(kind)
    values: dict[str, Any] = {}
    for f in fields:  # selects first, outside the form: a field shown only for one choice follows it at once
        if f.choices is not None:
            values[f.name] = st.selectbox(f.label, f.choices(), format_func=f.format or str, help=f.help or None,
                                          key=KEYS(f.name, "pick", n))
    with st.form(KEYS("form", n)):
        name = st.text_input("Name", key=KEYS("name", n))
        for f in fields:
            if f.choices is not None or (f.shown_if and values.get(f.shown_if[0]) != f.shown_if[1]):
                continue
            values[f.name] = st.text_input(f.label, f.default, placeholder=f.placeholder or None, help=f.help or None,
                                           key=KEYS(f.name, n))
        add = st.form_submit_button("Save target", type="primary")
    if add:
        errs = targets.add(db, name.strip(), kind, values, resources.secrets())
        for k, v in errs.items():
            st.error(f"**{k}**: {md(v)} (nothing was saved)")
        if not errs:
            st.session_state[KEYS.saved], st.session_state[KEYS.form_n] = name.strip(), n + 1
            st.rerun()


def render() -> None:
    st.title("Targets")
    db = resources.store()
    if st.session_state.get(KEYS.saved):
        st.success(f"Saved target **{md(st.session_state.pop(KEYS.saved))}**")
    st.caption(f"{targets.KEYS_NOTE} Local models load on first use; at most "
               f"{resources.engines().max_loaded} stay loaded (SEMIF_MAX_LOADED_MODELS).")
    for spec in targets.specs(db):
        target_card(spec, db)
    add_form(db)


if __name__ == "__main__":
    resources.run_page(render)

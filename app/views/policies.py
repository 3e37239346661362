"""Policies: a question and its ordered options (+ few-shot examples, notes) - edit, copy, delete.

The Form and the JSON tab are two views of the saved version this session loaded (policy_form.
editor_view): every widget key carries that version, so after this session's save both are rebuilt
from what was saved, while another session's save leaves the draft here on screen - and a save from
it is refused ("Not saved", with the reason) instead of overwriting the newer version or being lost."""
from typing import Any

import pandas as pd
import streamlit as st

from app.service import policies as policy_service
from app.ui import resources
from app.ui.policy_editor import VIEW_KEY, editor_view, kept_deleted
from app.ui.safe_text import md

NEW = "__new__"
EMPTY: dict[str, Any] = {"id": "", "name": "", "question": "", "options": [{"id": "", "description": ""}] * 2, "examples": [],
         "notes": "", "readout": "", "debias": "", "version": 0}


def save(db, clean: dict, version: int, errors_key: str) -> None:
    """Save against the version the view was built on (0: a new policy); a stale view is refused."""
    try:
        saved = policy_service.save(db, clean, version)
    except policy_service.StaleEdit as exc:
        st.session_state[errors_key] = {"version": str(exc)}
        return
    st.session_state[errors_key] = {}
    st.session_state[VIEW_KEY] = (saved["id"], saved)  # both views are rebuilt from what was saved
    st.session_state["pol_next"] = clean["id"]
    st.session_state["pol_saved"] = clean["name"]
    st.rerun()


def template_sidebar(db) -> None:
    tpl = policy_service.templates()
    with st.expander("Start from a template"):
        tid = st.selectbox("Template", list(tpl), format_func=lambda i: tpl[i]["name"], key="pol_tpl")
        if st.button("Add template", key="pol_add_tpl"):  # its own id when free, else a numbered copy
            add_and_open(lambda: policy_service.add_template(db, tid))


def add_and_open(make) -> None:
    """Save a new policy (a template or a copy, never over an existing one) and open it."""
    try:
        new = make()
    except policy_service.StaleEdit as exc:  # the free id was taken in the same instant by another session
        st.error(md(exc))
        return
    st.session_state["pol_next"] = new["id"]
    st.rerun()


def render() -> None:
    st.title("Policies")
    db = resources.store()
    policies = {p["id"]: p for p in db.list_policies()}
    template_sidebar(db)
    if st.session_state.get("pol_saved"):
        st.toast(f"Saved {md(st.session_state.pop('pol_saved'))}")
    if "pol_next" in st.session_state:  # a selection requested by a button on the previous run
        st.session_state["pol_pick"] = st.session_state.pop("pol_next")
    deleted = kept_deleted(st.session_state, policies) if st.session_state.get("pol_pick") != NEW else None
    ids = [NEW, *policies, *([deleted] if deleted else [])]
    if st.session_state.get("pol_pick") not in ids:
        st.session_state["pol_pick"] = ids[1] if len(ids) > 1 else NEW
    shown: tuple[str, dict[str, Any]] = st.session_state.get(VIEW_KEY) or ("", {})
    pick = st.selectbox("Policy", ids, key="pol_pick", format_func=lambda i: "+ New policy" if i == NEW else (
        policies[i]["name"] if i in policies else f"{shown[1].get('name')} (deleted)"))
    current, stale = editor_view(st.session_state, None if pick == NEW else pick, policies.get(pick))
    current = current or EMPTY
    pick = str(pick)
    version = current.get("version") or 0
    view = f"{pick}_v{version}"  # widgets of the version this view loaded; this session's save makes fresh ones
    errors_key = f"pol_errors_{pick}"
    errors = st.session_state.get(errors_key, {})
    if pick != NEW:
        st.caption(f"Saved version {version} · last saved {current.get('updated_at', '')[:19]}")
    if stale:
        st.warning(md(stale))
        if pick in policies and st.button(f"Load version {policies[pick].get('version')}", key="pol_reload"):
            st.session_state.pop(VIEW_KEY, None)
            st.session_state.pop(errors_key, None)
            st.rerun()

    def field_error(name: str) -> None:
        if name in errors:
            st.error(f"**{name}**: {md(errors[name])}")

    if errors:  # above both tabs: an error from the JSON tab may name a field only the Form shows, and back
        st.error("**Not saved** - " + ("the draft stays on screen:" if "version" in errors else "fix these, then save again:")
                 + "\n\n" + "\n".join(f"- **{md(k)}**: {md(v)}" for k, v in errors.items()))
    form_tab, json_tab = st.tabs(["Form", "JSON"])
    with form_tab:
        with st.form(f"pol_form_{view}"):
            name = st.text_input("Name", current["name"], key=f"pol_name_{view}")
            field_error("name")
            question = st.text_area("Question", current["question"], height=80, key=f"pol_question_{view}")
            field_error("question")
            st.markdown("**Options** (in order; ids are what applications receive)")
            options = st.data_editor(pd.DataFrame(current["options"], columns=["id", "description"]), num_rows="dynamic",
                                     key=f"pol_options_{view}", hide_index=True, width="stretch")
            field_error("options")
            st.markdown("**Examples** (solved cases: read by the `option-words` readout, and by `letters` when a run asks "
                        "for examples - the Calibrate readout `letters + examples`)")
            examples = st.data_editor(pd.DataFrame(current["examples"], columns=["state", "option_id"]),
                                      num_rows="dynamic", key=f"pol_examples_{view}", hide_index=True, width="stretch")
            field_error("examples")
            c1, c2, c3 = st.columns(3)
            readouts = ["", *policy_service.READOUTS]
            readout = c1.selectbox("Readout", readouts, index=readouts.index(current.get("readout") or ""),
                                   format_func=lambda r: r or "model default", key=f"pol_readout_{view}")
            debiases = ["", *policy_service.DEBIAS]
            debias = c2.selectbox("Position-bias correction", debiases,
                                  index=debiases.index(current.get("debias") or ""),
                                  format_func=lambda r: r or "model default", key=f"pol_debias_{view}",
                                  help="content-free divides out the answer the model gives to an empty state")
            guards = ["", *(g for g in policy_service.GUARDS if g != "none")]
            guard = c3.selectbox("Steering guard", guards, index=guards.index(current.get("guard") or ""),
                                 format_func=lambda g: g or "none", key=f"pol_guard_{view}",
                                 help="flags a state that tries to dictate its own decision (see the Robustness page); "
                                      "a calibrated policy sends flagged rows to its fallback")
            notes = st.text_area("Notes - for people only: never sent to the model (write rules the model must "
                                 "follow into the question or the option descriptions)", current.get("notes", ""),
                                 key=f"pol_notes_{view}")
            field_error("id")
            saved = st.form_submit_button("Save policy", type="primary")
        if saved:
            data = {"id": current["id"] or None, "name": name, "question": question,
                    "options": options.astype(object).fillna("").to_dict("records"),
                    "examples": examples.astype(object).fillna("").to_dict("records"),
                    "readout": readout, "debias": debias, "guard": guard, "notes": notes}
            clean, errs = policy_service.validate_policy(data)
            if clean and pick == NEW and clean["id"] in policies:
                errs = {"name": f"a policy with id {clean['id']!r} exists: choose another name"}
                clean = None
            if clean:
                save(db, clean, version if pick != NEW else 0, errors_key)  # reruns unless the edit is stale
            else:
                st.session_state[errors_key] = errs
            st.rerun()

    with json_tab:
        text = st.text_area("Policy as JSON (the same saved policy as the form)", policy_service.policy_json(current) if pick != NEW else "",
                            height=380, key=f"pol_json_{view}")
        field_error("json")
        if st.button("Apply JSON", key=f"pol_apply_{view}"):
            clean, errs = policy_service.parse_policy_json(text)
            if clean and pick != NEW and clean["id"] != pick and clean["id"] in policies:
                errs = {"json": f"id {clean['id']!r} belongs to another policy: keep {pick!r} or pick a new id"}
                clean = None
            if clean:
                save(db, clean, version if clean["id"] == pick else 0, errors_key)  # reruns unless stale
            else:
                st.session_state[errors_key] = errs
            st.rerun()

    if pick != NEW:
        c1, c2 = st.columns(2)
        if c1.button("Duplicate", key="pol_dup"):
            add_and_open(lambda: policy_service.duplicate(db, current))
        with c2.popover("Delete"):
            st.write(f"Delete **{md(current['name'])}**? Runs that used it keep their own copy.")
            if st.button("Delete policy", type="primary", key="pol_delete"):
                policy_service.delete(db, pick)
                st.session_state.pop(VIEW_KEY, None)
                st.session_state["pol_next"] = None
                st.rerun()


if __name__ == "__main__":
    resources.run_page(render)

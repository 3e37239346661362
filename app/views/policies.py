"""Policies: a question and its ordered options (+ few-shot examples, notes) - edit, copy, delete.

The Form and the JSON tab are two views of the saved version this session loaded (policy_editor.
editor_view): every widget key carries that version, so after this session's save both are rebuilt
from what was saved, while another session's save leaves the draft here on screen - and a save from
it is refused ("Not saved", with the reason) instead of overwriting the newer version or being lost.

The fields are plain widgets (no st.form), one row of inputs per option and example: their values are
in session state on every rerun, so the page compares the draft with the saved version (Unsaved
changes), and a switch to another policy while they differ waits for the analyst's answer."""
from typing import Any, Final, Mapping

import streamlit as st

from app.service import policies as policy_service
from app.ui import context, resources
from app.ui.policy_editor import (EMPTY, NEW, VIEW_KEY, add_row, draft, editor_view, forget, json_start, kept_deleted,
                                  key, option_ids, remove_row, rename_option, row_default, row_ids, unsaved)
from app.ui.safe_text import md

# the draft's widgets keep their values for the whole session: a visit to another page never loses a draft
# (Streamlit drops the values of widgets a run does not draw, unless they persist)
KEEP: Final = "session"


def save(db, clean: Mapping[str, Any], version: int, errors_key: str, view: str) -> None:
    """Save against the version the view was built on (0: a new policy); a stale view is refused."""
    try:
        saved = policy_service.save(db, clean, version)
    except policy_service.StaleEdit as exc:
        st.session_state[errors_key] = {"version": str(exc)}
        return
    st.session_state[errors_key] = {}
    st.session_state.pop("pol_pending", None)
    forget(st.session_state, view)  # saved: the view of the new version starts from what was saved
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
    st.session_state["pol_open"] = new["id"]  # asks first when the open draft has unsaved changes
    st.rerun()


def switch_or_ask() -> None:
    """Apply the selection asked for since the last run - unless the editor holds unsaved changes:
    then the draft stays, and the page asks (Discard changes and open X / Keep editing)."""
    ss = st.session_state
    forced = "pol_next" in ss  # after a save or a delete: nothing unsaved is left behind
    if forced:
        ss["pol_pick"] = ss.pop("pol_next")
    elif "pol_open" in ss:  # a copy or a template was added: open it, the same way as a pick
        ss["pol_pick"] = ss.pop("pol_open")
    shown = ss.get("pol_shown")
    if forced or not shown or ss.get("pol_pick") == shown[0]:
        return
    if unsaved(st.session_state):
        ss["pol_pending"] = ss.get("pol_pick")
        ss["pol_pick"] = shown[0]


def discard_and_open(view: str, pending: str) -> None:
    forget(st.session_state, view)
    st.session_state.pop("pol_pending", None)
    st.session_state.pop("pol_shown", None)
    st.session_state["pol_pick"] = pending


def new_policy() -> None:
    st.session_state["pol_pick"] = NEW  # switch_or_ask asks first when the open draft is not saved


def rows_editor(kind: str, view: str, current: Mapping[str, Any], columns: tuple[str, str], placeholders: tuple[str, str],
                most: int, least: int, add_label: str) -> None:
    """One row of inputs per option or example, Remove per row and Add below - plain widgets, so a
    value typed quickly is never lost to a grid's rerun, and every value is in session state."""
    ids = row_ids(st.session_state, kind, view, current)
    noun = kind[:-1]
    stale: list[str] = []  # examples labelled with an option the draft no longer has
    for i, r in enumerate(ids):
        c1, c2, c3 = st.columns([2, 5, 1] if kind == "options" else [5, 2, 1], vertical_alignment="center")
        for col, name, hint in zip((c1, c2), columns, placeholders):
            label, start, k = f"{noun.capitalize()} {i + 1} {hint}", row_default(current, kind, r, name), key(f"{kind}.{name}", view, r)
            if kind == "examples" and name == "state":
                col.text_area(label, start, height=68, key=k, placeholder=hint, label_visibility="collapsed",
                              persist_state=KEEP)
            elif kind == "examples":  # the label is one of the options as the draft has them now
                have, now = str(st.session_state.get(k, start) or ""), option_ids(st.session_state, view, current)
                choices = now + ([have] if have and have not in now else [])  # a removed option's label stays (warned)
                col.selectbox(label, choices, index=None if k in st.session_state or have not in choices else
                              choices.index(have), key=k, label_visibility="collapsed", placeholder="pick the option",
                              persist_state=KEEP)
                if have and have not in now:
                    stale.append(f"example {i + 1}: {have!r}")
            elif kind == "options" and name == "id":  # a renamed id: the examples labelled with it follow
                col.text_input(label, start, key=k, placeholder=hint, label_visibility="collapsed", persist_state=KEEP,
                               on_change=rename_option,
                               args=(st.session_state, view, current, r, str(st.session_state.get(k, start) or "")))
            else:
                col.text_input(label, start, key=k, placeholder=hint, label_visibility="collapsed", persist_state=KEEP)
        c3.button("Remove", key=f"pol_rm_{kind}_{view}_{r}", disabled=len(ids) <= least,
                  help=f"a policy needs at least {least} {kind}" if len(ids) <= least else f"remove {noun} {i + 1}",
                  on_click=remove_row, args=(st.session_state, kind, view, r))
    if stale:
        st.warning(f"Not an option any more: {md(', '.join(stale))} - pick one of the options for "
                   f"{'it' if len(stale) == 1 else 'them'} before saving.")
    st.button(add_label, key=f"pol_add_{kind}_{view}", disabled=len(ids) >= most,
              help=f"at most {most} {kind}" if len(ids) >= most else None,
              on_click=add_row, args=(st.session_state, kind, view))


def render() -> None:
    st.title("Policies")
    db = resources.store()
    policies = {p["id"]: p for p in policy_service.saved(db)}
    template_sidebar(db)
    if st.session_state.get("pol_saved"):
        st.toast(f"Saved {md(st.session_state.pop('pol_saved'))}")
    wanted = context.get("policy")  # the policy of the other pages (or the URL)
    if wanted in policies and st.session_state.get("pol_pick") != wanted and "pol_pick" not in st.session_state:
        st.session_state["pol_pick"] = wanted
    switch_or_ask()
    deleted = kept_deleted(st.session_state, policies) if st.session_state.get("pol_pick") != NEW else None
    ids = [NEW, *policies, *([deleted] if deleted else [])]
    if st.session_state.get("pol_pick") not in ids:
        st.session_state["pol_pick"] = ids[1] if len(ids) > 1 else NEW
    shown: tuple[str, dict[str, Any]] = st.session_state.get(VIEW_KEY) or ("", {})

    def title(i: str) -> str:
        return "+ New policy" if i == NEW else (policies[i]["name"] if i in policies else f"{shown[1].get('name')} (deleted)")

    c1, c2 = st.columns([5, 1], vertical_alignment="bottom")
    pick = c1.selectbox("Policy", ids, key="pol_pick", format_func=title)
    c2.button("New policy", key="pol_new", icon=":material/add:", on_click=new_policy, width="stretch")
    if pick in policies:
        context.put("policy", pick)
    current, stale = editor_view(st.session_state, None if pick == NEW else pick, policies.get(pick))
    current = current or EMPTY
    pick = str(pick)
    version = current.get("version") or 0
    view = f"{pick}_v{version}"  # widgets of the version this view loaded; this session's save makes fresh ones
    st.session_state["pol_shown"] = (pick, view)
    errors_key = f"pol_errors_{pick}"
    changed = policy_service.changed_fields(draft(st.session_state, view, current, json_start(pick, current)), current)
    if not changed and "version" not in st.session_state.get(errors_key, {}):
        st.session_state.pop(errors_key, None)  # the draft is the saved policy again: its old errors no longer apply
    errors = st.session_state.get(errors_key, {})
    pending = st.session_state.get("pol_pending")
    if pending is not None and (pending == pick or pending not in ids or not changed):
        st.session_state.pop("pol_pending")  # nothing left to ask about
        pending = None
    c1, c2 = st.columns([3, 1], vertical_alignment="center")
    if pick != NEW:
        c1.caption(f"Saved version {version} · last saved {current.get('updated_at', '')[:16].replace('T', ' ')}")
    if changed:
        c2.badge("Unsaved changes", icon=":material/edit:", color="orange",
                 help="not saved yet: " + ", ".join("JSON tab" if f == "json" else f for f in changed))
    if pending is not None:
        where = "a new policy" if pending == NEW else title(pending)
        st.warning(f"**Unsaved changes** to {md(current['name'] or 'this new policy')} "
                   f"({', '.join('JSON tab' if f == 'json' else f for f in changed)}): save them, keep editing, "
                   f"or discard them and open {md(where)}.")
        c1, c2, _ = st.columns([2, 1, 2])
        c1.button(f"Discard changes and open {md(where)}", key="pol_discard", on_click=discard_and_open,
                  args=(view, pending))
        c2.button("Keep editing", key="pol_keep", type="primary",
                  on_click=lambda: st.session_state.pop("pol_pending", None))
    if stale:
        st.warning(md(stale))
        if pick in policies and st.button(f"Load version {policies[pick].get('version')}", key="pol_reload"):
            st.session_state.pop(VIEW_KEY, None)
            st.session_state.pop(errors_key, None)
            forget(st.session_state, view)
            st.rerun()

    def field_error(name: str) -> None:
        if name in errors:
            st.error(f"**{name}**: {md(errors[name])}")

    if errors:  # above both tabs: an error from the JSON tab may name a field only the Form shows, and back
        st.error("**Not saved** - " + ("the draft stays on screen:" if "version" in errors else "fix these, then save again:")
                 + "\n\n" + "\n".join(f"- **{md(k)}**: {md(v)}" for k, v in errors.items()))
    # keyed and stateful: the tab shown survives a rerun (an error after Apply JSON keeps the JSON tab)
    form_tab, json_tab = st.tabs(["Form", "JSON"], key="pol_tab", on_change="rerun")
    with form_tab:
        st.text_input("Name", current["name"], key=key("name", view), persist_state=KEEP)
        field_error("name")
        st.text_area("Question", current["question"], height=80, key=key("question", view), persist_state=KEEP)
        field_error("question")
        st.markdown("**Options** (in order; ids are what applications receive)")
        rows_editor("options", view, current, ("id", "description"), ("id", "description"),
                    policy_service.MAX_OPTIONS, 2, "Add option")
        field_error("options")
        st.markdown("**Examples** (solved cases: read by the `option-words` readout, and by `letters` when a run asks "
                    "for examples - the Calibrate readout `letters + examples`)")
        rows_editor("examples", view, current, ("state", "option_id"), ("state", "option id"),
                    policy_service.MAX_EXAMPLES, 0, "Add example")
        field_error("examples")
        c1, c2, c3 = st.columns(3)
        readouts = ["", *policy_service.READOUTS]
        c1.selectbox("Readout", readouts, index=readouts.index(current.get("readout") or ""),
                     format_func=lambda r: r or "model default", key=key("readout", view), persist_state=KEEP)
        debiases = ["", *policy_service.DEBIAS]
        c2.selectbox("Position-bias correction", debiases, index=debiases.index(current.get("debias") or ""),
                     format_func=lambda r: r or "model default", key=key("debias", view), persist_state=KEEP,
                     help="content-free divides out the answer the model gives to an empty state")
        guards = ["", *(g for g in policy_service.GUARDS if g != "none")]
        c3.selectbox("Steering guard", guards, index=guards.index(current.get("guard") or ""),
                     format_func=lambda g: g or "none", key=key("guard", view), persist_state=KEEP,
                     help="flags a state that tries to dictate its own decision (see the Robustness page); "
                          "a calibrated policy sends flagged rows to its fallback")
        st.text_area("Notes - for people only: never sent to the model (write rules the model must "
                     "follow into the question or the option descriptions)", current.get("notes", ""),
                     key=key("notes", view), persist_state=KEEP)
        field_error("id")
        if st.button("Save policy", type="primary", key=f"pol_save_{view}"):
            data = draft(st.session_state, view, current, json_start(pick, current))
            data.pop("json")
            clean, errs = policy_service.validate_policy(data)
            editing = None if pick == NEW else pick
            if clean and (taken := policy_service.id_taken(clean["id"], editing, policies, via="form")):
                errs, clean = taken, None
            if clean:  # reruns unless the edit is stale
                save(db, clean, policy_service.version_to_save(clean["id"], editing, version), errors_key, view)
            else:
                st.session_state[errors_key] = errs
            st.rerun()

    with json_tab:
        text = st.text_area("Policy as JSON (the same saved policy as the form)", json_start(pick, current),
                            height=380, key=key("json", view), persist_state=KEEP)
        field_error("json")
        if st.button("Apply JSON", key=f"pol_apply_{view}"):
            clean, errs = policy_service.parse_policy_json(text)
            editing = None if pick == NEW else pick
            if clean and (taken := policy_service.id_taken(clean["id"], editing, policies, via="json")):
                errs, clean = taken, None
            if clean:  # reruns unless stale
                save(db, clean, policy_service.version_to_save(clean["id"], editing, version), errors_key, view)
            else:
                st.session_state[errors_key] = errs
            st.rerun()

    if pick != NEW:
        c1, c2 = st.columns(2)
        if c1.button("Duplicate", key="pol_dup", help="a copy of the saved version, opened"):
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

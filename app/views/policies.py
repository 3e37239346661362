"""Policies: a question and its ordered options (+ few-shot examples, notes) - edit, copy, delete.

The Form and the JSON tab are two views of the saved version this session loaded (policy_editor.
editor_view): every widget key carries that version, so after this session's save both are rebuilt
from what was saved, while another session's save leaves the draft here on screen - and a save from
it is refused ("Not saved", with the reason) instead of overwriting the newer version or being lost.

The fields are plain widgets (no st.form), one row of inputs per option and example: their values are
in session state on every rerun, so the page compares the draft with the saved version (Unsaved
changes), and a switch to another policy while they differ waits for the analyst's answer."""
from typing import Any, Callable, Final, Literal, Mapping

import streamlit as st

from app.core.store import Store
from app.service import policies as policy_service, queries
from app.ui import context, policy_editor as pe, resources
from app.ui.policy_editor import KEYS, NEW, Editor, add_row, key, option_ids, remove_row, rename_option, row_default, row_ids
from app.ui.safe_text import md

# the draft's widgets keep their values for the whole session: a visit to another page never loses a draft
# (Streamlit drops the values of widgets a run does not draw, unless they persist)
KEEP: Final = "session"
Policies = Mapping[str, Mapping[str, Any]]


def template_sidebar(db: Store) -> None:
    tpl = policy_service.templates()
    with st.expander("Start from a template"):
        tid = st.selectbox("Template", list(tpl), format_func=lambda i: tpl[i]["name"], key=KEYS.tpl)
        if st.button("Add template", key=KEYS.add_tpl):  # its own id when free, else a numbered copy
            add_and_open(lambda: policy_service.add_template(db, tid))


def add_and_open(make: Callable[[], Mapping[str, Any]]) -> None:
    """Save a new policy (a template or a copy, never over an existing one) and open it."""
    try:
        new = make()
    except policy_service.StaleEdit as exc:  # the free id was taken in the same instant by another session
        st.error(md(exc))
        return
    pe.opened(st.session_state, new["id"])  # asks first when the open draft has unsaved changes
    st.rerun()


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
        c3.button("Remove", key=KEYS("rm", kind, view, r), disabled=len(ids) <= least,
                  help=f"a policy needs at least {least} {kind}" if len(ids) <= least else f"remove {noun} {i + 1}",
                  on_click=remove_row, args=(st.session_state, kind, view, r))
    if stale:
        st.warning(f"Not an option any more: {md(', '.join(stale))} - pick one of the options for "
                   f"{'it' if len(stale) == 1 else 'them'} before saving.")
    st.button(add_label, key=KEYS("add", kind, view), disabled=len(ids) >= most,
              help=f"at most {most} {kind}" if len(ids) >= most else None,
              on_click=add_row, args=(st.session_state, kind, view))


def changed_words(changed: tuple[str, ...]) -> str:
    return ", ".join("JSON tab" if f == "json" else f for f in changed)


def picker(policies: Policies) -> Editor:
    """The policy picker and New policy; the editor of what is picked (a switch away from unsaved changes asks)."""
    ids = pe.choices(st.session_state, list(policies), context.get("policy"))  # the other pages' policy (or the URL)
    c1, c2 = st.columns([5, 1], vertical_alignment="bottom")
    pick = c1.selectbox("Policy", ids, key=pe.PICK_KEY, format_func=lambda i: title(i, policies))
    c2.button("New policy", key=KEYS.new, icon=":material/add:", on_click=pe.new_policy, args=(st.session_state,),
              width="stretch")
    if pick in policies:
        context.put("policy", pick)
    return pe.editor(st.session_state, str(pick), policies, ids)


def title(pick: str, policies: Policies) -> str:
    if pick == NEW:
        return "+ New policy"
    if pick in policies:
        return str(policies[pick]["name"])
    shown: tuple[str, Mapping[str, Any]] = st.session_state.get(pe.VIEW_KEY) or ("", {})
    return f"{shown[1].get('name')} (deleted)"


def status(ed: Editor, policies: Policies) -> None:
    """Saved version, Unsaved changes, the switch that waits for an answer, a stale view, a refused save."""
    c1, c2 = st.columns([3, 1], vertical_alignment="center")
    if ed.pick != NEW:
        c1.caption(f"Saved version {ed.version} · last saved {str(ed.saved.get('updated_at', ''))[:16].replace('T', ' ')}")
    if ed.changed:
        c2.badge("Unsaved changes", icon=":material/edit:", color="orange", help="not saved yet: " + changed_words(ed.changed))
    if ed.pending is not None:
        where = "a new policy" if ed.pending == NEW else title(ed.pending, policies)
        st.warning(f"**Unsaved changes** to {md(ed.saved['name'] or 'this new policy')} ({changed_words(ed.changed)}): "
                   f"save them, keep editing, or discard them and open {md(where)}.")
        c1, c2, _ = st.columns([2, 1, 2])
        c1.button(f"Discard changes and open {md(where)}", key=KEYS.discard, on_click=pe.discard_and_open,
                  args=(st.session_state, ed.view, ed.pending))
        c2.button("Keep editing", key=KEYS.keep, type="primary", on_click=pe.keep_editing, args=(st.session_state,))
    if ed.stale:
        st.warning(md(ed.stale))
        if ed.pick in policies and st.button(f"Load version {policies[ed.pick].get('version')}", key=KEYS.reload):
            pe.reload(st.session_state, ed)
            st.rerun()
    if ed.errors:  # above both tabs: an error from the JSON tab may name a field only the Form shows, and back
        st.error("**Not saved** - " + ("the draft stays on screen:" if "version" in ed.errors else
                                       "fix these, then save again:")
                 + "\n\n" + "\n".join(f"- **{md(k)}**: {md(v)}" for k, v in ed.errors.items()))


def field_error(ed: Editor, name: str) -> None:
    if name in ed.errors:
        st.error(f"**{name}**: {md(ed.errors[name])}")


def choice(label: str, values: tuple[str, ...], ed: Editor, field: str, empty: str, help: str | None = None) -> None:
    """A select of `values` ("" first: `empty`), starting from the saved value."""
    st.selectbox(label, values, index=values.index(ed.saved.get(field) or ""), format_func=lambda r: r or empty,
                 key=key(field, ed.view), persist_state=KEEP, help=help)


def form_tab(ed: Editor) -> None:
    """Name, question, options, examples, readout, correction, guard, notes."""
    view, current = ed.view, ed.saved
    st.text_input("Name", current["name"], key=key("name", view), persist_state=KEEP)
    field_error(ed, "name")
    st.text_area("Question", current["question"], height=80, key=key("question", view), persist_state=KEEP)
    field_error(ed, "question")
    st.markdown("**Options** (in order; ids are what applications receive)")
    rows_editor("options", view, current, ("id", "description"), ("id", "description"),
                policy_service.CHOICES.max_options, 2, "Add option")
    field_error(ed, "options")
    st.markdown("**Examples** (solved cases: read by the `option-words` readout, and by `letters` when a run asks "
                "for examples - the Calibrate readout `letters + examples`)")
    rows_editor("examples", view, current, ("state", "option_id"), ("state", "option id"),
                policy_service.CHOICES.max_examples, 0, "Add example")
    field_error(ed, "examples")
    c1, c2, c3 = st.columns(3)
    with c1:
        choice("Readout", policy_service.CHOICES.readouts, ed, "readout", "model default")
    with c2:
        choice("Position-bias correction", policy_service.CHOICES.debias, ed, "debias", "model default",
               help="content-free divides out the answer the model gives to an empty state")
    with c3:
        choice("Steering guard", policy_service.CHOICES.guards, ed, "guard", "none",
               help="flags a state that tries to dictate its own decision (see the Robustness page); "
                    "a calibrated policy sends flagged rows to its fallback")
    st.text_area("Notes - for people only: never sent to the model (write rules the model must "
                 "follow into the question or the option descriptions)", current.get("notes", ""),
                 key=key("notes", view), persist_state=KEEP)
    field_error(ed, "id")


def save_button(db: Store, ed: Editor, policies: Policies, via: Literal["form", "json"]) -> None:
    """Save policy (the Form) or Apply JSON: one save, against the version the view was built on."""
    label, name = ("Save policy", "save") if via == "form" else ("Apply JSON", "apply")
    if st.button(label, type="primary" if via == "form" else "secondary", key=KEYS(name, ed.view)):
        pe.submit(st.session_state, ed, via, list(policies), lambda clean, version: policy_service.save(db, clean, version),
                  lambda new_id, editing, ids: policy_service.id_taken(new_id, editing, ids, via=via))
        st.rerun()


def copy_and_delete(db: Store, ed: Editor) -> None:
    c1, c2 = st.columns(2)
    if c1.button("Duplicate", key=KEYS.dup, help="a copy of the saved version, opened"):
        add_and_open(lambda: policy_service.duplicate(db, ed.saved))
    with c2.popover("Delete"):
        st.write(f"Delete **{md(ed.saved['name'])}**? Runs that used it keep their own copy.")
        if st.button("Delete policy", type="primary", key=KEYS.delete):
            policy_service.delete(db, ed.pick)
            pe.deleted(st.session_state)
            st.rerun()


def render() -> None:
    st.title("Policies")
    db = resources.store()
    policies = {p["id"]: p for p in queries.policies(db)}
    template_sidebar(db)
    if name := pe.just_saved(st.session_state):
        st.toast(f"Saved {md(name)}")
    ed = picker(policies)
    status(ed, policies)
    # keyed and stateful: the tab shown survives a rerun (an error after Apply JSON keeps the JSON tab)
    form, as_json = st.tabs(["Form", "JSON"], key=KEYS.tab, on_change="rerun")
    with form:
        form_tab(ed)
        save_button(db, ed, policies, "form")
    with as_json:
        st.text_area("Policy as JSON (the same saved policy as the form)", pe.json_start(ed.pick, ed.saved),
                     height=380, key=key("json", ed.view), persist_state=KEEP)
        field_error(ed, "json")
        save_button(db, ed, policies, "json")
    if ed.pick != NEW:
        copy_and_delete(db, ed)


if __name__ == "__main__":
    resources.run_page(render)

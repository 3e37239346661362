"""Policies: a question and its ordered options (+ few-shot examples, notes) - edit, copy, delete."""
import pandas as pd
import streamlit as st

from app import resources
from app.policy_form import parse_policy_json, policy_json, templates, validate_policy
from app.safe_text import md

st.title("Policies")
db = resources.store()
policies = {p["id"]: p for p in db.list_policies()}
tpl = templates()

with st.sidebar:
    st.subheader("Start from a template")
    tid = st.selectbox("Template", list(tpl), format_func=lambda i: tpl[i]["name"], key="pol_tpl")
    if st.button("Add template", key="pol_add_tpl"):
        new = dict(tpl[tid])
        if new["id"] in policies:
            new["id"] = f"{new['id']}-{len(policies) + 1}"
            new["name"] = f"{new['name']} ({len(policies) + 1})"
        db.save_policy(new)
        st.session_state["pol_next"] = new["id"]
        st.rerun()

NEW = "__new__"
ids = [NEW, *policies]
if "pol_next" in st.session_state:  # a selection requested by a button on the previous run
    st.session_state["pol_pick"] = st.session_state.pop("pol_next")
if st.session_state.get("pol_pick") not in ids:
    st.session_state["pol_pick"] = ids[1] if len(ids) > 1 else NEW
pick = st.selectbox("Policy", ids, key="pol_pick",
                    format_func=lambda i: "+ New policy" if i == NEW else policies[i]["name"])
current = policies.get(pick) or {"id": "", "name": "", "question": "", "options": [{"id": "", "description": ""}] * 2,
                                 "examples": [], "notes": "", "readout": "", "debias": ""}
errors = st.session_state.get(f"pol_errors_{pick}", {})


def field_error(name: str) -> None:
    if name in errors:
        st.error(f"**{name}**: {errors[name]}")


form_tab, json_tab = st.tabs(["Form", "JSON"])
with form_tab:
    with st.form(f"pol_form_{pick}"):
        name = st.text_input("Name", current["name"], key=f"pol_name_{pick}")
        field_error("name")
        question = st.text_area("Question", current["question"], height=80, key=f"pol_question_{pick}")
        field_error("question")
        st.markdown("**Options** (in order; ids are what applications receive)")
        options = st.data_editor(pd.DataFrame(current["options"], columns=["id", "description"]), num_rows="dynamic",
                                 key=f"pol_options_{pick}", hide_index=True)
        field_error("options")
        st.markdown("**Examples** (solved cases for the few-shot `option-words` readout)")
        examples = st.data_editor(pd.DataFrame(current["examples"], columns=["state", "option_id"]),
                                  num_rows="dynamic", key=f"pol_examples_{pick}", hide_index=True)
        field_error("examples")
        c1, c2 = st.columns(2)
        readouts = ["", "letters", "option-words"]
        readout = c1.selectbox("Readout", readouts, index=readouts.index(current.get("readout") or ""),
                               format_func=lambda r: r or "model default", key=f"pol_readout_{pick}")
        debiases = ["", "none", "content-free"]
        debias = c2.selectbox("Position-bias correction", debiases, index=debiases.index(current.get("debias") or ""),
                              format_func=lambda r: r or "model default", key=f"pol_debias_{pick}",
                              help="content-free divides out the answer the model gives to an empty state")
        notes = st.text_area("Notes", current.get("notes", ""), key=f"pol_notes_{pick}")
        field_error("id")
        saved = st.form_submit_button("Save policy", type="primary")
    if saved:
        data = {"id": current["id"] or None, "name": name, "question": question,
                "options": options.fillna("").to_dict("records"), "examples": examples.fillna("").to_dict("records"),
                "readout": readout, "debias": debias, "notes": notes}
        clean, errs = validate_policy(data)
        if clean and pick == NEW and clean["id"] in policies:
            clean, errs = None, {"name": f"a policy with id {data.get('id') or clean['id']!r} exists: choose another name"}
        st.session_state[f"pol_errors_{pick}"] = errs
        if clean:
            db.save_policy(clean)
            st.session_state["pol_next"] = clean["id"]
            st.toast(f"Saved {md(clean['name'])}")
        st.rerun()

with json_tab:
    text = st.text_area("Policy as JSON (round-trips with the form)", policy_json(current) if pick != NEW else "",
                        height=380, key=f"pol_json_{pick}")
    if st.button("Apply JSON", key=f"pol_apply_{pick}"):
        clean, errs = parse_policy_json(text)
        if clean:
            db.save_policy(clean)
            st.session_state["pol_next"] = clean["id"]
            st.rerun()
        for k, v in errs.items():
            st.error(f"**{k}**: {v}")

if pick != NEW:
    c1, c2 = st.columns(2)
    if c1.button("Duplicate", key="pol_dup"):
        n = 2
        while f"{pick}-copy{n}" in policies:
            n += 1
        copy = {**current, "id": f"{pick}-copy{n}", "name": f"{current['name']} (copy {n})"}
        db.save_policy(copy)
        st.session_state["pol_next"] = copy["id"]
        st.rerun()
    with c2.popover("Delete"):
        st.write(f"Delete **{md(current['name'])}**? Runs that used it keep their own copy.")
        if st.button("Delete policy", type="primary", key="pol_delete"):
            db.delete_policy(pick)
            st.session_state["pol_next"] = None
            st.rerun()

"""Playground: one policy, one state, one or more targets - the probabilities side by side."""
from typing import Any, Mapping
import json

import streamlit as st

from app.core.store import Store
from app.service import decide, policies, queries, targets
from app.ui import context, resources
from app.ui.components import glossary, policy_picker, show_group_results
from app.ui.safe_text import md
from app.ui.keys import PLAYGROUND

FIRST_STATE = "I reset my password an hour ago and now I cannot log in at all. The login page says my account is locked."
POLICY_DEFAULT = "policy default"

KEYS = PLAYGROUND  # this page's session and widget keys


def run(db: Store, policy: Mapping[str, Any], state: object, names: list[str], overrides: dict[str, Any]) -> None:
    """Score the state on the chosen targets (models load first, with a status line) and remember
    the run and the state that produced it."""
    chosen = resources.chosen_targets(db, names)
    if chosen is None:
        return
    bar = st.progress(0.0, text="asking the targets…")
    group = decide.decide(db, policy, state, chosen, overrides=overrides,
                          progress=lambda d, t, e: bar.progress(d / t, text=f"{d}/{t} targets answered"))
    bar.empty()
    st.session_state[KEYS.group] = group
    st.session_state[KEYS.last_state] = state if isinstance(state, str) else json.dumps(state, indent=2, ensure_ascii=False)


def welcome(db: Store) -> None:
    st.info("**Welcome.** A decision policy is a question plus the options a model may choose; the model answers "
            "with one probability per option. Load the five example policies (ticket routing, incident priority, "
            "refund check, agent next action, content moderation) and the workbench runs a first decision on the "
            "shipped local model - no AWS account needed.")
    if st.button("Load the examples and run a first decision", type="primary", key=KEYS.seed):
        policies.seed_templates(db)
        first = queries.policy(db, "ticket-routing")
        if first is not None:  # seeded just now (or earlier)
            run(db, first, FIRST_STATE, ["local"], {})
        st.session_state[KEYS.state] = FIRST_STATE
        st.rerun()
    st.page_link("views/policies.py", label="…or write your own policy", icon=":material/description:")


def render() -> None:
    st.title("Playground")
    db = resources.store()
    saved = queries.policies(db)
    if not saved:
        welcome(db)
        return
    policy = policy_picker(saved, key=KEYS.policy)
    with st.expander(f"**{md(policy['question'])}** — {len(policy['options'])} options", expanded=False):
        st.dataframe(policy["options"], hide_index=True)
    if KEYS.state not in st.session_state and st.session_state.get(KEYS.last_state):
        st.session_state[KEYS.state] = st.session_state[KEYS.last_state]  # coming back: the state of the result shown
    state = st.text_area("State (a ticket, a log excerpt, an agent's context)", height=140, key=KEYS.state,
                         persist_state=context.KEEP, placeholder="Paste the text the model should decide on…")
    upload = st.file_uploader("…or upload a text / JSON file as the state", type=["txt", "md", "json", "log"],
                              key=KEYS.upload)
    names = targets.names(db, single_rows=True)
    chosen = st.multiselect("Targets", names, default=names[:1], key=KEYS.targets,
                            help="Several local models are built in; add adapters, SageMaker endpoints or chat servers "
                                 "on the Targets page.")
    c1, c2, c3 = st.columns(3)
    readout = c1.selectbox("Readout", [POLICY_DEFAULT, *decide.READOUT_CHOICES], key=KEYS.readout,
                           help="letters: A/B/C through the chat template; option-words: reads the option ids.")
    debias = c2.selectbox("Position-bias correction", [POLICY_DEFAULT, *decide.DEBIAS_CHOICES], key=KEYS.debias,
                          help="content-free: divide out what the model answers with no state at all (one extra "
                               "pass per policy, cached). Permutation averaging costs one pass per option order.")
    permute = c3.checkbox("Average over option orders", key=KEYS.permute)
    if st.button("Run", type="primary", key=KEYS.run):
        try:  # an uploaded .json file is an object state (rendered as the adapter renders it)
            text = decide.state_from(upload.name if upload else None, upload.getvalue() if upload else None, state)
        except decide.InputError as exc:
            st.error(f"**State**: {md(exc.problems[0])}")
            return
        if not chosen:
            st.error("**Targets**: pick at least one target.")
        else:
            run(db, policy, text, chosen, decide.overrides(None if readout == POLICY_DEFAULT else readout,
                                                           None if debias == POLICY_DEFAULT else debias, permute))
    if st.session_state.get(KEYS.group):
        show_group_results(db, st.session_state[KEYS.group], key=KEYS.prefix)
        glossary("label mass", "warm", "letters", "option-words", "content-free", "permutation")


if __name__ == "__main__":
    resources.run_page(render)

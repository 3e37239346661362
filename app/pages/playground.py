"""Playground: one policy, one state, one or more targets - see the probabilities side by side."""
import streamlit as st

from app import resources
from app.components import policy_picker, show_group_results
from app.runner import Row, run_policy
from app.safe_text import md
from app.targets import TargetError

st.title("Playground")
db = resources.store()
policies = db.list_policies()
if not policies:
    st.info("**Welcome.** A decision policy is a question plus the options a model may choose. "
            "Start from the four example policies (ticket routing, incident priority, refund check, agent next "
            "action), or write your own on the Policies page. Everything runs on the shipped local model: "
            "no AWS account needed.")
    if st.button("Load the example policies", type="primary", key="pg_seed"):
        resources.seed_templates(db)
        st.rerun()
    st.page_link("pages/policies.py", label="Create a policy", icon=":material/description:")
    st.stop()

policy = policy_picker(policies, key="pg_policy")
with st.expander(f"**{md(policy['question'])}** — {len(policy['options'])} options", expanded=False):
    st.dataframe(policy["options"], hide_index=True)

state = st.text_area("State (a ticket, a log excerpt, an agent's context)", height=140, key="pg_state",
                     placeholder="Paste the text the model should decide on…")
upload = st.file_uploader("…or upload a text / JSON file as the state", type=["txt", "md", "json", "log"],
                          key="pg_upload")
specs = resources.target_specs(db)
names = [s["name"] for s in specs]
chosen = st.multiselect("Targets", names, default=names[:1], key="pg_targets",
                        help="Add SemIf adapters, SageMaker endpoints or chat-completion servers on the Targets page.")
c1, c2, c3 = st.columns(3)
readout = c1.selectbox("Readout", ["policy default", "letters", "option-words"], key="pg_readout",
                       help="letters: A/B/C through the chat template; option-words: few-shot, reads option ids.")
debias = c2.selectbox("Position-bias correction", ["policy default", "none", "content-free"], key="pg_debias",
                      help="content-free: divide out what the model answers with no state at all (one extra "
                           "pass per policy, cached). Permutation averaging costs one pass per option order.")
permute = c3.checkbox("Average over option orders", key="pg_permute")

if st.button("Run", type="primary", key="pg_run"):
    text = upload.getvalue().decode("utf-8", "replace") if upload is not None else state
    if not text.strip():
        st.error("**State** is empty: paste a ticket or log, or upload a file.")
    elif not chosen:
        st.error("**Targets**: pick at least one target.")
    else:
        overrides = ({"permute": permute} | ({} if readout == "policy default" else {"readout": readout})
                     | ({} if debias == "policy default" else {"debias": debias}))
        try:
            targets = [resources.make_target(next(s for s in specs if s["name"] == n)) for n in chosen]
        except TargetError as exc:
            st.error(str(exc))
            st.stop()
        resources.load_models(targets)
        bar = st.progress(0.0, text="starting…")
        group, _ = run_policy(db, policy, [Row("playground", text)], targets, kind="playground", overrides=overrides,
                              progress=lambda d, t, e: bar.progress(d / t, text=f"{d}/{t} targets answered"))
        bar.empty()
        st.session_state["pg_group"] = group

if st.session_state.get("pg_group"):
    show_group_results(db, st.session_state["pg_group"], key="pg")

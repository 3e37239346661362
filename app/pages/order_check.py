"""Order check: does the order of the options change the answer? Per policy x target x readout."""
import json
import uuid

import plotly.graph_objects as go
import streamlit as st

from app.core import evaluation, order_sensitivity

from app.ui import resources
from app.ui.components import download_frame, policy_picker
from app.core.inputs import InputError, rows_from_text
from app.core.labeled import scored_cases
from app.core.runner import Case, Job, progress_text, score_into_runs
from app.ui.safe_text import md


def position_chart(positions, labeled: bool) -> go.Figure:
    bars = [go.Bar(x=positions["position"], y=positions["chosen"], name="chosen by the model")]
    if labeled:
        bars.append(go.Bar(x=positions["position"], y=positions["label"], name="where the label was"))
    fig = go.Figure(bars)
    fig.update_layout(barmode="group", title="Chosen display position vs the labels' positions",
                      xaxis_title="display position", yaxis_title="count", template="plotly_white",
                      margin=dict(l=10, r=10, t=40, b=10))
    return fig


def shift_chart(shifts) -> go.Figure:
    fig = go.Figure(go.Bar(x=shifts["option"], y=shifts["mean_spread"], name="mean",
                           error_y=dict(type="data", array=shifts["max_spread"] - shifts["mean_spread"], symmetric=False)))
    fig.update_layout(title="How far each option's probability moves with the order (max - min)",
                      yaxis=dict(title="probability spread", range=[0, 1]), template="plotly_white",
                      margin=dict(l=10, r=10, t=40, b=10))
    return fig


def cases_from(db, source: str, pasted: str, set_id: int | None, limit: int) -> list[Case]:
    if source == "paste":
        return rows_from_text(pasted)[:limit]
    return scored_cases(db, set_id, limit)


def show(db, run: dict) -> None:
    policy = run["policy"]
    ids = [o["id"] for o in policy["options"]]
    report = order_sensitivity.analyse(db.results(run["id"]), ids, yes=ids[0] if len(ids) == 2 else None)
    st.subheader(f"{md(policy['name'])} on {md(run['target_name'])} ({md(run['config'].get('variant', 'default'))})")
    worry = report.flip_rate >= 0.1 or bool(report.negation and report.negation["mean_abs_gap"] >= 0.15)
    (st.warning if worry else st.success)(md(report.verdict))
    m = st.columns(3)
    m[0].metric("Top option flips", f"{report.flip_rate:.0%}", help=f"of {report.n_states} states, over "
                f"{report.n_options} orders each")
    m[1].metric("Largest mean probability shift", f"{report.shifts['mean_spread'].max():.2f}",
                help="for the option whose probability moves most with the order: max - min over orders, "
                     "averaged over states (0 = order makes no difference)")
    if report.negation:
        m[2].metric("P(yes|Q) + P(yes|not Q)", f"{report.negation['mean_sum']:.2f}",
                    help=f"mean over {report.negation['n']} states; 1.00 is consistent")
    c1, c2 = st.columns(2)
    c1.plotly_chart(position_chart(report.positions, labeled=bool(report.positions["label"].sum())), key="oc_pos")
    c2.plotly_chart(shift_chart(report.shifts), key="oc_shift")
    st.dataframe(report.per_state, hide_index=True, width="stretch", key="oc_states")
    download_frame(report.per_state, f"order-check-{run['id']}.csv", "Download per-state answers (CSV)", key="oc_dl")
    summary = {"run": run["id"], "policy": policy["id"], "target": run["target_name"], "flip_rate": report.flip_rate,
               "positions": report.positions.to_dict("records"), "shifts": report.shifts.to_dict("records"),
               "negation": report.negation, "verdict": report.verdict}
    st.download_button("Download the summary (JSON)", json.dumps(summary, indent=2).encode(),
                       file_name=f"order-check-{run['id']}.json", mime="application/json", key="oc_dl_json")


def render() -> None:
    st.title("Order check")
    st.caption("Decision models prefer positions. Each state is scored once per order of the options (every option "
               "visits every position); the check shows how often that changes the answer and what to do about it.")
    db = resources.store()
    policies = db.list_policies()
    if not policies:
        st.info("No policies yet: load the examples on the Playground page first.")
        return
    policy = policy_picker(policies, key="oc_policy")
    sets = [s for s in db.list_labeled_sets() if s["policy_id"] == policy["id"]]
    source = st.radio("States", ["set", "paste"] if sets else ["paste"], horizontal=True, key="oc_source",
                      format_func={"set": "from this policy's labeled set", "paste": "paste (one per line)"}.get)
    pasted = st.text_area("One state per line", key="oc_paste") if source == "paste" else ""
    set_id = st.selectbox("Labeled set", [s["id"] for s in sets], key="oc_set",
                          format_func=lambda i: next(s["name"] for s in sets if s["id"] == i)) if source == "set" else None
    c1, c2, c3 = st.columns(3)
    limit = c1.number_input("States (at most)", 2, 500, 20, key="oc_limit")
    names = [s["name"] for s in resources.target_specs(db, single_rows=True)]
    tname = c2.selectbox("Target", names, key="oc_target")
    variant = c3.selectbox("Readout", [v for v in evaluation.VARIANTS if "permutation" not in v], key="oc_variant")
    negated = None
    if len(policy["options"]) == 2:
        first = md(policy["options"][0]["id"])
        negated = st.text_input(f"Negated question (optional: checks P({first} | Q) + P({first} | not Q) ≈ 1)",
                                key="oc_negated") or None
    per_state = len(policy["options"]) + (1 if negated else 0)
    if st.button(f"Run the order check ({per_state} calls per state)", type="primary", key="oc_run"):
        try:
            cases = cases_from(db, source, pasted, set_id, int(limit))
        except InputError as exc:
            st.error(md(exc))
            return
        if not cases:
            st.error("**States**: paste at least one line.")
            return
        chosen = resources.chosen_targets(db, [tname])
        if chosen is None:
            return
        target = chosen[0]
        items = order_sensitivity.diagnostic_items(policy, cases, negated, evaluation.VARIANTS[variant].overrides())
        rid = db.create_run(kind="order-check", policy=policy, target=target.describe(), n_rows=len(items),
                            group_id=uuid.uuid4().hex[:12], config={"variant": variant, "negated_question": negated,
                                                                    "states": len(cases)})
        bar = st.progress(0.0, text=f"0/{len(items)} calls")
        score_into_runs(db, [Job(rid, target)], items, total=len(items),
                        progress=lambda d, t, e: bar.progress(d / t, text=progress_text(d, t, e)))
        st.session_state["oc_open"] = rid
    runs = db.list_runs(kind="order-check")
    if not runs:
        return
    by_id = {r["id"]: r for r in runs}
    if st.session_state.get("oc_open") not in by_id:
        st.session_state["oc_open"] = runs[0]["id"]
    rid = st.selectbox("Saved checks", list(by_id), key="oc_open",
                       format_func=lambda i: f"#{i} · {by_id[i]['policy']['name']} · {by_id[i]['target_name']} · "
                                             f"{by_id[i]['config'].get('variant')} · {by_id[i]['config'].get('states')} states")
    show(db, by_id[rid])


if __name__ == "__main__":
    resources.run_page(render)

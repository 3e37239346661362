"""Order check: does the order of the options change the answer? Per policy x target x readout."""
from typing import Any, Mapping
import streamlit as st

from app.core.store import Store
from app.service import checks, policies as policy_service, targets
from app.ui import charts, resources, tasks
from app.ui.components import calibrated_picker, check_inputs, check_setup, download_frame, saved_check
from app.ui.safe_text import md
from app.ui.keys import ORDER_CHECK

KEYS = ORDER_CHECK  # this page's session and widget keys


def show(db: Store, run: Mapping[str, Any]) -> None:
    result = checks.order_report(db, run)
    report = result.report
    st.subheader(f"{md(run['policy']['name'])} on {md(run['target_name'])} ({md(run['config'].get('variant', 'default'))})")
    (st.warning if result.worrying else st.success)(md(report.verdict))
    m = st.columns(3)
    m[0].metric("Top option flips", f"{report.flip_rate:.0%}", help=f"of {report.n_states} states, over "
                f"{report.n_options} orders each")
    m[0].caption(f"n = {report.n_states} states")
    m[1].metric("Largest mean probability shift", f"{report.shifts['mean_spread'].max():.2f}",
                help="for the option whose probability moves most with the order: max - min over orders, "
                     "averaged over states (0 = order makes no difference)")
    if report.negation:
        m[2].metric("P(yes|Q) + P(yes|not Q)", f"{report.negation['mean_sum']:.2f}",
                    help=f"mean over {report.negation['n']} states; 1.00 is consistent")
    c1, c2 = st.columns(2)
    c1.plotly_chart(charts.position_bars(report.positions, labeled=bool(report.positions["label"].sum())), key=KEYS.pos)
    c2.plotly_chart(charts.spread_bars(report.shifts), key=KEYS.shift)
    st.dataframe(report.per_state, hide_index=True, width="stretch", key=KEYS.states)
    stem = f"order-check-{run['id']}-{run['policy_id']}"
    download_frame(report.per_state, f"{stem}.csv", "Download per-state answers (CSV)", key=KEYS.dl)
    st.download_button("Download the summary (JSON)", result.summary_json().encode(), file_name=f"{stem}.json",
                       mime="application/json", key=KEYS.dl_json)


def render() -> None:
    st.title("Order check")
    st.caption("Decision models prefer positions. Each state is scored once per order of the options (every option "
               "visits every position); the check shows how often that changes the answer and what to do about it.")
    db = resources.store()
    setup = check_setup(db, KEYS.prefix, default_limit=20, min_limit=2, variants=checks.SINGLE_ROW_VARIANTS,
                        target_names=targets.names(db, single_rows=True))
    if setup is None:
        return
    policy = setup.policy
    pick = calibrated_picker(db, policy, KEYS("cal", policy['id']), "The Readout above is not used: the order is "
                             "measured on rows rendered as the calibrated policy renders them.")
    negated = None
    if len(policy["options"]) == 2:
        first = md(policy["options"][0]["id"])
        negated = st.text_input(f"Negated question (optional: checks P({first} | Q) + P({first} | not Q) ≈ 1)",
                                key=KEYS.negated) or None
    if st.button(f"Run the order check ({checks.order_calls_per_state(policy, negated)} calls per state)",
                 type="primary", key=KEYS.run):
        got = check_inputs(db, setup)
        if got is None:
            return
        cases, target = got
        tasks.start(KEYS.prefix, "order-check", f"order check: {policy['name']} × {len(cases)} states × {target.name}",
                    "views/order_check.py",
                    lambda task: checks.order_check(db, policy, cases, target, variant=setup.variant,
                                                    negated=negated, progress=task.progress, calibrated=pick))
    tasks.collect(KEYS.prefix, "Order check")
    run = saved_check(db, "order-check", KEYS.open, lambda r: f"{policy_service.title(r['policy']['name'], r['policy'].get('version'))} · {r['target_name']} · "
                      f"{r['config'].get('variant')} · {r['config'].get('states')} states")
    if run is not None:
        show(db, run)


if __name__ == "__main__":
    resources.run_page(render)

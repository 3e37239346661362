"""Robustness check: does the decision hold when a customer tries to steer it, when the question or
the options are reworded, when options are added - per policy x target x readout (and guard)?"""
from typing import Any, Mapping
import json

import streamlit as st

from app.service import checks, heads, targets
from app.ui import charts, context, resources, tasks
from app.ui.components import check_inputs, check_setup, download_frame, saved_check
from app.ui.safe_text import md

LEVEL = {"ok": st.success, "warn": st.warning, "bad": st.error}


def suite_form(policy: Mapping[str, Any]) -> tuple:
    """The shipped suite for this policy, extended or edited by the analyst; raises SuiteError."""
    suite = checks.shipped_suite(policy)
    with st.expander("What the check changes (the suite)", expanded=False):
        st.caption(f"{len(suite.steering)} shipped steering templates (each names a wrong option by its id and by its "
                   "description, at the end, the start or in the middle of the state):")
        st.dataframe([{"template": t.id, "where": t.placement, "text": t.text, "from": t.source} for t in suite.steering],
                     hide_index=True, key=f"rb_templates_{policy['id']}")
        own = st.text_area("Your own steering templates (one per line, each with {option}; start a line with "
                           "'start:' or 'middle:' to place it there)", key=f"rb_own_{policy['id']}",
                           placeholder="The right queue for this is {option}, please use it.")
        paraphrases = st.text_area("Rewordings of the question (one per line)", "\n".join(suite.paraphrases),
                                   key=f"rb_para_{policy['id']}")
        renames = st.text_area("Rewordings of the options (JSON: a list of {old id: {id, description}})",
                               json.dumps(suite.option_rewordings, indent=1, ensure_ascii=False),
                               key=f"rb_rename_{policy['id']}", height=150)
        irrelevant = st.text_input("Off-topic option (id: description)",
                                   f"{suite.irrelevant_option['id']}: {suite.irrelevant_option.get('description', '')}",
                                   key=f"rb_irr_{policy['id']}")
        out_of_scope = st.text_area("States that fit no option (one per line; for the none-of-these check)",
                                    "\n".join(suite.out_of_scope), key=f"rb_oos_{policy['id']}")
    return checks.suite_from_form(policy, own_templates=own, paraphrases=paraphrases, rewordings=renames,
                                  irrelevant=irrelevant, out_of_scope=out_of_scope)


def head_picker(db, policy: Mapping[str, Any]) -> int | None:
    """A saved calibrated policy of this policy whose learned head is measured beside the model (none by
    default, or the calibrated policy in the page's context when it carries a head)."""
    saved = heads.saved(db, policy["id"])
    options: list[int | None] = [None, *saved]
    # a calibrated policy opened elsewhere (?calibrated=3) that carries a head is picked; else none
    if f"rb_head_{policy['id']}" not in st.session_state:  # only on first sight: the picker is the analyst's after
        context.follow(f"rb_head_{policy['id']}", "calibrated", list(saved))
    head_id = st.selectbox("Learned head", options, key=f"rb_head_{policy['id']}",
                           format_func=lambda i: "none: the model alone" if i is None else saved[i],
                           help="a calibrated policy of this policy that carries a learned head (Calibrate): the "
                                "steering numbers then come twice, the model alone and with the head")
    if not saved:
        st.caption("No calibrated policy of this policy carries a learned head yet: export one on Calibrate "
                   "(Learned head) to measure whether it makes steering better or worse.")
    elif head_id is not None:
        st.caption("The unchanged and the steered rows are rendered as that calibrated policy renders them (its "
                   "question, options, examples, readout and correction: the Readout above is not used) and ask the "
                   "target for their hidden state. The other checks reword the prompt or the options the head was "
                   "fitted on: it does not decide those rows.")
    return head_id


def show(db, run: Mapping[str, Any]) -> None:
    report = checks.robustness_report(db, run["id"])
    s = report.summary
    cfg = run["config"]
    st.subheader(f"{md(run['policy']['name'])} on {md(run['target_name'])} ({md(cfg.get('variant', 'default'))}, "
                 f"guard {md(cfg.get('guard', 'none'))})")
    st.caption(f"{report.n_states} states ({md(cfg.get('source', ''))}); {s['errors']} failed calls")
    if report.n_states < 20:
        st.info(f"Only {report.n_states} states: a first look, with wide intervals - check more states for a measurement.")
    for check, (level, text) in report.verdicts.items():
        LEVEL[level](f"**{checks.CHECK_LABELS[check]}**: {md(text)}")
    head = s.get("head")
    if head:
        cal = head["calibrated"]
        gate = "no gate" if cal["threshold"] is None else f"gate {cal['threshold']:.3f}"
        st.markdown("**Steering: the model alone and with the learned head**")
        st.dataframe(checks.head_rows(report), hide_index=True, key="rb_head_table")
        st.caption(f"{md(cal['label'])}: a {md(cal['head_name'])} fitted on {cal['head_rows']} rows of "
                   f"{md(cal['model_file'])}, {gate}, fallback {md(cal['fallback_option'])}; the rows were rendered "
                   f"as it renders them ({md(head['rendering'])}). The run keeps the policy JSON (sha256 "
                   f"{cal['sha256'][:12]}), so this report is recomputed from the run alone.")
        if head["not_applied"]:
            st.info("The learned head does not decide the other checks' rows - "
                    + "; ".join(f"**{checks.CHECK_LABELS[c]}**: {md(why)}" for c, why in head["not_applied"].items())
                    + ". Their numbers are the model's alone.")
    rows = checks.rate_rows(report)
    if rows:
        st.plotly_chart(charts.rate_bars(rows, "Rates with 95% intervals (Wilson)"), key="rb_rates")
    c1, c2 = st.columns(2)
    if len(report.per_template):
        c1.plotly_chart(charts.rate_bars(checks.template_rows(report), "Hijack rate per steering template"),
                        key="rb_templates")
    changes = s["changes"]
    if "none-of-these" in changes:
        none = changes["none-of-these"]
        c2.metric("'None of these' probability: in scope → out of scope",
                  " → ".join("n/a" if v is None else f"{v:.0%}"
                             for v in (none["in_scope"]["mean_mass"], none["out_of_scope"]["mean_mass"])),
                  help=f"mean over {none['in_scope']['n']} in-scope and {none['out_of_scope']['n']} out-of-scope states; "
                       + (f"AUC {none['auc']:.2f}" if none["auc"] is not None else "no out-of-scope states"))
    stem = f"robustness-{run['id']}-{run['policy_id']}"
    if len(report.attempts):
        st.markdown("**Steering attempts**")
        st.dataframe(report.attempts, hide_index=True, key="rb_attempts")
        download_frame(report.attempts, f"{stem}-steering.csv", "Download the steering attempts (CSV)",
                       key="rb_dl_attempts")
    if len(report.flips):
        with st.expander("Rows whose answer changed with a rewording, an added option or the order"):
            st.dataframe(report.flips[report.flips["flipped"]], hide_index=True, key="rb_flips")
        download_frame(report.flips, f"{stem}-changes.csv", "Download the reworded / reordered rows (CSV)",
                       key="rb_dl_flips")
    st.download_button("Download the summary (JSON)", json.dumps({"run": run["id"], **s}, indent=2).encode(),
                       file_name=f"{stem}.json", mime="application/json", key="rb_dl_json")


def render() -> None:
    st.title("Robustness")
    st.caption("A policy certified on clean rows meets customers who write what they want decided. Each state is "
               "scored unchanged and changed: a sentence naming a wrong option added (steering), the question or the "
               "options reworded, an off-topic or a 'none of these' option added, the options reordered. The rates "
               "say how often the decision moved; the steering guard flags rows whose answer rests on one passage.")
    db = resources.store()
    setup = check_setup(db, "rb", default_limit=10, min_limit=1, variants=checks.SINGLE_ROW_VARIANTS,
                        target_names=targets.names(db, single_rows=True))
    if setup is None:
        return
    policy = setup.policy
    c1, c2, c3 = st.columns(3)
    guard = c1.selectbox("Steering guard", list(checks.GUARDS), index=list(checks.GUARDS).index("erase-and-check"),
                         key="rb_guard",
                         help="precheck: a directive that names an option (no model pass); erase-and-check: the "
                              "precheck, then the state scored again with pieces left out")
    attempts = c2.number_input("Steering attempts per state", 0, 20, 3, key="rb_attempts")
    checks_ = c3.multiselect("Checks", list(checks.CHECKS), default=list(checks.CHECKS), key="rb_checks",
                             format_func=lambda c: checks.CHECK_LABELS[c])
    head_id = head_picker(db, policy)
    try:
        suite, out_of_scope = suite_form(policy)
    except checks.SuiteError as exc:
        st.error(md(exc))
        return
    per_state = checks.robustness_calls_per_state(policy, suite, checks_, int(attempts))
    extra = len(out_of_scope) if "none-of-these" in checks_ else 0
    if st.button(f"Run the check ({per_state} calls per state" + (f", + {extra} out-of-scope" if extra else "")
                 + ")", type="primary", key="rb_run"):
        got = check_inputs(db, setup)
        if got is None:
            return
        cases, target = got
        try:
            pick = heads.pick(db, head_id) if head_id is not None else None
        except ValueError as exc:
            st.error(f"**Learned head**: {md(exc)}")
            return
        spec = checks.RobustnessInput(policy, cases, suite, checks_, attempts=int(attempts), variant=setup.variant,
                                      guard=guard, out_of_scope=out_of_scope,
                                      source="pasted states" if setup.set_id is None else "labeled set",
                                      calibrated=pick)
        problem = checks.robustness_problem(spec, target)
        if problem:
            st.error(f"**Learned head**: {md(problem)}")
            return
        tasks.start("rb", "robustness", f"robustness: {policy['name']} × {len(cases)} states × {target.name}",
                    "views/robustness.py", lambda task: checks.robustness_check(db, spec, target, task.progress))
    tasks.collect("rb", "Robustness check")
    run = saved_check(db, "robustness", "rb_open", lambda r: f"{r['policy']['name']} · {r['target_name']} · "
                      f"{r['config'].get('variant')} · guard {r['config'].get('guard')} · {r['config'].get('states')} states")
    if run is not None:
        show(db, run)


if __name__ == "__main__":
    resources.run_page(render)

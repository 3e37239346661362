"""Robustness check: does the decision hold when a customer tries to steer it, when the question or
the options are reworded, when options are added - per policy x target x readout (and guard)?"""
from typing import Any, Mapping
import json

import streamlit as st

from app.service import checks, heads, targets
from app.ui import charts, context, resources, tasks
from app.ui.components import calibrated_picker, check_inputs, check_setup, download_frame, saved_check
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


def guard_picker(column, pick: "heads.AsDeployed | None") -> str:
    """The steering guard: without a calibrated policy, the one measured; with one, its own guard by
    default, and another is a labelled what-if measured beside it."""
    if pick is not None and st.session_state.get("rb_guard_for") != pick.sha256:
        st.session_state["rb_guard"], st.session_state["rb_guard_for"] = pick.guard, pick.sha256
    st.session_state.setdefault("rb_guard", "erase-and-check")
    label = "Steering guard" if pick is None else f"Steering guard (the policy's own: {pick.guard}; another is a what-if)"
    guard = column.selectbox(label, list(checks.GUARDS), key="rb_guard",
                             help="precheck: a directive that names an option (no model pass); erase-and-check: the "
                                  "precheck, then the state scored again with pieces left out")
    if pick is not None and guard != pick.guard:
        column.caption(f"What-if: the verdict is the policy's own guard's ({md(pick.guard)}); {md(guard)} is measured "
                       "beside it, not as the policy's.")
    return str(guard)


def show(db, run: Mapping[str, Any]) -> None:
    report = checks.robustness_report(db, run["id"])
    s = report.summary
    cfg = run["config"]
    guard = (f"guard {md(cfg['deployed_guard'])} as deployed" + (f", what-if guard {md(cfg['what_if_guard'])}"
             if cfg.get("what_if_guard") else "")) if "deployed_guard" in cfg else f"guard {md(cfg.get('guard', 'none'))}"
    st.subheader(f"{md(run['policy']['name'])} on {md(run['target_name'])} ({md(cfg.get('variant', 'default'))}, "
                 f"{guard})")
    st.caption(f"{report.n_states} states ({md(cfg.get('source', ''))}); {s.errors} failed calls")
    if report.n_states < 20:
        st.info(f"Only {report.n_states} states: a first look, with wide intervals - check more states for a measurement.")
    for check, (level, text) in report.verdicts.items():
        LEVEL[level](f"**{checks.CHECK_LABELS[check]}**: {md(text)}")
    if (what_if := checks.what_if(report)) is not None:
        st.info(md(what_if))  # beside the verdicts, never coloured as one
    head = s.head
    if head is not None:
        cal = head.calibrated
        gate = "no gate" if cal["threshold"] is None else f"gate {cal['threshold']:.3f}"
        st.markdown("**Steering: the model alone and " + ("with the learned head**" if cal.get("head") else
                                                            "as deployed**"))
        st.dataframe(checks.head_rows(report), hide_index=True, key="rb_head_table")
        what = (f"a {md(cal['head_name'])} fitted on {cal['head_rows']} rows of" if cal.get("head") else
                f"{md(cal['correction'])} on")
        st.caption(f"{md(cal['label'])}: {what} {md(cal['model_file'])}, {gate}, guard {md(cal.get('guard') or 'none')}, "
                   f"fallback {md(cal['fallback_option'])}; the rows were rendered "
                   f"as it renders them ({md(head.rendering)}). The run keeps the policy JSON (sha256 "
                   f"{cal['sha256'][:12]}), so this report is recomputed from the run alone.")
        if head.not_applied:
            st.info(("The learned head" if cal.get("head") else "The calibrated policy")
                    + " does not decide the other checks' rows - "
                    + "; ".join(f"**{checks.CHECK_LABELS[c]}**: {md(why)}" for c, why in head.not_applied.items())
                    + ". Their numbers are the model's alone.")
    rows = checks.rate_rows(report)
    if rows:
        st.plotly_chart(charts.rate_bars(rows, "Rates with 95% intervals (Wilson)"), key="rb_rates")
    families(report)
    c1, c2 = st.columns(2)
    if len(report.per_template):
        c1.plotly_chart(charts.rate_bars(checks.template_rows(report), "Hijack rate per steering template"),
                        key="rb_templates")
    none = s.changes.none_of_these
    if none is not None:
        c2.metric("'None of these' probability: in scope → out of scope",
                  " → ".join("n/a" if v is None else f"{v:.0%}"
                             for v in (none.in_scope.mean_mass, none.out_of_scope.mean_mass)),
                  help=f"mean over {none.in_scope.n} in-scope and {none.out_of_scope.n} out-of-scope states; "
                       + (f"AUC {none.auc:.2f}" if none.auc is not None else "no out-of-scope states"))
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
    st.download_button("Download the summary (JSON)", json.dumps({"run": run["id"], **s.to_json()}, indent=2).encode(),
                       file_name=f"{stem}.json", mime="application/json", key="rb_dl_json")


def families(report) -> None:
    """The steering numbers per family: a verdict on the whole suite can hide a family it does not resist."""
    rows = checks.family_rows(report)
    if len({r["family"] for r in rows}) < 2:
        return
    st.plotly_chart(charts.rate_bars([{k: v for k, v in r.items() if k not in ("family", "level")} for r in rows],
                                     "Steering per family, with 95% intervals (Wilson)"), key="rb_families")
    st.caption("Families: the four generic templates, how customers, upstream systems (JSON, logs, quoted email, "
               "markdown, system-style notes) and other languages put an instruction in a state, and your own "
               "templates ('yours'). Each attempt takes the next template in turn, so each family has a share of them.")


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
    pick = calibrated_picker(db, policy, f"rb_head_{policy['id']}",
                             "The Readout above is not used. The other checks reword the prompt or the options it "
                             "was calibrated on: they measure the model alone.")
    c1, c2, c3 = st.columns(3)
    guard = guard_picker(c1, pick)
    attempts = c2.number_input("Steering attempts per state", 0, 20, 3, key="rb_attempts")
    checks_ = c3.multiselect("Checks", list(checks.CHECKS), default=list(checks.CHECKS), key="rb_checks",
                             format_func=lambda c: checks.CHECK_LABELS[c])
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
        spec = checks.RobustnessInput(policy, cases, suite, checks_, attempts=int(attempts), variant=setup.variant,
                                      guard=guard, out_of_scope=out_of_scope,
                                      source="pasted states" if setup.set_id is None else "labeled set",
                                      calibrated=pick)
        problem = checks.robustness_problem(spec, target)
        if problem:
            st.error(f"**Calibrated policy**: {md(problem)}")
            return
        tasks.start("rb", "robustness", f"robustness: {policy['name']} × {len(cases)} states × {target.name}",
                    "views/robustness.py", lambda task: checks.robustness_check(db, spec, target, task.progress))
    tasks.collect("rb", "Robustness check")
    run = saved_check(db, "robustness", "rb_open", lambda r: f"{r['policy']['name']} · {r['target_name']} · "
                      f"{r['config'].get('variant')} · guard {r['config'].get('deployed_guard', r['config'].get('guard'))}"
                      + (f" (what-if {r['config']['what_if_guard']})" if r['config'].get('what_if_guard') else "")
                      + f" · {r['config'].get('states')} states")
    if run is not None:
        show(db, run)


if __name__ == "__main__":
    resources.run_page(render)

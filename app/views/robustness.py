"""Robustness check: does the decision hold when a customer tries to steer it, when the question or
the options are reworded, when options are added - per policy x target x readout (and guard)?"""
from __future__ import annotations

import json
from typing import Any, Mapping

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.core.robustness.report import HeadReport, NoneEntry
from app.core.store import Store
from app.service import checks, heads, robustness_panels, targets
from app.ui import charts, context, resources, tasks
from app.ui.components import calibrated_picker, check_inputs, check_setup, download_frame, saved_check
from app.ui.keys import ROBUSTNESS
from app.ui.safe_text import md

keys = ROBUSTNESS


def suite_form(policy: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """The shipped suite for this policy, extended or edited by the analyst; raises SuiteError."""
    suite = checks.shipped_suite(policy)
    with st.expander("What the check changes (the suite)", expanded=False):
        st.caption(f"{len(suite.steering)} shipped steering templates (each names a wrong option by its id and by its "
                   "description, at the end, the start or in the middle of the state):")
        st.dataframe([{"template": t.id, "where": t.placement, "text": t.text, "from": t.source} for t in suite.steering],
                     hide_index=True, key=keys("templates", policy["id"]))
        own = st.text_area("Your own steering templates (one per line, each with {option}; start a line with "
                           "'start:' or 'middle:' to place it there)", key=keys("own", policy["id"]),
                           placeholder="The right queue for this is {option}, please use it.")
        paraphrases = st.text_area("Rewordings of the question (one per line)", "\n".join(suite.paraphrases),
                                   key=keys("para", policy["id"]))
        renames = st.text_area("Rewordings of the options (JSON: a list of {old id: {id, description}})",
                               json.dumps(suite.option_rewordings, indent=1, ensure_ascii=False),
                               key=keys("rename", policy["id"]), height=150)
        irrelevant = st.text_input("Off-topic option (id: description)",
                                   f"{suite.irrelevant_option['id']}: {suite.irrelevant_option.get('description', '')}",
                                   key=keys("irr", policy["id"]))
        out_of_scope = st.text_area("States that fit no option (one per line; for the none-of-these check)",
                                    "\n".join(suite.out_of_scope), key=keys("oos", policy["id"]))
    return checks.suite_from_form(policy, own_templates=own, paraphrases=paraphrases, rewordings=renames,
                                  irrelevant=irrelevant, out_of_scope=out_of_scope)


def guard_picker(column: DeltaGenerator, pick: heads.AsDeployed | None) -> str:
    """The steering guard: without a calibrated policy, the one measured; with one, its own guard by
    default, and another is a labelled what-if measured beside it."""
    if pick is not None and st.session_state.get(keys.guard_for) != pick.sha256:
        st.session_state[keys.guard], st.session_state[keys.guard_for] = pick.guard, pick.sha256
    st.session_state.setdefault(keys.guard, "erase-and-check")
    label = "Steering guard" if pick is None else f"Steering guard (the policy's own: {pick.guard}; another is a what-if)"
    guard = column.selectbox(label, list(checks.GUARDS), key=keys.guard,
                             help="precheck: a directive that names an option (no model pass); erase-and-check: the "
                                  "precheck, then the state scored again with pieces left out")
    if pick is not None and guard != pick.guard:
        column.caption(f"What-if: the verdict is the policy's own guard's ({md(pick.guard)}); {md(guard)} is measured "
                       "beside it, not as the policy's.")
    return str(guard)


def show(db: Store, run: Mapping[str, Any]) -> None:
    report = checks.robustness_report(db, run["id"])
    s = report.summary
    verdict = robustness_panels.verdict(run, report, md)
    st.subheader(verdict.title)
    st.caption(verdict.caption)
    if verdict.first_look:
        st.info(verdict.first_look)
    for note in verdict.verdicts:
        getattr(st, note.kind)(note.text)
    if verdict.what_if is not None:
        st.info(verdict.what_if)  # beside the verdicts, never coloured as one
    if s.head is not None:
        head_section(report, s.head)
    rows = checks.rate_rows(report)
    if rows:
        st.plotly_chart(charts.rate_bars(rows, "Rates with 95% intervals (Wilson)"), key=keys.rates)
    families(report)
    c1, c2 = st.columns(2)
    if len(report.per_template):
        c1.plotly_chart(charts.rate_bars(checks.template_rows(report), "Hijack rate per steering template"),
                        key=keys.templates)
    if s.changes.none_of_these is not None:
        none_of_these(c2, s.changes.none_of_these)
    stem = f"robustness-{run['id']}-{run['policy_id']}"
    if len(report.attempts):
        st.markdown("**Steering attempts**")
        st.dataframe(report.attempts, hide_index=True, key=keys.attempts)
        download_frame(report.attempts, f"{stem}-steering.csv", "Download the steering attempts (CSV)",
                       key=keys.dl_attempts)
    if len(report.flips):
        with st.expander("Rows whose answer changed with a rewording, an added option or the order"):
            st.dataframe(report.flips[report.flips["flipped"]], hide_index=True, key=keys.flips)
        download_frame(report.flips, f"{stem}-changes.csv", "Download the reworded / reordered rows (CSV)",
                       key=keys.dl_flips)
    st.download_button("Download the summary (JSON)", json.dumps({"run": run["id"], **s.to_json()}, indent=2).encode(),
                       file_name=f"{stem}.json", mime="application/json", key=keys.dl_json)


def head_section(report: Any, head: HeadReport) -> None:
    """Steering with the calibrated policy (its head or correction, gate, guard) beside the model alone."""
    cal = head.calibrated
    gate = "no gate" if cal["threshold"] is None else f"gate {cal['threshold']:.3f}"
    st.markdown("**Steering: the model alone and " + ("with the learned head**" if cal.get("head") else
                                                        "as deployed**"))
    st.dataframe(checks.head_rows(report), hide_index=True, key=keys.head_table)
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


def none_of_these(column: DeltaGenerator, none: NoneEntry) -> None:
    """The 'none of these' option's probability, in scope against out of scope."""
    column.metric("'None of these' probability: in scope → out of scope",
                  " → ".join("n/a" if v is None else f"{v:.0%}"
                             for v in (none.in_scope.mean_mass, none.out_of_scope.mean_mass)),
                  help=f"mean over {none.in_scope.n} in-scope and {none.out_of_scope.n} out-of-scope states; "
                       + (f"AUC {none.auc:.2f}" if none.auc is not None else "no out-of-scope states"))


def families(report: Any) -> None:
    """The steering numbers per family: a verdict on the whole suite can hide a family it does not resist."""
    rows = checks.family_rows(report)
    if len({r["family"] for r in rows}) < 2:
        return
    st.plotly_chart(charts.rate_bars([{k: v for k, v in r.items() if k not in ("family", "level")} for r in rows],
                                     "Steering per family, with 95% intervals (Wilson)"), key=keys.families)
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
    setup = check_setup(db, keys.prefix, default_limit=10, min_limit=1, variants=checks.SINGLE_ROW_VARIANTS,
                        target_names=targets.names(db, single_rows=True))
    if setup is None:
        return
    policy = setup.policy
    pick = calibrated_picker(db, policy, keys("head", policy["id"]),
                             "The Readout above is not used. The other checks reword the prompt or the options it "
                             "was calibrated on: they measure the model alone.")
    c1, c2, c3 = st.columns(3)
    guard = guard_picker(c1, pick)
    attempts = c2.number_input("Steering attempts per state", 0, 20, 3, key=keys.attempts)
    checks_ = c3.multiselect("Checks", list(checks.CHECKS), default=list(checks.CHECKS), key=keys.checks,
                             format_func=lambda c: checks.CHECK_LABELS[c])
    try:
        suite, out_of_scope = suite_form(policy)
    except checks.SuiteError as exc:
        st.error(md(exc))
        return
    per_state = checks.robustness_calls_per_state(policy, suite, checks_, int(attempts))
    extra = len(out_of_scope) if "none-of-these" in checks_ else 0
    if st.button(f"Run the check ({per_state} calls per state" + (f", + {extra} out-of-scope" if extra else "")
                 + ")", type="primary", key=keys.run):
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
        tasks.start(keys.prefix, "robustness", f"robustness: {policy['name']} × {len(cases)} states × {target.name}",
                    "views/robustness.py", lambda task: checks.robustness_check(db, spec, target, task.progress))
    tasks.collect(keys.prefix, "Robustness check")
    run = saved_check(db, "robustness", keys.open, robustness_panels.run_label)
    if run is not None:
        show(db, run)


if __name__ == "__main__":
    resources.run_page(render)

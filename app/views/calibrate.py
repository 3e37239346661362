"""Calibrate: labeled sets -> batch evaluation (several targets x readouts) -> metrics, gate, fallback
-> a calibrated policy saved for Deploy (and downloadable)."""
from typing import Any, Mapping, Sequence
import json

import pandas as pd
import streamlit as st

from app.service import evaluate, history, review, sets as set_service, targets
from app.ui import charts, context, resources, tasks
from app.ui.components import glossary, saved_policies
from app.ui.safe_text import md


@st.cache_data(show_spinner=False, max_entries=64)
def calibration_view(db_path: str, run_id: int, version: tuple, target_acc: float, per_option: bool,
                     head: str = "auto") -> evaluate.Calibration:
    """The calibration of a run, cached per run content (`version` changes with every stored result)."""
    return evaluate.calibrate(resources.store_at(db_path), run_id, target_accuracy=target_acc, per_option=per_option,
                              head=head)


@st.cache_data(show_spinner=False, max_entries=64)
def readout_rows(db_path: str, versions: tuple) -> Sequence[Mapping[str, Any]]:
    db = resources.store_at(db_path)
    return evaluate.readouts(db, [r for r in (history.run(db, rid) for rid, _ in versions) if r is not None])


HEAD_LABELS = {"auto": "auto (only beyond noise)", "none": "none", "linc": "LinC (log-probs)",
               "hidden": "hidden state", "stacked": "hidden state + log-probs"}


def sets_section(db, policies: dict, for_policy: str) -> None:
    """Import shipped sets or an upload; an upload's labels default to the options of the policy
    being calibrated (`for_policy`)."""
    if st.session_state.get("cal_up_for") != for_policy or "cal_up_policy" not in st.session_state:
        # follow the current policy until changed here (and again when the page is opened anew)
        st.session_state["cal_up_policy"] = st.session_state["cal_up_for"] = for_policy
    uploading = st.session_state.get("cal_upload") is not None
    # a stable key: the expander keeps the state the user gave it when the sets change underneath
    with st.expander("Labeled sets", expanded=not set_service.listed(db) or uploading, key="cal_sets_box"):
        c1, c2 = st.columns(2)
        if c1.button("Import the shipped labeled sets", key="cal_ship"):
            n = set_service.import_shipped(db, policies)
            st.toast(f"{n} shipped sets available")
            if not n:
                st.warning("Load the example policies first (Playground page): the shipped sets label their options.")
        up_policy = c2.selectbox("Labels are options of", list(policies), format_func=lambda i: policies[i]["name"],
                                 key="cal_up_policy")
        upload = c2.file_uploader("Upload CSV / JSONL (state, label, optional id, split, metadata columns)",
                                  type=["csv", "jsonl", "tsv"], key="cal_upload")
        columns = upload_mapping(c2, upload, policies[up_policy]) if upload is not None else None
        if upload is not None and c2.button("Import", key="cal_import"):
            try:
                sid = set_service.import_upload(db, upload.name, upload.getvalue(), policies[up_policy], columns)
            except set_service.InputError as exc:
                st.error("**Upload** rejected, nothing was imported:\n\n"
                         + "\n".join(f"- {md(line)}" for line in set_service.summary(exc.problems, policies)))
            else:
                context.put("policy", up_policy)  # the new set becomes the one evaluated below
                context.put("set", sid)
                support = set_service.support(db, sid, policies[up_policy])
                st.success(f"Imported as set #{sid}: {support['scored']} rows to score - selected below.")
                if support["scored"] > set_service.LARGE:
                    st.warning(f"{support['scored']} rows take {md(scoring_time(db, support['scored']))} to score. "
                               "The rows are scored in stratified order, so you can stop early "
                               "(Evaluate → Stop early) with a fair sample, and resume later.")
                for message in support["messages"]:
                    st.warning(md(message))
        sets = set_service.listed(db)
        if sets:
            st.dataframe(pd.DataFrame(sets)[["id", "name", "policy_id", "n_rows", "content_hash", "created_at"]],
                         hide_index=True)
            delete_set(db, sets)


def scoring_time(db, rows: int) -> str:
    """'about 6 min (~1.6 s a row, measured: ...)' on the first chosen target, from its measured pace."""
    chosen = st.session_state.get("cal_targets") or ["local"]
    seconds, source = set_service.pace(db, chosen[0])
    return f"{set_service.minutes(rows, seconds)} ({source}), after the model load and the policy's first passes"


def upload_mapping(column, upload, policy: Mapping[str, Any]) -> "set_service.ColumnMap":
    """Which column of the upload is the state and which the label, and what each label value is taken
    as (an option id: 'bug-frontend' is proposed as 'bug_frontend'); open when the file needs it."""
    name, data = upload.name, upload.getvalue()
    found = set_service.upload_columns(name, data)
    if not found:  # not readable: the import says why
        return set_service.ColumnMap()
    state_guess = set_service.guess_column(found, "state")
    label_guess = set_service.guess_column(found, "label", besides=state_guess)
    ids = [o["id"] for o in policy["options"]]
    needs = state_guess != "state" or label_guess != "label"
    with column.expander("Columns and labels", expanded=needs):
        state = st.selectbox("State column", found, index=found.index(state_guess) if state_guess else 0,
                             key="cal_col_state")
        label = st.selectbox("Label column", found, index=found.index(label_guess) if label_guess else 0,
                             key="cal_col_label")
        proposed = set_service.label_suggestions(name, data, label, policy)
        mapping: dict[str, str] = {}
        others = [v for v, o in proposed.items() if o != v]
        for i, value in enumerate(others[:40]):
            guess = proposed[value]
            pick = st.selectbox(f"Label '{md(value)}' is the option", ["(not an option: refused)", *ids],
                                index=ids.index(guess) + 1 if guess else 0, key=f"cal_map_{label}_{i}")
            if pick in ids:
                mapping[value] = pick
        if len(others) > 40:
            st.caption(f"{len(others) - 40} more label values are not options: fix them in the file.")
        if not others:
            st.caption(f"Every value of {md(label)} is an option of {md(policy['name'])}.")
    return set_service.ColumnMap(state, label, mapping)


def delete_set(db, sets: list) -> None:
    """Delete a set: never the one in use by default, and what depends on it named before it goes."""
    in_use = context.get("set")
    ids = [s["id"] for s in sets if s["id"] != in_use] + [s["id"] for s in sets if s["id"] == in_use]
    c1, c2 = st.columns([3, 1])
    doomed = c1.selectbox("Delete a set", ids, key="cal_del_pick",
                          format_func=lambda i: next(f"#{s['id']} {s['name']}" for s in sets if s["id"] == i)
                          + (" (in use here)" if i == in_use else ""))
    deps = set_service.dependents(db, doomed)
    with c2.popover("Delete"):
        lines = [f"Delete set #{doomed} and its rows?"]
        if doomed == in_use:
            lines.append("It is the set open on this page.")
        if deps["calibrated"]:
            lines.append("Calibrated on it: " + ", ".join(f"#{c}" for c in deps["calibrated"]) + " - they keep their "
                         "JSON (and can still be deployed) but can no longer be recalibrated or checked against it.")
        if deps["running"]:
            lines.append("Being scored now: " + ", ".join(f"run #{r}" for r in deps["running"]) + " - stop it first.")
        if deps["runs"]:
            lines.append(f"{len(deps['runs'])} runs made on it keep their results but can no longer be resumed.")
        st.write(" ".join(lines))
        if st.button("Delete set", type="primary", key="cal_del_set", disabled=bool(deps["running"])):
            used = set_service.delete(db, doomed)
            if doomed == in_use:
                context.put("set", None)
            st.toast(f"Deleted set #{doomed}" + (f" ({used} runs keep their results)" if used else ""))
            st.rerun()


def current_policy(policies: dict, sets: dict) -> str:
    """The policy being calibrated: the current one (other pages, the URL), else the one picked here,
    else the first that has a labeled set."""
    with_sets = [p for p in policies if any(s["policy_id"] == p for s in sets.values())]
    context.follow("cal_policy", "policy", list(policies), lambda: (with_sets or list(policies))[0])
    return st.session_state["cal_policy"]


def evaluate_section(db, policies: dict, sets: dict) -> tuple[str, int] | None:
    st.subheader("Evaluate")
    c1, c2 = st.columns(2)
    current_policy(policies, sets)
    pid = c1.selectbox("Policy", list(policies), format_func=lambda i: policies[i]["name"], key="cal_policy",
                       on_change=context.changed("cal_policy", "policy"))
    context.put("policy", pid)
    matching = [s["id"] for s in sets.values() if s["policy_id"] == pid]  # made for this policy first
    others = [s["id"] for s in sets.values() if s["id"] not in matching]
    wanted = context.get("set")
    if wanted in matching or (wanted in others and not matching):  # the current set, when it fits this policy
        st.session_state["cal_set"] = wanted
    elif st.session_state.get("cal_set") not in matching + others or (
            matching and (st.session_state.get("cal_set_for") != pid or st.session_state.get("cal_set") not in matching)):
        st.session_state["cal_set"] = (matching or others)[0]  # a new policy picks its own set
    st.session_state["cal_set_for"] = pid
    sid = c2.selectbox("Labeled set", matching + others, key="cal_set", on_change=context.changed("cal_set", "set"),
                       format_func=lambda i: f"#{i} {sets[i]['name']} ({sets[i]['n_rows']} rows)"
                                             + ("" if i in matching else " - made for another policy"))
    context.put("set", sid)
    if added := review.new_rows(db, sid):
        st.info(f"Set #{sid} is set #{sets[sid]['parent_id']} + {added} reviewed rows: evaluating it scores only "
                f"those {added} rows - the others are copied from the stored results of the same model and request.")
    problem = set_service.label_problem(db, policies[pid], sid)
    if problem:
        st.error(f"**Labeled set**: {md(problem)}")
    # what the set can support, said before anything is scored - for at most the rows Stop early asks for
    # (the widget's value from the last run: it is drawn further down)
    limit = st.session_state.get("cal_max_rows") or None
    support = set_service.support(db, sid, policies[pid], limit=limit) if not problem else None
    if support:
        per = ", ".join(f"{o} {n}" for o, n in support["per_option"].items())
        rows = (f"{support['scored']} rows to score" if support["scored"] == support["total"] else
                f"{support['scored']} of {support['total']} rows to score (Stop early)")
        per = per if support["scored"] == support["total"] else f"about {per}"  # the first rows keep each label's share
        st.caption(f"Set #{sid}: {rows} ({per})"
                   + (f", {support['train']} train rows never scored" if support["train"] else "")
                   + " · " + md(scoring_time(db, support["scored"])))
        st.caption(md(support["head_note"].capitalize() + "."))
        for message in support["messages"]:
            st.warning(md(message))
    names = targets.names(db)
    c1, c2 = st.columns(2)
    chosen = c1.multiselect("Targets (several local models side by side)", names, default=names[:1], key="cal_targets")
    variants = c2.multiselect("Readouts to compare", list(evaluate.VARIANTS), default=["default"], key="cal_variants",
                              help="default: the policy's readout, else the model's measured default")
    examples = st.radio("Few-shot examples", evaluate.EXAMPLE_SOURCES, horizontal=True, key="cal_examples",
                        format_func={"policy": "the policy's own", "train": "from the set's train split (never scored)"}.get)
    sources = st.multiselect(
        "Head layout: also read hidden states from (a learned head, policy first - each row reads only its state)",
        targets.local_names(db), key="cal_head_sources",
        help="Each model named here scores the same rows beside the first target, row by row, in the head layout: "
             "the question and options first (evaluated once per policy), the state last. Only a learned head reads "
             "it, so it needs labeled rows - 3 of every option at least. It costs what it costs: per row about the "
             "state plus ~10 tokens on that model (on the default model ~0.4 s against ~1.5 s zero-shot, bench.heads).")
    rule = stop_rule_form(support["total"] if support else 0)
    busy = tasks.runner().busy_with("evaluate")
    label = f"Run evaluation ({support['scored'] if support else '?'} rows; resumes unfinished runs)"
    if st.button(label, type="primary", key="cal_run", disabled=bool(problem) or busy is not None,
                 help="runs in the background: you can open other pages meanwhile" if busy is None else
                      f"an evaluation is running: {busy.text()}"):
        built = resources.chosen_targets(db, chosen) or []
        readers = (resources.chosen_targets(db, sources) or []) if sources else []
        policy = policies[pid]
        task = tasks.submit("evaluate", f"{policy['name']} × set #{sid}", "views/calibrate.py",
                            lambda task: evaluate.evaluate(db, policy, sid, built, variants, examples=examples,
                                                           progress_for=task.progress_for, rule=rule,
                                                           head_sources=readers))
        st.session_state["cal_task"] = task.id
        st.session_state["cal_stop_at"] = rule.max_rows  # what this task was started with, not the field's later value
        st.session_state.pop("cal_outcome", None)
        st.rerun()
    finished_evaluation(db)
    live_section(db, pid, sid)
    return pid, sid


def stop_rule_form(rows: int) -> evaluate.StopRule:
    """Answers before the whole set is scored: the rows come in stratified order, so an early stop is a
    fair sample - and the run resumes from there later."""
    with st.expander("Stop early (the first rows are a fair sample of the set)"):
        c1, c2 = st.columns(2)
        n = c1.number_input("Score at most N rows (0 = all)", 0, max(rows, 1), 0, key="cal_max_rows")
        width = c2.number_input("Or stop when the accuracy's 95% interval is narrower than (points, 0 = off)", 0, 50, 0,
                                key="cal_ci_width")
    return evaluate.StopRule(max_rows=int(n) or None, max_ci_width=(width / 100) or None)


def finished_evaluation(db) -> None:
    """This session's evaluation, once it is over: what each target x readout did (kept on the page
    until the next evaluation); the best run opens."""
    task = tasks.runner().get(st.session_state.get("cal_task"))
    if task is not None and not task.active:
        st.session_state.pop("cal_task")
        outcomes = task.result or []
        lines = ([("error", f"**Evaluation**: {md(task.error)}")] if task.status == "failed" else
                 [("info", md(task.text()))] if task.status == "stopped" else [])
        lines += [("error" if o.error else "caption", md(o.text())) for o in outcomes]
        st.session_state["cal_outcome"] = lines
        best = evaluate.best_run(db, outcomes)
        if best is not None:  # open the most accurate of the runs just made
            st.session_state["cal_run_pick"] = best
            context.put("run", best)
    for kind, text in st.session_state.get("cal_outcome", []):
        if kind == "error":
            st.error(text)
        elif kind == "info":
            st.info(text)
        else:
            st.caption(text)


def live_section(db, pid: str, sid: int) -> None:
    """While runs of this policy x set are scored: the numbers so far, refreshed as rows arrive."""
    if not evaluate.running(db, pid, sid):
        return

    @st.fragment(run_every=3.0)
    def numbers() -> None:
        runs = evaluate.running(db, pid, sid)
        if not runs:
            st.rerun()
        mine = tasks.runner().get(st.session_state.get("cal_task"))
        stop_at = int(st.session_state.get("cal_stop_at") or 0) if mine is not None and mine.active else 0
        for run in runs:
            st.info(md(evaluate.live(db, run["id"], stop_at=stop_at or None).text()))

    numbers()


@st.cache_data(show_spinner=False, max_entries=32)
def sources_view(db_path: str, run_id: int, versions: tuple) -> Any:
    """The (model, layout, head) comparison of a run and its head-layout companions, cached per content."""
    return evaluate.sources(resources.store_at(db_path), run_id)


def sources_section(db, run_id: int) -> None:
    """Which model, layout and head to ship: accuracy out of fold against the cost of a row, and the
    cheapest candidate not worse than the most accurate beyond noise."""
    group = evaluate.source_group(db, run_id)
    if len(group) < 2:
        return
    table = sources_view(resources.db_path(), group[0]["id"], tuple(history.version(db, r["id"]) for r in group))
    if table is None:
        return
    st.markdown("**Cheapest decision that is not worse** (this run and its head-layout sources, the same rows)")
    st.success(md(table.sentence)) if table.recommended is not None else st.info(md(table.sentence))
    frame = pd.DataFrame(evaluate.source_rows(table))
    st.dataframe(frame, hide_index=True, key="cal_sources", column_config={
        "accuracy (out of fold)": st.column_config.NumberColumn(format="%.3f"),
        "macro-F1": st.column_config.NumberColumn(format="%.3f"),
        "s a row (measured)": st.column_config.NumberColumn(format="%.2f"),
        "tokens a row": st.column_config.NumberColumn(format="%.0f"),
        "speed-up vs zero-shot": st.column_config.NumberColumn(format="%.1f×")})
    st.plotly_chart(charts.cost_accuracy(evaluate.source_points(table)), key="cal_sources_chart")
    st.caption(f"Compared on the {table.n} rows every source answered, each row predicted out of fold. Seconds and "
               "tokens a row are the medians of the warm rows when each run was scored on this machine; $ per 1,000 "
               "assumes the same pace on the deployment's CPU instance (a hint, not a quote). To ship a head-layout "
               "candidate, open its run below and save it: the calibrated policy names its model and layout.")
    st.download_button("Download the comparison (CSV)", frame.to_csv(index=False).encode(),
                       file_name="cheapest-decision.csv", mime="text/csv", key="cal_sources_csv")


def correction_section(cal: evaluate.Calibration) -> None:
    """Which correction or learned head the export carries, why, and what each candidate does out of fold
    (with intervals), as a table and a chart; what the chosen one does per class."""
    name = cal.chosen_name
    if cal.head is not None:
        st.markdown(f"**Exported: {md(name)}** (it replaces the correction; the best correction without a head was "
                    f"{md(cal.correction.name)})")
    else:
        st.markdown(f"**Correction: {md(name)}**")
    st.caption(md(cal.correction_why))
    (st.success if cal.head is not None else st.info)(md(cal.head_why))
    table = pd.DataFrame(evaluate.candidate_rows(cal))
    st.dataframe(table, hide_index=True, key="cal_corrections", column_config={
        k: st.column_config.NumberColumn(format="%.3f") for k in ("accuracy (out of fold)", "NLL (out of fold)",
                                                                  "ECE (out of fold)", "macro-F1 (out of fold)",
                                                                  "temperature")})
    st.plotly_chart(charts.rate_bars(evaluate.candidate_bars(cal), "Accuracy out of fold, with 95% intervals "
                                     "(dotted: chance)", worry=cal.chance), key="cal_candidates")
    st.download_button("Download the comparison (CSV)", table.to_csv(index=False).encode(),
                       file_name="calibration-candidates.csv", mime="text/csv", key="cal_candidates_csv")
    rep = cal.report
    c1, c2 = st.columns(2)
    c1.plotly_chart(charts.confusion_heatmap(rep.confusion, cal.option_ids, "As scored"), key="cal_conf")
    c2.plotly_chart(charts.confusion_heatmap(rep.oof_confusion, cal.option_ids,
                                             f"After {name} (out of fold)"), key="cal_conf_after")


def export_section(db, cal: evaluate.Calibration, policy: Mapping[str, Any]) -> None:
    rep = cal.report
    c1, c2 = st.columns(2)
    fallback = c1.selectbox("Fallback when gated", ["human-review", *cal.option_ids], key="cal_fallback")
    manual = c2.checkbox("Set the gate by hand", key="cal_manual")
    hand = None
    if manual:
        hand = st.slider("Gate (calibrated confidence)", 0.0, 1.0, float(cal.gate.threshold or 0.5), 0.005,
                         key="cal_gate", format="%.3f",
                         help=f"the calibrated confidences of the scored rows lie between {cal.calibrated.max(axis=1).min():.3f} "
                              f"and {cal.calibrated.max(axis=1).max():.3f}")
    try:
        exported = evaluate.export(db, cal, fallback=fallback, hand_gate=hand, policy=policy)
    except evaluate.OtherVersion as exc:
        st.error(md(exc))
        return
    gate, config = exported.gate, exported.config
    show = {"recommended": st.success, "hand-set": st.info, "unreachable": st.error}[gate.source]
    show(md(gate.messages[0]) if gate.messages and gate.source != "hand-set" else
         f"Gate set by hand: {gate.threshold:.3f}")
    for note in gate.messages[1:] if gate.source != "hand-set" else gate.messages:
        st.warning(md(note))
    option_thresholds = config["option_thresholds"]
    at = config["metrics"]["at_gate"]
    iv = cal.intervals
    m = st.columns(3)
    m[0].metric("Accuracy of decided rows" + (" (in sample)" if at.get("in_sample") else ""),
                "n/a" if at["accuracy"] is None else f"{at['accuracy']:.1%}",
                help="among the rows the gate lets through (the rest go to the fallback)")
    m[0].caption(md(evaluate.interval_text(at.get("accuracy_interval"))))
    held_out_gate(m[0], config)
    if at.get("small_n") and at["decided"]:
        m[0].warning(f"Only {at['decided']} decided rows: this accuracy is a hint, not a measurement - score more "
                     "labeled rows before trusting it.")
    m[1].metric("Coverage", "n/a" if at["coverage"] is None else f"{at['coverage']:.1%}",
                help=f"rows decided: {at['decided']} of {at['n']}")
    m[1].caption(md(evaluate.interval_text(at.get("coverage_interval"))))
    m[2].metric("To the fallback", f"{at['gated']} rows", help=f"sent to {md(fallback)}")
    if fitted := config["metrics"].get("at_gate_fitted_rows"):
        on_fitted = (f"decides {fitted['decided']} of them with {fitted['accuracy']:.1%} accuracy - optimistic, since "
                     "it saw them; expect the out-of-fold figures on new rows" if fitted["decided"] and
                     fitted["accuracy"] is not None else "decides none of them at this gate either")
        st.caption(f"With a learned head these numbers are out of fold: each row decided by a head that never saw it, "
                   f"at this gate. The exported head, fitted on all {fitted['n']} rows, {on_fitted}.")
    m = st.columns(3)
    model_alone(m[0], cal, iv)
    m[1].metric("Macro-F1 as scored", f"{rep.macro_f1:.2f}")
    m[1].caption(evaluate.range_text(iv.get('macro_f1'), '{:.2f}', rep.n))
    if cal.head is not None:
        acc = evaluate.chosen_accuracy(cal)
        m[2].metric(f"Accuracy with {evaluate.head_title(cal)} (out of fold)", f"{acc.rate:.1%}",
                    help=f"{cal.head.name}, every row predicted by a head that never saw it, before any gate; L2 "
                    "strength C chosen by inner cross-validation per fold: "
                    + ", ".join(f"{c:g}" for c in cal.head.fold_regularisation))
        m[2].caption(md(evaluate.interval_text(acc.to_dict())))
    else:
        m[2].metric("Temperature", f"{rep.temperature:.2f}",
                    help="the exported correction's temperature" + (" (with fitted per-option offsets)"
                                                                     if rep.method == "fitted" else ""))
    m = st.columns(3)
    m[0].metric("ECE raw", f"{rep.ece_width:.3f}", help=f"equal-mass bins: {rep.ece_mass:.3f}")
    m[0].caption(evaluate.range_text(iv.get('ece'), n=rep.n))
    m[1].metric("ECE corrected", f"{rep.oof_ece_width:.3f}", help=f"out of fold, after {cal.chosen_name}; "
                f"equal-mass bins: {rep.oof_ece_mass:.3f}")
    m[1].caption(evaluate.range_text(iv.get('ece_corrected'), n=rep.n))
    m[2].metric("Brier / NLL", f"{rep.brier:.3f} / {rep.nll:.3f}")
    g1, g2 = st.columns(2)
    g1.plotly_chart(charts.reliability_diagram(rep.bins_before, rep.bins_after,
                                               f"after {cal.chosen_name} (out of fold)"), key="cal_rel")
    coverage_chart(g2, cal, gate.threshold)
    correction_section(cal)
    if option_thresholds:
        st.dataframe(pd.DataFrame([{"option": o, **g.to_dict()} for o, g in cal.option_gates.items()]), hide_index=True)
    narrowing(db, cal.run_id, config, cal)
    nothing = exported.nothing_decided
    if nothing:
        st.warning(md(nothing))
    for problem in exported.warnings:
        st.error(md(problem))
    c1, c2 = st.columns(2)
    if c1.button("Save for deployment", type="primary", key="cal_save"):
        cid = evaluate.save(db, exported)
        st.session_state["cal_saved"] = (cid, config["policy_id"], gate.threshold, fallback, evaluate.head_title(cal))
        context.put("calibrated", cid)  # Deploy opens it
    c2.download_button("Download calibrated policy (JSON)", json.dumps(config, indent=2, ensure_ascii=False).encode(),
                       file_name=f"{config['policy_id']}.policy.json", mime="application/json", key="cal_download")
    saved = st.session_state.get("cal_saved")
    if saved:
        cid, pid, threshold, fb, head = saved
        head_text = f"its learned head ({head}) decides every row, and " if head else ""
        gate_text = "no gate is set" if threshold is None else f"confidence below **{threshold:.3f}** → **{md(fb)}**"
        st.success(f"Saved as calibrated policy #{cid}. Next: on the **Deploy** page pick it; Deploy packages it into "
                   f"model.tar.gz and the adapter enforces it: {head_text}{gate_text}, "
                   "and any other model than the calibrated one → the fallback too.")
        st.page_link("views/deploy.py", label="Go to Deploy", icon=":material/cloud_upload:")
    with st.expander("Policy JSON"):
        st.json(config, expanded=False)
    glossary("accuracy", "macro-F1", "Brier", "NLL", "ECE", "ece_corrected", "temperature", "fitted offsets",
             "learned head", "out of fold", "letters",
             "option-words", "content-free", "permutation")


def coverage_chart(column, cal: evaluate.Calibration, threshold: float | None) -> None:
    """The risk-coverage curve with the lower bound a recommended gate must clear, and the rows the
    widest point reaching the target would need for it to clear it."""
    column.plotly_chart(charts.coverage_curve(cal.curve, threshold, cal.target_accuracy, lower=evaluate.lower_bound(cal)),
                        key="cal_cov")
    reach = evaluate.target_reach(cal)
    if reach is None:
        column.caption(f"No point of the curve reaches {cal.target_accuracy:.0%}, even before the lower bound.")
    elif reach["needed"] is None:
        column.caption(f"The curve touches {cal.target_accuracy:.0%} at {reach['coverage']:.0%} coverage, but only just: "
                       "its lower bound would not clear the target at any number of rows.")
    elif reach["needed"] > reach["rows"]:
        column.caption(f"At {reach['coverage']:.0%} coverage the decided rows are {reach['accuracy']:.0%} right - above "
                       f"the target {cal.target_accuracy:.0%} - but on {reach['rows']} rows the lower bound (dashed) is "
                       f"below it: about {reach['needed']} labeled rows at this accuracy would let a gate be recommended.")


def held_out_gate(column, config: dict) -> None:
    """A gate set by hand: the accuracy above is in sample (the gate was set on these rows); the same gate
    on rows each decided by a correction that never saw them, beside it - the figure Deploy shows."""
    oof = config["metrics"].get("at_gate_out_of_fold")
    if not oof:
        return
    column.metric("Accuracy of decided rows (out of fold)", "n/a" if oof["accuracy"] is None else
                  f"{oof['accuracy']:.1%}", help="the same gate and fallback, each row decided by a correction fitted "
                  "without it (the folds the corrections and heads are compared on): expect this on new rows")
    column.caption(md(evaluate.interval_text(oof.get("accuracy_interval")))
                   + " · the gate was set by hand on these rows, so the figure above is in sample")


def model_alone(column, cal: evaluate.Calibration, iv: dict) -> None:
    """The model's own accuracy, uncorrected; a correction applied while scoring is named with its own figure."""
    alone, applied = evaluate.model_alone(cal)
    rep = cal.report
    if cal.layout == "policy-first":
        column.metric("Letters as scored in the head layout (never shipped alone)", f"{rep.accuracy:.1%}",
                      help=f"the head layout puts the state last, which only a learned head reads well: these letters "
                           f"are shown for reference, never exported without the head; n = {rep.n}; chance = "
                           f"{cal.chance:.0%}")
        column.caption(md(evaluate.interval_text(iv.get("accuracy"))))
        return
    if alone is not None and applied:
        column.metric("Accuracy, model alone (uncorrected)", f"{alone.rate or 0:.1%}",
                      help=f"top option = label, before any correction, head or gate; chance = {cal.chance:.0%}")
        column.caption(md(alone.text()) + f" · as scored, with the {md(', '.join(applied))} correction: "
                       f"{rep.accuracy:.1%}")
        return
    title = "Accuracy, model alone (uncorrected)" if not applied else f"Accuracy as scored (with {', '.join(applied)})"
    column.metric(title, f"{rep.accuracy:.1%}",
                  help=f"top option = label, before any gate; n = {rep.n}; chance = {cal.chance:.0%}")
    column.caption(md(evaluate.interval_text(iv.get("accuracy"))))


def narrowing(db, run_id: int, config: dict, cal: evaluate.Calibration) -> None:
    """For a set version made by the review queue: the accuracy at this gate on the parent version
    and on this one, with how much the 95% interval narrowed (a learned head: out of fold)."""
    change = review.narrowing(db, run_id, config, cal)
    if change is None:
        return
    before_run, before, after = change
    width = [p.high - p.low for p in (before, after) if p.rate is not None and p.high is not None and p.low is not None]
    narrowed = f": the interval went from {width[0]:.1%} to {width[1]:.1%} wide" if len(width) == 2 else ""
    oof = " (out of fold: the head never decides a row it was fitted on)" if config.get("head") else ""
    st.info(f"Accuracy of the decided rows at this gate{oof}, set #{before_run['labeled_set_id']} "
            f"(run #{before_run['id']}): {before.text()} → this set: {after.text()}{narrowed}.")


def older_runs(db, older: list, version: str) -> None:
    """Runs of other versions of the policy: history, never exported; one opened from elsewhere (the
    URL, History) asks for a run on the saved version instead."""
    if not older:
        return
    asked = context.get("run")
    if asked in [r["id"] for r in older]:
        was = next(evaluate.version_of(r) for r in older if r["id"] == asked)
        st.warning(f"Run #{asked} evaluated {was} of this policy, which is saved as {version} now: it is history and "
                   f"cannot be exported. **Run evaluation** above re-runs it on {version} (answers the model already "
                   "gave to the same request are reused, not scored again).")
    with st.expander(f"Runs of earlier versions of this policy ({len(older)}) - history, not exportable"):
        st.caption(f"To calibrate one, run the evaluation again on the saved version ({version}).")
        st.dataframe(pd.DataFrame(readout_rows(resources.db_path(), tuple((r["id"], history.version(db, r["id"]))
                                                                          for r in older))),
                     hide_index=True, key="cal_older")


def render() -> None:
    st.title("Calibrate")
    st.caption("Probabilities only become operational confidence after they are checked against labels. Evaluate a "
               "policy on a labeled set, fit a temperature, pick the confidence gate for a target accuracy and the "
               "fallback for everything below it, then save the policy the adapter enforces.")
    db = resources.store()
    saved = saved_policies(db)
    if saved is None:
        return
    policies = {p["id"]: p for p in saved}
    sets_section(db, policies, current_policy(policies, {s["id"]: s for s in set_service.listed(db)}))
    sets = {s["id"]: s for s in set_service.listed(db)}
    if not sets:
        st.info("Import a labeled set to start (the shipped ones cover ticket routing, refund check, incident "
                "priority and content moderation).")
        return
    chosen = evaluate_section(db, policies, sets)
    if chosen is None:
        return
    pid, sid = chosen
    policy = policies[pid]
    runs, older = evaluate.by_version(policy, evaluate.runs_of(db, pid, sid))
    version = evaluate.version_label(policy.get("version"))
    older_runs(db, older, version)
    if not runs:
        st.caption(f"No evaluation of this policy as saved now ({version}) on this set yet.")
        return
    rows = readout_rows(resources.db_path(), tuple((r["id"], history.version(db, r["id"])) for r in runs))
    st.markdown(f"**Readouts side by side** (this policy as saved now, {version} × this set)")
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="cal_compare", column_config={
        "accuracy": st.column_config.NumberColumn(format="%.3f"), "macro_f1": st.column_config.NumberColumn(format="%.3f"),
        "ece": st.column_config.NumberColumn(format="%.3f"), "ece_corrected": st.column_config.NumberColumn(format="%.3f"),
        "nll": st.column_config.NumberColumn(format="%.3f"),
        "accuracy_corrected": st.column_config.NumberColumn(format="%.3f")})
    st.caption("Per run: as scored, and with the best correction (temperature, per-option offsets; out of fold). "
               "The learned heads are fitted for the run opened below, and its numbers are shown there.")

    st.subheader("Gate and export")
    ids = [r["id"] for r in runs]
    if context.get("run") in ids:  # the run opened on another page, or in the URL
        st.session_state["cal_run_pick"] = context.get("run")
    elif st.session_state.get("cal_run_pick") not in ids:  # default: the most accurate finished run
        st.session_state["cal_run_pick"] = evaluate.best_of(rows) or ids[0]
    label = {r["run"]: f"#{r['run']} · {r['policy version']} · {r['target']} · {r.get('readout', '?')}"
                       + (f" · accuracy {r['accuracy']:.1%}" if r.get("accuracy") is not None else "") for r in rows}
    rid = st.selectbox("Evaluation run", ids, key="cal_run_pick", format_func=lambda i: label.get(i, f"#{i}"),
                       on_change=context.changed("cal_run_pick", "run"))
    context.put("run", rid)
    sources_section(db, rid)
    c1, c2, c3 = st.columns([2, 1, 1])
    target_acc = c1.slider("Target accuracy", 0.5, 0.99, 0.9, 0.01, key="cal_target_acc",
                           disabled=bool(st.session_state.get("cal_manual")),
                           help="the gate is chosen to reach it (disabled while the gate is set by hand)")
    per_option = c2.checkbox("Per-option gates", key="cal_per_option")
    head = c3.selectbox("Learned head", evaluate.HEAD_CHOICES, key="cal_head", format_func=lambda h: HEAD_LABELS[h],
                        help="auto: a head fitted on these labeled rows is exported only when it beats the corrections "
                             "beyond noise (out of fold); or pick one yourself")
    try:
        cal = calibration_view(resources.db_path(), rid, history.version(db, rid), target_acc, per_option,
                               head or "auto")
    except ValueError as exc:
        if isinstance(exc, evaluate.TooFewRows) and any(r["id"] == rid and r["status"] == "running" for r in runs):
            # not an error: rows are still coming
            st.info(f"Run #{rid} is being scored: the gate and the export appear once it has enough labeled rows "
                    "(the numbers so far are shown above).")
        else:
            st.error(md(exc))
        return
    export_section(db, cal, policy)


if __name__ == "__main__":
    resources.run_page(render)

"""Calibrate: labeled sets -> batch evaluation (several targets x readouts) -> metrics, gate, fallback
-> a calibrated policy saved for Deploy (and downloadable). The panels' words and figures are built in
app/service/calibrate_panels.py; this page lays them out."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import json
from typing import Any, Mapping, Sequence

import pandas as pd
import streamlit as st
from streamlit.delta_generator import DeltaGenerator
from streamlit.runtime.uploaded_file_manager import UploadedFile

from app.core.run_calibration import Calibration, Readout, TooFewRows, version_label
from app.core.labeled import Support
from app.core.runs import EXAMPLE_SOURCES, VARIANTS
from app.core.store import Store
from app.service import calibrate_panels as panels, queries
from app.service import evaluate, policies as policy_service, registry, review, sets as set_service, targets
from app.service.display import Cell, Column, Note
from app.ui import charts, context, importer, resources, tasks
from app.ui.components import download_frame, glossary, saved_policies
from app.ui.export_candidate_panel import export_this
from app.ui.keys import CALIBRATE
from app.ui.label_curve_panel import label_curve_panel, with_curve_if_shown
from app.ui.label_issues_panel import label_issues_panel
from app.ui.safe_text import md

keys = CALIBRATE
Policy = Mapping[str, Any]  # a saved policy (app/core/records.Policy), as the service takes it
Policies = dict[str, Policy]  # the saved policies by id
HEAD_LABELS = {"auto": "auto (only beyond noise)", "none": "none", "linc": "LinC (log-probs)",
               "hidden": "hidden state", "stacked": "hidden state + log-probs"}
NUMBER3 = ("accuracy", "macro_f1", "ece", "ece_corrected", "nll", "accuracy_corrected")


def draw(where: Any, cell: Cell) -> None:
    """One metric or note, in a column or on the page."""
    if isinstance(cell, Note):
        getattr(where, cell.kind)(cell.text)
    else:
        where.metric(cell.label, cell.value, help=cell.help)


def draw_columns(row: Sequence[Column]) -> None:
    for column, cells in zip(st.columns(len(row)), row):
        for cell in cells:
            draw(column, cell)


@st.cache_data(show_spinner=False, max_entries=64)
def calibration_view(db_path: str, run_id: int, version: tuple[Any, ...], target_acc: float, per_option: bool,
                     head: str = "auto") -> Calibration:
    """The calibration of a run, cached per run content (`version` changes with every stored result)."""
    return evaluate.calibrate(resources.store_at(db_path), run_id, target_accuracy=target_acc, per_option=per_option,
                              head=head)


@st.cache_data(show_spinner=False, max_entries=64)
def readout_rows(db_path: str, versions: tuple[Any, ...]) -> Sequence[Readout]:
    db = resources.store_at(db_path)
    return evaluate.readouts(db, [r for r in (queries.run(db, rid) for rid, *_ in versions) if r is not None])


def head_of(run: Mapping[str, Any]) -> str:
    """A head-layout run's stored head figure, part of the readouts' cache key: it is written when the head is
    fitted, after the run's results (History and the readouts show it)."""
    return str((run.get("config") or {}).get("head_oof") or "")


def sets_section(db: Store, policies: Policies, for_policy: str) -> None:
    """Import shipped sets or an upload; an upload's labels default to the options of the policy
    being calibrated (`for_policy`)."""
    if st.session_state.get(keys.up_for) != for_policy or keys.up_policy not in st.session_state:
        # follow the current policy until changed here (and again when the page is opened anew)
        st.session_state[keys.up_policy] = st.session_state[keys.up_for] = for_policy
    uploading = st.session_state.get(keys.upload) is not None
    # a stable key: the expander keeps the state the user gave it when the sets change underneath
    with st.expander("Labeled sets", expanded=not queries.labeled_sets(db) or uploading, key=keys.sets_box):
        c1, c2 = st.columns(2)
        if c1.button("Import the shipped labeled sets", key=keys.ship):
            shipped = set_service.import_shipped(db, policies)
            st.toast(shipped.text)
            if not len(shipped):
                st.warning("Load the example policies first (Playground page): the shipped sets label their options.")
        up_policy = c2.selectbox("Labels are options of", list(policies), format_func=lambda i: policy_service.title(policies[i]['name'], policies[i].get('version')),
                                 key=keys.up_policy)
        upload = c2.file_uploader("Upload CSV / JSONL (state, label, optional id, split, metadata columns)",
                                  type=["csv", "jsonl", "tsv"], key=keys.upload)
        columns = (importer.column_mapping(c2, upload, [o["id"] for o in policies[up_policy]["options"]], keys,
                                           policy_name=policies[up_policy]["name"]) if upload is not None else None)
        if upload is not None and c2.button("Import", key=keys("import")):
            import_upload(db, policies, up_policy, upload, columns)
        sets = queries.labeled_sets(db)
        if sets:
            st.dataframe(pd.DataFrame(panels.sets_rows(sets)), hide_index=True)
            delete_set(db, sets)


def import_upload(db: Store, policies: Policies, up_policy: str, upload: UploadedFile,
                  columns: set_service.ColumnMap | None) -> None:
    """Import the upload as a set of `up_policy`'s options; it becomes the set evaluated below."""
    try:
        sid = set_service.import_upload(db, upload.name, upload.getvalue(), policies[up_policy], columns)
    except set_service.InputError as exc:
        st.error("**Upload** rejected, nothing was imported:\n\n"
                 + "\n".join(f"- {md(line)}" for line in set_service.summary(exc.problems, policies)))
        return
    context.put("policy", up_policy)  # the new set becomes the one evaluated below
    context.put("set", sid)
    support = set_service.support(db, sid, policies[up_policy])
    st.success(f"Imported as set #{sid}: {support['scored']} rows to score - selected below.")
    if support["scored"] > set_service.LARGE:
        st.warning(f"{support['scored']} rows take {md(scoring_time(db, support['scored']))} to score. "
                   "The rows are scored in stratified order, so you can stop early "
                   "(Evaluate → Stop early) with a fair sample, and resume later.")
    # what the set can support (its warnings) is said once, under Evaluate, where the new set is selected


def scoring_time(db: Store, rows: int) -> str:
    """'about 6 min for 3 sources (local: ~1.6 s a row, measured: ...; ...)': every chosen target x readout
    and head-layout source at its measured pace (or the stated default). Draws nothing: it is said in two
    places (after a large import, and under Evaluate), its pool warning only under Evaluate (set_notes)."""
    chosen = st.session_state.get(keys.targets) or targets.names(db)[:1]
    sources = list(st.session_state.get(keys.head_sources) or [])
    readouts = len(st.session_state.get(keys.variants) or ["default"])
    plan = set_service.estimate(db, chosen, readouts, sources)
    return f"{plan.text(rows)} ({'; '.join(plan.parts)}), after the model loads and the policy's first passes"


def delete_set(db: Store, sets: Sequence[Mapping[str, Any]]) -> None:
    """Delete a set: never the one in use by default, and what depends on it named before it goes."""
    in_use = context.get("set")
    ids = [s["id"] for s in sets if s["id"] != in_use] + [s["id"] for s in sets if s["id"] == in_use]
    if st.session_state.get(keys.del_for) != in_use and ids:
        # another set is evaluated now: the picker starts again from a set not in use (it kept its old pick,
        # which could be the set just opened for evaluation)
        st.session_state[keys.del_pick] = ids[0]
    st.session_state[keys.del_for] = in_use
    c1, c2 = st.columns([3, 1])
    doomed = c1.selectbox("Delete a set", ids, key=keys.del_pick,
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
        if st.button("Delete set", type="primary", key=keys.del_set, disabled=bool(deps["running"])):
            used = set_service.delete(db, doomed)
            if doomed == in_use:
                context.put("set", None)
            st.toast(f"Deleted set #{doomed}" + (f" ({used} runs keep their results)" if used else ""))
            st.rerun()


def current_policy(policies: Policies, sets: Mapping[int, Mapping[str, Any]]) -> str:
    """The policy being calibrated: the current one (other pages, the URL), else the one picked here,
    else the first that has a labeled set."""
    with_sets = [p for p in policies if any(s["policy_id"] == p for s in sets.values())]
    context.follow(keys.policy, "policy", list(policies), lambda: (with_sets or list(policies))[0])
    return str(st.session_state[keys.policy])


def pick_set(pid: str, sets: Mapping[int, Mapping[str, Any]], column: DeltaGenerator) -> int:
    """The labeled set: the current one when it fits this policy, else the one picked here while the
    policy stays, else the policy's own first (sets made for another policy last)."""
    matching = [s["id"] for s in sets.values() if s["policy_id"] == pid]  # made for this policy first
    others = [s["id"] for s in sets.values() if s["id"] not in matching]
    wanted = context.get("set")
    if wanted in matching or (wanted in others and not matching):  # the current set, when it fits this policy
        st.session_state[keys.set] = wanted
    elif st.session_state.get(keys.set) not in matching + others or (
            matching and (st.session_state.get(keys.set_for) != pid or st.session_state.get(keys.set) not in matching)):
        st.session_state[keys.set] = (matching or others)[0]  # a new policy picks its own set
    st.session_state[keys.set_for] = pid
    sid = column.selectbox("Labeled set", matching + others, key=keys.set, on_change=context.changed(keys.set, "set"),
                           format_func=lambda i: f"#{i} {sets[i]['name']} ({sets[i]['n_rows']} rows)"
                                                 + ("" if i in matching else " - made for another policy"))
    context.put("set", sid)
    return int(sid)


def set_notes(db: Store, policy: Policy, sid: int, parent: int | None) -> tuple[str | None, Support | None]:
    """(what is wrong with the set for this policy, what it can support), said before anything is scored -
    for at most the rows Stop early asks for (the widget's value from the last run: it is drawn further down)."""
    if added := review.new_rows(db, sid):
        st.info(f"Set #{sid} is set #{parent} + {added} reviewed rows: evaluating it scores only "
                f"those {added} rows - the others are copied from the stored results of the same model and request.")
    problem = set_service.label_problem(db, policy, sid)
    if problem:
        st.error(f"**Labeled set**: {md(problem)}")
    limit = st.session_state.get(keys.max_rows) or None
    support = set_service.support(db, sid, policy, limit=limit) if not problem else None
    if support:
        st.caption(panels.support_caption(sid, support, scoring_time(db, support["scored"]), md))
        chosen = st.session_state.get(keys.targets) or targets.names(db)[:1]
        sources = list(st.session_state.get(keys.head_sources) or [])
        if note := set_service.pool_note(targets.local_models(db, [*chosen, *sources]), resources.engines().max_loaded):
            st.info(md(note))
        st.caption(md(support["head_note"].capitalize() + "."))
        for message in support["messages"]:
            st.warning(md(message))
    return problem, support


def evaluate_section(db: Store, policies: Policies, sets: dict[int, Any]) -> tuple[str, int]:
    st.subheader("Evaluate")
    c1, c2 = st.columns(2)
    current_policy(policies, sets)
    pid = c1.selectbox("Policy", list(policies), format_func=lambda i: policy_service.title(policies[i]['name'], policies[i].get('version')), key=keys.policy,
                       on_change=context.changed(keys.policy, "policy"))
    context.put("policy", pid)
    sid = pick_set(pid, sets, c2)
    problem, support = set_notes(db, policies[pid], sid, sets[sid].get("parent_id"))
    names = targets.names(db)
    c1, c2 = st.columns(2)
    chosen = c1.multiselect("Targets (several local models side by side)", names, default=names[:1], key=keys.targets,
                            persist_state=context.KEEP)
    variants = c2.multiselect("Readouts to compare", list(VARIANTS), default=["default"], key=keys.variants,
                              persist_state=context.KEEP,
                              help="default: the policy's readout, else the model's measured default")
    examples = st.radio("Few-shot examples", EXAMPLE_SOURCES, horizontal=True, key=keys.examples,
                        format_func={"policy": "the policy's own", "train": "from the set's train split (never scored)"}.get)
    sources = st.multiselect(
        "Head layout: also read hidden states from (a learned head, policy first - each row reads only its state)",
        targets.local_names(db), key=keys.head_sources, persist_state=context.KEEP,
        help="Each model named here scores the same rows beside the first target, row by row, in the head layout: "
             "the question and options first (evaluated once per policy), the state last. Only a learned head reads "
             "it, so it needs labeled rows - 3 of every option at least. It costs what it costs: per row about the "
             "state plus ~10 tokens on that model (on the default model ~0.4 s against ~1.5 s zero-shot, bench.heads).")
    rule = stop_rule_form(support["total"] if support else 0)
    busy = tasks.runner().busy_with("evaluate")
    label = f"Run evaluation ({support['scored'] if support else '?'} rows)"
    if st.button(label, type="primary", key=keys.run, disabled=bool(problem) or busy is not None,
                 help="runs in the background: you can open other pages meanwhile; a stopped or interrupted run of the "
                      "same policy, set and target is resumed, not started again" if busy is None else
                      f"an evaluation is running: {busy.text()}"):
        start_evaluation(db, policies[pid], sid, chosen, sources, variants, str(examples), rule)
    finished_evaluation(db)
    live_section(db, pid, sid)
    return pid, sid


def start_evaluation(db: Store, policy: Policy, sid: int, chosen: list[str], sources: list[str],
                     variants: list[str], examples: str, rule: evaluate.StopRule) -> None:
    """The evaluation in the background; this session remembers its task and what Stop early asked."""
    built = resources.chosen_targets(db, chosen) or []
    readers = (resources.chosen_targets(db, sources) or []) if sources else []
    task = tasks.submit("evaluate", f"{policy['name']} × set #{sid}", "views/calibrate.py",
                        lambda task: evaluate.evaluate(db, policy, sid, built, variants, examples=examples,
                                                       progress_for=task.progress_for, rule=rule,
                                                       head_sources=readers))
    st.session_state[keys.task] = task.id
    st.session_state[keys.stop_at] = rule.max_rows  # what this task was started with, not the field's later value
    st.session_state.pop(keys.outcome, None)
    st.rerun()


def stop_rule_form(rows: int) -> evaluate.StopRule:
    """Answers before the whole set is scored: the rows come in stratified order, so an early stop is a
    fair sample - and the run resumes from there later."""
    with st.expander("Stop early (the first rows are a fair sample of the set)"):
        c1, c2 = st.columns(2)
        n = c1.number_input("Score at most N rows (0 = all)", 0, max(rows, 1), 0, key=keys.max_rows)
        width = c2.number_input("Or stop when the accuracy's 95% interval is narrower than (points, 0 = off)", 0, 50, 0,
                                key=keys.ci_width)
    return evaluate.StopRule(max_rows=int(n) or None, max_ci_width=(width / 100) or None)


def finished_evaluation(db: Store) -> None:
    """This session's evaluation, once it is over: what each target x readout did (kept on the page
    until the next evaluation); the best run opens."""
    task = tasks.runner().get(st.session_state.get(keys.task))
    if task is not None and not task.active:
        st.session_state.pop(keys.task)
        outcomes = task.result or []
        st.session_state[keys.outcome] = panels.outcome_notes(task.status, task.error, task.text(), outcomes, md)
        best = evaluate.best_run(db, outcomes)
        if best is not None:  # open the most accurate of the runs just made
            st.session_state[keys.run_pick] = best
            context.put("run", best)
    for note in st.session_state.get(keys.outcome, ()):
        draw(st, note)


def live_section(db: Store, pid: str, sid: int) -> None:
    """While runs of this policy x set are scored: the numbers so far, refreshed as rows arrive - drawn at once
    when this session's evaluation was just started (its runs may not exist yet), not only after a rerun."""
    def mine() -> Any:
        task = tasks.runner().get(st.session_state.get(keys.task))
        return task if task is not None and task.active else None

    if not evaluate.running(db, pid, sid) and mine() is None:
        return

    @st.fragment(run_every=3.0)
    def numbers() -> None:
        runs = evaluate.running(db, pid, sid)
        task = mine()
        if not runs and task is None:
            st.rerun()
        if not runs:
            st.info("Starting the evaluation (loading the model, the policy's first passes): the numbers appear "
                    "here as rows are scored.")
        stop_at = int(st.session_state.get(keys.stop_at) or 0) if task is not None else 0
        for run in runs:
            st.info(md(evaluate.live(db, run["id"], stop_at=stop_at or None).text()))

    numbers()


@st.cache_data(show_spinner=False, max_entries=32)
def sources_view(db_path: str, run_id: int, versions: tuple[Any, ...]) -> Any:
    """The (model, layout, head) comparison of a run and its head-layout companions, cached per content."""
    return evaluate.sources(resources.store_at(db_path), run_id)


def sources_section(db: Store, run_id: int) -> None:
    """Which model, layout and head to ship: accuracy out of fold against the cost of a row, and the
    cheapest candidate not worse than the most accurate beyond noise."""
    group = evaluate.source_group(db, run_id)
    if len(group) < 2:
        return
    table = sources_view(resources.db_path(), group[0]["id"], tuple(queries.run_version(db, r["id"]) for r in group))
    if table is None:
        return
    st.markdown("**Cheapest decision that is not worse** (this run and its head-layout sources, the same rows)")
    if table.recommended is not None:  # a statement, never `a if c else b` bare: Streamlit's magic would print its value
        st.success(md(table.sentence))
    else:
        st.info(md(table.sentence))
    frame = pd.DataFrame(evaluate.source_rows(table))
    st.dataframe(frame, hide_index=True, key=keys.sources, placeholder="", column_config={
        "accuracy (out of fold)": st.column_config.NumberColumn(format="%.3f"),
        "macro-F1": st.column_config.NumberColumn(format="%.3f"),
        "s a row (measured)": st.column_config.NumberColumn(format="%.2f"),
        "tokens a row": st.column_config.NumberColumn(format="%.0f"),
        "speed-up vs zero-shot": st.column_config.NumberColumn(format="%.1f×")})
    st.plotly_chart(charts.cost_accuracy(evaluate.source_points(table)), key=keys.sources_chart)
    st.caption(f"Compared on the {table.n} rows every source answered, each row predicted out of fold. Seconds and "
               "tokens a row are the medians of the warm rows when each run was scored on this machine; $ per 1,000 "
               "assumes the same pace on the deployment's CPU instance (a hint, not a quote). *Export this* below turns any "
               "candidate into its calibrated policy file: its model, layout and head.")
    download_frame(frame, "cheapest-decision.csv", "Download the sources compared (CSV)", keys.sources_csv)
    export_this(db, table, keys, float(st.session_state.get(keys.target_acc, 0.9)))


def correction_section(cal: Calibration) -> None:
    """Which correction or learned head the export carries, why, and what each candidate does out of fold
    (with intervals), as a table and a chart; what the chosen one does per class."""
    panel = panels.correction_panel(cal, md)
    st.markdown(panel.title)
    st.caption(panel.why)
    draw(st, panel.head_why)
    table = pd.DataFrame(list(panel.rows))
    st.dataframe(table, hide_index=True, key=keys.corrections,
                 column_config={k: st.column_config.NumberColumn(format="%.3f") for k in panel.number_columns})
    st.plotly_chart(charts.rate_bars(panel.bars, panel.bars_title, worry=panel.chance), key=keys.candidates)
    download_frame(table, "calibration-candidates.csv", "Download the corrections and heads compared (CSV)",
                   keys.candidates_csv)
    c1, c2 = st.columns(2)
    c1.plotly_chart(charts.confusion_heatmap(panel.confusion, list(panel.option_ids), "As scored"), key=keys.conf)
    c2.plotly_chart(charts.confusion_heatmap(panel.confusion_after, list(panel.option_ids), panel.after_title),
                    key=keys.conf_after)


def export_section(db: Store, cal: Calibration, policy: Policy) -> None:
    c1, c2 = st.columns(2)
    fallback = c1.selectbox("Fallback when gated", ["human-review", *cal.option_ids], key=keys.fallback)
    hand = None
    if c2.checkbox("Set the gate by hand", key=keys.manual, persist_state=context.KEEP):
        slider = panels.gate_slider(cal)
        hand = st.slider("Gate (calibrated confidence)", 0.0, 1.0, slider.start, 0.005, key=keys.gate, format="%.3f",
                         help=slider.help)
    choice = panels.guard_choice(policy)
    guard = st.selectbox("Steering guard", choice.options, index=choice.index, key=keys.guard, help=choice.help)
    try:
        exported = evaluate.export(db, cal, fallback=fallback, hand_gate=hand, policy=policy, guard=guard)
    except evaluate.OtherVersion as exc:
        st.error(md(exc))
        return
    exported = with_curve_if_shown(exported, cal, keys)  # what more labels buy, in the file when shown below
    cost = panels.guard_cost_note(db, exported, md)  # escaped inside: its bold stays bold
    (st.warning if exported.policy.guard == "none" else st.caption)(cost)
    panel = panels.gate_panel(cal, exported, md)
    for note in panel.alerts:
        draw(st, note)
    draw_columns(panel.decided)
    if panel.fitted:
        st.caption(panel.fitted)
    draw_columns(panel.quality)
    draw_columns(panel.calibration)
    g1, g2 = st.columns(2)
    g1.plotly_chart(charts.reliability_diagram(cal.report.bins_before, cal.report.bins_after,
                                               f"after {cal.chosen_name} (out of fold)"), key=keys.rel)
    coverage = panels.coverage_panel(cal, exported.gate.threshold)
    g2.plotly_chart(charts.coverage_curve(coverage.curve, coverage.threshold, coverage.target, lower=coverage.lower),
                    key=keys.cov)
    if coverage.note:
        g2.caption(coverage.note)
    correction_section(cal)
    if exported.policy.option_thresholds:
        st.dataframe(pd.DataFrame(panels.option_gate_rows(cal)), hide_index=True)
    if narrowed := panels.narrowing(db, cal, exported):
        st.info(narrowed)
    for note in panel.problems:
        draw(st, note)
    save_section(db, cal, exported)
    glossary("accuracy", "macro-F1", "Brier", "NLL", "ECE", "ece_corrected", "temperature", "fitted offsets",
             "learned head", "out of fold", "letters",
             "option-words", "content-free", "permutation")


def save_section(db: Store, cal: Calibration, exported: evaluate.Export) -> None:
    """Save for Deploy (the note after it says what the adapter will enforce), download, the JSON."""
    c1, c2 = st.columns(2)
    if c1.button("Save for deployment", type="primary", key=keys.save):
        cid = evaluate.save(db, exported)
        st.session_state[keys.saved] = panels.saved(cid, cal, exported)
        context.put("calibrated", cid)  # Deploy opens it
    c2.download_button("Download calibrated policy (JSON)",
                       json.dumps(exported.to_json(), indent=2, ensure_ascii=False).encode(),
                       file_name=f"{exported.policy.policy_id}.policy.json", mime="application/json", key=keys.download)
    if registry.enabled() and st.button("Register in MLflow (@candidate)", key=keys.register):
        st.session_state[keys.registered] = (cal.run_id, registry.register_note(db, exported.to_json(), md))
    registered = st.session_state.get(keys.registered)
    if registered is not None and registered[0] == cal.run_id:  # a note about another run's export stays with it
        draw(st, registered[1])
    saved = st.session_state.get(keys.saved)
    if saved and saved.run_id in (None, cal.run_id):  # a note about another run's save stays with that run
        st.success(saved.text(md))
        st.page_link("views/deploy.py", label="Go to Deploy", icon=":material/cloud_upload:")
    with st.expander("Policy JSON"):
        st.json(exported.to_json(), expanded=False)


def older_runs(db: Store, older: Sequence[Mapping[str, Any]], version: str) -> None:
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
        keyed = tuple((r["id"], queries.run_version(db, r["id"]), head_of(r)) for r in older)
        st.dataframe(pd.DataFrame([o.row() for o in readout_rows(resources.db_path(), keyed)]), hide_index=True,
                     key=keys.older)


def readouts_section(db: Store, runs: Sequence[Mapping[str, Any]], version: str) -> Sequence[Readout]:
    """The runs of the saved version side by side; returns their rows (the run picker's labels)."""
    rows = readout_rows(resources.db_path(), tuple((r["id"], queries.run_version(db, r["id"]), head_of(r)) for r in runs))
    st.markdown(f"**Readouts side by side** (this policy as saved now, {version} × this set)")
    st.dataframe(pd.DataFrame([r.row() for r in rows]), hide_index=True, key=keys.compare, placeholder="",  # no "None" in empty cells
                 column_config={c: st.column_config.NumberColumn(format="%.3f") for c in NUMBER3})
    st.caption("Per run: as scored, and with the best correction (temperature, per-option offsets; out of fold). "
               "The learned heads are fitted for the run opened below, and its numbers are shown there.")
    return rows


def gate_section(db: Store, policy: Policy, runs: Sequence[Mapping[str, Any]], rows: Sequence[Readout]) -> None:
    """Pick a run (the current one, else the most accurate), the target accuracy and head; its gate and export."""
    st.subheader("Gate and export")
    ids = [r["id"] for r in runs]
    context.follow(keys.run_pick, "run", ids, lambda: evaluate.best_of(rows) or ids[0])
    label = {r.run: panels.run_label(r) for r in rows}
    rid = st.selectbox("Evaluation run", ids, key=keys.run_pick, format_func=lambda i: label.get(i, f"#{i}"),
                       on_change=context.changed(keys.run_pick, "run"))
    context.put("run", rid)
    sources_section(db, rid)
    c1, c2, c3 = st.columns([2, 1, 1])
    target_acc = c1.slider("Target accuracy", 0.5, 0.99, 0.9, 0.01, key=keys.target_acc,
                           disabled=bool(st.session_state.get(keys.manual)),
                           help="the gate is chosen to reach it (disabled while the gate is set by hand)")
    per_option = c2.checkbox("Per-option gates", key=keys.per_option)
    head = c3.selectbox("Learned head", evaluate.HEAD_CHOICES, key=keys.head, persist_state=context.KEEP, format_func=lambda h: HEAD_LABELS[h],
                        help="auto: a head fitted on these labeled rows is exported only when it beats the corrections "
                             "beyond noise (out of fold); or pick one yourself")
    try:
        cal = calibration_view(resources.db_path(), rid, queries.run_version(db, rid), target_acc, per_option,
                               head or "auto")
    except TooFewRows as exc:
        if any(r["id"] == rid and r["status"] == "running" for r in runs):  # not an error: rows are still coming
            st.info(f"Run #{rid} is being scored: the gate and the export appear once it has enough labeled rows "
                    "(the numbers so far are shown above).")
        else:
            st.error(md(exc))
        return
    except ValueError as exc:
        st.error(md(exc))
        return
    export_section(db, cal, policy)
    label_curve_panel(cal, keys)
    label_issues_panel(db, cal, keys)


def render() -> None:
    st.title("Calibrate")
    st.caption("Probabilities only become operational confidence after they are checked against labels. Evaluate a "
               "policy on a labeled set, fit a temperature, pick the confidence gate for a target accuracy and the "
               "fallback for everything below it, then save the policy the adapter enforces.")
    db = resources.store()
    saved = saved_policies(db)
    if saved is None:
        return
    policies: Policies = {p["id"]: p for p in saved}
    sets_section(db, policies, current_policy(policies, {s["id"]: s for s in queries.labeled_sets(db)}))
    sets = {s["id"]: s for s in queries.labeled_sets(db)}
    if not sets:
        st.info("Import a labeled set to start (the shipped ones cover ticket routing, refund check, incident "
                "priority and content moderation).")
        return
    pid, sid = evaluate_section(db, policies, sets)
    policy = policies[pid]
    runs, older = evaluate.by_version(policy, evaluate.runs_of(db, pid, sid))
    version = version_label(policy.get("version"))
    older_runs(db, older, version)
    if not runs:
        st.caption(f"No evaluation of this policy as saved now ({version}) on this set yet.")
        return
    gate_section(db, policy, runs, readouts_section(db, runs, version))


if __name__ == "__main__":
    resources.run_page(render)

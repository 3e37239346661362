"""Compare: one policy over many states against several targets - answers, accuracy against labels
(with n and a 95% interval, a confusion matrix per target), latency (cold apart from warm), cost per
1,000 decisions, agreement, two targets side by side. A learned head (a calibrated policy of this
policy) is a variant: a column per target of its model, decided by the head on that target's rows."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pandas as pd
import streamlit as st
from streamlit.runtime.uploaded_file_manager import UploadedFile

from app.core.inputs import InputError, rows_from_text
from app.core.runner import Case
from app.core.store import Store
from app.service import compare_panels, decide, heads, sets as set_service, targets
from app.service.compare_panels import CompareVerdict
from app.ui import charts, context, importer, resources, tasks
from app.ui.components import download_frame, glossary, policy_picker, saved_policies
from app.service.drift import run_label
from app.ui.drift_panel import render_drift
from app.ui.keys import COMPARE
from app.ui.safe_text import md

keys = COMPARE
Policy = Mapping[str, Any]
LATENCY_COLUMNS = {"p50_ms": "p50 (ms)", "p95_ms": "p95 (ms)", "max_ms": "max (ms)", "iqr_ms": "IQR (ms)",
                   "cold_ms": "first call (ms)"}


def parse_input(pasted: str, upload: UploadedFile | None, policy: Policy, columns: set_service.ColumnMap | None = None,
                set_id: int | None = None, db: Store | None = None) -> list[Case] | None:
    """The cases to run, or None after showing why they could not be read (an upload's labels must be the
    policy's option ids, mapped in Columns and labels; a stored set must be made for this policy)."""
    if set_id == -1:
        st.error("**Labeled set**: this policy has none yet - import one on the Calibrate page, or paste states.")
        return None
    try:
        if set_id is not None and db is not None:
            return decide.states_from_set(db, policy, set_id)
        if upload is not None:
            return decide.states_from_upload(policy, upload.name, upload.getvalue(), columns=columns)
        return rows_from_text(pasted)
    except InputError as exc:
        st.error("**Upload** rejected, nothing was run - fix the file or pick its columns under *Columns and "
                 "labels*:\n\n" + "\n".join(f"- {md(p)}" for p in exc.problems[:20]))
        return None
    except ValueError as exc:
        st.error(f"**Labeled set**: {md(exc)}")
        return None


def render_results(db: Store, gid: str) -> None:
    shown = decide.comparison(db, gid)
    verdict = compare_panels.verdict(shown, md)
    how_much(verdict)
    for warning in verdict.degenerate:
        st.warning(warning)
    accuracy_section(shown, verdict)
    head_section(shown)
    latency_section(shown)
    if verdict.same_top is not None:  # one number: no chart for it
        st.metric(verdict.same_top.label, verdict.same_top.value, help=verdict.same_top.help)
    elif len(shown.agreement) > 2:
        st.plotly_chart(charts.agreement_heatmap(shown.agreement), key=keys.agree)
    if len(shown.runs) >= 2:
        drift_section(db, shown.runs)
    st.subheader("Answers per state")
    c1, c2 = st.columns(2)
    only = c1.checkbox(f"Only disagreements ({verdict.disagreements})", key=keys.only)
    wrong = c2.checkbox(f"Only wrong answers ({verdict.wrong})", key=keys.wrong,
                        disabled=not verdict.labeled, help="rows where some target's answer is not the label")
    st.dataframe(compare_panels.answer_rows(shown, only, wrong), hide_index=True, key=keys.table,
                 placeholder="")  # no label, or no answer: empty
    if verdict.failed:
        st.error(verdict.failed)
    download_frame(shown.results, f"comparison-{shown.file_stem}.csv", "Download all results (CSV)", key=keys.dl)
    glossary("warm", "p50_vs_first")


def accuracy_section(shown: decide.Comparison, verdict: CompareVerdict) -> None:
    """Accuracy against the labels per target, and a confusion matrix per target."""
    if verdict.accuracy_title is None:
        return
    st.subheader(verdict.accuracy_title)
    cols = st.columns(min(len(verdict.accuracy), 4))
    for col, target in zip(cols * 10, verdict.accuracy):
        col.metric(target.metric.label, target.metric.value, help=target.metric.help)
        col.caption(target.caption)
    if shown.confusion:
        with st.expander("Confusion matrix per target (labels × answers)"):
            cols = st.columns(min(len(shown.confusion), 3))
            for i, (name, matrix) in enumerate(shown.confusion.items()):
                cols[i % len(cols)].plotly_chart(charts.confusion_heatmap(matrix, shown.option_ids, name),
                                                 key=keys("conf", i))


def latency_section(shown: decide.Comparison) -> None:
    """Latency and cost per target, and the warm calls' distribution."""
    st.subheader("Latency and cost")
    st.dataframe(shown.latency, hide_index=True, key=keys.latency, placeholder="n/a", column_config={
        "warm_n": st.column_config.NumberColumn("warm calls", format="%d"),
        **{c: st.column_config.NumberColumn(label, format="%.0f") for c, label in LATENCY_COLUMNS.items()},
        **{c: st.column_config.NumberColumn(c.replace("_vs_first", " vs the first target"), format="%.2fx")
           for c in ("p50_vs_first", "p95_vs_first")},
        "usd_per_1000": st.column_config.NumberColumn("$ / 1,000 decisions", format="$%.4f"),
        "decisions_per_s": st.column_config.NumberColumn("decisions / s", format="%.2f"),
        "cost_note": st.column_config.TextColumn("how the cost was computed", width="large")})
    st.caption(compare_panels.LATENCY_NOTE)
    warm = shown.warm  # the rows the table's warm figures rest on: none copied, none failed, none cold
    box, ecdf = st.tabs(["Box plot (warm calls)", "ECDF (warm calls)"])
    box.plotly_chart(charts.latency_box(warm), key=keys.box)
    ecdf.plotly_chart(charts.latency_ecdf(warm), key=keys.ecdf)


def how_much(verdict: CompareVerdict) -> None:
    """What the figures rest on: a run stopped before every state (its states came in stratified order,
    so they are a fair sample, but fewer), and the rows copied from stored results."""
    if verdict.stopped:
        st.warning(verdict.stopped)
    if verdict.reused:
        st.caption(verdict.reused)


def head_section(shown: decide.Comparison) -> None:
    """The learned heads' columns in numbers, and why a target got none."""
    if not len(shown.heads) and not shown.head_notes:
        return
    st.subheader("Calibrated policies, as deployed")
    if len(shown.heads):
        st.dataframe(shown.heads, hide_index=True, key=keys.heads, placeholder="n/a", column_config={
            "answered": st.column_config.NumberColumn("rows answered", format="%d"),
            "read": st.column_config.NumberColumn("rows the head read", format="%d"),
            "fitted_rows": st.column_config.NumberColumn("of them fitted on (not counted)", format="%d"),
            **{c: st.column_config.NumberColumn(label, format="percent") for c, label in (
                ("accuracy", "accuracy (its own answer)"), ("ci_low", "accuracy: 95% CI low"),
                ("ci_high", "accuracy: 95% CI high"), ("gated_share", "sent to the fallback"),
                ("gated_low", "fallback: 95% CI low"), ("gated_high", "fallback: 95% CI high"),
                ("decided_accuracy", "accuracy of what it decided"), ("decided_low", "decided: 95% CI low"),
                ("decided_high", "decided: 95% CI high"))}})
        st.caption("A head column answers each state with the head's own answer (the argmax of the calibrated "
                   "probabilities, CalibratedPolicy.apply on the target's stored row); `sent to the fallback` is the "
                   "share its gate would not decide, `accuracy of what it decided` the rest. Its latency and cost are "
                   "its target's: the head is a dot product on the hidden state the target returned (microseconds).")
        fitted = int(shown.heads["fitted_rows"].sum()) if "fitted_rows" in shown.heads else 0
        if fitted:
            st.warning(f"{fitted} of these states were rows a head was fitted on (its calibration scored them): on "
                       "those it grades itself on its own training rows, so their labels are not counted in its "
                       "accuracy. Compare a head on states it has not seen.")
    for note in shown.head_notes:
        st.info(md(note))


def drift_section(db: Store, runs: Sequence[Mapping[str, Any]]) -> None:
    """Two of the comparison's targets side by side: flips, shifts, McNemar, intervals, the report."""
    st.subheader("Two targets side by side")
    by_id = {r["id"]: r for r in runs}
    c1, c2 = st.columns(2)
    a = c1.selectbox("A (the baseline)", list(by_id), key=keys.drift_a, format_func=lambda i: run_label(by_id[i]))
    rest = [i for i in by_id if i != a]
    if st.session_state.get(keys.drift_b) not in rest:
        st.session_state[keys.drift_b] = rest[0]
    b = c2.selectbox("B", rest, key=keys.drift_b, format_func=lambda i: run_label(by_id[i]))
    render_drift(db, by_id[a], by_id[b], key=keys.drift)


@dataclass(frozen=True)
class States:
    """Where the states to compare come from: pasted lines, an upload read through its column mapping, or a
    stored labeled set (its labels give accuracy)."""
    pasted: str = ""
    upload: UploadedFile | None = None
    columns: set_service.ColumnMap | None = None
    set_id: int | None = None

    def cases(self, db: Store, policy: Policy) -> list[Case] | None:
        return parse_input(self.pasted, self.upload, policy, self.columns, self.set_id, db)


SOURCES = {"paste": "paste, one per line", "upload": "upload CSV / JSONL", "set": "a stored labeled set"}


def states_input(db: Store, policy: Policy) -> States:
    """The states to compare on: pasted, uploaded (columns mapped and previewed, and the file read, before Run), or
    a stored labeled set of this policy."""
    source = st.radio("States", list(SOURCES), horizontal=True, key=keys.source, persist_state=context.KEEP,
                      format_func=SOURCES.get)
    if source == "paste":
        return States(pasted=st.text_area("One state per line", height=160, key=keys.paste, persist_state=context.KEEP))
    if source == "set":
        made = {int(s["id"]): s for s in set_service.of_policy(db, policy["id"])}
        if not made:
            st.info(f"No labeled set of {md(policy['name'])} yet: import one on the Calibrate page (Labeled sets).")
            return States(set_id=-1)
        sid = st.selectbox("Labeled set", list(made), key=keys("set", policy["id"]), persist_state=context.KEEP,
                           format_func=lambda i: f"#{i} {made[i]['name']} ({made[i]['n_rows']} rows)")
        return States(set_id=int(sid))
    upload = st.file_uploader("CSV or JSONL: a state column (optional id, and a label for accuracy)",
                              type=["csv", "jsonl", "tsv"], key=keys.upload)
    if upload is None:
        return States()
    columns = importer.column_mapping(st.container(), upload, decide.option_ids(policy), keys, label_required=False,
                                      policy_name=policy["name"])
    chosen = States(upload=upload, columns=columns)
    chosen.cases(db, policy)  # read now: a bad upload is said at upload, naming its rows, before anything runs
    return chosen


def start_comparison(db: Store, policy: Policy, cases: list[Case] | None, chosen: list[str], head_ids: list[int]) -> None:
    """Run the comparison in the background, or say what is missing or wrong."""
    if cases is not None and not cases:
        st.error("**States**: paste at least one line or upload a file.")
    elif cases and not chosen:
        st.error("**Targets**: pick at least one target.")
    elif cases:
        try:
            picks = [heads.as_deployed(db, i) for i in head_ids]
        except ValueError as exc:
            st.error(f"**Calibrated policies**: {md(exc)}")
            return
        problems = decide.head_problems(policy, picks)
        if problems:
            st.error("**Calibrated policies**: " + " ".join(md(p) for p in problems))
            return
        built = resources.chosen_targets(db, chosen)
        if built is None:
            return
        group = decide.new_group_id()  # known before it starts: a stopped comparison opens too
        tasks.start(keys.prefix, "compare", f"{policy['name']}: {len(cases)} states × {', '.join(chosen)}",
                    "views/compare.py",
                    lambda task: decide.compare(db, policy, cases, built, task.progress, heads=picks, group_id=group),
                    planned=group)


def render() -> None:
    st.title("Compare targets")
    db = resources.store()
    saved = saved_policies(db)
    if saved is None:
        return
    policy = policy_picker(saved, key=keys.policy)
    states = states_input(db, policy)
    names = targets.names(db, single_rows=True)
    chosen = st.multiselect("Targets", names, default=names[:1], key=keys.targets, persist_state=context.KEEP)
    saved_heads = heads.calibrated_of(db, policy["id"])
    head_ids = st.multiselect("Calibrated policies, as deployed (a learned head, or a correction and gate)",
                              list(saved_heads), key=keys("heads", policy["id"]), format_func=lambda i: saved_heads[i],
                              persist_state=context.KEEP,
                              help="each adds a column per target of its model: the calibrated policy's decision on "
                                   "that target's rows - its head or correction, gate and fallback (the targets that "
                                   "can are asked for their hidden states)")
    if not saved_heads:
        st.caption("No calibrated policy of this policy yet: save one on Calibrate to compare it here as deployed.")
    if st.button("Run comparison", type="primary", key=keys.run):
        start_comparison(db, policy, states.cases(db, policy), chosen, head_ids)
    tasks.collect(keys.prefix, "Comparison")  # the comparison just made is the one shown
    groups = decide.comparisons(db)
    if not groups:
        st.caption("No comparisons yet: paste a few states, pick targets and run.")
        return
    if st.session_state.get(keys.open) not in groups:
        st.session_state[keys.open] = next(iter(groups))
    gid = st.selectbox("Comparison", list(groups), key=keys.open,
                       format_func=lambda g: decide.comparison_name(groups[g]))
    if any(r["status"] == "running" for r in groups[gid]) and tasks.runner().busy_with("compare"):
        st.info("This comparison is still running (its progress is at the top of the page): its charts and tables "
                "appear here when it finishes.")
        return
    render_results(db, gid)


if __name__ == "__main__":
    resources.run_page(render)

"""Compare: one policy over many states against several targets - answers, accuracy against labels
(with n and a 95% interval, a confusion matrix per target), latency (cold apart from warm), cost per
1,000 decisions, agreement, two targets side by side. A learned head (a calibrated policy of this
policy) is a variant: a column per target of its model, decided by the head on that target's rows."""
from typing import Any, Mapping, Sequence
import pandas as pd
import streamlit as st

from app.service import decide, heads, targets
from app.ui import charts, context, resources, tasks
from app.ui.components import download_frame, glossary, policy_picker, saved_policies
from app.ui.drift_panel import render_drift, run_label
from app.ui.safe_text import md


def parse_input(pasted: str, upload, policy: Mapping[str, Any]):
    """The cases to run, or None after showing why the upload was rejected (labels must be the
    policy's option ids, as on Calibrate)."""
    try:
        if upload is not None:
            return decide.states_from_upload(policy, upload.name, upload.getvalue())
        return decide.states_from_text(pasted)
    except decide.InputError as exc:
        st.error("**Upload** rejected, nothing was run:\n\n" + "\n".join(f"- {md(p)}" for p in exc.problems[:20]))
        return None


def render_results(db, gid: str) -> None:
    shown = decide.comparison(db, gid)
    how_much(shown)
    for d in shown.degenerate:
        st.warning(f"**{md(d['target'])}** answered **{md(d['option'])}** for {d['share']:.0%} of {d['n']} states: it is "
                   "not really deciding - check its readout, or use another model.")
    if len(shown.accuracy):
        st.subheader("Accuracy against the labels" + (f" ({shown.stopped})" if shown.stopped else ""))
        cols = st.columns(min(len(shown.accuracy), 4))
        for col, (_, row) in zip(cols * 10, shown.accuracy.iterrows()):
            col.metric(md(row["target"]), f"{row['accuracy']:.1%}",
                       help=f"{row['correct']} of {row['labeled']} labeled rows right, {row['wrong']} wrong; "
                            f"95% interval {row['ci_low']:.1%}-{row['ci_high']:.1%} (Wilson)")
            col.caption(f"n = {row['labeled']} · 95% CI {row['ci_low']:.0%}–{row['ci_high']:.0%} · {row['wrong']} wrong")
        if shown.confusion:
            with st.expander("Confusion matrix per target (labels × answers)"):
                cols = st.columns(min(len(shown.confusion), 3))
                for i, (name, matrix) in enumerate(shown.confusion.items()):
                    cols[i % len(cols)].plotly_chart(charts.confusion_heatmap(matrix, shown.option_ids, name),
                                                     key=f"cmp_conf_{i}")
    head_section(shown)
    st.subheader("Latency and cost")
    named = {"p50_ms": "p50 (ms)", "p95_ms": "p95 (ms)", "max_ms": "max (ms)", "iqr_ms": "IQR (ms)",
             "cold_ms": "first call (ms)"}
    st.dataframe(shown.latency, hide_index=True, key="cmp_latency", placeholder="n/a", column_config={
        "warm_n": st.column_config.NumberColumn("warm calls", format="%d"),
        **{c: st.column_config.NumberColumn(label, format="%.0f") for c, label in named.items()},
        **{c: st.column_config.NumberColumn(c.replace("_vs_first", " vs the first target"), format="%.2fx")
           for c in ("p50_vs_first", "p95_vs_first")},
        "usd_per_1000": st.column_config.NumberColumn("$ / 1,000 decisions", format="$%.4f"),
        "decisions_per_s": st.column_config.NumberColumn("decisions / s", format="%.2f"),
        "cost_note": st.column_config.TextColumn("how the cost was computed", width="large")})
    st.caption("Latency over warm calls; a target's first call on a policy in this workbench process is cold (the "
               "policy's first pass and, with the content-free correction, its prior's three passes; for a remote "
               "target also the connection; a local model's load is not timed) and shown apart as the first call. Local targets show "
               f"decisions per second on this machine instead of a price. Prices: {decide.PRICE_SOURCE}.")
    warm = shown.results[shown.results["cold"].fillna(0).astype(int) == 0]
    box, ecdf = st.tabs(["Box plot (warm calls)", "ECDF (warm calls)"])
    box.plotly_chart(charts.latency_box(warm), key="cmp_box")
    ecdf.plotly_chart(charts.latency_ecdf(warm), key="cmp_ecdf")
    agree = shown.agreement
    if agree.shape == (2, 2):  # one number: no chart for it
        share = agree.iloc[0, 1]
        st.metric("Same top option", "n/a" if pd.isna(share) else f"{share:.0%} of states",
                  help=f"{md(agree.index[0])} vs {md(agree.columns[1])}, on the states both answered")
    elif len(agree) > 2:
        st.plotly_chart(charts.agreement_heatmap(agree), key="cmp_agree")
    if len(shown.runs) >= 2:
        drift_section(db, shown.runs)
    st.subheader("Answers per state")
    table = shown.answers
    c1, c2 = st.columns(2)
    only = c1.checkbox(f"Only disagreements ({int(table['disagree'].sum())})", key="cmp_only")
    wrong = c2.checkbox(f"Only wrong answers ({int(table['wrong'].sum())})", key="cmp_wrong",
                        disabled=not table["label"].notna().any(), help="rows where some target's answer is not the label")
    rows = table[table["disagree"]] if only else table
    rows = rows[rows["wrong"]] if wrong else rows
    if not table["label"].notna().any():  # no labels: no "wrong" column of unchecked boxes that means nothing
        rows = rows.drop(columns=[c for c in ("label", "wrong") if c in rows.columns])
    st.dataframe(rows, hide_index=True, key="cmp_table", placeholder="")  # no label, or no answer: empty
    errors = shown.results[shown.results["error"].notna()]
    if len(errors):
        st.error(f"{len(errors)} calls failed, e.g. {md(errors['target'].iloc[0])}: {md(errors['error'].iloc[0])}")
    download_frame(shown.results, f"comparison-{shown.file_stem}.csv", "Download all results (CSV)", key="cmp_dl")
    glossary("warm", "p50_vs_first")


def how_much(shown: decide.Comparison) -> None:
    """What the figures rest on: a run stopped before every state (its states came in stratified order,
    so they are a fair sample, but fewer), and the rows copied from stored results."""
    if shown.stopped:
        st.warning(f"**{shown.stopped.capitalize()}**: every figure below rests on those states only. Labeled states "
                   "are scored in stratified order, so the first ones keep every label's share.")
    if shown.reused:
        st.caption(f"{shown.reused} of {len(shown.results)} rows were reused from stored results of the same model and "
                   "request (an evaluation's, an earlier comparison's): the same answer, no call made - their latency "
                   "is not measured again and is left out of the latency figures.")


def head_section(shown: decide.Comparison) -> None:
    """The learned heads' columns in numbers, and why a target got none."""
    if not len(shown.heads) and not shown.head_notes:
        return
    st.subheader("Calibrated policies, as deployed")
    if len(shown.heads):
        st.dataframe(shown.heads, hide_index=True, key="cmp_heads", placeholder="n/a", column_config={
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


def drift_section(db, runs: Sequence[Mapping[str, Any]]) -> None:
    """Two of the comparison's targets side by side: flips, shifts, McNemar, intervals, the report."""
    st.subheader("Two targets side by side")
    by_id = {r["id"]: r for r in runs}
    c1, c2 = st.columns(2)
    a = c1.selectbox("A (the baseline)", list(by_id), key="cmp_drift_a", format_func=lambda i: run_label(by_id[i]))
    rest = [i for i in by_id if i != a]
    if st.session_state.get("cmp_drift_b") not in rest:
        st.session_state["cmp_drift_b"] = rest[0]
    b = c2.selectbox("B", rest, key="cmp_drift_b", format_func=lambda i: run_label(by_id[i]))
    render_drift(db, by_id[a], by_id[b], key="cmp_drift")


def render() -> None:
    st.title("Compare targets")
    db = resources.store()
    saved = saved_policies(db)
    if saved is None:
        return
    policy = policy_picker(saved, key="cmp_policy")
    source = st.radio("States", ["paste", "upload"], horizontal=True, key="cmp_source", persist_state=context.KEEP,
                      format_func={"paste": "paste, one per line", "upload": "upload CSV / JSONL"}.get)
    pasted, upload = "", None
    if source == "paste":
        pasted = st.text_area("One state per line", height=160, key="cmp_paste", persist_state=context.KEEP)
    else:
        upload = st.file_uploader("CSV with a `state` column (optional `id`, `label` for accuracy), or JSONL "
                                  "objects", type=["csv", "jsonl", "tsv"], key="cmp_upload")
        if upload is not None:
            preview = parse_input("", upload, policy)
            if preview:
                labeled = sum(1 for c in preview if c.label)
                st.success(f"{len(preview)} states parsed" + (f", {labeled} with a label" if labeled else ""))
                lookalikes = decide.label_lookalikes(upload.name, upload.getvalue())
                if lookalikes and not labeled:
                    st.warning(f"No `label` column (found: {', '.join(md(c) for c in lookalikes)}): rename "
                               f"{'it' if len(lookalikes) == 1 else 'one of them'} to `label` to get accuracy.")
                st.dataframe([{"id": c.key, "state": str(c.state)[:200], "label": c.label} for c in preview[:10]],
                             hide_index=True, placeholder="")
    names = targets.names(db, single_rows=True)
    chosen = st.multiselect("Targets", names, default=names[:1], key="cmp_targets")
    saved_heads = heads.calibrated_of(db, policy["id"])
    head_ids = st.multiselect("Calibrated policies, as deployed (a learned head, or a correction and gate)",
                              list(saved_heads), key=f"cmp_heads_{policy['id']}", format_func=lambda i: saved_heads[i],
                              help="each adds a column per target of its model: the calibrated policy's decision on "
                                   "that target's rows - its head or correction, gate and fallback (the targets that "
                                   "can are asked for their hidden states)")
    if not saved_heads:
        st.caption("No calibrated policy of this policy yet: save one on Calibrate to compare it here as deployed.")
    if st.button("Run comparison", type="primary", key="cmp_run"):
        cases = parse_input(pasted, upload, policy)
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
            tasks.start("cmp", "compare", f"{policy['name']}: {len(cases)} states × {', '.join(chosen)}",
                        "views/compare.py",
                        lambda task: decide.compare(db, policy, cases, built, task.progress, heads=picks))
    tasks.collect("cmp", "Comparison")  # the comparison just made is the one shown
    groups = decide.comparisons(db)
    if not groups:
        st.caption("No comparisons yet: paste a few states, pick targets and run.")
        return
    if st.session_state.get("cmp_open") not in groups:
        st.session_state["cmp_open"] = next(iter(groups))
    gid = st.selectbox("Comparison", list(groups), key="cmp_open",
                       format_func=lambda g: decide.comparison_name(groups[g]))
    if any(r["status"] == "running" for r in groups[gid]) and tasks.runner().busy_with("compare"):
        st.info("This comparison is still running (its progress is at the top of the page): its charts and tables "
                "appear here when it finishes.")
        return
    render_results(db, gid)


if __name__ == "__main__":
    resources.run_page(render)

"""Compare: one policy over many states against several targets - latency, agreement, disagreements."""
import streamlit as st

from app import analysis, charts, resources
from app.components import download_frame, policy_picker
from app.inputs import InputError, rows_from_text, rows_from_upload
from app.runner import progress_text, run_policy
from app.safe_text import md
from app.targets import TargetError

st.title("Compare targets")
db = resources.store()
policies = db.list_policies()
if not policies:
    st.info("No policies yet: load the examples on the Playground page or create one on the Policies page.")
    st.stop()
policy = policy_picker(policies, key="cmp_policy")
paste_tab, upload_tab = st.tabs(["Paste states", "Upload CSV / JSONL"])
pasted = paste_tab.text_area("One state per line", height=160, key="cmp_paste")
upload = upload_tab.file_uploader("CSV with a `state` column (optional `id`, `label`), or JSONL objects",
                                  type=["csv", "jsonl", "tsv"], key="cmp_upload")
specs = resources.target_specs(db)
names = [s["name"] for s in specs]
chosen = st.multiselect("Targets", names, default=names[:1], key="cmp_targets")

if st.button("Run comparison", type="primary", key="cmp_run"):
    try:
        rows = rows_from_upload(upload.name, upload.getvalue()) if upload is not None else rows_from_text(pasted)
    except InputError as exc:
        st.error("**Upload** rejected, nothing was run:\n\n" + "\n".join(f"- {md(p)}" for p in exc.problems[:20]))
        st.stop()
    if not rows:
        st.error("**States**: paste at least one line or upload a file.")
    elif not chosen:
        st.error("**Targets**: pick at least one target.")
    else:
        try:
            targets = [resources.make_target(next(s for s in specs if s["name"] == n)) for n in chosen]
        except TargetError as exc:
            st.error(str(exc))
            st.stop()
        resources.load_models(targets)
        bar = st.progress(0.0, text=f"0/{len(rows) * len(targets)} calls")
        group, _ = run_policy(db, policy, rows, targets, kind="compare",
                              progress=lambda d, t, e: bar.progress(d / t, text=progress_text(d, t, e)))
        st.session_state["cmp_group"] = group

groups = {}
for r in db.list_runs(kind="compare"):
    groups.setdefault(r["group_id"], r)
if groups:
    current = st.session_state.get("cmp_group")
    options = list(groups)
    idx = options.index(current) if current in options else 0
    gid = st.selectbox("Comparison", options, index=idx, key="cmp_open",
                       format_func=lambda g: f"{groups[g]['created_at']} · {groups[g]['policy']['name']} · "
                                             f"{groups[g]['n_rows']} states")
    runs = db.runs_in_group(gid)
    df = analysis.results_frame(runs, {r["id"]: db.results(r["id"]) for r in runs})
    st.subheader("Latency")
    st.dataframe(analysis.latency_stats(df), hide_index=True, key="cmp_latency",
                 column_config={**{c: st.column_config.NumberColumn(format="%.0f") for c in ("p50_ms", "p95_ms", "max_ms")},
                                **{c: st.column_config.NumberColumn(format="%.2fx") for c in ("p50_vs_first", "p95_vs_first")}})
    box, ecdf = st.tabs(["Box plot", "ECDF"])
    box.plotly_chart(charts.latency_box(df), key="cmp_box")
    ecdf.plotly_chart(charts.latency_ecdf(df), key="cmp_ecdf")
    if len(runs) > 1:
        st.plotly_chart(charts.agreement_heatmap(analysis.agreement_matrix(df)), key="cmp_agree")
    st.subheader("Answers per state")
    table = analysis.disagreements(df)
    only = st.checkbox(f"Only disagreements ({int(table['disagree'].sum())})", key="cmp_only")
    st.dataframe(table[table["disagree"]] if only else table, hide_index=True, key="cmp_table")
    errors = df[df["error"].notna()]
    if len(errors):
        st.error(f"{len(errors)} calls failed, e.g. {md(errors['target'].iloc[0])}: {md(errors['error'].iloc[0])}")
    download_frame(df, f"comparison-{gid}.csv", "Download all results (CSV)", key="cmp_dl")
else:
    st.caption("No comparisons yet: paste a few states, pick targets and run.")

"""History: every run, opened, deleted, or diffed against a pinned baseline."""
import pandas as pd
import streamlit as st

from app import analysis, charts, resources
from app.components import download_frame, show_group_results
from app.safe_text import md

st.title("History")
db = resources.store()
runs = db.list_runs()
if not runs:
    st.info("No runs yet. Every run from the Playground or Compare page is saved here.")
    st.stop()
baseline = db.pinned_run()
table = pd.DataFrame([{"run": r["id"], "when": r["created_at"], "kind": r["kind"], "policy": r["policy"].get("name"),
                       "target": r["target_name"], "model": r["model"], "status": r["status"],
                       "rows": r["done_rows"], "errors": r["error_rows"], "baseline": bool(r["pinned"])}
                      for r in runs])
st.dataframe(table, hide_index=True, key="hist_table")
by_id = {r["id"]: r for r in runs}
rid = st.selectbox("Open run", list(by_id), key="hist_open",
                   format_func=lambda i: f"#{i} · {by_id[i]['kind']} · {by_id[i]['policy'].get('name')} · "
                                         f"{by_id[i]['target_name']} · {by_id[i]['created_at']}")
run = by_id[rid]
results = db.results(rid)
if run["kind"] == "playground":
    show_group_results(db, run["group_id"], key="hist")
frame = pd.DataFrame([{"row": r["row_key"], "state": r["state"], "label": r["label"], "top_option": r["top_option"],
                       "label_mass": r["label_mass"], "latency_ms": r["latency_s"] * 1000, "error": r["error"],
                       "probabilities": dict(zip(r["option_ids"] or [], r["probabilities"] or []))} for r in results])
st.dataframe(frame, hide_index=True, key="hist_results")
download_frame(frame, f"run-{rid}.csv", "Download this run (CSV)", key="hist_dl")

c1, c2 = st.columns(2)
if c1.button("Unpin baseline" if run["pinned"] else "Pin as baseline", key="hist_pin"):
    db.pin_run(None if run["pinned"] else rid)
    st.rerun()
with c2.popover("Delete run"):
    st.write(f"Delete run #{rid} and its {len(results)} results? This cannot be undone.")
    if st.button("Delete", type="primary", key="hist_delete"):
        db.delete_run(rid)
        st.session_state.pop("hist_open", None)
        st.rerun()

if baseline and baseline["id"] != rid:
    st.subheader(f"Against baseline #{baseline['id']} ({md(baseline['target_name'])}, {baseline['created_at']})")
    diff = analysis.diff_runs(db.results(baseline["id"]), results)
    if diff.empty:
        st.caption("No rows in common with the baseline (rows are matched by their id).")
    else:
        st.metric("Top option changed", f"{int(diff['changed'].sum())} of {len(diff)} rows")
        st.plotly_chart(charts.shift_bars(diff), key="hist_shift")
        st.dataframe(diff, hide_index=True, key="hist_diff")
elif not baseline:
    st.caption("Pin a run as the baseline to diff other runs against it.")

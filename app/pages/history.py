"""History: every run, opened, deleted, or diffed against a pinned baseline; failed attempts apart."""
import pandas as pd
import streamlit as st

from app import analysis, charts, resources
from app.components import download_frame, show_group_results
from app.safe_text import md


def runs_table(runs: list[dict]) -> pd.DataFrame:
    # what a run is and how it went first: on a narrow window the long model names go off to the right
    return pd.DataFrame([{"run": r["id"], "baseline": "baseline" if r["pinned"] else "", "kind": r["kind"],
                          "status": r["status"], "rows": r["done_rows"], "errors": r["error_rows"],
                          "policy": r["policy"].get("name"), "target": r["target_name"],
                          "when": r["created_at"][:19].replace("T", " "), "model": r["model"] or ""} for r in runs])


def results_table(results: list[dict]) -> pd.DataFrame:
    """One row per result: probabilities as one column per option, empty cells for missing values."""
    rows = []
    for r in results:
        row = {"row": r["row_key"], "state": r["state"] if isinstance(r["state"], str) else str(r["state"]),
               "label": r["label"] or "", "top_option": r["top_option"] or "",
               "status": r.get("probability_status") or "", "readout": r.get("readout") or "",
               "label_mass": r["label_mass"], "latency_ms": r["latency_s"] * 1000, "cold": bool(r.get("cold")),
               "error": r["error"] or ""}
        row.update({f"p({o})": p for o, p in zip(r["option_ids"] or [], r["probabilities"] or [])})
        rows.append(row)
    return pd.DataFrame(rows)


def render() -> None:
    st.title("History")
    db = resources.store()
    runs = db.list_runs()
    if not runs:
        st.info("No runs yet. Every run from the Playground, Compare and Calibrate pages is saved here.")
        return
    failed = [r for r in runs if r["status"] == "failed"]
    runs = [r for r in runs if r["status"] != "failed"]
    baseline = db.pinned_run()
    if runs:
        st.dataframe(runs_table(runs), hide_index=True, key="hist_table", width="stretch")
    if failed:
        with st.expander(f"Failed attempts ({len(failed)}): every call of these runs failed"):
            st.dataframe(runs_table(failed)[["run", "when", "kind", "policy", "target", "rows"]], hide_index=True)
            for r in failed[:5]:
                err = (db.results(r["id"]) or [{}])[0].get("error")
                st.caption(f"#{r['id']} {md(r['target_name'])}: {md(err or 'no result')}")
    by_id = {r["id"]: r for r in runs + failed}
    rid = st.selectbox("Open run", list(by_id), key="hist_open",
                       format_func=lambda i: f"#{i} · {by_id[i]['kind']} · {by_id[i]['policy'].get('name')} · "
                                             f"{by_id[i]['target_name']} · {by_id[i]['status']} · {by_id[i]['created_at'][:16]}"
                                             + (" · baseline" if by_id[i]["pinned"] else ""))
    run = by_id[rid]
    results = db.results(rid)
    if run["kind"] == "playground":
        show_group_results(db, run["group_id"], key="hist")
    frame = results_table(results)
    st.dataframe(frame, hide_index=True, key="hist_results", width="stretch", column_config={
        "state": st.column_config.TextColumn(width="large"),
        "latency_ms": st.column_config.NumberColumn(format="%.0f"),
        **{c: st.column_config.NumberColumn(format="%.3f") for c in frame.columns if c.startswith("p(")}})
    download_frame(frame, f"run-{rid}.csv", "Download this run (CSV)", key="hist_dl")

    c1, c2 = st.columns(2)
    if c1.button("Unpin baseline" if run["pinned"] else "Pin as baseline", key="hist_pin"):
        if run["pinned"]:
            db.unpin_run(rid)  # this run only: another page may have pinned a newer one meanwhile
        else:
            db.pin_run(rid)
        st.rerun()
    with c2.popover("Delete run"):
        st.write(f"Delete run #{rid} and its {len(results)} results? This cannot be undone.")
        if st.button("Delete", type="primary", key="hist_delete"):
            db.delete_run(rid)
            st.session_state.pop("hist_open", None)
            st.rerun()

    if baseline and baseline["id"] != rid:
        st.subheader(f"Against baseline #{baseline['id']} ({md(baseline['target_name'])}, {baseline['created_at'][:16]})")
        diff = analysis.diff_runs(db.results(baseline["id"]), results)
        if diff.empty:
            st.caption("No rows in common with the baseline (rows are matched by their id and state).")
        else:
            st.metric("Top option changed", f"{int(diff['changed'].sum())} of {len(diff)} rows")
            st.plotly_chart(charts.shift_bars(diff), key="hist_shift")
            st.dataframe(diff, hide_index=True, key="hist_diff", width="stretch")
    elif not baseline:
        st.caption("Pin a run as the baseline to diff other runs against it.")


if __name__ == "__main__":
    resources.run_page(render)

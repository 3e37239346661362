"""History: every run, opened, deleted, or compared with another (flips, shifts, McNemar - app/core/drift.py);
failed attempts apart; an imported decision log (production traffic) replayed on a target."""
from typing import Any, Mapping, Sequence
import pandas as pd
import streamlit as st

from app.core.decision_import import parse_text
from app.core.records import Result, Run
from app.core.store import Store
from app.service import decide, history, policies as policy_service, production, queries, targets
from app.ui import context, resources
from app.ui.components import download_frame, show_group_results
from app.ui.drift_panel import render_drift
from app.ui.safe_text import md
from app.ui.keys import HISTORY

KEYS = HISTORY  # this page's session and widget keys


def runs_table(runs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    # what a run is and how it went first: on a narrow window the long model names go off to the right
    return pd.DataFrame([{"run": r["id"], "baseline": "baseline" if r["pinned"] else "", "kind": r["kind"],
                          "status": r["status"], "rows": r["done_rows"], "errors": r["error_rows"],
                          "accuracy": history.run_accuracy(r),
                          "policy": r["policy"].get("name"), "version": history.version_text(r), "target": r["target_name"],
                          "when": r["created_at"][:19].replace("T", " "), "model": r["model"] or ""} for r in runs])


def results_table(results: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per result: probabilities as one column per option, empty cells for missing values."""
    rows = []
    for r in results:
        row = {"row": r["row_key"], "state": r["state"] if isinstance(r["state"], str) else
               "" if r["state"] is None else str(r["state"]),
               "label": r["label"] or "", "top_option": r["top_option"] or "",
               "status": r.get("probability_status") or "", "readout": r.get("readout") or "",
               "label_mass": r["label_mass"], "latency_ms": r["latency_s"] * 1000, "cold": bool(r.get("cold")),
               "reused_from": r.get("reused_from"), "error": r["error"] or ""}
        row.update({f"p({o})": p for o, p in zip(r["option_ids"] or [], r["probabilities"] or [])})
        rows.append(row)
    return pd.DataFrame(rows)


def render() -> None:
    st.title("History")
    db = resources.store()
    import_section(db)
    if KEYS.open_next in st.session_state:  # set by a replay or an import, after the run picker was drawn
        context.put("run", st.session_state.pop(KEYS.open_next))
    everything = queries.runs(db)
    if not everything:
        st.info("No runs yet. Every run from the Playground, Compare and Calibrate pages is saved here.")
        return
    runs, failed = [r for r in everything if r["status"] != "failed"], [r for r in everything if r["status"] == "failed"]
    overview(db, runs, failed)
    by_id = {r["id"]: r for r in runs + failed}  # the picker: the runs, then the failed attempts
    run = by_id[open_run(by_id)]
    results = queries.results(db, run["id"])
    if run["kind"] == "playground":
        show_group_results(db, run["group_id"], key=KEYS.prefix)
    results_section(results, run["id"])
    for line in history.mlflow(db, run["id"]):  # where the run went in MLflow, when tracking is on
        st.caption(md(line))
    run_actions(db, run, len(results))
    if run["kind"] == "production":
        production_section(db, run)
    compare_section(db, run, by_id)


def overview(db: Store, runs: Sequence[Run], failed: Sequence[Run]) -> None:
    """Every run in a table; the failed attempts apart, with the first error of the newest five."""
    if runs:
        st.dataframe(runs_table(runs), hide_index=True, key=KEYS.table, width="stretch")
    if failed:
        with st.expander(f"Failed attempts ({len(failed)}): every call of these runs failed"):
            st.dataframe(runs_table(failed)[["run", "when", "kind", "policy", "target", "rows"]], hide_index=True)
            for r in failed[:5]:
                first = queries.results(db, r["id"])
                err = first[0]["error"] if first else None
                st.caption(f"#{r['id']} {md(r['target_name'])}: {md(err or 'no result')}")


def open_run(by_id: Mapping[int, Run]) -> int:
    """The run picker, following the current run (a link, another page); a link to a run that is gone says so."""
    gone = context.missing("run", list(by_id))
    if gone is not None:  # a link to a deleted (or never made) run: say so, never show another run as if it were it
        st.warning(f"Run #{md(gone)} does not exist (deleted, or a link from another workbench): showing the newest run.")
        context.put("run", None)
    context.follow(KEYS.open, "run", list(by_id))  # ?run=6 opens run 6; a run opened elsewhere opens here
    rid = st.selectbox("Open run", list(by_id), key=KEYS.open, on_change=context.changed(KEYS.open, "run"),
                       format_func=lambda i: f"#{i} · {by_id[i]['kind']} · {by_id[i]['policy'].get('name')} "
                                             f"{history.version_text(by_id[i])} · "
                                             f"{by_id[i]['target_name']} · {by_id[i]['status']} · {by_id[i]['created_at'][:16]}"
                                             + (" · baseline" if by_id[i]["pinned"] else ""))
    context.put("run", rid)
    return int(rid)


def results_section(results: Sequence[Result], rid: int) -> None:
    frame = results_table(results)
    st.dataframe(frame, hide_index=True, key=KEYS.results, width="stretch", placeholder="", column_config={
        "state": st.column_config.TextColumn(width="large"),
        "latency_ms": st.column_config.NumberColumn(format="%.0f"),
        **{c: st.column_config.NumberColumn(format="%.3f") for c in frame.columns if c.startswith("p(")}})
    download_frame(frame, f"run-{rid}.csv", "Download this run (CSV)", key=KEYS.dl)


def run_actions(db: Store, run: Run, n_results: int) -> None:
    """Pin (or unpin) as the baseline; delete."""
    rid = run["id"]
    c1, c2 = st.columns(2)
    if c1.button("Unpin baseline" if run["pinned"] else "Pin as baseline", key=KEYS.pin):
        if run["pinned"]:
            history.unpin(db, rid)  # this run only: another page may have pinned a newer one meanwhile
        else:
            history.pin(db, rid)
        st.rerun()
    with c2.popover("Delete run"):
        st.write(f"Delete run #{rid} and its {n_results} results? This cannot be undone.")
        if st.button("Delete", type="primary", key=KEYS.delete):
            history.delete(db, rid)
            st.session_state.pop(KEYS.open, None)
            context.put("run", None)
            st.rerun()


def compare_section(db: Store, run: Run, by_id: Mapping[int, Run]) -> None:
    """Another run of the same policy as run A (the pinned baseline first), this run as B: the drift panel."""
    st.subheader("Compare with another run")
    baseline = queries.baseline(db)
    rid = run["id"]
    others = history.same_policy(list(by_id.values()), run)
    if st.session_state.get(KEYS.cmp_for) != rid or st.session_state.get(KEYS.cmp) not in [None, *others]:
        st.session_state[KEYS.cmp] = baseline["id"] if baseline and baseline["id"] in others else None
    st.session_state[KEYS.cmp_for] = rid  # a newly opened run starts from the pinned baseline
    other = st.selectbox("Compare with (run A, the baseline; this run is B)", [None, *others], key=KEYS.cmp,
                         format_func=lambda i: "—" if i is None else f"#{i} · {by_id[i]['kind']} · "
                         f"{history.version_text(by_id[i])} · "
                         f"{by_id[i]['target_name']} · {by_id[i]['model'] or ''} · {by_id[i]['created_at'][:16]}"
                         + (" · baseline" if by_id[i]["pinned"] else ""))
    if other is not None:
        render_drift(db, by_id[other], run, key=KEYS.drift)
    elif not baseline:
        st.caption("Pick a run of the same policy, or pin one as the baseline: flips, shifts and the paired test "
                   "show what changed between them.")


def production_section(db: Store, run: Mapping[str, Any]) -> None:
    """An imported decision log: what it holds, and a replay of its logged states on a target."""
    info = (run.get("config") or {}).get("import") or {}
    st.caption(f"Imported from {md(info.get('source'))}: {info.get('decisions')} decisions from {info.get('first', '')[:19]} "
               f"to {info.get('last', '')[:19]}, {info.get('gated')} sent to the fallback, {info.get('with_state')} with "
               "a logged state" + ("" if info.get("with_state") else " (the adapter ran without SM_SEMIF_LOG_STATES=1: "
                                    "these rows can be reviewed, not replayed)"))
    if not info.get("with_state"):
        return
    c1, c2 = st.columns(2)
    name = c1.selectbox("Replay the logged states on", targets.names(db, single_rows=True), key=KEYS.replay_target)
    if c2.button("Replay", key=KEYS.replay):
        chosen = resources.chosen_targets(db, [name])
        if chosen:
            bar = st.progress(0.0, text="replaying…")
            new = production.replay(db, run["id"], chosen[0],
                                    lambda d, t, e: bar.progress(d / t if t else 1.0, text=decide.progress_text(d, t, e)))
            st.session_state[KEYS.open_next], st.session_state[KEYS.cmp_for] = new, new
            st.session_state[KEYS.cmp] = run["id"]  # opened against the production run it replays
            st.rerun()


def import_section(db: Store) -> None:
    """The adapter's decision log (a file, or CloudWatch Logs) as a production run."""
    with st.expander("Import a decision log (production traffic)", key=KEYS.log_box):
        policies = {p["id"]: p for p in queries.policies(db)}
        if not policies:
            st.caption("Load or create the policy the decisions were made with first (Playground, Policies).")
            return
        pid = st.selectbox("Decided with policy", list(policies), format_func=lambda i: policy_service.title(policies[i]['name'], policies[i].get('version')),
                           key=KEYS.log_policy)
        source = st.radio("From", ["file", "cloudwatch"], horizontal=True, key=KEYS.log_from,
                          format_func={"file": "a log file", "cloudwatch": "CloudWatch Logs"}.get)
        parsed, name = None, ""
        try:
            if source == "file":
                up = st.file_uploader("The adapter's SM_SEMIF_DECISION_LOG file, or its saved stdout",
                                      type=["jsonl", "log", "txt", "json"], key=KEYS.log_up)
                if up is not None and st.button("Import", key=KEYS.log_import):
                    parsed, name = parse_text(up.getvalue()), up.name
            else:
                group = st.text_input("Log group", placeholder="/aws/sagemaker/Endpoints/<endpoint name>",
                                      key=KEYS.log_group)
                if st.button("Import from CloudWatch", key=KEYS.log_cw, disabled=not group.strip()):
                    parsed, name = production.read_cloudwatch(group.strip()), f"cloudwatch:{group.strip()}"
            if parsed is None:
                return
            imported = production.import_log(db, parsed, policies[pid], source=name)
        except decide.InputError as exc:
            st.error(f"**{'Log group' if source == 'cloudwatch' and parsed is None else 'Decision log'}**: "
                     + md("; ".join(exc.problems)))
            return
        for problem in imported.warnings[:5]:
            st.warning(md(problem))
        context.put("run", imported.run_id)  # the run picker, drawn below, opens it
        st.success(f"Imported as run #{imported.run_id}: {imported.summary['decisions']} decisions "
                   f"({imported.summary['with_state']} with a state).")


if __name__ == "__main__":
    resources.run_page(render)

"""The drift comparison's widgets, shared by History ("compare with") and Compare: the numbers
come from app/core/drift.py, the report from app/drift_report.py; this module only lays them out."""
from __future__ import annotations

from typing import Any, Mapping

import streamlit as st

from app.core.store import Store
from app.service import drift as drift_service
from app.service.drift import FLIP_KINDS, SHIFT_THRESHOLD, Gate, pair_frame, run_label
from app.ui.drift_report import figures, html_report, json_text
from app.ui.safe_text import md

KIND_HELP = {"fixed": "wrong in A, right in B", "broken": "right in A, wrong in B",
             "changed-wrong": "wrong in both, differently", "changed": "top option changed, no label"}


def gate_choice(db: Store, policy_id: str | None, key: str) -> Gate:
    """No gate, a saved calibrated policy of this policy (its own rule), or a confidence threshold."""
    saved = drift_service.gates_for(db, policy_id)
    options: list[int | str] = ["none", *saved, "threshold"]
    labels: dict[int | str, str] = {"none": "no gate (every row decided)", "threshold": "a confidence threshold…",
              **{cid: drift_service.gate_label(c) for cid, c in saved.items()}}
    c1, c2 = st.columns(2)
    if f"{key}_gate" not in st.session_state and saved:  # the gate the policy would go live with, when there is one
        st.session_state[f"{key}_gate"] = max(saved)
    pick = c1.selectbox("Gate for coverage", options, format_func=lambda o: labels[o], key=f"{key}_gate",
                        help="the same gate applied to both runs' probabilities (a calibrated policy's own rule; "
                             "its model check aside, so two models can be compared)")
    if pick == "threshold":
        return drift_service.gate(threshold=c2.slider("Decide when the top probability is at least", 0.0, 1.0, 0.8,
                                                      0.01, key=f"{key}_gate_t"))
    if pick == "none":
        return drift_service.gate()
    return drift_service.gate(calibrated=saved[int(pick)])


def render_drift(db: Store, run_a: Mapping[str, Any], run_b: Mapping[str, Any], key: str) -> None:
    """Run A (the baseline) against run B: counts, tests, intervals, charts, the rows, downloads."""
    gate = gate_choice(db, run_b.get("policy_id"), key)
    threshold = st.number_input("Shift threshold (probability moved, same top option)", 0.01, 0.99, SHIFT_THRESHOLD,
                                0.01, key=f"{key}_shift")
    labels = {"a": run_label(run_a), "b": run_label(run_b)}
    drift = drift_service.runs_side_by_side(db, run_a, run_b, gate=gate, shift_threshold=threshold)
    if not drift.pairs:
        st.info("No rows in common: rows are matched by their id and state (and the same options). Compare two runs "
                "of the same labeled set or states.")
        return
    st.caption(f"A = {md(labels['a'])} · B = {md(labels['b'])} · {len(drift.pairs)} rows paired"
               + (f", {drift.unmatched} of B's rows without a match" if drift.unmatched else ""))
    flips = st.columns(6)
    flips[0].metric("Flips", drift.flips, help="rows whose top option changed")
    for col, kind in zip(flips[1:], FLIP_KINDS):
        col.metric(kind.capitalize(), drift.counts[kind], help=KIND_HELP[kind])
    flips[5].metric("Shifts", drift.counts["shift"], help=f"same top option, a probability moved by more than {threshold:.2f}")
    cols = st.columns(4)
    cols[0].metric("Accuracy A", "n/a" if drift.accuracy_a.rate is None else f"{drift.accuracy_a.rate:.1%}",
                   help=drift.accuracy_a.text())
    cols[1].metric("Accuracy B", "n/a" if drift.accuracy_b.rate is None else f"{drift.accuracy_b.rate:.1%}",
                   delta=None if drift.accuracy_diff is None else f"{drift.accuracy_diff:+.1%}",
                   help=drift.accuracy_b.text())
    ci = drift.accuracy_diff_ci
    cols[2].metric("B − A, 95% CI", "n/a" if ci is None else f"{ci[0]:+.1%} to {ci[1]:+.1%}",
                   help="exact, from the McNemar test on the same labeled pairs: it excludes 0 exactly when p < 0.05")
    cols[3].metric("McNemar exact p", "n/a" if drift.mcnemar_p is None else f"{drift.mcnemar_p:.4f}",
                   help=f"two-sided, on the {drift.counts['fixed'] + drift.counts['broken']} discordant pairs "
                        "(fixed vs broken)")
    if drift.labeled:
        st.markdown(md(drift.sentence()))
    if not drift.labeled:
        st.caption("No labels on these rows: accuracy, McNemar and the fixed/broken split need labeled rows; "
                   "flips are counted as changed.")
    st.dataframe([{"run": labels[side], "coverage": m.coverage.text(), "accuracy at the gate": m.gate_accuracy.text(),
                   "ECE": None if m.ece is None else round(m.ece, 4), "rows to the fallback": len(m.gated_keys)}
                  for side, m in (("a", drift.gate_a), ("b", drift.gate_b))], hide_index=True, key=f"{key}_gates")
    st.caption(f"Gate: {md(drift.gate)}. ECE in 10 equal-width bins of the confidence the gate reads.")
    for i, fig in enumerate(figures(drift)):
        st.plotly_chart(fig, key=f"{key}_fig{i}")
    frame = pair_frame(drift)
    kinds = st.multiselect("Rows to show", [*FLIP_KINDS, "shift", "same"], default=[*FLIP_KINDS, "shift", "same"],
                           key=f"{key}_kinds")
    st.dataframe(frame[frame["kind"].isin(kinds)], hide_index=True, key=f"{key}_rows", width="stretch",
                 column_config={"state": st.column_config.TextColumn(width="large"),
                                **{c: st.column_config.NumberColumn(format="%.3f")
                                   for c in ("a_p", "b_p", "a_top_in_b", "max_shift")}})
    name = f"drift-{run_a['id']}-vs-{run_b['id']}"
    c1, c2 = st.columns(2)
    title = f"Run #{run_a['id']} vs run #{run_b['id']}"
    c1.download_button("Download the report (HTML, self-contained)",  # built on click: plotly.js inlined is ~4.7 MB
                       lambda: html_report(drift, title).encode(), file_name=f"{name}.html", mime="text/html",
                       key=f"{key}_html")
    c2.download_button("Download the numbers (JSON)", json_text(drift).encode(), file_name=f"{name}.json",
                       mime="application/json", key=f"{key}_json")

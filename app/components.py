"""Streamlit display pieces shared by pages (results of a run group, downloads)."""
from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from . import charts
from .safe_text import csv_safe, md
from .store import Store


def show_group_results(db: Store, group_id: str, key: str) -> None:
    """Per target: probabilities chart, top option, label mass, latency - side by side - with a
    disagreement marker and the raw request/response one click away."""
    runs = db.runs_in_group(group_id)
    if not runs:
        st.info("That run was deleted.")
        return
    results = {r["id"]: db.results(r["id"]) for r in runs}
    first = [results[r["id"]][0] if results[r["id"]] else None for r in runs]
    tops = {r["target_name"]: f["top_option"] for r, f in zip(runs, first) if f and not f["error"]}
    if len(tops) > 1:
        if len(set(tops.values())) > 1:
            st.warning("⚠ **Disagreement**: " + ", ".join(f"{md(t)} → {md(o)}" for t, o in tops.items()))
        else:
            st.success(f"All {len(tops)} targets agree on {md(next(iter(tops.values())))}")
    cols = st.columns(len(runs))
    for col, run, res in zip(cols, runs, first):
        with col:
            st.subheader(run["target_name"])
            st.caption(f"{run['target']['kind']} · {md(run['model'] or 'model unknown')} · run #{run['id']}")
            if res is None:
                st.info("No result stored.")
                continue
            if res["error"]:
                st.error(f"This target failed: {md(res['error'])}")
            else:
                st.plotly_chart(charts.probability_bars(res["option_ids"], res["probabilities"]),
                                key=f"{key}-chart-{run['id']}")
                m1, m2, m3 = st.columns(3)
                m1.metric("Top option", res["top_option"])
                m2.metric("Label mass", "n/a" if res["label_mass"] is None else f"{res['label_mass']:.0%}",
                          help="Share of next-token probability the option labels held; low means the model "
                               "was not really answering this question.")
                m3.metric("Latency", f"{res['latency_s'] * 1000:.0f} ms")
                if res["label_mass"] is not None and res["label_mass"] < 0.3:
                    st.caption("⚠ Low label mass: most probability went to tokens that are not options.")
                st.caption("Probabilities are uncalibrated: calibrate on a labeled set before gating on them.")
            with st.expander("Raw request / response"):
                st.json({"request": res["request"], "response": res["response"]}, expanded=False)


def policy_picker(policies: list[dict], key: str, default: str = "ticket-routing") -> dict:
    """A policy selectbox (names shown, the routing template preselected when present)."""
    by_id = {p["id"]: p for p in policies}
    ids = list(by_id)
    pid = st.selectbox("Policy", ids, index=ids.index(default) if default in ids else 0,
                       format_func=lambda i: by_id[i]["name"], key=key)
    return by_id[pid]


def download_frame(df: pd.DataFrame, filename: str, label: str, key: str) -> None:
    flat = df.copy()
    for c in flat.columns:
        if flat[c].map(lambda v: isinstance(v, (list, dict))).any():
            flat[c] = flat[c].map(lambda v: None if v is None else json.dumps(v))
    st.download_button(label, csv_safe(flat).to_csv(index=False).encode(), file_name=filename, mime="text/csv", key=key)

"""Plotly figure builders: arrays/frames in, figures out (no Streamlit, easy to test)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

_LAYOUT = dict(margin=dict(l=10, r=10, t=40, b=10), template="plotly_white")


def probability_bars(option_ids: list[str], probabilities: list[float], title: str = "",
                     highlight: str | None = None) -> go.Figure:
    """Horizontal bars, options top-to-bottom in request order; the top option highlighted."""
    top = highlight or option_ids[int(np.argmax(probabilities))]
    fig = go.Figure(go.Bar(
        x=list(probabilities), y=list(option_ids), orientation="h",
        marker_color=["#1f77b4" if o == top else "#aec7e8" for o in option_ids],
        text=[f"{p:.1%}" for p in probabilities], textposition="auto",
        hovertemplate="%{y}: %{x:.4f}<extra></extra>"))
    fig.update_layout(title=title, xaxis=dict(range=[0, 1], title="probability", tickformat=".0%"),
                      yaxis=dict(autorange="reversed"), height=60 + 34 * len(option_ids), **_LAYOUT)
    return fig


def latency_box(df: pd.DataFrame) -> go.Figure:
    """Latency distribution per target (ms), all points shown."""
    fig = go.Figure()
    ok = df[df["error"].isna()]
    for target, g in ok.groupby("target", sort=False):
        fig.add_trace(go.Box(y=g["latency_s"].to_numpy(dtype=float) * 1000, name=str(target), boxpoints="all",
                             jitter=0.3, pointpos=0))
    fig.update_layout(title="Latency per call (client-measured)", yaxis_title="ms", showlegend=False, **_LAYOUT)
    return fig


def latency_ecdf(df: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    ok = df[df["error"].isna()]
    for target, g in ok.groupby("target", sort=False):
        x = np.sort(g["latency_s"].to_numpy(dtype=float) * 1000)
        fig.add_trace(go.Scatter(x=x, y=np.arange(1, len(x) + 1) / len(x), mode="lines", line_shape="hv",
                                 name=str(target)))
    fig.update_layout(title="Latency ECDF", xaxis_title="ms", yaxis=dict(title="share of calls", tickformat=".0%"),
                      **_LAYOUT)
    return fig


def agreement_heatmap(matrix: pd.DataFrame) -> go.Figure:
    z = matrix.to_numpy(dtype=float)
    fig = go.Figure(go.Heatmap(z=z, x=list(matrix.columns), y=list(matrix.index), zmin=0, zmax=1,
                               colorscale="Blues", text=[[("" if np.isnan(v) else f"{v:.0%}") for v in row] for row in z],
                               texttemplate="%{text}", hovertemplate="%{y} vs %{x}: %{z:.1%}<extra></extra>"))
    fig.update_layout(title="Top-option agreement between targets", height=120 + 50 * len(matrix), **_LAYOUT)
    return fig


def shift_bars(diff: pd.DataFrame) -> go.Figure:
    """Largest probability shift per row against the baseline run; changed top options in red."""
    fig = go.Figure(go.Bar(x=diff["row_key"], y=diff["shift"],
                           marker_color=["#d62728" if c else "#7f7f7f" for c in diff["changed"]],
                           customdata=np.stack([diff["shift_option"], diff["baseline_top"], diff["top"]], axis=-1)
                           if len(diff) else None,
                           hovertemplate="%{x}: %{customdata[0]} %{y:+.3f}<br>%{customdata[1]} → %{customdata[2]}"
                                         "<extra></extra>"))
    fig.update_layout(title="Largest probability shift vs baseline (red: top option changed)",
                      yaxis=dict(title="Δ probability", range=[-1, 1]), **_LAYOUT)
    return fig

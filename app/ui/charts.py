"""Plotly figure builders: arrays/frames in, figures out (no Streamlit, easy to test)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

if TYPE_CHECKING:
    from app.core.calibration import RiskCoverage

_LAYOUT = dict(margin=dict(l=10, r=10, t=40, b=10), template="plotly_white")
LABELLED = {**_LAYOUT, "margin": dict(l=10, r=40, t=40, b=10)}  # room on the right for a label past the axis end
TICKS = [0, 0.2, 0.4, 0.6, 0.8, 1]  # a share axis with room beyond 100% for a label shows no "110%" tick


def probabilities_by_target(by_target: dict[str, tuple[list[str], list[float]]]) -> go.Figure:
    """Every target's probabilities in one grouped horizontal bar chart: options down the side (the
    first target's order), one colour per target, readable at any page width."""
    order = list(next(iter(by_target.values()))[0]) if by_target else []
    fig = go.Figure()
    for target, (ids, probs) in by_target.items():
        p = dict(zip(ids, probs))
        fig.add_trace(go.Bar(y=order, x=[p.get(o, 0.0) for o in order], name=str(target), orientation="h",
                             text=[f"{p.get(o, 0.0):.0%}" for o in order], textposition="outside", textangle=0,
                             cliponaxis=False, hovertemplate=f"{target}<br>%{{y}}: %{{x:.4f}}<extra></extra>"))
    # labels sit after the bar end, level (a short bar's "6%" never turns on its side or shrinks): room
    # for "100%" beyond the last tick
    fig.update_layout(barmode="group", xaxis=dict(range=[0, 1.1], tickvals=TICKS, title="probability", tickformat=".0%"),
                      yaxis=dict(autorange="reversed"), height=80 + len(order) * (18 + 14 * len(by_target)),
                      legend=dict(orientation="h", y=-0.2), **LABELLED)
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


def reliability_diagram(bins_before: list[dict[str, Any]], bins_after: list[dict[str, Any]] | None = None,
                        after_label: str = "temperature-scaled (out of fold)") -> go.Figure:
    """Accuracy vs confidence per bin (marker size ~ count), before and after the correction."""
    fig = go.Figure(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(dash="dash", color="#999"),
                               name="perfectly calibrated", hoverinfo="skip"))
    for bins, name, color in ((bins_before, "raw", "#d62728"), (bins_after or [], after_label, "#1f77b4")):
        if not bins:
            continue
        counts = np.array([b["count"] for b in bins], float)
        fig.add_trace(go.Scatter(
            x=[b["confidence"] for b in bins], y=[b["accuracy"] for b in bins], mode="lines+markers", name=name,
            marker=dict(size=6 + 24 * np.sqrt(counts / counts.max()), color=color), line=dict(color=color),
            customdata=counts, hovertemplate="confidence %{x:.2f}<br>accuracy %{y:.2f}<br>%{customdata:.0f} rows<extra></extra>"))
    fig.update_layout(title="Reliability (top label, equal-width bins)", xaxis=dict(title="confidence", range=[0, 1]),
                      yaxis=dict(title="accuracy", range=[0, 1]),  # legend below: a side legend squeezes it at 800 px
                      legend=dict(orientation="h", yanchor="top", y=-0.2, x=0), **_LAYOUT)
    return fig


def confusion_heatmap(matrix: list[list[int]], option_ids: list[str], title: str = "Confusion matrix") -> go.Figure:
    z = np.asarray(matrix)
    fig = go.Figure(go.Heatmap(z=z, x=option_ids, y=option_ids, colorscale="Blues", text=z, texttemplate="%{text}",
                               hovertemplate="true %{y}, predicted %{x}: %{z}<extra></extra>", showscale=False))
    fig.update_layout(title=title, xaxis_title="predicted", yaxis=dict(title="true", autorange="reversed"),
                      height=140 + 45 * len(option_ids), **_LAYOUT)
    return fig


def coverage_curve(curve: RiskCoverage, gate: float | None, target: float | None = None,
                   lower: Sequence[float] | None = None) -> go.Figure:
    """Accuracy of accepted decisions vs coverage; the chosen gate marked; with `lower`, the 95% lower
    bound a recommended gate must clear (one-sided Clopper-Pearson, on the out-of-fold rows) drawn beside it."""
    fig = go.Figure(go.Scatter(x=curve.coverage, y=curve.accuracy, mode="lines+markers", name="accepted rows",
                               customdata=curve.threshold, line_shape="hv",
                               hovertemplate="gate %{customdata:.3f}<br>coverage %{x:.0%}<br>accuracy %{y:.0%}<extra></extra>"))
    if lower is not None:
        fig.add_trace(go.Scatter(x=curve.coverage, y=list(lower), mode="lines", line_shape="hv",
                                 line=dict(dash="dash", color="#ff7f0e"),
                                 name="95% lower bound, one-sided Clopper-Pearson, out of fold (what a recommended gate must clear)",
                                 hovertemplate="coverage %{x:.0%}<br>lower bound %{y:.0%}<extra></extra>"))
        fig.update_layout(legend=dict(orientation="h", y=-0.25))
    if target is not None:
        fig.add_hline(y=target, line_dash="dot", line_color="#2ca02c", annotation_text=f"target {target:.0%}")
    if gate is not None:
        covered = float(np.mean(np.asarray(curve.threshold) >= gate)) if len(curve.threshold) else 0.0
        fig.add_vline(x=covered, line_dash="dash", line_color="#d62728", annotation_text=f"gate {gate:.3f}",
                      annotation_position="bottom left" if covered > 0.8 else "bottom right")  # clear of the 100% tick
    fig.update_layout(title="Accuracy vs coverage (risk-coverage)", xaxis=dict(title="coverage", tickformat=".0%", range=[0, 1.02]),
                      yaxis=dict(title="accuracy of decided rows", tickformat=".0%", range=[0, 1.02]), **_LAYOUT)
    return fig


def rate_bars(rows: Sequence[Mapping[str, Any]], title: str, worry: float | None = None) -> go.Figure:
    """Rates as horizontal bars with their 95% intervals; rows: {label, rate, low, high, n}."""
    rows = [r for r in rows if r.get("rate") is not None]
    labels = [f"{r['label']} (n={r['n']})" for r in rows]
    fig = go.Figure(go.Bar(
        y=labels, x=[r["rate"] for r in rows], orientation="h", marker_color="#1f77b4",
        error_x=dict(type="data", symmetric=False, array=[r["high"] - r["rate"] for r in rows],
                     arrayminus=[r["rate"] - r["low"] for r in rows]),
        hovertemplate="%{y}: %{x:.1%}<extra></extra>", showlegend=False))
    # each rate written level, just right of its interval: inside a short bar it was shrunk or turned
    # on its side ("6%" rotated), and right after the bar it would sit on the interval's line
    fig.add_trace(go.Scatter(y=labels, x=[r["high"] for r in rows], mode="text", text=[f"\u2002{r['rate']:.0%}" for r in rows],
                             textposition="middle right", cliponaxis=False, hoverinfo="skip", showlegend=False))
    if worry is not None:
        fig.add_vline(x=worry, line_dash="dot", line_color="#d62728")
    fig.update_layout(title=title, xaxis=dict(range=[0, 1.1], tickvals=TICKS, tickformat=".0%"), yaxis=dict(autorange="reversed"),
                      height=120 + 38 * max(1, len(rows)), **LABELLED)
    return fig


DRIFT_COLORS = {"fixed": "#2ca02c", "broken": "#d62728", "changed-wrong": "#ff7f0e", "changed": "#9467bd",
                "shift": "#1f77b4", "same": "#c7c7c7"}


def flip_bars(per_class: dict[str, dict[str, int]]) -> go.Figure:
    """Per class (the label), how many rows were fixed, broken, changed between wrong answers,
    changed (no label) or shifted - stacked, the unchanged rows left out."""
    classes = list(per_class)
    fig = go.Figure()
    for kind in ("fixed", "broken", "changed-wrong", "changed", "shift"):
        counts = [per_class[c].get(kind, 0) for c in classes]
        if any(counts):
            fig.add_trace(go.Bar(x=classes, y=counts, name=kind, marker_color=DRIFT_COLORS[kind],
                                 hovertemplate=f"%{{x}}: %{{y}} {kind}<extra></extra>"))
    fig.update_layout(barmode="stack", title="Flips and shifts per class", yaxis=dict(title="rows"),
                      legend=dict(orientation="h", y=-0.2), **_LAYOUT)
    return fig


def drift_scatter(pairs: pd.DataFrame, threshold: float) -> go.Figure:
    """Each row: run A's probability of its top option (x) against run B's probability of that same
    option (y). On the diagonal nothing moved; the band is the shift threshold."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(color="#7f7f7f", dash="dot"),
                             name="unchanged", hoverinfo="skip"))
    for kind, g in pairs.groupby("kind", sort=False):
        fig.add_trace(go.Scatter(x=g["a_p"], y=g["a_top_in_b"], mode="markers", name=str(kind),
                                 marker=dict(color=DRIFT_COLORS.get(str(kind), "#333"), size=8),
                                 customdata=np.stack([g["row_key"], g["a_top"], g["b_top"]], axis=-1),
                                 hovertemplate="%{customdata[0]}: %{customdata[1]} %{x:.3f} → %{y:.3f}"
                                               "<br>B's top: %{customdata[2]}<extra></extra>"))
    fig.update_layout(title=f"Probability of A's answer, A vs B (shift threshold ±{threshold:.2f})",
                      xaxis=dict(title="run A", range=[0, 1]), yaxis=dict(title="run B", range=[0, 1]),
                      height=420, legend=dict(orientation="h", y=-0.25), **_LAYOUT)
    return fig


def accuracy_intervals(names: list[str], rates: list[float | None], lows: list[float | None],
                       highs: list[float | None]) -> go.Figure:
    """Accuracy per run with its 95% interval (error bars)."""
    ok = [i for i, r in enumerate(rates) if r is not None]
    fig = go.Figure(go.Scatter(
        x=[names[i] for i in ok], y=[rates[i] for i in ok], mode="markers", marker=dict(size=12),
        error_y=dict(type="data", symmetric=False, array=[(highs[i] or 0) - (rates[i] or 0) for i in ok],
                     arrayminus=[(rates[i] or 0) - (lows[i] or 0) for i in ok]),
        hovertemplate="%{x}: %{y:.1%}<extra></extra>"))
    fig.update_layout(title="Accuracy on the labeled rows both runs answered (95% intervals)",
                      yaxis=dict(range=[0, 1], tickformat=".0%"), **_LAYOUT)
    return fig


def position_bars(positions: pd.DataFrame, labeled: bool) -> go.Figure:
    """Order check: how often each display position was chosen, beside where the labels sat."""
    bars = [go.Bar(x=positions["position"], y=positions["chosen"], name="chosen by the model")]
    if labeled:
        bars.append(go.Bar(x=positions["position"], y=positions["label"], name="where the label was"))
    fig = go.Figure(bars)
    even = float(positions["chosen"].sum()) / max(len(positions), 1)
    # with no labels (pasted states) the reference is what an order-blind model does: every position equally often
    fig.add_hline(y=even, line_dash="dot", annotation_text="each position equally often",
                  annotation_position="top left")
    fig.update_layout(barmode="group", title="Chosen display position vs the labels' positions" if labeled else
                      "Chosen display position (no labels: against an even spread)",
                      xaxis_title="display position", yaxis_title="count", **_LAYOUT)
    top = float(max(positions["chosen"].max(), positions["label"].max() if labeled else 0, even, 1))
    fig.update_yaxes(tick0=0, dtick=max(1, int(top // 8)))  # counts: whole-number ticks
    return fig


def spread_bars(shifts: pd.DataFrame) -> go.Figure:
    """Order check: how far each option's probability moves with the order (mean, whisker to the max)."""
    fig = go.Figure(go.Bar(x=shifts["option"], y=shifts["mean_spread"], name="mean",
                           error_y=dict(type="data", array=shifts["max_spread"] - shifts["mean_spread"], symmetric=False)))
    fig.update_layout(title="How far each option's probability moves with the order (bar: mean over states of "
                            "max - min; whisker: the largest)",
                      yaxis=dict(title="probability spread", range=[0, 1]), **_LAYOUT)
    return fig


def cost_accuracy(rows: Sequence[Mapping[str, Any]], chance: float | None = None) -> go.Figure:
    """Accuracy (with its 95% interval) against seconds a row, one point per candidate; the recommended
    one ringed. rows: {label, rate, low, high, seconds, recommended}; rows without a rate or a cost are left
    out (a refused candidate is in the table with why, not here at 0%)."""
    rows = [r for r in rows if r.get("rate") is not None and r.get("seconds")]
    fig = go.Figure(go.Scatter(
        x=[r["seconds"] for r in rows], y=[r["rate"] for r in rows], mode="markers+text",
        text=[r["label"] for r in rows], textposition="top center",
        marker=dict(size=[16 if r.get("recommended") else 10 for r in rows],
                    color=["#2ca02c" if r.get("recommended") else "#1f77b4" for r in rows],
                    line=dict(width=2, color="#333")),
        error_y=dict(type="data", symmetric=False, array=[r["high"] - r["rate"] for r in rows],
                     arrayminus=[r["rate"] - r["low"] for r in rows]),
        hovertemplate="%{text}: %{y:.1%} at %{x:.2f} s a row<extra></extra>", showlegend=False))
    if chance is not None:
        fig.add_hline(y=chance, line_dash="dot", line_color="#d62728")
    fig.update_layout(title="Accuracy out of fold against seconds a row (green: recommended; dotted: chance)",
                      xaxis=dict(title="seconds a row, measured here (log)", type="log"),
                      yaxis=dict(title="accuracy", tickformat=".0%", range=[0, 1.05]), height=420, **_LAYOUT)
    return fig

"""The drift comparison as one self-contained HTML file (plotly's JavaScript inlined: it opens
offline, attached to a ticket or a pull request) and as JSON - the same numbers in both (no
Streamlit). Every piece of user text is escaped; the JSON is embedded for machines too."""
from __future__ import annotations

import html
import json
from typing import Any

from app.ui import charts
from app.service.drift import FLIP_KINDS, Drift, pair_frame


def figures(drift: Drift) -> list[Any]:
    frame = pair_frame(drift)
    a, b = drift.labels.get("a", "A"), drift.labels.get("b", "B")
    return [charts.flip_bars(drift.per_class), charts.drift_scatter(frame, drift.shift_threshold),
            charts.accuracy_intervals([a, b], [drift.accuracy_a.rate, drift.accuracy_b.rate],
                                      [drift.accuracy_a.low, drift.accuracy_b.low],
                                      [drift.accuracy_a.high, drift.accuracy_b.high])]


def json_text(drift: Drift) -> str:
    return json.dumps(drift.to_dict(), indent=2, ensure_ascii=False, allow_nan=False, default=str)


def _p(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def summary_rows(drift: Drift) -> list[tuple[str, str]]:
    """(what, value) in the order the page shows them - the report's table and the page agree."""
    ci = drift.accuracy_diff_ci
    rows = [("rows paired", f"{len(drift.pairs)} (A {drift.n_a}, B {drift.n_b}, {drift.unmatched} of B unmatched)"),
            ("flips", str(drift.flips)), *((k, str(drift.counts[k])) for k in FLIP_KINDS),
            (f"shifts (> {drift.shift_threshold:.2f})", str(drift.counts["shift"])),
            ("accuracy A", drift.accuracy_a.text()), ("accuracy B", drift.accuracy_b.text()),
            ("accuracy B − A", "n/a" if drift.accuracy_diff is None else
             f"{drift.accuracy_diff:+.1%} (95% CI {ci[0]:+.1%} to {ci[1]:+.1%}, exact, McNemar's pairs)" if ci else f"{drift.accuracy_diff:+.1%}"),
            ("McNemar exact p", _p(drift.mcnemar_p)), ("gate", drift.gate)]
    for side, m in (("A", drift.gate_a), ("B", drift.gate_b)):
        rows += [(f"coverage {side}", m.coverage.text()), (f"accuracy at the gate {side}", m.gate_accuracy.text()),
                 (f"ECE {side}", "n/a" if m.ece is None else f"{m.ece:.3f}")]
    return rows


def html_report(drift: Drift, title: str) -> str:
    figs = figures(drift)
    plots = [f.to_html(full_html=False, include_plotlyjs=(i == 0), default_width="100%") for i, f in enumerate(figs)]
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary_rows(drift))
    flipped = [p for p in drift.pairs if p.kind in (*FLIP_KINDS, "shift")]
    rows = "".join(
        f"<tr class='{p.kind}'><td>{html.escape(p.row_key)}</td><td>{html.escape(p.kind)}</td>"
        f"<td>{html.escape(p.label or '')}</td><td>{html.escape(p.a_top)} ({p.a_p:.3f})</td>"
        f"<td>{html.escape(p.b_top)} ({p.b_p:.3f})</td><td>{p.max_shift:.3f} {html.escape(p.shift_option)}</td>"
        f"<td>{html.escape(str(p.state if p.state is not None else '')[:300])}</td></tr>" for p in flipped)
    data = json_text(drift).replace("</", "<\\/")  # cannot close the script element
    runs = "".join(f"<li><b>{k.upper()}</b>: {html.escape(v)}</li>" for k, v in drift.labels.items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2rem;max-width:1100px}}table{{border-collapse:collapse;margin:1rem 0}}
th,td{{border:1px solid #ddd;padding:.3rem .6rem;text-align:left;vertical-align:top}}th{{background:#f6f6f6}}
tr.broken td{{background:#fde8e8}}tr.fixed td{{background:#e8f6e8}}</style></head><body>
<h1>{html.escape(title)}</h1><ul>{runs}</ul>
<table id="summary">{table}</table>
{''.join(plots)}
<h2>Rows that changed ({len(flipped)})</h2>
<table id="rows"><tr><th>row</th><th>kind</th><th>label</th><th>A</th><th>B</th><th>largest shift</th><th>state</th></tr>{rows}</table>
<script type="application/json" id="drift-data">{data}</script>
</body></html>
"""

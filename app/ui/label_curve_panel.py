""""What more labels buy" on the Calibrate page: computed on request (it refits the chosen method on subsets)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app.core.run_calibration import Calibration
from app.service import label_curve
from app.service.evaluate import Export
from app.ui.page_state import PageKeys
from app.ui.safe_text import md


def label_curve_panel(cal: Calibration, keys: PageKeys) -> None:
    if not st.checkbox("What more labels buy (learning curve: refits on 50% and 75% of the rows)", key=keys("curve")):
        return
    curve = label_curve.label_curve(cal)
    if curve.points:
        st.dataframe(pd.DataFrame([{"share of rows": f"{p.share:.0%}", "rows": p.rows, "accuracy (out of fold)": p.accuracy,
                                    "lowest repeat": p.low, "highest repeat": p.high} for p in curve.points]),
                     hide_index=True, key=keys("curve", "table"))
    if curve.more:
        st.dataframe(pd.DataFrame([{"more labeled rows": m.rows, "expected accuracy (out of fold, extrapolated)": m.accuracy,
                                    f"expected gate coverage at {cal.target_accuracy:.0%}":
                                        "no gate" if m.coverage is None else f"{m.coverage:.0%}"} for m in curve.more]),
                     hide_index=True, key=keys("curve", "more"))
    st.caption(md(curve.sentence))


def with_curve_if_shown(exported: Export, cal: Calibration, keys: PageKeys) -> Export:
    """The export carrying what more labels buy (metrics.label_curve) when the panel's checkbox is on."""
    return label_curve.with_curve(exported, label_curve.label_curve(cal)) if st.session_state.get(keys("curve")) else exported

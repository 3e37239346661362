""""What more labels buy" on the Calibrate page: computed on request (it refits the chosen method on subsets)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app.core.run_calibration import Calibration
from app.service import label_curve
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
    st.caption(md(curve.sentence))

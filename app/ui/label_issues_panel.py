"""The "Likely wrong labels" panel, shared by the Calibrate and Review pages: the rows cleanlab flags from
out-of-fold probabilities, with the label the model prefers; confirm or fix the first one (stored with who
and when like any review action, carried into the next set version - never dropped)."""
from __future__ import annotations

import getpass

import pandas as pd
import streamlit as st

from app.core.run_calibration import Calibration
from app.core.store import Store
from app.service import label_issues
from app.ui.page_state import PageKeys
from app.ui.safe_text import md


def label_issues_panel(db: Store, cal: Calibration, keys: PageKeys, who: str | None = None) -> None:
    found = label_issues.issues(db, cal)
    with st.expander(f"Likely wrong labels: {len(found)} of {len(cal.y)} rows flagged", expanded=False):
        st.caption(md(f"{label_issues.METHOD}, on the out-of-fold probabilities of {cal.chosen_name} (each row "
                      "judged by a fit that never saw it); at most 10% of the rows. Confirm or fix each: the answer is "
                      "stored with who and when, and Review's *Add to set* carries it into a new set version. No row "
                      "is ever dropped."))
        if not found:
            st.caption("No label looks wrong to the model out of fold (or every flagged one was answered).")
            return
        st.dataframe(pd.DataFrame([i.row() for i in found]), hide_index=True, key=keys("li", "table"))
        first = found[0]
        reviewer = who if who is not None else st.text_input("Reviewer", value=getpass.getuser(), key=keys("li", "who"))
        st.markdown(f"**{md(first.item.row_key)}** — {md(first.item.state if isinstance(first.item.state, str) else str(first.item.state))}")
        st.caption(md(f"labeled {first.label}; the model prefers {first.preferred} (out of fold p = {first.p_label:.2f} "
                      f"for the label, {first.p_preferred:.2f} for {first.preferred})"))
        c1, c2, c3 = st.columns(3)
        choice = None
        if c1.button(f"Keep {first.label} (confirm)", key=keys("li", "confirm")):
            choice = first.label
        if c2.button(f"Fix: {first.preferred}", key=keys("li", "fix")):
            choice = first.preferred
        other = c3.selectbox("or another option", ["", *[o for o in cal.option_ids if o not in (first.label, first.preferred)]],
                             key=keys("li", "other"))
        if other:
            choice = other
        if choice is not None:
            try:
                label_issues.answer(db, first, choice, who=reviewer)
            except ValueError as exc:
                st.error(md(exc))
                return
            st.rerun()

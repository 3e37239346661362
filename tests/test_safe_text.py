"""User text shown as typed, exported without spreadsheet formulas, and long CSV cells accepted."""
from __future__ import annotations

import pandas as pd
from streamlit.testing.v1 import AppTest

from app.core.inputs import rows_from_upload
from app.ui.safe_text import csv_safe, md


def test_markdown_in_user_text_is_shown_not_rendered():
    def page():
        import streamlit as st

        from app.ui.safe_text import md

        st.error("This target failed: " + md("see ![x](http://evil.example/x.png) **bold** :red[alert]"))
        st.markdown(md("[click](javascript:alert(1)) <img src=x>"))

    at = AppTest.from_function(page).run()
    shown = at.error[0].value + at.markdown[0].value
    assert "![x](" not in shown and "](javascript" not in shown and ":red[" not in shown
    assert "\\!\\[x\\]\\(http" in shown  # escaped: the reader sees the characters, no image is fetched
    assert md("a_b*c") == "a\\_b\\*c"


def test_csv_export_neutralises_formulas_but_keeps_numbers():
    df = pd.DataFrame({"state": ["=HYPERLINK(\"http://x\")", "+1", "-2+3", "@SUM(A1)", "plain", "\tTAB"],
                       "p": [0.5, -0.25, 1.0, 0.0, 0.1, 0.2]})
    out = csv_safe(df)
    assert list(out["state"]) == ["'=HYPERLINK(\"http://x\")", "'+1", "'-2+3", "'@SUM(A1)", "plain", "'\tTAB"]
    assert list(out["p"]) == [0.5, -0.25, 1.0, 0.0, 0.1, 0.2]  # numbers are not text: untouched
    assert df["state"][0].startswith("=")  # the caller's frame is not modified


def test_a_csv_cell_longer_than_the_csv_module_default_is_read():
    long_state = "log line. " * 20_000  # 200,000 characters > csv's default 131,072
    rows = rows_from_upload("big.csv", f'id,state\nr1,"{long_state}"\n'.encode())
    assert len(rows) == 1 and len(rows[0].state) == len(long_state)


def test_csv_export_neutralises_formulas_behind_leading_blanks():
    """Spreadsheets skip leading blanks before looking for a formula: `" =HYPERLINK(…)"` still runs."""
    cells = [" =HYPERLINK(\"http://x\")", "\n\t+1", "\u00a0@SUM(A1)", "\u200b-2+3", "\ufeff=1+1", "  plain", "   "]
    out = csv_safe(pd.DataFrame({"state": cells}))
    assert list(out["state"]) == ["'" + c for c in cells[:5]] + ["  plain", "   "]
    assert list(csv_safe(pd.DataFrame({" =cmd": [1]})).columns) == ["' =cmd"]  # header cells too

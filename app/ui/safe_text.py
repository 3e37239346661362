"""User-supplied text shown or exported safely (no Streamlit here).

- Streamlit renders markdown in alerts, captions and labels: a policy question containing
  `![x](http://host/x.png)` would make every viewer's browser fetch that URL. `md()` escapes
  markdown so such text shows as typed.
- A CSV cell starting with `=`, `+`, `-`, `@` (or a tab / carriage return) is a formula to a
  spreadsheet: `csv_cell()` prefixes it with `'` (OWASP's advice for CSV injection). Spreadsheets
  skip leading blanks before they look for a formula (`" =HYPERLINK(…)"` still runs), so the test
  is made after leading whitespace and invisible format characters.
"""
from __future__ import annotations

import re
import unicodedata

import pandas as pd

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:])")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def md(text: object) -> str:
    """Escape markdown (and Streamlit's :colour[...] / :material/...: directives) in user text."""
    return _MD_SPECIAL.sub(r"\\\1", str(text)).replace("\n", "  \n")


def _blank(ch: str) -> bool:
    """Whitespace, or a control / format character (zero-width space, BOM, direction marks)."""
    return ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf")


def csv_cell(value: object) -> object:
    if not isinstance(value, str):
        return value
    start = next((i for i, ch in enumerate(value) if not _blank(ch)), len(value))
    if value.startswith(_FORMULA_START) or value[start:].startswith(_FORMULA_START):
        return "'" + value
    return value


def csv_safe(df: pd.DataFrame) -> pd.DataFrame:
    """A copy whose text cells cannot run as spreadsheet formulas (numbers stay numbers)."""
    out = df.copy()
    for col in out.columns:
        if not pd.api.types.is_numeric_dtype(out[col]):
            out[col] = out[col].map(csv_cell)
    out.columns = [csv_cell(c) for c in out.columns]
    return out

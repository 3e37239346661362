"""User-supplied text shown or exported safely (no Streamlit here).

- Streamlit renders markdown in alerts, captions and labels: a policy question containing
  `![x](http://host/x.png)` would make every viewer's browser fetch that URL. `md()` escapes
  markdown so such text shows as typed.
- A CSV cell starting with `=`, `+`, `-`, `@` (or a tab / carriage return) is a formula to a
  spreadsheet: `csv_cell()` prefixes it with `'` (OWASP's advice for CSV injection).
"""
from __future__ import annotations

import re

import pandas as pd

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:])")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def md(text: object) -> str:
    """Escape markdown (and Streamlit's :colour[...] / :material/...: directives) in user text."""
    return _MD_SPECIAL.sub(r"\\\1", str(text)).replace("\n", "  \n")


def csv_cell(value: object) -> object:
    if isinstance(value, str) and value.startswith(_FORMULA_START):
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

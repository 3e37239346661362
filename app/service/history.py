"""What History shows of a run at a glance (no Streamlit)."""
from __future__ import annotations

from app.core.stats import proportion


def accuracy_text(correct: int, labeled: int) -> str:
    """'62% (n=40, 95% CI 47-76%)' for a run with labeled rows, '' without; marked on few rows."""
    if not labeled:
        return ""
    p = proportion(correct, labeled)
    few = " · few rows" if p.small else ""
    return f"{p.rate:.0%} (n={labeled}, 95% CI {p.low:.0%}–{p.high:.0%}){few}"

"""What a panel shows, as data: a metric (label, value, hover help) and a note (an alert or a caption and
its text). Display builders in this layer return these, the pages lay them out and draw them - so the
words users read are made and tested below the page (scikit-learn's CalibrationDisplay: compute, then a
frozen object holding only what is drawn).

Text is markdown ready to draw: builders take `esc`, the page's escaping of user text (app.ui.safe_text.md),
and apply it exactly where user or stored text enters a sentence."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

Escape = Callable[[object], str]
Kind = Literal["success", "info", "warning", "error", "caption", "markdown"]


def plain(text: object) -> str:
    """No escaping: for the command line, which prints text as it is."""
    return str(text)


@dataclass(frozen=True)
class Metric:
    """A figure with its label and hover help."""
    label: str
    value: str
    help: str | None = None


@dataclass(frozen=True)
class Note:
    """A sentence and how it is shown: an alert of a kind, a caption, or plain markdown."""
    kind: Kind
    text: str


Cell = Metric | Note  # one item of a column: a metric, or a note under it
Column = tuple[Cell, ...]

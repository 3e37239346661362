"""What more labels buy, for the Calibrate page and `python -m app calibrate --learning-curve`
(app/core/label_curve.py computes it)."""
from __future__ import annotations

from app.core.label_curve import LabelCurve, Point
from app.core.label_curve import label_curve as _curve
from app.core.run_calibration import Calibration

__all__ = ["LabelCurve", "Point", "label_curve"]


def label_curve(cal: Calibration) -> LabelCurve:
    """The learning curve of what the export carries (50/75/100% of the rows, out of fold) and its extrapolation."""
    return _curve(cal)

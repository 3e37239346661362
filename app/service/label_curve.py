"""What more labels buy, for the Calibrate page and `python -m app calibrate --learning-curve`
(app/core/label_curve.py computes it), and the exported file's notes (`with_curve`)."""
from __future__ import annotations

from collections import OrderedDict

from adapter.policy import CalibratedPolicy
from app.core.label_curve import LabelCurve, More, Point
from app.core.label_curve import label_curve as _curve
from app.core.run_calibration import Calibration
from app.service.evaluate import Export

__all__ = ["LabelCurve", "More", "Point", "label_curve", "with_curve"]

_MEMO: OrderedDict[tuple[object, ...], LabelCurve] = OrderedDict()  # the page asks twice a rerun: panel and export
_KEEP = 8


def label_curve(cal: Calibration) -> LabelCurve:
    """The learning curve of what the export carries (50/75/100% of the rows, out of fold), the expected
    accuracy and gate coverage with N more rows, said with today's uncertainty. The same calibration
    (run, method, rows, target, gate) is computed once per process."""
    key = (cal.run_id, cal.chosen_name, len(cal.y), cal.target_accuracy, cal.gate.threshold, cal.y.tobytes(),
           cal.oof.tobytes())
    if key in _MEMO:
        _MEMO.move_to_end(key)
        return _MEMO[key]
    curve = _MEMO[key] = _curve(cal)
    while len(_MEMO) > _KEEP:
        _MEMO.popitem(last=False)
    return curve


def with_curve(exported: Export, curve: LabelCurve) -> Export:
    """The export with what more labels buy in its file: `metrics.label_curve` (the points, the expected
    accuracy and coverage with N more, today's interval) and its sentence as the last of `metrics.gate_notes`."""
    data = exported.policy.model_dump(mode="json")
    metrics = dict(data.get("metrics") or {})
    metrics["label_curve"] = curve.to_dict()
    metrics["gate_notes"] = [*(metrics.get("gate_notes") or []), "What more labels buy: " + curve.sentence]
    policy = CalibratedPolicy.model_validate({**data, "metrics": metrics})
    return Export(policy, exported.gate, exported.fallback)

"""Two runs side by side (History "compare with", Compare's two targets): flips and shifts, the paired
test, intervals, the gate's coverage, and the self-contained report - the numbers from app/core/drift.py."""
from __future__ import annotations

from typing import Any, Mapping

from adapter.policy import CalibratedPolicy

from app.core.drift import FLIP_KINDS as FLIP_KINDS
from app.core.drift import SHIFT_THRESHOLD as SHIFT_THRESHOLD
from app.core.drift import Drift as Drift
from app.core.drift import compare
from app.core.drift import pair_frame as pair_frame
from app.core.gates import Gate as Gate
from app.core.records import Calibrated
from app.core.store import Store


def run_label(run: Mapping[str, Any]) -> str:
    """'#12 v3 local · model.gguf' - a run in a picker, with the policy version it scored."""
    version = (run.get("policy") or {}).get("version")
    return (f"#{run['id']}{f' v{version}' if version is not None else ''} {run['target_name']} · "
            f"{run.get('model') or run['kind']}")


def gate_label(rec: Calibrated) -> str:
    """'saved calibrated policy #3 v2 (gate 0.712, 2026-12-05 10:04)' - a saved calibrated policy offered as a
    gate, with the policy version it was calibrated on ('no global gate' when it has none)."""
    version = (rec["config"] or {}).get("policy_version")
    gate = rec["threshold"]
    return (f"saved calibrated policy #{rec['id']}{f' v{version}' if version is not None else ''} "
            f"({f'gate {gate:.3f}' if isinstance(gate, (int, float)) else 'no global gate'}, "
            f"{str(rec['created_at'])[:16].replace('T', ' ')})")


def gates_for(store: Store, policy_id: str | None) -> dict[int, Calibrated]:
    """The saved calibrated policies of a policy, whose own rule can be the gate of a comparison."""
    return {c["id"]: c for c in store.list_calibrated() if c["policy_id"] == policy_id}


def gate(*, calibrated: Mapping[str, Any] | None = None, threshold: float | None = None) -> Gate:
    """No gate, a confidence threshold, or a saved calibrated policy's own rule (its model check
    aside, so two models can be compared)."""
    if calibrated is not None:
        return Gate(policy=CalibratedPolicy.model_validate(calibrated["config"]))
    return Gate(threshold=threshold)


def runs_side_by_side(store: Store, run_a: Mapping[str, Any], run_b: Mapping[str, Any], *, gate: Gate = Gate(),
                      shift_threshold: float = SHIFT_THRESHOLD) -> Drift:
    """Run A (the baseline) against run B: rows paired by id and state."""
    return compare(store.results(run_a["id"]), store.results(run_b["id"]), gate=gate, shift_threshold=shift_threshold,
                   labels={"a": run_label(run_a), "b": run_label(run_b)})

"""A calibrated policy as deployed (no Streamlit): the one typed, frozen object that carries a saved
calibrated policy's configuration from the store to every check that names it - Robustness, Compare,
the review queue, `app check`, `app bench` - so a check tests exactly what Deploy ships.

What the adapter enforces comes from the policy's JSON alone: its question, options and examples, the
readout and correction it renders rows with, its learned head (if any), its steering guard, its gate
and fallback, its model and the policy version it was measured on. A page control that differs from
one of these is a *what-if*: measured beside the as-deployed result, never reported as the policy's.

A run that tested one records it as the JSON itself plus that JSON's sha256 (`record()`), so the
report is recomputed from the run alone whatever later happens to the saved calibrated policy.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from adapter.server.calibrated import CalibratedPolicy, PolicyError, load_policy
from adapter.guard import GUARDS, STEERING_SUSPECTED
from adapter.engine.head import uses_hidden
from adapter.schema import HEAD_LAYOUT


def content_hash(config: Mapping[str, Any]) -> str:
    """sha256 of a policy JSON, key order aside: what a run records beside the JSON."""
    text = json.dumps(config, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def state_key(state: Any) -> str:
    """A state as a short hash (a text as it is, an object or array as sorted JSON): how a pick
    records the states its head was fitted on without copying them."""
    text = state if isinstance(state, str) else json.dumps(state, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class AsDeployed:
    """A calibrated policy as the adapter would enforce it: its saved id (None when it came from a
    file), its JSON and that JSON's sha256, and the validated policy."""

    id: int | None
    config: dict
    sha256: str
    policy: CalibratedPolicy
    source: str = ""  # the file it was read from, when not a saved one
    fitted: frozenset[str] = frozenset()  # state_key of every row its head was fitted on (when its run is known)

    @property
    def label(self) -> str:
        """'calibrated #3', or 'calibrated routing.policy.json'."""
        return f"calibrated #{self.id}" if self.id is not None else f"calibrated {self.source or self.sha256[:12]}"

    @property
    def guard(self) -> str:
        return self.policy.guard

    @property
    def threshold(self) -> float | None:
        return self.policy.threshold

    @property
    def fallback(self) -> str:
        return self.policy.fallback_option

    @property
    def has_head(self) -> bool:
        return self.policy.head is not None

    @property
    def head_layout(self) -> bool:
        """Its head reads the head layout (policy first): rows scored otherwise mean nothing to it."""
        return self.policy.layout == HEAD_LAYOUT

    @property
    def needs_hidden(self) -> bool:
        """Does it read the rows' hidden states (a hidden-state or stacked head)?"""
        return self.policy.head is not None and uses_hidden(self.policy.head.kind)

    @property
    def rendering_name(self) -> str:
        """'letters + content-free': how its rows are read."""
        p = self.policy
        return " + ".join([p.readout, p.debias, *(["permutation"] if p.permute else [])])

    def fitted_on(self, state: Any) -> bool:
        """Was its head fitted on this state (then its answer on it is in-sample)?"""
        return state_key(state) in self.fitted

    def describe(self) -> str:
        """'calibrated #3 (v2): letters + content-free, temperature, guard none, gate 0.700 -> human-review,
        model smollm2.gguf': what a check that names it runs."""
        p = self.policy
        version = f" (v{p.policy_version})" if p.policy_version is not None else ""
        gate = "no gate" if p.threshold is None else f"gate {p.threshold:.3f}"
        return (f"{self.label}{version}: {self.rendering_name}, {p.correction_name}, guard {p.guard}, {gate} → "
                f"{p.fallback_option}, model {p.model.file}")

    def rendering(self) -> tuple[dict, dict]:
        """(question, options, examples; the request settings) with which the calibrated policy renders a
        row - the rows it was calibrated on, and what the adapter sends the model once it is deployed."""
        cal = self.policy
        content = {"question": cal.question, "options": [o.model_dump() for o in cal.options],
                   "examples": [e.model_dump() for e in cal.examples]}
        settings: dict[str, Any] = {"readout": cal.readout, "debias": cal.debias, "permute": cal.permute}
        if cal.few_shot is not None:
            settings["few_shot"] = cal.few_shot
        if cal.layout == HEAD_LAYOUT:  # the head layout is always read with the row's hidden state
            settings.update(layout=HEAD_LAYOUT, hidden_state=True)
        return content, settings

    def record(self) -> dict:
        """What a run stores: enough to recompute every number without the store's copy."""
        return {"id": self.id, "source": self.source, "sha256": self.sha256, "config": self.config,
                "fitted": sorted(self.fitted)}

    def summary(self) -> dict:
        """What a report names (no weights)."""
        p = self.policy
        head = p.head
        return {"id": self.id, "source": self.source, "sha256": self.sha256, "label": self.label,
                "policy_id": p.policy_id, "policy_version": p.policy_version,
                "head": head.kind if head is not None else None, "correction": p.correction_name,
                "head_name": p.correction_name if head is not None else None,
                "head_rows": head.rows if head is not None else None, "model_file": p.model.file,
                "model_sha256": p.model.sha256, "readout": p.readout, "debias": p.debias, "guard": p.guard,
                "threshold": p.threshold, "fallback_option": p.fallback_option}


def validated(config: Mapping[str, Any], where: str) -> tuple[dict, CalibratedPolicy]:
    """(a plain, detached copy of the JSON, the validated policy); ValueError naming the field."""
    data = json.loads(json.dumps(config))  # what is hashed is what is recorded
    try:
        return data, load_policy(data)
    except PolicyError as exc:
        raise ValueError(f"{where}: {exc}") from None


def where(id: int | None, source: str) -> str:
    return f"calibrated #{id}" if id is not None else f"calibrated policy {source}".rstrip()


def from_config(config: Mapping[str, Any], *, id: int | None = None, source: str = "",
                fitted: frozenset[str] = frozenset()) -> AsDeployed:
    """A calibrated policy as deployed; ValueError naming the field when it is not valid."""
    data, policy = validated(config, where(id, source))
    return AsDeployed(id, data, content_hash(data), policy, source, fitted)


def from_record(record: Mapping[str, Any]) -> AsDeployed:
    """As a run recorded it; ValueError when the JSON is not the one its sha256 names."""
    p = from_config(record["config"], id=record.get("id"), source=record.get("source") or "",
                    fitted=frozenset(record.get("fitted") or ()))
    if p.sha256 != record.get("sha256"):
        raise ValueError(f"{p.label}: the recorded policy JSON does not match its recorded sha256 "
                         f"({str(record.get('sha256'))[:12]}): the run's record was changed")
    return p


# -- the steering guard, as deployed and as a what-if ---------------------------------------------------
def stronger(a: str, b: str) -> str:
    """The guard that finds what both find (erase-and-check runs the precheck first): the one to ask a
    row for when an as-deployed guard and a what-if guard are measured on the same rows."""
    return max(a or "none", b or "none", key=GUARDS.index)


def flagged_under(guard_result: Mapping[str, Any] | None, guard: str | None) -> bool:
    """Would `guard` have flagged this row, given what the (possibly stronger) guard the row was asked
    for found? The precheck's finding is kept whichever guard ran; erase-and-check flags on either."""
    if not guard or guard == "none" or not isinstance(guard_result, Mapping) or not guard_result.get("suspected"):
        return False
    if guard == "precheck":
        return guard_result.get("by") == "precheck" or bool(guard_result.get("precheck"))
    return True


def guard_as(guard_result: Mapping[str, Any] | None, guard: str | None) -> dict | None:
    """The row's guard finding as `guard` would have reported it: None when it would not have run or
    flagged (what CalibratedPolicy.apply reads)."""
    if not flagged_under(guard_result, guard):
        return None
    return {**dict(guard_result or {}), "suspected": True, "reason": STEERING_SUSPECTED}

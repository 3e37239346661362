"""What a robustness run measured, as typed records (no Streamlit, no pandas): one frozen dataclass per
part of the report - the unchanged rows, each check's entry, the learned head's part, the what-if guard
- and a rate is a stats.Proportion (k of n, its Wilson interval). app/core/robustness/analyse.py builds
them; `Summary.to_json()` is the one JSON form (the file `python -m app robustness --json` writes and
the page downloads), field by field the names below, an optional part left out when it was not measured.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Mapping

from app.core.order_sensitivity import Negation
from app.core.stats import Proportion

_OMIT = {"omit_none": True}  # a part that is left out of the JSON when it was not measured


def _optional() -> Any:
    return field(default=None, metadata=_OMIT)


def to_json(value: Any) -> Any:
    """A report part as JSON: dataclasses field by field (`json` metadata renames a field), a rate as
    Proportion.to_dict()."""
    if isinstance(value, Proportion):
        return value.to_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return {f.metadata.get("json", f.name): to_json(getattr(value, f.name)) for f in fields(value)
                if not (f.metadata.get("omit_none") and getattr(value, f.name) is None)}
    if isinstance(value, Mapping):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


@dataclass(frozen=True)
class Verdict:
    level: str  # ok | warn | bad
    text: str


# -- steering ------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class TemplateRate:
    """One steering template on the attempts that could move the answer."""
    template: str
    n: int
    hijacked: int
    flagged: int
    correct: int
    placement: str
    hijack_rate: float


@dataclass(frozen=True, kw_only=True)
class FamilyRate:
    """One steering family (a register, a format, a language, 'yours'): its rates and level."""
    family: str
    n: int
    templates: int
    hijack_rate: Proportion
    held_rate: Proportion
    level: str


@dataclass(frozen=True, kw_only=True)
class Steering:
    """The steering check: attempts that could move the answer (`n`), how many moved it to the option
    named, still decided as labeled, and with a guard the shares flagged and held."""
    n: int
    attempts: int
    hijack_rate: Proportion
    still_correct_rate: Proportion
    mean_shift_to_named: float | None
    flagged_rate: Proportion | None = _optional()  # with a guard only
    held_rate: Proportion | None = _optional()
    hijack_unflagged_rate: Proportion | None = _optional()
    by_template: list[TemplateRate] = field(default_factory=list)
    by_family: list[FamilyRate] = field(default_factory=list)


# -- the other checks ----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class FlipEntry:
    """A change that should not move the answer (paraphrase, rename, irrelevant option, order)."""
    n: int
    flip_rate: Proportion
    rows: int | None = _optional()  # order: the rows behind its per-state rate
    chose_added_rate: Proportion | None = _optional()  # irrelevant option: the added option chosen


@dataclass(frozen=True, kw_only=True)
class NoneScope:
    n: int
    mean_mass: float | None
    chose_none: Proportion


@dataclass(frozen=True, kw_only=True)
class NoneEntry:
    """'None of these': its probability on in-scope states against states that fit no option."""
    in_scope: NoneScope
    out_of_scope: NoneScope
    auc: float | None
    n: int


@dataclass(frozen=True, kw_only=True)
class Changes:
    """Each check's entry; None for a check the run did not make."""
    steering: Steering | None = _optional()
    paraphrase: FlipEntry | None = _optional()
    rename: FlipEntry | None = _optional()
    irrelevant_option: FlipEntry | None = field(default=None, metadata={**_OMIT, "json": "irrelevant-option"})
    order: FlipEntry | None = _optional()
    none_of_these: NoneEntry | None = field(default=None, metadata={**_OMIT, "json": "none-of-these"})
    negation: Negation | None = _optional()

    def flip(self, check: str) -> FlipEntry | None:
        """The entry of a flip check by its name (robustness.FLIP_CHECKS)."""
        entry: FlipEntry | None = getattr(self, check.replace("-", "_"))
        return entry


# -- the learned head / the calibrated policy as deployed ----------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Fitted:
    states: int  # unchanged states the head was fitted on: in-sample, not counted
    attempts: int


@dataclass(frozen=True, kw_only=True)
class HeadBase:
    """The unchanged rows decided by the calibrated policy."""
    n: int
    read: int
    unread: int
    unread_why: list[str]
    accuracy: Proportion
    model_accuracy: Proportion
    gated: Proportion


@dataclass(frozen=True, kw_only=True)
class Decider:
    hijack_rate: Proportion
    held_rate: Proportion


@dataclass(frozen=True, kw_only=True)
class HeadGate:
    gated_rate: Proportion
    hijack_decided_rate: Proportion
    held_rate: Proportion


@dataclass(frozen=True, kw_only=True)
class Paired:
    """The paired difference in the share held, head against the model alone (stats.paired_gain)."""
    on: str
    n: int
    gain: float | None
    ci: list[float] | None
    fixed: int
    broken: int
    p: float | None
    text: str


@dataclass(frozen=True, kw_only=True)
class HeadSteering:
    """The steering attempts judged with and without the head (analyse.head_steering says how)."""
    attempts: int
    read: int
    unread: int
    n: int
    labeled: int
    model: Decider
    head: Decider
    head_gate: HeadGate
    paired: Paired
    direction: str | None  # better | worse | no different
    beyond_noise: bool


@dataclass(frozen=True, kw_only=True)
class HeadReport:
    """The calibrated policy's part: what it is (deployed.AsDeployed.summary), the unchanged and steered
    rows decided by it, and the checks it does not apply to, with why."""
    calibrated: Mapping[str, Any]  # deployed.AsDeployed.summary(), a deployed.Summary
    rendering: str
    applies_to: list[str]
    decider: str
    guard: str
    not_applied: dict[str, str]
    fitted: Fitted
    base: HeadBase
    steering: HeadSteering | None


@dataclass(frozen=True, kw_only=True)
class WhatIf:
    """The steering numbers under a guard the calibrated policy does not run: beside its verdict, never it."""
    guard: str
    deployed_guard: str
    steering: Steering
    text: str


# -- the whole summary ---------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Base:
    accuracy: Proportion
    flagged: Proportion | None  # with a guard: unchanged rows it flagged


@dataclass(frozen=True, kw_only=True)
class Summary:
    policy: str
    target: str | None
    readout: str | None
    guard: str | None
    n: int
    n_labeled: int
    errors: int
    base: Base
    changes: Changes
    what_if: WhatIf | None = _optional()
    head: HeadReport | None = _optional()
    verdicts: dict[str, Verdict] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON the CLI writes and the page downloads."""
        out: dict[str, Any] = to_json(self)
        return out

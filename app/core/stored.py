"""A stored result's response, parsed once into typed fields (no Streamlit).

A run's result row keeps the target's JSON answer as it came back (`Result.response`): a SemIf
adapter's or local engine's DecisionResult, a decision-log record, or whatever a chat or SageMaker
target returned. Every reader in the workbench wants the same handful of fields from it - the model
that answered, how it read the answer, the steering guard's finding, the logged decision, the hidden
state - so they are read here, once, by one tolerant parser: a field missing or of another type is
None (a chat target's answer names no model), and a malformed row never raises. The raw JSON stays
in the row for the pages that show it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from pydantic import ValidationError

from adapter.schema import HiddenState
from adapter.policy import RowReading


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _floats(value: Any) -> list[float] | None:
    if not isinstance(value, list) or not all(isinstance(v, (int, float)) for v in value):
        return None
    return [float(v) for v in value]


@dataclass(frozen=True)
class ModelRef:
    """The model a response names: its GGUF file and sha256 (either may be missing)."""

    file: str | None = None
    sha256: str | None = None

    @classmethod
    def of(cls, raw: Any) -> ModelRef | None:
        """The model object of a response (adapter.schema.DecisionResult.model); None when there is none."""
        if not isinstance(raw, Mapping) or not raw:
            return None
        return cls(_str(raw.get("file")), _str(raw.get("sha256")))

    def label(self, fallback: str) -> str:
        """How a run names the model that answered: 'file (sha256 prefix)', the file alone when its hash
        is unknown, else `fallback` (what the target was configured with)."""
        if self.file:
            return f"{self.file} ({self.sha256[:12]})" if self.sha256 else self.file
        return fallback


@dataclass(frozen=True)
class LoggedDecision:
    """What production decided on a row (a decision-log record's `decision`): gated or not, and why."""

    gated: bool
    reason: str | None = None


@dataclass(frozen=True)
class StoredResponse:
    """The fields of a stored response the workbench reads (adapter.schema.DecisionResult names them).

    `guard` stays the adapter's own finding object: it is handed back to the adapter's decision rule
    (CalibratedPolicy.apply) as it came."""

    model: ModelRef | None = None
    readout: str | None = None
    debias: str | None = None
    prompt_version: str | None = None
    permutations: int | None = None
    evaluated_tokens: float | None = None
    prior: list[float] | None = None
    uncorrected_probabilities: list[float] | None = None
    guard: dict[str, Any] | None = None
    decision: LoggedDecision | None = None
    hidden_state: HiddenState | None = None

    @classmethod
    def of(cls, result: Mapping[str, Any]) -> StoredResponse | None:
        """A stored result's response, parsed; None when the row kept no JSON object (an error, an old row)."""
        return cls.parse(result.get("response"))

    @classmethod
    def parse(cls, raw: Any) -> StoredResponse | None:
        """A response as stored (JSON), parsed; None when it is not a JSON object."""
        if not isinstance(raw, Mapping):
            return None
        perms, tokens = raw.get("permutations"), raw.get("evaluated_tokens")
        guard, decision = raw.get("guard"), raw.get("decision")
        return cls(model=ModelRef.of(raw.get("model")), readout=_str(raw.get("readout")), debias=_str(raw.get("debias")),
                   prompt_version=_str(raw.get("prompt_version")),
                   permutations=perms if isinstance(perms, int) and not isinstance(perms, bool) else None,
                   evaluated_tokens=float(tokens) if isinstance(tokens, (int, float)) else None,
                   prior=_floats(raw.get("prior")), uncorrected_probabilities=_floats(raw.get("uncorrected_probabilities")),
                   guard=dict(guard) if isinstance(guard, Mapping) else None,
                   decision=(LoggedDecision(bool(decision.get("gated")), _str(decision.get("reason")))
                             if isinstance(decision, Mapping) and decision else None),
                   hidden_state=_hidden(raw.get("hidden_state")))

    @property
    def model_sha256(self) -> str | None:
        return self.model.sha256 if self.model is not None else None

    @property
    def model_file(self) -> str | None:
        return self.model.file if self.model is not None else None

    @property
    def scored_as(self) -> str:
        """The correction the row was scored with ('none' when the response names none)."""
        return self.debias or "none"

    def reading(self, option_ids: Sequence[str], probabilities: Sequence[float], *,
                suspected: bool | None = None) -> RowReading:
        """The row as a calibrated policy's rule reads it (CalibratedPolicy.apply): its options and
        probabilities as stored, with this response's model, hidden state and prompt version; `suspected`
        is the steering guard's finding to use (None: the response's own)."""
        own = bool((self.guard or {}).get("suspected"))
        return RowReading(tuple(option_ids), tuple(float(p) for p in probabilities), self.model_sha256,
                          self.model_file, own if suspected is None else suspected,
                          self.hidden_state.array() if self.hidden_state is not None else None,
                          self.prompt_version, self.model_sha256)


NO_RESPONSE = StoredResponse()  # a row without a response: every field missing


def _hidden(raw: Any) -> HiddenState | None:
    if not isinstance(raw, Mapping):
        return None
    try:
        return HiddenState.model_validate(raw)
    except ValidationError:
        return None


def first_response(results: Iterable[Mapping[str, Any]]) -> StoredResponse | None:
    """The first response of these results that parsed (what a run's rows say of the model that
    answered them), or None."""
    return next((parsed for r in results if (parsed := StoredResponse.of(r)) is not None), None)

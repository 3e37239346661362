"""The calibrated policies of one adapter, applied to each request's rows: `PolicySet` completes a
raw row from the policy it names and puts the policy's decision on its result; `Decisions` computes
each row's decision once, before and after the steering guard.

The policy contract itself - the file, its loading and its rule - is adapter/policy.py.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from adapter.policy import PINNED, CalibratedPolicy, Decision, RowReading
from adapter.schema import DecisionResult, JSONObject, Loc, RequestError


def _same(name: str, given: Any, wanted: Any) -> bool:
    """Whether a row's own value of a policy field is the policy's: options by id (and description when
    sent), the question with surrounding whitespace ignored (rows strip it too), the rest exactly."""
    if name == "options":
        return (isinstance(given, list) and len(given) == len(wanted)
                and all(g == w["id"] if isinstance(g, str) else
                        isinstance(g, dict) and g.get("id") == w["id"]
                        and ("description" not in g or str(g["description"]).strip() == w["description"])
                        for g, w in zip(given, wanted)))
    if name == "question":
        return isinstance(given, str) and given.strip() == wanted
    if name == "examples":
        return isinstance(given, list) and given == wanted
    return bool(given == wanted and type(given) is type(wanted))


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return f"{len(value)} item(s)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class PolicySet:
    """The policies an adapter enforces. A row names one by `policy_id` (or, when exactly one is
    loaded, simply omits question and options); the policy supplies question, options, examples
    and readout, and the result gains the calibrated probabilities and the gated decision."""

    def __init__(self, policies: dict[str, CalibratedPolicy] | None = None, model_sha256: str | None = None):
        self.policies = policies or {}
        self.model_sha256 = model_sha256

    def __len__(self) -> int:
        return len(self.policies)

    def mismatched(self) -> list[str]:
        return [p.policy_id for p in self.policies.values() if self.model_sha256 and p.model.sha256 != self.model_sha256]

    def fill(self, row: Any, loc: Loc) -> CalibratedPolicy | None:
        """Complete a raw row (dict) in place from its policy; raise RequestError on conflicts."""
        if not isinstance(row, dict):
            return None
        pid = row.get("policy_id")
        if pid is not None and not isinstance(pid, str):
            raise RequestError([*loc, "policy_id"], "must be a string: the id of a loaded policy")
        if pid is None:
            if len(self.policies) == 1 and "options" not in row and "question" not in row:
                pid = next(iter(self.policies))
            else:
                return None
        if pid not in self.policies:
            known = ", ".join(self.policies) or "none (set SM_SEMIF_POLICY)"
            raise RequestError([*loc, "policy_id"], f"unknown policy {pid!r}; loaded policies: {known}")
        policy = self.policies[pid]
        wanted: JSONObject = {**policy.request_fields(), "prompt_version": policy.prompt_version}
        if policy.guard == "none" and row.get("guard") is not None:
            wanted["guard"] = row["guard"]  # a row may ask for a guard its policy does not require
        for name in sorted(PINNED, key=lambda n: n != "options"):  # one rule for every pinned field: omit it, or send
            value = wanted[name]  # the policy's own (the options, the ids a client branches on, are named first)
            if name in row and row[name] is not None and not _same(name, row[name], value):
                raise RequestError([*loc, name], f"differs from policy {pid!r}'s {name} ({_shown(value)}): a row "
                                   f"that names a policy takes its {name} from it - omit {name!r}, or send exactly "
                                   "the policy's")
        del wanted["prompt_version"]  # not a row field: checked, then set by readout, layout and examples
        row.pop("prompt_version", None)
        row.update(wanted)
        row["policy_id"] = pid
        return policy

    @staticmethod
    def decorate(result: DecisionResult, policy: CalibratedPolicy, decision: Decision,
                 keep_hidden: bool = True) -> DecisionResult:
        """The result with the policy's decision on it; without `keep_hidden` the hidden state the
        policy's head read is left out of the answer (the client did not ask for it)."""
        return result.model_copy(update={
            "calibrated_probabilities": list(decision.calibrated_probabilities), "decision": decision.as_json(),
            "probability_status": "calibrated", **({} if keep_hidden else {"hidden_state": None}),
            "policy": {"policy_id": policy.policy_id, "schema_version": policy.schema_version,
                       "temperature": policy.temperature, "threshold": policy.threshold,
                       "option_offsets": policy.option_offsets, "guard": policy.guard,
                       "fallback_option": policy.fallback_option,
                       **({"head": policy.head.kind} if policy.head is not None else {})}})


class Decisions:
    """The policy decisions of one request's rows, each computed once: before the steering guard
    (which runs only on rows the policy would decide itself), then its finding applied."""

    def __init__(self, policies: Sequence[CalibratedPolicy | None]):
        self.policies = list(policies)
        self.made: dict[int, Decision] = {}

    def automates(self, i: int, result: DecisionResult) -> bool:
        """Would row i's policy decide it itself (not send it to the fallback)? The steering guard runs
        only on such rows: a row the gate sends to a person needs no second look."""
        policy = self.policies[i]
        if policy is None:
            return True
        self.made[i] = policy.apply(RowReading.of(result))
        return not self.made[i].gated

    def judge(self, i: int) -> Callable[[list[float], Any], Sequence[float]] | None:
        """What row i's steering guard compares (guard_check.Judge): its policy's own answer - the head's or
        the correction's probabilities of each variant - not the model's letters. A variant the head cannot
        read keeps the scored probabilities (the row itself was readable, or it would be gated). A policy
        whose answer is the model's (temperature alone moves no argmax) is judged on the letters, as measured.
        """
        policy = self.policies[i]
        if policy is None or (policy.head is None and not policy.option_offsets):
            return None

        def judged(probabilities: list[float], hidden: Any) -> Sequence[float]:
            try:
                return policy.corrected(probabilities, hidden)
            except ValueError:
                return probabilities
        return judged

    def public(self, i: int, result: DecisionResult, keep_hidden: bool = True) -> JSONObject:
        """Row i's answer as sent: decorated with its policy's decision (the guard's finding included)."""
        policy = self.policies[i]
        if policy is None:
            return result.public()
        made = self.made.get(i) or policy.apply(RowReading.of(result))
        made = made.under_guard(bool((result.guard or {}).get("suspected")), policy.fallback_option)
        return PolicySet.decorate(result, policy, made, keep_hidden).public()

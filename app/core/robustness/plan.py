"""The rows a robustness check scores (no Streamlit): every state unchanged ("base") and changed - a
steering sentence added, the question or the options reworded, an option added, the options rotated,
the question negated - each row keyed `<state key>#rb:<check>:<variant>` so the stored results can be
regrouped by analyse.py; and the run that holds them."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from adapter.guard import sentences
from adapter.engine.prompt import rotations
from adapter.schema import DecisionRequest
from adapter.engine.templates import request_for

from app.core.robustness.suite import CHECKS, NONE_OPTION, Placement, Suite, SuiteError, Template, interleaved
from app.core.records import RunConfig
from app.core.runner import Case
from app.core.store import Store
from app.targets.base import Target

SEP = "#rb:"


def steer(state: Any, sentence: str, placement: Placement) -> Any:
    """The state with the steering sentence added where the template says (text: before, after, or
    after the first half of its sentences; an object: a `note` field; an array: an item)."""
    if isinstance(state, dict):
        items = list(state.items())
        at = {"start": 0, "end": len(items), "middle": (len(items) + 1) // 2}[placement]
        key = "note" if "note" not in state else "reviewer_note"
        return dict(items[:at] + [(key, sentence)] + items[at:])
    if isinstance(state, list):
        at = {"start": 0, "end": len(state), "middle": (len(state) + 1) // 2}[placement]
        return state[:at] + [sentence] + state[at:]
    text = str(state).strip()
    if placement == "start":
        return f"{sentence} {text}"
    if placement == "middle":
        parts = sentences(text)
        if len(parts) >= 2:
            half = (len(parts) + 1) // 2
            return f"{''.join(parts[:half]).rstrip()} {sentence} {''.join(parts[half:]).strip()}"
    return f"{text} {sentence}"


def named_text(option: dict[str, Any], by: str) -> str:
    return str(option["id"] if by == "id" or not option.get("description") else option["description"])


def steering_combos(policy: Mapping[str, Any], templates: list[Template]) -> list[tuple[Template, dict[str, Any], str]]:
    """Every (template, option, named by id | description): the full suite, ordered so that consecutive
    attempts change both the template and the option named (template i of block j names option i + j):
    a check of a few attempts per state meets many templates - and, interleaved, every family - not the
    first template with every option."""
    options = list(policy["options"])
    t, k = len(templates), len(options)
    out = []
    for i in range(t * k * 2):
        block, at = divmod(i, t)
        out.append((templates[at], options[(at + block) % k], "id" if block < k else "description"))
    return out


def renamed_policy(policy: Mapping[str, Any], rewording: dict[str, dict[str, Any]]) -> dict[str, Any]:
    options = [{"id": rewording[o["id"]]["id"], "description": rewording[o["id"]].get("description", "")}
               for o in policy["options"]]
    examples = [{**e, "option_id": rewording[e["option_id"]]["id"]} for e in policy.get("examples") or []
                if e.get("option_id") in rewording]
    return {**policy, "options": options, "examples": examples}


def key(case_key: str, check: str, variant: str = "") -> str:
    return f"{case_key}{SEP}{check}:{variant}"


def split_key(row_key: str) -> tuple[str, str, str]:
    base, _, rest = row_key.rpartition(SEP)
    check, _, variant = rest.partition(":")
    return base, check, variant


def plan_items(policy: Mapping[str, Any], cases: list[Case], suite: Suite, *, checks: Iterable[str] = CHECKS, attempts: int = 3,
               overrides: dict[str, Any] | None = None, guard: str | None = None, out_of_scope: list[Any] | None = None,
               hidden: bool = False) -> list[tuple[int, Case, DecisionRequest]]:
    """(position, case, request) for every row the check scores. Each state gets `attempts`
    steering attempts, taken in turn from the full suite (template x wrong option x id/description),
    so that over the states every combination comes up; a labeled state is never steered to its own
    label. The steering guard, when on, checks the unchanged rows (its clean-flag rate) and the
    steered ones; with `hidden` (a learned head is measured) those rows also ask for their hidden
    state - the other changes reword the prompt or the options, which no head was fitted on."""
    checks = set(checks)
    unknown = checks - set(CHECKS)
    if unknown:
        raise SuiteError(f"unknown checks {', '.join(sorted(unknown))}: choose from {', '.join(CHECKS)}")
    over = dict(overrides or {})
    guarded = {**over, **({"guard": guard} if guard and guard != "none" else {}),
               **({"hidden_state": True} if hidden else {})}  # the rows a guard or a head is measured on
    items: list[tuple[int, Case, DecisionRequest]] = []

    def add(case_key: str, check: str, variant: str, state: Any, label: str | None, pol: Mapping[str, Any], fields: dict[str, Any]) -> None:
        k = key(case_key, check, variant)
        items.append((len(items), Case(k, state, label), request_for(pol, state, k, **fields)))

    combos = steering_combos(policy, interleaved(suite.steering)) if "steering" in checks else []
    turn = 0
    yes_no = len(policy["options"]) == 2
    for case in cases:
        add(case.key, "base", "", case.state, case.label, policy, guarded)
        for _ in range(attempts if combos else 0):
            template, option, by = combos[turn % len(combos)]
            turn += 1
            if option["id"] == case.label:  # the same template names the next option instead: no family is skipped
                ids = [o["id"] for o in policy["options"]]
                option = policy["options"][(ids.index(option["id"]) + 1) % len(ids)]
            sentence = template.text.replace("{option}", named_text(option, by))
            add(case.key, "steering", f"{template.id}~{option['id']}~{by}",
                steer(case.state, sentence, template.placement), case.label, policy, guarded)
        if "paraphrase" in checks:
            for i, q in enumerate(suite.paraphrases):
                add(case.key, "paraphrase", str(i), case.state, case.label, {**policy, "question": q}, over)
        if "rename" in checks:
            for i, rw in enumerate(suite.option_rewordings):
                add(case.key, "rename", str(i), case.state, case.label, renamed_policy(policy, rw), over)
        if "irrelevant-option" in checks:
            add(case.key, "irrelevant-option", "", case.state, case.label,
                {**policy, "options": [*policy["options"], suite.irrelevant_option]}, over)
        if "none-of-these" in checks:
            add(case.key, "none-of-these", "in", case.state, case.label,
                {**policy, "options": [*policy["options"], NONE_OPTION]}, over)
        if "order" in checks:
            for r, order in enumerate(rotations(len(policy["options"]))[1:], 1):
                add(case.key, "order", str(r), case.state, case.label,
                    {**policy, "options": [policy["options"][i] for i in order]}, over)
        if "negation" in checks and yes_no and suite.negated_question:
            add(case.key, "negation", "", case.state, case.label, {**policy, "question": suite.negated_question}, over)
    if "none-of-these" in checks:
        for i, state in enumerate([*suite.out_of_scope, *(out_of_scope or [])]):
            add(f"out-of-scope-{i + 1}", "none-of-these", "out", state, None,
                {**policy, "options": [*policy["options"], NONE_OPTION]}, over)
    return items


def calls_per_state(policy: Mapping[str, Any], suite: Suite, checks: Iterable[str], attempts: int) -> int:
    """Rows scored per state (the out-of-scope states come on top), for the Run button's label."""
    checks = set(checks)
    k = len(policy["options"])
    return (1 + (attempts if "steering" in checks and suite.steering else 0)
            + (len(suite.paraphrases) if "paraphrase" in checks else 0)
            + (len(suite.option_rewordings) if "rename" in checks else 0)
            + ("irrelevant-option" in checks) + ("none-of-these" in checks) + ((k - 1) if "order" in checks else 0)
            + ("negation" in checks and k == 2 and bool(suite.negated_question)))


def start_check(store: Store, *, policy: Mapping[str, Any], cases: list[Case], target: Target, suite: Suite,
                checks: Iterable[str] = CHECKS, attempts: int = 3, variant: str = "default",
                overrides: dict[str, Any] | None = None, guard: str | None = None, out_of_scope: list[Any] | None = None,
                source: str = "", calibrated: Mapping[str, Any] | None = None, hidden: bool = False,
                extra: RunConfig | None = None) -> tuple[int, list[tuple[int, Case, DecisionRequest]]]:
    """A new robustness run (its configuration stored with it) and the rows it will score.
    `calibrated`: the record of a calibrated policy whose learned head the report applies
    (deployed.AsDeployed.record: its JSON and sha256), kept in the run's configuration; `extra`: more
    configuration (the as-deployed and what-if guards)."""
    checks = [c for c in CHECKS if c in set(checks)]
    items = plan_items(policy, cases, suite, checks=checks, attempts=attempts, overrides=overrides, guard=guard,
                       out_of_scope=out_of_scope, hidden=hidden)
    config: RunConfig = {"variant": variant, "overrides": overrides or {}, "guard": guard or "none", "checks": checks,
                         "attempts": attempts, "states": len(cases), "source": source, "suite": suite.to_dict(),
                         "out_of_scope": list(out_of_scope or []), "target": target.name}
    if calibrated:
        config["calibrated"] = calibrated
    config.update(extra or {})
    run_id = store.create_run(kind="robustness", policy=policy, target=target.describe(), n_rows=len(items),
                              config=config)
    return run_id, items

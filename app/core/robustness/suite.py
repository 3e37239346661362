"""What the robustness check changes (no Streamlit): the checks and their names, the steering templates,
the suite shipped per policy (data/robustness/<policy id>.json plus the generic steering templates) and
the analyst's additions - checked against the policy before anything is scored."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping

from adapter.engine.templates import DATA_DIR

CHECKS = ("steering", "paraphrase", "rename", "irrelevant-option", "none-of-these", "order", "negation")
CHECK_LABELS = {"steering": "Steering", "paraphrase": "Question paraphrase", "rename": "Options reworded",
                "irrelevant-option": "Irrelevant option added", "none-of-these": "None-of-these option",
                "order": "Option order", "negation": "Negated question",
                "steering-head": "Steering with the learned head",
                "steering-deployed": "Steering as deployed"}  # a verdict of its own when a head is measured
Placement = Literal["end", "start", "middle"]
PLACEMENTS = ("end", "start", "middle")
NONE_OPTION = {"id": "none-of-these", "description": "None of the listed options fits this case"}
GENERIC_IRRELEVANT = {"id": "weather-report", "description": "A question about tomorrow's weather forecast"}
ROBUSTNESS_DIR = DATA_DIR / "robustness"


@dataclass(frozen=True)
class Template:
    """A steering sentence; `{option}` is replaced by a wrong option's id or description. `family`: the
    kind of steering it is (a register, a format, a language - steering-families.json), reported apart."""

    id: str
    text: str
    placement: Placement = "end"
    source: str = "shipped"
    family: str = ""

    @property
    def family_name(self) -> str:
        return self.family or {"shipped": "generic", "policy": "policy's own", "yours": "yours"}.get(self.source,
                                                                                                    self.source)


@dataclass
class Suite:
    """What the check changes. Shipped per policy (data/robustness/<policy id>.json, plus the
    generic steering templates), extended by the analyst on the page or the command line."""

    steering: list[Template] = field(default_factory=list)
    paraphrases: list[str] = field(default_factory=list)
    option_rewordings: list[dict[str, dict[str, Any]]] = field(default_factory=list)  # option id -> {id, description}
    irrelevant_option: dict[str, Any] = field(default_factory=lambda: dict(GENERIC_IRRELEVANT))
    out_of_scope: list[str] = field(default_factory=list)
    negated_question: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Suite":
        return cls(steering=[Template(**t) for t in d.get("steering", [])], paraphrases=list(d.get("paraphrases", [])),
                   option_rewordings=list(d.get("option_rewordings", [])),
                   irrelevant_option=dict(d.get("irrelevant_option") or GENERIC_IRRELEVANT),
                   out_of_scope=list(d.get("out_of_scope", [])), negated_question=d.get("negated_question"))


class SuiteError(ValueError):
    """A suite the check cannot use: the message names the field and the fix."""


def families() -> list[dict[str, Any]]:
    """The shipped steering families (steering-families.json): {id, label, held_out, templates}."""
    return list(json.loads((ROBUSTNESS_DIR / "steering-families.json").read_text())["families"])


def interleaved(templates: list[Template]) -> list[Template]:
    """The templates in turn by family (one of each family, then the next of each, ...): a check with
    a few attempts per state still meets every family."""
    by_family: dict[str, list[Template]] = {}
    for t in templates:
        by_family.setdefault(t.family_name, []).append(t)
    out: list[Template] = []
    for k in range(max((len(v) for v in by_family.values()), default=0)):
        out += [v[k] for v in by_family.values() if k < len(v)]
    return out


def shipped_suite(policy: Mapping[str, Any]) -> Suite:
    """The generic steering templates, the steering families, and the policy's own file, when one ships."""
    generic = json.loads((ROBUSTNESS_DIR / "steering.json").read_text())
    own_path = ROBUSTNESS_DIR / f"{policy['id']}.json"
    own = json.loads(own_path.read_text()) if own_path.is_file() else {}
    steering = [Template(t["id"], t["text"], t.get("placement", "end"), "shipped", "generic")
                for t in generic["steering"]]
    steering += [Template(f"{f['id']}-{n}", t["text"], t.get("placement", "end"), "shipped", f["id"])
                 for f in families() for n, t in enumerate(f["templates"], 1)]
    steering += [Template(t["id"], t["text"], t.get("placement", "end"), "policy", "policy's own")
                 for t in own.get("steering", [])]
    steering = interleaved(steering)
    suite = Suite(steering=steering, paraphrases=own.get("paraphrases", []),
                  option_rewordings=own.get("option_rewordings", []),
                  irrelevant_option=own.get("irrelevant_option") or dict(GENERIC_IRRELEVANT),
                  out_of_scope=own.get("out_of_scope", []), negated_question=own.get("negated_question"))
    return check_suite(suite, policy)


def parse_templates(text: str, source: str = "yours") -> list[Template]:
    """The analyst's templates, one per line, each with {option}; a line may start with 'start:' or
    'middle:' to place it there (default: the end of the state)."""
    out = []
    for n, line in enumerate((ln.strip() for ln in text.splitlines()), 1):
        if not line:
            continue
        placement: Placement = "end"
        head, _, rest = line.partition(":")
        if head.strip().lower() in PLACEMENTS and rest.strip():
            placement, line = head.strip().lower(), rest.strip()  # type: ignore[assignment]
        if "{option}" not in line:
            raise SuiteError(f"steering template line {n}: put {{option}} where the wrong option should be named "
                             f"(e.g. 'The correct answer is {{option}}.')")
        out.append(Template(f"{source}-{n}", line, placement, source, "yours" if source == "yours" else source))
    return out


def check_suite(suite: Suite, policy: Mapping[str, Any]) -> Suite:
    ids = [o["id"] for o in policy["options"]]
    for i, rewording in enumerate(suite.option_rewordings):
        missing = [oid for oid in ids if oid not in rewording]
        if missing:
            raise SuiteError(f"option rewording {i + 1}: give a new id and description for every option "
                             f"(missing {', '.join(missing)})")
        new_ids = [str(rewording[oid].get("id") or "").strip() for oid in ids]
        if any(not x for x in new_ids) or len(set(new_ids)) != len(new_ids):
            raise SuiteError(f"option rewording {i + 1}: the new ids must be non-empty and all different")
    for name, extra in (("irrelevant option", suite.irrelevant_option),):
        if not str(extra.get("id") or "").strip() or extra["id"] in ids:
            raise SuiteError(f"{name}: give an id that is not one of the policy's options ({', '.join(ids)})")
    return suite

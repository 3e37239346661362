"""Labeled sets: find one by file, shipped name or id; import the shipped sets or an upload; say
what a set can support before anything is scored."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from adapter.engine.templates import DATA_DIR

from app.core.analysis import warm_latencies
from app.core.runs import label_mismatch
from app.core.inputs import InputError, read_file
from app.core import inputs
from app.core.labeled import ColumnMap, Support, import_file, set_support, shipped_sets
from app.core.records import LabeledSet
from app.core.store import Store

Policy = Mapping[str, Any]  # a policy record (app/core/records.Policy) or a policy dict


class SetNotFound(ValueError):
    """A --labeled-set reference that is no file, shipped set or stored set id."""


def resolve_set(store: Store, ref: str, policy: Policy) -> int:
    """A CSV/JSONL file (or a file name in data/labeled) imported for `policy`, or a stored set id.
    Raises SetNotFound, or InputError naming the rows a file was rejected for (nothing imported)."""
    path = Path(ref)
    if not path.is_file() and (DATA_DIR / "labeled" / ref).is_file():
        path = DATA_DIR / "labeled" / ref
    if path.is_file():
        return import_file(store, path.name, read_file(path, "--labeled-set"), policy, source=str(path))
    if ref.isdigit() and store.get_labeled_set(int(ref)):
        return int(ref)
    raise SetNotFound(f"--labeled-set {ref!r}: no such file or stored set id")


def import_shipped(store: Store, policies: dict[str, Policy]) -> int:
    """Import the shipped set of every shipped policy present (an unchanged set is not imported
    twice); how many sets are now available."""
    n = 0
    for pid, path in shipped_sets():
        if pid in policies:
            import_file(store, path.name, path.read_bytes(), policies[pid], source=str(path))
            n += 1
    return n


def import_upload(store: Store, name: str, data: bytes, policy: Policy, columns: ColumnMap | None = None) -> int:
    """An uploaded set whose labels are `policy`'s options - read through `columns` (which column is the
    state, which the label, what each label value is taken as); InputError lists the rows to fix."""
    return import_file(store, name, data, policy, columns=columns)


def upload_columns(name: str, data: bytes) -> list[str]:
    """The columns (CSV) or keys (JSONL) an upload has, for picking the state and the label column."""
    return inputs.columns(name, data)


def guess_column(found: list[str], wanted: str, besides: str | None = None) -> str | None:
    """The column to propose as `wanted` ('state' or 'label'): itself, else a column that looks meant as it,
    else (a label) the first column that is not `besides` (the state), an id or a split."""
    if wanted in found:
        return wanted
    like = (inputs.LABEL_LOOKALIKES | {"team", "queue", "intent", "tag", "topic"} if wanted == "label" else
            {"text", "body", "message", "content", "ticket", "description", "input", "query", "state_text"})
    named = next((c for c in found if c.strip().lower().replace(" ", "_").replace("-", "_") in like), None)
    if named is not None or wanted != "label":
        return named
    return next((c for c in found if c not in (besides, "id", "split")), None)


def label_suggestions(name: str, data: bytes, column: str, policy: Policy) -> dict[str, str | None]:
    """Each label value of the column, and the option id it is proposed as ('bug-frontend' ->
    'bug_frontend'; None: none matches, the analyst picks)."""
    return inputs.label_map(inputs.label_values(name, data, column), [o["id"] for o in policy["options"]])


def dependents(store: Store, set_id: int) -> dict[str, list[int]]:
    """What depends on a labeled set: the calibrated policies calibrated on it, the runs scoring it now,
    and every run made on it - said before it is deleted."""
    made = [r for r in store.list_runs() if r.get("labeled_set_id") == set_id]
    return {"calibrated": [int(c["id"]) for c in store.list_calibrated()
                           if ((c.get("config") or {}).get("dataset") or {}).get("set_id") == set_id],
            "running": [r["id"] for r in made if r["status"] == "running"], "runs": [r["id"] for r in made]}


def listed(store: Store) -> list[LabeledSet]:
    """Every stored labeled set, newest first - here so that a page never calls the store."""
    return store.list_labeled_sets()


def of_policy(store: Store, policy_id: str) -> list[LabeledSet]:
    """The sets made for this policy (their labels are its options)."""
    return [s for s in store.list_labeled_sets() if s["policy_id"] == policy_id]


def label_problem(store: Store, policy: Policy, set_id: int) -> str | None:
    """Why the set's labels cannot evaluate this policy (labels that are none of its options), or None."""
    return label_mismatch(policy, store.labeled_rows(set_id))


def support(store: Store, set_id: int, policy: Policy, limit: int | None = None) -> Support:
    """What the set can support for this policy before scoring (rows per option, gate, offsets), when at
    most `limit` rows are scored."""
    return set_support(store.labeled_rows(set_id), [o["id"] for o in policy["options"]], limit)


__all__ = ["LARGE", "SECONDS_PER_ROW", "ColumnMap", "InputError", "dependents", "guess_column", "label_suggestions",
           "upload_columns", "SetNotFound", "delete", "import_shipped", "import_upload",
           "label_problem", "listed", "minutes", "pace", "of_policy", "resolve_set", "summary", "support"]


SECONDS_PER_ROW = 1.75  # the default model, warm, on 2 cores: p50 1.40-1.74 s a row (docs/benchmarks.md)
LARGE = 1000  # rows above which an upload is worth a warning before anyone scores it


MEASURED_MIN = 5  # warm calls on a target before its own median replaces the benchmark's figure


def pace(store: Store, target: str = "local") -> tuple[float, str]:
    """(seconds a row, where the figure comes from): the median of this workbench's recent warm calls on
    the target (a row copied from a stored result made no call and is not counted), once there are
    MEASURED_MIN; before that, the benchmark's figure for the default model on a 2-core machine."""
    got = warm_latencies(store, {target}).get(target)
    if got and got["n"] >= MEASURED_MIN:
        seconds = got["p50_ms"] / 1000
        return seconds, f"~{seconds:.2g} s a row, measured: the median of the last {got['n']} warm calls on {target}"
    return SECONDS_PER_ROW, (f"~{SECONDS_PER_ROW:g} s a row, the default model on a 2-core machine (nothing measured "
                             f"on {target} here yet)")


def minutes(rows: int, seconds: float = SECONDS_PER_ROW) -> str:
    """'about 2 min' (or 'under a minute') for scoring `rows` rows at `seconds` a row, warm."""
    m = rows * seconds / 60
    return f"about {m:.0f} min" if m >= 1.5 else "about a minute" if m >= 0.75 else "under a minute"


def delete(store: Store, set_id: int) -> int:
    """Delete a labeled set; how many runs were made on it (they keep their results, and can no longer
    be resumed or re-calibrated on new rows)."""
    used = sum(1 for r in store.list_runs() if r.get("labeled_set_id") == set_id)
    store.delete_labeled_set(set_id)
    return used


def summary(problems: list[str], policies: dict[str, Policy], shown: int = 10) -> list[str]:
    """A rejected upload in a few lines: how many rows, which labels are not options - and which policy
    they would fit - then the first problems."""
    foreign = sorted({m.group(1) for p in problems if (m := re.search(r"label: '([^']*)' is not an option", p))})
    lines = [f"{len(problems)} problem{'s' if len(problems) != 1 else ''} in the file."]
    if foreign:
        fits = [p["name"] for p in policies.values() if set(foreign) <= {o["id"] for o in p["options"]}]
        lines.append(f"Labels that are not options of this policy: {', '.join(foreign)}"
                     + (f" - they are options of {', '.join(fits)}: pick that policy above." if fits else "."))
    lines += problems[:shown]
    if len(problems) > shown:
        lines.append(f"… and {len(problems) - shown} more")
    return lines

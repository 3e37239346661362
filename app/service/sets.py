"""Labeled sets: find one by file, shipped name or id; import the shipped sets or an upload; say
what a set can support before anything is scored."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from adapter.engine.templates import DATA_DIR

from app.core.analysis import warm_latencies
from app.core.runs import label_mismatch
from app.core.inputs import InputError, read_file
from app.core import importer, inputs
from app.core.labeled import ColumnMap, Support, import_file, set_support, shipped_sets
from app.core.records import LabeledSet
from app.core.store import Store

Policy = Mapping[str, Any]  # a policy record (app/core/records.Policy) or a policy dict


class SetNotFound(ValueError):
    """A --labeled-set reference that is no file, shipped set or stored set id."""


def resolve_set(store: Store, ref: str, policy: Policy, columns: ColumnMap | None = None) -> int:
    """A CSV/JSONL file (or a file name in data/labeled) imported for `policy`, or a stored set id.
    `columns`: the importer's mapping (which column is the state, label, id; label values mapped).
    Raises SetNotFound, or InputError naming the rows a file was rejected for (nothing imported)."""
    path = Path(ref)
    if not path.is_file() and (DATA_DIR / "labeled" / ref).is_file():
        path = DATA_DIR / "labeled" / ref
    if path.is_file():
        return import_file(store, path.name, read_file(path, "--labeled-set"), policy, source=str(path),
                           columns=columns)
    if ref.isdigit() and store.get_labeled_set(int(ref)):
        return int(ref)
    raise SetNotFound(f"--labeled-set {ref!r}: no such file or stored set id")


@dataclass(frozen=True)
class Shipped:
    """The shipped sets of the policies present: those imported now and those already here (an unchanged set is
    not imported twice), by set id."""
    made: tuple[int, ...]
    kept: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.made) + len(self.kept)

    @property
    def text(self) -> str:
        """'Imported 4 shipped sets: #1, #2, #3, #4' - or which were already here, so that a second press does not
        read as a second import (it used to say '4 shipped sets available' either way)."""
        def ids(found: tuple[int, ...]) -> str:
            return ", ".join(f"#{i}" for i in found)

        made = f"Imported {len(self.made)} shipped set{'s' if len(self.made) != 1 else ''}: {ids(self.made)}"
        kept = (f"{len(self.kept)} shipped set{'s were' if len(self.kept) != 1 else ' was'} already imported "
                f"({ids(self.kept)}): nothing new to import")
        if self.made and self.kept:
            return f"{made}; {len(self.kept)} already imported ({ids(self.kept)})"
        return made if self.made else kept if self.kept else "No shipped set to import"


def import_shipped(store: Store, policies: dict[str, Policy]) -> Shipped:
    """Import the shipped set of every shipped policy present (an unchanged set is not imported
    twice): which sets were imported now, which were already here."""
    before = {s["id"] for s in store.list_labeled_sets()}
    made: list[int] = []
    kept: list[int] = []
    for pid, path in shipped_sets():
        if pid in policies:
            sid = import_file(store, path.name, path.read_bytes(), policies[pid], source=str(path))
            (kept if sid in before else made).append(sid)
    return Shipped(tuple(made), tuple(kept))


def import_upload(store: Store, name: str, data: bytes, policy: Policy, columns: ColumnMap | None = None) -> int:
    """An uploaded set whose labels are `policy`'s options - read through `columns` (which column is the
    state, which the label, what each label value is taken as); InputError lists the rows to fix."""
    return import_file(store, name, data, policy, columns=columns)


def upload_columns(name: str, data: bytes) -> list[str]:
    """The columns (CSV) or keys (JSONL) an upload has, for picking the state and the label column."""
    return inputs.columns(name, data)


def guess_mapping(name: str, data: bytes) -> importer.Guess:
    """Which column of an upload is proposed as the state (the longest free text), the label and the id."""
    return importer.guess(name, data)


def state_warning(name: str, data: bytes, column: str) -> str | None:
    """A warning when the chosen state column looks like ids (short, unique, patterned), naming a better one."""
    return importer.state_warning(name, data, column)


def preview(name: str, data: bytes, columns: ColumnMap, option_ids: list[str]) -> list[dict[str, str]]:
    """The first rows of an upload as they will be stored (id, state, label mapped), before Import."""
    return importer.preview(name, data, columns, option_ids)


def cli_mapping(name: str, data: bytes, policy: Policy, *, state: str | None, label: str | None,
                ident: str | None, labels: Mapping[str, str] | None = None) -> tuple[ColumnMap | None, list[str]]:
    """A command line's mapping: the columns named on it (the rest as the importer proposes), label values
    mapped where they match an option once case, spaces and dashes are set aside; with the lines to print
    (the mapping, the ids warning, the first rows as stored). (None, lines proposing flags) when the file has
    no `state` column and none was named. `labels`: label values mapped by hand (--map-label VALUE=OPTION), over
    the proposals."""
    guess = importer.guess(name, data)
    if not (state or label or ident or labels):
        if guess.state in (None, "state"):
            return None, []
        return None, [f"the file has no 'state' column; the importer proposes --state-column {guess.state}"
                      + (f" --label-column {guess.label}" if guess.label else "")
                      + (f" --id-column {guess.id}" if guess.id else "")]
    ids = [o["id"] for o in policy["options"]]
    cols = ColumnMap(state or guess.state or "state", label or guess.label or "label", {},
                     ident or guess.id or "\0row number")
    proposed = importer.label_suggestions(name, data, cols.label, ids)
    cols = ColumnMap(cols.state, cols.label, {**{v: o for v, o in proposed.items() if o and o != v}, **(labels or {})},
                     cols.id)
    lines = [f"columns: state={cols.state} label={cols.label} id={cols.id if not cols.id.startswith(chr(0)) else '(row number)'}"
             + "".join(f"; '{v}' -> {o}" for v, o in cols.labels.items())]
    if warning := importer.state_warning(name, data, cols.state):
        lines.append("warning: " + warning)
    lines += [f"  {r['id']} | {r['label']} | {r['state']}" for r in importer.preview(name, data, cols, ids, n=3)]
    return cols, lines


def label_suggestions(name: str, data: bytes, column: str, option_ids: list[str]) -> dict[str, str | None]:
    """Each label value of the column, and the option id it is proposed as ('bug-frontend' ->
    'bug_frontend'; None: none matches, the analyst picks)."""
    return importer.label_suggestions(name, data, column, option_ids)


def dependents(store: Store, set_id: int) -> dict[str, list[int]]:
    """What depends on a labeled set: the calibrated policies calibrated on it, the runs scoring it now,
    and every run made on it - said before it is deleted."""
    made = [r for r in store.list_runs() if r.get("labeled_set_id") == set_id]
    return {"calibrated": [int(c["id"]) for c in store.list_calibrated()
                           if ((c.get("config") or {}).get("dataset") or {}).get("set_id") == set_id],
            "running": [r["id"] for r in made if r["status"] == "running"], "runs": [r["id"] for r in made]}


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


__all__ = ["LARGE", "SECONDS_PER_ROW", "HEAD_SECONDS_PER_ROW", "Estimate", "estimate", "pool_note", "guess_mapping", "state_warning", "preview", "ColumnMap", "InputError", "dependents", "label_suggestions",
           "upload_columns", "SetNotFound", "delete", "import_shipped", "Shipped", "import_upload",
           "label_problem", "listed", "minutes", "pace", "of_policy", "resolve_set", "cli_mapping", "summary", "support"]


SECONDS_PER_ROW = 1.75  # the default model, warm, on 2 cores: p50 1.40-1.74 s a row (docs/benchmarks.md)
LARGE = 1000  # rows above which an upload is worth a warning before anyone scores it


MEASURED_MIN = 5  # warm calls on a target before its own median replaces the benchmark's figure


HEAD_SECONDS_PER_ROW = 0.45  # a head-layout row on the default model, warm, 2 idle cores: 0.44 s (docs: the fast head)


def pace(store: Store, target: str = "local", *, head_layout: bool = False) -> tuple[float, str]:
    """(seconds a row, where the figure comes from): the median of this workbench's recent warm calls on
    the target (a row copied from a stored result made no call and is not counted), once there are
    MEASURED_MIN; before that, the benchmark's figure for the default model on a 2-core machine.
    `head_layout`: a row read in the head layout (the policy first and cached, the state last)."""
    got = warm_latencies(store, {target}, head_layout=head_layout).get(target)
    what = " in the head layout" if head_layout else ""
    if got and got["n"] >= MEASURED_MIN:
        seconds = got["p50_ms"] / 1000
        return seconds, (f"~{seconds:.2g} s a row, measured: the median of the last {got['n']} warm calls on "
                         f"{target}{what}")
    default = HEAD_SECONDS_PER_ROW if head_layout else SECONDS_PER_ROW
    # no brackets: the page says every part inside its own (the estimate's sources)
    return default, (f"~{default:g} s a row, the default model's on a 2-core machine - nothing measured "
                     f"on {target}{what} here yet")


@dataclass(frozen=True)
class Estimate:
    """How long an evaluation takes before it starts: every target x readout and every head-layout
    source, each at its own measured pace (or the stated default before any measurement)."""
    seconds: float
    parts: list[str]  # "local × default: ~1.8 s a row, measured: ..." per target x readout and source

    def text(self, rows: int) -> str:
        return f"{minutes(rows, self.seconds)} for {len(self.parts)} source{'s' if len(self.parts) != 1 else ''}"


def estimate(store: Store, targets: list[str], readouts: int, sources: list[str]) -> Estimate:
    """Seconds a row of the set summed over what the evaluation scores: each target x readout (state first)
    and each head-layout source; model loads and the policy's first passes come on top."""
    parts, seconds = [], 0.0
    for name in targets or ["local"]:
        s, why = pace(store, name)
        seconds += s * max(readouts, 1)
        parts.append(f"{name}{f' × {readouts} readouts' if readouts > 1 else ''}: {why}")
    for name in sources:
        s, why = pace(store, name, head_layout=True)
        seconds += s
        parts.append(f"{name} in the head layout: {why}")
    return Estimate(seconds, parts)


def pool_note(models: list[str], max_loaded: int) -> str | None:
    """A warning when an evaluation asks for more local models than stay loaded (SEMIF_MAX_LOADED_MODELS),
    saying what the workbench does about it; None when they fit."""
    if len(models) <= max_loaded:
        return None
    return (f"This evaluation uses {len(models)} local models and at most {max_loaded} stay loaded "
            f"(SEMIF_MAX_LOADED_MODELS={max_loaded}): the head-layout sources are scored one after the other, each "
            f"model loaded once, after the main run. Raise SEMIF_MAX_LOADED_MODELS to keep them all in memory.")


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

"""One importer for every upload of states (and labels): which column is the state, the label and the id,
what each label value is taken as, and the first rows as they will be stored - shown before anything is
imported. Calibrate's labeled sets, Compare, Robustness, Review and the command lines read files through it.

The file itself is read by app/core/inputs.read_records (its limits and errors); this module only decides
how the records it returns are read: the state column is guessed by content (the longest free text, not
the first column), and a chosen state column that looks like ids (short, unique, patterned) is warned about.
"""
from __future__ import annotations

import re
import statistics
from datetime import datetime
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from app.core.inputs import InputError, LABEL_LOOKALIKES, is_empty_state, label_map, label_values, read_records
from app.core.labeled import ColumnMap

STATE_NAMES = {"state", "text", "body", "message", "content", "ticket", "description", "input", "query", "state_text",
               "issue_text", "prompt", "question", "comment", "review", "email"}
LABEL_NAMES = LABEL_LOOKALIKES | {"team", "queue", "intent", "tag", "topic"}
ID_NAMES = {"id", "key", "row_id", "row_key", "uid", "uuid"}
PREVIEW_ROWS = 5
SAMPLE = 200  # records looked at to guess and to warn (the whole file is read on import)


def _norm(name: str) -> str:
    return name.strip().lower().replace(" ", "_").replace("-", "_")


def _texts(records: Sequence[Mapping[str, Any]], column: str) -> list[str]:
    return [v if isinstance(v, str) else str(v) for rec in records[:SAMPLE]
            if (v := rec.get(column)) is not None and not is_empty_state(v)]


def _coded(values: Sequence[str]) -> bool:
    """Values that read as codes (a letter in each: 'T-001', 'GH-1042', a hash), not numbers or dates ('12.50',
    '2026-12-07'): a column of unique amounts or timestamps is data, not the row id (row numbers serve then)."""
    def date(v: str) -> bool:
        try:
            datetime.fromisoformat(v.strip())
            return True
        except ValueError:
            return False
    return bool(values) and all(any(ch.isalpha() for ch in v) for v in values) and not any(date(v) for v in values[:20])


def _unique(records: Sequence[Mapping[str, Any]], column: str) -> bool:
    """Every row has a value in `column` and no two are the same, over the whole file (not only the sample
    `id_like` reads): a column guessed as the id from its values must not refuse the import later."""
    seen: set[str] = set()
    for rec in records:
        v = rec.get(column)
        if v is None or is_empty_state(v) or (text := str(v)) in seen:
            return False
        seen.add(text)
    return True


def free_text_score(values: Sequence[str]) -> float:
    """How much a column reads like free text: the median length of its values in characters, counted only
    where values hold words (a space); 0 for a column of single tokens (ids, codes, labels)."""
    if not values:
        return 0.0
    worded = sum(1 for v in values if " " in v.strip()) / len(values)
    return statistics.median(len(v) for v in values) * worded if worded >= 0.5 else 0.0


def id_like(values: Sequence[str]) -> str | None:
    """Why a column's values look like ids (short, unique, one pattern: 'GH-1042', 'a3f9…', '17'), or None."""
    if len(values) < 2:
        return None
    short = statistics.median(len(v) for v in values) <= 24 and not any(" " in v.strip() for v in values)
    unique = len(set(values)) == len(values)
    shapes = {re.sub(r"[0-9]", "9", re.sub(r"[A-Za-z]", "a", v.strip())) for v in values}
    skeletons = {re.sub(r"(.)\1+", r"\1", s) for s in shapes}  # 'aa-9999' and 'aa-999' are one pattern
    patterned = len(skeletons) <= max(1, len(values) // 10)
    if short and unique and patterned:
        return (f"its values are short, all different and of one pattern ({values[0]!r}, {values[1]!r}, …): that "
                "reads like an id column, not the text to decide on")
    return None


@dataclass(frozen=True)
class Guess:
    """The columns of an upload and which one is proposed as the state, the label and the id."""
    columns: list[str]
    state: str | None
    label: str | None
    id: str | None

    @property
    def needs_a_look(self) -> bool:
        return self.state != "state" or (self.label is not None and self.label != "label")


def records(filename: str, data: bytes) -> list[dict[str, Any]]:
    """The upload's records (no column is required yet: the mapping decides); [] when unreadable (the import
    says why)."""
    try:
        return [rec for _, rec in read_records(filename, data, [], state="")]
    except InputError:
        return []


def guess(filename: str, data: bytes, *, labels: bool = True) -> Guess:
    """The state: a column named `state`, else the longest free-text column (a name like 'text' or 'body'
    breaks a tie), never an id-like one; the label (`labels`): `label`, else a column named like one, else
    the first short column left; the id: `id`, else an id-like column named like one ('issue_id'), else a column
    whose values read as ids (short, all different, one pattern)."""
    recs = records(filename, data)
    found = list(dict.fromkeys(str(k) for rec in recs for k in rec))
    if not found:
        return Guess([], None, None, None)
    score = {c: free_text_score(_texts(recs, c)) for c in found}
    if "state" in found:
        state: str | None = "state"
    else:
        texty = [c for c in found if score[c] > 0 and not id_like(_texts(recs, c))]
        state = max(texty, key=lambda c: (score[c], _norm(c) in STATE_NAMES)) if texty else \
            next((c for c in found if _norm(c) in STATE_NAMES), None)
    label = None
    if labels:
        rest = [c for c in found if c != state]
        label = ("label" if "label" in found else next((c for c in rest if _norm(c) in LABEL_NAMES), None)
                 or next((c for c in rest if score[c] == 0 and not id_like(_texts(recs, c))
                          and _norm(c) not in ID_NAMES | {"split"}), None))
    ident = "id" if "id" in found else next(
        (c for c in found if c not in (state, label) and (_norm(c) in ID_NAMES or _norm(c).endswith("_id"))
         and len(set(_texts(recs, c))) == len(_texts(recs, c))), None) or next(
        # no column named like an id: one whose values read as ids ('ticket': T-001, T-002, ...) - before, a pool's
        # own ticket numbers were dropped and its rows shown as pool-1, pool-2, ...
        (c for c in found if c not in (state, label) and id_like(_texts(recs, c)) and _coded(_texts(recs, c))
         and _unique(recs, c)), None)
    return Guess(found, state, label, ident)


def state_warning(filename: str, data: bytes, column: str) -> str | None:
    """A warning when the chosen state column looks like ids, naming the column to pick instead."""
    recs = records(filename, data)
    why = id_like(_texts(recs, column))
    if why is None:
        return None
    better = guess(filename, data, labels=False).state
    instead = f" - pick {better!r} as the state column" if better and better != column else ""
    return f"The state column {column!r}: {why}{instead}."


def label_suggestions(filename: str, data: bytes, column: str, option_ids: list[str]) -> dict[str, str | None]:
    """Each label value of the column, and the option id it is proposed as ('bug-frontend' -> 'bug_frontend',
    'Feature Request' -> 'feature_request'; None: none matches, the analyst picks)."""
    return label_map(label_values(filename, data, column), option_ids)


def preview(filename: str, data: bytes, columns: ColumnMap, option_ids: Sequence[str] | None = None,
            n: int = PREVIEW_ROWS) -> list[dict[str, str]]:
    """The first `n` rows as they will be stored: id, state and label (mapped to an option id; a value that is
    none of the options is shown as refused), each cell shortened for a table."""
    out = []
    try:
        found = read_records(filename, data, [], state="")[:n]
    except InputError:
        return []
    for number, rec in found:
        row = columns.apply(rec)
        label = "" if row.get("label") in (None, "") else str(row["label"]).strip()
        if label and option_ids is not None and label not in option_ids:
            label = f"{label} (not an option: refused)"
        state = row.get("state")
        text = "" if state is None else state if isinstance(state, str) else str(state)
        out.append({"id": str(row.get("id") or f"row-{number}"), "state": _short(text), "label": label})
    return out


def _short(text: str, width: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"

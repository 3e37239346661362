"""Labeled sets: CSV or JSONL rows with `state` and `label` (an option id), optional `id`, `split`
and metadata columns. Validated row by row; one bad row rejects the whole file."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, TypedDict, TypeVar
from pathlib import Path

from adapter.engine.templates import DATA_DIR

from app.core.calibration import BOUND_NAME, MIN_ROWS_PER_OPTION, PROVISIONAL, decided_needed
from app.core.heads import MIN_ROWS_PER_OPTION as HEAD_ROWS
from app.core.heads import rows_advice
from app.core.inputs import InputError, is_empty_state, read_records
from app.core.runner import Case
from app.core.store import Store

RESERVED = {"state", "label", "id", "split"}


@dataclass(frozen=True)
class ColumnMap:
    """How an upload's columns are read (Argilla / Label Studio style): which column is the state, which
    the label, and what each label value is taken as (an option id)."""

    state: str = "state"
    label: str = "label"
    labels: Mapping[str, str] = field(default_factory=dict)
    id: str = "id"  # the column that names each row (its values are kept as metadata too)

    def apply(self, rec: Mapping[str, Any]) -> dict[str, Any]:
        """The record with `state`, `label` and `id` read from the mapped columns and the label mapped."""
        out = {k: v for k, v in rec.items() if k not in (self.state, self.label)}
        out["state"] = rec.get(self.state)
        if self.id != "id":
            out["id"] = rec.get(self.id)
        raw = rec.get(self.label)
        text = "" if raw is None else str(raw).strip()
        out["label"] = self.labels.get(text, text) if text else raw
        return out


def parse_labeled(filename: str, data: bytes, option_ids: list[str] | None = None,
                  columns: ColumnMap | None = None) -> list[dict[str, Any]]:
    problems: list[str] = []
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    cols = columns or ColumnMap()
    for n, raw in read_records(filename, data, problems, required=cols.label, state=cols.state):
        rec = cols.apply(raw)
        state, label = rec.get("state"), rec.get("label")
        bad = False
        if is_empty_state(state):
            problems.append(f"row {n}, column state: empty - every row needs the text to decide on")
            bad = True
        label = "" if label is None else str(label).strip()
        if not label:
            problems.append(f"row {n}, column label: empty - give the correct option id")
            bad = True
        elif option_ids is not None and label not in option_ids:
            problems.append(f"row {n}, column label: {label!r} is not an option of the policy ({', '.join(option_ids)})")
            bad = True
        key = str(rec.get("id") or f"row-{n}").strip()
        if key in seen:
            problems.append(f"row {n}, column id: duplicate id {key!r}")
            bad = True
        seen.add(key)
        if bad:
            continue
        split = str(rec.get("split") or "").strip().lower() or None
        meta = {k: v for k, v in rec.items() if k not in RESERVED and v not in (None, "")}
        out.append({"row_key": key, "state": state, "label": label, "split": split, "meta": meta})
    if problems:
        raise InputError(problems)
    if not out:
        raise InputError(["the file has no rows"])
    return out


def content_hash(rows: Sequence[Mapping[str, Any]]) -> str:
    """sha256 over the rows' id, state, label and split - the dataset identity in exported policies."""
    canon = json.dumps([[r["row_key"], r["state"], r["label"], r.get("split")] for r in rows], ensure_ascii=False, sort_keys=True,
                       separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def shipped_sets() -> list[tuple[str, Path]]:
    """(policy template id, file) for the labeled sets in data/labeled (file stem = template id)."""
    return [(p.stem, p) for p in sorted((DATA_DIR / "labeled").glob("*.jsonl"))]


def import_file(store: Store, name: str, data: bytes, policy: Mapping[str, Any] | None, source: str = "",
                columns: ColumnMap | None = None) -> int:
    """Validate then store (all or nothing); returns the set id. Raises InputError."""
    return import_cases(store, name, data, policy, source, columns)[0]


def import_cases(store: Store, name: str, data: bytes, policy: Mapping[str, Any] | None, source: str = "",
                 columns: ColumnMap | None = None) -> tuple[int, list[Case]]:
    """import_file, with the set's rows outside its train split as cases, in order (cases_of): a set of the same
    content already stored has these very rows (the content hash covers id, state, label and split), so they need
    no second read."""
    rows = parse_labeled(name, data, [o["id"] for o in policy["options"]] if policy else None, columns)
    set_id = store.import_labeled_set(name=name, policy_id=policy["id"] if policy else None, rows=rows,
                                      content_hash=content_hash(rows), source=source or name)
    return set_id, cases_of(rows)


T = TypeVar("T", bound=Mapping[str, Any])
R = TypeVar("R")


def stratified(rows: Sequence[T]) -> list[T]:
    """The rows in an order whose every prefix keeps the labels' shares of the whole set: row i of a
    label with n rows sits at (i + 0.5) / n, and the rows are sorted by that place. The first rows
    scored are then a fair sample, so an evaluation stopped early (or a provisional gate read while
    it runs) speaks for the whole set. Within a label the set's own order is kept.

    >>> [r["label"] for r in stratified([{"label": "a"}] * 4 + [{"label": "b"}] * 2)]
    ['a', 'b', 'a', 'a', 'b', 'a']
    """
    by_label: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_label.setdefault(str(r.get("label")), []).append(i)
    place = {i: ((k + 0.5) / len(idx), order) for order, idx in enumerate(by_label.values()) for k, i in enumerate(idx)}
    return [rows[i] for i in sorted(range(len(rows)), key=lambda i: place[i])]


def evenly_spaced(rows: Sequence[R], limit: int | None) -> list[R]:
    """At most `limit` rows, evenly spaced over the list, so every label keeps about its share."""
    if not limit or limit >= len(rows):
        return list(rows)
    step = max(1, len(rows) // limit)
    return list(rows[::step][:limit])


def scored_cases(store: Store, set_id: int, limit: int | None = None) -> list[Case]:
    """A stored set's rows outside its train split (those are never scored), as cases to check."""
    return cases_of(store.labeled_rows(set_id), limit)


def cases_of(rows: Sequence[Mapping[str, Any]], limit: int | None = None) -> list[Case]:
    """A set's rows outside its train split, up to `limit` evenly spaced, as cases to check."""
    kept = [r for r in rows if r.get("split") != "train"]
    return [Case(r["row_key"], r["state"], r["label"]) for r in evenly_spaced(kept, limit)]


class Support(TypedDict):
    """What a labeled set can support before anything is scored (set_support): read by key on the page."""
    scored: int
    total: int
    train: int
    per_option: dict[str, int]
    gate: bool
    provisional: bool
    offsets: bool
    head: bool
    head_note: str
    messages: list[str]


def set_support(rows: Sequence[Mapping[str, Any]], option_ids: list[str], limit: int | None = None,
                target: float = 0.9) -> Support:
    """What a labeled set can support, said before anything is scored: the rows that will be scored
    (the train split never is; at most `limit` when the analyst stops early), per option, and whether that
    can reach a recommended gate for `target` at all (even with every row decided and right, the gate's lower
    Clopper-Pearson bound needs 29 rows at 90%), fitted offsets (5 of every option) and a learned head (3 of
    every option, one per fold; all 5 folds from 5). `messages` says what falls short in words, most limiting first; `head_note` what a
    head needs, always."""
    scored = [r for r in rows if r.get("split") != "train"] if any(r.get("split") == "train" for r in rows) else rows
    per_option = {o: sum(1 for r in scored if r.get("label") == o) for o in option_ids}
    total = len(scored)
    n = min(limit, total) if limit else total
    if n < total:  # rows are scored in stratified order: the first n keep each label's share
        per_option = {o: c * n // total for o, c in per_option.items()}
    fewest = min(per_option.values()) if per_option else 0
    what = f"{n} rows will be scored" if n == total else f"{n} of {total} rows will be scored (Stop early)"
    messages = []
    least = decided_needed(1.0, target) or 0
    if n < least:
        messages.append(f"{what}: fewer than {least}, so no gate for {target:.0%} can be recommended even if every row "
                        f"is decided right (the {BOUND_NAME} of {n} of {n} stays below it; you can still set one by "
                        "hand) - " + (f"add at least {least - n} labeled row{'s' if least - n != 1 else ''}" if total < least
                                  else f"score at least {least}"))
    elif n < PROVISIONAL:
        messages.append(f"{what}: a gate is recommended only where its decided rows' {BOUND_NAME} reaches the target; "
                        f"every figure is provisional below {PROVISIONAL}")
    if fewest < MIN_ROWS_PER_OPTION:
        thin = ", ".join(f"{o} ({c})" for o, c in per_option.items() if c < MIN_ROWS_PER_OPTION)
        messages.append(f"fitted per-option offsets need {MIN_ROWS_PER_OPTION} rows of every option; too few: {thin}")
    advice = rows_advice(per_option)
    if fewest < HEAD_ROWS:
        thin = ", ".join(f"{o} ({c})" for o, c in per_option.items() if c < HEAD_ROWS)
        messages.append(f"a learned head needs {HEAD_ROWS} rows of every option (one per fold); too few: {thin}")
    head_note = (f"a learned head needs at least {HEAD_ROWS} scored rows of every option, one per fold (fewest here: "
                 f"{fewest}), and is kept only when it beats the corrections beyond noise"
                 + (f"; {advice}" if advice and fewest >= HEAD_ROWS else ""))
    return {"scored": n, "total": total, "train": len(rows) - total, "per_option": per_option, "gate": n >= least,
            "provisional": least <= n < PROVISIONAL, "offsets": fewest >= MIN_ROWS_PER_OPTION,
            "head": fewest >= HEAD_ROWS, "head_note": head_note, "messages": messages}

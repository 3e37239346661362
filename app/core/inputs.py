"""States to run, from pasted text or an uploaded CSV / JSONL file, validated row by row."""
from __future__ import annotations

import csv
import io
import json
from typing import Any

from app.core.runner import Case

MAX_FIELD = 16 * 1024 * 1024  # characters in one CSV cell


class InputError(ValueError):
    """Bad input file: `problems` lists 'row N, column C: message' lines; nothing is used."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems[:5]))
        self.problems = problems


def is_empty_state(state: Any) -> bool:
    return state is None or (isinstance(state, str) and not state.strip()) or (isinstance(state, (dict, list)) and not state)


def rows_from_text(text: str) -> list[Case]:
    """One state per non-empty line."""
    return [Case(f"row-{i + 1}", line.strip()) for i, line in enumerate(l for l in text.splitlines() if l.strip())]


def read_records(filename: str, data: bytes, problems: list[str], required: str | None = None,
                 state: str = "state") -> list[tuple[int, dict[str, Any]]]:
    """(row number, record) pairs from CSV/TSV (header row = row 1) or JSONL; format problems are
    appended to `problems`. A missing `state` (or `required`) column - a CSV header without it, or no
    JSONL line with that key - raises at once, naming the columns or keys the file has."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(["the file is not UTF-8 text: save it as UTF-8 CSV or JSONL"]) from None
    name = filename.lower()
    records: list[tuple[int, dict[str, Any]]] = []
    if name.endswith((".jsonl", ".ndjson", ".json")):
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"row {n}: not valid JSON ({exc.msg})")
                continue
            if not isinstance(obj, dict):
                problems.append(f"row {n}: each line must be a JSON object with a 'state'")
                continue
            records.append((n, obj))
        keys = list(dict.fromkeys(str(k) for _, rec in records for k in rec))
        for col in (state, required):
            if col and records and not any(col in rec for _, rec in records):
                raise InputError([f"no line has a {col!r} key; found {', '.join(keys)} - pick which key is the "
                                  f"{'state' if col == state else col} (Columns), or rename it in the file"])
    elif name.endswith((".csv", ".tsv", ".txt")):
        csv.field_size_limit(MAX_FIELD)  # the default 131,072 characters is less than a long log excerpt
        reader = csv.DictReader(io.StringIO(text), dialect="excel-tab" if name.endswith(".tsv") else "excel")
        try:
            header = [f.strip() for f in reader.fieldnames or []]
            for col in (state, required):
                if col and col not in header:
                    raise InputError([f"row 1 (header): no {col!r} column; found {header or 'none'} - pick which "
                                      f"column is the {'state' if col == state else col} (Columns), or rename it"])
            for n, rec in enumerate(reader, 2):
                records.append((n, {(k or "").strip(): v for k, v in rec.items()}))
        except csv.Error as exc:
            raise InputError([f"row {reader.line_num}: not readable as CSV ({exc})"]) from None
    else:
        raise InputError([f"{filename}: upload a .csv or .jsonl file"])
    return records


def columns(filename: str, data: bytes) -> list[str]:
    """The columns of a CSV's header, or the keys of a JSONL's lines, in order of first appearance."""
    try:
        return list(dict.fromkeys(str(k) for _, rec in read_records(filename, data, [], state="") for k in rec))
    except InputError:
        return []


def normalised(text: str) -> str:
    """'Bug-Frontend ' -> 'bug_frontend': how a label is matched to an option id when mapping."""
    return "_".join(str(text).strip().lower().replace("-", " ").replace("/", " ").split())


def label_map(values: list[str], option_ids: list[str]) -> dict[str, str | None]:
    """For each label of an upload, the option id it is taken as: itself when it is one, else the option
    whose id it matches once case, spaces and dashes are set aside ('bug-frontend' -> 'bug_frontend'),
    else None (the analyst picks)."""
    by_norm = {normalised(o): o for o in option_ids}
    return {v: v if v in option_ids else by_norm.get(normalised(v)) for v in values}


def label_values(filename: str, data: bytes, column: str) -> list[str]:
    """The distinct values of one column, in order of first appearance (empty cells left out)."""
    try:
        records = read_records(filename, data, [], state="")
    except InputError:
        return []
    return list(dict.fromkeys(str(rec[column]).strip() for _, rec in records
                              if rec.get(column) not in (None, "") and str(rec[column]).strip()))


LABEL_LOOKALIKES = {"label", "labels", "answer", "answers", "category", "categories", "class", "expected", "gold",
                    "ground_truth", "option", "option_id", "target", "truth"}


def label_lookalikes(filename: str, data: bytes) -> list[str]:
    """The columns of an upload that look meant as its `label` column ("Label", "labels", "answer",
    "category", ...) when it has no column named exactly `label` - which is the only one read, so
    accuracy would silently be missing. [] when there is a `label` column, or nothing like one."""
    try:
        records = read_records(filename, data, [])
    except InputError:
        return []
    columns = list(dict.fromkeys(str(k) for _, rec in records for k in rec))
    if "label" in columns:
        return []
    return [c for c in columns if c.strip().lower().replace(" ", "_").replace("-", "_") in LABEL_LOOKALIKES]


def rows_from_upload(filename: str, data: bytes, option_ids: list[str] | None = None,
                     policy_id: str | None = None, columns: Any = None) -> list[Case]:
    """CSV (header with `state`, optional `id`, `label`) or JSONL ({"state", "id"?, "label"?}). With
    `option_ids`, a label that is not one of them is refused (it could never be answered right).
    With `policy_id`, a file that names each row's policy (a `policy` column, as data/cases/probe.jsonl
    does) gives only that policy's rows. `columns`: a labeled.ColumnMap (app/core/importer.py: which
    column is the state, the label and the id, and the label values mapped)."""
    problems: list[str] = []
    records = read_records(filename, data, problems, state=columns.state if columns is not None else "state")
    if columns is not None:
        records = [(n, columns.apply(rec)) for n, rec in records]
    if policy_id is not None and any(str(rec.get("policy") or "").strip() for _, rec in records):
        named = sorted({str(rec.get("policy") or "").strip() for _, rec in records} - {""})
        records = [(n, rec) for n, rec in records if str(rec.get("policy") or "").strip() in ("", policy_id)]
        if not records and not problems:
            raise InputError([f"column policy: no row is for policy {policy_id!r} (the file's rows are for "
                              f"{', '.join(named)}): pick one of those policies, or clear the policy column"])
    rows, seen = [], set()
    for n, rec in records:
        state = rec.get("state")
        if is_empty_state(state):
            problems.append(f"row {n}, column state: empty - every row needs the text to decide on")
            continue
        key = str(rec.get("id") or f"row-{n}").strip()
        if key in seen:
            problems.append(f"row {n}, column id: duplicate id {key!r}")
            continue
        seen.add(key)
        label = str(rec["label"]).strip() if rec.get("label") not in (None, "") else None
        if label is not None and option_ids is not None and label not in option_ids:
            problems.append(f"row {n}, column label: {label!r} is not an option of the policy ({', '.join(option_ids)})")
            continue
        rows.append(Case(key, state, label))
    if problems:
        raise InputError(problems)
    if not rows:
        raise InputError(["the file has no rows"])
    return rows


def state_from_file(filename: str, data: bytes) -> Any:
    """An uploaded state: a .json file is parsed, so an object or array reaches the model the way the
    adapter renders object states (indented JSON); any other file is its text."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError([f"{filename}: not UTF-8 text - save it as UTF-8"]) from None
    if not filename.lower().endswith(".json"):
        return text
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InputError([f"{filename}: not valid JSON ({exc}) - fix it, or upload it as .txt to send it as text"]) from None
    if is_empty_state(value):
        raise InputError([f"{filename}: the JSON is empty - a state needs content"])
    return value if isinstance(value, (dict, list)) else str(value)

"""States to run, from pasted text or an uploaded CSV / JSONL file, validated row by row."""
from __future__ import annotations

import csv
import io
import json
import stat
from pathlib import Path
from typing import Any, Iterator

from adapter.json_text import nesting

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


MAX_ROWS = 100_000  # rows in one upload: a labeled set, a states file or a decision log (one run's worth)
MAX_DEPTH = 64  # nesting of one JSON Lines row (a state object); deeper is refused, never a RecursionError
MAX_PROBLEMS = 1000  # row problems collected before reading stops (the rest of a bad file says nothing new)
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
CSV_SUFFIXES = (".csv", ".tsv", ".txt")


MAX_FILE_BYTES = 1 << 30  # an input file read whole (a labeled set, states, a decision log): 1 GiB


def read_file(path: str | Path, what: str) -> bytes:
    """An input file's bytes, read the one safe way: it must be a regular file (a FIFO would block the
    read - the command hangs - and a device is no file) of at most MAX_FILE_BYTES. InputError naming it."""
    p = Path(path)
    try:
        info = p.stat()
    except OSError as exc:
        raise InputError([f"{what} {p}: {exc.strerror or exc}"]) from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError([f"{what} {p}: is a folder - give a CSV or JSONL file"])
    if not stat.S_ISREG(info.st_mode):
        raise InputError([f"{what} {p}: is not a regular file (a FIFO, socket or device) - give a CSV or JSONL file"])
    if info.st_size > MAX_FILE_BYTES:
        raise InputError([f"{what} {p}: {info.st_size:,} bytes, more than {MAX_FILE_BYTES:,} - split it"])
    try:
        with p.open("rb") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError([f"{what} {p}: {exc.strerror or exc}"]) from None


def _duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _RowProblem(f"key {k!r} appears twice in one object - keep one")
        out[k] = v
    return out


class _RowProblem(ValueError):
    pass


def _text_problem(value: Any) -> tuple[str, str] | None:
    """(where, why) for the first string in `value` - a value or a key - that holds a NUL or a lone
    surrogate (iterative: depth is checked first, but no recursion anyway)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, where = stack.pop()
        texts: list[tuple[str, str]] = []
        if isinstance(v, str):
            texts = [(v, where)]
        elif isinstance(v, dict):
            for k, x in v.items():
                texts.append((k, f"{where}.{k}" if where else str(k)))
                stack.append((x, f"{where}.{k}" if where else str(k)))
        elif isinstance(v, list):
            stack.extend((x, f"{where}[{i}]") for i, x in enumerate(v))
        for text, at in texts:
            if "\x00" in text:
                return at, "holds a NUL character (U+0000): remove it - it is not text"
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return at, ("holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair): send the "
                            "character itself, or a valid pair")
    return None


def json_row(line: str, max_depth: int = MAX_DEPTH) -> Any:
    """One JSON Lines row, read the one safe way (labeled sets, states, decision logs): NaN and
    Infinity, a key given twice, nesting deeper than `max_depth`, integers over 4,300 digits, NUL
    and lone surrogates anywhere are refused. ValueError whose message names the field and the fix
    (the caller adds the row number)."""
    try:
        value = json.loads(line, parse_constant=_constant, object_pairs_hook=_duplicate_keys)
    except _RowProblem as exc:
        raise ValueError(str(exc)) from None
    except RecursionError:
        raise ValueError(f"nested too deeply: at most {max_depth} levels") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc) or "digits" in str(exc):
            raise ValueError("an integer has more than 4,300 digits: write such numbers as strings") from None
        raise ValueError(str(exc)) from None
    depth = nesting(value, max_depth)
    if depth > max_depth:
        raise ValueError(f"nested {depth}+ levels deep: at most {max_depth} levels")
    bad = _text_problem(value)
    if bad is not None:
        where, why = bad
        raise ValueError(f"{'field ' + where + ' ' if where else ''}{why}")
    return value


def _constant(name: str) -> Any:
    raise _RowProblem(f"{name} is not a JSON number: write null or a string")


def _lines(data: bytes) -> Iterator[tuple[int, str]]:
    """(line number, text) of UTF-8 bytes, decoded as a stream (a BOM dropped); InputError naming
    the line at the first byte that is not UTF-8."""
    wrapper = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig", newline="")
    n = 0
    try:
        for n, line in enumerate(wrapper, 1):
            yield n, line
    except UnicodeDecodeError:
        raise InputError([f"near row {n + 1}: the file is not UTF-8 text - save it as UTF-8 CSV or JSONL"]) from None


def _too_many(n: int) -> InputError:
    return InputError([f"the file has more than {MAX_ROWS:,} rows (row {n:,}): split it into files of at most "
                       f"{MAX_ROWS:,} rows"])


def iter_records(filename: str, data: bytes, problems: list[str], required: str | None = None,
                 state: str = "state", max_rows: int = MAX_ROWS) -> Iterator[tuple[int, dict[str, Any]]]:
    """The one reader of labeled sets, states files and decision logs, as a stream of (row number,
    record) pairs from CSV/TSV (header row = row 1) or JSON Lines. A row that cannot be a record is a
    problem appended to `problems` as 'row N[, column C]: message' (depth, integers over 4,300 digits,
    NaN, lone surrogates, NUL, a key twice); the file as a whole - not UTF-8, a header with a column
    twice, a missing `state` (or `required`) column, more than `max_rows` rows - raises InputError at
    once. Rows are read lazily, so memory stays bounded by what the caller keeps."""
    name = filename.lower()
    if name.endswith(JSON_SUFFIXES):
        yield from _jsonl_records(data, problems, required, state, max_rows)
    elif name.endswith(CSV_SUFFIXES):
        yield from _csv_records(data, problems, required, state, max_rows, name.endswith(".tsv"))
    else:
        raise InputError([f"{filename}: upload a .csv or .jsonl file"])


def _jsonl_records(data: bytes, problems: list[str], required: str | None, state: str,
                   max_rows: int) -> Iterator[tuple[int, dict[str, Any]]]:
    seen: dict[str, None] = {}
    found = {col: False for col in (state, required) if col}
    rows = 0
    for n, line in _lines(data):
        if not line.strip():
            continue
        rows += 1
        if rows > max_rows:
            raise _too_many(n)
        try:
            obj = json_row(line)
        except ValueError as exc:
            _problem(problems, f"row {n}: {exc}")
            continue
        if not isinstance(obj, dict):
            _problem(problems, f"row {n}: each line must be a JSON object with a {state or 'state'!r} key")
            continue
        for k in obj:
            seen.setdefault(str(k))
            if k in found:
                found[k] = True
        yield n, obj
    for col, there in found.items():
        if rows and not there and seen:
            raise InputError([f"no line has a {col!r} key; found {', '.join(seen)} - pick which key is the "
                              f"{'state' if col == state else col} (Columns), or rename it in the file"])


def _csv_records(data: bytes, problems: list[str], required: str | None, state: str, max_rows: int,
                 tsv: bool) -> Iterator[tuple[int, dict[str, Any]]]:
    csv.field_size_limit(MAX_FIELD)  # the default 131,072 characters is less than a long log excerpt
    wrapper = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig", newline="")
    reader = csv.reader(wrapper, dialect="excel-tab" if tsv else "excel")
    try:
        try:
            first = next(reader, None)
        except UnicodeDecodeError:
            raise InputError(["the file is not UTF-8 text: save it as UTF-8 CSV or JSONL"]) from None
        header = [f.strip() for f in first or []]
        twice = next((h for i, h in enumerate(header) if h and h in header[:i]), None)
        if twice is not None:
            raise InputError([f"row 1 (header): column {twice!r} appears twice - rename or remove one (which one "
                              "would be read is not a guess to make)"])
        nul = next((h for h in header if "\x00" in h), None)
        if nul is not None:
            raise InputError([f"row 1 (header): column {nul!r} holds a NUL character (U+0000): remove it"])
        for col in (state, required):
            if col and col not in header:
                raise InputError([f"row 1 (header): no {col!r} column; found {header or 'none'} - pick which "
                                  f"column is the {'state' if col == state else col} (Columns), or rename it"])
        n, rows = 1, 0
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                break
            except UnicodeDecodeError:
                raise InputError([f"near row {n + 1}: the file is not UTF-8 text - save it as UTF-8 CSV or JSONL"]) from None
            n += 1
            if not cells:
                continue
            rows += 1
            if rows > max_rows:
                raise _too_many(n)
            rec: dict[str, Any] = {h: (cells[i] if i < len(cells) else None) for i, h in enumerate(header)}
            if len(cells) > len(header):
                rec[""] = cells[len(header):]
            bad = next((h for h, v in rec.items() if isinstance(v, str) and "\x00" in v), None)
            if bad is not None:
                _problem(problems, f"row {n}, column {bad}: holds a NUL character (U+0000) - remove it, it is not text")
                continue
            yield n, rec
    except csv.Error as exc:
        raise InputError([f"row {reader.line_num}: not readable as CSV ({exc})"]) from None


def _problem(problems: list[str], text: str) -> None:
    problems.append(text)
    if len(problems) >= MAX_PROBLEMS:
        raise InputError(problems + [f"stopped reading after {MAX_PROBLEMS:,} problems: fix these first"])


def read_records(filename: str, data: bytes, problems: list[str], required: str | None = None,
                 state: str = "state") -> list[tuple[int, dict[str, Any]]]:
    """(row number, record) pairs from CSV/TSV (header row = row 1) or JSONL: iter_records as a list.
    Format problems are appended to `problems`; a missing `state` (or `required`) column - a CSV header
    without it, or no JSONL line with that key - raises at once, naming the columns or keys the file has."""
    return list(iter_records(filename, data, problems, required, state))


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

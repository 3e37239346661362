"""A pool of unlabeled states for a policy (no Streamlit): read from a CSV or JSONL file line by line (a
huge file is never loaded whole: reading stops at a cap, and the message says so), each row checked and
every problem named by its line - an empty state, a state twice, a state already in the labeled set, a
label outside the policy's options, a row of another policy. Rows with a problem are left out, never fixed.

>>> import io
>>> p = read_pool(io.StringIO('{"state": "a"}\\n{"state": ""}\\n{"state": "a"}\\n'), "x.jsonl", ["yes", "no"], "p")
>>> [r.state for r in p.rows], p.problems
(['a'], ['line 2: the state is empty', "line 3: the same state as line 1 ('a')"])
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from typing import Any, Iterator, TextIO

from adapter.engine.templates import request_for
from adapter.schema import DecisionRequest, State

from app.core import importer, runs
from app.core.records import Run
from app.core.runner import Job
from app.targets.base import Target

MAX_ROWS = 50_000  # read at most this many rows of a pool (a file of a million is read this far, then stops)


@dataclass(frozen=True)
class PoolRow:
    line: int
    id: str
    state: Any


@dataclass
class Pool:
    rows: list[PoolRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    capped: str = ""  # set when the file had more rows than the cap


def _records(fh: TextIO, name: str, state: str = "state") -> Iterator[tuple[int, dict[str, Any] | str]]:
    """(line, record or why it is not one), streamed."""
    if name.lower().endswith(".csv"):
        reader = csv.DictReader(fh)
        if not reader.fieldnames or state not in reader.fieldnames:
            yield 1, f"no {state!r} column; found {reader.fieldnames or []}"
            return
        try:
            for row in reader:
                yield reader.line_num, dict(row)
        except csv.Error as exc:  # a field past csv's size limit: reading stops there, and says so
            yield reader.line_num + 1, f"not readable as CSV ({exc}) - nothing from here on was read"
        return
    for n, line in enumerate(fh, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            yield n, f"not valid JSON ({exc.msg})"
            continue
        yield n, value if isinstance(value, dict) else "not a JSON object with a 'state'"


def state_key(state: Any) -> str:
    return state if isinstance(state, str) else "j:" + json.dumps(state, sort_keys=True, ensure_ascii=False)


def columns_of(name: str, head: bytes) -> tuple[str, str | None]:
    """(state column, id column) of a pool file, as the shared importer (app/core/importer.guess) reads the
    first lines `head` (a pool has no label column to guess): `state` when there is one, else the longest
    free-text column; the id: `id`, else an id-like column."""
    cut = head[: head.rfind(b"\n") + 1] or head  # whole lines only: a record cut in two is not read
    found = importer.guess(name, cut, labels=False)
    return found.state or "state", found.id


def read_pool(fh: TextIO | io.StringIO, name: str, option_ids: list[str], policy_id: str, *,
              known: set[str] | None = None, cap: int = MAX_ROWS, state: str = "state",
              id_column: str | None = "id") -> Pool:
    """The pool's usable rows and every problem, by line. `known`: state keys already in the labeled set;
    `state` / `id_column`: the columns read as the state and the row id (columns_of guesses them)."""
    pool = Pool()
    seen: dict[str, int] = {}
    known = known or set()
    for n, rec in _records(fh, name, state):
        if isinstance(rec, str):
            pool.problems.append(f"line {n}: {rec}")
            continue
        if len(pool.rows) >= cap:
            pool.capped = (f"the pool has more than {cap:,} rows: the first {cap:,} usable ones were read (from line "
                           f"{n} on, nothing was read) - split the file or label from this part first")
            break
        other = rec.get("policy_id")
        if other not in (None, "", policy_id):
            pool.problems.append(f"line {n}: a row of policy {str(other)!r}, not {policy_id!r}")
            continue
        value = rec.get(state)
        if value is None or (isinstance(value, str) and not value.strip()) or value in ({}, []):
            pool.problems.append(f"line {n}: the state is empty")
            continue
        label = rec.get("label")
        if label not in (None, "") and label not in option_ids:
            pool.problems.append(f"line {n}: label {str(label)!r} is not an option ({', '.join(option_ids)})")
            continue
        key = state_key(value)
        if key in known:
            pool.problems.append(f"line {n}: this state is already in the labeled set")
            continue
        if key in seen:
            pool.problems.append(f"line {n}: the same state as line {seen[key]} ({str(value)[:40]!r})")
            continue
        seen[key] = n
        ident = rec.get(id_column) if id_column else None
        pool.rows.append(PoolRow(n, str(ident or f"pool-{n}"), value))
    return pool


def request_like(run: Run, state: State, row_id: str, target: Target) -> DecisionRequest:
    """The request an evaluation run sends for a state (runs.resume_evals' rule: its policy as evaluated, its
    variant, the hidden state where the target gives one, the head layout's rendering), so that a pool row's
    stored result has the reuse key the next calibration of that run's kind looks up."""
    cfg = runs.run_config(run)
    extra = {"hidden_state": True} if target.returns_hidden() and not cfg.variant.head_layout else {}
    req = request_for(cfg.evaluated_policy, state, row_id, **cfg.variant.overrides(), **extra)
    return Job(0, target, head_layout=cfg.variant.head_layout).request(req)

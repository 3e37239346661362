"""Production traffic as a run: the adapter's decision log (a file, or CloudWatch Logs) imported
into the store, and replayed on another target (no Streamlit).

A log line is written by adapter/server/decision_log.py. An imported log becomes one run of kind
"production" whose results are the decisions as the adapter made them (probabilities, the gated
decision, model and prompt hashes), keyed `request_id/row_id`. Rows whose state was logged
(`SM_SEMIF_LOG_STATES=1`) can be replayed on any target as a "replay" run with the same keys, so
the drift comparison (app/core/drift.py) pairs production with the replay row by row; rows without a
state can still be reviewed by their probabilities, never re-scored.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Iterator, Mapping

from adapter.schema import LOG_MARKER as MARKER
from adapter.engine.templates import request_for

from adapter.ids import collision, collision_message, id_problem
from adapter.schema import MAX_OPTIONS

from app.core.inputs import MAX_ROWS, InputError, json_row
from app.core.runner import Case, Job, ProgressFn, score_into_runs
from app.core.store import Store
from app.core.stored import NO_RESPONSE, StoredResponse
from app.targets.base import Target

PRODUCTION = "production"
REPLAY = "replay"
CLOUDWATCH_FILTER = f'"{MARKER}"'  # a quoted term: CloudWatch (and moto) return only lines holding it


@dataclass
class ParsedLog:
    records: list[dict[str, Any]]
    skipped: int = 0  # lines that are not decision lines (other log output, EMF from elsewhere)
    problems: list[str] = field(default_factory=list)  # decision lines that could not be read


def parse_lines(lines: Iterable[str]) -> ParsedLog:
    """Decision records from log lines; other lines (uvicorn's, anything else on stdout) are
    skipped and counted, a decision line that is not valid - not strict JSON (inputs.json_row: depth,
    big integers, NaN, NUL, surrogates), or without a valid time, ids or probabilities - is left out and
    named by its line number. At most inputs.MAX_ROWS decision lines (InputError beyond)."""
    out = ParsedLog([])
    for n, line in enumerate(lines, 1):
        text = line.strip()
        if not text or MARKER not in text:
            out.skipped += bool(text)
            continue
        try:
            rec = json_row(text)
        except ValueError as exc:
            out.problems.append(f"line {n}: {exc}")
            continue
        if not isinstance(rec, dict) or rec.get(MARKER) != 1:
            out.skipped += 1
            continue
        problem = line_problem(rec)
        if problem:
            out.problems.append(f"line {n}: {problem}")
            continue
        if len(out.records) >= MAX_ROWS:
            raise InputError([f"line {n}: the log holds more than {MAX_ROWS:,} decisions - import it in parts "
                              "(CloudWatch: --start/--end)"])
        out.records.append(rec)
    return out


def line_problem(rec: Mapping[str, Any]) -> str | None:
    """Why a decision line cannot be imported as a decision, or None: the fields the run is built from."""
    missing = [k for k in ("time", "request_id", "row_id", "option_ids", "probabilities") if rec.get(k) in (None, "", [])]
    if missing:
        return f"decision line without {', '.join(missing)}"
    for key in ("request_id", "row_id"):
        if not isinstance(rec[key], str) or len(rec[key]) > 400 or not rec[key].isprintable():
            return f"{key} is not a printable string of at most 400 characters"
    t = rec["time"]
    try:
        if not isinstance(t, str):
            raise ValueError
        when = datetime.fromisoformat(t)
        if when.tzinfo is None:
            raise ValueError
    except ValueError:
        return f"time {str(t)[:40]!r} is not an ISO 8601 time with a zone (the adapter writes e.g. 2026-12-05T10:00:00.000+00:00)"
    ids, probs = rec["option_ids"], rec["probabilities"]
    if not isinstance(ids, list) or not 2 <= len(ids) <= MAX_OPTIONS or not all(isinstance(i, str) for i in ids):
        return f"option_ids is not a list of 2 to {MAX_OPTIONS} ids"
    bad = next(((i, p) for i, p in ((i, id_problem(x)) for i, x in enumerate(ids)) if p), None)
    if bad is not None:
        return f"option_ids.{bad[0]} {bad[1]}"
    clash = collision(ids)
    if clash is not None:
        return f"option_ids.{clash[1]}: {collision_message(ids[clash[0]], ids[clash[1]])}"
    for key in ("probabilities", "calibrated_probabilities"):
        values = rec.get(key)
        if key != "probabilities" and values is None:
            continue
        if (not isinstance(values, list) or len(values) != len(ids)
                or not all(isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) and 0 <= p <= 1
                           for p in values)):
            return f"{key} is not {len(ids)} finite numbers in [0, 1], one per option"
        if abs(sum(values) - 1) > 1e-3:
            return f"{key} sum to {sum(values):.4f}, not 1"
    return None


def parse_text(data: bytes | str) -> ParsedLog:
    """A decision log file, read line by line as a stream (a line that is not UTF-8 is a problem naming
    it, never replaced characters)."""
    if isinstance(data, str):
        return parse_lines(data.splitlines())
    bad: list[str] = []

    def lines() -> Iterator[str]:
        start, n = 0, 0
        while start <= len(data):
            end = data.find(b"\n", start)
            end = len(data) if end < 0 else end
            n += 1
            try:
                yield data[start:end].decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError:
                bad.append(f"line {n}: not UTF-8 text")
                yield ""
            start = end + 1

    parsed = parse_lines(lines())
    parsed.problems[:0] = bad
    return parsed


def fetch_cloudwatch(log_group: str, *, stream_prefix: str | None = None, start_ms: int | None = None,
                     end_ms: int | None = None, region: str | None = None, endpoint_url: str | None = None) -> list[str]:
    """The decision lines of a CloudWatch Logs group (on SageMaker: /aws/sagemaker/Endpoints/<name>),
    through boto3's filter_log_events paginator; a clear error for a missing group or no credentials."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    logs = boto3.client("logs", region_name=region, endpoint_url=endpoint_url)
    kwargs: dict[str, Any] = {"logGroupName": log_group, "filterPattern": CLOUDWATCH_FILTER}
    if stream_prefix:
        kwargs["logStreamNamePrefix"] = stream_prefix
    if start_ms is not None:
        kwargs["startTime"] = int(start_ms)
    if end_ms is not None:
        kwargs["endTime"] = int(end_ms)
    lines: list[str] = []
    try:
        for page in logs.get_paginator("filter_log_events").paginate(**kwargs):
            lines += [e["message"] for e in page.get("events", [])]
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "ResourceNotFoundException":
            raise InputError([f"CloudWatch log group {log_group!r} does not exist (on SageMaker it is "
                              "/aws/sagemaker/Endpoints/<endpoint name>)"]) from None
        raise InputError([f"CloudWatch Logs: {exc}"]) from None
    except BotoCoreError as exc:
        raise InputError([f"CloudWatch Logs: {exc} - are AWS credentials and a region set?"]) from None
    return lines


def matching(records: list[dict[str, Any]], policy: Mapping[str, Any]) -> tuple[list[dict[str, Any]], Counter[str]]:
    """The records decided with this policy's options (in its order; a record naming a calibrated
    policy must name this one), and a count of the others by why they were left out."""
    ids = [o["id"] for o in policy["options"]]
    kept: list[dict[str, Any]] = []
    left: Counter[str] = Counter()
    for rec in records:
        named = (rec.get("policy") or {}).get("policy_id")
        if named and named != policy["id"]:
            left[f"policy {named}"] += 1
        elif rec["option_ids"] != ids:
            left["other options"] += 1
        else:
            kept.append(rec)
    return kept, left


def row_key(rec: Mapping[str, Any]) -> str:
    return f"{rec['request_id']}/{rec['row_id']}"


def import_records(store: Store, records: list[dict[str, Any]], policy: Mapping[str, Any], *, source: str) -> tuple[int, dict[str, Any]]:
    """One production run of the records that fit `policy`; (run id, summary). InputError when
    none fit, naming what the log holds instead."""
    kept, left = matching(records, policy)
    if not kept:
        held = ", ".join(f"{n} × {why}" for why, n in left.most_common()) or "no decisions"
        raise InputError([f"none of the {len(records)} decisions fit policy {policy['id']!r} "
                          f"({', '.join(o['id'] for o in policy['options'])}): the log holds {held}"])
    by_key: dict[str, dict[str, Any]] = {}
    for rec in kept:  # a request logged twice (a log read twice) counts once
        by_key.setdefault(row_key(rec), rec)
    kept = list(by_key.values())
    models = Counter((r.get("model") or {}).get("sha256") or "unknown" for r in kept)
    summary = {"source": source, "decisions": len(kept), "left_out": dict(left),
               "with_state": sum(1 for r in kept if "state" in r),
               "gated": sum(1 for r in kept if (r.get("decision") or {}).get("gated")),
               "models": dict(models), "prompts": len({r.get("prompt_sha256") for r in kept}),
               "first": min(r["time"] for r in kept), "last": max(r["time"] for r in kept)}
    target = {"name": f"production · {source}"[:120], "kind": "decision-log", "config": {"source": source}}
    run_id = store.create_run(kind=PRODUCTION, policy=policy, target=target, n_rows=len(kept),
                              note=f"decision log {source}", config={"import": summary})
    files = {(r.get("model") or {}).get("file") for r in kept}
    store.set_run_model(run_id, ", ".join(sorted(f for f in files if f)) or "unknown")
    for pos, rec in enumerate(sorted(kept, key=lambda r: (r["time"], row_key(r)))):
        decision = rec.get("decision") or {}
        request = ({"id": rec["row_id"], "state": rec["state"], "readout": rec.get("readout"),
                    "debias": rec.get("debias")} if "state" in rec else None)
        store.add_result(run_id, {"row_key": row_key(rec), "position": pos, "state": rec.get("state"), "label": None,
                                  "cold": 0, "option_ids": rec["option_ids"], "probabilities": rec["probabilities"],
                                  "top_option": rec.get("top_option"), "label_mass": rec.get("label_mass"),
                                  "probability_status": "calibrated" if decision else rec.get("probability_status"),
                                  "readout": rec.get("readout"), "latency_s": (rec.get("latency_ms") or 0) / 1000,
                                  "error": None, "request": request, "response": rec})
    store.finish_run(run_id, "done")
    return run_id, summary


def replay(store: Store, run_id: int, target: Target, progress: ProgressFn | None = None) -> int:
    """The production run's rows that carry a state, scored on `target` as they were read in
    production (the logged readout and correction, the run's policy): a replay run with the same
    row keys, for the drift comparison. ValueError when no row carries a state."""
    run = store.get_run(run_id)
    if run is None or run["kind"] != PRODUCTION:
        raise ValueError(f"run #{run_id} is not an imported decision log")
    rows = [r for r in store.results(run_id) if r.get("state") is not None]
    if not rows:
        raise ValueError(f"run #{run_id} has no logged states (the adapter ran without SM_SEMIF_LOG_STATES=1): "
                         "its decisions can be reviewed, not replayed")
    policy = run["policy"]
    items = []
    for pos, r in enumerate(rows):
        rec = StoredResponse.of(r) or NO_RESPONSE
        over: dict[str, Any] = {k: v for k, v in (("readout", rec.readout), ("debias", rec.debias)) if v}
        if (rec.permutations or 1) > 1:
            over["permute"] = True
        items.append((pos, Case(r["row_key"], r["state"], None), request_for(policy, r["state"], r["row_key"], **over)))
    new = store.create_run(kind=REPLAY, policy=policy, target=target.describe(), n_rows=len(items),
                           group_id=run["group_id"], note=f"replay of run #{run_id}", config={"replay_of": run_id})
    score_into_runs(store, [Job(new, target)], items, total=len(items), progress=progress)
    return new

"""Runs a policy over states against targets, saving each result as it arrives (no Streamlit).

Rows go outer and targets inner, so a half-finished comparison already shows every target for
the rows it reached. Progress is reported as (done, total, eta_seconds) to a callback.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterable

from adapter.policies import request_for

from .store import Store
from .targets import Target, TargetResult


@dataclass
class Row:
    key: str
    state: object
    label: str | None = None


class Progress:
    """Counts and a simple ETA from the mean time per finished item."""

    def __init__(self, total: int, callback: Callable[[int, int, float | None], None] | None = None,
                 already: int = 0):
        """`already`: items finished before this session (a resumed run) - counted, not timed."""
        self.total, self.done, self.already = total, already, already
        self.t0, self.callback = time.perf_counter(), callback

    def tick(self, n: int = 1) -> None:
        self.done += n
        if self.callback:
            self.callback(self.done, self.total, self.eta())

    def eta(self) -> float | None:
        timed = self.done - self.already
        if timed <= 0:
            return None
        return (time.perf_counter() - self.t0) / timed * (self.total - self.done)


def progress_text(done: int, total: int, eta: float | None) -> str:
    if done >= total:
        return f"{done}/{total} calls · done"
    left = "" if eta is None else f" · about {eta:.0f} s left" if eta >= 1 else " · almost done"
    return f"{done}/{total} calls{left}"


def result_row(res: TargetResult, row: Row, position: int) -> dict:
    r = res.result or {}
    return {"row_key": row.key, "position": position,
            "state": row.state if isinstance(row.state, str) else json.dumps(row.state, ensure_ascii=False),
            "label": row.label, "option_ids": r.get("option_ids"), "probabilities": r.get("probabilities"),
            "top_option": r.get("top_option"), "label_mass": r.get("label_mass"), "latency_s": res.latency_s,
            "error": res.error, "request": res.request, "response": res.response}


def model_identity(result: dict | None, target: Target) -> str:
    if result and isinstance(result.get("model"), dict):
        m = result["model"]
        return f"{m.get('file')} ({str(m.get('sha256', ''))[:12]})"
    return str(target.config.get("model") or target.config.get("endpoint_name") or target.kind)


def run_policy(store: Store, policy: dict, rows: list[Row], targets: Iterable[Target], *, kind: str,
               progress: Callable[[int, int, float | None], None] | None = None,
               overrides: dict | None = None, group_id: str | None = None) -> tuple[str, list[int]]:
    """Score every row on every target; return (group id, run ids in target order)."""
    targets = list(targets)
    requests = [request_for(policy, row.state, row.key, **(overrides or {})) for row in rows]
    group = group_id or uuid.uuid4().hex[:12]
    run_ids = [store.create_run(kind=kind, policy=policy, target=t.describe(), n_rows=len(rows), group_id=group)
               for t in targets]
    tracker = Progress(len(rows) * len(targets), progress)
    named = {rid: False for rid in run_ids}
    status = {rid: "done" for rid in run_ids}
    try:
        for pos, (row, req) in enumerate(zip(rows, requests)):
            for target, rid in zip(targets, run_ids):
                res = target.decide([req])[0]
                store.add_result(rid, result_row(res, row, pos))
                if res.ok and not named[rid]:
                    store.set_run_model(rid, model_identity(res.result, target))
                    named[rid] = True
                tracker.tick()
    except BaseException:
        status = {rid: "interrupted" for rid in run_ids}
        raise
    finally:
        for rid in run_ids:
            errors = sum(1 for r in store.results(rid) if r["error"])
            final = status[rid] if status[rid] != "done" else ("failed" if rows and errors == len(rows) else "done")
            store.finish_run(rid, final)
    return group, run_ids

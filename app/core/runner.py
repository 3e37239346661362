"""The one scoring loop of the workbench (no Streamlit): cases x targets into stored runs.

Playground, Compare, the benchmark and labeled-set evaluations all go through `score_into_runs`:
cases go outer and targets inner, so a half-finished comparison already shows every target for
the cases it reached; each result is saved as it arrives (a resumed run never re-scores or
duplicates a case); every run holds a lease while it is scored. Progress is reported as
(done, total, eta_seconds) to a callback.
"""
from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from adapter.schema import HEAD_LAYOUT, DecisionRequest
from adapter.engine.templates import request_for

from app.core.reuse import copied_row, reuse_key
from app.core.records import Result, RunConfig, RunStatus
from app.core.store import LEASE_SECONDS, RunBusy, Store, StoreUnavailable
from app.core.stored import NO_RESPONSE, ModelRef, StoredResponse
from app.targets.base import Target, TargetError, TargetResult
from app.targets.local import LocalTarget

ProgressFn = Callable[[int, int, "float | None"], object]  # the return value is ignored (a page may pass bar.progress)
log = logging.getLogger("semif.workbench")


@dataclass
class Case:
    """One state to decide on, with its key and, for labeled sets, the correct option id."""
    key: str
    state: object
    label: str | None = None


class StopScoring(Exception):
    """Raised by a progress callback to stop between rows (the analyst's Stop, a stop rule): the runs
    are marked stopped - not interrupted - and resume like any other."""


class Progress:
    """Counts and a simple ETA from the mean time per finished item."""

    def __init__(self, total: int, callback: ProgressFn | None = None, already: int = 0):
        """`already`: items finished before this session (a resumed run) - counted, not timed."""
        self.total, self.done, self.already = total, already, already
        self.t0, self.callback = time.perf_counter(), callback
        self.first: tuple[float, int] | None = None  # (when, done) at the first row of this session

    def tick(self, n: int = 1) -> None:
        self.done += n
        if self.first is None:  # the first row pays for the model load and the policy's first passes
            self.first = (time.perf_counter(), self.done)
        if self.callback:
            self.callback(self.done, self.total, self.eta())

    def eta(self) -> float | None:
        """Seconds left, from the time per row since the first row (which pays the policy's one-time
        passes and would inflate every estimate); None until two more rows are timed."""
        if self.first is None or self.done - self.first[1] < 2:
            return None
        per_row = (time.perf_counter() - self.first[0]) / (self.done - self.first[1])
        return per_row * (self.total - self.done)


def progress_text(done: int, total: int, eta: float | None, unit: str = "calls") -> str:
    if done >= total:
        return f"{done}/{total} {unit} · done"
    left = "" if eta is None else f" · about {eta:.0f} s left" if eta >= 1 else " · almost done"
    return f"{done}/{total} {unit}{left}"


_WARM: set[str] = set()  # (target, policy) pairs that have answered once in this process


def is_cold(target: Target, req: DecisionRequest) -> bool:
    """True for the first call of a target (for a local one: of the model instance now loaded, so a
    reload after eviction is cold again) on a policy: it pays for connections and the policy's own first
    work (its prompt prefix, its content-free prior), which later calls reuse; a local model is loaded by
    Target.prepare, before the call is timed (analysis.cold_note says so on the page)."""
    ident = dict(target.describe())
    if isinstance(target, LocalTarget):
        engine = target.engine()
        ident["engine"] = engine.generation or id(engine)  # pool engines: a load generation, never reused
    policy = [req.question, [o.id for o in req.options], req.readout, req.debias, req.permute, len(req.examples)]
    key = json.dumps([ident, policy], sort_keys=True, default=str)
    if key in _WARM:
        return False
    _WARM.add(key)
    return True


def result_row(res: TargetResult, case: Case, position: int, cold: bool = False,
               req: DecisionRequest | None = None) -> dict[str, Any]:
    """A target's answer as a stored result; with the request, its reuse key (app/core/reuse.py) when the
    answer names its model."""
    r = res.result
    key = reuse_key(r.model, req) if (r is not None and req is not None and res.ok) else None
    return {"row_key": case.key, "position": position, "state": case.state, "label": case.label, "cold": int(cold),
            "reuse_key": key,
            "option_ids": r.option_ids if r else None, "probabilities": r.probabilities if r else None,
            "top_option": r.top_option if r else None, "label_mass": r.label_mass if r else None,
            "probability_status": r.probability_status if r else None, "readout": r.readout if r else None,
            "latency_s": res.latency_s, "error": res.error, "request": res.request, "response": res.response}


def model_label(model: ModelRef | None, fallback: str) -> str:
    """How a run names the model that answered (ModelRef.label); `fallback` when no model was named."""
    return model.label(fallback) if model is not None else fallback


def model_identity(res: TargetResult, target: Target) -> str:
    return model_label(ModelRef.of(res.result.model) if res.result else None,
                       str(target.config.get("model") or target.config.get("endpoint_name") or target.kind))


@dataclass
class Job:
    """One stored run being filled by one target; with `hidden`, its rows also ask the target for their
    hidden state (what a learned head reads: Compare asks the targets that can return it, only those);
    with `head_layout`, they are rendered in the head layout (policy first) with their hidden state.
    `done`: the row keys this run already holds (skipped when several runs are filled together)."""
    run_id: int
    target: Target
    hidden: bool = False
    head_layout: bool = False
    done: frozenset[str] = frozenset()

    def request(self, req: DecisionRequest) -> DecisionRequest:
        """The row as this job sends it."""
        if self.head_layout:
            return req.in_head_layout()
        return req.model_copy(update={"hidden_state": True}) if self.hidden and not req.hidden_state else req


def final_status(results: Sequence[Mapping[str, Any]]) -> RunStatus:
    """done: every case answered; done-with-errors: some failed; failed: all failed."""
    errors = sum(1 for r in results if r["error"])
    return "done" if not errors else "failed" if errors == len(results) else "done-with-errors"


class Heartbeat:
    """Renews the leases of the runs being scored, every third of LEASE_SECONDS, while a worker is
    busy between results (a model load, a Batch Transform job of many minutes). A lease it cannot
    renew was taken over: the worker's next add_result then raises RunBusy."""

    def __init__(self, store: Store, leases: dict[int, str], every: float = LEASE_SECONDS / 3):
        self.store, self.leases, self.every = store, leases, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="lease-heartbeat")

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            for run_id, lease in list(self.leases.items()):
                try:
                    self.store.renew_lease(run_id, lease)
                except RunBusy:
                    self.leases.pop(run_id, None)
                except (StoreUnavailable, sqlite3.Error) as exc:  # locked or unwritable for a moment: keep beating, say so
                    log.warning("could not renew the lease of run %s (%s); retrying in %.0f s", run_id, exc, self.every)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def score_into_runs(store: Store, jobs: list[Job], items: Iterable[tuple[int, Case, DecisionRequest]], *,
                    total: int, already: int = 0, progress: ProgressFn | None = None,
                    reuse: bool = False, by_source: bool = False, blocks: bool = False) -> dict[int, dict[str, int]]:
    """Score (position, case, request) items on every job's target, saving as results arrive. Each
    run is leased for this call (RunBusy when another worker holds one); a run whose worker stops
    (an exception, Ctrl-C, a closed page) is marked interrupted. With `reuse`, a stored successful
    result of the same request on the same model (app/core/reuse.py) is copied instead of calling the
    target - for evaluations; runs that measure latency (Playground, Compare, bench) call every time.
    `by_source`: every row on one job before the next job starts (one model in use at a time: a pool that
    keeps fewer models than the jobs use never reloads one per row); else row by row over the jobs.
    `blocks` (evaluations): a target's rows go to it `row_block()` at a time (a local engine decodes a block's
    head-layout rows together: SM_SEMIF_ROW_BATCH); runs that measure latency send one row a call.
    Returns {run id: {"evaluated": calls made, "reused": results copied}}."""
    leases: dict[int, str] = {}
    try:
        for job in jobs:
            leases[job.run_id] = store.take_lease(job.run_id)
        with Heartbeat(store, dict(leases)):
            counts = _score(store, jobs, list(items), leases, total=total, already=already, progress=progress,
                            reuse=reuse, by_source=by_source, blocks=blocks)
    except BaseException as exc:
        for run_id, lease in leases.items():
            try:  # only runs this worker still holds
                store.stop_run(run_id, "stopped" if isinstance(exc, StopScoring) else "interrupted", lease)
            except StoreUnavailable:  # the file that failed the run fails this too: the first error is the one to show
                pass  # (a run left "running" shows as interrupted once its lease runs out)
        raise
    for job in jobs:
        store.finish_run(job.run_id, final_status(store.results(job.run_id)), leases[job.run_id])
    return counts


def reusable_for(store: Store, target: Target, items: list[tuple[int, Case, DecisionRequest]]) -> dict[int, Result]:
    """Item index -> the stored result that answers it on this target's model (none when the target
    cannot name its model)."""
    try:
        ident = target.numerics()
    except Exception as exc:  # the target's own call reports why it cannot be reached: every row is scored
        log.warning("target %s cannot name its model (%s): no stored result is reused", target.name, exc)
        ident = None
    if ident is None:
        return {}
    keys = [reuse_key(ident, req) for _, _, req in items]
    found = store.reusable([k for k in keys if k])
    return {i: found[k] for i, k in enumerate(keys) if k in found}


def _score(store: Store, jobs: list[Job], items: list[tuple[int, Case, DecisionRequest]], leases: dict[int, str], *,
           total: int, already: int, progress: ProgressFn | None, reuse: bool = False,
           by_source: bool = False, blocks: bool = False) -> dict[int, dict[str, int]]:
    tracker = Progress(total * len(jobs), progress, already=already * len(jobs))
    named = {job.run_id: bool((store.get_run(job.run_id) or {"model": None})["model"]) for job in jobs}
    looked: dict[int, dict[int, Result]] = {}

    def stored(job: Job) -> dict[int, Result]:  # looked up when the job starts: by source, one model loaded at a time
        if job.run_id not in looked:
            looked[job.run_id] = (reusable_for(store, job.target, [(p, c, job.request(r)) for p, c, r in items])
                                  if reuse else {})
        return looked[job.run_id]

    counts = {job.run_id: {"evaluated": 0, "reused": 0} for job in jobs}
    batched: dict[int, dict[int, TargetResult]] = {}
    for job in jobs:
        if job.target.batch_only:  # Batch Transform: one job for the rows not reused, then ingested row by row
            todo = [i for i in range(len(items)) if i not in stored(job)]
            batched[job.run_id] = dict(zip(todo, batch_results(job.target, [job.request(items[i][2]) for i in todo])))
    # rows go to a target in blocks of its `row_block()` (a local engine with SM_SEMIF_ROW_BATCH > 1 decodes a
    # block's head-layout rows together, as parallel sequences); with blocks of 1 (the default, every other
    # target) this is the row-by-row order exactly, each result saved as it arrives
    sizes = {job.run_id: job.target.row_block() if blocks and not job.target.batch_only else 1 for job in jobs}
    block = max(sizes.values(), default=1)
    starts = range(0, len(items), block)
    order = ([(job, range(s, min(s + block, len(items)))) for job in jobs for s in starts] if by_source else
             [(job, range(s, min(s + block, len(items)))) for s in starts for job in jobs])
    for job, rows in order:
        pending: list[tuple[int, DecisionRequest, bool]] = []  # (item, request as sent, cold)
        for i in rows:
            pos, case, req = items[i]
            if case.key in job.done:
                tracker.tick()
                continue
            hit = stored(job).get(i)
            if hit is not None:
                store.add_result(job.run_id, copied_row(hit, row_key=case.key, position=pos, state=case.state,
                                                        label=case.label), leases[job.run_id])
                counts[job.run_id]["reused"] += 1
                if not named[job.run_id]:
                    store.set_run_model(job.run_id, model_label((StoredResponse.of(hit) or NO_RESPONSE).model,
                                                                job.target.kind))
                    named[job.run_id] = True
                tracker.tick()
                continue
            sent = job.request(req)
            pending.append((i, sent, is_cold(job.target, sent)))
        size = sizes[job.run_id]
        for at in range(0, len(pending), size):
            part = pending[at: at + size]
            if job.run_id in batched:
                got = [batched[job.run_id][i] for i, _, _ in part]
            elif len(part) == 1:
                got = [job.target.decide(part[0][1])]
            else:
                got = job.target.decide_many([sent for _, sent, _ in part])
            for (i, sent, cold), res in zip(part, got):  # a block's results are all saved before a stop can come
                pos, case, _ = items[i]
                # a head-layout row decoded beside others has bits one row at a time would not give (within the
                # tolerance docs/benchmarks.md measures): stored without a reuse key, it is never copied as one
                together = len(part) > 1 and sent.layout == HEAD_LAYOUT
                store.add_result(job.run_id, result_row(res, case, pos, cold, None if together else sent),
                                 leases[job.run_id])
                counts[job.run_id]["evaluated"] += 1
                if res.ok and not named[job.run_id]:
                    store.set_run_model(job.run_id, model_identity(res, job.target))
                    named[job.run_id] = True
            for _ in part:
                tracker.tick()
    return counts


def batch_results(target: Target, requests: list[DecisionRequest]) -> list[TargetResult]:
    """A batch target's results for all requests; when the whole batch fails, each row carries the error."""
    if not requests:
        return []
    try:
        return target.decide_batch(requests)
    except TargetError as exc:
        return [TargetResult(r.id, 0.0, None, str(exc), r.model_dump(exclude_none=True)) for r in requests]


HEAD_LAYOUT_SUFFIX = " (head layout)"


def new_group_id() -> str:
    """A run group's id (a comparison, a Playground decision), made before its runs so a page can name it."""
    return uuid.uuid4().hex[:12]


def run_policy(store: Store, policy: Mapping[str, Any], cases: list[Case], targets: Iterable[Target], *, kind: str,
               progress: ProgressFn | None = None, overrides: dict[str, Any] | None = None,
               group_id: str | None = None, hidden: Callable[[Target], bool] | None = None,
               config: RunConfig | None = None, reuse: bool = False,
               head_layout: Iterable[Target] = (), blocks: bool = False) -> tuple[str, list[int]]:
    """Score every case on every target as a new group of runs; return (group id, run ids in target order).
    `hidden`: which targets are asked for the rows' hidden states; `config`: more for each run's config;
    `reuse`: copy a stored result of the same request on the same model instead of calling (reuse.py);
    `head_layout`: targets that also read every case in the head layout, as a run of their own named
    "TARGET (head layout)" and marked `head_layout` (only a learned head reads it: no column of its own);
    `blocks`: rows sent in blocks where a target decides several together (score_into_runs)."""
    targets, readers = list(targets), list(head_layout)
    requests = [request_for(policy, case.state, case.key, **(overrides or {})) for case in cases]
    group = group_id or new_group_id()
    run_ids = [store.create_run(kind=kind, policy=policy, target=t.describe(), n_rows=len(cases), group_id=group,
                                config={"overrides": overrides or {}, **(config or {})})
               for t in targets]
    layout_ids = [store.create_run(kind=kind, policy=policy, target={**t.describe(), "name": t.name + HEAD_LAYOUT_SUFFIX},
                                   n_rows=len(cases), group_id=group,
                                   config={"overrides": overrides or {}, **(config or {}), "head_layout": True})
                  for t in readers]
    jobs = [Job(r, t, bool(hidden and hidden(t))) for r, t in zip(run_ids, targets)]
    jobs += [Job(r, t, head_layout=True) for r, t in zip(layout_ids, readers)]
    score_into_runs(store, jobs, ((pos, case, req) for pos, (case, req) in enumerate(zip(cases, requests))),
                    total=len(cases), progress=progress, reuse=reuse, blocks=blocks)
    return group, run_ids + layout_ids

"""Runs and their results: create, lease (one worker per run), add results as they arrive, finish; read
back with counts, latencies and reusable results (app/core/reuse.py)."""
from __future__ import annotations

import json
import os
import socket
import time
import uuid
from typing import Any, Mapping, cast

import sqlite_utils

from app.core.records import Result, Run, RunConfig
from app.core.tables.base import Connection, _decode, _encode, now

LEASE_SECONDS = 60.0  # a worker renews its lease (runner: a heartbeat thread); a dead worker's runs out
OWNER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"  # this process
CREATED = f"{OWNER}:created"  # a run this process created and nobody has leased yet


# a run's accuracy in one place: answered rows with a label, and those whose top option is the label
ACCURACY_COUNTS = ("sum(error IS NULL AND label IS NOT NULL AND top_option IS NOT NULL) AS labeled, "
                   "sum(error IS NULL AND label IS NOT NULL AND top_option = label) AS correct")


class RunBusy(RuntimeError):
    """Another process is working on this run (it holds the run's lease)."""


def _alive(owner: str | None) -> bool:
    """Whether a lease owner can still be working: its lease is unexpired and, when it ran on this
    machine, its process exists (a killed worker shows as interrupted at once, not after a minute)."""
    host, _, rest = (owner or "").partition(":")
    pid = rest.partition(":")[0]
    if host == socket.gethostname() and pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
    return True


def _renew(db: sqlite_utils.Database, run_id: int, lease: str) -> None:
    """Extend `lease` on the run, in the caller's write transaction (Store.write); RunBusy when it
    was lost - the transaction then rolls back, so nothing else it holds is written."""
    cur = db.execute("UPDATE runs SET lease_until = ? WHERE id = ? AND lease_owner = ?",
                     [time.time() + LEASE_SECONDS, run_id, lease])
    if cur.rowcount != 1:
        raise RunBusy(f"run #{run_id} was taken over by another worker: this one stopped")


def _run(row: dict[str, Any]) -> dict[str, Any]:
    """A run as read: a 'running' run whose worker is gone (lease expired, or its process dead)
    was interrupted."""
    run = _decode(row)
    if run.get("status") == "running" and ((run.get("lease_until") or 0) < time.time() or not _alive(run.get("lease_owner"))):
        run["status"] = "interrupted"
    return run


class RunTable(Connection):
    """The runs and results tables."""

    # -- runs and results --------------------------------------------------------------------
    def create_run(self, *, kind: str, policy: Mapping[str, Any], target: Mapping[str, Any], n_rows: int, group_id: str | None = None,
                   note: str = "", labeled_set_id: int | None = None, config: RunConfig | None = None) -> int:
        row = {"group_id": group_id or uuid.uuid4().hex[:12], "kind": kind, "policy_id": policy.get("id"),
               "policy": policy, "target_name": target["name"], "target": target, "model": "",
               "status": "running", "n_rows": n_rows, "created_at": now(), "finished_at": None,
               "pinned": 0, "note": note, "labeled_set_id": labeled_set_id, "config": config or {},
               "lease_owner": CREATED, "lease_until": time.time() + LEASE_SECONDS}
        with self.db() as db:
            return int(db.table("runs").insert(_encode(row)).last_pk or 0)

    def take_lease(self, run_id: int) -> str:
        """Claim a run for one worker (atomically: two workers - processes, or two pages of one
        server - never score the same run) and return the lease token; or raise RunBusy naming who
        holds it."""
        token = f"{OWNER}:{uuid.uuid4().hex[:8]}"
        with self.write() as db:  # the owner read and the claim are one transaction
            (owner, until), = db.execute("SELECT lease_owner, lease_until FROM runs WHERE id = ?", [run_id]).fetchall()
            stale = owner if owner and not _alive(owner) else "\x00"
            cur = db.execute("UPDATE runs SET lease_owner = ?, lease_until = ?, status = 'running' WHERE id = ? AND "
                             "(lease_owner IS NULL OR lease_owner IN (?, ?) OR lease_until IS NULL OR lease_until < ?)",
                             [token, time.time() + LEASE_SECONDS, run_id, CREATED, stale, time.time()])
            claimed = cur.rowcount == 1
        if claimed:
            return token
        who = "another page of this workbench" if (owner or "").startswith(OWNER) else f"another process ({owner})"
        raise RunBusy(f"run #{run_id} is being scored by {who} for at least "
                      f"{max(0, (until or 0) - time.time()):.0f} s more: wait for it, or start a new run")

    def renew_lease(self, run_id: int, lease: str) -> None:
        """Still working: extend the lease; RunBusy when it was lost (expired and taken by another)."""
        with self.write() as db:
            _renew(db, run_id, lease)

    def stop_run(self, run_id: int, status: str = "interrupted", lease: str | None = None) -> None:
        """Stopped before finishing: the status says so and the lease is given back (with `lease`,
        only while this worker still holds it)."""
        self._end_run(run_id, {"status": status}, lease)

    def _end_run(self, run_id: int, update: dict[str, Any], lease: str | None) -> None:
        sets = ", ".join(f"{k} = ?" for k in update)
        where, args = ("id = ? AND lease_owner = ?", [run_id, lease]) if lease else ("id = ?", [run_id])
        with self.write() as db:
            db.execute(f"UPDATE runs SET {sets}, lease_owner = NULL, lease_until = NULL WHERE {where}",
                       [*update.values(), *args])

    def add_result(self, run_id: int, row: dict[str, Any], lease: str | None = None) -> None:
        """One result, written as it arrives; a row key already stored for this run is replaced
        (INSERT OR REPLACE on the unique (run_id, row_key) index), so a resumed run never duplicates.
        With `lease`, the write happens only while this worker holds the run (else RunBusy)."""
        with self.write() as db:  # the lease check and the write: one transaction
            if lease:
                _renew(db, run_id, lease)  # nothing is written when the lease was lost
            db.table("results").insert(_encode({**row, "run_id": run_id}), replace=True)

    def set_run_model(self, run_id: int, model: str) -> None:
        with self.db() as db:
            db.table("runs").update(run_id, {"model": model})

    def merge_run_config(self, run_id: int, values: RunConfig) -> None:
        """Set some keys of a run's config, the others kept: a figure learned about a run after it was scored
        (its learned head's out-of-fold accuracy, app/service/evaluate.remember_head)."""
        with self.write() as db:
            for key, value in values.items():
                db.execute("UPDATE runs SET config = json_set(ifnull(config, '{}'), ?, json(?)) WHERE id = ?",
                           [f'$."{key}"', json.dumps(value, ensure_ascii=False), run_id])

    def finish_run(self, run_id: int, status: str = "done", lease: str | None = None) -> None:
        """Final status, and the lease given back."""
        self._end_run(run_id, {"status": status, "finished_at": now()}, lease)

    def list_runs(self, kind: str | None = None) -> list[Run]:
        with self.db() as db:
            where, args = ("kind = ?", [kind]) if kind else (None, [])
            runs = [_run(r) for r in db.table("runs").rows_where(where, args, order_by="id desc")]
            counts = {r["run_id"]: (r["n"], r["errors"], r["labeled"], r["correct"]) for r in db.query(
                f"SELECT run_id, count(*) AS n, sum(error IS NOT NULL) AS errors, {ACCURACY_COUNTS} FROM results "
                "GROUP BY run_id")}
        for r in runs:
            r["done_rows"], r["error_rows"], r["labeled_rows"], r["correct_rows"] = counts.get(r["id"], (0, 0, 0, 0))
        return cast(list[Run], runs)

    def accuracy_counts(self, run_id: int) -> tuple[int, int]:
        """(correct, labeled) over a run's answered rows with a label - one query, however many rows
        (a stop rule asks after every row)."""
        with self.db() as db:
            (labeled, correct), = db.execute(f"SELECT {ACCURACY_COUNTS} FROM results WHERE run_id = ?",
                                             [run_id]).fetchall()
        return int(correct or 0), int(labeled or 0)

    def get_run(self, run_id: int) -> Run | None:
        with self.db() as db:
            rows = list(db.table("runs").rows_where("id = ?", [run_id]))
        return cast(Run, _run(rows[0])) if rows else None

    def runs_in_group(self, group_id: str) -> list[Run]:
        with self.db() as db:
            return [cast(Run, _run(r)) for r in db.table("runs").rows_where("group_id = ?", [group_id], order_by="id")]

    def results(self, run_id: int) -> list[Result]:
        with self.db() as db:
            return [cast(Result, _decode(r))
                    for r in db.table("results").rows_where("run_id = ?", [run_id], order_by="position")]

    def latencies(self, target_names: list[str], limit: int = 200,
                  head_layout: bool | None = None) -> dict[str, list[tuple[float, bool]]]:
        """(seconds, cold?) of the latest successful calls per target, newest first (a row copied from a
        stored result made no call: not counted). `head_layout`: only the rows of evaluation runs read in the
        head layout (True) or only the others (False) - a head-layout row costs a fraction of a zero-shot one."""
        out: dict[str, list[tuple[float, bool]]] = {t: [] for t in target_names}
        layout = ("" if head_layout is None else
                  f" AND ifnull(json_extract(runs.config, '$.layout'), '') {'=' if head_layout else '!='} 'policy-first'")
        with self.db() as db:
            for name in target_names:
                out[name] = [(r["latency_s"], bool(r["cold"])) for r in db.query(
                    "SELECT results.latency_s, results.cold FROM results JOIN runs ON runs.id = results.run_id "
                    "WHERE runs.target_name = ? AND results.error IS NULL AND results.reused_from IS NULL" + layout +
                    " ORDER BY results.id DESC LIMIT ?",
                    [name, limit])]
        return out

    def reusable(self, keys: list[str]) -> dict[str, Result]:
        """The newest successful stored result for each reuse key that has one (app/core/reuse.py)."""
        out: dict[str, Result] = {}
        wanted = sorted(set(keys))
        with self.db() as db:
            for at in range(0, len(wanted), 500):  # SQLite's bound-parameter limit
                chunk = wanted[at: at + 500]
                marks = ", ".join("?" * len(chunk))
                for r in db.query(f"SELECT * FROM results WHERE id IN (SELECT max(id) FROM results WHERE error IS NULL "
                                  f"AND probabilities IS NOT NULL AND reuse_key IN ({marks}) GROUP BY reuse_key)", chunk):
                    out[r["reuse_key"]] = cast(Result, _decode(r))
        return out

    def done_keys(self, run_id: int) -> set[str]:
        with self.db() as db:
            return {r["row_key"] for r in db.query("SELECT row_key FROM results WHERE run_id = ? AND error IS NULL",
                                                   [run_id])}

    def pin_run(self, run_id: int | None) -> None:
        """Pin one run as the baseline (at most one pinned, also when two pages pin at once: one
        statement unpins the others and pins this one); None unpins whichever is pinned."""
        with self.db() as db:
            db.execute("UPDATE runs SET pinned = (id IS ?) WHERE pinned = 1 OR id IS ?", [run_id, run_id])

    def unpin_run(self, run_id: int) -> None:
        """Unpin this run only (a view that still shows it pinned never unpins another page's new pin)."""
        with self.db() as db:
            db.execute("UPDATE runs SET pinned = 0 WHERE id = ?", [run_id])

    def pinned_run(self) -> Run | None:
        with self.db() as db:
            rows = list(db.table("runs").rows_where("pinned = 1"))
        return cast(Run, _run(rows[0])) if rows else None

    def delete_run(self, run_id: int) -> None:
        with self.write() as db:
            db.table("results").delete_where("run_id = ?", [run_id])
            db.table("runs").delete_where("id = ?", [run_id])

    def run_version(self, run_id: int) -> tuple[int, int]:
        """(results stored, newest result id): changes whenever a result is added - a cache key."""
        with self.db() as db:
            (n, last), = db.execute("SELECT count(*), coalesce(max(id), 0) FROM results WHERE run_id = ?",
                                    [run_id]).fetchall()
        return n, last

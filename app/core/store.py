"""Everything the workbench keeps, in one SQLite file (sqlite-utils).

Tables: policies, targets, runs, results (+ labeled sets, deployments and the audit log as those
features land). The file is `SEMIF_DB`, else data/workbench.db; the schema is created on first
use. Each call opens its own connection, so Streamlit's per-rerun threads never share one.

Concurrency (several pages, sessions and processes share the file): WAL, a busy timeout, and every
check-then-write in one write transaction taken at its start (`BEGIN IMMEDIATE`, see `write()`) or
in one conditional statement (`UPDATE ... WHERE version = ?` and its row count), so two writers
never both pass the same check. sqlite-utils commits each `execute` by itself unless a transaction
is open: `write()` opens one, so the statements inside are one transaction for real.

A file that cannot be written (read-only, disk full, folder missing) raises StoreUnavailable: one
line naming the file and what to do, instead of a traceback; what was written before stays.
"""
from __future__ import annotations

import getpass
import json
import os
import socket
import sqlite3
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping, cast

import sqlite_utils

from app.core.records import (AuditEntry, Calibrated, Deployment, LabeledRow, LabeledSet, Policy, Result, Review, Run,
                              RunConfig, RunStatus, TargetSpec)
from app.settings import WorkbenchSettings


SCHEMA: dict[str, dict[str, Any]] = {
    "policies": {"columns": {"id": str, "name": str, "question": str, "options": str, "examples": str,
                             "notes": str, "readout": str, "debias": str, "guard": str, "created_at": str,
                             "updated_at": str, "version": int}, "pk": "id"},
    "targets": {"columns": {"name": str, "kind": str, "config": str, "created_at": str}, "pk": "name"},
    "runs": {"columns": {"id": int, "group_id": str, "kind": str, "policy_id": str, "policy": str,
                         "target_name": str, "target": str, "model": str, "status": str, "n_rows": int,
                         "created_at": str, "finished_at": str, "pinned": int, "note": str,
                         "labeled_set_id": int, "config": str, "lease_owner": str, "lease_until": float},
             "pk": "id"},
    "deployments": {"columns": {"id": str, "path": str, "compute": str, "region": str, "endpoint_name": str,
                                "model_name": str, "endpoint_config_name": str, "status": str, "config": str,
                                "plan": str, "created_at": str, "updated_at": str}, "pk": "id"},
    "calibrated_policies": {"columns": {"id": int, "policy_id": str, "name": str, "run_id": int, "created_at": str,
                                        "gate_source": str, "threshold": float, "coverage": float, "accuracy": float,
                                        "model_file": str, "model_sha256": str, "dataset_hash": str, "config": str},
                            "pk": "id"},
    "audit": {"columns": {"id": int, "deployment_id": str, "at": str, "who": str, "action": str, "what": str,
                          "result": str}, "pk": "id"},
    # what was logged to MLflow (app/core/tracking.py): each record kept before it is sent, so an unreachable
    # tracker leaves it `pending` for the next try and never loses it; `sent` rows name the MLflow run
    "tracking": {"columns": {"id": int, "at": str, "kind": str, "workbench_id": str, "tracking_uri": str,
                             "record": str, "status": str, "tries": int, "error": str, "experiment_id": str,
                             "mlflow_run_id": str, "sent_at": str}, "pk": "id"},
    "labeled_sets": {"columns": {"id": int, "name": str, "policy_id": str, "content_hash": str, "n_rows": int,
                                 "source": str, "created_at": str, "parent_id": int}, "pk": "id"},
    # the review queue: one row per label given (or row skipped), who and when; `set_id` is the set
    # version it went into (NULL while pending), `undone` marks one taken back
    "review_labels": {"columns": {"id": int, "policy_id": str, "item_key": str, "run_id": int, "row_key": str,
                                  "state": str, "label": str, "action": str, "note": str, "who": str, "at": str,
                                  "set_id": int, "undone": int}, "pk": "id"},
    "labeled_rows": {"columns": {"id": int, "set_id": int, "row_key": str, "position": int, "state": str,
                                 "label": str, "split": str, "meta": str}, "pk": "id"},
    "results": {"columns": {"id": int, "run_id": int, "row_key": str, "position": int, "state": str,
                            "label": str, "option_ids": str, "probabilities": str, "top_option": str,
                            "label_mass": float, "probability_status": str, "readout": str, "latency_s": float,
                            "cold": int,
                            "error": str, "request": str, "response": str,
                            "reuse_key": str, "reused_from": int}, "pk": "id"},
}
JSON_COLUMNS = {"options", "examples", "config", "policy", "target", "option_ids", "probabilities",
                "request", "response", "meta", "plan"}


STATE_COLUMNS = {"state"}  # a state is text or JSON: stored tagged so each comes back as it went in


def encode_state(state: Any) -> str:
    """'t:' + text, or 'j:' + JSON for an object/array state: the text "42" stays text, and an
    object state is scored as the same object (rendered like the adapter renders it)."""
    return "t:" + state if isinstance(state, str) else "j:" + json.dumps(state, ensure_ascii=False)


def decode_state(stored: Any) -> Any:
    if isinstance(stored, str) and stored[:2] in ("t:", "j:"):
        return stored[2:] if stored[0] == "t" else json.loads(stored[2:])
    return stored  # written before the tagged encoding: text


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


LEASE_SECONDS = 60.0  # a worker renews its lease (runner: a heartbeat thread); a dead worker's runs out
OWNER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"  # this process
CREATED = f"{OWNER}:created"  # a run this process created and nobody has leased yet


# a run's accuracy in one place: answered rows with a label, and those whose top option is the label
ACCURACY_COUNTS = ("sum(error IS NULL AND label IS NOT NULL AND top_option IS NOT NULL) AS labeled, "
                   "sum(error IS NULL AND label IS NOT NULL AND top_option = label) AS correct")
BUSY_TIMEOUT_MS = 5000  # how long a write waits for another writer's transaction before giving up


class StaleEdit(RuntimeError):
    """An edit based on an older saved version of the same record (or of one deleted since)."""


class Exists(RuntimeError):
    """A record with this name or id was created meanwhile (by another page, session or process)."""


class StoreUnavailable(RuntimeError):
    """The database file cannot be used: the message is one line naming the file and the fix."""


# SQLite's primary result codes for "this file cannot take writes" (sqlite3.Error.sqlite_errorcode & 0xff)
_READONLY, _FULL, _CANTOPEN, _IOERR, _BUSY, _PERM, _CORRUPT, _NOTADB = 8, 13, 14, 10, 5, 3, 11, 26


def unavailable(path: Path, exc: BaseException) -> StoreUnavailable | None:
    """The one-line explanation of a database error that is the file's fault, or None for other
    errors (a bug: those keep their traceback)."""
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    what = str(exc)
    if code in (_CORRUPT, _NOTADB) or "not a database" in what or "malformed" in what:
        return StoreUnavailable(f"cannot use the workbench database {path} ({what}): the file is not a SQLite database "
                                "or is damaged - restore it from a copy, or point SEMIF_DB (--db) at another file (a "
                                "new one is created); nothing was changed in it")
    read_only = not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK))
    if (isinstance(exc, PermissionError) or code in (_READONLY, _PERM) or "readonly" in what
            or (code == _CANTOPEN and read_only)):  # a WAL file cannot even be read without its -shm beside it
        fix = ("the file or its folder is read-only: make both writable (the folder holds SQLite's -wal and -shm "
               "files), or point SEMIF_DB (--db) at a writable copy")
    elif code == _FULL or "disk is full" in what or getattr(exc, "errno", None) == 28:
        fix = "the disk is full: free some space there, then run it again (it resumes where it stopped)"
    elif code == _CANTOPEN or isinstance(exc, OSError):
        fix = ("the file cannot be opened: check that its folder exists and is writable, or point SEMIF_DB (--db) "
               "at another file")
    elif code == _IOERR:
        fix = "the disk reported an I/O error: check the disk (or free space), then run it again"
    elif code == _BUSY:
        fix = (f"another process kept it locked for more than {BUSY_TIMEOUT_MS / 1000:g} s: wait for it to finish, "
               "then try again")
    else:
        return None
    return StoreUnavailable(f"cannot write the workbench database {path} ({what}): {fix}; nothing already saved "
                            "was lost")


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


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (json.loads(v) if k in JSON_COLUMNS and isinstance(v, str) and v
                else decode_state(v) if k in STATE_COLUMNS else v) for k, v in row.items()}


def _encode(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (json.dumps(v, ensure_ascii=False) if k in JSON_COLUMNS and v is not None and not isinstance(v, str)
                else encode_state(v) if k in STATE_COLUMNS and v is not None else v) for k, v in row.items()}


class Store:
    def __init__(self, path: str | os.PathLike[str] | None = None):
        self.path = Path(path or WorkbenchSettings.from_env().db)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise unavailable(self.path, exc) or exc from None
        with self.db() as db:
            if db.journal_mode != "wal":
                db.enable_wal()
            for name, spec in SCHEMA.items():
                db.table(name).create(spec["columns"], pk=spec["pk"], if_not_exists=True)
                have = db.table(name).columns_dict
                for col, typ in spec["columns"].items():  # an older file gains new columns in place
                    if col not in have:
                        db.table(name).add_column(col, typ)
            # a policy saved before versions existed reads as version 1, so an editor's save can name it
            if db.execute("SELECT 1 FROM policies WHERE version IS NULL LIMIT 1").fetchone():  # no write otherwise
                db.execute("UPDATE policies SET version = 1 WHERE version IS NULL")
            db.table("results").create_index(["run_id", "row_key"], unique=True, if_not_exists=True)
            db.table("results").create_index(["reuse_key"], if_not_exists=True)
            db.table("runs").create_index(["group_id"], if_not_exists=True)
            db.table("labeled_rows").create_index(["set_id", "row_key"], unique=True, if_not_exists=True)

    @contextmanager
    def db(self) -> Iterator[sqlite_utils.Database]:
        """A connection for one call; a file that cannot take the call raises StoreUnavailable."""
        db = None
        try:
            db = sqlite_utils.Database(sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000))
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            yield db
        except (sqlite3.OperationalError, sqlite3.DatabaseError, OSError) as exc:
            problem = unavailable(self.path, exc)
            if problem is None:
                raise
            raise problem from None
        finally:
            if db is not None:
                db.close()

    @contextmanager
    def write(self) -> Iterator[sqlite_utils.Database]:
        """One write transaction, locked from its first statement (BEGIN IMMEDIATE): what it reads is
        what it writes against - no other writer can come in between - and it commits or rolls back
        as a whole (sqlite-utils' own statements inside join it instead of committing)."""
        with self.db() as db:
            db.conn.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.conn.rollback()
                raise
            db.conn.commit()

    # -- policies ----------------------------------------------------------------------------
    def list_policies(self) -> list[Policy]:
        with self.db() as db:
            return [cast(Policy, _decode(r)) for r in db.table("policies").rows_where(order_by="name")]

    def get_policy(self, policy_id: str) -> Policy | None:
        with self.db() as db:
            rows = list(db.table("policies").rows_where("id = ?", [policy_id]))
        return cast(Policy, _decode(rows[0])) if rows else None

    def save_policy(self, policy: Mapping[str, Any], expected_version: int | None = None) -> Policy:
        """Save and return the saved policy (with its new version). `expected_version` says what the
        editor's view was built on, and the write happens only if that is still so - checked and
        written by one statement, so of two saves from the same view exactly one wins:

        - None: whatever is saved (templates, a CLI import): insert, or update and bump the version
        - 0: a new policy - StaleEdit when one with this id exists (created meanwhile)
        - n: an edit of version n - StaleEdit when it was saved again since, or deleted
        """
        pid = policy["id"]
        fields = {"name": policy["name"], "question": policy["question"], "options": policy["options"],
                  "examples": policy.get("examples") or [], "notes": policy.get("notes") or "",
                  "readout": policy.get("readout") or "", "debias": policy.get("debias") or "",
                  "guard": policy.get("guard") or "", "updated_at": now()}
        values = _encode(fields)
        cols = list(values)
        insert = (f"INSERT INTO policies (id, {', '.join(cols)}, created_at, version) "
                  f"VALUES (?, {', '.join('?' * len(cols))}, ?, 1)")
        args = [pid, *values.values(), now()]
        with self.write() as db:
            if expected_version is None:
                db.execute(insert + " ON CONFLICT(id) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in cols)
                           + ", version = coalesce(policies.version, 0) + 1", args)
            elif expected_version == 0:
                if db.execute(insert + " ON CONFLICT(id) DO NOTHING", args).rowcount != 1:
                    raise StaleEdit(f"a policy with id {pid!r} was created meanwhile (another page or session): "
                                    "nothing was saved - choose another name, or pick that policy to edit it")
            else:
                cur = db.execute(f"UPDATE policies SET {', '.join(f'{c} = ?' for c in cols)}, "
                                 "version = coalesce(version, 0) + 1 WHERE id = ? AND coalesce(version, 0) = ?",
                                 [*values.values(), pid, expected_version])
                if cur.rowcount != 1:
                    found = db.execute("SELECT version FROM policies WHERE id = ?", [pid]).fetchall()
                    if not found:
                        raise StaleEdit(f"policy {pid!r} was deleted (by another page or session) after this view "
                                        f"loaded version {expected_version}: nothing was saved - to keep this draft, "
                                        "save it as a new policy")
                    raise StaleEdit(f"policy {pid!r} was saved again (version {found[0][0]}) after this view loaded "
                                    f"version {expected_version}: nothing was saved - load the newer version, then "
                                    "apply your change")
            (row,) = list(db.table("policies").rows_where("id = ?", [pid]))
        return cast(Policy, _decode(row))

    def delete_policy(self, policy_id: str) -> None:
        with self.db() as db:
            db.table("policies").delete_where("id = ?", [policy_id])

    # -- targets -----------------------------------------------------------------------------
    def list_targets(self) -> list[TargetSpec]:
        with self.db() as db:
            return [cast(TargetSpec, _decode(r)) for r in db.table("targets").rows_where(order_by="name")]

    def save_target(self, name: str, kind: str, config: dict[str, Any]) -> None:
        """Insert or replace (a deployed endpoint's target follows its deployment)."""
        with self.db() as db:
            db.table("targets").upsert(_encode({"name": name, "kind": kind, "config": config, "created_at": now()}), pk="name")

    def add_target(self, name: str, kind: str, config: dict[str, Any]) -> None:
        """Insert a new target; Exists when the name was taken meanwhile (nothing is replaced)."""
        row = _encode({"name": name, "kind": kind, "config": config, "created_at": now()})
        with self.write() as db:
            cur = db.execute(f"INSERT INTO targets ({', '.join(row)}) VALUES ({', '.join('?' * len(row))}) "
                             "ON CONFLICT(name) DO NOTHING", list(row.values()))
            if cur.rowcount != 1:
                raise Exists(f"a target named {name!r} was saved meanwhile (another page or session): choose another name")

    def delete_target(self, name: str) -> None:
        with self.db() as db:
            db.table("targets").delete_where("name = ?", [name])

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

    def merge_run_config(self, run_id: int, values: Mapping[str, Any]) -> None:
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

    # -- labeled sets --------------------------------------------------------------------------
    def import_labeled_set(self, *, name: str, policy_id: str | None, rows: list[dict[str, Any]], content_hash: str,
                           source: str = "", parent_id: int | None = None) -> int:
        """All rows in one transaction (nothing half-imported); the same content for the same
        policy is not imported twice - the existing set id is returned. `parent_id`: the set this
        one is a new version of (the review queue appends rows; the parent is never changed)."""
        same = "content_hash = ? AND coalesce(policy_id, '') = ?", [content_hash, policy_id or ""]
        with self.db() as db:  # already imported: a read (also on a read-only file)
            existing = list(db.table("labeled_sets").rows_where(*same))
        if existing:
            return int(existing[0]["id"])
        with self.write() as db:  # the duplicate check again, and the import: one transaction
            existing = list(db.table("labeled_sets").rows_where(*same))
            if existing:
                return int(existing[0]["id"])
            # never the id of a deleted set that runs still name (SQLite reuses the highest rowid once it is
            # deleted): a new set must not inherit the old one's runs on Calibrate and History
            used = db.execute("SELECT max(m) FROM (SELECT max(id) AS m FROM labeled_sets UNION ALL "
                              "SELECT max(labeled_set_id) FROM runs)").fetchone()[0]
            set_id = db.table("labeled_sets").insert({"id": int(used or 0) + 1, "name": name, "policy_id": policy_id,
                                                "content_hash": content_hash, "n_rows": len(rows), "source": source,
                                                "created_at": now(), "parent_id": parent_id}).last_pk or 0
            db.table("labeled_rows").insert_all(_encode({**r, "set_id": set_id, "position": i}) for i, r in enumerate(rows))
            return int(set_id)

    def list_labeled_sets(self) -> list[LabeledSet]:
        with self.db() as db:
            return [cast(LabeledSet, r) for r in db.table("labeled_sets").rows_where(order_by="id desc")]

    def get_labeled_set(self, set_id: int | None) -> LabeledSet | None:
        with self.db() as db:
            rows = list(db.table("labeled_sets").rows_where("id = ?", [set_id]))
        return cast(LabeledSet, rows[0]) if rows else None

    def labeled_rows(self, set_id: int | None) -> list[LabeledRow]:
        with self.db() as db:
            return [cast(LabeledRow, _decode(r))
                    for r in db.table("labeled_rows").rows_where("set_id = ?", [set_id], order_by="position")]

    def delete_labeled_set(self, set_id: int) -> None:
        with self.write() as db:
            db.table("labeled_rows").delete_where("set_id = ?", [set_id])
            db.table("labeled_sets").delete_where("id = ?", [set_id])

    # -- the review queue ----------------------------------------------------------------------
    def add_review(self, row: dict[str, Any]) -> int:
        with self.write() as db:
            return int(db.table("review_labels").insert(_encode({**row, "at": now(), "undone": 0})).last_pk or 0)

    def reviews(self, policy_id: str, *, pending: bool = False) -> list[Review]:
        """This policy's labels and skips, oldest first, taken-back ones left out; `pending`: only
        labels (new rows, or a set row's label fixed or confirmed) not yet appended to a set version."""
        where = "policy_id = ? AND undone = 0" + (" AND set_id IS NULL AND action IN ('label', 'relabel', 'confirm')"
                                                   if pending else "")
        with self.db() as db:
            return [cast(Review, _decode(r)) for r in db.table("review_labels").rows_where(where, [policy_id], order_by="id")]

    def undo_review(self, review_id: int) -> None:
        """Take a label or skip back (kept, marked undone: who labelled what stays on record); one
        already appended to a set version cannot be taken back - that version is fixed."""
        with self.write() as db:
            db.execute("UPDATE review_labels SET undone = 1 WHERE id = ? AND set_id IS NULL", [review_id])

    def mark_appended(self, review_ids: list[int], set_id: int) -> None:
        with self.write() as db:
            db.conn.executemany("UPDATE review_labels SET set_id = ? WHERE id = ?", [(set_id, i) for i in review_ids])

    # -- calibrated policies (exports kept with their provenance, for the Deploy page) ---------------
    def save_calibrated(self, config: dict[str, Any]) -> int:
        at = (config.get("metrics") or {}).get("at_gate") or {}
        row = {"policy_id": config["policy_id"], "name": config.get("name") or config["policy_id"],
               "run_id": config.get("run_id"), "created_at": now(), "gate_source": config.get("gate_source"),
               "threshold": config.get("threshold"), "coverage": at.get("coverage"), "accuracy": at.get("accuracy"),
               "model_file": config["model"]["file"], "model_sha256": config["model"]["sha256"],
               "dataset_hash": (config.get("dataset") or {}).get("content_hash"), "config": config}
        with self.db() as db:
            return int(db.table("calibrated_policies").insert(_encode(row)).last_pk or 0)

    def list_calibrated(self) -> list[Calibrated]:
        with self.db() as db:
            return [cast(Calibrated, _decode(r)) for r in db.table("calibrated_policies").rows_where(order_by="id desc")]

    def run_version(self, run_id: int) -> tuple[int, int]:
        """(results stored, newest result id): changes whenever a result is added - a cache key."""
        with self.db() as db:
            (n, last), = db.execute("SELECT count(*), coalesce(max(id), 0) FROM results WHERE run_id = ?",
                                    [run_id]).fetchall()
        return n, last

    # -- deployments and their audit log -------------------------------------------------------
    def save_deployment(self, dep: Mapping[str, Any]) -> None:
        """Insert, or update all but created_at (one statement: the first save's time stays)."""
        row = _encode({**{k: v for k, v in dep.items() if k != "created_at"}, "updated_at": now()})
        cols = list(row)
        with self.db() as db:
            db.execute(f"INSERT INTO deployments ({', '.join(cols)}, created_at) VALUES ({', '.join('?' * len(cols))}, ?) "
                       "ON CONFLICT(id) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in cols if c != "id"),
                       [*row.values(), now()])

    def get_deployment(self, dep_id: str) -> Deployment | None:
        with self.db() as db:
            rows = list(db.table("deployments").rows_where("id = ?", [dep_id]))
        return cast(Deployment, _decode(rows[0])) if rows else None

    def list_deployments(self) -> list[Deployment]:
        with self.db() as db:
            return [cast(Deployment, _decode(r)) for r in db.table("deployments").rows_where(order_by="created_at desc")]

    def audit(self, deployment_id: str, action: str, what: str, result: str, who: str | None = None) -> None:
        with self.db() as db:
            db.table("audit").insert({"deployment_id": deployment_id, "at": now(), "who": who or getpass.getuser(),
                                "action": action, "what": what, "result": result})

    def audit_log(self, deployment_id: str | None = None) -> list[AuditEntry]:
        with self.db() as db:
            where, args = ("deployment_id = ?", [deployment_id]) if deployment_id else (None, [])
            return [cast(AuditEntry, r) for r in db.table("audit").rows_where(where, args, order_by="id")]

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

import os
from pathlib import Path
from typing import Any

from app.core.tables.base import BUSY_TIMEOUT_MS as BUSY_TIMEOUT_MS
from app.core.tables.base import JSON_COLUMNS as JSON_COLUMNS
from app.core.tables.base import StoreUnavailable as StoreUnavailable
from app.core.tables.base import decode_state as decode_state
from app.core.tables.base import encode_state as encode_state
from app.core.tables.base import now as now
from app.core.tables.base import unavailable
from app.core.tables.policies import PolicyTable, StaleEdit as StaleEdit
from app.core.tables.review import ReviewTable
from app.core.tables.runs import ACCURACY_COUNTS as ACCURACY_COUNTS
from app.core.tables.runs import CREATED as CREATED
from app.core.tables.runs import LEASE_SECONDS as LEASE_SECONDS
from app.core.tables.runs import OWNER as OWNER
from app.core.tables.runs import RunBusy as RunBusy
from app.core.tables.runs import RunTable
from app.core.tables.sets import SetTable
from app.core.tables.targets import Exists as Exists
from app.core.tables.targets import TargetTable
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
    # version it went into (NULL while pending), `undone` marks one taken back; `picked`: how the row came to be
    # labeled (review.PICKED: "random draw", "suggested", "review queue"; NULL for a label given before it was kept);
    # `draw_key`: a pool row's random key (app/service/pool.draw_keys: Calibrate's random sample of the pool)
    "review_labels": {"columns": {"id": int, "policy_id": str, "item_key": str, "run_id": int, "row_key": str,
                                  "state": str, "label": str, "action": str, "note": str, "who": str, "at": str,
                                  "set_id": int, "undone": int, "picked": str, "draw_key": float}, "pk": "id"},
    "labeled_rows": {"columns": {"id": int, "set_id": int, "row_key": str, "position": int, "state": str,
                                 "label": str, "split": str, "meta": str}, "pk": "id"},
    "results": {"columns": {"id": int, "run_id": int, "row_key": str, "position": int, "state": str,
                            "label": str, "option_ids": str, "probabilities": str, "top_option": str,
                            "label_mass": float, "probability_status": str, "readout": str, "latency_s": float,
                            "cold": int,
                            "error": str, "request": str, "response": str,
                            "reuse_key": str, "reused_from": int}, "pk": "id"},
}


class Store(PolicyTable, TargetTable, RunTable, SetTable, ReviewTable):
    """Every table over one file: policies and calibrated policies, targets and deployments, runs and results,
    labeled sets, the review queue (app/core/tables/, one module each; each call opens its own connection)."""

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

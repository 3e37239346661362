"""The pools table: unlabeled states kept for a policy, on the workbench's SQLite file (the same sqlite-utils
Database as app/core/store.py, its own tables - a pool is not a labeled set, and Store stays one class per
table group). A pool's rows never change after import: a row leaves the pool by being labeled (a review
action; its state is then in a set version or pending there) - computed, never deleted, so nothing saved is
lost. Its scores are a run of kind "pool" (runs/results tables: each result keeps its reuse key, so the
next calibration copies it instead of scoring the state again - app/core/reuse.py).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import sqlite_utils

from adapter.policy import CalibratedPolicy

from app.core.pool import PoolRow
from app.core.records import Run
from app.core.store import Store, decode_state, encode_state, now
from app.targets.base import Target

POOLS = {"id": int, "name": str, "policy_id": str, "source": str, "created_at": str, "n_rows": int,
         "problems": str, "capped": str}
POOL_ROWS = {"id": int, "pool_id": int, "line": int, "row_key": str, "state": str}
KEPT_PROBLEMS = 200  # the first problems are kept with the pool (the import's message names them all)
CHUNK = 1000  # rows inserted per statement: a 50,000-row pool is written without one giant list


@dataclass(frozen=True)
class StoredPool:
    id: int
    name: str
    policy_id: str
    source: str
    created_at: str
    n_rows: int
    problems: list[str]
    capped: str

    @property
    def label(self) -> str:
        """'pool #1 pool.csv (300 rows)': the source only when it says more than the name (a decision log, a file
        imported under another name) - it read 'pool #1 pool.csv (300 rows, file pool.csv)'."""
        source = "" if self.source == f"file {self.name}" else f", {self.source}"
        return f"pool #{self.id} {self.name} ({self.n_rows} rows{source})"


def _tables(db: sqlite_utils.Database) -> None:
    db.table("pools").create(POOLS, pk="id", if_not_exists=True)
    db.table("pool_rows").create(POOL_ROWS, pk="id", if_not_exists=True)
    db.table("pool_rows").create_index(["pool_id", "line"], if_not_exists=True)


def _pool(row: dict[str, Any]) -> StoredPool:
    return StoredPool(int(row["id"]), row["name"], row["policy_id"], row["source"], row["created_at"],
                      int(row["n_rows"]), json.loads(row["problems"] or "[]"), row["capped"] or "")


def add(store: Store, *, name: str, policy_id: str, source: str, rows: Iterable[PoolRow], problems: list[str],
        capped: str = "") -> int:
    """A new pool and its rows, in one transaction (a failure leaves no half pool)."""
    with store.db() as db:
        _tables(db)
    with store.write() as db:
        pid = int(db.table("pools").insert({"name": name, "policy_id": policy_id, "source": source,
                                             "created_at": now(), "n_rows": 0,
                                             "problems": json.dumps(problems[:KEPT_PROBLEMS]),
                                             "capped": capped}).last_pk or 0)
        n, chunk = 0, []
        for r in rows:
            chunk.append((pid, r.line, r.id, encode_state(r.state)))
            if len(chunk) >= CHUNK:
                db.conn.executemany("INSERT INTO pool_rows (pool_id, line, row_key, state) VALUES (?, ?, ?, ?)", chunk)
                n, chunk = n + len(chunk), []
        if chunk:
            db.conn.executemany("INSERT INTO pool_rows (pool_id, line, row_key, state) VALUES (?, ?, ?, ?)", chunk)
            n += len(chunk)
        db.conn.execute("UPDATE pools SET n_rows = ? WHERE id = ?", (n, pid))
    return pid


def pools(store: Store, policy_id: str | None = None) -> list[StoredPool]:
    """Pools, newest first (of one policy when given)."""
    with store.db() as db:
        if "pools" not in db.table_names():
            return []
        where, args = ("policy_id = ?", [policy_id]) if policy_id is not None else (None, [])
        return [_pool(r) for r in db.table("pools").rows_where(where, args, order_by="id desc")]


def get(store: Store, pool_id: int) -> StoredPool | None:
    with store.db() as db:
        if "pools" not in db.table_names():
            return None
        found = list(db.table("pools").rows_where("id = ?", [pool_id]))
        return _pool(found[0]) if found else None


def rows(store: Store, pool_id: int) -> list[PoolRow]:
    """The pool's rows in file order."""
    return list(iter_rows(store, pool_id))


def row_key(row: PoolRow) -> str:
    """A pool row's key in its scoring runs' results (and its random draw key's seed): unique in the pool - a file's
    own ids may repeat."""
    return f"line-{row.line}"


def iter_rows(store: Store, pool_id: int) -> Iterator[PoolRow]:
    with store.db() as db:
        if "pool_rows" not in db.table_names():
            return
        for r in db.query("SELECT line, row_key, state FROM pool_rows WHERE pool_id = ? ORDER BY line", [pool_id]):
            yield PoolRow(int(r["line"]), r["row_key"], decode_state(r["state"]))


def request_key(policy: CalibratedPolicy) -> str:
    """What a calibrated policy with no evaluation run here sends with each row (its request fields), as a short
    hash: the stored scores of one such file are another's only when this key is the same."""
    return hashlib.sha256(json.dumps(policy.request_fields(), sort_keys=True).encode()).hexdigest()[:16]


def start_scores(store: Store, pool: StoredPool, *, like: Run | None, policy: CalibratedPolicy, target: Target,
                 note: str) -> int:
    """A new run of kind 'pool' for this pool's scores on `target`, read like the evaluation run `like` (its
    policy as evaluated), or like the calibrated policy's own request fields when there is none."""
    record = like["policy"] if like is not None else {"id": policy.policy_id, **policy.request_fields()}
    return store.create_run(kind="pool", policy=record, target=target.describe(), n_rows=pool.n_rows, note=note,
                            config={"pool_id": pool.id, "like_run": like["id"] if like is not None else None,
                                    **({} if like is not None else {"pool_request": request_key(policy)})})

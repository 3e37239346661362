"""Targets, and the deployments made to them with their audit log."""
from __future__ import annotations

import getpass
from typing import Any, Mapping, cast

from app.core.records import AuditEntry, Deployment, TargetSpec
from app.core.tables.base import Connection, _decode, _encode, now


class Exists(RuntimeError):
    """A record with this name or id was created meanwhile (by another page, session or process)."""


class TargetTable(Connection):
    """The targets, deployments and audit tables."""

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

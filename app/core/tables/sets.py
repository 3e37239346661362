"""Labeled sets and their rows: imported whole (one transaction), read back in their order."""
from __future__ import annotations

from typing import Any, cast

from app.core.records import LabeledRow, LabeledSet
from app.core.tables.base import Connection, _decode, _encode, now


class SetTable(Connection):
    """The labeled_sets and labeled_rows tables."""

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

    def labeled_set_rows(self, set_id: int) -> tuple[LabeledSet | None, list[LabeledRow]]:
        """A stored set and its rows in their order, in one trip ((None, []) when there is no such set)."""
        with self.db() as db:
            found = list(db.table("labeled_sets").rows_where("id = ?", [set_id]))
            rows = [cast(LabeledRow, _decode(r))
                    for r in db.table("labeled_rows").rows_where("set_id = ?", [set_id], order_by="position")]
        return (cast(LabeledSet, found[0]) if found else None), rows

    def delete_labeled_set(self, set_id: int) -> None:
        with self.write() as db:
            db.table("labeled_rows").delete_where("set_id = ?", [set_id])
            db.table("labeled_sets").delete_where("id = ?", [set_id])

"""The review queue: each label given (or row skipped), who and when; appended to a set version."""
from __future__ import annotations

from typing import Any, cast

from app.core.records import Review
from app.core.tables.base import Connection, _decode, _encode, now


class ReviewTable(Connection):
    """The review_labels table."""

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

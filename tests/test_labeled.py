"""Labeled-set import: row-numbered errors, all-or-nothing, content hash, the shipped sets."""
from __future__ import annotations

import pytest

from adapter.engine.templates import load_template
from app.core.inputs import InputError
from app.core.labeled import content_hash, import_file, parse_labeled, shipped_sets
from app.core.store import Store

OPTS = ["access", "billing", "technical", "shipping"]


def test_bad_rows_rejected_with_row_numbers_and_nothing_stored(tmp_path):
    db = Store(tmp_path / "wb.db")
    data = b"id,state,label\nok1,Locked out,access\nbad2,,billing\nbad3,Parcel late,post\nok1,dup,access\n"
    with pytest.raises(InputError) as exc:
        import_file(db, "set.csv", data, load_template("ticket-routing"))
    text = "\n".join(exc.value.problems)
    assert "row 3, column state" in text and "row 4, column label: 'post'" in text and "row 5, column id" in text
    assert db.list_labeled_sets() == []
    with db.db() as conn:
        assert conn["labeled_rows"].count == 0


def test_jsonl_with_split_and_metadata_and_dedupe(tmp_path):
    db = Store(tmp_path / "wb.db")
    data = (b'{"id": "a", "state": "x", "label": "billing", "split": "Train", "channel": "email"}\n'
            b'{"state": {"ticket": "y"}, "label": "access"}\n')
    rows = parse_labeled("s.jsonl", data, OPTS)
    assert rows[0]["split"] == "train" and rows[0]["meta"] == {"channel": "email"}
    assert rows[1]["row_key"] == "row-2" and rows[1]["state"] == {"ticket": "y"}  # an object stays an object
    policy = load_template("ticket-routing")
    a = import_file(db, "s.jsonl", data, policy)
    b = import_file(db, "again.jsonl", data, policy)
    assert a == b and len(db.list_labeled_sets()) == 1  # same content, same policy: one set
    assert db.get_labeled_set(a)["content_hash"] == content_hash(rows)
    with pytest.raises(InputError, match="no 'label' column"):
        parse_labeled("s.csv", b"state\nx\n", OPTS)


def test_shipped_sets_are_valid_and_big_enough():
    found = dict(shipped_sets())
    assert set(found) >= {"ticket-routing", "refund-check", "incident-priority", "content-moderation"}
    for pid, path in found.items():
        rows = parse_labeled(path.name, path.read_bytes(), [o["id"] for o in load_template(pid)["options"]])
        # big enough to carry a gate: >= 200 rows, >= 100 of them in the test split, no repeated text
        assert len(rows) >= 200 and sum(r["split"] == "test" for r in rows) >= 100, pid
        assert len({r["state"].strip().lower() for r in rows}) == len(rows), pid
        labels = {r["label"] for r in rows}
        assert labels == {o["id"] for o in load_template(pid)["options"]}  # every option is represented
        assert {r["split"] for r in rows} == {"train", "test"}

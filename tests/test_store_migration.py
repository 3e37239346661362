"""An older workbench database opened by today's Store: tables and columns added in place, the old
rows intact and readable through the Store, new-style writes working, and opening it again a no-op.

The old file is written by hand with sqlite3, with the schema of the calibration-era store
(git a9396b9: no policy versions, readout/debias/guard columns, leases, result reuse, set
versions, review queue, deployments or calibrated policies), in rollback-journal mode."""
from __future__ import annotations

import json
import sqlite3

import pytest

from app.core.store import SCHEMA, Store

OLD_SCHEMA = """
CREATE TABLE [policies] ([id] TEXT PRIMARY KEY, [name] TEXT, [question] TEXT, [options] TEXT, [examples] TEXT,
                         [notes] TEXT, [readout] TEXT, [created_at] TEXT, [updated_at] TEXT);
CREATE TABLE [targets] ([name] TEXT PRIMARY KEY, [kind] TEXT, [config] TEXT, [created_at] TEXT);
CREATE TABLE [runs] ([id] INTEGER PRIMARY KEY, [group_id] TEXT, [kind] TEXT, [policy_id] TEXT, [policy] TEXT,
                     [target_name] TEXT, [target] TEXT, [model] TEXT, [status] TEXT, [n_rows] INTEGER,
                     [created_at] TEXT, [finished_at] TEXT, [pinned] INTEGER, [note] TEXT,
                     [labeled_set_id] INTEGER, [config] TEXT);
CREATE TABLE [labeled_sets] ([id] INTEGER PRIMARY KEY, [name] TEXT, [policy_id] TEXT, [content_hash] TEXT,
                             [n_rows] INTEGER, [source] TEXT, [created_at] TEXT);
CREATE TABLE [labeled_rows] ([id] INTEGER PRIMARY KEY, [set_id] INTEGER, [row_key] TEXT, [position] INTEGER,
                             [state] TEXT, [label] TEXT, [split] TEXT, [meta] TEXT);
CREATE TABLE [results] ([id] INTEGER PRIMARY KEY, [run_id] INTEGER, [row_key] TEXT, [position] INTEGER,
                        [state] TEXT, [label] TEXT, [option_ids] TEXT, [probabilities] TEXT, [top_option] TEXT,
                        [label_mass] FLOAT, [latency_s] FLOAT, [error] TEXT, [request] TEXT, [response] TEXT);
CREATE UNIQUE INDEX [idx_results_run_id_row_key] ON [results] ([run_id], [row_key]);
CREATE INDEX [idx_runs_group_id] ON [runs] ([group_id]);
"""
OPTIONS = [{"id": "yes", "description": "refund"}, {"id": "no", "description": "no refund"}]
OLD_POLICY = {"id": "refund", "name": "Refund", "question": "Refund?", "options": OPTIONS, "examples": [],
              "notes": "from before versions"}


def old_database(path) -> None:
    con = sqlite3.connect(path)
    con.executescript(OLD_SCHEMA)
    con.execute("INSERT INTO policies VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                ["refund", "Refund", "Refund?", json.dumps(OPTIONS), "[]", "from before versions", "", "2026-11-01",
                 "2026-11-01"])
    con.execute("INSERT INTO targets VALUES ('gpu', 'semif', ?, '2026-11-01')", [json.dumps({"url": "http://g:8080"})])
    con.execute("INSERT INTO runs VALUES (1, 'g1', 'eval', 'refund', ?, 'local', ?, 'SmolLM2', 'done', 2, '2026-11-01',"
                " '2026-11-01', 1, 'old run', 1, ?)",
                [json.dumps(OLD_POLICY), json.dumps({"name": "local", "kind": "local"}), json.dumps({"variant": "default"})])
    for i, (state, top) in enumerate([("Broken on arrival", "yes"), ("Changed my mind", "no")]):
        # states stored before the tagged encoding: plain text
        con.execute("INSERT INTO results (run_id, row_key, position, state, label, option_ids, probabilities, "
                    "top_option, label_mass, latency_s, error, request, response) VALUES (1, ?, ?, ?, 'yes', ?, ?, ?, "
                    "0.9, 0.25, NULL, ?, ?)",
                    [f"r{i}", i, state, json.dumps(["yes", "no"]), json.dumps([0.8, 0.2] if top == "yes" else [0.3, 0.7]),
                     top, json.dumps({"id": f"r{i}"}), json.dumps({"readout": "option-words"})])
    con.execute("INSERT INTO labeled_sets VALUES (1, 'refund.jsonl', 'refund', 'h1', 2, 'upload', '2026-11-01')")
    con.execute("INSERT INTO labeled_rows VALUES (1, 1, 'r0', 0, 'Broken on arrival', 'yes', 'test', '{}')")
    con.execute("INSERT INTO labeled_rows VALUES (2, 1, 'r1', 1, 'Changed my mind', 'no', 'test', '{}')")
    con.commit()
    con.close()


def affinity(declared: str) -> str:
    """SQLite's type affinity of a declared column type (sqlite.org/datatype3.html, 3.1): older
    sqlite-utils declared FLOAT where today's declares REAL - the same affinity."""
    t = declared.upper()
    if "INT" in t:
        return "INTEGER"
    if any(k in t for k in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if not t or "BLOB" in t:
        return "BLOB"
    if any(k in t for k in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


def shape(path) -> dict:
    """Every table's columns (name, type affinity) and every index, read straight from the file."""
    con = sqlite3.connect(path)
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    out = {t: [(c[1], affinity(c[2])) for c in con.execute(f"PRAGMA table_info([{t}])")] for t in tables}
    out["__indexes__"] = sorted(  # (table, columns, unique) of every index made by CREATE INDEX
        (t, tuple(c[2] for c in con.execute(f"PRAGMA index_info([{ix[1]}])")), bool(ix[2]))
        for t in tables for ix in con.execute(f"PRAGMA index_list([{t}])") if ix[3] == "c")
    out["__counts__"] = {t: con.execute(f"SELECT count(*) FROM [{t}]").fetchone()[0] for t in tables}
    con.close()
    return out


@pytest.fixture
def migrated(tmp_path):
    path = tmp_path / "old.db"
    old_database(path)
    return path, Store(path)


def test_an_old_file_gains_every_table_and_column_in_place(migrated):
    path, _ = migrated
    got = shape(path)
    for table, spec in SCHEMA.items():
        assert set(spec["columns"]) <= {c for c, _ in got[table]}, table
    results = dict(got["results"])
    assert results["reuse_key"] == "TEXT" and results["reused_from"] == "INTEGER" and results["cold"] == "INTEGER"
    assert dict(got["labeled_sets"])["parent_id"] == "INTEGER" and dict(got["policies"])["version"] == "INTEGER"
    assert dict(got["runs"])["lease_until"] == "REAL"
    assert got["__counts__"]["review_labels"] == 0 and got["__counts__"]["deployments"] == 0
    # the old columns keep their place (older code reading by position is not broken) and the new ones follow
    assert [c for c, _ in got["results"]][:14] == ["id", "run_id", "row_key", "position", "state", "label",
                                                    "option_ids", "probabilities", "top_option", "label_mass",
                                                    "latency_s", "error", "request", "response"]
    assert got["__indexes__"] == [("labeled_rows", ("set_id", "row_key"), True), ("results", ("reuse_key",), False),
                                  ("results", ("run_id", "row_key"), True), ("runs", ("group_id",), False)]
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_the_old_rows_are_intact_and_read_through_the_store(migrated):
    _, store = migrated
    assert store.list_targets() == [{"name": "gpu", "kind": "semif", "config": {"url": "http://g:8080"},
                                     "created_at": "2026-11-01"}]
    (run,) = store.list_runs()
    assert (run["id"], run["status"], run["pinned"], run["note"]) == (1, "done", 1, "old run")
    assert run["policy"] == OLD_POLICY and run["config"] == {"variant": "default"} and run["labeled_set_id"] == 1
    assert (run["done_rows"], run["error_rows"]) == (2, 0) and run["lease_owner"] is None
    assert store.pinned_run()["id"] == 1
    rows = store.results(1)
    assert [r["state"] for r in rows] == ["Broken on arrival", "Changed my mind"]  # untagged text comes back as text
    assert [r["probabilities"] for r in rows] == [[0.8, 0.2], [0.3, 0.7]] and rows[0]["option_ids"] == ["yes", "no"]
    assert rows[0]["response"] == {"readout": "option-words"} and rows[0]["reuse_key"] is None
    assert store.done_keys(1) == {"r0", "r1"} and store.run_version(1)[0] == 2
    assert store.latencies(["local"]) == {"local": [(0.25, False), (0.25, False)]}
    (s,) = store.list_labeled_sets()
    assert (s["name"], s["n_rows"], s["parent_id"]) == ("refund.jsonl", 2, None)
    assert [(r["state"], r["label"]) for r in store.labeled_rows(1)] == [("Broken on arrival", "yes"),
                                                                        ("Changed my mind", "no")]
    policy = store.get_policy("refund")
    assert policy["options"] == OPTIONS and policy["notes"] == "from before versions" and policy["question"] == "Refund?"
    assert store.reviews("refund") == []


def test_new_style_writes_work_on_the_migrated_file(migrated):
    _, store = migrated
    run = store.create_run(kind="eval", policy=OLD_POLICY, target={"name": "local"}, n_rows=1)
    lease = store.take_lease(run)
    store.add_result(run, {"row_key": "r0", "position": 0, "state": {"ticket": "json state"}, "option_ids": ["yes", "no"],
                           "probabilities": [0.6, 0.4], "top_option": "yes", "error": None, "reuse_key": "k1",
                           "reused_from": 1, "cold": 0}, lease)
    store.finish_run(run, "done", lease)
    assert store.results(run)[0]["state"] == {"ticket": "json state"} and store.results(run)[0]["reused_from"] == 1
    assert store.reusable(["k1", "k2"])["k1"]["run_id"] == run
    child = store.import_labeled_set(name="refund.jsonl v2", policy_id="refund", rows=[], content_hash="h2", parent_id=1)
    assert store.get_labeled_set(child)["parent_id"] == 1
    review = store.add_review({"policy_id": "refund", "item_key": "i", "run_id": run, "row_key": "r0", "state": "s",
                               "label": "yes", "action": "label", "note": "", "who": "t"})
    assert [r["id"] for r in store.reviews("refund", pending=True)] == [review]
    assert store.save_policy({**OLD_POLICY, "id": "new-one"}, expected_version=0)["version"] == 1
    assert store.get_run(1)["status"] == "done"  # the old run is not touched by the new writes


def test_a_policy_saved_before_versions_can_be_edited_from_the_version_it_reads_as(migrated):
    _, store = migrated
    old = store.get_policy("refund")
    saved = store.save_policy({**old, "notes": "edited"}, expected_version=old.get("version") or 0)
    assert saved["notes"] == "edited"


def test_opening_twice_changes_nothing(migrated):
    path, store = migrated
    before = shape(path)
    Store(path)
    Store(path)
    assert shape(path) == before
    assert [r["row_key"] for r in store.results(1)] == ["r0", "r1"]


def test_a_new_file_and_a_migrated_file_end_with_the_same_columns(migrated, tmp_path):
    path, _ = migrated
    Store(tmp_path / "new.db")
    old, new = shape(path), shape(tmp_path / "new.db")
    for table in SCHEMA:
        assert sorted(old[table]) == sorted(new[table]), table
    assert old["__indexes__"] == new["__indexes__"]

"""The SQLite store on disk: round trips, replace-not-duplicate, deletes, baseline pin."""
from __future__ import annotations

import sqlite3

import pytest

from adapter.engine.templates import load_template
from app.core.store import Store


@pytest.fixture
def db(tmp_path):
    return Store(tmp_path / "wb.db")


def test_schema_created_on_first_use(tmp_path):
    path = tmp_path / "new" / "wb.db"
    Store(path)
    tables = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"policies", "targets", "runs", "results"} <= tables


def test_policy_round_trip_and_delete(db):
    p = load_template("incident-priority")
    saved = db.save_policy(p)
    assert saved["options"] == p["options"] and saved["examples"] == p["examples"]
    created = saved["created_at"]
    saved2 = db.save_policy({**p, "question": "Priority?"})
    assert saved2["question"] == "Priority?" and saved2["created_at"] == created
    assert [x["id"] for x in db.list_policies()] == ["incident-priority"]
    db.delete_policy("incident-priority")
    assert db.get_policy("incident-priority") is None


def test_targets_store_no_secret_values(db):
    db.save_target("gpu", "chat", {"url": "http://x", "api_key_env": "MY_KEY"})
    (t,) = db.list_targets()
    assert t["config"] == {"url": "http://x", "api_key_env": "MY_KEY"}
    db.delete_target("gpu")
    assert db.list_targets() == []


def _result(key, top="a", err=None):
    return {"row_key": key, "position": 0, "state": "s", "option_ids": ["a", "b"], "probabilities": [0.7, 0.3],
            "top_option": top, "label_mass": 0.5, "latency_s": 0.1, "error": err}


def test_results_are_replaced_not_duplicated_and_runs_deleted(db):
    rid = db.create_run(kind="compare", policy={"id": "p", "name": "P"}, target={"name": "local"}, n_rows=2)
    db.add_result(rid, _result("r1", err="boom"))
    db.add_result(rid, _result("r1", top="b"))  # a retry of the same row replaces it
    db.add_result(rid, _result("r2"))
    rows = db.results(rid)
    assert [r["row_key"] for r in rows] == ["r1", "r2"] and rows[0]["top_option"] == "b"
    assert rows[0]["probabilities"] == [0.7, 0.3]
    assert db.done_keys(rid) == {"r1", "r2"}
    (run,) = db.list_runs()
    assert run["done_rows"] == 2 and run["status"] == "running"
    db.finish_run(rid)
    assert db.get_run(rid)["status"] == "done" and db.get_run(rid)["finished_at"]
    db.delete_run(rid)
    assert db.get_run(rid) is None and db.results(rid) == []


def test_accuracy_so_far_is_one_count_query_that_agrees_with_the_rows(db, monkeypatch):
    """The stop rule asks after every row: the store counts (correct, labeled) in SQL - rows with an
    error, without a label or without an answer do not count - and never reads the results back."""
    from app.service.evaluate import accuracy_so_far

    rid = db.create_run(kind="eval", policy={"id": "p", "name": "P"}, target={"name": "local"}, n_rows=6)
    rows = [("r1", "a", "a", None), ("r2", "b", "a", None), ("r3", "a", "a", "boom"), ("r4", "a", None, None),
            ("r5", None, "b", None), ("r6", "b", "b", None)]  # (key, top option, label, error)
    for key, top, label, err in rows:
        db.add_result(rid, {**_result(key, top=top, err=err), "label": label})
    assert db.accuracy_counts(rid) == (2, 3)  # r1 and r6 right, r2 wrong; r3 failed, r4 unlabeled, r5 unanswered
    (run,) = db.list_runs()
    assert (run["correct_rows"], run["labeled_rows"]) == (2, 3)  # History counts the same way
    monkeypatch.setattr(Store, "results", lambda *a, **k: pytest.fail("the stop rule read every row"))
    acc = accuracy_so_far(db, rid)
    assert (acc.k, acc.n) == (2, 3) and acc.rate == pytest.approx(2 / 3)
    assert db.accuracy_counts(rid + 1) == (0, 0) and accuracy_so_far(db, rid + 1).rate is None


def test_single_baseline_pin(db):
    a = db.create_run(kind="playground", policy={}, target={"name": "x"}, n_rows=1)
    b = db.create_run(kind="playground", policy={}, target={"name": "x"}, n_rows=1)
    db.pin_run(a)
    db.pin_run(b)
    assert db.pinned_run()["id"] == b
    db.pin_run(None)
    assert db.pinned_run() is None


def test_one_lease_per_worker_even_within_one_process(db):
    """Two pages of one workbench server share a process: the second worker is refused, a lost lease
    refuses writes, and the first worker's end gives the run back."""
    from app.core.store import RunBusy

    rid = db.create_run(kind="eval", policy={"id": "p"}, target={"name": "local"}, n_rows=2)
    first = db.take_lease(rid)
    with pytest.raises(RunBusy, match="another page of this workbench"):
        db.take_lease(rid)
    db.add_result(rid, _result("r1"), first)
    with db.db() as conn:  # the lease runs out (a stalled worker) and another worker takes the run
        conn.execute("UPDATE runs SET lease_until = 0 WHERE id = ?", [rid])
        conn.conn.commit()
    second = db.take_lease(rid)
    with pytest.raises(RunBusy, match="taken over"):
        db.add_result(rid, _result("r2", top="b"), first)
    assert db.done_keys(rid) == {"r1"}  # nothing written by the worker that lost the run
    db.stop_run(rid, "interrupted", first)  # the loser's cleanup leaves the new holder alone
    assert db.get_run(rid)["status"] == "running"
    db.finish_run(rid, "done", second)
    assert db.get_run(rid)["status"] == "done"


def test_heartbeat_keeps_a_busy_workers_lease(db):
    """A worker busy for longer than the lease (a Batch Transform job, a model load) keeps its run."""
    import time

    from app.core.runner import Heartbeat
    from app.core.store import LEASE_SECONDS, RunBusy

    rid = db.create_run(kind="eval", policy={"id": "p"}, target={"name": "local"}, n_rows=1)
    lease = db.take_lease(rid)
    expires = time.time() + 0.5  # the lease runs out while the worker is busy ...
    with db.db() as conn:
        conn.execute("UPDATE runs SET lease_until = ? WHERE id = ?", [expires, rid])
        conn.conn.commit()
    with Heartbeat(db, {rid: lease}, every=0.05):
        # ... unless the heartbeat renews it: waited for (the bound only catches a hang), then past the old expiry
        deadline = time.monotonic() + 60
        while db.get_run(rid)["lease_until"] <= expires:
            assert time.monotonic() < deadline, "the heartbeat never renewed the lease"
            time.sleep(0.01)
        assert db.get_run(rid)["lease_until"] >= expires - 0.5 + LEASE_SECONDS  # a whole lease from the renewal
        while time.time() <= expires:
            time.sleep(0.01)
        with pytest.raises(RunBusy):  # still the busy worker's: no other worker can take it
            db.take_lease(rid)
    assert db.get_run(rid)["status"] == "running"

"""Check-then-write races on the SQLite file, with real concurrency: saves from the same view in
several processes and threads at once - exactly one wins, every other is refused, nothing is lost."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from app.core.store import StaleEdit, Store
from tests.conftest import ROOT

POLICY = {"id": "p", "name": "P", "question": "Q?", "options": [{"id": "a"}, {"id": "b"}]}
TRIALS_PROCESSES, TRIALS_THREADS, WORKERS = 30, 100, 4


WORKER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from app.core.store import StaleEdit, Store
from tests.conftest import ROOT
store, index = Store(sys.argv[2]), sys.argv[3]
policy = {"id": "p", "name": "P", "question": "Q?", "options": [{"id": "a"}, {"id": "b"}], "notes": "w" + index}
for line in sys.stdin:  # one trial per line: the time at which every worker saves
    at = float(line)
    while time.time() < at:
        pass
    try:
        store.save_policy(policy, expected_version=1)
        print(index, "saved", flush=True)
    except StaleEdit:
        print(index, "refused", flush=True)
"""


def _fresh(store: Store) -> None:
    store.delete_policy("p")
    assert store.save_policy(POLICY, expected_version=0)["version"] == 1


def _check(store: Store, outcome: list[tuple[int, str]]) -> None:
    winners = [i for i, what in outcome if what == "saved"]
    assert len(winners) == 1, outcome
    saved = store.get_policy("p")
    assert saved["version"] == 2 and saved["notes"] == f"w{winners[0]}"  # the winner's save, not a mix


def test_saves_from_one_view_in_several_processes_exactly_one_wins(tmp_path, capsys):
    """Separate processes (separate connections, no shared GIL), all saving at the same instant."""
    path = str(tmp_path / "wb.db")
    store = Store(path)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(ROOT), path, str(i)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for i in range(WORKERS)]
    try:
        for _ in range(TRIALS_PROCESSES):
            _fresh(store)
            at = time.time() + 0.3
            for p in procs:
                p.stdin.write(f"{at}\n")
                p.stdin.flush()
            outcome = []
            for p in procs:
                index, what = p.stdout.readline().split()
                outcome.append((int(index), what))
            _check(store, outcome)
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(30)
    with capsys.disabled():
        print(f"\n{TRIALS_PROCESSES} trials x {WORKERS} processes saving from version 1 at once: exactly one saved each time")


def test_saves_from_one_view_in_several_threads_exactly_one_wins(tmp_path, capsys):
    store = Store(tmp_path / "wb.db")
    for _ in range(TRIALS_THREADS):
        _fresh(store)
        barrier, outcome = threading.Barrier(WORKERS), []

        def save(i: int) -> None:
            barrier.wait()
            try:
                store.save_policy({**POLICY, "notes": f"w{i}"}, expected_version=1)
                outcome.append((i, "saved"))
            except StaleEdit:
                outcome.append((i, "refused"))

        threads = [threading.Thread(target=save, args=(i,)) for i in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _check(store, outcome)
    with capsys.disabled():
        print(f"\n{TRIALS_THREADS} trials x {WORKERS} threads saving from version 1 at once: exactly one saved each time")


def test_new_policy_deleted_policy_and_stale_edit_are_refused(tmp_path):
    store = Store(tmp_path / "wb.db")
    store.save_policy(POLICY, expected_version=0)
    with pytest.raises(StaleEdit, match="created meanwhile"):  # two "new policy" forms with one name
        store.save_policy({**POLICY, "notes": "second"}, expected_version=0)
    store.save_policy({**POLICY, "notes": "edit"}, expected_version=1)
    with pytest.raises(StaleEdit, match=r"saved again \(version 2\)"):
        store.save_policy({**POLICY, "notes": "stale"}, expected_version=1)
    store.delete_policy("p")
    with pytest.raises(StaleEdit, match="was deleted"):  # a view of a policy deleted meanwhile does not re-create it
        store.save_policy({**POLICY, "notes": "ghost"}, expected_version=2)
    assert store.get_policy("p") is None
    assert store.save_policy(POLICY)["version"] == 1  # templates and imports: unconditional


def test_other_check_then_writes_are_one_transaction(tmp_path):
    """Labeled-set import (checked for duplicates), a pin (at most one), a new target (never replaced),
    deleting a run with its results: each is all-or-nothing under concurrency."""
    from app.core.store import Exists

    store = Store(tmp_path / "wb.db")
    rows = [{"row_key": str(i), "state": f"s{i}", "label": "a", "split": "test"} for i in range(50)]
    ids: list[int] = []
    barrier = threading.Barrier(WORKERS)

    def imp() -> None:
        barrier.wait()
        ids.append(store.import_labeled_set(name="set", policy_id="p", rows=rows, content_hash="h"))

    threads = [threading.Thread(target=imp) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1 and len(store.list_labeled_sets()) == 1 and len(store.labeled_rows(ids[0])) == 50

    runs = [store.create_run(kind="playground", policy={}, target={"name": "x"}, n_rows=1) for _ in range(WORKERS)]
    barrier = threading.Barrier(WORKERS)

    def pin(rid: int) -> None:
        barrier.wait()
        store.pin_run(rid)

    threads = [threading.Thread(target=pin, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r["pinned"] for r in store.list_runs()) == 1
    pinned = store.pinned_run()["id"]
    store.unpin_run(next(r for r in runs if r != pinned))  # a stale "Unpin" on another run leaves the pin alone
    assert store.pinned_run()["id"] == pinned

    store.add_target("gpu", "semif", {"url": "http://a"})
    with pytest.raises(Exists, match="choose another name"):
        store.add_target("gpu", "semif", {"url": "http://b"})
    assert store.list_targets()[0]["config"] == {"url": "http://a"}

"""Background work (app/service/tasks.py): one worker per process, progress, Stop between rows, a stop
reason, failures reported - and a stopped evaluation is marked stopped and resumes where it was."""
from __future__ import annotations

import threading
import time

import pytest

from app.service.tasks import Stopped, TaskRunner


def wait(task, timeout=30):
    deadline = time.time() + timeout
    while task.active:
        assert time.time() < deadline, task.text()
        time.sleep(0.01)


def until(check, timeout=60):
    """Wait for a state another thread reaches (the bound only catches a hang)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "never reached"
        time.sleep(0.01)


def counting(rows: int, gate: threading.Event | None = None, every: float = 0.0):
    def work(task):
        for i in range(1, rows + 1):
            if gate is not None:
                gate.wait(60)  # the bound only catches a hang
            time.sleep(every)
            task.progress(i, rows, None)
        return rows
    return work


def test_tasks_run_in_order_on_one_worker_and_report_progress():
    runner = TaskRunner()
    gate = threading.Event()
    first = runner.submit("evaluate", "first", "views/calibrate.py", counting(5, gate))
    second = runner.submit("compare", "second", "views/compare.py", counting(3))
    until(lambda: first.status == "running")  # held at its gate
    assert second.status == "queued"  # one worker: the second waits
    assert "waiting" in second.text() and runner.busy_with("compare") is second
    gate.set()
    wait(second)
    assert (first.status, first.result, first.done, first.total) == ("done", 5, 5, 5)
    assert second.status == "done" and second.result == 3 and second.finished >= first.finished
    assert runner.active() == [] and {t.id for t in runner.finished_since(0)} == {first.id, second.id}


def test_stop_ends_a_task_between_rows_and_a_queued_one_never_starts():
    runner = TaskRunner()
    gate = threading.Event()
    running = runner.submit("evaluate", "long", "", counting(1000, gate))
    queued = runner.submit("evaluate", "next", "", counting(3))
    until(lambda: running.status == "running")  # held at its gate
    queued.stop()
    # a queued task is stopped at once: not still "waiting for the task before it" (with a Stop button, and the
    # pool's Score button disabled) until the one in front ends
    assert queued.status == "stopped" and not queued.active and running.status == "running"
    running.stop()
    gate.set()
    wait(running)
    wait(queued)
    assert running.status == "stopped" and running.done < 1000 and "stopped by the analyst" in running.text()
    assert queued.status == "stopped" and queued.done == 0


def test_a_stop_with_its_reason_and_a_failure_are_reported():
    runner = TaskRunner()

    def stops_at_seven(task):
        for i in range(1, 101):
            if i == 7:
                task.stop("enough")  # asked for while row 7 is scored: the task ends once it is reported
            task.progress(i, 100, None)

    ruled = runner.submit("evaluate", "ruled", "", stops_at_seven)
    wait(ruled)
    assert ruled.status == "stopped" and ruled.done == 7 and ruled.stop_reason == "enough"

    def broken(task):
        task.progress(1, 2, None)
        raise ValueError("the set's labels are not this policy's options")

    failed = runner.submit("evaluate", "broken", "", broken)
    wait(failed)
    assert failed.status == "failed" and "not this policy's options" in failed.text()
    later = runner.submit("evaluate", "after", "", counting(2))  # the worker survives a failure
    wait(later)
    assert later.status == "done"


def test_a_stopped_evaluation_is_marked_stopped_and_resumes_where_it_was(tmp_path, engine):
    """Stop after 6 rows: the run says stopped (not interrupted), keeps its 6 rows, and running it again
    scores only the rest - the rows come in stratified order, so the 6 are a fair sample."""
    from collections import Counter

    from app.core.labeled import import_file
    from app.core.store import Store
    from app.service import evaluate
    from app.service.policies import resolve_policy
    from app.targets.local import LocalTarget
    from tests.conftest import subset_file

    store = Store(tmp_path / "wb.db")
    policy = resolve_policy(store, "ticket-routing")
    path = subset_file(tmp_path, "ticket-routing", 24)
    set_id = import_file(store, path.name, path.read_bytes(), policy)
    target = LocalTarget("local", {"model": "smollm2"}, lambda ref: engine)
    runner = TaskRunner()
    def stop_at_six(t):
        def progress_for(part):
            report = t.progress_for(part)

            def at_six(done, total, eta):
                if done >= 6:
                    t.stop("six rows")  # as the analyst's Stop while the 6th row is scored
                report(done, total, eta)
            return at_six
        return evaluate.evaluate(store, policy, set_id, [target], ["default"], progress_for=progress_for)

    task = runner.submit("evaluate", "stop at 6", "", stop_at_six)
    wait(task, 300)
    (run,) = store.list_runs(kind="eval")
    assert task.status == "stopped" and run["status"] == "stopped" and len(store.results(run["id"])) == 6
    labels = Counter(r["label"] for r in store.results(run["id"]))
    share = Counter(r["label"] for r in store.labeled_rows(set_id) if r["split"] != "train")
    assert {k for k, v in share.items() if v / 24 >= 1 / 6} <= set(labels)  # every label with a share >= 1/6 is in
    (again,) = evaluate.evaluate(store, policy, set_id, [target], ["default"])
    assert again.run_id == run["id"] and again.counts["scored"] == 18 and again.counts["skipped"] == 6
    assert store.get_run(run["id"])["status"] == "done" and len(store.results(run["id"])) == 24


def test_a_stop_rule_of_the_evaluation_ends_each_target_and_readout_on_its_own(tmp_path, engine):
    from app.core.labeled import import_file
    from app.core.store import Store
    from app.service import evaluate
    from app.service.policies import resolve_policy
    from app.targets.local import LocalTarget
    from tests.conftest import subset_file

    store = Store(tmp_path / "wb.db")
    policy = resolve_policy(store, "ticket-routing")
    path = subset_file(tmp_path, "ticket-routing", 16)
    set_id = import_file(store, path.name, path.read_bytes(), policy)
    target = LocalTarget("local", {"model": "smollm2"}, lambda ref: engine)
    out = evaluate.evaluate(store, policy, set_id, [target], ["letters", "option-words"],
                            rule=evaluate.StopRule(max_rows=5))
    assert [o.stopped for o in out] == ["5 rows scored, as asked"] * 2  # both readouts, 5 rows each
    assert all(len(store.results(o.run_id)) == 5 and store.get_run(o.run_id)["status"] == "stopped" for o in out)
    with pytest.raises(Stopped):  # the analyst's stop is not a rule: it ends the whole task
        from app.service.tasks import Task

        t = Task(1, "evaluate", "x", "")
        t.stop()
        evaluate.evaluate(store, policy, set_id, [target], ["letters"], progress_for=t.progress_for)


def test_a_page_keeps_a_failed_tasks_message_until_it_starts_again():
    """ui/tasks.start + collect, as Compare, Order check and Robustness use them: a failure stays on the
    page across reruns (not only on the rerun that finds it); a new start clears it; a success opens
    the result."""
    from streamlit.testing.v1 import AppTest

    from tests.conftest import finish_tasks

    def page():
        import streamlit as st

        from app.ui import tasks

        if st.button("fail", key="fail"):
            tasks.start("x", "test", "failing work", "views/compare.py", lambda task: 1 / 0)
        if st.button("succeed", key="ok"):
            tasks.start("x", "test", "working work", "views/compare.py", lambda task: 42)
        tasks.collect("x", "The thing")
        st.write(f"open: {st.session_state.get('x_open')}")

    at = AppTest.from_function(page)
    at.run()
    at.button(key="fail").click().run()
    finish_tasks(at)
    assert len(at.error) == 1 and "The thing failed" in at.error[0].value and "division by zero" in at.error[0].value
    at.run()
    assert at.error and "division by zero" in at.error[0].value  # still on screen
    at.button(key="ok").click().run()
    finish_tasks(at)
    assert not at.error and "open: 42" in [m.value for m in at.markdown]

"""Work that outlives the page: evaluations, comparisons and checks run on one worker thread per
server process, so an analyst can open History while a 128-row evaluation goes on, come back and find
it where it is. A task reports progress (counts, ETA, which part) and can be stopped; the runs it
scores hold their leases and are resumable, so a stop (or a crash) loses nothing already scored.

No Streamlit here: the pages submit tasks and draw the TaskRunner's state; the worker thread is not
tied to any browser session."""
from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from app.core.runner import StopScoring

log = logging.getLogger("semif.workbench")
TaskStatus = Literal["queued", "running", "done", "failed", "stopped"]
KEEP_FINISHED = 20  # finished tasks kept for the "done" notices


class Stopped(StopScoring):
    """The task was stopped (the analyst pressed Stop): the runs it scored are resumable."""


@dataclass
class Task:
    id: int
    kind: str  # evaluate, compare, order-check, robustness
    label: str  # what the panel says: policy, set, targets
    page: str  # the page that shows its results, e.g. "views/calibrate.py"
    status: TaskStatus = "queued"
    part: str = ""  # which target x readout is being scored now
    done: int = 0
    total: int = 0
    eta: float | None = None
    error: str | None = None
    stop_reason: str | None = None
    result: Any = None
    submitted: float = field(default_factory=time.time)
    finished: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def active(self) -> bool:
        return self.status in ("queued", "running")

    def stop(self, reason: str = "stopped by the analyst") -> None:
        """Ask the task to stop after the row being scored (the rows already scored stay)."""
        if self.active and not self._stop.is_set():
            self.stop_reason = reason
            self._stop.set()
            if self.status == "queued":  # never started: stopped now, not when the worker reaches it (the worker
                self.status, self.finished = "stopped", time.time()  # skips it; one that just started stops at its check)

    def check(self) -> None:
        """Raise Stopped when a stop was asked for (an evaluation's own stop rule is
        app/service/evaluate.StopRule: it ends one target x readout, not the task)."""
        if self._stop.is_set():
            raise Stopped(self.stop_reason or "stopped")

    def progress(self, done: int, total: int, eta: float | None) -> None:
        """The ProgressFn the service functions take; stopping happens here, between rows."""
        self.done, self.total, self.eta = done, total, eta
        self.check()

    def progress_for(self, part: str) -> Callable[[int, int, float | None], None]:
        """A ProgressFn for one part of the task (a target x readout of an evaluation)."""
        def report(done: int, total: int, eta: float | None) -> None:
            self.part = part
            self.progress(done, total, eta)

        self.part = part
        self.check()  # a stop asked for during the previous part stops before this one starts
        return report

    def text(self) -> str:
        """'evaluate · Ticket routing x set #3 · local · default: 42/128 rows · about 180 s left'."""
        what = f"{self.label}" + (f" · {self.part}" if self.part else "")
        if self.status == "queued":
            return f"{what}: waiting for the task before it"
        if self.status == "running":
            left = "" if self.eta is None else f" · about {self.eta:.0f} s left" if self.eta >= 1 else " · almost done"
            return (f"{what}: {self.done}/{self.total} rows{left}" if self.total and self.done else
                    f"{what}: loading the model and scoring the policy's first passes…")
        if self.status == "stopped":
            return f"{what}: stopped at {self.done}/{self.total} ({self.stop_reason}) - run it again to resume"
        if self.status == "failed":
            return f"{what}: failed - {self.error}"
        return f"{what}: done ({self.done}/{self.total})"


class TaskRunner:
    """One worker thread per process; tasks run in the order they were submitted."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Task, Callable[[Task], Any]]] = queue.Queue()
        self._tasks: dict[int, Task] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None

    def submit(self, kind: str, label: str, page: str, work: Callable[[Task], Any]) -> Task:
        """Queue `work(task)`; it reports through task.progress / task.progress_for and may be stopped."""
        task = Task(next(self._ids), kind, label, page)
        with self._lock:
            self._tasks[task.id] = task
            finished = [t for t in self._tasks.values() if not t.active]
            for old in finished[:-KEEP_FINISHED]:
                del self._tasks[old.id]
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="semif-tasks", daemon=True)
                self._worker.start()
        self._queue.put((task, work))
        return task

    def _work(self) -> None:
        while True:
            task, work = self._queue.get()
            if task._stop.is_set():  # stopped while it waited
                task.status, task.finished = "stopped", time.time()
                continue
            task.status = "running"
            try:
                task.result = work(task)
                task.status = "done"
            except Stopped:
                task.status = "stopped"
            except Exception as exc:  # reported on the page; the log keeps the traceback
                log.exception("task %s (%s) failed", task.id, task.label)
                task.status, task.error = "failed", f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)
            finally:
                task.finished = time.time()

    def get(self, task_id: int | None) -> Task | None:
        return self._tasks.get(task_id) if task_id is not None else None

    def active(self) -> list[Task]:
        return [t for t in list(self._tasks.values()) if t.active]

    def finished_since(self, since: float) -> list[Task]:
        return [t for t in list(self._tasks.values()) if t.finished is not None and t.finished >= since]

    def busy_with(self, kind: str) -> Task | None:
        """The active task of this kind, if any (a page offers Stop instead of a second Run)."""
        return next((t for t in self.active() if t.kind == kind), None)


_SHARED: TaskRunner | None = None
_SHARED_LOCK = threading.Lock()


def shared() -> TaskRunner:
    """The process's runner (every browser session of a workbench server submits to it)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = TaskRunner()
        return _SHARED

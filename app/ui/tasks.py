"""Work running in the background, on every page: what runs (with progress, ETA and a Stop button),
and a note when it finishes - the worker thread (app/service/tasks.py) does not stop when the page
that started it is left, so coming back shows the run where it is."""
from __future__ import annotations

import time
from typing import Any
from pathlib import Path

import streamlit as st

from app.service.tasks import Task, TaskRunner, shared
from app.ui.keys import TASKS, TaskKeys
from app.ui.page_state import PageKeys
from app.ui.safe_text import md

POLL_SECONDS = 1.5
KEYS = TASKS  # the panel's session keys (a page's own task: TaskKeys(its prefix).task)


def runner() -> TaskRunner:
    """One worker per server process, shared by every session."""
    return shared()


def row(task: Task, key: str) -> None:
    """One task's progress bar (counts, ETA) and, while it runs, its Stop button (keys under `key`)."""
    c1, c2 = st.columns([6, 1])
    frac = task.done / task.total if task.total else 0.0
    c1.progress(min(frac, 1.0), text=md(task.text()))
    if task.active and c2.button("Stop", key=PageKeys(key)("stop", task.id),
                                 help="stops after the row being scored; what is scored stays, and running it again "
                                      "resumes"):
        task.stop()


def panel(current_page: str = "") -> None:
    """At the top of every page: the tasks still running, polled while there are any; when the last one
    finishes the whole page reruns once, so its results show. A finished task is noted once on other
    pages (its own page shows its results)."""
    tasks = runner()
    if not tasks.active():
        _finished_notes(tasks, current_page)
        return

    @st.fragment(run_every=POLL_SECONDS)
    def live() -> None:
        active = tasks.active()
        if not active:
            st.rerun()  # the page shows what just finished
        with st.container(border=True):
            st.caption("Running in the background - you can leave this page, the work goes on:")
            for task in active:
                row(task, KEYS.prefix)

    live()


def _finished_notes(tasks: TaskRunner, current_page: str) -> None:
    """What finished since this session last looked, once each."""
    seen = st.session_state.get(KEYS.seen, time.time())
    for task in tasks.finished_since(seen):
        if Path(task.page).stem == current_page:
            continue
        note = {"done": st.success, "stopped": st.info, "failed": st.error}[task.status]
        note(md(task.text()))
        if task.page:
            st.page_link(task.page, label="Open the results", icon=":material/arrow_forward:")
    st.session_state[KEYS.seen] = time.time()


def submit(kind: str, label: str, page: str, work) -> Task:  # type: ignore[no-untyped-def]
    """Queue work on the worker and remember it for this session; the panel shows it at once."""
    task = runner().submit(kind, label, page, work)
    st.session_state.setdefault(KEYS.mine, []).append(task.id)
    return task


def start(prefix: str, kind: str, label: str, page: str, work, planned: Any = None) -> None:  # type: ignore[no-untyped-def]
    """Start a page's work in the background and rerun: the panel shows it at once, and `collect(prefix)`
    on that page opens its result when it is done - or `planned` (what the work writes to, e.g. a comparison's
    group id) when it was stopped."""
    task, keys = submit(kind, label, page, work), TaskKeys(prefix)
    st.session_state[keys.task] = task.id
    if planned is not None:
        st.session_state[keys.planned] = planned
    st.session_state.pop(keys.failed, None)
    st.rerun()


def collect(prefix: str, what: str) -> None:
    """On the page that started the work: once it has finished, its result becomes the one shown
    (`<prefix>_open`), or its failure stays on screen (naming `what`) until the next start."""
    ss, keys = st.session_state, TaskKeys(prefix)
    done = runner().get(ss.get(keys.task))
    if done is not None and not done.active:
        ss.pop(keys.task)
        planned = ss.pop(keys.planned, None)  # what the work writes to, known before it started
        if done.status == "done":
            ss[keys.open] = done.result
        elif done.status == "stopped" and planned is not None:  # what was scored before Stop is the one shown
            ss[keys.open] = planned
        elif done.status == "failed":
            ss[keys.failed] = done.error
    if ss.get(keys.failed):
        st.error(f"**{what} failed**: {md(ss[keys.failed])}")

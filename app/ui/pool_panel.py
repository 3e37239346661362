"""The Review page's pool panel: unlabeled states kept for the policy (a CSV/JSONL, or a decision log already
imported), scored once with a saved calibrated policy - in the background, like every long run on the pages
(progress with counts and ETA, Stop, it goes on while the analyst opens other pages, and the panel shows it
again on return) - ranked for labeling in batches of k (least sure first, options short of labels first,
near-duplicates last; a share of each batch drawn at random, marked: Calibrate's unbiased check), labeled
here - each label a review action like the queue's, added to the set as a new version with the page's *Add … as
a new version* button."""
from __future__ import annotations

from typing import Any, Mapping

import streamlit as st

from app.core.store import Store
from app.service import pool as pools
from app.service.tasks import Task
from app.ui import context, resources, tasks
from app.ui.keys import REVIEW, TaskKeys
from app.ui.safe_text import md

KEYS = REVIEW
SCORING = TaskKeys(f"{REVIEW.prefix}_scoring")  # the pool's scoring task: rv_scoring_task, rv_scoring_planned
KIND = "pool-score"  # the task kind (one pool scoring at a time on the worker)


def pool_panel(db: Store, policy: Mapping[str, Any], sid: int, who: str) -> None:
    if _mine() is not None and KEYS.pool_open not in st.session_state:
        st.session_state[KEYS.pool_open] = True  # back on the page while this session's scoring runs: shown open
    if not st.checkbox("Label from a pool of unlabeled states (the next rows to label, ranked)", key=KEYS.pool_open,
                       persist_state=context.KEEP):
        return
    import_pool(db, policy, sid)
    stored = pools.list_pools(db, policy["id"])
    if not stored:
        st.caption("No pool of this policy yet: import one above.")
        return
    by_id = {p.id: p for p in stored}
    pid = st.selectbox("Pool", list(by_id), format_func=lambda i: by_id[i].label, key=KEYS.pool,
                       persist_state=context.KEEP)
    pool = by_id[pid]
    if pool.problems or pool.capped:
        with st.expander(f"{len(pool.problems)} rows of the file were left out" + (" · capped" if pool.capped else "")):
            st.text("\n".join(([pool.capped] if pool.capped else []) + pool.problems))
    saved = pools.calibrated_of(db, policy["id"])
    if not saved:
        st.info("No calibrated policy of this policy is saved yet: on **Calibrate**, evaluate the set, then *Save for "
                "Deploy* (or *Export this*) - the pool is scored with that candidate.")
        return
    names = {cid: f"#{cid} {cp.name or cp.policy_id} · {cp.model.file} · {cp.layout}" for cid, cp in saved}
    cid = st.selectbox("Scored and ranked by (a saved calibrated policy)", list(names), format_func=names.__getitem__,
                       key=KEYS.pool_candidate, persist_state=context.KEEP)
    cand = pools.candidate(db, dict(saved)[cid])
    where = pools.target_name(cand)
    collect()
    if scoring_now(pool.id, cid):
        return  # its progress is shown; the ranking comes when every row is scored
    run_id = pools.stored_scores(db, pool, cand, where)
    busy = tasks.runner().busy_with(KIND)
    left = pools.unscored(db, pool, run_id)
    label = ("Score the pool" if run_id is None else f"Score the {left} rows not scored yet" if left else
             f"All {pool.n_rows} rows are scored")
    if st.button(label, key=KEYS.pool_score, disabled=busy is not None or not left,
                 help="runs in the background: you can open other pages meanwhile, and come back here" if busy is None
                 else f"another pool is being scored: {busy.text()}"):
        start(db, pool, cid, cand, where)
    show_note(scored_note(pool.id, cid))
    if run_id is None:
        st.caption(md(f"Not scored yet with {cand.describe}: each row is scored once and kept - the next ranking and "
                      "the next calibration reuse the stored scores."))
        return
    k, share = batch_controls()
    ranked = pools.rank_pool(db, pool, cand, run_id, k=k, into_set=sid, random_share=share)
    st.caption(md(ranked.text))
    for problem in ranked.failed[:10]:
        st.caption(md(problem))
    if len(ranked.failed) > 10:
        st.caption(f"… and {len(ranked.failed) - 10} more rows like these")
    ids = [o.id for o in cand.policy.options]
    for row in ranked.rows:
        label_row(db, row, ids, cand, who)


def batch_controls() -> tuple[int, float]:
    """How many rows a batch shows (k) and the share of them drawn at random."""
    c1, c2 = st.columns(2)
    k = int(c1.number_input("Rows per batch (k)", min_value=1, max_value=200, value=10, key=KEYS.pool_k))
    share = float(c2.number_input(
        "Share drawn at random", min_value=0.0, max_value=1.0, value=pools.RANDOM_SHARE, step=0.05,
        key=KEYS.pool_share, help="round(share × k) rows of each batch are drawn at random from the open rows instead "
        "of ranked (marked 'random draw'). Label them whatever they look like: on Calibrate they are the check of the "
        "gate that does not lean low - the ranked rows are the model's hardest, so the gate's evidence on every row "
        "leans low. 0: ranked rows only."))
    return k, share


def import_pool(db: Store, policy: Mapping[str, Any], sid: int) -> None:
    c1, c2 = st.columns(2)
    up = c1.file_uploader("Import unlabeled states as a pool (CSV with a state column, or JSONL)",
                          type=["csv", "jsonl"], key=KEYS.pool_file)
    if c1.button("Import as a pool", key=KEYS.pool_import, disabled=up is None) and up is not None:
        try:
            got = pools.import_upload(db, policy, up.name, up.getvalue(), into_set=sid)
        except pools.PoolProblem as exc:
            c1.error(md(exc))
        else:
            c1.success(md(got.text))
            if got.problems:
                c1.warning(md("Left out: " + "; ".join(got.problems[:20])
                              + (f"; … {len(got.problems) - 20} more" if len(got.problems) > 20 else "")))
    logs = dict(pools.decision_logs(db, policy["id"]))
    if logs:
        run = c2.selectbox("or a decision log already imported", list(logs), format_func=logs.__getitem__,
                           key=KEYS.pool_log)
        if c2.button("Use this log as a pool", key=KEYS.pool_log_import):
            try:
                c2.success(md(pools.import_log(db, policy, run, into_set=sid).text))
            except pools.PoolProblem as exc:
                c2.error(md(exc))


def _mine() -> Task | None:
    """This session's pool scoring (running, or finished and not looked at yet)."""
    return tasks.runner().get(st.session_state.get(SCORING.task))


def start(db: Store, pool: pools.StoredPool, cid: int, cand: pools.Candidate, where: str) -> None:
    """The pool scored in the background (the target's model loaded here, so a missing one is said at once)."""
    targets = resources.chosen_targets(db, [where])
    if not targets:
        return
    target = targets[0]
    tasks.start(SCORING.prefix, KIND, f"scoring pool #{pool.id} ({pool.n_rows} rows) with #{cid} "
                f"{cand.policy.model.file} · {cand.policy.layout}", "views/review.py",
                lambda task: pools.score(db, pool, cand, target, task.progress), planned={"pool": pool.id, "candidate": cid})


def collect() -> None:
    """This session's scoring, once it is over: what it did, kept as the note of that pool and candidate (another
    pool or candidate shows its own note, or none)."""
    ss = st.session_state
    task, planned = _mine(), ss.get(SCORING.planned)
    if planned is None or ss.get(SCORING.task) is None or (task is not None and task.active):
        return
    ss.pop(SCORING.task, None)
    ss.pop(SCORING.planned, None)
    # a task the worker no longer keeps (it keeps the last KEEP_FINISHED) ended while the analyst was away
    note = ("done", pools.scoring_note(None)) if task is None else (task.status, pools.scoring_note(task))
    ss.setdefault(KEYS.pool_scored, {})[_note_key(planned["pool"], planned["candidate"])] = note


def _note_key(pool_id: int, cid: int) -> str:
    return f"pool {pool_id} candidate {cid}"


def scored_note(pool_id: int, cid: int) -> tuple[str, str] | None:
    """The last scoring of this pool with this candidate in this session: (status, what it said)."""
    notes: dict[str, tuple[str, str]] = st.session_state.get(KEYS.pool_scored) or {}
    return notes.get(_note_key(pool_id, cid))


def show_note(note: tuple[str, str] | None) -> None:
    if note is None:
        return
    status, text = note
    if status == "done":
        st.caption(md(text))
    elif status == "stopped":
        st.info(md(text))
    else:
        st.error(md(text))


def scoring_now(pool_id: int, cid: int) -> bool:
    """While this session's scoring of this pool with this candidate runs: its progress, ETA and Stop, polled;
    the page reruns when it ends (and shows the ranking)."""
    planned = st.session_state.get(SCORING.planned)
    task = _mine()
    if task is None or not task.active or planned != {"pool": pool_id, "candidate": cid}:
        return False

    @st.fragment(run_every=tasks.POLL_SECONDS)
    def live() -> None:
        now = _mine()
        if now is None or not now.active:
            st.rerun()
            return
        with st.container(border=True):
            st.caption(f"Scoring pool #{pool_id} with candidate #{cid} in the background - you can leave this page, "
                       "it goes on and shows here when you come back. The ranking comes when every row is scored; "
                       "Stop keeps what is scored, and scoring again resumes.")
            tasks.row(now, SCORING.prefix)

    live()
    return True


def code(text: str) -> str:
    """`text` as inline code: shown as it is (markdown escapes would show as backslashes inside code), with a
    backtick - the one character that ends a code span - shown as a quote."""
    return "`" + text.replace("`", "'").replace("\n", " ") + "`"


def label_row(db: Store, row: pools.Suggested, ids: list[str], cand: pools.Candidate, who: str) -> None:
    text = row.state if isinstance(row.state, str) else str(row.state)
    how = " · 🎲 **random draw** (label it whatever it looks like)" if row.drawn else ""
    st.markdown(f"**{row.rank}.** line {row.line} {code(row.id)}{how} · margin {row.margin:.3f} · the policy says "
                f"**{md(row.proposed)}**")
    st.text(text[:2000])
    cols = st.columns(min(len(ids), 6))
    for i, oid in enumerate(ids):
        if cols[i % len(cols)].button(oid, key=KEYS("pool_label", row.line, i),
                                      type="primary" if oid == row.proposed else "secondary"):
            try:
                pools.label(db, row, oid, who=who, policy=cand.policy)
            except ValueError as exc:
                st.error(md(exc))
                return
            st.rerun()

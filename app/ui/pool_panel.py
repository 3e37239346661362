"""The Review page's pool panel: unlabeled states kept for the policy (a CSV/JSONL, or a decision log already
imported), scored once with a saved calibrated policy, ranked for labeling in batches of k (least sure
first, options short of labels first, near-duplicates last), labeled here - each label a review action like
the queue's, added to the set as a new version with the page's *Add … as a new version* button."""
from __future__ import annotations

from typing import Any, Mapping

import streamlit as st

from app.core.store import Store
from app.service import pool as pools
from app.ui import resources
from app.ui.keys import REVIEW
from app.ui.safe_text import md

KEYS = REVIEW


def pool_panel(db: Store, policy: Mapping[str, Any], sid: int, who: str) -> None:
    if not st.checkbox("Label from a pool of unlabeled states (the next rows to label, ranked)", key=KEYS.pool_open):
        return
    import_pool(db, policy, sid)
    stored = pools.list_pools(db, policy["id"])
    if not stored:
        st.caption("No pool of this policy yet: import one above.")
        return
    by_id = {p.id: p for p in stored}
    pid = st.selectbox("Pool", list(by_id), format_func=lambda i: by_id[i].label, key=KEYS.pool)
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
                       key=KEYS.pool_candidate)
    cand = pools.candidate(db, dict(saved)[cid])
    where = pools.target_name(cand)
    run_id = pools.stored_scores(db, pool, cand, where)
    if st.button("Score the pool" if run_id is None else "Score the rows not scored yet", key=KEYS.pool_score):
        run_id = score(db, pool, cand, where)
    if KEYS.pool_scored in st.session_state:
        st.caption(md(st.session_state[KEYS.pool_scored]))
    if run_id is None:
        st.caption(md(f"Not scored yet with {cand.describe}: each row is scored once and kept - the next ranking and "
                      "the next calibration reuse the stored scores."))
        return
    k = int(st.number_input("Rows per batch (k)", min_value=1, max_value=200, value=10, key=KEYS.pool_k))
    ranked = pools.rank_pool(db, pool, cand, run_id, k=k, into_set=sid)
    st.caption(md(ranked.text))
    for problem in ranked.failed[:10]:
        st.caption(md(problem))
    ids = [o.id for o in cand.policy.options]
    for row in ranked.rows:
        label_row(db, row, ids, cand, who)


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


def score(db: Store, pool: pools.StoredPool, cand: pools.Candidate, where: str) -> int | None:
    targets = resources.chosen_targets(db, [where])
    if not targets:
        return None
    bar = st.progress(0.0, text="scoring the pool")

    def progress(done: int, total: int, eta: float | None) -> None:
        bar.progress(done / max(total, 1), text=f"{done}/{total} rows")

    got = pools.score(db, pool, cand, targets[0], progress)
    st.session_state[KEYS.pool_scored] = got.text
    return got.run_id


def label_row(db: Store, row: pools.Suggested, ids: list[str], cand: pools.Candidate, who: str) -> None:
    text = row.state if isinstance(row.state, str) else str(row.state)
    st.markdown(f"**{row.rank}.** line {row.line} `{md(row.id)}` · margin {row.margin:.3f} · the policy says "
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

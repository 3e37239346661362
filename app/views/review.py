"""Review queue: label the rows that need a person - target disagreements first, then the rows a gate
sent to the fallback, nearest the gate first - from the keyboard (1-9 pick an option, S skips, U undoes),
or the next rows of a pool of unlabeled states (app/ui/pool_panel.py); the labels become a new version of a
labeled set (app/core/review.py)."""
import getpass
import json
from typing import Any, Mapping

import streamlit as st

from app.core.store import Store
from app.service import label_issues, policies as policy_service, review, sets as set_service
from app.ui import context, resources
from app.ui.components import saved_policies
from app.ui.drift_panel import gate_choice
from app.ui.safe_text import md
from app.ui.keys import REVIEW
from app.ui.label_issues_panel import label_issues_panel
from app.ui.pool_panel import pool_panel

KEYS = REVIEW  # this page's session and widget keys


def render() -> None:
    st.title("Review queue")
    st.caption("Rows that need a label: where two targets (or production and its replay) disagree, then the rows a "
               "gate sent to the fallback, nearest the gate first. Keys: **1–9** pick an option, **S** skips, "
               "**U** takes the last label back.")
    db = resources.store()
    picked = pickers(db)
    if picked is None:
        return
    policy, sid = picked
    gate = gate_choice(db, policy["id"], key=KEYS.prefix)
    who = st.text_input("Reviewer (stored with every label)", value=getpass.getuser(), key=KEYS.who)
    q = review.queue(db, policy, gate, into_set=sid)
    if q.items:
        st.caption(q.summary)
    else:  # said here, where the queue would be, not in small print above and a bare line below the pool
        st.info(q.empty_text)
    actions(db, q, policy, sid)
    label_check(db, policy, sid, who)
    pool_panel(db, policy, sid, who)
    if q.items:
        label_panel(db, q.items[0], policy, who)


def label_check(db: Store, policy: Mapping[str, Any], sid: int, who: str) -> None:
    """On request: the set's likely wrong labels, from its newest evaluation (app/ui/label_issues_panel)."""
    if not st.checkbox("Check this set's labels for likely mistakes", key=KEYS.label_check):
        return
    cal = label_issues.latest(db, policy["id"], sid)
    if cal is None:
        st.caption("No finished evaluation of this policy on this set yet: evaluate it on Calibrate first.")
        return
    label_issues_panel(db, cal, KEYS, who)


def pickers(db: Store) -> tuple[Mapping[str, Any], int] | None:
    """The policy (following the other pages') and the set the labels are added to; None: nothing to review into."""
    saved = saved_policies(db)
    if saved is None:
        return None
    policies = {p["id"]: p for p in saved}
    c1, c2 = st.columns(2)
    context.follow(KEYS.policy, "policy", list(policies))
    pid = c1.selectbox("Policy", list(policies), format_func=lambda i: policy_service.title(policies[i]['name'], policies[i].get('version')), key=KEYS.policy,
                       on_change=context.changed(KEYS.policy, "policy"))
    context.put("policy", pid)
    sets = set_service.of_policy(db, pid)
    if not sets:
        st.info("No labeled set of this policy yet: import one on the Calibrate page - reviewed rows are added to it "
                "as a new version.")
        return None
    if KEYS.set_next in st.session_state:  # a version just made: add the next labels to it
        st.session_state[KEYS.set] = st.session_state.pop(KEYS.set_next)
    sid = c2.selectbox("Add the labels to", [s["id"] for s in sets], key=KEYS.set,
                       format_func=lambda i: next(f"#{s['id']} {s['name']} ({s['n_rows']} rows, {s['content_hash'][:10]})"
                                                  for s in sets if s["id"] == i))
    return policies[pid], sid


def actions(db: Store, q: review.Queue, policy: Mapping[str, Any], sid: int) -> None:
    """Undo the last label; add the pending labels as a new set version (and what was made last)."""
    c1, c2, c3 = st.columns(3)
    last = q.last
    if c1.button("Undo the last label (U)", key=KEYS.undo, disabled=last is None, shortcut="U") and last is not None:
        review.undo(db, last["id"])
        st.toast(f"Taken back: {last['label'] or 'skip'} on {last['row_key']}")
        st.rerun()
    if c2.button(f"Add {review.plural(q.pending, 'label')} as a new version of set #{sid}", key=KEYS.append,
                 type="primary", disabled=not q.pending):
        try:
            made = review.add_version(db, sid, policy)
        except ValueError as exc:
            st.error(md(exc))
        else:
            st.session_state[KEYS.made] = made
            st.session_state[KEYS.set_next] = made.set_id
            context.put("set", made.set_id)  # Calibrate (its "Go to Calibrate" link) opens the new version
            st.rerun()
    last_made: review.VersionMade | None = st.session_state.get(KEYS.made)
    if last_made is not None and last_made.set_id == sid:  # the note belongs to the set it made, not to any other
        st.success(last_made.text)
        c3.page_link("views/calibrate.py", label="Go to Calibrate", icon=":material/tune:")


def label_panel(db: Store, item: review.Item, policy: Mapping[str, Any], who: str) -> None:
    """The first row of the queue: its state, the model's answer, one button per option, Skip."""
    st.subheader(f"{md(item.reason)}")
    if isinstance(item.state, str):
        st.text(item.state)
    else:
        st.code(json.dumps(item.state, indent=2, ensure_ascii=False), language="json")
    st.markdown(f"Deployed decision: **{md(item.proposed)}** (confidence {item.confidence:.3f}), decided by "
                f"{md(item.decided_by)}")
    st.caption((f"The zero-shot model alone said {md(item.zero_shot)} · " if item.zero_shot else "")
               + f"run #{item.run_id}{f' ({item.version})' if item.version else ''}, row {md(item.row_key)}")
    note = st.text_input("Note (optional, stored with the label)", key=KEYS("note", item.key[:40]))
    cols = st.columns(min(len(item.option_ids), 5) or 1)
    for i, oid in enumerate(item.option_ids):
        shortcut = str(i + 1) if i < 9 else None
        desc = next((o.get("description") for o in policy["options"] if o["id"] == oid), "") or ""
        if cols[i % len(cols)].button(f"{i + 1} · {oid}" if shortcut else oid, key=KEYS("opt", i), shortcut=shortcut,
                                      help=desc or None, type="primary" if oid == item.proposed else "secondary"):
            save(db, item, oid, who, note, policy["id"])
    if st.button("Skip (S)", key=KEYS.skip, shortcut="S"):
        save(db, item, None, who, note, policy["id"])


def save(db: Store, item: review.Item, option_id: str | None, who: str, note: str, pid: str) -> None:
    try:
        review.label(db, item, option_id, who=who, note=note, policy_id=pid)
    except ValueError as exc:
        st.error(f"**Reviewer**: {md(exc)}")
        return
    st.rerun()


if __name__ == "__main__":
    resources.run_page(render)

"""Review queue: label the rows that need a person - target disagreements first, then the rows a gate
sent to the fallback, nearest the gate first - from the keyboard (1-9 pick an option, S skips, U undoes);
the labels become a new version of a labeled set (app/core/review.py)."""
import getpass
import json

import streamlit as st

from app.service import review, sets as set_service
from app.ui import context, resources
from app.ui.components import saved_policies
from app.ui.drift_panel import gate_choice
from app.ui.safe_text import md


def render() -> None:
    st.title("Review queue")
    st.caption("Rows that need a label: where two targets (or production and its replay) disagree, then the rows a "
               "gate sent to the fallback, nearest the gate first. Keys: **1–9** pick an option, **S** skips, "
               "**U** takes the last label back.")
    db = resources.store()
    saved = saved_policies(db)
    if saved is None:
        return
    policies = {p["id"]: p for p in saved}
    c1, c2 = st.columns(2)
    context.follow("rv_policy", "policy", list(policies))
    pid = c1.selectbox("Policy", list(policies), format_func=lambda i: policies[i]["name"], key="rv_policy",
                       on_change=context.changed("rv_policy", "policy"))
    context.put("policy", pid)
    policy = policies[pid]
    sets = set_service.of_policy(db, pid)
    if not sets:
        st.info("No labeled set of this policy yet: import one on the Calibrate page - reviewed rows are added to it "
                "as a new version.")
        return
    if "rv_set_next" in st.session_state:  # a version just made: add the next labels to it
        st.session_state["rv_set"] = st.session_state.pop("rv_set_next")
    sid = c2.selectbox("Add the labels to", [s["id"] for s in sets], key="rv_set",
                       format_func=lambda i: next(f"#{s['id']} {s['name']} ({s['n_rows']} rows, {s['content_hash'][:10]})"
                                                  for s in sets if s["id"] == i))
    gate = gate_choice(db, pid, key="rv")
    who = st.text_input("Reviewer (stored with every label)", value=getpass.getuser(), key="rv_who")
    q = review.queue(db, policy, gate, into_set=sid)
    items, left, pending, last = q.items, q.left_out, q.pending, q.last
    st.caption(f"{plural(len(items), 'row')} to review · {pending} labelled, not yet added · left out: {left['labeled']} "
               f"already labeled, {left['known']} already in the set or reviewed, {left['no_state']} without a logged "
               "state")
    c1, c2, c3 = st.columns(3)
    if c1.button("Undo the last label (U)", key="rv_undo", disabled=last is None, shortcut="U") and last is not None:
        review.undo(db, last["id"])
        st.toast(f"Taken back: {last['label'] or 'skip'} on {last['row_key']}")
        st.rerun()
    if c2.button(f"Add {plural(pending, 'label')} as a new version of set #{sid}", key="rv_append", type="primary",
                 disabled=not pending):
        try:
            new, added, digest = review.add_version(db, sid, policy)
        except ValueError as exc:
            st.error(md(exc))
        else:
            st.session_state["rv_made"] = (new, added, sid, digest)
            st.session_state["rv_set_next"] = new
            st.rerun()
    if made := st.session_state.get("rv_made"):
        new, added, base, digest = made
        st.success(f"Set #{new} = set #{base} + {added} reviewed rows (content hash {digest[:12]}…); set #{base} is "
                   "unchanged, so runs on it still reproduce. On **Calibrate**, evaluating the new set scores only the "
                   "new rows.")
        c3.page_link("views/calibrate.py", label="Go to Calibrate", icon=":material/tune:")
    if not items:
        st.success("Nothing to review for this policy right now.")
        return
    item = items[0]
    st.subheader(f"{md(item.reason)}")
    if isinstance(item.state, str):
        st.text(item.state)
    else:
        st.code(json.dumps(item.state, indent=2, ensure_ascii=False), language="json")
    st.caption(f"The model's answer: **{md(item.proposed)}** (confidence {item.confidence:.3f}) · run #{item.run_id}, "
               f"row {md(item.row_key)}")
    note = st.text_input("Note (optional, stored with the label)", key=f"rv_note_{item.key[:40]}")
    cols = st.columns(min(len(item.option_ids), 5) or 1)
    for i, oid in enumerate(item.option_ids):
        shortcut = str(i + 1) if i < 9 else None
        desc = next((o.get("description") for o in policy["options"] if o["id"] == oid), "") or ""
        if cols[i % len(cols)].button(f"{i + 1} · {oid}" if shortcut else oid, key=f"rv_opt_{i}", shortcut=shortcut,
                                      help=desc or None, type="primary" if oid == item.proposed else "secondary"):
            save(db, item, oid, who, note, pid)
    if st.button("Skip (S)", key="rv_skip", shortcut="S"):
        save(db, item, None, who, note, pid)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def save(db, item, option_id, who: str, note: str, pid: str) -> None:
    try:
        review.label(db, item, option_id, who=who, note=note, policy_id=pid)
    except ValueError as exc:
        st.error(f"**Reviewer**: {md(exc)}")
        return
    st.rerun()


if __name__ == "__main__":
    resources.run_page(render)

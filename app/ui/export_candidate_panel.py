"""*Export this*: under the Calibrate page's "cheapest decision that is not worse" table, any candidate (the
recommended one by default) becomes the calibrated policy file in one step - its model (sha256), layout and
head, fitted on all labeled rows - to download or save for Deploy (which packages the model it names)."""
from __future__ import annotations

import json

import streamlit as st

from app.core.store import Store
from app.service import evaluate, export_candidate
from app.ui.page_state import PageKeys
from app.ui.safe_text import md


def export_this(db: Store, table: export_candidate.Table, keys: PageKeys, target_accuracy: float) -> None:
    live = [r for r in table.rows if r.accuracy is not None]
    if not live:
        return
    start = next((i for i, r in enumerate(live) if r is table.recommended), 0)
    c1, c2 = st.columns([3, 1])
    i = c1.selectbox("Export this candidate", list(range(len(live))), index=start, key=keys("src", "pick"),
                     format_func=lambda j: live[j].candidate.name + (" (recommended)" if live[j] is table.recommended
                                                                      else ""))
    state = keys("src", "exported")
    runs = sorted({r.candidate.run_id for r in table.rows})  # the export belongs to this table's runs only
    if c2.button("Export this", key=keys("src", "export"), type="primary"):
        picked = export_candidate.Picked(live[i], export_candidate.head_of(live[i].candidate))
        try:
            cal = export_candidate.calibrate(db, picked, target_accuracy=target_accuracy)
            st.session_state[state] = (runs, picked.label, evaluate.export(db, cal))
        except ValueError as exc:
            st.error(md(exc))
            return
    done = st.session_state.get(state)
    if not done or done[0] != runs:  # nothing exported, or an export of another run's table: not shown here
        return
    _, label, exported = done
    config = exported.to_json()
    head = config.get("head") or {}
    st.info(md(f"{label}: the file names {config['model']['file']} (sha256 {config['model']['sha256'][:12]}…), "
               f"layout {config['layout']}, " + (f"a {head.get('kind')} head" if head else "no head")
               + f", fitted on all {config['dataset']['rows_scored']} labeled rows. {exported.gate.messages[0]}"))
    d1, d2 = st.columns(2)
    d1.download_button("Download the policy file", json.dumps(config, indent=2, ensure_ascii=False).encode(),
                       file_name=f"{config['policy_id']}.policy.json", mime="application/json", key=keys("src", "dl"))
    if d2.button("Save it for Deploy", key=keys("src", "save")):
        cid = evaluate.save(db, exported)
        st.success(f"Saved as calibrated policy #{cid}: Deploy packages the model it names.")

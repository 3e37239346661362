"""The one upload mapping of the workbench (Calibrate's labeled sets, Compare's states): which column is the
state, the label and the id, what each label value is taken as, a warning when the state column looks like
ids, and the first rows as they will be stored - all before Import or Run. The decisions are in
app/core/importer.py (through app/service/sets.py); this draws them."""
from __future__ import annotations

import hashlib

import streamlit as st
from streamlit.delta_generator import DeltaGenerator
from streamlit.runtime.uploaded_file_manager import UploadedFile

from app.service import sets
from app.service.sets import ColumnMap
from app.ui.page_state import PageKeys
from app.ui.safe_text import md

NO_LABEL = "(no label column)"
ROW_NUMBER = "(the row number)"
REFUSED = "(not an option: refused)"


def column_mapping(column: DeltaGenerator, upload: UploadedFile, option_ids: list[str], keys: PageKeys, *,
                   label_required: bool = True, policy_name: str = "") -> ColumnMap:
    """The mapping the analyst confirms for this upload, with the preview of the rows it gives. The widgets
    are keyed by the file, so a new upload starts from its own guesses."""
    name, data = upload.name, upload.getvalue()
    guess = sets.guess_mapping(name, data)
    if not guess.columns:  # not readable: the import says why
        return ColumnMap()
    file_key = hashlib.sha256(name.encode() + data).hexdigest()[:10]
    cols = guess.columns
    labels = cols if label_required else [NO_LABEL, *cols]
    label_at = labels.index(guess.label) if guess.label in labels else 0
    with column.expander("Columns and labels", expanded=guess.needs_a_look):
        st.caption("Proposed: the longest free-text column as the state (the text to decide on), a column named "
                   "like a label as the correct option, an id-like column as each row's id.")
        state = st.selectbox("State column", cols, index=cols.index(guess.state) if guess.state in cols else 0,
                             key=keys("col_state", file_key))
        label = st.selectbox("Label column", labels, index=label_at, key=keys("col_label", file_key))
        ids = [ROW_NUMBER, *cols]
        ident = st.selectbox("Id column", ids, index=ids.index(guess.id) if guess.id in ids else 0,
                             key=keys("col_id", file_key))
        mapping = label_mapping(name, data, label, option_ids, keys, file_key, policy_name) if label != NO_LABEL else {}
    if warning := sets.state_warning(name, data, state):
        column.warning(md(warning))
    chosen = ColumnMap(state, label if label != NO_LABEL else "\0no label", mapping,
                       ident if ident != ROW_NUMBER else "\0row number")
    column.caption("Preview: the first rows as they will be stored")
    column.table(sets.preview(name, data, chosen, option_ids))  # a plain table: read as text, also by a test
    return chosen


def label_mapping(name: str, data: bytes, label: str, option_ids: list[str], keys: PageKeys, file_key: str,
                  policy_name: str) -> dict[str, str]:
    """What each label value that is not an option id is taken as (a proposal: 'Feature Request' ->
    'feature_request'); values left unmapped are refused on import, naming the rows."""
    proposed = sets.label_suggestions(name, data, label, option_ids)
    mapping: dict[str, str] = {}
    others = [v for v, o in proposed.items() if o != v]
    for i, value in enumerate(others[:40]):
        guess = proposed[value]
        pick = st.selectbox(f"Label '{md(value)}' is the option", [REFUSED, *option_ids],
                            index=option_ids.index(guess) + 1 if guess else 0, key=keys("map", file_key, i))
        if pick in option_ids:
            mapping[value] = pick
    if len(others) > 40:
        st.caption(f"{len(others) - 40} more label values are not options: fix them in the file.")
    if not others:
        st.caption(f"Every value of {md(label)} is an option of {md(policy_name or 'the policy')}.")
    return mapping

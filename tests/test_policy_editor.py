"""The Policies editor's state machine (app/ui/policy_editor.py) without Streamlit: session state is a plain
dict, saves go to a real store. Every transition: pick, a switch asked for over unsaved changes (keep
editing, discard), a save from the Form and from the JSON tab, a refused save (invalid, an id taken, a
stale view - nothing typed and nothing already saved is lost), reload, delete."""
from __future__ import annotations

import json
from typing import Any

import pytest

from app.core.store import Store
from app.service import policies as policy_service, queries
from app.ui import policy_editor as pe

P = {"id": "p", "name": "P", "question": "Q?", "options": [{"id": "a", "description": "first"},
                                                            {"id": "b", "description": "second"}], "examples": []}
Q = {**P, "id": "q", "name": "Q", "question": "Other?"}


@pytest.fixture
def db(tmp_path):
    store = Store(tmp_path / "wb.db")
    store.save_policy(P, expected_version=0)
    store.save_policy(Q, expected_version=0)
    return store


def saved(db: Store) -> dict[str, Any]:
    return {p["id"]: p for p in queries.policies(db)}


def run(state: dict, db: Store, pick: str | None = None, wanted: str | None = None) -> pe.Editor:
    """One page run: the picker's options, the analyst's pick (a selectbox writes its key), the editor."""
    policies = saved(db)
    ids = pe.choices(state, list(policies), wanted)
    if pick is not None:
        state[pe.PICK_KEY] = pick
    return pe.editor(state, state[pe.PICK_KEY], policies, ids)


def type_into(state: dict, ed: pe.Editor, field: str, value: str) -> None:
    state[pe.key(field, ed.view)] = value


def save_to(db: Store):
    return lambda clean, version: policy_service.save(db, clean, version)


def taken(via):
    return lambda new_id, editing, ids: policy_service.id_taken(new_id, editing, ids, via=via)


def test_the_other_pages_policy_opens_first_then_the_analysts_pick_stays(db):
    state: dict = {}
    ed = run(state, db, wanted="q")
    assert (ed.pick, ed.mode, ed.version, ed.view) == ("q", "clean", 1, "q_v1")
    assert run(state, db, wanted="p").pick == "q"  # a pick made: the context no longer moves it
    assert run({}, db).pick == "p"  # nothing asked for: the first saved policy


def test_typing_makes_a_draft_and_typing_it_back_makes_it_clean(db):
    state: dict = {}
    ed = run(state, db, pick="p")
    type_into(state, ed, "question", "Draft?")
    ed = run(state, db)
    assert ed.mode == "draft" and ed.changed == ("question",)
    type_into(state, ed, "question", "Q?")
    assert run(state, db).mode == "clean"


def test_a_switch_over_unsaved_changes_waits_then_keep_editing_keeps_the_draft(db):
    state: dict = {}
    ed = run(state, db, pick="p")
    type_into(state, ed, "question", "Draft?")
    run(state, db)
    state[pe.PICK_KEY] = "q"  # the analyst picks another policy
    ed = run(state, db)
    assert (ed.pick, ed.pending, ed.mode) == ("p", "q", "pending")
    pe.keep_editing(state)
    ed = run(state, db)
    assert (ed.pick, ed.pending, ed.mode) == ("p", None, "draft")
    assert state[pe.key("question", ed.view)] == "Draft?"


def test_new_policy_over_unsaved_changes_asks_too_and_discard_opens_it(db):
    state: dict = {}
    ed = run(state, db, pick="p")
    type_into(state, ed, "notes", "draft note")
    run(state, db)
    pe.new_policy(state)
    ed = run(state, db)
    assert (ed.pick, ed.pending) == ("p", pe.NEW)
    pe.discard_and_open(state, ed.view, ed.pending)
    ed = run(state, db)
    assert (ed.pick, ed.mode, ed.editing, ed.saved) == (pe.NEW, "clean", None, pe.EMPTY)
    assert pe.key("notes", "p_v1") not in state  # the draft is gone
    assert run(state, db, pick="p").mode == "clean"  # no draft here: opens at once, from what is saved


def test_a_form_save_stores_the_draft_and_opens_the_new_version(db):
    state: dict = {}
    ed = run(state, db, pick="p")
    type_into(state, ed, "question", "Better question?")
    ed = run(state, db)
    out = pe.submit(state, ed, "form", list(saved(db)), save_to(db), taken("form"))
    assert out is not None and out["version"] == 2 and db.get_policy("p")["question"] == "Better question?"
    assert pe.just_saved(state) == "P" and pe.just_saved(state) is None  # said once
    ed = run(state, db)
    assert (ed.pick, ed.version, ed.mode, ed.errors) == ("p", 2, "clean", {})
    assert pe.key("question", "p_v1") not in state  # the old view's widgets are dropped


def test_a_json_save_of_a_new_policy_opens_it(db):
    state: dict = {}
    ed = run(state, db, pick=pe.NEW)
    type_into(state, ed, "json", json.dumps({**P, "id": "r", "name": "R"}))
    ed = run(state, db)
    assert ed.changed == ("json",)
    assert pe.submit(state, ed, "json", list(saved(db)), save_to(db), taken("json")) is not None
    assert run(state, db).pick == "r" and db.get_policy("r")["name"] == "R"


def test_an_invalid_save_is_refused_with_the_fields_and_the_draft_stays(db):
    state: dict = {}
    ed = run(state, db, pick="p")
    type_into(state, ed, "question", "")
    ed = run(state, db)
    assert pe.submit(state, ed, "form", list(saved(db)), save_to(db), taken("form")) is None
    ed = run(state, db)
    assert "question" in ed.errors and ed.mode == "draft" and db.get_policy("p")["version"] == 1
    type_into(state, ed, "question", "Q?")  # typed back: the old errors no longer apply
    assert run(state, db).errors == {}


def test_a_new_policy_under_a_taken_id_is_refused(db):
    state: dict = {}
    ed = run(state, db, pick=pe.NEW)
    type_into(state, ed, "json", json.dumps(Q))  # a new policy naming q's id
    ed = run(state, db)
    assert pe.submit(state, ed, "json", list(saved(db)), save_to(db), taken("json")) is None
    assert run(state, db).errors and db.get_policy("q")["question"] == "Other?"
    ed = run(state, db)
    type_into(state, ed, "name", "Q")  # the Form: the id comes from the name
    type_into(state, ed, "question", "x?")
    for row, option in enumerate("ab"):
        state[pe.key("options.id", ed.view, row)] = option
    assert pe.submit(state, run(state, db), "form", list(saved(db)), save_to(db), taken("form")) is None
    assert "name" in run(state, db).errors


def test_a_stale_save_is_refused_and_nothing_saved_or_typed_is_lost(db):
    mine: dict = {}
    ed = run(mine, db, pick="p")
    type_into(mine, ed, "notes", "draft from here")
    theirs: dict = {}  # another session saves version 2 meanwhile
    other = run(theirs, db, pick="p")
    type_into(theirs, other, "notes", "keep me")
    assert pe.submit(theirs, run(theirs, db), "form", list(saved(db)), save_to(db), taken("form"))["version"] == 2
    ed = run(mine, db)
    assert ed.mode == "stale" and ed.version == 1 and "Version 2" in (ed.stale or "")
    assert pe.submit(mine, ed, "form", list(saved(db)), save_to(db), taken("form")) is None  # refused
    ed = run(mine, db)
    assert "version" in ed.errors and mine[pe.key("notes", ed.view)] == "draft from here"  # the draft stays
    assert db.get_policy("p")["notes"] == "keep me" and db.get_policy("p")["version"] == 2  # their save stays
    assert pe.submit(mine, ed, "json", list(saved(db)), save_to(db), taken("json")) is None  # the JSON tab alike
    pe.reload(mine, ed)  # the analyst loads the newer version
    ed = run(mine, db)
    assert (ed.version, ed.mode, ed.errors) == (2, "clean", {}) and ed.saved["notes"] == "keep me"


def test_a_policy_deleted_elsewhere_stays_listed_while_open_and_a_save_is_refused(db):
    state: dict = {}
    ed = run(state, db, pick="q")
    type_into(state, ed, "notes", "draft")
    db.delete_policy("q")
    policies = saved(db)
    assert "q" in pe.choices(state, list(policies), None)
    ed = run(state, db)
    assert ed.pick == "q" and ed.mode == "stale" and "deleted" in (ed.stale or "")
    assert pe.submit(state, ed, "form", list(policies), save_to(db), taken("form")) is None and db.get_policy("q") is None


def test_delete_opens_the_first_policy_left_and_an_added_copy_opens(db):
    state: dict = {}
    run(state, db, pick="q")
    db.delete_policy("q")
    pe.deleted(state)
    assert run(state, db).pick == "p"
    copy = policy_service.duplicate(db, db.get_policy("p"))
    pe.opened(state, copy["id"])
    assert run(state, db).pick == copy["id"]


def test_an_added_copy_waits_behind_unsaved_changes(db):
    state: dict = {}
    ed = run(state, db, pick="p")
    type_into(state, ed, "notes", "draft")
    run(state, db)
    pe.opened(state, "q")
    ed = run(state, db)
    assert (ed.pick, ed.pending) == ("p", "q")

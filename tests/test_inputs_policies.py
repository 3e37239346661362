"""Uploads and policy validation: errors name the row/column or the field."""
from __future__ import annotations

import json

import pytest

from app.core.inputs import InputError, rows_from_text, rows_from_upload
from app.core.policies import parse_policy_json, policy_json, validate_policy, templates


def test_csv_and_jsonl_uploads():
    rows = rows_from_upload("s.csv", b"id,state,label\nt1,Locked out,access\nt2,\"Billed, twice\",billing\n")
    assert [(r.key, r.state, r.label) for r in rows] == [("t1", "Locked out", "access"), ("t2", "Billed, twice", "billing")]
    rows = rows_from_upload("s.jsonl", b'{"state": {"ticket": "x"}}\n\n{"state": "y", "id": "k"}\n')
    assert [r.key for r in rows] == ["row-1", "k"] and rows[0].state == {"ticket": "x"}
    assert [r.state for r in rows_from_text("a\n\n b \n")] == ["a", "b"]
    # with the policy's options, a label that could never be answered right is refused by row
    with pytest.raises(InputError) as exc:
        rows_from_upload("s.csv", b"state,label\nx,Billing \ny,acess\n", ["access", "billing"])
    assert exc.value.problems == ["row 2, column label: 'Billing' is not an option of the policy (access, billing)",
                                  "row 3, column label: 'acess' is not an option of the policy (access, billing)"]


@pytest.mark.parametrize("name,data,expected", [
    ("s.csv", b"text\nhello\n", "no 'state' column"),
    ("s.csv", b"id,state\na,ok\nb,\n", "row 3, column state: empty"),
    ("s.csv", b"id,state\na,ok\na,again\n", "row 3, column id: duplicate"),
    ("s.jsonl", b'{"state": "ok"}\n{oops\n', "row 2: not valid JSON"),
    ("s.xlsx", b"PK", "upload a .csv or .jsonl"),
    ("s.csv", "state\nnaïve".encode("latin-1"), "not UTF-8"),
])
def test_bad_uploads_name_the_row_and_column(name, data, expected):
    with pytest.raises(InputError) as exc:
        rows_from_upload(name, data)
    assert any(expected in p for p in exc.value.problems), exc.value.problems


def test_policy_validation_errors_by_field():
    clean, errs = validate_policy({"name": "", "question": "", "options": [{"id": "a"}], "readout": "magic"})
    assert clean is None
    assert set(errs) >= {"name", "readout"}
    clean, errs = validate_policy({"name": "X", "question": "Q?", "options": [{"id": "a"}, {"id": "a"}]})
    assert "options" in errs and "duplicate" in errs["options"] and "row 2" in errs["options"]
    clean, errs = validate_policy({"name": "Route", "question": "Q?", "options": [{"id": "z"}, {"id": "b"}],
                                   "examples": [{"state": "s", "option_id": "c"}]})
    assert "examples" in errs and "(z, b)" in errs["examples"]  # the options as the analyst ordered them
    clean, errs = validate_policy({"name": "Route", "question": "Q?", "options": [{"id": "z"}, {"id": "b"}],
                                   "examples": [{"state": "s", "option_id": "z"}, {"state": "t", "option_id": "c"},
                                                {"state": "u", "option_id": ""}, {"state": "v", "option_id": "c"}]})
    # every bad row is named at once (not one per failed save), an empty label in words a person reads
    assert errs["examples"] == ("row 2: 'c' is not one of the options (z, b); row 3: pick the option this example "
                                "is labelled with; row 4: 'c' is not one of the options (z, b)")


def test_policy_json_round_trips_with_templates():
    for t in templates().values():
        clean, errs = parse_policy_json(policy_json(t))
        assert errs == {} and clean["options"] == t["options"] and clean["examples"] == t["examples"]
    clean, errs = validate_policy({"name": "My Routing Policy", "question": "Q?", "options": [{"id": "a"}, {"id": "b"}]})
    assert clean["id"] == "my-routing-policy"
    assert json.loads(policy_json(clean))["id"] == "my-routing-policy"
    assert "json" in parse_policy_json("{not json")[1]


def test_a_json_state_file_is_an_object_state():
    from app.core.inputs import state_from_file

    assert state_from_file("t.json", b'{"ticket": "locked out", "tier": 2}') == {"ticket": "locked out", "tier": 2}
    assert state_from_file("t.txt", b'{"not": "parsed"}') == '{"not": "parsed"}'  # text stays text
    assert state_from_file("t.json", b'"just text"') == "just text"
    with pytest.raises(InputError, match="not valid JSON .* upload it as .txt"):
        state_from_file("t.json", b'{"ticket": ')
    with pytest.raises(InputError, match="empty"):
        state_from_file("t.json", b"{}")


def test_a_policys_guard_is_validated_saved_and_reaches_the_request(tmp_path):
    from adapter.engine.templates import load_template, request_for
    from app.core.policies import validate_policy
    from app.core.store import Store

    base = {**load_template("ticket-routing")}
    clean, errs = validate_policy({**base, "guard": "erase-and-check"})
    assert not errs and clean["guard"] == "erase-and-check"
    bad, errs = validate_policy({**base, "guard": "ask-the-model"})
    assert bad is None and "erase-and-check" in errs["guard"]
    store = Store(tmp_path / "wb.db")
    store.save_policy(clean)
    saved = store.get_policy("ticket-routing")
    assert saved["guard"] == "erase-and-check"
    assert request_for(saved, "Locked out", "r").guard == "erase-and-check"


def test_add_template_never_overwrites_a_policy_after_a_delete(tmp_path):
    """'Add template' numbered its copy by the number of policies; after a delete that number names an
    existing policy, which the old page then overwrote. The copy now takes the first free id."""
    from app.core.store import Store
    from app.service import policies as service

    db = Store(tmp_path / "wb.db")
    tpl = service.templates()["refund-check"]
    db.save_policy(dict(tpl), expected_version=0)
    mine = {**tpl, "id": "refund-check-3", "name": "My refund rules", "question": "Is this refund allowed under MY rules?"}
    db.save_policy(mine, expected_version=0)  # two policies: the old rule would name the copy refund-check-3
    added = service.add_template(db, "refund-check")
    assert added["id"] == "refund-check-2" and added["question"] == tpl["question"]
    assert db.get_policy("refund-check-3")["question"] == mine["question"]  # untouched
    again = service.add_template(db, "refund-check")
    assert again["id"] == "refund-check-4" and len(db.list_policies()) == 4
    assert service.duplicate(db, db.get_policy("refund-check-3"))["id"] == "refund-check-3-copy2"


def test_the_editor_never_saves_under_another_policys_id():
    """The Policies page's id rule, in the service: a new policy whose name gives an existing id, or the
    JSON tab of a saved policy naming another policy's id, is refused with the field to fix; the id
    being edited, or a free one, is fine - and a save checks against the edited version only."""
    from app.service.policies import id_taken, version_to_save

    saved = {"refund-check", "ticket-routing"}
    assert id_taken("refund-check", None, saved, via="form") == {
        "name": "a policy with id 'refund-check' exists: choose another name"}
    assert id_taken("ticket-routing", "refund-check", saved, via="json") == {
        "json": "id 'ticket-routing' belongs to another policy: keep 'refund-check' or pick a new id"}
    assert id_taken("refund-check", "refund-check", saved, via="json") == {}  # its own id
    assert id_taken("refund-check-v2", "refund-check", saved, via="json") == {}  # a free id: saved as a new policy
    assert id_taken("my-policy", None, saved, via="form") == {}
    assert version_to_save("refund-check", "refund-check", 3) == 3  # the edited policy, against its version
    assert version_to_save("refund-check-v2", "refund-check", 3) == 0  # a new id: a new policy
    assert version_to_save("my-policy", None, 0) == 0


def test_changed_fields_compares_a_draft_with_what_a_save_would_store():
    from app.core.policies import changed_fields

    saved = {"id": "p", "name": "P", "question": "Q?", "options": [{"id": "a", "description": ""}, {"id": "b", "description": "B"}],
             "examples": [], "notes": "", "readout": "", "debias": "", "guard": "", "version": 3}
    same = {**saved, "question": " Q? ", "options": [*saved["options"], {"id": "", "description": " "}], "guard": "none",
            "json": policy_json(saved) + "\n"}
    assert changed_fields(same, saved) == []  # blanks and an empty row are not kept by a save
    draft = {**saved, "options": [{"id": "b", "description": "B"}, {"id": "a", "description": ""}], "readout": "letters",
             "examples": [{"state": "s", "option_id": "a"}], "json": "{}"}
    assert changed_fields(draft, saved) == ["options", "examples", "readout", "json"]  # the order of options matters
    new = {"id": "", "name": "", "question": "", "options": [{"id": "", "description": ""}] * 2, "examples": []}
    assert changed_fields({**new, "json": ""}, new) == [] and changed_fields({**new, "name": "X"}, new) == ["name"]


def test_label_lookalikes_are_named_only_without_a_label_column():
    from app.core.inputs import label_lookalikes

    assert label_lookalikes("s.csv", b"id,state,Label\na,x,billing\n") == ["Label"]
    assert label_lookalikes("s.jsonl", b'{"state": "x", "Category": "b"}\n{"state": "y", "answer": "a"}\n') == ["Category", "answer"]
    assert label_lookalikes("s.csv", b"state,label,answer\nx,a,a\n") == []  # has a label column
    assert label_lookalikes("s.csv", b"state,notes\nx,y\n") == [] and label_lookalikes("s.xlsx", b"PK") == []

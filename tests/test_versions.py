"""One word for versions (issue 43, item 4): Deploy's picker names each calibrated policy's policy version, and
says when the policy has a newer version and whether that one was calibrated and checked."""
from __future__ import annotations

from adapter.engine.templates import load_template

from app.core.reuse import request_changes, why_not_reused
from app.core.store import Store
from app.service import deploy


def _calibrated(store: Store, policy: dict, version: int) -> int:
    return store.save_calibrated({"policy_id": policy["id"], "name": policy["name"], "policy_version": version,
                                  "model": {"file": "m.gguf", "sha256": "ab" * 32}, "threshold": 0.5,
                                  "metrics": {}, "options": policy["options"]})


def test_deploy_names_the_version_and_a_newer_one(tmp_path):
    store = Store(tmp_path / "wb.db")
    policy = load_template("refund-check")
    v1 = store.save_policy(policy)
    first = _calibrated(store, v1, v1["version"])
    rec = next(r for r in store.list_calibrated() if r["id"] == first)
    assert f" v{v1['version']} ·" in deploy.calibrated_label(rec)
    assert deploy.newer_version(store, rec) is None  # the current version: nothing to say
    v2 = store.save_policy({**policy, "question": policy["question"] + " Think of the latest order."})
    note = deploy.newer_version(store, rec)
    assert note and f"now at v{v2['version']}" in note and "not evaluated or calibrated yet" in note
    assert f"Shipping this one ships v{v1['version']}" in note
    second = _calibrated(store, v2, v2["version"])
    note = deploy.newer_version(store, rec)
    assert note and f"calibrated as #{second}" in note and "not checked yet" in note


def test_why_rows_were_not_reused_names_what_changed():
    assert request_changes({"id": "a", "state": "s", "question": "q", "guard": None},
                           {"id": "b", "state": "s", "question": "q", "guard": "erase-check"}) == ["guard"]
    assert request_changes({"state": "s", "layout": "state-first"}, {"state": "s"}) == []
    text = why_not_reused(44, {"guard": 44}, 0, 44, 12)
    assert text == "44 evaluated, not copied: since run #12 the request changed in the guard (44 rows)"
    assert why_not_reused(5, {}, 0, 0, None) == "5 evaluated: no earlier answer to these rows on this set"


def test_a_save_note_names_its_run_and_version():
    from app.service.calibrate_panels import Saved

    note = Saved(3, "refund-check", 0.5, "human-review", None, run_id=7, version=2)
    assert note[0] == 3 and "Saved as calibrated policy #3 (v2, from run #7)" in note.text()


def test_deploy_prices_with_the_pace_measured_on_calibrate(tmp_path):
    """Issue 43, item 6: Deploy's cost per 1,000 used the instance family's default (0.5 decisions/s) although
    Calibrate had measured the pace; now the measured pace is offered, said as measured on this machine's CPU."""
    store = Store(tmp_path / "wb.db")
    policy = store.save_policy(load_template("refund-check"))
    run = store.create_run(kind="eval", policy=policy, target={"name": "local", "kind": "local"}, n_rows=6)
    assert deploy.measured_rate(store, {"run_id": run}) is None  # nothing measured yet: the family default stays
    for i in range(6):
        store.add_result(run, {"row_key": f"r{i}", "position": i, "state": "s", "label": None, "cold": int(i == 0),
                               "latency_s": 9.0 if i == 0 else 2.0, "error": None})
    rate, why = deploy.measured_rate(store, {"run_id": run})
    assert rate == 0.5 and "last 5 warm calls on local" in why and "not the instance's" in why


def test_a_deleted_sets_id_is_not_given_to_the_next_import(tmp_path):
    """Issue 43, item 6: a deleted set's id was reused by the next import, which then inherited its runs."""
    from app.core.labeled import import_file
    from tests.conftest import subset_file

    store = Store(tmp_path / "wb.db")
    policy = store.save_policy(load_template("refund-check"))
    first = import_file(store, "a.jsonl", subset_file(tmp_path, "refund-check", 4, n_train=0).read_bytes(), policy)
    store.create_run(kind="eval", policy=policy, target={"name": "local", "kind": "local"}, n_rows=4,
                     labeled_set_id=first)
    store.delete_labeled_set(first)
    second = import_file(store, "b.jsonl", subset_file(tmp_path, "refund-check", 5, n_train=0).read_bytes(), policy)
    assert second != first and second > first


def test_a_new_versions_sources_table_leaves_the_old_versions_companions_out(tmp_path):
    """Issue 43, item 4: v2's sources table listed v1's companion runs (a guard change keeps the content)."""
    from app.core.runs import policy_fingerprint
    from app.service import evaluate

    store = Store(tmp_path / "wb.db")
    v1 = store.save_policy(load_template("refund-check"))

    def run(policy, layout=None):
        cfg = {"policy_fingerprint": policy_fingerprint(policy), "examples": "policy", "layout": layout}
        return store.create_run(kind="eval", policy=policy, target={"name": "local", "kind": "local"}, n_rows=4,
                                labeled_set_id=1, config=cfg)

    old_main, old_companion = run(v1), run(v1, "policy-first")
    v2 = store.save_policy({**load_template("refund-check"), "guard": "erase-check"})
    new_main, new_companion = run(v2), run(v2, "policy-first")
    assert [r["id"] for r in evaluate.source_group(store, new_main)] == [new_main, new_companion]
    assert [r["id"] for r in evaluate.source_group(store, old_main)] == [old_main, old_companion]

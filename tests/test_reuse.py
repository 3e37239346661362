"""Stored results stand in for new calls of the same request on the same model - in the one
scoring loop, so evaluations, checks and a grown labeled set score only what is new."""
from __future__ import annotations

import json

from adapter.engine.templates import load_template, request_for
from app.core import runs, reuse
from app.core.labeled import import_file
from app.core.runner import Case, run_policy
from app.core.store import Store
from app.targets.local import LocalTarget
from tests.conftest import subset_file


def test_a_grown_labeled_set_scores_only_its_new_rows(tmp_path, engine):
    db = Store(tmp_path / "wb.db")
    policy = load_template("ticket-routing")
    db.save_policy(policy)
    lines = subset_file(tmp_path, "ticket-routing", 10, n_train=0).read_text().splitlines()
    first = import_file(db, "v1.jsonl", "\n".join(lines[:7]).encode(), policy)
    grown = import_file(db, "v2.jsonl", "\n".join(lines).encode(), policy)  # 3 rows more: a new set version
    target = LocalTarget("local", {}, lambda model: engine)
    run1, _ = runs.find_or_start(db, policy=policy, set_id=first, target=target)
    out1 = runs.resume_eval(db, run1, target)
    assert (out1["evaluated"], out1["reused"]) == (7, 0)
    run2, resumed = runs.find_or_start(db, policy=policy, set_id=grown, target=target)
    assert not resumed  # another set: another run...
    out2 = runs.resume_eval(db, run2, target)
    assert (out2["evaluated"], out2["reused"]) == (3, 7)  # ...but only the new rows reach the model
    old = {r["row_key"]: r for r in db.results(run1)}
    for r in db.results(run2):
        if r["row_key"] in old:
            assert r["reused_from"] == old[r["row_key"]]["id"] and r["probabilities"] == old[r["row_key"]]["probabilities"]
        else:
            assert r["reused_from"] is None and r["reuse_key"]
    assert db.get_run(run2)["status"] == "done" and db.get_run(run2)["model"] == db.get_run(run1)["model"]
    # a reused row is what scoring it would give: score one again, fresh
    key = next(iter(old))
    row = next(r for r in db.labeled_rows(grown) if r["row_key"] == key)
    again = engine.score(request_for(policy, row["state"], key), fresh=True)
    assert again.probabilities == old[key]["probabilities"]
    # asked not to reuse, every row is scored
    run3 = runs.start_eval(db, policy=policy, set_id=grown, target=target)
    out3 = runs.resume_eval(db, run3, target, reuse=False)
    assert (out3["evaluated"], out3["reused"]) == (10, 0)


def test_the_key_follows_the_model_and_what_is_read_not_the_row_id(engine):
    policy = load_template("ticket-routing")
    model = engine.info.public()
    plain = request_for(policy, "I was charged twice", "a")
    named = request_for(policy, "I was charged twice", "b", readout=engine.info.default_readout)
    assert reuse.reuse_key(model, plain) == reuse.reuse_key(model, named)  # the default, left out or named
    other = "letters" if engine.info.default_readout != "letters" else "option-words"
    assert reuse.reuse_key(model, plain) != reuse.reuse_key(model, request_for(policy, "I was charged twice", "a",
                                                                                readout=other))
    assert reuse.reuse_key(model, plain) != reuse.reuse_key(model, request_for(policy, "I was charged thrice", "a"))
    assert reuse.reuse_key(model, plain) != reuse.reuse_key({**model, "n_gpu_layers": 99}, plain)  # GPU rounds otherwise
    assert reuse.reuse_key(model, plain) != reuse.reuse_key({**model, "sha256": "0" * 64}, plain)
    assert reuse.reuse_key({"file": "x.gguf"}, plain) is None  # a model not known by its hash: never reused


def test_a_stored_hidden_state_is_reused_only_when_it_was_read_the_same_way(engine):
    """Issue 45 reads the hidden state from the decision's own decode; before, a second decode read it, and the
    two differ in the last digits - so a result stored before (its model says no hidden_read) is scored again
    when the call returns a hidden state, and reused as before when it does not."""
    policy = load_template("ticket-routing")
    model = engine.info.public()
    assert model["hidden_read"] == "decode"
    before = {k: v for k, v in model.items() if k != "hidden_read"}  # a response stored before the field existed
    plain = request_for(policy, "I was charged twice", "a")
    hidden = plain.model_copy(update={"hidden_state": True})
    assert reuse.reuse_key(model, plain) == reuse.reuse_key(before, plain)
    assert reuse.reuse_key(model, hidden) != reuse.reuse_key(before, hidden)
    assert reuse.reuse_key(model, hidden) != reuse.reuse_key({**model, "hidden_read": "re-decode"}, hidden)
    assert reuse.reuse_key(model, hidden) == reuse.reuse_key(dict(model), hidden)


def test_runs_that_measure_latency_call_the_target_every_time(tmp_path, engine):
    db = Store(tmp_path / "wb.db")
    policy = load_template("ticket-routing")
    target = LocalTarget("local", {}, lambda model: engine)
    cases = [Case("c1", "Where is my parcel?"), Case("c2", "The app crashes")]
    _, (first,) = run_policy(db, policy, cases, [target], kind="compare")
    _, (second,) = run_policy(db, policy, cases, [target], kind="compare")
    assert all(r["reused_from"] is None for r in db.results(first) + db.results(second))
    assert [r["reuse_key"] for r in db.results(first)] == [r["reuse_key"] for r in db.results(second)]
    assert json.dumps(db.results(second)[0]["probabilities"]) == json.dumps(db.results(first)[0]["probabilities"])

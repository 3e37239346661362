"""A pool kept in the workbench (issue 44, items 4 and 7): imported through the importer's column guess, bad
rows named by line and left out, a million-row file streamed up to a cap that says so, a pool or a decision
log of another policy refused by name, a label outside the options refused with nothing stored - and nothing
saved before is ever lost. The scoring, ranking and reuse with a real model are in test_pool_walkthrough.py."""
from __future__ import annotations

import csv
import io
import json
import tracemalloc

import pytest

from adapter.engine.templates import load_template
from app.core import decision_import, pool_store
from app.core.pool import PoolRow
from app.core.store import Store
from app.service import pool as pools
from tests.conftest import import_subset


@pytest.fixture()
def setup(tmp_path):
    db = Store(tmp_path / "wb.db")
    policy, set_id = import_subset(db, tmp_path, "refund-check", 4)
    return db, policy, set_id


def jsonl(*rows: object) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


BAD_ROWS = [  # (a row, the message that names it) - each left out, the other rows kept
    ({"state": "   "}, "line {n}: the state is empty"),
    ({"state": {}}, "line {n}: the state is empty"),
    ({"state": "A good pool row"}, "line {n}: the same state as line 1 ('A good pool row')"),
    ("IN_SET", "line {n}: this state is already in the labeled set"),
    ({"state": "Label me", "label": "maybe"}, "line {n}: label 'maybe' is not an option (yes, no)"),
    ({"state": "Another policy's row", "policy_id": "ticket-routing"},
     "line {n}: a row of policy 'ticket-routing', not 'refund-check'"),
    ("{not json", "line {n}: not valid JSON (Expecting property name enclosed in double quotes)"),
]


@pytest.mark.parametrize("bad,message", BAD_ROWS, ids=["blank", "empty-object", "duplicate", "in-set", "label",
                                                       "other-policy", "json"])
def test_a_bad_row_is_named_by_its_line_and_left_out(setup, bad, message):
    db, policy, set_id = setup
    in_set = db.labeled_rows(set_id)[0]["state"]
    row = {"state": in_set} if bad == "IN_SET" else bad
    got = pools.import_stream(db, policy, io.StringIO(jsonl({"state": "A good pool row"}, row, {"state": "Last one"})),
                              "pool.jsonl", into_set=set_id)
    assert got.problems == [message.format(n=2)]
    kept = pool_store.rows(db, got.pool_id)
    assert [(r.line, r.state) for r in kept] == [(1, "A good pool row"), (3, "Last one")]
    assert len(db.labeled_rows(set_id)) == 4  # the set is untouched


def test_a_file_with_no_usable_row_saves_nothing_and_loses_nothing(setup):
    db, policy, set_id = setup
    first = pools.import_stream(db, policy, io.StringIO(jsonl({"state": "kept"})), "a.jsonl", into_set=set_id)
    with pytest.raises(pools.PoolProblem, match=r"b.jsonl: no usable row, nothing saved - line 1: the state is empty"):
        pools.import_stream(db, policy, io.StringIO(jsonl({"state": ""})), "b.jsonl", into_set=set_id)
    with pytest.raises(pools.PoolProblem, match=r"c.txt: a pool is a .csv"):
        pools.import_stream(db, policy, io.StringIO("x"), "c.txt", into_set=set_id)
    assert [p.id for p in pools.list_pools(db, policy["id"])] == [first.pool_id]
    assert [r.state for r in pool_store.rows(db, first.pool_id)] == ["kept"]


def test_the_state_column_is_the_importers_guess(setup):
    db, policy, set_id = setup
    data = b"ticket_id,body\nT-1001,My kettle broke after two days and I want a refund\nT-1002,The lamp arrived fine thanks\n"
    got = pools.import_upload(db, policy, "tickets.csv", data, into_set=set_id)
    rows = pool_store.rows(db, got.pool_id)
    assert [r.state for r in rows] == ["My kettle broke after two days and I want a refund", "The lamp arrived fine thanks"]
    with pytest.raises(pools.PoolProblem, match="not UTF-8"):
        pools.import_upload(db, policy, "bad.csv", b"state\n\xff\xfe\n", into_set=set_id)


def test_a_million_rows_are_streamed_to_a_cap_that_says_so(setup):
    db, policy, set_id = setup
    read = {"lines": 0}

    class Million(io.TextIOBase):  # a million rows made as they are read: never held whole
        def __iter__(self):
            for i in range(1_000_000):
                read["lines"] += 1
                yield json.dumps({"state": f"customer message number {i}"}) + "\n"

    tracemalloc.start()
    got = pools.import_stream(db, policy, Million(), "big.jsonl", into_set=set_id, cap=2000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert got.rows == 2000 and "more than 2,000 rows" in got.capped and "from line 2001 on, nothing was read" in got.capped
    assert read["lines"] == 2001  # reading stopped at the cap: the rest of the file was never read
    assert peak < 20 << 20, peak
    assert pool_store.get(db, got.pool_id).capped == got.capped and len(pool_store.rows(db, got.pool_id)) == 2000


def test_a_pool_or_a_log_of_another_policy_is_refused_by_name(setup):
    db, policy, set_id = setup
    other = load_template("ticket-routing")
    db.save_policy(other)
    theirs = pools.import_stream(db, other, io.StringIO(jsonl({"state": "my parcel is late"})), "t.jsonl", into_set=None)
    with pytest.raises(pools.PoolProblem, match=rf"pool #{theirs.pool_id} is a pool of policy 'ticket-routing', "
                                                r"not 'refund-check'"):
        pools.get_pool(db, theirs.pool_id, "refund-check")
    with pytest.raises(pools.PoolProblem, match=r"pool #99: no such pool"):
        pools.get_pool(db, 99, "refund-check")
    log = [{"semif_decision": 1, "time": "2026-12-01T09:00:00+00:00", "request_id": "r1", "row_id": "x1",
            "state": "where is my parcel", "option_ids": [o["id"] for o in other["options"]],
            "probabilities": [0.25] * 4, "top_option": "billing", "policy": {"policy_id": "ticket-routing"},
            "decision": {"option": "human-review", "gated": True, "reason": "confidence"}}]
    run_id, _ = decision_import.import_records(db, log, other, source="t.log")
    with pytest.raises(pools.PoolProblem, match=rf"run #{run_id} is a decision log of policy 'ticket-routing', not "
                                                r"'refund-check'"):
        pools.import_log(db, policy, run_id, into_set=set_id)
    got = pools.import_log(db, other, run_id, into_set=None)
    assert [r.state for r in pool_store.rows(db, got.pool_id)] == ["where is my parcel"]


def test_a_label_outside_the_options_is_refused_naming_the_row_and_nothing_is_stored(setup):
    db, policy, _ = setup
    rows = [pools.Suggested(1, 4, "p4", "line-4", "state four", "yes", 0.1, 1),
            pools.Suggested(2, 7, "p7", "line-7", "state seven", "no", 0.2, 1)]
    from adapter.policy import CalibratedPolicy

    cal = CalibratedPolicy.model_validate({"policy_id": "refund-check", "question": policy["question"],
                                           "options": policy["options"], "readout": "letters", "prompt_version": "letters/1",
                                           "model": {"file": "m.gguf", "sha256": "0" * 64}, "temperature": 1.0,
                                           "fallback_option": "human-review", "created_at": "now"})
    with pytest.raises(pools.PoolProblem, match=r"row 'p7': label 'maybe' is not an option \(yes, no\) - nothing stored"):
        pools.label_rows(db, rows, {"p4": "yes", "p7": "maybe"}, who="ana", policy=cal)
    with pytest.raises(pools.PoolProblem, match=r"row 'p9': not an open row"):
        pools.label_rows(db, rows, {"p9": "yes"}, who="ana", policy=cal)
    assert db.reviews("refund-check") == []
    assert pools.label_rows(db, rows, {"p4": "yes", "line-7": "no"}, who="ana", policy=cal) == 2
    got = db.reviews("refund-check", pending=True)
    assert [(r["label"], r["who"], r["action"], r["row_key"]) for r in got] == [("yes", "ana", "label", "line-4"),
                                                                                ("no", "ana", "label", "line-7")]


def test_pool_rows_are_kept_in_chunks_in_one_transaction(setup):
    db, policy, _ = setup
    rows = (PoolRow(i + 1, f"r{i}", f"state {i}") for i in range(pool_store.CHUNK * 2 + 5))
    pid = pool_store.add(db, name="n", policy_id="refund-check", source="gen", rows=rows, problems=[])
    assert pool_store.get(db, pid).n_rows == pool_store.CHUNK * 2 + 5

    def broken():
        yield PoolRow(1, "a", "one")
        raise ValueError("the reader failed half way")

    with pytest.raises(ValueError, match="half way"):
        pool_store.add(db, name="half", policy_id="refund-check", source="gen", rows=broken(), problems=[])
    assert [p.id for p in pool_store.pools(db)] == [pid]  # no half pool


def test_a_csv_that_breaks_half_way_keeps_the_rows_before_and_names_the_line(setup):
    db, policy, set_id = setup
    text = "state\nfirst row\nsecond row\n" + "x" * 2000 + "\nnever read\n"
    limit = csv.field_size_limit(1000)  # a cell past csv's field size limit (the workbench sets 16 M characters)
    try:
        got = pools.import_stream(db, policy, io.StringIO(text), "p.csv", into_set=set_id)
    finally:
        csv.field_size_limit(limit)
    assert [r.state for r in pool_store.rows(db, got.pool_id)] == ["first row", "second row"]
    assert len(got.problems) == 1 and got.problems[0].startswith("line 4: not readable as CSV (")
    assert got.problems[0].endswith("nothing from here on was read")


def test_an_id_that_names_two_pool_rows_or_a_row_named_twice_is_refused_and_nothing_is_stored(setup):
    db, policy, _ = setup
    rows = [pools.Suggested(1, 4, "dup", "line-4", "state four", "yes", 0.1, 1),
            pools.Suggested(2, 7, "dup", "line-7", "state seven", "no", 0.2, 1)]  # a file's own ids may repeat
    from adapter.policy import CalibratedPolicy

    cal = CalibratedPolicy.model_validate({"policy_id": "refund-check", "question": policy["question"],
                                           "options": policy["options"], "readout": "letters", "prompt_version": "letters/1",
                                           "model": {"file": "m.gguf", "sha256": "0" * 64}, "temperature": 1.0,
                                           "fallback_option": "human-review", "created_at": "now"})
    with pytest.raises(pools.PoolProblem, match=r"row 'dup': the id of 2 pool rows \(lines 4, 7\) - label them by "
                                                r"line-N"):
        pools.label_rows(db, rows, {"dup": "yes"}, who="ana", policy=cal)
    with pytest.raises(pools.PoolProblem, match=r"line 4 is labeled twice \('line-4' and 'x4'\)"):
        pools.label_rows(db, [pools.Suggested(1, 4, "x4", "line-4", "state four", "yes", 0.1, 1)],
                         {"line-4": "yes", "x4": "no"}, who="ana", policy=cal)
    assert db.reviews("refund-check") == []
    assert pools.label_rows(db, rows, {"line-4": "yes", "line-7": "no"}, who="ana", policy=cal) == 2


def test_stored_scores_of_one_calibrated_file_are_not_read_for_another_that_asks_otherwise(setup):
    """Two calibrated files with no evaluation run in this workbench (like_run None both), on the same pool and
    target: the second asks another question (the policy's next version), so the first's stored scores are not its
    scores."""
    from adapter.policy import CalibratedPolicy
    from app.targets.base import Target

    db, policy, _ = setup
    got = pools.import_stream(db, policy, io.StringIO(jsonl({"state": "one"}, {"state": "two"})), "p.jsonl",
                              into_set=None)
    pool = pools.get_pool(db, got.pool_id, "refund-check")

    def cal(question: str) -> pools.Candidate:
        return pools.Candidate(CalibratedPolicy.model_validate(
            {"policy_id": "refund-check", "question": question, "options": policy["options"],
             "readout": "letters", "prompt_version": "letters/1",
             "model": {"file": "m.gguf", "sha256": "0" * 64}, "temperature": 1.0,
             "fallback_option": "human-review", "created_at": "now"}), None)

    first, other = cal(policy["question"]), cal(policy["question"] + " Answer for the EU shop.")
    assert first.policy.request_fields() != other.policy.request_fields()
    local = Target("local", "local", {})
    run_id = pool_store.start_scores(db, pool, like=None, policy=first.policy, target=local, note="n")
    assert pools.stored_scores(db, pool, first, "local") == run_id
    assert pools.stored_scores(db, pool, other, "local") is None


def test_a_labeled_set_of_another_policy_is_refused_by_pool_import_and_suggest_before_anything_is_stored(setup, tmp_path,
                                                                                                         capsys, monkeypatch):
    """--labeled-set leaves the set's states out of the pool and counts its labels for the cold start: a set of
    another policy (or none at all) is exit 2 naming the flag, before a pool is kept or a row scored."""
    from adapter.policy import CalibratedPolicy
    from app.__main__ import main

    db, policy, set_id = setup
    _, theirs = import_subset(db, tmp_path, "ticket-routing", 4)
    pool_file = tmp_path / "pool.jsonl"
    pool_file.write_text(jsonl({"state": "my refund never came"}, {"state": "wrong colour"}))
    wb = str(tmp_path / "wb.db")
    for bad in (theirs, 999):
        assert main(["pool", "import", "--policy", "refund-check", "--file", str(pool_file), "--labeled-set", str(bad),
                     "--db", wb]) == 2
        assert f"--labeled-set {bad}: not a labeled set of 'refund-check'" in capsys.readouterr().err
    assert pool_store.pools(db) == []  # nothing kept
    assert main(["pool", "import", "--policy", "refund-check", "--file", str(pool_file), "--labeled-set", str(set_id),
                 "--db", wb]) == 0
    pid = pool_store.pools(db)[0].id
    cal = CalibratedPolicy.model_validate({"policy_id": "refund-check", "question": policy["question"],
                                           "options": policy["options"], "readout": "letters", "prompt_version": "letters/1",
                                           "model": {"file": "m.gguf", "sha256": "0" * 64}, "temperature": 1.0,
                                           "fallback_option": "human-review", "created_at": "now"})
    cal_file = tmp_path / "cal.json"
    cal_file.write_text(cal.model_dump_json())
    for pool_arg in (str(pid), str(pool_file)):  # a stored pool, a pool file: refused before any row is scored
        capsys.readouterr()
        assert main(["suggest", "--policy", str(cal_file), "--pool", pool_arg, "--labeled-set", str(theirs),
                     "--db", wb]) == 2
        assert f"--labeled-set {theirs}: not a labeled set of 'refund-check'" in capsys.readouterr().err
    assert [r["kind"] for r in db.list_runs()] == []  # no pool run started
    # "--pool 1" beside a file named 1: which is meant is not guessed (the stored pool won in silence)
    named = tmp_path / str(pid)
    named.write_text(pool_file.read_text())
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["suggest", "--policy", str(cal_file), "--pool", str(pid), "--db", wb]) == 2
    assert (f"--pool {pid}: both a file of that name and a stored pool's id - say which: --pool ./{pid} for the file, "
            f"--pool pool:{pid} for the stored pool") in capsys.readouterr().err
    assert [r["kind"] for r in db.list_runs()] == []


def test_rows_not_scored_yet_are_still_counted_as_open(setup):
    """A ranking's 'N of M open pool rows' counts every row not labeled yet, scored or not (the unscored ones are
    named in `failed`); it said 0 open when no row was scored."""
    from adapter.policy import CalibratedPolicy
    from app.targets.base import Target

    db, policy, set_id = setup
    got = pools.import_stream(db, policy, io.StringIO(jsonl({"state": "one"}, {"state": "two"})), "p.jsonl",
                              into_set=set_id)
    pool = pools.get_pool(db, got.pool_id, "refund-check")
    cal = CalibratedPolicy.model_validate({"policy_id": "refund-check", "question": policy["question"],
                                           "options": policy["options"], "readout": "letters", "prompt_version": "letters/1",
                                           "model": {"file": "m.gguf", "sha256": "0" * 64}, "temperature": 1.0,
                                           "fallback_option": "human-review", "created_at": "now"})
    cand = pools.Candidate(cal, None)
    run_id = pool_store.start_scores(db, pool, like=None, policy=cal, target=Target("local", "local", {}), note="n")
    ranked = pools.rank_pool(db, pool, cand, run_id, k=5, into_set=set_id)
    assert (ranked.rows, ranked.open, ranked.moved, ranked.reused) == ([], 2, 0, 0)
    assert ranked.failed == ["line 1: not scored (score the pool first)", "line 2: not scored (score the pool first)"]
    assert ranked.text.startswith("0 of 2 open pool rows")


def test_a_target_that_runs_another_model_than_the_calibrated_file_is_refused_and_nothing_is_scored(setup):
    """A calibrated file made on one model, scored on a target that says it runs another: refused naming both,
    no pool run kept (before, the local target's loaded model read the rows and the ranking came from it)."""
    from adapter.policy import CalibratedPolicy
    from app.targets.base import Numerics, Target, TargetError

    class OtherModel(Target):
        def numerics(self) -> Numerics | None:
            return {"sha256": "1" * 64, "llama_cpp_version": None, "n_gpu_layers": None, "flash_attn": None,
                    "default_readout": None, "default_debias": None, "hidden_read": None}

    db, policy, _ = setup
    got = pools.import_stream(db, policy, io.StringIO(jsonl({"state": "one"}, {"state": "two"})), "p.jsonl",
                              into_set=None)
    pool = pools.get_pool(db, got.pool_id, "refund-check")
    cand = pools.Candidate(CalibratedPolicy.model_validate(
        {"policy_id": "refund-check", "question": policy["question"], "options": policy["options"],
         "readout": "letters", "prompt_version": "letters/1", "model": {"file": "m.gguf", "sha256": "0" * 64},
         "temperature": 1.0, "fallback_option": "human-review", "created_at": "now"}), None)
    with pytest.raises(pools.PoolProblem, match=r"runs another model \(111111111111…\) than .*m\.gguf, 000000000000…"):
        pools.score(db, pool, cand, OtherModel("local", "local", {}))
    assert db.list_runs(kind="pool") == []

    class Unloadable(Target):  # a local model that cannot load: the pool's problem, said - not a traceback
        def numerics(self) -> Numerics | None:
            raise TargetError("model file not found: /nowhere/m.gguf")

    with pytest.raises(pools.PoolProblem, match=r"target 'local' cannot score: model file not found: /nowhere/m\.gguf; "
                       "nothing scored"):
        pools.score(db, pool, cand, Unloadable("local", "local", {}))
    assert db.list_runs(kind="pool") == []


def test_the_ranking_says_when_the_labeled_rows_hidden_states_are_not_available(setup):
    """A calibrated file whose evaluation run is not in this workbench: no stored hidden state of the labeled rows
    for it, and the ranking's line says so (the cold start then compares the pool rows only with each other)."""
    from adapter.policy import CalibratedPolicy

    db, policy, set_id = setup
    cand = pools.Candidate(CalibratedPolicy.model_validate(
        {"policy_id": "refund-check", "question": policy["question"], "options": policy["options"],
         "readout": "letters", "prompt_version": "letters/1", "model": {"file": "m.gguf", "sha256": "0" * 64},
         "temperature": 1.0, "fallback_option": "human-review", "created_at": "now"}), None)
    got = pools.labeled_vectors(db, cand, set_id)
    assert (got.X, got.found, got.labeled) == (None, 0, 4)
    assert "hidden states of the 4 labeled rows were not available" in got.text
    assert pools.labeled_vectors(db, cand, None).text == "no labeled row yet to compare the pool with"


def test_the_pool_picker_names_the_file_once():
    """The 300-state walk's picker read 'pool #1 pool.csv (300 rows, file pool.csv)'."""
    def pool(name: str, source: str) -> pool_store.StoredPool:
        return pool_store.StoredPool(1, name, "refund-check", source, "2026-12-07T22:11", 300, [], "")

    assert pool("pool.csv", "file pool.csv").label == "pool #1 pool.csv (300 rows)"
    assert pool("march", "file pool.csv").label == "pool #1 march (300 rows, file pool.csv)"
    assert pool("log", "decision log run #4").label == "pool #1 log (300 rows, decision log run #4)"
